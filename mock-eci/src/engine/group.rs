//! A container group and its lifecycle: the state machine of one ECI instance.
//!
//! Every transition takes the time it happens at and schedules the next ones on the agenda
//! ([`Timers`]); nothing here reads a clock or does I/O.

use std::net::Ipv4Addr;

use eci_proto::status::{GroupStatus, RestartPolicy};
use eci_proto::v20180808::{Container, CreateContainerGroupRequest};
use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::engine::behaviour::{Behaviour, Readiness};
use crate::engine::probe::{ProbeKind, ProbeOutcome, ProbeTiming, Probing};
use crate::engine::real::Hook;
use crate::engine::timers::{TimerKind, Timers};
use crate::settings::Settings;

/// How long `ErrImagePull` shows before `ImagePullBackOff`.
const PULL_BACKOFF_MS: Millis = 5_000;
/// How long RestartContainerGroup and UpdateContainerGroup keep the group busy.
pub const RESTART_DURATION_MS: Millis = 1_000;
/// Events kept per group (oldest dropped first).
const MAX_EVENTS: usize = 50;
/// Exit code of a container killed by SIGKILL.
const SIGKILL_EXIT: i32 = 137;
/// Appended log lines kept per container (the oldest go first).
pub const MAX_APPENDED_LINES: usize = 10_000;

/// The state of one run of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
    /// Not running: not started yet, backing off, or failing to pull.
    Waiting {
        /// e.g. `ContainerCreating`, `CrashLoopBackOff`, `ImagePullBackOff`.
        reason: String,
        /// Details.
        message: String,
    },
    /// Running since `started_at`.
    Running {
        /// Start time.
        started_at: Millis,
    },
    /// Ended.
    Terminated {
        /// Exit code.
        exit_code: i32,
        /// e.g. `Completed`, `Error`.
        reason: String,
        /// Details.
        message: String,
        /// Signal that ended it, if any.
        signal: Option<i32>,
        /// Start time.
        started_at: Millis,
        /// End time.
        finished_at: Millis,
    },
}

impl RunState {
    fn waiting(reason: &str, message: impl Into<String>) -> Self {
        RunState::Waiting {
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// Whether the container is running.
    pub fn is_running(&self) -> bool {
        matches!(self, RunState::Running { .. })
    }

    /// The exit code, when terminated.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            RunState::Terminated { exit_code, .. } => Some(*exit_code),
            _ => None,
        }
    }

    /// When the current (or ended) run started.
    pub fn started_at(&self) -> Option<Millis> {
        match self {
            RunState::Running { started_at } | RunState::Terminated { started_at, .. } => {
                Some(*started_at)
            }
            RunState::Waiting { .. } => None,
        }
    }
}

/// The runtime state of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRun {
    /// What the container does.
    pub behaviour: Behaviour,
    /// Its current state.
    pub state: RunState,
    /// The state of its previous run, once it restarted.
    pub previous: Option<RunState>,
    /// Passing readiness.
    pub ready: bool,
    /// Started (and not restarted since).
    pub started: bool,
    /// Restarts so far; also the index of the current run.
    pub restart_count: u32,
    /// Waiting for a back-off to end before its next run.
    pub backing_off: bool,
    /// Lines a test wrote into the log through the admin API, with their times (those of the
    /// current and the previous run; at most [`MAX_APPENDED_LINES`]).
    #[serde(default)]
    pub appended: Vec<(Millis, String)>,
    /// Real runtime: run `restart_count` is asked for and not started yet (the driver pulls
    /// and starts it, then reports).
    #[serde(default)]
    pub launch: bool,
    /// Real runtime: what the current run's probes amount to.
    #[serde(default)]
    pub probes: Probing,
}

impl ContainerRun {
    fn new(behaviour: Behaviour) -> Self {
        Self {
            behaviour,
            state: RunState::waiting("ContainerCreating", ""),
            previous: None,
            ready: false,
            started: false,
            restart_count: 0,
            backing_off: false,
            appended: Vec::new(),
            launch: false,
            probes: Probing::default(),
        }
    }

    /// Ended and never starting again.
    fn is_done(&self) -> bool {
        matches!(self.state, RunState::Terminated { .. }) && !self.backing_off
    }
}

/// What a container's environment declares of its type (ECI's user guide: "declaring
/// container types").
#[derive(Debug, Clone, Copy, Default)]
struct Kind {
    /// `ECI_CONTAINER_TYPE=sidecar`: stopped once the other containers ended for good.
    sidecar: bool,
    /// `ECI_CONTAINER_IGNORE_EXIT_CODE=true`: counts as succeeded whatever its exit code.
    ignore_exit_code: bool,
}

impl Kind {
    fn of(container: &Container) -> Self {
        let value = |key: &str| {
            container
                .environment_var
                .iter()
                .rev()
                .find(|var| var.key == key)
                .map(|var| var.value.trim().to_ascii_lowercase())
        };
        Self {
            sidecar: value("ECI_CONTAINER_TYPE").as_deref() == Some("sidecar"),
            ignore_exit_code: value("ECI_CONTAINER_IGNORE_EXIT_CODE").as_deref() == Some("true"),
        }
    }
}

/// Event reason of a spot reclaim, announced and done (ACK's word).
pub const SPOT_TO_BE_RELEASED: &str = "SpotToBeReleased";

/// One event on a group, deduplicated by type, reason and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupEvent {
    /// How often it happened.
    pub count: i32,
    /// `Normal` or `Warning`.
    pub kind: String,
    /// Short machine-readable reason.
    pub reason: String,
    /// Details.
    pub message: String,
    /// First occurrence.
    pub first: Millis,
    /// Last occurrence.
    pub last: Millis,
}

/// One ECI container group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Group {
    /// `eci-…`.
    pub id: String,
    /// The creation request, normalised (defaults filled in).
    pub request: CreateContainerGroupRequest,
    /// Restart policy.
    pub restart_policy: RestartPolicy,
    /// Group vCPU.
    pub cpu: f64,
    /// Group GiB.
    pub memory: f64,
    /// The termination grace period asked for.
    pub grace_seconds: i64,
    /// Status.
    pub status: GroupStatus,
    /// Intranet IP, once scheduled.
    pub ip: Option<Ipv4Addr>,
    /// The IP (and the capacity slot) is still claimed.
    pub holds_capacity: bool,
    /// Creation time.
    pub created_at: Millis,
    /// When provisioning takes (took) place.
    pub provisioned_at: Option<Millis>,
    /// When it succeeded.
    pub succeeded_at: Option<Millis>,
    /// When it failed (or failed to schedule).
    pub failed_at: Option<Millis>,
    /// When it expired.
    pub expired_at: Option<Millis>,
    /// Last change of anything DescribeContainerGroupStatus returns.
    pub changed_at: Millis,
    /// Init containers, in order.
    pub init: Vec<ContainerRun>,
    /// Init containers completed so far.
    pub init_done: usize,
    /// Containers.
    pub containers: Vec<ContainerRun>,
    /// Events.
    pub events: Vec<GroupEvent>,
    /// Bumped whenever pending timers must be forgotten (deletion, restart, final state).
    pub epoch: u32,
    /// Hash of the creation request, to detect a reused ClientToken.
    pub fingerprint: u64,
    /// The vSwitch and zone it landed on (`None` in state files written before zones).
    #[serde(default)]
    pub placement: Option<crate::engine::placement::Placement>,
    /// Where its images come from: pulled, or an image cache.
    #[serde(default)]
    pub image_source: crate::engine::image_cache::ImageSource,
}

/// Borrowed context of a transition: settings, the agenda and the time.
#[derive(Debug)]
pub struct Cx<'a> {
    /// Engine settings.
    pub settings: &'a Settings,
    /// The agenda.
    pub timers: &'a mut Timers,
    /// When the transition happens.
    pub now: Millis,
}

/// Which list a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `InitContainer.N`.
    Init,
    /// `Container.N`.
    Regular,
}

impl Group {
    /// A new, pending group. Schedules the start of scheduling.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        request: CreateContainerGroupRequest,
        valid: crate::engine::validate::ValidCreate,
        fingerprint: u64,
        cx: &mut Cx<'_>,
    ) -> Self {
        let mut group = Self {
            id,
            request,
            restart_policy: valid.restart_policy,
            cpu: valid.cpu,
            memory: valid.memory,
            grace_seconds: valid.grace_seconds,
            status: GroupStatus::Pending,
            ip: None,
            holds_capacity: false,
            created_at: cx.now,
            provisioned_at: None,
            succeeded_at: None,
            failed_at: None,
            expired_at: None,
            changed_at: cx.now,
            init: valid
                .init_behaviours
                .into_iter()
                .map(ContainerRun::new)
                .collect(),
            init_done: 0,
            containers: valid
                .behaviours
                .into_iter()
                .map(ContainerRun::new)
                .collect(),
            events: Vec::new(),
            epoch: 0,
            fingerprint,
            placement: None,
            image_source: crate::engine::image_cache::ImageSource::Pull,
        };
        cx.timers.set(
            cx.now + cx.settings.scheduling_delay_ms,
            &group.id,
            group.epoch,
            TimerKind::BeginScheduling,
        );
        if let Some(deadline) = group.deadline_at() {
            cx.timers
                .set(deadline, &group.id, group.epoch, TimerKind::Deadline);
        }
        group.touch(cx.now);
        group
    }

    /// The container specs of a list.
    pub fn specs(&self, which: Which) -> &[Container] {
        match which {
            Which::Init => &self.request.init_container,
            Which::Regular => &self.request.container,
        }
    }

    /// The runs of a list.
    pub fn runs(&self, which: Which) -> &[ContainerRun] {
        match which {
            Which::Init => &self.init,
            Which::Regular => &self.containers,
        }
    }

    fn runs_mut(&mut self, which: Which) -> &mut Vec<ContainerRun> {
        match which {
            Which::Init => &mut self.init,
            Which::Regular => &mut self.containers,
        }
    }

    /// Finds a container of either list by name.
    pub fn find_container(&self, name: &str) -> Option<(&Container, &ContainerRun)> {
        [Which::Regular, Which::Init].into_iter().find_map(|which| {
            self.specs(which)
                .iter()
                .zip(self.runs(which))
                .find(|(spec, _)| spec.name == name)
        })
    }

    /// Where a container of either list is, by name.
    fn locate(&self, name: &str) -> Option<(Which, usize)> {
        [Which::Regular, Which::Init].into_iter().find_map(|which| {
            self.specs(which)
                .iter()
                .position(|spec| spec.name == name)
                .map(|index| (which, index))
        })
    }

    /// A test writes `lines` into the log of the running container `name` at `now` (admin
    /// API). Lines older than the previous run are forgotten.
    pub fn append_log(&mut self, name: &str, lines: &[String], now: Millis) -> Result<(), String> {
        let (which, index) = self
            .locate(name)
            .ok_or_else(|| format!("no container {name:?} in {}", self.id))?;
        let run = &mut self.runs_mut(which)[index];
        if !run.state.is_running() {
            return Err(format!("container {name:?} of {} is not running", self.id));
        }
        let keep_from = run
            .previous
            .as_ref()
            .and_then(RunState::started_at)
            .or(run.state.started_at())
            .unwrap_or(now);
        run.appended.retain(|(at, _)| *at >= keep_from);
        run.appended
            .extend(lines.iter().map(|line| (now, line.clone())));
        let excess = run.appended.len().saturating_sub(MAX_APPENDED_LINES);
        run.appended.drain(..excess);
        Ok(())
    }

    /// A test ends the running container `name` now with `exit_code` (admin API), as if its
    /// process exited: the restart policy decides what follows.
    pub fn exit_now(&mut self, name: &str, exit_code: i32, cx: &mut Cx<'_>) -> Result<(), String> {
        let (which, index) = self
            .locate(name)
            .ok_or_else(|| format!("no container {name:?} in {}", self.id))?;
        if !self.runs(which)[index].state.is_running() {
            return Err(format!("container {name:?} of {} is not running", self.id));
        }
        let reason = crate::engine::behaviour::default_reason(exit_code);
        self.terminate(which, index, exit_code, reason, "", None, cx);
        self.after_exit(which, index, exit_code, cx);
        Ok(())
    }

    /// The zone the group is in.
    pub fn zone<'a>(&'a self, settings: &'a Settings) -> &'a str {
        if let Some(placed) = &self.placement {
            &placed.zone
        } else if self.request.zone_id.is_empty() {
            &settings.zone
        } else {
            &self.request.zone_id
        }
    }

    /// The vSwitch the group is on: where it was placed, else the first listed.
    pub fn vswitch(&self) -> &str {
        match &self.placement {
            Some(placed) => &placed.vswitch,
            None => self
                .request
                .v_switch_id
                .split(',')
                .next()
                .unwrap_or_default(),
        }
    }

    /// When `ActiveDeadlineSeconds` ends the group, if set.
    pub fn deadline_at(&self) -> Option<Millis> {
        self.request
            .active_deadline_seconds
            .map(|seconds| self.created_at + seconds.saturating_mul(1_000))
    }

    /// Records that the visible status changed.
    pub fn touch(&mut self, now: Millis) {
        self.changed_at = self.changed_at.max(now);
    }

    /// Adds an event, folding it into an identical earlier one.
    pub fn event(&mut self, now: Millis, kind: &str, reason: &str, message: impl Into<String>) {
        let message = message.into();
        if let Some(existing) = self
            .events
            .iter_mut()
            .find(|event| event.kind == kind && event.reason == reason && event.message == message)
        {
            existing.count += 1;
            existing.last = now;
        } else {
            if self.events.len() == MAX_EVENTS {
                self.events.remove(0);
            }
            self.events.push(GroupEvent {
                count: 1,
                kind: kind.to_owned(),
                reason: reason.to_owned(),
                message,
                first: now,
                last: now,
            });
        }
        self.touch(now);
    }

    /// Pending → Scheduling, with an IP (`Some`) or a reason scheduling failed (`Err`).
    pub fn begin_scheduling(&mut self, outcome: Result<Ipv4Addr, (&str, String)>, cx: &mut Cx<'_>) {
        match outcome {
            Ok(ip) => {
                self.ip = Some(ip);
                self.holds_capacity = true;
                self.status = GroupStatus::Scheduling;
                let mut delay = cx.settings.provisioning.pick(&self.id, cx.settings.seed);
                if self.image_source.skips_pull() {
                    // Its images are on the cache's snapshot: no pull, never slower.
                    delay = delay.min(
                        cx.settings
                            .cached_provisioning
                            .pick(&self.id, cx.settings.seed),
                    );
                }
                let provisioned = self.created_at + delay;
                let provisioned = provisioned.max(cx.now);
                self.provisioned_at = Some(provisioned);
                cx.timers
                    .set(provisioned, &self.id, self.epoch, TimerKind::Provisioned);
                self.touch(cx.now);
            }
            Err((reason, message)) => {
                self.event(cx.now, "Warning", reason, message);
                self.finish(GroupStatus::ScheduleFailed, cx);
            }
        }
    }

    /// Scheduling → init containers (status Pending) or containers (Running).
    pub fn provisioned(&mut self, cx: &mut Cx<'_>) {
        let zone = self.zone(cx.settings).to_owned();
        self.event(
            cx.now,
            "Normal",
            "Scheduled",
            format!(
                "Successfully assigned {} to {zone}",
                self.request.container_group_name
            ),
        );
        if self.init.is_empty() {
            self.start_containers(cx);
        } else {
            self.status = GroupStatus::Pending;
            self.start_run(Which::Init, 0, cx);
        }
    }

    fn start_containers(&mut self, cx: &mut Cx<'_>) {
        for index in 0..self.containers.len() {
            self.start_run(Which::Regular, index, cx);
        }
        self.refresh_running_status();
    }

    /// Running once every container has started at least once; Pending while any waits for
    /// its image.
    fn refresh_running_status(&mut self) {
        if matches!(
            self.status,
            GroupStatus::Pending | GroupStatus::Scheduling | GroupStatus::Running
        ) {
            let waiting_for_image = self.containers.iter().any(|run| {
                matches!(&run.state, RunState::Waiting { reason, .. } if reason == "ErrImagePull" || reason == "ImagePullBackOff")
            });
            // Real runtime: a first run asked for and not started yet.
            let never_started = self
                .containers
                .iter()
                .any(|run| run.launch && run.restart_count == 0);
            self.status = if waiting_for_image || never_started {
                GroupStatus::Pending
            } else {
                GroupStatus::Running
            };
        }
    }

    /// Starts the current run of a container (or fails its image pull).
    fn start_run(&mut self, which: Which, index: usize, cx: &mut Cx<'_>) {
        let now = cx.now;
        let (id, epoch) = (self.id.clone(), self.epoch);
        let spec_name = self.specs(which)[index].name.clone();
        let image = self.specs(which)[index].image.clone();
        let run = &mut self.runs_mut(which)[index];
        run.backing_off = false;
        if cx.settings.real_runtime {
            // The runtime driver starts it and reports ([`Self::observed_start`]).
            run.state = RunState::waiting("ContainerCreating", "");
            run.started = false;
            run.ready = false;
            run.launch = true;
            self.touch(now);
            return;
        }
        if run.behaviour.pull_fails {
            run.state = RunState::waiting(
                "ErrImagePull",
                format!(
                    "failed to pull image {image:?}: the image does not exist or the registry denied access"
                ),
            );
            run.started = false;
            cx.timers.set(
                now + PULL_BACKOFF_MS,
                &id,
                epoch,
                TimerKind::PullBackOff {
                    init: which == Which::Init,
                    index,
                },
            );
            self.event(
                now,
                "Warning",
                "Failed",
                format!("Failed to pull image {image:?}"),
            );
            return;
        }
        run.state = RunState::Running { started_at: now };
        run.started = true;
        run.ready = false;
        let run_index = run.restart_count;
        if let Some(exit) = run.behaviour.exit_for_run(run_index) {
            cx.timers.set(
                now + exit.after_ms,
                &id,
                epoch,
                TimerKind::Exit {
                    init: which == Which::Init,
                    index,
                    run: run_index,
                },
            );
        }
        if which == Which::Regular {
            match run.behaviour.readiness {
                Readiness::After(0) => run.ready = true,
                Readiness::After(delay) => cx.timers.set(
                    now + delay,
                    &id,
                    epoch,
                    TimerKind::Ready {
                        index,
                        run: run_index,
                    },
                ),
                Readiness::Never => {}
            }
        }
        self.event(
            now,
            "Normal",
            "Started",
            format!("Started container {spec_name}"),
        );
    }

    /// A timer: the container's planned exit.
    pub fn exit(&mut self, which: Which, index: usize, run_index: u32, cx: &mut Cx<'_>) {
        let run = &self.runs(which)[index];
        if run.restart_count != run_index || !run.state.is_running() {
            return;
        }
        let Some(exit) = run.behaviour.exit_for_run(run_index).cloned() else {
            return;
        };
        self.terminate(which, index, exit.code, &exit.reason, "", None, cx);
        self.after_exit(which, index, exit.code, cx);
    }

    /// Marks a running container terminated.
    #[allow(clippy::too_many_arguments)]
    fn terminate(
        &mut self,
        which: Which,
        index: usize,
        exit_code: i32,
        reason: &str,
        message: &str,
        signal: Option<i32>,
        cx: &Cx<'_>,
    ) {
        let run = &mut self.runs_mut(which)[index];
        let started_at = run.state.started_at().unwrap_or(cx.now);
        run.state = RunState::Terminated {
            exit_code,
            reason: reason.to_owned(),
            message: message.to_owned(),
            signal,
            started_at,
            finished_at: cx.now,
        };
        run.ready = which == Which::Init && exit_code == 0;
        self.touch(cx.now);
    }

    /// What follows an exit: the next init container, a restart, or the end of the group.
    fn after_exit(&mut self, which: Which, index: usize, exit_code: i32, cx: &mut Cx<'_>) {
        let name = self.specs(which)[index].name.clone();
        if which == Which::Init && exit_code == 0 {
            self.init_done = index + 1;
            if self.init_done < self.init.len() {
                self.start_run(Which::Init, self.init_done, cx);
            } else {
                self.start_containers(cx);
            }
            return;
        }
        if self.restart_policy.restarts(exit_code) {
            let run = &mut self.runs_mut(which)[index];
            let backoff = cx.settings.restart_backoff(run.restart_count);
            run.backing_off = true;
            run.previous = Some(run.state.clone());
            run.state = RunState::waiting(
                "CrashLoopBackOff",
                format!(
                    "back-off {}s restarting failed container={name}",
                    backoff / 1_000
                ),
            );
            let run_index = run.restart_count;
            cx.timers.set(
                cx.now + backoff,
                &self.id,
                self.epoch,
                TimerKind::Restart {
                    init: which == Which::Init,
                    index,
                    run: run_index,
                },
            );
            self.event(
                cx.now,
                "Warning",
                "BackOff",
                format!("Back-off restarting failed container {name}"),
            );
            return;
        }
        if which == Which::Init {
            // A failed init container under restartPolicy Never fails the whole group.
            self.event(
                cx.now,
                "Warning",
                "InitContainerFailed",
                format!("Init container {name} exited with code {exit_code}"),
            );
            self.finish(GroupStatus::Failed, cx);
            return;
        }
        self.end_if_done(cx);
    }

    /// The group ends once its containers have ended for good. Sidecars
    /// (`ECI_CONTAINER_TYPE=sidecar`) do not hold it: once every other container ended, ECI
    /// stops them (SIGKILL, 137), and a container with `ECI_CONTAINER_IGNORE_EXIT_CODE=true`
    /// counts as succeeded whatever its code.
    fn end_if_done(&mut self, cx: &mut Cx<'_>) {
        let kinds: Vec<Kind> = self.request.container.iter().map(Kind::of).collect();
        let apps_done = self
            .containers
            .iter()
            .zip(&kinds)
            .all(|(run, kind)| kind.sidecar || run.is_done());
        let has_apps = kinds.iter().any(|kind| !kind.sidecar);
        if has_apps && apps_done {
            for (index, kind) in kinds.iter().enumerate() {
                if kind.sidecar && self.containers[index].state.is_running() {
                    let name = self.request.container[index].name.clone();
                    self.event(
                        cx.now,
                        "Normal",
                        "Killing",
                        format!("Stopping sidecar container {name}: the other containers ended"),
                    );
                    // Reported as succeeded when its exit code is to be ignored.
                    let (code, reason) = if kind.ignore_exit_code {
                        (0, "Completed")
                    } else {
                        (137, "Error")
                    };
                    self.terminate(Which::Regular, index, code, reason, "", Some(9), cx);
                }
                // A sidecar backing off restarts no more.
                if kind.sidecar {
                    self.containers[index].backing_off = false;
                }
            }
        }
        if !self.containers.iter().all(ContainerRun::is_done) {
            return;
        }
        let all_zero = self
            .containers
            .iter()
            .zip(&kinds)
            .all(|(run, kind)| kind.ignore_exit_code || run.state.exit_code() == Some(0));
        self.finish(
            if all_zero {
                GroupStatus::Succeeded
            } else {
                GroupStatus::Failed
            },
            cx,
        );
    }

    /// A timer: a back-off ended.
    pub fn restart(&mut self, which: Which, index: usize, run_index: u32, cx: &mut Cx<'_>) {
        let run = &mut self.runs_mut(which)[index];
        if run.restart_count != run_index || !run.backing_off {
            return;
        }
        run.restart_count += 1;
        self.start_run(which, index, cx);
    }

    /// A timer: readiness passed.
    pub fn ready(&mut self, index: usize, run_index: u32, now: Millis) {
        let run = &mut self.containers[index];
        if run.restart_count == run_index && run.state.is_running() && !run.ready {
            run.ready = true;
            self.touch(now);
        }
    }

    /// A timer: `ErrImagePull` becomes `ImagePullBackOff`.
    pub fn pull_backoff(&mut self, which: Which, index: usize, now: Millis) {
        let image = self.specs(which)[index].image.clone();
        let run = &mut self.runs_mut(which)[index];
        if matches!(&run.state, RunState::Waiting { reason, .. } if reason == "ErrImagePull") {
            run.state = RunState::waiting(
                "ImagePullBackOff",
                format!("Back-off pulling image {image:?}"),
            );
            self.event(
                now,
                "Normal",
                "BackOff",
                format!("Back-off pulling image {image:?}"),
            );
        }
    }

    /// A timer: the active deadline passed.
    pub fn deadline(&mut self, cx: &mut Cx<'_>) {
        if self.status.is_final() || self.status == GroupStatus::Terminating {
            return;
        }
        self.kill_running(SIGKILL_EXIT, "DeadlineExceeded", cx);
        self.event(
            cx.now,
            "Warning",
            "DeadlineExceeded",
            "Pod was active on the node longer than the specified deadline",
        );
        self.finish(GroupStatus::Failed, cx);
    }

    fn kill_running(&mut self, exit_code: i32, reason: &str, cx: &Cx<'_>) {
        for which in [Which::Init, Which::Regular] {
            for index in 0..self.runs(which).len() {
                if self.runs(which)[index].state.is_running() {
                    self.terminate(which, index, exit_code, reason, "", Some(9), cx);
                }
            }
        }
    }

    /// Enters a final status: forgets pending timers and schedules the end of retention.
    pub fn finish(&mut self, status: GroupStatus, cx: &mut Cx<'_>) {
        self.status = status;
        match status {
            GroupStatus::Succeeded => self.succeeded_at = Some(cx.now),
            GroupStatus::Expired => self.expired_at = Some(cx.now),
            _ => self.failed_at = Some(cx.now),
        }
        for run in self.init.iter_mut().chain(self.containers.iter_mut()) {
            run.backing_off = false;
            run.ready = false;
        }
        self.epoch += 1;
        cx.timers.set(
            cx.now + cx.settings.retention_ms,
            &self.id,
            self.epoch,
            TimerKind::Retire,
        );
        self.touch(cx.now);
    }

    /// The service's notice ahead of a spot reclaim (ECI gives about 3 minutes): a Warning
    /// event; the group runs on until [`Self::expire`].
    pub fn announce_reclaim(&mut self, now: Millis) {
        self.event(
            now,
            "Warning",
            SPOT_TO_BE_RELEASED,
            "The spot instance will be reclaimed in about 3 minutes",
        );
    }

    /// Spot reclaim: the group ends `Expired`.
    pub fn expire(&mut self, cx: &mut Cx<'_>) {
        self.kill_running(SIGKILL_EXIT, "Expired", cx);
        self.event(
            cx.now,
            "Warning",
            SPOT_TO_BE_RELEASED,
            "The spot instance was reclaimed by the cloud provider",
        );
        self.finish(GroupStatus::Expired, cx);
    }

    /// Starts a deletion. Returns `true` when the group must disappear at once (forced, nothing
    /// running, or no grace); otherwise it is `Terminating` until the grace period ends.
    pub fn begin_termination(&mut self, force: bool, cx: &mut Cx<'_>) -> bool {
        if self.status == GroupStatus::Terminating && !force {
            return false;
        }
        let grace = (self.grace_seconds.saturating_mul(1_000)).min(cx.settings.max_grace_ms);
        let stop_after = self
            .init
            .iter()
            .chain(&self.containers)
            .filter(|run| run.state.is_running())
            .map(|run| {
                run.behaviour
                    .stop_after_ms
                    .or(cx.settings.stop_after_ms)
                    .map_or(grace, |stop| stop.min(grace))
            })
            .max();
        let Some(stop_after) = stop_after.filter(|stop| !force && *stop > 0) else {
            return true;
        };
        for which in [Which::Init, Which::Regular] {
            for index in 0..self.runs(which).len() {
                if self.runs(which)[index].state.is_running() {
                    let name = self.specs(which)[index].name.clone();
                    self.event(
                        cx.now,
                        "Normal",
                        "Killing",
                        format!("Stopping container {name}"),
                    );
                }
            }
        }
        self.status = GroupStatus::Terminating;
        self.epoch += 1;
        cx.timers.set(
            cx.now + stop_after,
            &self.id,
            self.epoch,
            TimerKind::TerminationDone,
        );
        self.touch(cx.now);
        false
    }

    /// RestartContainerGroup: every container stops, then starts again.
    pub fn begin_restart(&mut self, cx: &mut Cx<'_>) {
        self.kill_running(0, "Restarted", cx);
        self.status = GroupStatus::Restarting;
        self.rearm(cx);
        cx.timers.set(
            cx.now + RESTART_DURATION_MS,
            &self.id,
            self.epoch,
            TimerKind::RestartDone,
        );
        self.event(
            cx.now,
            "Normal",
            "Restarting",
            "Restarting the container group",
        );
    }

    /// UpdateContainerGroup with new containers: they are replaced after a short while.
    pub fn begin_update(&mut self, cx: &mut Cx<'_>) {
        self.kill_running(0, "Replaced", cx);
        self.status = GroupStatus::Updating;
        self.rearm(cx);
        cx.timers.set(
            cx.now + RESTART_DURATION_MS,
            &self.id,
            self.epoch,
            TimerKind::UpdateDone,
        );
        self.event(cx.now, "Normal", "Updating", "Updating the container group");
    }

    /// UpdateContainerGroup that only changed the files of `ConfigFileVolume`s: the new files
    /// are in place at once, like the kubelet's atomic writes of a projected volume; the group
    /// shows `Updating` for a moment (the API says an update turns the instance `Updating`) and
    /// no container is stopped or restarted. A group not running yet just gets the new files.
    pub fn rewrite_files(&mut self, volumes: &[String], cx: &mut Cx<'_>) {
        self.event(
            cx.now,
            "Normal",
            "VolumesUpdated",
            format!("Updated the files of volume(s) {}", volumes.join(", ")),
        );
        if self.status != GroupStatus::Running {
            return;
        }
        self.status = GroupStatus::Updating;
        // Same epoch: the containers' own timers (exits, readiness) stay valid.
        cx.timers.set(
            cx.now + RESTART_DURATION_MS,
            &self.id,
            self.epoch,
            TimerKind::FilesRewritten,
        );
        self.touch(cx.now);
    }

    /// A timer: an in-place file update finished; the group is `Running` again unless
    /// something else (a deletion, the containers ending) changed its status meanwhile.
    pub fn files_rewritten(&mut self, cx: &mut Cx<'_>) {
        if self.status == GroupStatus::Updating {
            self.status = GroupStatus::Running;
            self.refresh_running_status();
            self.touch(cx.now);
        }
    }

    /// New epoch (old timers stale) with the deadline kept.
    fn rearm(&mut self, cx: &mut Cx<'_>) {
        self.epoch += 1;
        if let Some(deadline) = self.deadline_at() {
            cx.timers.set(
                deadline.max(cx.now),
                &self.id,
                self.epoch,
                TimerKind::Deadline,
            );
        }
        self.touch(cx.now);
    }

    /// A timer: a restart or an update finished; containers run again (behaviours from
    /// `behaviours` when the spec changed).
    pub fn restart_done(&mut self, behaviours: Option<Vec<Behaviour>>, cx: &mut Cx<'_>) {
        if let Some(behaviours) = behaviours {
            let previous = std::mem::take(&mut self.containers);
            self.containers = behaviours.into_iter().map(ContainerRun::new).collect();
            // A container in the same position keeps its restart history.
            for (run, old) in self.containers.iter_mut().zip(previous) {
                run.restart_count = old.restart_count;
                run.previous = old.previous;
                run.state = old.state;
                run.appended = old.appended;
            }
        }
        for run in &mut self.containers {
            if matches!(run.state, RunState::Terminated { .. }) {
                run.previous = Some(run.state.clone());
                run.restart_count += 1;
            }
        }
        self.status = GroupStatus::Running;
        self.start_containers(cx);
    }

    /// Whether what the real runtime reports still matters: not once the group ended or is
    /// being deleted (its containers are being stopped on purpose).
    fn takes_observations(&self) -> bool {
        !self.status.is_final() && self.status != GroupStatus::Terminating
    }

    /// The container `name`'s run `run` if it is the current one and the group takes
    /// observations.
    fn observed_run(&self, name: &str, run: u32) -> Option<(Which, usize)> {
        let (which, index) = self.locate(name)?;
        let current = &self.runs(which)[index];
        (self.takes_observations() && current.restart_count == run).then_some((which, index))
    }

    /// Real runtime: run `run` of container `name` started at `cx.now`.
    pub fn observed_start(&mut self, name: &str, run: u32, cx: &mut Cx<'_>) {
        let Some((which, index)) = self.observed_run(name, run) else {
            return;
        };
        let spec = &self.specs(which)[index].clone();
        let current = &mut self.runs_mut(which)[index];
        if !current.launch {
            return;
        }
        current.launch = false;
        current.state = RunState::Running { started_at: cx.now };
        current.started = true;
        current.probes = Probing::default();
        // Without a readiness probe, a running container is ready.
        current.ready = which == Which::Regular && probe_of(spec, ProbeKind::Readiness).is_none();
        self.event(
            cx.now,
            "Normal",
            "Started",
            format!("Started container {name}"),
        );
        self.refresh_running_status();
    }

    /// Real runtime: run `run` of container `name` exited with `exit_code` at `cx.now`, leaving
    /// `message` (its termination message); the restart policy decides what follows.
    pub fn observed_exit(
        &mut self,
        name: &str,
        run: u32,
        exit_code: i32,
        message: &str,
        cx: &mut Cx<'_>,
    ) {
        let Some((which, index)) = self.observed_run(name, run) else {
            return;
        };
        if !self.runs(which)[index].state.is_running() {
            return;
        }
        let signal = (exit_code > 128).then_some(exit_code - 128);
        let reason = crate::engine::behaviour::default_reason(exit_code);
        self.terminate(which, index, exit_code, reason, message, signal, cx);
        self.after_exit(which, index, exit_code, cx);
    }

    /// Real runtime: run `run` of container `name` could not be started (`message` says
    /// why): it ends at once with code 128, `StartError`, and the restart policy applies.
    pub fn observed_start_failure(&mut self, name: &str, run: u32, message: &str, cx: &mut Cx<'_>) {
        let Some((which, index)) = self.observed_run(name, run) else {
            return;
        };
        let current = &mut self.runs_mut(which)[index];
        if !current.launch {
            return;
        }
        current.launch = false;
        self.event(cx.now, "Warning", "Failed", format!("Error: {message}"));
        self.terminate(which, index, 128, "StartError", message, None, cx);
        self.after_exit(which, index, 128, cx);
    }

    /// Real runtime: pulling the image of run `run` of container `name` failed: it waits in
    /// `ErrImagePull` (`ImagePullBackOff` after a while) with a Warning event; the driver
    /// retries while the run is still asked for.
    pub fn observed_pull_failure(
        &mut self,
        name: &str,
        run: u32,
        message: &str,
        event_message: &str,
        cx: &mut Cx<'_>,
    ) {
        let Some((which, index)) = self.observed_run(name, run) else {
            return;
        };
        let (id, epoch) = (self.id.clone(), self.epoch);
        let current = &mut self.runs_mut(which)[index];
        if !current.launch {
            return;
        }
        current.state = RunState::waiting("ErrImagePull", message);
        cx.timers.set(
            cx.now + PULL_BACKOFF_MS,
            &id,
            epoch,
            TimerKind::PullBackOff {
                init: which == Which::Init,
                index,
            },
        );
        self.event(cx.now, "Warning", "Failed", event_message);
        self.refresh_running_status();
    }

    /// Real runtime: a probe of run `run` of container `name` ran. Readiness follows the
    /// readiness probe; a liveness probe that turns failing has the run killed (the plan
    /// stops it) and the restart policy decides what follows its exit. Each failure is an
    /// `Unhealthy` event.
    pub fn observed_probe(
        &mut self,
        name: &str,
        run: u32,
        kind: ProbeKind,
        outcome: &ProbeOutcome,
        cx: &mut Cx<'_>,
    ) {
        let Some((which, index)) = self.observed_run(name, run) else {
            return;
        };
        let Some(probe) = probe_of(&self.specs(which)[index], kind) else {
            return;
        };
        let timing = ProbeTiming::of(kind, probe);
        let current = &mut self.runs_mut(which)[index];
        let killing = !current.probes.liveness.is_passing();
        if which == Which::Init || !current.state.is_running() || killing {
            return;
        }
        let state = current.probes.get_mut(kind);
        let before = *state;
        *state = before.after(*outcome == ProbeOutcome::Success, &timing);
        let after = *state;
        if kind == ProbeKind::Readiness {
            current.ready = after.is_passing();
        }
        if let ProbeOutcome::Failure { message } = outcome {
            let word = kind.word();
            self.event(
                cx.now,
                "Warning",
                "Unhealthy",
                format!("{word} probe failed: {message}"),
            );
        }
        if kind == ProbeKind::Liveness && !after.is_passing() {
            self.event(
                cx.now,
                "Normal",
                "Killing",
                format!("Container {name} failed liveness probe, will be restarted"),
            );
        }
        if before.is_passing() != after.is_passing() {
            self.touch(cx.now);
        }
    }

    /// Real runtime: a lifecycle hook of run `run` of container `name` failed (a failed
    /// postStart hook also has the runtime kill the run).
    pub fn observed_hook_failure(
        &mut self,
        name: &str,
        run: u32,
        hook: Hook,
        message: &str,
        cx: &mut Cx<'_>,
    ) {
        if self.observed_run(name, run).is_none() {
            return;
        }
        let reason = match hook {
            Hook::PostStart => "FailedPostStartHook",
            Hook::PreStop => "FailedPreStopHook",
        };
        self.event(
            cx.now,
            "Warning",
            reason,
            format!("{} hook of container {name} failed: {message}", hook.word()),
        );
    }
}

/// The container's probe of that kind, if it has one.
pub fn probe_of(spec: &Container, kind: ProbeKind) -> Option<&eci_proto::v20180808::Probe> {
    match kind {
        ProbeKind::Liveness => spec.liveness_probe.as_ref(),
        ProbeKind::Readiness => spec.readiness_probe.as_ref(),
    }
}
