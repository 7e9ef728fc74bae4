//! The real runtime's driver (`--runtime real`): an owned task that converges the machine to
//! what the engine says should exist ([`crate::engine::real`]) and reports back what happened.
//!
//! Level-triggered: it reads the engine's plan after every change and at least every
//! [`POLL`]; each group with a plan has one worker task owning its sandbox group. A worker
//! pulls the images of the runs asked for (retrying failed pulls with back-off), creates the
//! sandbox group, starts runs, stops what should not run, and reports starts, exits, pull
//! and start failures. A deleted group's containers get SIGTERM, then SIGKILL after the grace
//! period, and the sandbox goes; an ended group's sandbox goes too, its logs are kept under
//! `<runtime-dir>/logs` while the engine lists it.

pub mod handlers;
pub mod resolve;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use eci_proto::v20180808::{Container, CreateContainerGroupRequest};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use crate::engine::group::probe_of;
use crate::engine::logs::{self, RealLogs};
use crate::engine::probe::{ProbeKind, ProbeOutcome};
use crate::engine::real::{GroupPlan, Hook, Observation, PlannedContainer, Want};
use crate::engine::usage::{GroupMeasures, Measured};
use crate::images::{ImageStore, PullError, PullOptions, PulledImage};
use crate::sandbox::{Dns, GroupSpec, HostAlias, Sandbox, SandboxConfig, SandboxError};
use crate::service::MockEci;
use crate::service::config::MockConfig;

/// Longest time between two looks at the engine's plan (its timers fire lazily: a restart
/// back-off ends without a call).
const POLL: Duration = Duration::from_millis(250);
/// First wait before pulling again after a failed pull; doubles up to [`MAX_PULL_BACKOFF`].
const PULL_BACKOFF: Duration = Duration::from_secs(2);
const MAX_PULL_BACKOFF: Duration = Duration::from_secs(60);
/// Wait before creating a sandbox group again after a failure.
const CREATE_RETRY: Duration = Duration::from_secs(2);
/// Longest a postStart hook runs: then it counts as failed (and the container is killed).
const POST_START_LIMIT: Duration = Duration::from_secs(120);
/// Longest a `Sync` exec runs: then it is stopped, and what it printed is the answer.
const SYNC_EXEC_LIMIT: Duration = Duration::from_secs(10);
/// Most of a `Sync` exec's output kept (each stream).
const SYNC_EXEC_OUTPUT: u64 = 1 << 20;
/// How much of a log's end a termination message's fallback reads (80 lines of a few KiB each
/// fit; the message keeps 2 KiB of them).
const LOG_TAIL_READ: usize = 256 * 1024;
/// Most groups one metric call measures (the API takes 20).
const MAX_MEASURED_GROUPS: usize = 20;
/// How long a container's CPU reading is kept for the next one's rate.
const READING_KEPT: Duration = Duration::from_secs(600);

/// Why real mode cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("--runtime real needs root (namespaces, mounts, a bridge); mock-eci runs as uid {0}")]
    NotRoot(u32),
    #[error(
        "--runtime real needs an OCI runtime: {0} was not found (install runc, or give --oci-runtime)"
    )]
    NoOciRuntime(PathBuf),
    #[error("could not open the sandbox")]
    Sandbox(#[source] SandboxError),
    #[error("could not open the image store")]
    Images(#[source] PullError),
    #[error("could not prepare {0}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("could not set up the HTTP client of probes and hooks")]
    Http(#[source] reqwest::Error),
}

/// The real runtime's machine-wide parts: the sandbox (bridge, naming) and the image store.
#[derive(Debug)]
pub struct RealRuntime {
    sandbox: Sandbox,
    images: ImageStore,
    /// Logs of ended groups, `<group>/<container>/log[.previous]`.
    archive: PathBuf,
    /// Sends the HTTP probes and hooks (certificates unchecked, as ECI and the kubelet do).
    http: reqwest::Client,
    /// The instance's own resolvers (the VPC's): this machine's, read at start.
    host_dns: Dns,
    /// Each container's previous CPU reading (when, CPU time), for its rate.
    cpu_readings: std::sync::Mutex<BTreeMap<(String, String), (Instant, u64)>>,
}

impl RealRuntime {
    /// Checks that real mode can run (root, the OCI runtime), removes an earlier run's
    /// leftovers and opens the sandbox and the image store.
    pub async fn open(config: &MockConfig) -> Result<Self, RuntimeError> {
        if !running_as_root() {
            return Err(RuntimeError::NotRoot(rustix::process::geteuid().as_raw()));
        }
        let runtime = find_program(&config.oci_runtime)
            .ok_or_else(|| RuntimeError::NoOciRuntime(config.oci_runtime.clone()))?;
        let images = ImageStore::open(&config.image_store_dir())
            .map_err(RuntimeError::Images)?
            .with_docker_hub_mirror(config.runtime_registry_mirror.clone());
        let archive = config.runtime_dir.join("logs");
        match tokio::fs::remove_dir_all(&archive).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::Io(archive, e));
            }
            _ => {}
        }
        let sandbox = Sandbox::open(SandboxConfig {
            prefix: config.runtime_prefix.clone(),
            network: config.runtime_network,
            state_dir: config.runtime_dir.join("sandbox"),
            runtime,
        })
        .await
        .map_err(RuntimeError::Sandbox)?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .danger_accept_invalid_certs(true)
            .redirect(reqwest::redirect::Policy::limited(10))
            .build()
            .map_err(RuntimeError::Http)?;
        let host_dns = host_dns(&config.runtime_resolv_conf).await;
        tracing::info!(network = %config.runtime_network, dir = %config.runtime_dir.display(), nameservers = ?host_dns.nameservers, "real runtime ready");
        Ok(Self {
            sandbox,
            images,
            archive,
            http,
            host_dns,
            cpu_readings: std::sync::Mutex::default(),
        })
    }

    /// The log files of a container, live or archived; `None` when it has none (yet).
    pub async fn logs(&self, group: &str, container: &str) -> Option<RealLogs> {
        let live = self.sandbox.log_path(group, container).ok()?;
        let archived = self.archive.join(group).join(container).join("log");
        for path in [live, archived] {
            if let Some(logs) = read_logs(&path).await {
                return Some(logs);
            }
        }
        None
    }

    /// What the running containers of `groups` use now, read from their cgroups; the CPU
    /// rate is the change since the previous reading of the same container (0 at the first).
    pub fn measure(&self, groups: &[String]) -> GroupMeasures {
        let now = Instant::now();
        let mut readings = self
            .cpu_readings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Readings of containers nobody asked about for long are dropped.
        readings.retain(|_, (at, _)| now.duration_since(*at) < READING_KEPT);
        let mut measured = GroupMeasures::new();
        for group in groups.iter().take(MAX_MEASURED_GROUPS) {
            for (container, usage) in self.sandbox.group_usage(group) {
                let key = (group.clone(), container.clone());
                let nano_cores = cpu_rate(readings.get(&key).copied(), (now, usage.cpu_nanos));
                readings.insert(key, (now, usage.cpu_nanos));
                let figures = Measured {
                    nano_cores,
                    core_nanos: usage.cpu_nanos,
                    memory_bytes: usage.memory_bytes,
                    working_set: usage.working_set_bytes,
                    rss: usage.rss_bytes,
                    cache: usage.cache_bytes,
                };
                measured
                    .entry(group.clone())
                    .or_default()
                    .insert(container, figures);
            }
        }
        measured
    }

    /// The command line that runs `argv` in a running container (see
    /// [`Sandbox::exec_command`]).
    pub fn exec_command(
        &self,
        group: &str,
        container: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<(PathBuf, Vec<std::ffi::OsString>), SandboxError> {
        self.sandbox.exec_command(group, container, argv, tty)
    }

    /// Runs `argv` in a running container without input (`Sync=true`): its stdout, then its
    /// stderr, each cut at [`SYNC_EXEC_OUTPUT`]; stopped after [`SYNC_EXEC_LIMIT`]. A command
    /// that could not run answers why.
    pub async fn exec_sync(&self, group: &str, container: &str, argv: &[String]) -> String {
        use tokio::io::AsyncReadExt as _;
        let (program, args) = match self.exec_command(group, container, argv, false) {
            Ok(command) => command,
            Err(error) => return format!("cannot run the command: {}\n", chain(&error)),
        };
        let spawned = tokio::process::Command::new(&program)
            .args(args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => return format!("cannot run {}: {error}\n", program.display()),
        };
        let read = |stream: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| async move {
            let mut text = Vec::new();
            if let Some(stream) = stream {
                let _ = stream.take(SYNC_EXEC_OUTPUT).read_to_end(&mut text).await;
            }
            text
        };
        let stdout = tokio::spawn(read(child.stdout.take().map(|s| Box::new(s) as _)));
        let stderr = tokio::spawn(read(child.stderr.take().map(|s| Box::new(s) as _)));
        if tokio::time::timeout(SYNC_EXEC_LIMIT, child.wait())
            .await
            .is_err()
        {
            tracing::info!(group, container, "a Sync exec ran too long: stopped");
            let _ = crate::sandbox::container::end_exec(&mut child).await;
        }
        // A process the command left in the background may hold the streams open.
        let drain = |reader: tokio::task::JoinHandle<Vec<u8>>| async move {
            let abort = reader.abort_handle();
            let read = tokio::time::timeout(Duration::from_secs(2), reader).await;
            abort.abort();
            read.ok().and_then(Result::ok).unwrap_or_default()
        };
        let mut text = drain(stdout).await;
        text.extend(drain(stderr).await);
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Drives the sandbox until `stop`; then stops every group (their containers get no
    /// grace) and removes the bridge.
    pub async fn drive(self: Arc<Self>, mock: MockEci, mut stop: watch::Receiver<bool>) {
        let mut workers: BTreeMap<String, watch::Sender<GroupPlan>> = BTreeMap::new();
        let mut tasks: JoinSet<String> = JoinSet::new();
        let mut archived: BTreeSet<String> = BTreeSet::new();
        loop {
            let plan = mock.runtime_plan();
            let listed: BTreeSet<&str> = plan.iter().map(|(id, _)| id.as_str()).collect();
            workers.retain(|id, _| listed.contains(id.as_str()));
            for id in archived.iter().filter(|id| !listed.contains(id.as_str())) {
                self.forget_logs(id).await;
            }
            archived.retain(|id| listed.contains(id.as_str()));
            for (id, group_plan) in &plan {
                if let Some(sender) = workers.get(id) {
                    sender.send_if_modified(|current| replace_if_changed(current, group_plan));
                } else if matches!(group_plan, GroupPlan::Live { .. }) && !archived.contains(id) {
                    let (sender, receiver) = watch::channel(group_plan.clone());
                    let worker = Worker::new(id.clone(), self.clone(), mock.clone());
                    tasks.spawn(worker.run(receiver));
                    workers.insert(id.clone(), sender);
                } else if matches!(group_plan, GroupPlan::Terminating { .. }) {
                    mock.observe_deleted(id);
                }
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = mock.runtime_changed() => {}
                Some(ended) = tasks.join_next() => match ended {
                    Ok(id) => {
                        workers.remove(&id);
                        archived.insert(id);
                    }
                    Err(error) => tracing::error!(%error, "a group worker ended abnormally"),
                },
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        workers.clear();
        while tasks.join_next().await.is_some() {}
        let _ = tokio::fs::remove_dir_all(&self.archive).await;
        if let Err(error) = self.sandbox.close().await {
            tracing::warn!(error = %chain(&error), "removing the bridge");
        }
    }

    async fn forget_logs(&self, group: &str) {
        if crate::sandbox::names::Label::new("group id", group).is_ok() {
            let _ = tokio::fs::remove_dir_all(self.archive.join(group)).await;
        }
    }

    /// Copies a group's logs out of its sandbox directory, which is about to go.
    async fn archive_logs(&self, group: &str, containers: &[String]) {
        for container in containers {
            let Ok(live) = self.sandbox.log_path(group, container) else {
                continue;
            };
            let dir = self.archive.join(group).join(container);
            if tokio::fs::create_dir_all(&dir).await.is_err() {
                continue;
            }
            for name in ["log", "log.previous"] {
                let _ = tokio::fs::copy(live.with_file_name(name), dir.join(name)).await;
            }
        }
    }
}

/// CPU in nanocores between two readings (when, CPU nanoseconds); 0 without an earlier one,
/// or when the counter went back (a new run of the container).
fn cpu_rate(before: Option<(Instant, u64)>, (now, nanos): (Instant, u64)) -> u64 {
    let Some((then, earlier)) = before else {
        return 0;
    };
    let elapsed = now.duration_since(then).as_nanos();
    match nanos.checked_sub(earlier) {
        Some(used) if elapsed > 0 => {
            u64::try_from(u128::from(used) * 1_000_000_000 / elapsed).unwrap_or(u64::MAX)
        }
        _ => 0,
    }
}

fn replace_if_changed(current: &mut GroupPlan, new: &GroupPlan) -> bool {
    if current == new {
        false
    } else {
        *current = new.clone();
        true
    }
}

/// `program` as given when it has a slash, else the first executable of that name on PATH.
pub fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        std::fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return executable(program).then(|| program.to_owned());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| executable(path))
}

/// Whether this process runs as root, as real mode must (it makes namespaces, interfaces and
/// cgroups, and runs the OCI runtime).
pub fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// An error and its causes on one line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// A failed pull and when to try again.
#[derive(Debug)]
struct PullRetry {
    at: Instant,
    backoff: Duration,
}

/// One group's worker: owns its sandbox group.
struct Worker {
    id: String,
    runtime: Arc<RealRuntime>,
    mock: MockEci,
    group: Option<crate::sandbox::Group>,
    /// The run each container last started.
    started: BTreeMap<String, u32>,
    /// Exits already reported, by container and run.
    reported: BTreeSet<(String, u32)>,
    pulled: BTreeMap<String, PulledImage>,
    pull_retries: BTreeMap<String, PullRetry>,
    create_retry: Option<Instant>,
    /// The group's address and its containers' specs as last planned (hooks, probes).
    ip: Option<Ipv4Addr>,
    specs: BTreeMap<String, Container>,
    /// The probe tasks running, by container and probe, with the run each probes.
    probing: BTreeMap<(String, ProbeKind), (u32, AbortHandle)>,
    probers: JoinSet<()>,
}

impl Worker {
    fn new(id: String, runtime: Arc<RealRuntime>, mock: MockEci) -> Self {
        Self {
            id,
            runtime,
            mock,
            group: None,
            started: BTreeMap::new(),
            reported: BTreeSet::new(),
            pulled: BTreeMap::new(),
            pull_retries: BTreeMap::new(),
            create_retry: None,
            ip: None,
            specs: BTreeMap::new(),
            probing: BTreeMap::new(),
            probers: JoinSet::new(),
        }
    }

    /// Converges until the group is deleted, ends or leaves the plan; returns its id.
    async fn run(mut self, mut plan: watch::Receiver<GroupPlan>) -> String {
        loop {
            let current = plan.borrow_and_update().clone();
            match current {
                GroupPlan::Live {
                    ip,
                    request,
                    grace_ms,
                    containers,
                } => {
                    self.ip = Some(ip);
                    self.specs = containers
                        .iter()
                        .map(|c| (c.spec.name.clone(), c.spec.clone()))
                        .collect();
                    self.converge(ip, &request, grace(grace_ms), &containers)
                        .await;
                }
                GroupPlan::Terminating { grace_ms } => {
                    self.tear_down(grace(grace_ms)).await;
                    self.mock.observe_deleted(&self.id);
                    return self.id;
                }
                GroupPlan::Finished => {
                    let names: Vec<String> = self.started.keys().cloned().collect();
                    self.runtime.archive_logs(&self.id, &names).await;
                    self.tear_down(Duration::ZERO).await;
                    return self.id;
                }
            }
            self.report_exits();
            let retry = self
                .pull_retries
                .values()
                .map(|retry| retry.at)
                .chain(self.create_retry)
                .min();
            let retry = async move {
                match retry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let exited = async {
                match &mut self.group {
                    Some(group) => group.wait_any().await,
                    None => std::future::pending().await,
                }
            };
            let plan_gone = tokio::select! {
                changed = plan.changed() => changed.is_err(),
                () = exited => false,
                () = retry => false,
            };
            if plan_gone {
                self.tear_down(Duration::ZERO).await;
                return self.id;
            }
            self.report_exits();
        }
    }

    async fn converge(
        &mut self,
        ip: Ipv4Addr,
        request: &CreateContainerGroupRequest,
        grace: Duration,
        containers: &[PlannedContainer],
    ) {
        if self.group.is_none() && !self.create(ip, request, containers).await {
            return;
        }
        self.update_files(request);
        for container in containers {
            let name = &container.spec.name;
            match container.want {
                Want::Start if self.started.get(name) != Some(&container.run) => {
                    self.start(ip, request, grace, container).await;
                }
                Want::Stop => {
                    if self.group.as_ref().is_some_and(|g| g.is_running(name)) {
                        let grace = self.pre_stop(name, grace).await;
                        if let Some(group) = self.group.as_mut() {
                            if let Err(error) = group.stop(name, grace).await {
                                tracing::warn!(group = %self.id, container = %name, error = %chain(&error), "stopping a container");
                            }
                        }
                    }
                }
                Want::Start | Want::Run => {}
            }
        }
        self.sync_probers(containers);
    }

    /// Rewrites the files of the group's ConfigFileVolumes that an UpdateContainerGroup
    /// changed, in place: the containers keep running and see the new files. A failure is
    /// logged and tried again at the worker's next pass.
    fn update_files(&mut self, request: &CreateContainerGroupRequest) {
        let Some(group) = self.group.as_mut() else {
            return;
        };
        let volumes: Vec<_> = request.volume.iter().map(resolve::volume).collect();
        match group.update_files(&volumes) {
            Ok(names) if !names.is_empty() => {
                tracing::info!(group = %self.id, volumes = ?names, "volume files rewritten");
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(group = %self.id, error = %chain(&error), "rewriting volume files");
            }
        }
    }

    /// Where container `name`'s probes and hooks run, once the group has an address.
    fn target(&self, name: &str) -> Option<handlers::Target> {
        Some(handlers::Target {
            runtime: self.runtime.clone(),
            group: self.id.clone(),
            container: name.to_owned(),
            ip: self.ip?,
        })
    }

    /// Has a probe task run for each probe of each running container's current run, and
    /// none for anything else.
    fn sync_probers(&mut self, containers: &[PlannedContainer]) {
        while self.probers.try_join_next().is_some() {}
        let mut wanted = BTreeMap::new();
        for container in containers.iter().filter(|c| !c.init && c.want == Want::Run) {
            let name = &container.spec.name;
            let running = self.started.get(name) == Some(&container.run)
                && self.group.as_ref().is_some_and(|g| g.is_running(name));
            for kind in [ProbeKind::Liveness, ProbeKind::Readiness] {
                if let Some(probe) = probe_of(&container.spec, kind).filter(|_| running) {
                    wanted.insert((name.clone(), kind), (container.run, probe.clone()));
                }
            }
        }
        self.probing.retain(|key, (run, handle)| {
            let keep = wanted.get(key).is_some_and(|(wanted, _)| wanted == run);
            if !keep {
                handle.abort();
            }
            keep
        });
        for ((name, kind), (run, probe)) in wanted {
            if self.probing.contains_key(&(name.clone(), kind)) {
                continue;
            }
            let Some(target) = self.target(&name) else {
                continue;
            };
            let task = handlers::probe_loop(target, run, kind, probe, self.mock.clone());
            let handle = self.probers.spawn(task);
            self.probing.insert((name, kind), (run, handle));
        }
    }

    /// Runs container `name`'s preStop hook, if it has one, within `grace`; returns what is
    /// left of the grace period. A failure is reported, and the stop goes on.
    async fn pre_stop(&self, name: &str, grace: Duration) -> Duration {
        let handler = self
            .specs
            .get(name)
            .and_then(|spec| spec.lifecycle_pre_stop_handler.as_ref());
        let (Some(action), Some(target)) = (
            handler.and_then(handlers::Action::of_hook),
            self.target(name),
        ) else {
            return grace;
        };
        if grace.is_zero() {
            return grace;
        }
        let began = Instant::now();
        if let ProbeOutcome::Failure { message } = target.run(action, grace).await {
            tracing::warn!(group = %self.id, container = %name, %message, "preStop hook failed");
            if let Some(run) = self.started.get(name) {
                let failed = Observation::HookFailed {
                    hook: Hook::PreStop,
                    message,
                };
                self.mock.observe(&self.id, name, *run, &failed);
            }
        }
        grace.saturating_sub(began.elapsed())
    }

    /// Runs the postStart hook of a run just started, if it has one; if it fails, that is
    /// reported and the run is killed (its exit is reported as any other).
    async fn post_start(&mut self, container: &PlannedContainer, grace: Duration) {
        let name = &container.spec.name;
        let handler = container.spec.lifecycle_post_start_handler.as_ref();
        let (Some(action), Some(target)) = (
            handler.and_then(handlers::Action::of_hook),
            self.target(name),
        ) else {
            return;
        };
        let ProbeOutcome::Failure { message } = target.run(action, POST_START_LIMIT).await else {
            return;
        };
        tracing::warn!(group = %self.id, container = %name, %message, "postStart hook failed: killing the container");
        let failed = Observation::HookFailed {
            hook: Hook::PostStart,
            message,
        };
        self.mock.observe(&self.id, name, container.run, &failed);
        if let Some(group) = self.group.as_mut() {
            if let Err(error) = group.stop(name, grace).await {
                tracing::warn!(group = %self.id, container = %name, error = %chain(&error), "stopping a container");
            }
        }
    }

    /// Creates the sandbox group; on a failure, the runs asked for fail to start (the
    /// engine's restart policy decides what follows) and creation is retried later.
    async fn create(
        &mut self,
        ip: Ipv4Addr,
        request: &CreateContainerGroupRequest,
        containers: &[PlannedContainer],
    ) -> bool {
        if self.create_retry.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        match self
            .runtime
            .sandbox
            .create_group(&group_spec(&self.id, ip, request, &self.runtime.host_dns))
            .await
        {
            Ok(group) => {
                self.group = Some(group);
                self.create_retry = None;
                true
            }
            Err(error) => {
                let message = format!("could not create the sandbox: {}", chain(&error));
                tracing::warn!(group = %self.id, %message);
                for container in containers.iter().filter(|c| c.want == Want::Start) {
                    let failed = Observation::StartFailed {
                        message: message.clone(),
                    };
                    self.mock
                        .observe(&self.id, &container.spec.name, container.run, &failed);
                }
                self.create_retry = Some(Instant::now() + CREATE_RETRY);
                false
            }
        }
    }

    /// Pulls the image, clears the earlier run away and starts the run.
    async fn start(
        &mut self,
        ip: Ipv4Addr,
        request: &CreateContainerGroupRequest,
        grace: Duration,
        container: &PlannedContainer,
    ) {
        let name = container.spec.name.clone();
        let Some(image) = self.pull(request, container).await else {
            return;
        };
        let Some(group) = self.group.as_mut() else {
            return;
        };
        if self.started.remove(&name).is_some() {
            if group.is_running(&name) {
                let _ = group.stop(&name, grace).await;
            }
            if let Err(error) = group.remove_container(&name).await {
                tracing::warn!(group = %self.id, container = %name, error = %chain(&error), "removing the earlier run");
            }
        }
        let accounts = resolve::Accounts {
            passwd: image_file(&image.rootfs, "etc/passwd"),
            group: image_file(&image.rootfs, "etc/group"),
        };
        let outcome = match resolve::container_spec(&container.spec, &image.config, &accounts, ip) {
            Ok(spec) => group
                .start(&spec, &image.rootfs)
                .await
                .map_err(|error| chain(&error)),
            Err(message) => Err(message),
        };
        let observation = match outcome {
            Ok(()) => {
                self.started.insert(name.clone(), container.run);
                Observation::Started
            }
            Err(message) => {
                tracing::warn!(group = %self.id, container = %name, %message, "container did not start");
                Observation::StartFailed { message }
            }
        };
        let started = observation == Observation::Started;
        self.mock
            .observe(&self.id, &name, container.run, &observation);
        if started {
            self.post_start(container, grace).await;
        }
    }

    /// The container's image, pulled now or before; `None` when the pull failed (reported)
    /// or waits for its back-off to end.
    async fn pull(
        &mut self,
        request: &CreateContainerGroupRequest,
        container: &PlannedContainer,
    ) -> Option<PulledImage> {
        let (name, image) = (&container.spec.name, &container.spec.image);
        if let Some(pulled) = self.pulled.get(image) {
            return Some(pulled.clone());
        }
        if self
            .pull_retries
            .get(name)
            .is_some_and(|retry| Instant::now() < retry.at)
        {
            return None;
        }
        let options = PullOptions::from_request(
            &request.image_registry_credential,
            &request.plain_http_registry,
            &request.insecure_registry,
        );
        match self.runtime.images.pull(image, &options).await {
            Ok(pulled) => {
                self.pull_retries.remove(name);
                self.pulled.insert(image.clone(), pulled.clone());
                Some(pulled)
            }
            Err(error) => {
                let failure = error.failure(image);
                tracing::warn!(group = %self.id, container = %name, message = %failure.message, "pull failed");
                let backoff = self.pull_retries.get(name).map_or(PULL_BACKOFF, |retry| {
                    (retry.backoff * 2).min(MAX_PULL_BACKOFF)
                });
                self.pull_retries.insert(
                    name.clone(),
                    PullRetry {
                        at: Instant::now() + backoff,
                        backoff,
                    },
                );
                let observation = Observation::PullFailed {
                    message: failure.message,
                    event_message: failure.event_message,
                };
                self.mock
                    .observe(&self.id, name, container.run, &observation);
                None
            }
        }
    }

    /// Reports every exit not reported yet.
    fn report_exits(&mut self) {
        let Some(group) = &self.group else {
            return;
        };
        for (name, exit) in group.exited() {
            let Some(run) = self.started.get(&name).copied() else {
                continue;
            };
            if self.reported.insert((name.clone(), run)) {
                let observation = Observation::Exited {
                    exit_code: exit.code,
                    message: self.termination_message(group, &name, exit.code),
                };
                self.mock.observe(&self.id, &name, run, &observation);
            }
        }
    }

    /// What container `name`'s ended run leaves as its message, as the kubelet reads it.
    fn termination_message(
        &self,
        group: &crate::sandbox::Group,
        name: &str,
        exit_code: i32,
    ) -> String {
        let policy = self
            .specs
            .get(name)
            .map_or("", |spec| spec.termination_message_policy.as_str());
        let file = group.termination_message(name, logs::MESSAGE_FILE_BYTES);
        let log = (file.is_empty() && logs::falls_back_to_log(policy, exit_code))
            .then(|| group.log_tail(name, LOG_TAIL_READ));
        logs::termination_message(&file, log.as_deref())
    }

    /// Stops the probes, runs the running containers' preStop hooks (together, within
    /// `grace`), then stops the containers in what is left of it and removes the group.
    async fn tear_down(&mut self, grace: Duration) {
        self.probing.clear();
        self.probers.abort_all();
        let Some(group) = self.group.take() else {
            return;
        };
        let running: Vec<&String> = self
            .started
            .keys()
            .filter(|name| group.is_running(name))
            .collect();
        let hooks = running.iter().map(|name| self.pre_stop(name, grace));
        let left = futures::future::join_all(hooks)
            .await
            .into_iter()
            .min()
            .unwrap_or(grace);
        if let Err(error) = group.delete(left).await {
            tracing::warn!(group = %self.id, error = %chain(&error), "removing the sandbox group");
        }
    }
}

/// A file of an image's root file system (empty when missing or unreadable), resolved inside
/// it: a link there to `/etc/shadow` is the image's own, never the host's.
fn image_file(rootfs: &Path, path: &str) -> String {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use std::io::Read as _;
    const MOST: u64 = 1 << 20;
    let opened = rustix::fs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .and_then(|root| {
        rustix::fs::openat2(
            &root,
            path,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT,
        )
    });
    let mut text = String::new();
    if let Ok(file) = opened {
        let _ = std::fs::File::from(file)
            .take(MOST)
            .read_to_string(&mut text);
    }
    text
}

fn grace(grace_ms: crate::clock::Millis) -> Duration {
    Duration::from_millis(u64::try_from(grace_ms).unwrap_or(0))
}

/// The resolvers of the resolv.conf at `path`; none, with a warning, when it cannot be read.
async fn host_dns(path: &Path) -> Dns {
    match tokio::fs::read_to_string(path).await {
        Ok(text) => crate::sandbox::files::parse_resolv_conf(&text),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "no resolvers for DnsPolicy Default: groups get only their DnsConfig");
            Dns::default()
        }
    }
}

/// The sandbox's view of the group: host name (`HostName`, else the group's name, else its
/// id), address, DNS (`DnsPolicy` over `host_dns`, the instance's own resolvers, and
/// `DnsConfig`) and host aliases (entries that do not parse are left out).
fn group_spec(
    id: &str,
    ip: Ipv4Addr,
    request: &CreateContainerGroupRequest,
    host_dns: &Dns,
) -> GroupSpec {
    let hostname = [&request.host_name, &request.container_group_name]
        .into_iter()
        .find(|name| crate::sandbox::names::hostname(name).is_ok())
        .cloned()
        .unwrap_or_else(|| id.to_owned());
    let dns = request
        .dns_config
        .as_ref()
        .map(|config| Dns {
            nameservers: config
                .name_server
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect(),
            searches: config.search.clone(),
            options: config
                .option
                .iter()
                .map(|option| match option.value.as_str() {
                    "" => option.name.clone(),
                    value => format!("{}:{value}", option.name),
                })
                .collect(),
        })
        .unwrap_or_default();
    let dns = crate::sandbox::files::group_dns(&request.dns_policy, &dns, host_dns);
    let host_aliases = request
        .host_aliase
        .iter()
        .filter_map(|alias| {
            Some(HostAlias {
                ip: alias.ip.parse().ok()?,
                hostnames: alias.hostname.clone(),
            })
        })
        .collect();
    GroupSpec {
        id: id.to_owned(),
        hostname,
        ip,
        dns,
        host_aliases,
        volumes: request.volume.iter().map(resolve::volume).collect(),
        sysctls: request
            .security_context
            .iter()
            .flat_map(|context| &context.sysctl)
            .map(|sysctl| (sysctl.name.clone(), sysctl.value.clone()))
            .collect(),
    }
}

/// The log at `log` and the previous run's beside it (`log.previous`). The current log is
/// read first: a restart renames it to the previous one and the next run creates it again, so
/// a reader between the two finds only the previous log, which is then the ended run's whole
/// output and the current run's is still empty.
async fn read_logs(log: &Path) -> Option<RealLogs> {
    let current = tokio::fs::read_to_string(log).await.ok();
    let previous = tokio::fs::read_to_string(log.with_extension("previous"))
        .await
        .ok();
    match (current, previous) {
        (None, None) => None,
        (current, previous) => Some(RealLogs {
            current: current.unwrap_or_default(),
            previous,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_rate_is_the_change_between_readings() {
        let then = Instant::now();
        let later = then + Duration::from_secs(2);
        let cases = [
            (None, 5_000_000_000, 0),
            (Some((then, 1_000_000_000)), 2_000_000_000, 500_000_000),
            (Some((then, 1_000_000_000)), 1_000_000_000, 0),
            // A new run starts its counter again.
            (Some((then, 9_000_000_000)), 1_000_000_000, 0),
        ];
        for (before, nanos, expected) in cases {
            assert_eq!(cpu_rate(before, (later, nanos)), expected, "{before:?}");
        }
        assert_eq!(cpu_rate(Some((later, 1)), (later, 2)), 0, "no time passed");
    }

    #[tokio::test]
    async fn a_restart_between_setting_the_log_aside_and_the_next_run_keeps_the_ended_runs_log() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("log");
        assert_eq!(read_logs(&log).await, None, "no run yet");
        std::fs::write(&log, "run 1\n").expect("write");
        let first = RealLogs {
            current: "run 1\n".into(),
            previous: None,
        };
        assert_eq!(read_logs(&log).await, Some(first));
        // The restart has renamed the log; the next run has not created its own.
        std::fs::rename(&log, dir.path().join("log.previous")).expect("rename");
        let between = RealLogs {
            current: String::new(),
            previous: Some("run 1\n".into()),
        };
        assert_eq!(read_logs(&log).await, Some(between));
        std::fs::write(&log, "run 2\n").expect("write");
        let second = RealLogs {
            current: "run 2\n".into(),
            previous: Some("run 1\n".into()),
        };
        assert_eq!(read_logs(&log).await, Some(second));
    }
}
