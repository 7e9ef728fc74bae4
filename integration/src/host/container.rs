//! One container's life: prepare (environment, image binary, mounts), start, probe, wait,
//! restart per policy with exponential back-off (`CrashLoopBackOff`), and stop gracefully
//! (preStop, SIGTERM, SIGKILL at the deadline) when the pod worker asks.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, ObjectReference, Pod, Probe, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::env::{self, EnvSources, FieldContext};
use super::probe::{self, ProbeKind, Thresholds, Timing, Verdict};
use super::process::{self, Launch, Mount, ProcessError};
use super::status::{ContainerRecord, PodRecord, RunState, Terminated};
use super::{Ctx, volumes};

/// Which container of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// `spec.initContainers[i]`.
    Init(usize),
    /// `spec.containers[i]`.
    Main(usize),
}

/// What a pod's containers share.
#[derive(Debug)]
pub(crate) struct PodShared {
    /// The agent.
    pub(crate) ctx: Arc<Ctx>,
    /// Namespace.
    pub(crate) namespace: String,
    /// Name.
    pub(crate) name: String,
    /// UID.
    pub(crate) uid: String,
    /// `<dir>/pods/<namespace>_<name>`: logs, pid files, hosts file, volumes.
    pub(crate) dir: PathBuf,
    /// The pod's IP.
    pub(crate) pod_ip: String,
    /// The containers' states.
    pub(crate) record: parking_lot::Mutex<PodRecord>,
    /// Bumped on every change of `record`.
    pub(crate) changes: watch::Sender<u64>,
    /// The latest Pod object.
    pub(crate) pod: watch::Receiver<Arc<Pod>>,
}

impl PodShared {
    /// The hosts file bind-mounted as `/etc/hosts`.
    pub(crate) fn hosts_file(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    /// Where volumes live.
    pub(crate) fn volumes_dir(&self) -> PathBuf {
        self.dir.join("volumes")
    }

    /// Changes the pod record and tells the status writer.
    pub(crate) fn update_record(&self, f: impl FnOnce(&mut PodRecord)) {
        {
            let mut record = self.record.lock();
            f(&mut record);
        }
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Changes one container's record.
    pub(crate) fn update(&self, slot: Slot, f: impl FnOnce(&mut ContainerRecord)) {
        self.update_record(|record| {
            let c = match slot {
                Slot::Init(i) => record.init.get_mut(i),
                Slot::Main(i) => record.containers.get_mut(i),
            };
            if let Some(c) = c {
                f(c);
            }
        });
    }

    /// A copy of the record.
    pub(crate) fn snapshot(&self) -> PodRecord {
        self.record.lock().clone()
    }

    /// The latest Pod object.
    pub(crate) fn latest(&self) -> Arc<Pod> {
        Arc::clone(&self.pod.borrow())
    }

    fn container(&self, slot: Slot) -> Option<Container> {
        let pod = self.latest();
        let spec = pod.spec.as_ref()?;
        match slot {
            Slot::Init(i) => spec.init_containers.as_ref()?.get(i).cloned(),
            Slot::Main(i) => spec.containers.get(i).cloned(),
        }
    }

    /// Records a kubelet-style Event on the pod (best effort: a slow or failing API server only
    /// costs a debug line).
    pub(crate) async fn event(&self, warning: bool, reason: &str, note: String) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        match tokio::time::timeout(
            Duration::from_secs(2),
            self.ctx.recorder.publish(&event, &reference),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => debug!(error = %error, reason, "event not recorded"),
            Err(_) => debug!(reason, "event not recorded in time"),
        }
    }

    /// `terminationGracePeriodSeconds` (default 30 s).
    pub(crate) fn grace(&self) -> Duration {
        let pod = self.latest();
        let seconds = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }
}

/// The pod worker's request to stop a container by `deadline` (SIGKILL then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StopRequest {
    /// When SIGKILL is sent.
    pub(crate) deadline: Instant,
}

/// How a container's runner ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Exited 0 and is not restarted.
    Succeeded,
    /// Exited non-zero (or could not run) and is not restarted.
    Failed,
    /// Stopped on request.
    Stopped,
}

/// Restart back-off: the first restart at once, then `initial`, doubling up to `max`; reset
/// after a run longer than twice `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A fresh back-off.
    pub(crate) fn new((initial, max): (Duration, Duration)) -> Self {
        Self {
            initial,
            max: max.max(initial),
            next: Duration::ZERO,
        }
    }

    /// The delay before the next start after a run of `ran_for`.
    pub(crate) fn next_delay(&mut self, ran_for: Duration) -> Duration {
        if ran_for > self.max * 2 {
            self.next = Duration::ZERO;
        }
        let delay = self.next;
        self.next = if delay.is_zero() {
            self.initial
        } else {
            (delay * 2).min(self.max)
        };
        delay
    }
}

/// Whether a container that exited with `exit_code` runs again under `policy`.
pub(crate) fn restarts(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Always" => true,
        "OnFailure" => exit_code != 0,
        _ => false,
    }
}

/// The restart policy that applies to the container in `slot`: the pod's for containers,
/// `OnFailure` for init containers (`Never` in a `Never` pod), `Always` for sidecars.
pub(crate) fn policy_for(pod_policy: &str, slot: Slot, container: &Container) -> &'static str {
    match slot {
        Slot::Init(_) if container.restart_policy.as_deref() == Some("Always") => "Always",
        Slot::Init(_) if pod_policy == "Never" => "Never",
        Slot::Init(_) => "OnFailure",
        Slot::Main(_) => match pod_policy {
            "Never" => "Never",
            "OnFailure" => "OnFailure",
            _ => "Always",
        },
    }
}

/// Why a container could not be started (kubelet waiting reason and message).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NotStarted {
    reason: &'static str,
    message: String,
}

/// A prepared run.
#[derive(Debug)]
struct Prepared {
    launch: Launch,
    image_id: String,
}

/// Runs the container in `slot` until it is finished for good or `stop` asks.
pub(crate) async fn run(
    shared: Arc<PodShared>,
    slot: Slot,
    mut stop: watch::Receiver<Option<StopRequest>>,
) -> Outcome {
    let Some(container) = shared.container(slot) else {
        return Outcome::Failed;
    };
    let pod_policy = shared
        .latest()
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".to_owned());
    let policy = policy_for(&pod_policy, slot, &container);
    let mut backoff = Backoff::new(shared.ctx.config.restart_backoff);
    let mut first = true;
    let mut last_failure: Option<String> = None;
    let pid_file = shared.dir.join(format!("{}.pid", container.name));
    loop {
        if stop.borrow().is_some() {
            return Outcome::Stopped;
        }
        let started_at = Timestamp::now();
        let started = Instant::now();
        let run = match prepare(&shared, &container).await {
            Ok(prepared) => {
                last_failure = None;
                start_with_events(&shared, slot, &container, prepared, first, &pid_file).await
            }
            Err(not_started) => {
                show_not_started(&shared, slot, &container, not_started, &mut last_failure).await;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(2)) => continue,
                    _ = stop_requested(&mut stop) => return Outcome::Stopped,
                }
            }
        };
        first = false;
        let (terminated, stopped) = match run {
            Err(error) => {
                warn!(container = %container.name, error = %error, "container could not start");
                let mut t = Terminated::exited(128, None, started_at, Timestamp::now(), None);
                t.reason = "StartError".into();
                t.message = Some(error.to_string());
                (t, false)
            }
            Ok((mut child, pid, launch)) => {
                let container_id = Some(format!("host://{pid}"));
                let (status, stopped) = supervise(
                    &shared, slot, &container, &mut child, pid, &launch, &mut stop,
                )
                .await;
                process::signal(&shared.ctx.tools, pid, "KILL", true).await;
                let _ = std::fs::remove_file(&pid_file);
                (terminated_from(status, started_at, container_id), stopped)
            }
        };
        let exit_code = terminated.exit_code;
        info!(container = %container.name, exit_code, reason = %terminated.reason, "container ended");
        if stopped || !restarts(policy, exit_code) || stop.borrow().is_some() {
            return finish(&shared, slot, terminated, stopped);
        }
        let delay = backoff.next_delay(started.elapsed());
        if !back_off(&shared, slot, &container, terminated, delay, &mut stop).await {
            return Outcome::Stopped;
        }
    }
}

/// Starts a prepared run, with the events kubelet emits for it.
async fn start_with_events(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    prepared: Prepared,
    first: bool,
    pid_file: &Path,
) -> Result<(tokio::process::Child, u32, Launch), ProcessError> {
    let image = container.image.clone().unwrap_or_default();
    shared
        .event(
            false,
            "Pulled",
            format!("Container image \"{image}\" already present on machine"),
        )
        .await;
    let started = start(shared, slot, container, prepared, first, pid_file);
    match &started {
        Ok(_) => {
            let name = &container.name;
            shared
                .event(false, "Created", format!("Created container: {name}"))
                .await;
            shared
                .event(false, "Started", format!("Started container {name}"))
                .await;
        }
        Err(error) => {
            shared
                .event(true, "Failed", format!("Error: {error}"))
                .await;
        }
    }
    started
}

/// Shows the container waiting and why, with an event when the reason is new.
async fn show_not_started(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    not_started: NotStarted,
    last_failure: &mut Option<String>,
) {
    if last_failure.as_deref() != Some(not_started.message.as_str()) {
        *last_failure = Some(not_started.message.clone());
        shared
            .event(true, "Failed", format!("Error: {}", not_started.message))
            .await;
    }
    debug!(container = %container.name, reason = not_started.reason, message = %not_started.message, "container not started");
    shared.update(slot, |c| {
        c.state = RunState::Waiting {
            reason: not_started.reason.to_owned(),
            message: Some(not_started.message),
        };
    });
}

/// Shows the container terminated for good, and says how its runner ended.
fn finish(shared: &PodShared, slot: Slot, terminated: Terminated, stopped: bool) -> Outcome {
    let exit_code = terminated.exit_code;
    shared.update(slot, |c| {
        c.state = RunState::Terminated(terminated);
        c.ready = false;
        c.started = false;
    });
    match (stopped, exit_code) {
        (true, _) => Outcome::Stopped,
        (false, 0) => Outcome::Succeeded,
        (false, _) => Outcome::Failed,
    }
}

/// Shows the container terminated, or in `CrashLoopBackOff` for `delay`, and waits that long;
/// `false` when a stop is requested meanwhile.
async fn back_off(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    terminated: Terminated,
    delay: Duration,
    stop: &mut watch::Receiver<Option<StopRequest>>,
) -> bool {
    let message = format!(
        "back-off {} restarting failed container={} pod={}_{}({})",
        humantime::format_duration(delay),
        container.name,
        shared.name,
        shared.namespace,
        shared.uid
    );
    shared.update(slot, |c| {
        c.last_terminated = Some(terminated.clone());
        c.ready = false;
        c.started = false;
        c.state = if delay.is_zero() {
            RunState::Terminated(terminated)
        } else {
            RunState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(message),
            }
        };
    });
    if !delay.is_zero() {
        shared
            .event(
                true,
                "BackOff",
                format!(
                    "Back-off restarting failed container {} in pod {}_{}({})",
                    container.name, shared.name, shared.namespace, shared.uid
                ),
            )
            .await;
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop_requested(stop) => return false,
        }
    }
    true
}

/// Resolves once a stop is requested (or the pod worker is gone).
async fn stop_requested(stop: &mut watch::Receiver<Option<StopRequest>>) -> StopRequest {
    loop {
        if let Some(request) = *stop.borrow_and_update() {
            return request;
        }
        if stop.changed().await.is_err() {
            return StopRequest {
                deadline: Instant::now(),
            };
        }
    }
}

fn terminated_from(
    status: Option<ExitStatus>,
    started_at: Timestamp,
    container_id: Option<String>,
) -> Terminated {
    use std::os::unix::process::ExitStatusExt as _;
    let (code, signal) = match status {
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(signal)) => (128 + signal, Some(signal)),
            (None, None) => (255, None),
        },
        None => (255, None),
    };
    Terminated::exited(code, signal, started_at, Timestamp::now(), container_id)
}

/// Starts a prepared run and shows it as Running.
fn start(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    prepared: Prepared,
    first: bool,
    pid_file: &Path,
) -> Result<(tokio::process::Child, u32, Launch), ProcessError> {
    let child = process::spawn(&shared.ctx.tools, &prepared.launch)?;
    let pid = child.id().unwrap_or_default();
    std::fs::write(pid_file, format!("{pid}\n")).map_err(|source| ProcessError::File {
        what: "write pid file",
        path: pid_file.to_owned(),
        source,
    })?;
    info!(container = %container.name, pid, program = %prepared.launch.program.display(), "container started");
    let no_startup_probe = container.startup_probe.is_none();
    let no_readiness_probe = container.readiness_probe.is_none();
    shared.update(slot, |c| {
        if !first {
            c.restart_count += 1;
        }
        c.image_id.clone_from(&prepared.image_id);
        c.state = RunState::Running {
            started_at: Timestamp::now(),
            pid,
        };
        c.started = no_startup_probe;
        c.ready = no_startup_probe && no_readiness_probe;
    });
    Ok((child, pid, prepared.launch))
}

/// Waits for the process to end: on its own, after failing liveness/startup probes (killed
/// with the pod's grace period), or stopped on request. `true` with the latter.
async fn supervise(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    child: &mut tokio::process::Child,
    pid: u32,
    launch: &Launch,
    stop: &mut watch::Receiver<Option<StopRequest>>,
) -> (Option<ExitStatus>, bool) {
    let target = probe::Target {
        pod_ip: &shared.pod_ip,
        container,
        pid,
        env: &launch.env,
        http: &shared.ctx.http,
        tools: &shared.ctx.tools,
    };
    if let Some(ended) = post_start(shared, container, child, target, stop).await {
        return (ended, false);
    }
    let ended = tokio::select! {
        status = child.wait() => return (status.ok(), false),
        restart = probes(shared, slot, container, target) => Err(restart),
        request = stop_requested(stop) => Ok(request),
    };
    match ended {
        Ok(request) => {
            shared
                .event(
                    false,
                    "Killing",
                    format!("Stopping container {}", container.name),
                )
                .await;
            (
                terminate(
                    shared,
                    container,
                    child,
                    target,
                    request.deadline,
                    stop,
                    true,
                )
                .await,
                true,
            )
        }
        Err((message, probe_grace)) => {
            info!(container = %container.name, message, "container unhealthy: restarted");
            shared
                .event(
                    false,
                    "Killing",
                    format!("Container {} {message}, will be restarted", container.name),
                )
                .await;
            // A probe's own terminationGracePeriodSeconds wins over the pod's.
            let grace = probe_grace
                .and_then(|s| u64::try_from(s).ok())
                .map_or_else(|| shared.grace(), Duration::from_secs);
            let deadline = Instant::now() + grace;
            (
                terminate(shared, container, child, target, deadline, stop, true).await,
                false,
            )
        }
    }
}

/// Runs the postStart hook, if any; `Some` with the exit status when the process ended
/// meanwhile, or was killed because the hook failed.
async fn post_start(
    shared: &PodShared,
    container: &Container,
    child: &mut tokio::process::Child,
    target: probe::Target<'_>,
    stop: &mut watch::Receiver<Option<StopRequest>>,
) -> Option<Option<ExitStatus>> {
    let hook = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref())?;
    tokio::select! {
        verdict = probe::hook(hook, target, shared.grace()) => {
            if let Verdict::Failure(message) = verdict {
                warn!(container = %container.name, message, "postStart hook failed: container killed");
                let deadline = Instant::now() + shared.grace();
                return Some(terminate(shared, container, child, target, deadline, stop, false).await);
            }
            None
        }
        status = child.wait() => Some(status.ok()),
    }
}

/// preStop (with `pre_stop`), SIGTERM, then SIGKILL to the process group at `deadline` (moved
/// earlier by later stop requests).
async fn terminate(
    shared: &PodShared,
    container: &Container,
    child: &mut tokio::process::Child,
    target: probe::Target<'_>,
    mut deadline: Instant,
    stop: &mut watch::Receiver<Option<StopRequest>>,
    pre_stop: bool,
) -> Option<ExitStatus> {
    let tools = &shared.ctx.tools;
    if let Some(hook) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .filter(|_| pre_stop)
    {
        let budget = deadline.saturating_duration_since(Instant::now());
        tokio::select! {
            verdict = probe::hook(hook, target, budget) => {
                if let Verdict::Failure(message) = verdict {
                    warn!(container = %container.name, message, "preStop hook failed");
                }
            }
            status = child.wait() => return status.ok(),
        }
    }
    process::signal(tools, target.pid, "TERM", false).await;
    let mut listening = true;
    loop {
        tokio::select! {
            status = child.wait() => return status.ok(),
            () = tokio::time::sleep_until(deadline) => break,
            changed = stop.changed(), if listening => match changed {
                Ok(()) => {
                    if let Some(request) = *stop.borrow_and_update() {
                        deadline = deadline.min(request.deadline);
                    }
                }
                Err(_) => listening = false,
            },
        }
    }
    debug!(container = %container.name, pid = target.pid, "grace period over: SIGKILL");
    process::signal(tools, target.pid, "KILL", true).await;
    let _ = child.start_kill();
    child.wait().await.ok()
}

/// Why a container is restarted after a probe failed for good, and that probe's own
/// `terminationGracePeriodSeconds` (which wins over the pod's).
type Restart = (String, Option<i64>);

/// Runs the startup, readiness and liveness probes; returns when the container must be
/// restarted. Until the startup probe (if any) passes, the other two do not run.
async fn probes(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    target: probe::Target<'_>,
) -> Restart {
    if let Some(startup) = &container.startup_probe {
        let started = run_probe(shared, ProbeKind::Startup, startup, target, Some).await;
        if !started {
            return restart_after(ProbeKind::Startup, startup);
        }
        let no_readiness_probe = container.readiness_probe.is_none();
        shared.update(slot, |c| {
            c.started = true;
            c.ready = no_readiness_probe;
        });
    }
    tokio::select! {
        never = readiness_probe(shared, slot, container, target) => match never {},
        restart = liveness_probe(shared, container, target) => restart,
    }
}

/// Probes readiness for ever (or never, without a probe), showing each change.
async fn readiness_probe(
    shared: &PodShared,
    slot: Slot,
    container: &Container,
    target: probe::Target<'_>,
) -> Infallible {
    let Some(readiness) = &container.readiness_probe else {
        return std::future::pending().await;
    };
    run_probe(shared, ProbeKind::Readiness, readiness, target, |ready| {
        let changed = {
            let record = shared.record.lock();
            let current = match slot {
                Slot::Init(i) => record.init.get(i),
                Slot::Main(i) => record.containers.get(i),
            };
            current.is_some_and(|c| c.ready != ready)
        };
        if changed {
            info!(container = %container.name, ready, "readiness changed");
            shared.update(slot, |c| c.ready = ready);
        }
        None
    })
    .await
}

/// Probes liveness until it fails for good (never, without a probe).
async fn liveness_probe(
    shared: &PodShared,
    container: &Container,
    target: probe::Target<'_>,
) -> Restart {
    let Some(liveness) = &container.liveness_probe else {
        return std::future::pending().await;
    };
    run_probe(shared, ProbeKind::Liveness, liveness, target, |alive| {
        (!alive).then(|| restart_after(ProbeKind::Liveness, liveness))
    })
    .await
}

/// The restart that `failed`, a probe of `kind`, calls for.
fn restart_after(kind: ProbeKind, failed: &Probe) -> Restart {
    (
        kind.restart_reason(),
        failed.termination_grace_period_seconds,
    )
}

/// Runs `probe` as the kubelet does: after `initialDelaySeconds`, once every `periodSeconds`,
/// each try bounded by `timeoutSeconds`, counting consecutive results against
/// `successThreshold` and `failureThreshold`. A failed try is logged, and reported as an
/// `Unhealthy` event when `kind` says so; then, each time a threshold is met, `on_verdict`
/// hears which (`true`: success) and ends the run by returning `Some`.
async fn run_probe<T>(
    shared: &PodShared,
    kind: ProbeKind,
    probe: &Probe,
    target: probe::Target<'_>,
    mut on_verdict: impl FnMut(bool) -> Option<T>,
) -> T {
    let timing = Timing::of(probe);
    tokio::time::sleep(timing.initial_delay).await;
    let mut thresholds = Thresholds::default();
    loop {
        let verdict = probe::probe_once(probe, target, timing.timeout).await;
        let met = thresholds.record(verdict == Verdict::Success, &timing);
        if let Verdict::Failure(message) = &verdict {
            debug!(container = %target.container.name, probe = kind.name(), message, "probe failed");
            if kind.reports_failure(met) {
                let note = format!("{} probe failed: {message}", kind.name());
                shared.event(true, "Unhealthy", note).await;
            }
        }
        if let Some(ended) = met.and_then(&mut on_verdict) {
            return ended;
        }
        tokio::time::sleep(timing.period).await;
    }
}

/// Everything a run needs, or why the container cannot start yet.
async fn prepare(shared: &PodShared, container: &Container) -> Result<Prepared, NotStarted> {
    let ctx = &shared.ctx;
    let pod = shared.latest();
    let image = container.image.clone().unwrap_or_default();
    let config_error = |message: String| NotStarted {
        reason: "CreateContainerConfigError",
        message,
    };

    let (config_map_names, secret_names) = env::referenced_objects(container);
    let mut sources = EnvSources::default();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &shared.namespace);
    for name in config_map_names {
        let found = config_maps
            .get_opt(&name)
            .await
            .map_err(|error| config_error(format!("read configmap {name}: {error}")))?;
        sources.config_maps.insert(name, found);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &shared.namespace);
    for name in secret_names {
        let found = secrets
            .get_opt(&name)
            .await
            .map_err(|error| config_error(format!("read secret {name}: {error}")))?;
        sources.secrets.insert(name, found);
    }
    let services = ctx.services.state();
    let service_env = env::service_env(
        &pod,
        services.iter().map(AsRef::as_ref),
        &ctx.config.api_host,
        ctx.config.api_port,
    );
    let pod_ips = [shared.pod_ip.clone()];
    let fields = FieldContext {
        pod: &pod,
        pod_ips: &pod_ips,
        host_ip: super::HOST_IP,
    };
    let environment = env::resolve(fields, container, &sources, &service_env)
        .map_err(|error| config_error(error.to_string()))?;
    let (command, args) = env::expand_command(container, &environment);
    let (program, args, image_dir) =
        process::resolve_program(&ctx.config.images, &image, &command, &args).map_err(|error| {
            match error {
                ProcessError::UnknownImage { .. } => NotStarted {
                    reason: "ErrImagePull",
                    message: error.to_string(),
                },
                _ => NotStarted {
                    reason: "CreateContainerError",
                    message: error.to_string(),
                },
            }
        })?;
    let mounts = mounts(shared, &pod, container, &environment).map_err(config_error)?;
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| shared.name.clone());
    Ok(Prepared {
        launch: Launch {
            program,
            args,
            env: environment,
            mounts,
            hostname,
            working_dir: container.working_dir.clone(),
            log: shared.dir.join(format!("{}.log", container.name)),
        },
        image_id: format!("host://{}", image_dir.display()),
    })
}

/// The container's bind mounts: the hosts file, then its volume mounts.
fn mounts(
    shared: &PodShared,
    pod: &Pod,
    container: &Container,
    environment: &[(String, String)],
) -> Result<Vec<Mount>, String> {
    let volumes: BTreeMap<&str, _> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| (v.name.as_str(), v))
        .collect();
    let vars: BTreeMap<&str, &str> = environment
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut out = vec![Mount {
        source: shared.hosts_file(),
        target: "/etc/hosts".into(),
        read_only: false,
        file: true,
    }];
    for vm in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .get(vm.name.as_str())
            .ok_or_else(|| format!("volume {} is not a volume of the pod", vm.name))?;
        let (mut source, always_read_only) = volumes::source(&shared.volumes_dir(), volume);
        let sub_path = match (&vm.sub_path, &vm.sub_path_expr) {
            (Some(path), _) if !path.is_empty() => Some(path.clone()),
            (_, Some(expr)) if !expr.is_empty() => {
                Some(vne_core::expansion::expand(expr, |name| {
                    vars.get(name).copied()
                }))
            }
            _ => None,
        };
        if let Some(sub_path) = sub_path {
            if Path::new(&sub_path)
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(format!("invalid subPath {sub_path:?}"));
            }
            source = source.join(sub_path);
            if !source.exists() {
                std::fs::create_dir_all(&source)
                    .map_err(|error| format!("create subPath {}: {error}", source.display()))?;
            }
        }
        let file = source.is_file();
        out.push(Mount {
            source,
            target: vm.mount_path.clone(),
            read_only: always_read_only || vm.read_only == Some(true),
            file,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_sequence() {
        let s = Duration::from_secs;
        let mut b = Backoff::new((s(10), s(300)));
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay(s(1)).as_secs()).collect();
        assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300]);
        // A long healthy run resets it.
        assert_eq!(b.next_delay(s(601)), Duration::ZERO);
        assert_eq!(b.next_delay(s(1)), s(10));
        let mut b = Backoff::new((Duration::from_millis(200), Duration::from_millis(500)));
        let delays: Vec<u128> = (0..5)
            .map(|_| b.next_delay(Duration::ZERO).as_millis())
            .collect();
        assert_eq!(delays, [0, 200, 400, 500, 500]);
    }

    #[test]
    fn restart_rules() {
        let cases = [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
            ("Never", 0, false),
        ];
        for (policy, code, want) in cases {
            assert_eq!(restarts(policy, code), want, "{policy} {code}");
        }
        let plain = Container::default();
        let sidecar = Container {
            restart_policy: Some("Always".into()),
            ..Container::default()
        };
        let policies = [
            ("Always", Slot::Main(0), &plain, "Always"),
            ("OnFailure", Slot::Main(0), &plain, "OnFailure"),
            ("Never", Slot::Main(0), &plain, "Never"),
            ("Always", Slot::Init(0), &plain, "OnFailure"),
            ("Never", Slot::Init(0), &plain, "Never"),
            ("Never", Slot::Init(0), &sidecar, "Always"),
        ];
        for (pod, slot, container, want) in policies {
            assert_eq!(policy_for(pod, slot, container), want, "{pod} {slot:?}");
        }
    }
}
