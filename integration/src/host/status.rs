//! What the agent knows about a pod's containers ([`PodRecord`]) and the Pod status it shows
//! for it ([`pod_status`]), following the kubelet's `generateAPIPodStatus` / `getPhase`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Pod condition types the agent owns.
pub(crate) const OWNED_CONDITIONS: [&str; 4] = [
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
];

/// How a container run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Terminated {
    /// Exit code (128 + signal when killed by one).
    pub(crate) exit_code: i32,
    /// The signal that killed it.
    pub(crate) signal: Option<i32>,
    /// `Completed`, `Error`, `StartError`, …
    pub(crate) reason: String,
    /// Why, in words.
    pub(crate) message: Option<String>,
    /// When that run started.
    pub(crate) started_at: Timestamp,
    /// When it ended.
    pub(crate) finished_at: Timestamp,
    /// `host://<pid>` of that run, if it ran.
    pub(crate) container_id: Option<String>,
}

impl Terminated {
    /// An exit with `exit_code` (or by `signal`): `Completed` for 0, else `Error`.
    pub(crate) fn exited(
        exit_code: i32,
        signal: Option<i32>,
        started_at: Timestamp,
        finished_at: Timestamp,
        container_id: Option<String>,
    ) -> Self {
        Self {
            exit_code,
            signal,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.to_owned(),
            message: None,
            started_at,
            finished_at,
            container_id,
        }
    }
}

/// A container's current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunState {
    /// Not running: `ContainerCreating`, `PodInitializing`, `CrashLoopBackOff`,
    /// `CreateContainerConfigError`, `ErrImagePull`.
    Waiting {
        /// Reason.
        reason: String,
        /// Message.
        message: Option<String>,
    },
    /// Running as process `pid`.
    Running {
        /// When this run started.
        started_at: Timestamp,
        /// The process.
        pid: u32,
    },
    /// Ended and not (yet) restarted.
    Terminated(Terminated),
}

/// One container as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerRecord {
    /// Container name.
    pub(crate) name: String,
    /// Image as in the spec.
    pub(crate) image: String,
    /// Where the image's binaries came from.
    pub(crate) image_id: String,
    /// Current state.
    pub(crate) state: RunState,
    /// The previous run's end.
    pub(crate) last_terminated: Option<Terminated>,
    /// Restarts so far.
    pub(crate) restart_count: i32,
    /// Readiness probe verdict (true without a probe once started).
    pub(crate) ready: bool,
    /// Startup probe verdict (true without a probe once running).
    pub(crate) started: bool,
    /// A restartable init container (sidecar).
    pub(crate) sidecar: bool,
}

impl ContainerRecord {
    /// A container not started yet.
    pub(crate) fn new(name: &str, image: &str, waiting_reason: &str, sidecar: bool) -> Self {
        Self {
            name: name.to_owned(),
            image: image.to_owned(),
            image_id: String::new(),
            state: RunState::Waiting {
                reason: waiting_reason.to_owned(),
                message: None,
            },
            last_terminated: None,
            restart_count: 0,
            ready: false,
            started: false,
            sidecar,
        }
    }

    fn is_running(&self) -> bool {
        matches!(self.state, RunState::Running { .. })
    }

    fn succeeded(&self) -> bool {
        matches!(&self.state, RunState::Terminated(t) if t.exit_code == 0)
    }
}

/// The pod-wide facts besides the containers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PodRecord {
    /// Pod IPs (set before anything starts).
    pub(crate) pod_ips: Vec<String>,
    /// The node's IP.
    pub(crate) host_ip: String,
    /// When the agent accepted the pod.
    pub(crate) start_time: Option<Timestamp>,
    /// Sandbox (directories, volumes' directory, hosts file) prepared.
    pub(crate) sandbox_ready: bool,
    /// Init containers, in spec order.
    pub(crate) init: Vec<ContainerRecord>,
    /// Containers, in spec order.
    pub(crate) containers: Vec<ContainerRecord>,
    /// An init container failed for good (restartPolicy Never).
    pub(crate) init_failed: bool,
    /// Nothing will run or restart any more (deleted, shut down, or finished): the phase is
    /// Succeeded or Failed.
    pub(crate) terminal: bool,
    /// Pod-level reason and message (e.g. node shutdown).
    pub(crate) reason: Option<(String, String)>,
}

/// The status to show: phase, IPs, conditions (the owned ones, with transition times carried
/// over from `previous` when unchanged) and container statuses.
pub(crate) fn pod_status(
    pod: &Pod,
    record: &PodRecord,
    previous: &[PodCondition],
    now: Timestamp,
) -> PodStatus {
    let spec = pod.spec.as_ref();
    let restart_policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let phase = phase(record, restart_policy);
    let terminal_phase = matches!(phase, "Succeeded" | "Failed");
    let generation = pod.metadata.generation;
    let mut conditions = Conditions {
        previous,
        now,
        generation,
        list: Vec::new(),
    };
    add_conditions(&mut conditions, pod, record, terminal_phase);

    let statuses =
        |records: &[ContainerRecord]| records.iter().map(container_status).collect::<Vec<_>>();
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions.list),
        host_ip: Some(record.host_ip.clone()),
        host_ips: Some(vec![HostIP {
            ip: record.host_ip.clone(),
        }]),
        pod_ip: record.pod_ips.first().cloned(),
        pod_ips: (!record.pod_ips.is_empty()).then(|| {
            record
                .pod_ips
                .iter()
                .map(|ip| PodIP { ip: ip.clone() })
                .collect()
        }),
        start_time: record.start_time.map(Time),
        container_statuses: Some(statuses(&record.containers)),
        init_container_statuses: (!record.init.is_empty()).then(|| statuses(&record.init)),
        reason: record.reason.as_ref().map(|(reason, _)| reason.clone()),
        message: record.reason.as_ref().map(|(_, message)| message.clone()),
        observed_generation: generation,
        ..PodStatus::default()
    }
}

/// The owned conditions being built, with what carries their transition times over.
struct Conditions<'a> {
    previous: &'a [PodCondition],
    now: Timestamp,
    generation: Option<i64>,
    list: Vec<PodCondition>,
}

impl Conditions<'_> {
    /// Adds condition `type_`, True when `ok` (the reason and message only show when not).
    fn add(&mut self, type_: &str, ok: bool, reason: Option<String>, message: Option<String>) {
        let status = if ok { "True" } else { "False" };
        let since = self
            .previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(self.now));
        self.list.push(PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: if ok { None } else { reason },
            message: if ok { None } else { message },
            last_transition_time: Some(since),
            last_probe_time: None,
            observed_generation: self.generation,
        });
    }
}

/// `PodReadyToStartContainers`, `Initialized`, `ContainersReady` and `Ready`, in that order.
fn add_conditions(
    conditions: &mut Conditions<'_>,
    pod: &Pod,
    record: &PodRecord,
    terminal_phase: bool,
) {
    conditions.add(
        "PodReadyToStartContainers",
        record.sandbox_ready && !terminal_phase,
        None,
        None,
    );

    let incomplete_init: Vec<&str> = record
        .init
        .iter()
        .filter(|c| {
            if c.sidecar {
                !c.started
            } else {
                !c.succeeded()
            }
        })
        .map(|c| c.name.as_str())
        .collect();
    let initialized =
        incomplete_init.is_empty() || (terminal_phase && !record.init_failed && init_ran(record));
    conditions.add(
        "Initialized",
        initialized,
        Some("ContainersNotInitialized".into()),
        Some(format!(
            "containers with incomplete status: [{}]",
            incomplete_init.join(" ")
        )),
    );

    let unready: Vec<&str> = record
        .init
        .iter()
        .filter(|c| c.sidecar)
        .chain(&record.containers)
        .filter(|c| !(c.ready && c.is_running()))
        .map(|c| c.name.as_str())
        .collect();
    let containers_ready = unready.is_empty() && !terminal_phase;
    let (not_ready_reason, not_ready_message) = if terminal_phase {
        ("PodCompleted".to_owned(), None)
    } else {
        (
            "ContainersNotReady".to_owned(),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    conditions.add(
        "ContainersReady",
        containers_ready,
        Some(not_ready_reason.clone()),
        not_ready_message.clone(),
    );

    let gates = readiness_gates(pod);
    let (ready, ready_reason, ready_message) = match (&gates, containers_ready) {
        (_, false) => (false, not_ready_reason, not_ready_message),
        (Some(message), true) => (
            false,
            "ReadinessGatesNotReady".to_owned(),
            Some(message.clone()),
        ),
        (None, true) => (true, String::new(), None),
    };
    conditions.add("Ready", ready, Some(ready_reason), ready_message);
}

fn init_ran(record: &PodRecord) -> bool {
    record.init.iter().all(|c| c.sidecar || c.succeeded())
}

/// `None` when every readiness gate's condition is True, else the kubelet's message.
fn readiness_gates(pod: &Pod) -> Option<String> {
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref())?;
    let conditions: BTreeMap<&str, &str> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    for gate in gates {
        match conditions.get(gate.condition_type.as_str()) {
            None => {
                return Some(format!(
                    "corresponding condition of pod readiness gate \"{}\" does not exist.",
                    gate.condition_type
                ));
            }
            Some(&"True") => {}
            Some(status) => {
                return Some(format!(
                    "the status of pod readiness gate \"{}\" is not \"True\", but {status}",
                    gate.condition_type
                ));
            }
        }
    }
    None
}

/// The kubelet's `getPhase`.
pub(crate) fn phase(record: &PodRecord, restart_policy: &str) -> &'static str {
    if record.init_failed && restart_policy == "Never" {
        return "Failed";
    }
    if record.terminal && record.reason.is_some() {
        return "Failed";
    }
    let pending_init = record.init.iter().any(|c| {
        if c.sidecar {
            !c.started
        } else {
            !c.succeeded()
        }
    });
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &record.containers {
        match &c.state {
            RunState::Running { .. } => running += 1,
            RunState::Terminated(t) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            RunState::Waiting { .. } if c.last_terminated.is_some() => stopped += 1,
            RunState::Waiting { .. } => waiting += 1,
        }
    }
    if record.terminal {
        // Deleted or finished: nothing restarts any more.
        return if running == 0
            && waiting == 0
            && stopped == succeeded
            && !record.containers.is_empty()
            && !record.init_failed
        {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if pending_init || waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return match restart_policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

fn time(at: Timestamp) -> Option<Time> {
    Some(Time(at))
}

fn terminated_state(t: &Terminated) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: t.exit_code,
            signal: t.signal,
            reason: Some(t.reason.clone()),
            message: t.message.clone(),
            started_at: time(t.started_at),
            finished_at: time(t.finished_at),
            container_id: t.container_id.clone(),
        }),
        ..ContainerState::default()
    }
}

/// One container's status.
pub(crate) fn container_status(c: &ContainerRecord) -> ContainerStatus {
    let (state, container_id) = match &c.state {
        RunState::Waiting { reason, message } => (
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..ContainerState::default()
            },
            c.last_terminated
                .as_ref()
                .and_then(|t| t.container_id.clone()),
        ),
        RunState::Running { started_at, pid } => (
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: time(*started_at),
                }),
                ..ContainerState::default()
            },
            Some(format!("host://{pid}")),
        ),
        RunState::Terminated(t) => (terminated_state(t), t.container_id.clone()),
    };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        container_id,
        ready: c.ready && c.is_running(),
        started: Some(c.started && c.is_running()),
        restart_count: c.restart_count,
        state: Some(state),
        last_state: Some(
            c.last_terminated
                .as_ref()
                .map(terminated_state)
                .unwrap_or_default(),
        ),
        ..ContainerStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodReadinessGate, PodSpec};

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn running(name: &str) -> ContainerRecord {
        ContainerRecord {
            state: RunState::Running {
                started_at: at(1),
                pid: 42,
            },
            started: true,
            ready: true,
            ..ContainerRecord::new(name, "img", "ContainerCreating", false)
        }
    }

    fn exited(name: &str, code: i32) -> ContainerRecord {
        ContainerRecord {
            state: RunState::Terminated(Terminated::exited(
                code,
                None,
                at(1),
                at(2),
                Some("host://42".into()),
            )),
            ..ContainerRecord::new(name, "img", "ContainerCreating", false)
        }
    }

    fn backing_off(name: &str) -> ContainerRecord {
        ContainerRecord {
            state: RunState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: None,
            },
            last_terminated: Some(Terminated::exited(1, None, at(1), at(2), None)),
            restart_count: 1,
            ..ContainerRecord::new(name, "img", "ContainerCreating", false)
        }
    }

    fn waiting(name: &str) -> ContainerRecord {
        ContainerRecord::new(name, "img", "ContainerCreating", false)
    }

    fn record(init: Vec<ContainerRecord>, containers: Vec<ContainerRecord>) -> PodRecord {
        PodRecord {
            pod_ips: vec!["127.0.0.2".into()],
            host_ip: "127.0.0.1".into(),
            start_time: Some(at(0)),
            sandbox_ready: true,
            init,
            containers,
            ..PodRecord::default()
        }
    }

    #[test]
    fn phases() {
        let terminal = |mut r: PodRecord| {
            r.terminal = true;
            r
        };
        let init_failed = |mut r: PodRecord| {
            r.init_failed = true;
            r
        };
        let cases: Vec<(&str, PodRecord, &str, &str)> = vec![
            (
                "nothing started",
                record(vec![], vec![waiting("a")]),
                "Always",
                "Pending",
            ),
            (
                "init running",
                record(vec![running("i")], vec![waiting("a")]),
                "Always",
                "Pending",
            ),
            (
                "init done, running",
                record(vec![exited("i", 0)], vec![running("a")]),
                "Always",
                "Running",
            ),
            (
                "one of two waiting",
                record(vec![], vec![running("a"), waiting("b")]),
                "Always",
                "Pending",
            ),
            (
                "crash loop",
                record(vec![], vec![backing_off("a")]),
                "Always",
                "Running",
            ),
            (
                "exited 0, Always",
                record(vec![], vec![exited("a", 0)]),
                "Always",
                "Running",
            ),
            (
                "exited 0, OnFailure",
                record(vec![], vec![exited("a", 0)]),
                "OnFailure",
                "Succeeded",
            ),
            (
                "exited 1, OnFailure",
                record(vec![], vec![exited("a", 1)]),
                "OnFailure",
                "Running",
            ),
            (
                "exited 1, Never",
                record(vec![], vec![exited("a", 1)]),
                "Never",
                "Failed",
            ),
            (
                "mixed, Never",
                record(vec![], vec![exited("a", 0), exited("b", 2)]),
                "Never",
                "Failed",
            ),
            (
                "all 0, Never",
                record(vec![], vec![exited("a", 0), exited("b", 0)]),
                "Never",
                "Succeeded",
            ),
            (
                "one still running, Never",
                record(vec![], vec![exited("a", 1), running("b")]),
                "Never",
                "Running",
            ),
            (
                "init failed, Never",
                init_failed(record(vec![exited("i", 1)], vec![waiting("a")])),
                "Never",
                "Failed",
            ),
            (
                "deleted, all 0",
                terminal(record(vec![], vec![exited("a", 0)])),
                "Always",
                "Succeeded",
            ),
            (
                "deleted, killed",
                terminal(record(vec![], vec![exited("a", 137)])),
                "Always",
                "Failed",
            ),
            (
                "deleted before start",
                terminal(record(vec![], vec![waiting("a")])),
                "Always",
                "Failed",
            ),
        ];
        for (what, record, policy, want) in cases {
            assert_eq!(phase(&record, policy), want, "{what}");
        }
    }

    fn pod(gates: &[&str], conditions: &[(&str, &str)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                readiness_gates: (!gates.is_empty()).then(|| {
                    gates
                        .iter()
                        .map(|g| PodReadinessGate {
                            condition_type: (*g).into(),
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            ..PodCondition::default()
                        })
                        .collect(),
                ),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn condition<'a>(status: &'a PodStatus, type_: &str) -> &'a PodCondition {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .unwrap()
    }

    #[test]
    fn conditions_follow_the_containers() {
        let status = pod_status(
            &pod(&[], &[]),
            &record(vec![running("i")], vec![waiting("a")]),
            &[],
            at(5),
        );
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(
            condition(&status, "PodReadyToStartContainers").status,
            "True"
        );
        let init = condition(&status, "Initialized");
        assert_eq!(init.status, "False");
        assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
        assert_eq!(
            init.message.as_deref(),
            Some("containers with incomplete status: [i]")
        );
        let ready = condition(&status, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [a]")
        );
        assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.2"));
        assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));

        let mut unready = running("b");
        unready.ready = false;
        let r = record(vec![exited("i", 0)], vec![running("a"), unready]);
        let status = pod_status(&pod(&[], &[]), &r, &[], at(5));
        assert_eq!(condition(&status, "Initialized").status, "True");
        assert_eq!(
            condition(&status, "ContainersReady").message.as_deref(),
            Some("containers with unready status: [b]")
        );

        let r = record(vec![], vec![running("a")]);
        let status = pod_status(&pod(&[], &[]), &r, &[], at(5));
        assert_eq!(condition(&status, "Ready").status, "True");
        assert_eq!(
            condition(&status, "Ready").last_transition_time,
            Some(Time(at(5)))
        );
        // Unchanged: the transition time stays.
        let later = pod_status(
            &pod(&[], &[]),
            &r,
            status.conditions.as_deref().unwrap(),
            at(9),
        );
        assert_eq!(
            condition(&later, "Ready").last_transition_time,
            Some(Time(at(5)))
        );
        assert_eq!(later, status);

        let gated = pod_status(&pod(&["example.com/gate"], &[]), &r, &[], at(5));
        assert_eq!(condition(&gated, "ContainersReady").status, "True");
        assert_eq!(
            condition(&gated, "Ready").reason.as_deref(),
            Some("ReadinessGatesNotReady")
        );
        let gated = pod_status(
            &pod(&["example.com/gate"], &[("example.com/gate", "True")]),
            &r,
            &[],
            at(5),
        );
        assert_eq!(condition(&gated, "Ready").status, "True");

        let mut done = record(vec![], vec![exited("a", 0)]);
        done.terminal = true;
        let status = pod_status(&pod(&[], &[]), &done, &[], at(5));
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        assert_eq!(
            condition(&status, "Ready").reason.as_deref(),
            Some("PodCompleted")
        );
        assert_eq!(
            condition(&status, "PodReadyToStartContainers").status,
            "False"
        );
    }

    #[test]
    fn container_statuses() {
        let s = container_status(&running("a"));
        assert_eq!(s.container_id.as_deref(), Some("host://42"));
        assert!(s.ready);
        assert_eq!(s.started, Some(true));
        assert!(s.state.unwrap().running.is_some());

        let s = container_status(&backing_off("a"));
        assert!(!s.ready);
        assert_eq!(s.restart_count, 1);
        let waiting = s.state.unwrap().waiting.unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        let last = s.last_state.unwrap().terminated.unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));

        let s = container_status(&exited("a", 0));
        let t = s.state.unwrap().terminated.unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    }
}
