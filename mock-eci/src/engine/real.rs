//! The engine's side of the real runtime (`--runtime real`): what it asks the runtime driver to
//! make exist ([`Engine::runtime_plan`]) and what the driver saw happen ([`Engine::observe`]).
//! Pure, like the rest of the engine: the driver (in the service) does the pulls and runs.

use std::net::Ipv4Addr;

use eci_proto::status::GroupStatus;
use eci_proto::v20180808::{Container, CreateContainerGroupRequest};

use crate::clock::Millis;
use crate::engine::Engine;
use crate::engine::group::{Group, RunState, Which};
use crate::engine::probe::{ProbeKind, ProbeOutcome};

/// What the driver saw happen to one run of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The run started.
    Started,
    /// The run's process ended with this code (128 + signal when a signal ended it), leaving
    /// this termination message (see [`crate::engine::logs::termination_message`]).
    Exited { exit_code: i32, message: String },
    /// The run could not be started (a bundle or runtime failure).
    StartFailed { message: String },
    /// Pulling the run's image failed: the container's waiting message and the event's.
    PullFailed {
        message: String,
        event_message: String,
    },
    /// A probe of the run ran.
    Probe {
        kind: ProbeKind,
        outcome: ProbeOutcome,
    },
    /// A lifecycle hook of the run failed (`message` says how).
    HookFailed { hook: Hook, message: String },
}

/// A container lifecycle hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Runs once the container started; failing, the container is killed.
    PostStart,
    /// Runs before the container is stopped, within its grace period.
    PreStop,
}

impl Hook {
    /// The hook's name in ECI's (and the kubelet's) words.
    pub fn word(self) -> &'static str {
        match self {
            Self::PostStart => "PostStart",
            Self::PreStop => "PreStop",
        }
    }
}

/// What the driver should do with one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Start run `run` (stopping whatever earlier run is left).
    Start,
    /// Run `run` runs: leave it.
    Run,
    /// Nothing of it should run.
    Stop,
}

/// One container as the driver should have it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedContainer {
    /// Its spec.
    pub spec: Container,
    /// An init container.
    pub init: bool,
    /// The current run (its restart count).
    pub run: u32,
    /// What should be.
    pub want: Want,
}

/// What the driver should make of one group.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupPlan {
    /// The group runs: its sandbox exists, its containers as listed.
    Live {
        /// Its address, from the sandbox network.
        ip: Ipv4Addr,
        /// The creation request (host name, DNS, credentials, registries).
        request: Box<CreateContainerGroupRequest>,
        /// The grace period containers get when stopped.
        grace_ms: Millis,
        /// Init containers first, then containers.
        containers: Vec<PlannedContainer>,
    },
    /// Deleted: stop every container (SIGTERM, SIGKILL after `grace_ms`) and remove the
    /// sandbox, then report [`Engine::observe_deleted`].
    Terminating {
        /// The grace period.
        grace_ms: Millis,
    },
    /// Ended (Succeeded, Failed, Expired): nothing runs any more; the sandbox goes, the logs
    /// stay readable while the group is listed.
    Finished,
}

impl Engine {
    /// Every group the real runtime has something to do for, by id; a group absent from it
    /// (never provisioned, or gone) should have no sandbox and no logs.
    pub fn runtime_plan(&mut self, now: Millis) -> Vec<(String, GroupPlan)> {
        self.advance(now);
        let max_grace = self.settings.max_grace_ms;
        self.groups
            .values()
            .filter_map(|group| Some((group.id.clone(), plan_of(group, now, max_grace)?)))
            .collect()
    }

    /// Applies what the driver saw; an observation of a run that is no longer current (or of
    /// a group gone, ended or being deleted) changes nothing.
    pub fn observe(
        &mut self,
        id: &str,
        container: &str,
        run: u32,
        observation: &Observation,
        now: Millis,
    ) {
        self.advance(now);
        self.with_group(id, now, |group, cx| match observation {
            Observation::Started => group.observed_start(container, run, cx),
            Observation::Exited { exit_code, message } => {
                group.observed_exit(container, run, *exit_code, message, cx);
            }
            Observation::StartFailed { message } => {
                group.observed_start_failure(container, run, message, cx);
            }
            Observation::PullFailed {
                message,
                event_message,
            } => group.observed_pull_failure(container, run, message, event_message, cx),
            Observation::Probe { kind, outcome } => {
                group.observed_probe(container, run, *kind, outcome, cx);
            }
            Observation::HookFailed { hook, message } => {
                group.observed_hook_failure(container, run, *hook, message, cx);
            }
        });
    }

    /// The driver stopped a deleted group's containers and removed its sandbox: the group
    /// disappears now rather than at the end of its grace period.
    pub fn observe_deleted(&mut self, id: &str, now: Millis) {
        self.advance(now);
        if self
            .groups
            .get(id)
            .is_some_and(|group| group.status == GroupStatus::Terminating)
        {
            self.remove(id);
        }
    }
}

fn plan_of(group: &Group, now: Millis, max_grace_ms: Millis) -> Option<GroupPlan> {
    let grace_ms = group.grace_seconds.saturating_mul(1_000).min(max_grace_ms);
    if group.status == GroupStatus::Terminating {
        return Some(GroupPlan::Terminating { grace_ms });
    }
    if group.status.is_final() {
        return group
            .provisioned_at
            .is_some_and(|at| at <= now)
            .then_some(GroupPlan::Finished);
    }
    let ip = group.ip?;
    if group.provisioned_at.is_none_or(|at| at > now) {
        return None;
    }
    let containers = [Which::Init, Which::Regular]
        .into_iter()
        .flat_map(|which| {
            group
                .specs(which)
                .iter()
                .zip(group.runs(which))
                .map(move |(spec, run)| PlannedContainer {
                    spec: spec.clone(),
                    init: which == Which::Init,
                    run: run.restart_count,
                    // A run whose liveness probe failed is stopped; its exit is reported
                    // and the restart policy applies.
                    want: if run.launch {
                        Want::Start
                    } else if matches!(run.state, RunState::Running { .. })
                        && run.probes.liveness.is_passing()
                    {
                        Want::Run
                    } else {
                        Want::Stop
                    },
                })
        })
        .collect();
    Some(GroupPlan::Live {
        ip,
        request: Box::new(group.request.clone()),
        grace_ms,
        containers,
    })
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::Container;

    use super::*;
    use crate::settings::Settings;

    fn engine() -> Engine {
        Engine::new(Settings {
            real_runtime: true,
            restart_backoff_ms: 1_000,
            ..Settings::default()
        })
    }

    fn create(engine: &mut Engine, restart_policy: &str) -> String {
        let request = CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg".into(),
            v_switch_id: "vsw".into(),
            container_group_name: "real".into(),
            restart_policy: restart_policy.into(),
            container: vec![Container {
                name: "app".into(),
                image: "busybox".into(),
                ..Container::default()
            }],
            ..CreateContainerGroupRequest::default()
        };
        engine.create(request, 0).expect("a valid create")
    }

    /// (want, run) of the group's only container, or the plan's kind when not live.
    fn wanted(engine: &mut Engine, id: &str, now: Millis) -> String {
        let plan = engine.runtime_plan(now);
        match plan
            .iter()
            .find(|(planned, _)| planned == id)
            .map(|(_, plan)| plan)
        {
            None => "absent".into(),
            Some(GroupPlan::Live { containers, .. }) => {
                format!("{:?} {}", containers[0].want, containers[0].run)
            }
            Some(GroupPlan::Terminating { .. }) => "terminating".into(),
            Some(GroupPlan::Finished) => "finished".into(),
        }
    }

    fn state(engine: &Engine, id: &str) -> (GroupStatus, String) {
        let group = &engine.groups[id];
        let reason = match &group.containers[0].state {
            RunState::Waiting { reason, .. } => reason.clone(),
            RunState::Running { .. } => "Running".into(),
            RunState::Terminated { exit_code, .. } => format!("exit {exit_code}"),
        };
        (group.status, reason)
    }

    /// An exit that left no termination message.
    fn exited(exit_code: i32) -> Observation {
        Observation::Exited {
            exit_code,
            message: String::new(),
        }
    }

    #[test]
    fn a_run_is_asked_for_then_follows_what_the_runtime_saw() {
        let mut engine = engine();
        let id = create(&mut engine, "Never");
        assert_eq!(
            wanted(&mut engine, &id, 100),
            "absent",
            "not provisioned yet"
        );
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Pending, "ContainerCreating".into())
        );
        engine.observe(&id, "app", 0, &Observation::Started, 10_100);
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Running, "Running".into())
        );
        assert_eq!(wanted(&mut engine, &id, 10_200), "Run 0");
        // A report about another run, or another container, changes nothing.
        engine.observe(&id, "app", 1, &exited(1), 10_300);
        engine.observe(&id, "other", 0, &exited(1), 10_300);
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Running, "Running".into())
        );
        let exit = Observation::Exited {
            exit_code: 3,
            message: "the message the container left".into(),
        };
        engine.observe(&id, "app", 0, &exit, 11_000);
        assert_eq!(state(&engine, &id), (GroupStatus::Failed, "exit 3".into()));
        let RunState::Terminated { message, .. } = &engine.groups[&id].containers[0].state else {
            panic!("terminated");
        };
        assert_eq!(message, "the message the container left");
        assert_eq!(wanted(&mut engine, &id, 11_100), "finished");
    }

    #[test]
    fn a_crash_under_always_backs_off_then_asks_for_the_next_run() {
        let mut engine = engine();
        let id = create(&mut engine, "Always");
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        engine.observe(&id, "app", 0, &Observation::Started, 10_000);
        engine.observe(&id, "app", 0, &exited(1), 10_500);
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Running, "CrashLoopBackOff".into())
        );
        assert_eq!(wanted(&mut engine, &id, 11_000), "Stop 0");
        assert_eq!(
            wanted(&mut engine, &id, 11_500),
            "Start 1",
            "after the 1 s back-off"
        );
        engine.observe(
            &id,
            "app",
            1,
            &Observation::StartFailed {
                message: "no".into(),
            },
            11_600,
        );
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Running, "CrashLoopBackOff".into())
        );
        assert_eq!(engine.groups[&id].containers[0].restart_count, 1);
        assert_eq!(
            wanted(&mut engine, &id, 13_600),
            "Start 2",
            "2 s back-off the second time"
        );
    }

    #[test]
    fn a_failed_pull_waits_in_err_image_pull_then_image_pull_back_off() {
        let mut engine = engine();
        let id = create(&mut engine, "Always");
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        let failed = Observation::PullFailed {
            message: "failed to pull image \"busybox\": not found".into(),
            event_message: "Failed to pull image \"busybox\": not found".into(),
        };
        engine.observe(&id, "app", 0, &failed, 10_000);
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Pending, "ErrImagePull".into())
        );
        let events = &engine.groups[&id].events;
        assert!(
            events
                .iter()
                .any(|e| e.kind == "Warning" && e.reason == "Failed"),
            "{events:?}"
        );
        assert_eq!(
            wanted(&mut engine, &id, 20_000),
            "Start 0",
            "the pull is retried"
        );
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Pending, "ImagePullBackOff".into())
        );
        engine.observe(&id, "app", 0, &Observation::Started, 20_000);
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Running, "Running".into())
        );
    }

    #[test]
    fn a_deleted_running_group_is_stopped_then_gone_once_the_runtime_says_so() {
        let mut engine = engine();
        let id = create(&mut engine, "Always");
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        engine.observe(&id, "app", 0, &Observation::Started, 10_000);
        let delete = eci_proto::v20180808::DeleteContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: id.clone(),
            ..Default::default()
        };
        engine.delete(&delete, 10_100).expect("delete");
        assert_eq!(wanted(&mut engine, &id, 10_200), "terminating");
        // Exits seen while stopping are the deletion's doing: not reported as a crash.
        engine.observe(&id, "app", 0, &exited(143), 10_300);
        assert_eq!(wanted(&mut engine, &id, 10_300), "terminating");
        engine.observe_deleted(&id, 10_400);
        assert_eq!(wanted(&mut engine, &id, 10_500), "absent");
    }

    fn create_probed(engine: &mut Engine) -> String {
        let probe = |failure_threshold| eci_proto::v20180808::Probe {
            exec: Some(eci_proto::v20180808::ExecAction {
                command: vec!["true".into()],
            }),
            failure_threshold,
            ..Default::default()
        };
        let request = CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg".into(),
            v_switch_id: "vsw".into(),
            container_group_name: "probed".into(),
            restart_policy: "Always".into(),
            container: vec![Container {
                name: "app".into(),
                image: "busybox".into(),
                liveness_probe: Some(probe(2)),
                readiness_probe: Some(probe(1)),
                ..Container::default()
            }],
            ..CreateContainerGroupRequest::default()
        };
        engine.create(request, 0).expect("a valid create")
    }

    fn probed(kind: ProbeKind, passed: bool) -> Observation {
        let outcome = if passed {
            ProbeOutcome::Success
        } else {
            ProbeOutcome::Failure {
                message: "exit code 1".into(),
            }
        };
        Observation::Probe { kind, outcome }
    }

    #[test]
    fn readiness_follows_the_readiness_probe() {
        let mut engine = engine();
        let id = create_probed(&mut engine);
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        engine.observe(&id, "app", 0, &Observation::Started, 10_000);
        let ready = |engine: &Engine| engine.groups[&id].containers[0].ready;
        assert!(
            !ready(&engine),
            "not ready before its readiness probe passed"
        );
        engine.observe(&id, "app", 0, &probed(ProbeKind::Readiness, true), 10_100);
        assert!(ready(&engine));
        engine.observe(&id, "app", 0, &probed(ProbeKind::Readiness, false), 10_200);
        assert!(!ready(&engine), "failure threshold 1");
        let events = &engine.groups[&id].events;
        assert!(
            events.iter().any(|e| e.kind == "Warning"
                && e.reason == "Unhealthy"
                && e.message == "Readiness probe failed: exit code 1"),
            "{events:?}"
        );
        // A result of an earlier run changes nothing.
        engine.observe(&id, "app", 1, &probed(ProbeKind::Readiness, true), 10_300);
        assert!(!ready(&engine));
        assert_eq!(
            wanted(&mut engine, &id, 10_300),
            "Run 0",
            "readiness kills nothing"
        );
    }

    #[test]
    fn a_failed_liveness_probe_stops_the_run_and_the_restart_policy_restarts_it() {
        let mut engine = engine();
        let id = create_probed(&mut engine);
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        engine.observe(&id, "app", 0, &Observation::Started, 10_000);
        engine.observe(&id, "app", 0, &probed(ProbeKind::Liveness, false), 10_100);
        assert_eq!(
            wanted(&mut engine, &id, 10_100),
            "Run 0",
            "one failure of two"
        );
        engine.observe(&id, "app", 0, &probed(ProbeKind::Liveness, true), 10_200);
        engine.observe(&id, "app", 0, &probed(ProbeKind::Liveness, false), 10_300);
        assert_eq!(
            wanted(&mut engine, &id, 10_300),
            "Run 0",
            "a success in between"
        );
        engine.observe(&id, "app", 0, &probed(ProbeKind::Liveness, false), 10_400);
        assert_eq!(wanted(&mut engine, &id, 10_400), "Stop 0", "two in a row");
        let events = &engine.groups[&id].events;
        assert!(
            events.iter().any(|e| e.reason == "Killing"
                && e.message == "Container app failed liveness probe, will be restarted"),
            "{events:?}"
        );
        engine.observe(&id, "app", 0, &exited(143), 10_500);
        assert_eq!(
            state(&engine, &id),
            (GroupStatus::Running, "CrashLoopBackOff".into())
        );
        assert_eq!(
            wanted(&mut engine, &id, 11_500),
            "Start 1",
            "after the back-off"
        );
        engine.observe(&id, "app", 1, &Observation::Started, 11_600);
        assert_eq!(
            wanted(&mut engine, &id, 11_700),
            "Run 1",
            "the new run's probes start over"
        );
        assert_eq!(engine.groups[&id].containers[0].restart_count, 1);
    }

    #[test]
    fn a_failed_hook_is_a_warning_event() {
        let mut engine = engine();
        let id = create(&mut engine, "Always");
        assert_eq!(wanted(&mut engine, &id, 10_000), "Start 0");
        engine.observe(&id, "app", 0, &Observation::Started, 10_000);
        let failed = Observation::HookFailed {
            hook: Hook::PostStart,
            message: "exit code 2".into(),
        };
        engine.observe(&id, "app", 0, &failed, 10_100);
        let events = &engine.groups[&id].events;
        assert!(
            events.iter().any(|e| e.kind == "Warning"
                && e.reason == "FailedPostStartHook"
                && e.message == "PostStart hook of container app failed: exit code 2"),
            "{events:?}"
        );
    }
}
