//! The pods bound to the node: a watch (`spec.nodeName=<node>`) feeding one worker per pod.
//! A worker gives the pod its IP and hosts file, writes its status (before anything starts, so
//! `status.podIP` field references resolve), materialises its volumes, runs the init
//! containers in order and then the containers, and on deletion stops them (preStop, SIGTERM,
//! SIGKILL at the deadline) and deletes the pod with grace 0 and a UID precondition.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use super::container::{self, Outcome, PodShared, Slot, StopRequest};
use super::env::FieldContext;
use super::ipam::IpamError;
use super::proxy::{HostsEntry, ProxyError};
use super::status::{self, ContainerRecord, PodRecord, RunState};
use super::volumes::{VolumeError, Volumes};
use super::{Ctx, FIELD_MANAGER, HOST_IP};

/// A pod could not be run.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// No pod IP was left.
    #[error("pod {pod}: {source}")]
    Ip {
        /// `namespace/name`.
        pod: String,
        /// The error.
        #[source]
        source: IpamError,
    },
    /// The pod's directory could not be made.
    #[error("pod {pod}: create {}: {source}", path.display())]
    Dir {
        /// `namespace/name`.
        pod: String,
        /// The directory.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The hosts file could not be written.
    #[error("pod {pod}: {source}")]
    Hosts {
        /// `namespace/name`.
        pod: String,
        /// The error.
        #[source]
        source: ProxyError,
    },
}

/// Least time given to a container to stop (the kubelet's `minimumGracePeriodInSeconds`).
const MIN_GRACE: Duration = Duration::from_secs(2);
/// Volumes (ConfigMaps, Secrets, downward API) are written again this often.
const VOLUME_RESYNC: Duration = Duration::from_secs(20);

struct Handle {
    pod: watch::Sender<Arc<Pod>>,
    gone: CancellationToken,
}

/// Watches the node's pods until `shutdown` says so, then waits for the workers (which stop
/// their containers within the limit it carries).
pub(crate) async fn dispatch(ctx: Arc<Ctx>, mut shutdown: watch::Receiver<Option<Duration>>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let config =
        watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.config.node_name));
    let mut events = pin!(watcher(api, config).default_backoff());
    let mut workers: HashMap<String, Handle> = HashMap::new();
    let mut tasks: JoinSet<String> = JoinSet::new();
    let mut listed: Option<HashSet<String>> = None;
    loop {
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || shutdown.borrow().is_some() {
                    break;
                }
            }
            Some(joined) = tasks.join_next() => {
                if let Ok(uid) = joined {
                    workers.remove(&uid);
                }
            }
            event = events.next() => {
                let Some(event) = event else { break };
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        debug!(error = %error, "pod watch interrupted");
                        continue;
                    }
                };
                match event {
                    watcher::Event::Init => listed = Some(HashSet::new()),
                    watcher::Event::InitApply(pod) => {
                        if let (Some(seen), Some(uid)) = (listed.as_mut(), pod.metadata.uid.clone()) {
                            seen.insert(uid);
                        }
                        apply(&ctx, pod, &mut workers, &mut tasks, &shutdown);
                    }
                    watcher::Event::InitDone => {
                        if let Some(seen) = listed.take() {
                            for (uid, handle) in &workers {
                                if !seen.contains(uid) {
                                    handle.gone.cancel();
                                }
                            }
                        }
                    }
                    watcher::Event::Apply(pod) => apply(&ctx, pod, &mut workers, &mut tasks, &shutdown),
                    watcher::Event::Delete(pod) => {
                        if let Some(handle) = pod.metadata.uid.as_ref().and_then(|uid| workers.get(uid)) {
                            handle.gone.cancel();
                        }
                    }
                }
            }
        }
    }
    debug!(
        pods = workers.len(),
        "pod dispatcher stopping: waiting for the pod workers"
    );
    while tasks.join_next().await.is_some() {}
    drop(workers);
}

fn apply(
    ctx: &Arc<Ctx>,
    pod: Pod,
    workers: &mut HashMap<String, Handle>,
    tasks: &mut JoinSet<String>,
    shutdown: &watch::Receiver<Option<Duration>>,
) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    if let Some(handle) = workers.get(&uid) {
        handle.pod.send_replace(Arc::new(pod));
        return;
    }
    let (tx, rx) = watch::channel(Arc::new(pod));
    let gone = CancellationToken::new();
    let pod = rx.borrow().clone();
    let span = info_span!(
        "pod",
        namespace = pod.metadata.namespace.as_deref().unwrap_or_default(),
        name = pod.metadata.name.as_deref().unwrap_or_default(),
        uid = %uid,
    );
    let worker = Worker {
        ctx: Arc::clone(ctx),
        signals: Signals::new(rx, gone.clone(), shutdown.clone()),
    };
    let task_uid = uid.clone();
    tasks.spawn(
        async move {
            if let Err(error) = worker.run().await {
                warn!(error = %error, "pod worker failed");
            }
            task_uid
        }
        .instrument(span),
    );
    workers.insert(uid, Handle { pod: tx, gone });
}

/// Why and by when a pod's containers stop.
#[derive(Debug)]
struct Signals {
    pod: watch::Receiver<Arc<Pod>>,
    gone: CancellationToken,
    shutdown: watch::Receiver<Option<Duration>>,
    pod_open: bool,
    shutdown_open: bool,
    deadline: Option<Instant>,
    deletion_grace: Option<i64>,
    /// The pod was deleted (it is deleted with grace 0 once its containers have stopped).
    deleted: bool,
    /// The pod is gone from the API.
    gone_seen: bool,
    /// The node shuts down.
    shutdown_seen: bool,
}

impl Signals {
    fn new(
        pod: watch::Receiver<Arc<Pod>>,
        gone: CancellationToken,
        shutdown: watch::Receiver<Option<Duration>>,
    ) -> Self {
        Self {
            pod,
            gone,
            shutdown,
            pod_open: true,
            shutdown_open: true,
            deadline: None,
            deletion_grace: None,
            deleted: false,
            gone_seen: false,
            shutdown_seen: false,
        }
    }

    fn latest(&self) -> Arc<Pod> {
        Arc::clone(&self.pod.borrow())
    }

    fn spec_grace(&self) -> Duration {
        let seconds = self
            .latest()
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    /// Resolves with a stop deadline whenever one appears or moves earlier: pod deleted (its
    /// deletion grace period), gone from the API, or node shutdown (the pod's grace, capped).
    async fn next(&mut self) -> Instant {
        loop {
            let now = Instant::now();
            let mut candidate: Option<Instant> = None;
            let mut propose =
                |at: Instant| candidate = Some(candidate.map_or(at, |c: Instant| c.min(at)));
            if (self.gone.is_cancelled() || !self.pod_open) && !self.gone_seen {
                self.gone_seen = true;
                propose(now + MIN_GRACE);
            }
            let limit = if self.shutdown_open {
                *self.shutdown.borrow()
            } else {
                Some(Duration::ZERO)
            };
            if let Some(limit) = limit {
                if !self.shutdown_seen {
                    self.shutdown_seen = true;
                    propose(now + self.spec_grace().min(limit).max(MIN_GRACE.min(limit)));
                }
            }
            let pod = self.latest();
            if pod.metadata.deletion_timestamp.is_some() {
                self.deleted = true;
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .unwrap_or_else(|| i64::try_from(self.spec_grace().as_secs()).unwrap_or(30));
                if self.deletion_grace != Some(grace) {
                    self.deletion_grace = Some(grace);
                    propose(
                        now + Duration::from_secs(u64::try_from(grace).unwrap_or(0)).max(MIN_GRACE),
                    );
                }
            }
            if let Some(at) = candidate {
                if self.deadline.is_none_or(|d| at < d) {
                    self.deadline = Some(at);
                    return at;
                }
            }
            tokio::select! {
                () = self.gone.cancelled(), if !self.gone_seen => {}
                changed = self.pod.changed(), if self.pod_open => {
                    if changed.is_err() {
                        self.pod_open = false;
                    }
                }
                changed = self.shutdown.changed(), if self.shutdown_open => {
                    if changed.is_err() {
                        self.shutdown_open = false;
                    }
                }
                // Nothing left to learn: no earlier deadline will come.
                else => std::future::pending::<()>().await,
            }
        }
    }
}

/// How the containers' phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Stop requested, by this deadline.
    Stop(Instant),
    /// Every container finished for good (or an init container failed for good).
    Finished,
}

struct Worker {
    ctx: Arc<Ctx>,
    signals: Signals,
}

impl Worker {
    async fn run(mut self) -> Result<(), PodError> {
        let pod = self.signals.latest();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = format!("{namespace}/{name}");

        // A pod of the same name (an earlier incarnation) finishes first.
        let lock = self.ctx.name_lock(&key);
        let _guard = tokio::select! {
            guard = lock.lock_owned() => guard,
            () = self.signals.gone.cancelled() => return Ok(()),
        };
        let pod = self.signals.latest();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &namespace);
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if matches!(phase, "Succeeded" | "Failed") || pod.metadata.deletion_timestamp.is_some() {
            // Nothing to run: delete it once deleted (at once if it already is).
            self.signals.next().await;
            if self.signals.deleted && !self.signals.gone_seen {
                delete_pod(&api, &name, &uid).await;
            }
            return Ok(());
        }

        let ip = self.allocate_ip(&pod).map_err(|source| PodError::Ip {
            pod: key.clone(),
            source,
        })?;
        let mut lease = IpLease {
            ctx: Arc::clone(&self.ctx),
            ip,
            held: true,
        };
        let result = self.run_pod(&pod, &api, &mut lease, &key).await;
        lease.release();
        self.ctx.hosts.unregister(&key);
        result
    }

    /// The pod's IP: the node's for `hostNetwork` pods, else its previous one when free, else
    /// the lowest free loopback address.
    fn allocate_ip(&self, pod: &Pod) -> Result<Ipv4Addr, IpamError> {
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            // Not from the pool: releasing it is a no-op.
            return Ok(Ipv4Addr::LOCALHOST);
        }
        let mut ips = self.ctx.ips.lock();
        let previous = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        match previous {
            Some(ip) if ips.reserve(ip) => Ok(ip),
            _ => ips.allocate(),
        }
    }

    async fn run_pod(
        &mut self,
        pod: &Arc<Pod>,
        api: &Api<Pod>,
        lease: &mut IpLease,
        key: &str,
    ) -> Result<(), PodError> {
        let ip = lease.ip;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let dir = self
            .ctx
            .config
            .dir
            .join("pods")
            .join(format!("{namespace}_{name}"));
        let volumes_dir = prepare_pod_dir(&dir, key)?;

        let init_specs = spec.init_containers.clone().unwrap_or_default();
        let record = initial_record(pod, &spec, &init_specs, ip);
        let (changes, _) = watch::channel(0u64);
        let shared = Arc::new(PodShared {
            ctx: Arc::clone(&self.ctx),
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
            dir: dir.clone(),
            pod_ip: ip.to_string(),
            record: parking_lot::Mutex::new(record),
            changes,
            pod: self.signals.pod.clone(),
        });
        let hosts = hosts_entry(&shared, &spec, ip);
        self.ctx
            .hosts
            .register(key, hosts)
            .map_err(|source| PodError::Hosts {
                pod: key.to_owned(),
                source,
            })?;
        shared.update_record(|r| r.sandbox_ready = true);

        // Owned helpers: the status writer and the volume refresher.
        let mut aux: JoinSet<()> = JoinSet::new();
        let (writer, first_written) = StatusTask::spawn(&shared, api);
        info!(ip = %ip, "pod accepted");
        // The IP is in the status before anything starts (bounded: an unreachable API server
        // does not hold the containers back for ever).
        let _ = tokio::time::timeout(Duration::from_secs(10), first_written).await;

        let end = self
            .run_volumes_and_containers(&shared, &init_specs, &mut aux)
            .await;
        aux.shutdown().await;
        self.write_final_status(&shared, end, writer).await;
        let _ = std::fs::remove_dir_all(&volumes_dir);
        info!(end = ?end, "pod's containers stopped");

        if matches!(end, End::Finished)
            && !self.signals.deleted
            && !self.signals.gone_seen
            && !self.signals.shutdown_seen
        {
            // Completed pods stay until deleted; their IP is free meanwhile.
            lease.release();
            self.ctx.hosts.unregister(key);
            self.signals.next().await;
        }
        if self.signals.deleted && !self.signals.gone_seen {
            delete_pod(api, &name, &uid).await;
        }
        Ok(())
    }

    /// Writes the volumes (unless a stop comes first), keeps them refreshed in `aux`, and runs
    /// the containers.
    async fn run_volumes_and_containers(
        &mut self,
        shared: &Arc<PodShared>,
        init_specs: &[Container],
        aux: &mut JoinSet<()>,
    ) -> End {
        let mut volumes = Volumes::new(shared.volumes_dir());
        let setup = tokio::select! {
            refresh = setup_volumes(shared, &mut volumes) => Ok(refresh),
            deadline = self.signals.next() => Err(deadline),
        };
        match setup {
            Err(deadline) => End::Stop(deadline),
            Ok(refresh) => {
                aux.spawn(
                    refresh_volumes(Arc::clone(shared), volumes, refresh)
                        .instrument(tracing::Span::current()),
                );
                self.run_containers(shared, init_specs).await
            }
        }
    }

    /// Marks the record terminal (saying why at a node shutdown) and gives the status writer
    /// a bounded time to write it, unless the pod is gone.
    async fn write_final_status(&self, shared: &PodShared, end: End, writer: StatusTask) {
        shared.update_record(|r| {
            r.terminal = true;
            if self.signals.shutdown_seen && !self.signals.gone_seen && matches!(end, End::Stop(_))
            {
                r.reason = Some((
                    "Terminated".into(),
                    "Pod was terminated in response to imminent node shutdown.".into(),
                ));
            }
        });
        let flush = if self.signals.shutdown_seen {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(15)
        };
        writer.done.cancel();
        if self.signals.gone_seen {
            drop(writer.task);
        } else if tokio::time::timeout(flush, writer.task).await.is_err() {
            warn!("final pod status not written in time");
        }
    }

    /// Init containers in order (sidecars kept running), then the containers, until they all
    /// finish for good or a stop is requested; then stops them.
    async fn run_containers(&mut self, shared: &Arc<PodShared>, init_specs: &[Container]) -> End {
        let mut runners = Runners::new(shared, init_specs);
        let mut changes = shared.changes.subscribe();
        runners.advance();

        let end = loop {
            tokio::select! {
                deadline = self.signals.next() => break End::Stop(deadline),
                Some(joined) = runners.tasks.join_next() => {
                    let Ok((slot, outcome)) = joined else { continue };
                    if let Some(end) = runners.exited(slot, outcome) {
                        break end;
                    }
                }
                changed = changes.changed(), if runners.awaiting_sidecar.is_some() => {
                    if changed.is_err() {
                        continue;
                    }
                    runners.advance_once_sidecar_started();
                }
            }
        };
        runners.stop(end, &mut self.signals).await;
        end
    }
}

/// Makes the pod's directory `dir` and an empty `volumes` in it (returned), and removes the
/// pid files an earlier incarnation left.
fn prepare_pod_dir(dir: &std::path::Path, key: &str) -> Result<std::path::PathBuf, PodError> {
    let dir_error = |path: &std::path::Path, source| PodError::Dir {
        pod: key.to_owned(),
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| dir_error(dir, e))?;
    let volumes_dir = dir.join("volumes");
    let _ = std::fs::remove_dir_all(&volumes_dir);
    std::fs::create_dir_all(&volumes_dir).map_err(|e| dir_error(&volumes_dir, e))?;
    for stale in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if stale.path().extension().is_some_and(|e| e == "pid") {
            let _ = std::fs::remove_file(stale.path());
        }
    }
    Ok(volumes_dir)
}

/// The pod's record before anything runs: its IP and every container waiting.
fn initial_record(pod: &Pod, spec: &PodSpec, init_specs: &[Container], ip: Ipv4Addr) -> PodRecord {
    let sidecar = |i: usize| init_specs[i].restart_policy.as_deref() == Some("Always");
    let main_waiting = if init_specs.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    PodRecord {
        pod_ips: vec![ip.to_string()],
        host_ip: HOST_IP.to_owned(),
        start_time: Some(
            pod.status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map_or_else(Timestamp::now, |t| t.0),
        ),
        sandbox_ready: false,
        init: init_specs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                ContainerRecord::new(
                    &c.name,
                    c.image.as_deref().unwrap_or_default(),
                    "PodInitializing",
                    sidecar(i),
                )
            })
            .collect(),
        containers: spec
            .containers
            .iter()
            .map(|c| {
                ContainerRecord::new(
                    &c.name,
                    c.image.as_deref().unwrap_or_default(),
                    main_waiting,
                    false,
                )
            })
            .collect(),
        ..PodRecord::default()
    }
}

/// The pod's entry in the hosts files: its hostname, subdomain and host aliases.
fn hosts_entry(shared: &PodShared, spec: &PodSpec, ip: Ipv4Addr) -> HostsEntry {
    HostsEntry {
        path: shared.hosts_file(),
        namespace: shared.namespace.clone(),
        pod_ip: ip.to_string(),
        hostname: spec
            .hostname
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| shared.name.clone()),
        subdomain: spec.subdomain.clone().filter(|s| !s.is_empty()),
        aliases: spec
            .host_aliases
            .iter()
            .flatten()
            .map(|a| (a.ip.clone(), a.hostnames.clone().unwrap_or_default()))
            .collect(),
    }
}

/// The pod's status writer, and the token telling it to write once more and end.
struct StatusTask {
    task: tokio_util::task::AbortOnDropHandle<()>,
    done: CancellationToken,
}

impl StatusTask {
    /// Starts [`status_writer`]; the receiver resolves once it wrote the first status.
    fn spawn(
        shared: &Arc<PodShared>,
        api: &Api<Pod>,
    ) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let done = CancellationToken::new();
        let (first_written, first_written_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(
            status_writer(Arc::clone(shared), api.clone(), done.clone(), first_written)
                .instrument(tracing::Span::current()),
        );
        let task = tokio_util::task::AbortOnDropHandle::new(task);
        (Self { task, done }, first_written_rx)
    }
}

/// A pod's containers while they run: their runner tasks, the stop requests (containers and
/// sidecars are told apart), and how far the init sequence got.
struct Runners<'a> {
    shared: &'a Arc<PodShared>,
    init_specs: &'a [Container],
    tasks: JoinSet<(Slot, Outcome)>,
    stop_main: watch::Sender<Option<StopRequest>>,
    stop_main_rx: watch::Receiver<Option<StopRequest>>,
    stop_side: watch::Sender<Option<StopRequest>>,
    stop_side_rx: watch::Receiver<Option<StopRequest>>,
    n_main: usize,
    side_running: usize,
    other_running: usize,
    next_init: usize,
    awaiting_sidecar: Option<usize>,
    mains_left: usize,
}

impl<'a> Runners<'a> {
    fn new(shared: &'a Arc<PodShared>, init_specs: &'a [Container]) -> Self {
        let n_main = shared.snapshot().containers.len();
        let (stop_main, stop_main_rx) = watch::channel::<Option<StopRequest>>(None);
        let (stop_side, stop_side_rx) = watch::channel::<Option<StopRequest>>(None);
        Self {
            shared,
            init_specs,
            tasks: JoinSet::new(),
            stop_main,
            stop_main_rx,
            stop_side,
            stop_side_rx,
            n_main,
            side_running: 0,
            other_running: 0,
            next_init: 0,
            awaiting_sidecar: None,
            mains_left: n_main,
        }
    }

    fn sidecar(&self, i: usize) -> bool {
        self.init_specs[i].restart_policy.as_deref() == Some("Always")
    }

    fn spawn(&mut self, slot: Slot, rx: watch::Receiver<Option<StopRequest>>) {
        let name = match slot {
            Slot::Init(i) => self.init_specs[i].name.clone(),
            Slot::Main(i) => self
                .shared
                .latest()
                .spec
                .as_ref()
                .and_then(|s| s.containers.get(i))
                .map(|c| c.name.clone())
                .unwrap_or_default(),
        };
        let span = info_span!("container", container = %name);
        self.tasks.spawn(
            container::run(Arc::clone(self.shared), slot, rx)
                .map(move |outcome| (slot, outcome))
                .instrument(span),
        );
    }

    /// Starts the next init container, or the containers once all are done.
    fn advance(&mut self) {
        if self.next_init < self.init_specs.len() {
            let i = self.next_init;
            self.next_init += 1;
            if self.sidecar(i) {
                self.spawn(Slot::Init(i), self.stop_side_rx.clone());
                self.side_running += 1;
                self.awaiting_sidecar = Some(i);
            } else {
                self.spawn(Slot::Init(i), self.stop_main_rx.clone());
                self.other_running += 1;
            }
            return;
        }
        self.shared.update_record(|r| {
            for c in &mut r.containers {
                if let RunState::Waiting { reason, .. } = &mut c.state {
                    if reason == "PodInitializing" {
                        "ContainerCreating".clone_into(reason);
                    }
                }
            }
        });
        for i in 0..self.n_main {
            self.spawn(Slot::Main(i), self.stop_main_rx.clone());
            self.other_running += 1;
        }
    }

    /// Counts a runner's end and moves the sequence on; `Some` when the containers' phase is
    /// over (every container finished, or an init container failed for good).
    fn exited(&mut self, slot: Slot, outcome: Outcome) -> Option<End> {
        let is_sidecar = matches!(slot, Slot::Init(i) if self.sidecar(i));
        if is_sidecar {
            self.side_running -= 1;
            return None;
        }
        self.other_running -= 1;
        match (slot, outcome) {
            (Slot::Init(_), Outcome::Succeeded) => {
                self.advance();
                None
            }
            (Slot::Init(_), _) => {
                self.shared.update_record(|r| r.init_failed = true);
                Some(End::Finished)
            }
            (Slot::Main(_), _) => {
                self.mains_left -= 1;
                (self.mains_left == 0).then_some(End::Finished)
            }
        }
    }

    /// Moves on past the sidecar being waited for once it has started.
    fn advance_once_sidecar_started(&mut self) {
        let started = self
            .awaiting_sidecar
            .and_then(|i| self.shared.snapshot().init.get(i).map(|c| c.started))
            .unwrap_or(true);
        if started {
            self.awaiting_sidecar = None;
            self.advance();
        }
    }

    /// Stops them: containers first, then sidecars; a later, earlier deadline moves it.
    async fn stop(&mut self, end: End, signals: &mut Signals) {
        let mut deadline = match end {
            End::Stop(deadline) => deadline,
            End::Finished => Instant::now() + self.shared.grace().max(MIN_GRACE),
        };
        self.stop_main.send_replace(Some(StopRequest { deadline }));
        let mut sidecars_told = false;
        loop {
            if self.other_running == 0 && !sidecars_told {
                self.stop_side.send_replace(Some(StopRequest { deadline }));
                sidecars_told = true;
            }
            if self.other_running == 0 && self.side_running == 0 {
                break;
            }
            tokio::select! {
                Some(joined) = self.tasks.join_next() => {
                    match joined {
                        Ok((Slot::Init(i), _)) if self.sidecar(i) => self.side_running -= 1,
                        Ok(_) => self.other_running -= 1,
                        Err(_) => {
                            self.side_running = self.side_running.min(self.tasks.len());
                            self.other_running = self.tasks.len() - self.side_running;
                        }
                    }
                }
                at = signals.next() => {
                    deadline = deadline.min(at);
                    self.stop_main.send_replace(Some(StopRequest { deadline }));
                    if sidecars_told {
                        self.stop_side.send_replace(Some(StopRequest { deadline }));
                    }
                }
                else => break,
            }
        }
    }
}

/// Writes the volumes once for the latest Pod object; when a token is next due.
async fn sync_volumes(
    shared: &PodShared,
    volumes: &mut Volumes,
) -> Result<Option<Instant>, VolumeError> {
    let pod = shared.latest();
    let pod_ips = [shared.pod_ip.clone()];
    let fields = FieldContext {
        pod: &pod,
        pod_ips: &pod_ips,
        host_ip: HOST_IP,
    };
    let next_token = volumes.sync(&shared.ctx.client, fields).await?;
    Ok(next_token.map(Instant::from_std))
}

/// Writes the volumes, retrying (with the containers shown waiting and why) until it works.
async fn setup_volumes(shared: &PodShared, volumes: &mut Volumes) -> Option<Instant> {
    let mut last_error: Option<String> = None;
    loop {
        match sync_volumes(shared, volumes).await {
            Ok(next_token) => return next_token,
            Err(error) => {
                warn!(error = %error, "volumes not ready (retried)");
                show_volume_error(shared, &error);
                let text = error.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    shared
                        .event(
                            true,
                            "FailedMount",
                            format!("MountVolume.SetUp failed: {text}"),
                        )
                        .await;
                    last_error = Some(text);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

fn show_volume_error(shared: &PodShared, error: &VolumeError) {
    let message = format!("MountVolume.SetUp failed: {error}");
    shared.update_record(|r| {
        for c in r.init.iter_mut().chain(r.containers.iter_mut()) {
            if let RunState::Waiting { message: m, .. } = &mut c.state {
                *m = Some(message.clone());
            }
        }
    });
}

/// Rewrites the volumes every [`VOLUME_RESYNC`] and when a token is due.
async fn refresh_volumes(
    shared: Arc<PodShared>,
    mut volumes: Volumes,
    mut next_token: Option<Instant>,
) {
    loop {
        let resync = Instant::now() + VOLUME_RESYNC;
        let at = next_token.map_or(resync, |t| t.min(resync));
        tokio::time::sleep_until(at).await;
        match sync_volumes(&shared, &mut volumes).await {
            Ok(next) => next_token = next,
            Err(error) => {
                debug!(error = %error, dir = %volumes.dir().display(), "volume refresh failed (retried)");
            }
        }
    }
}

/// Writes the pod's status whenever it changes (strategic merge patch of `pods/status`: the
/// owned conditions merge by type, others' conditions stay), and once more when `done`.
async fn status_writer(
    shared: Arc<PodShared>,
    api: Api<Pod>,
    done: CancellationToken,
    first_written: tokio::sync::oneshot::Sender<()>,
) {
    let mut first = true;
    let mut changes = shared.changes.subscribe();
    let mut pod_changes = shared.pod.clone();
    let mut writes = StatusWrites {
        first_written: Some(first_written),
        previous: owned_conditions(&shared.latest()),
        last: None,
        retry: false,
    };
    // Out of the service proxy whenever this writer ends (also when aborted).
    let _unready = Unready(&shared);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    loop {
        let finishing = if first {
            first = false;
            false
        } else {
            tokio::select! {
                biased;
                () = done.cancelled() => true,
                changed = changes.changed() => changed.is_err(),
                changed = pod_changes.changed() => changed.is_err(),
                () = tokio::time::sleep(Duration::from_secs(1)), if writes.retry => false,
            }
        };
        if !finishing && writes.last.is_some() {
            // Coalesce bursts of changes.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let pod = shared.latest();
        let status =
            status::pod_status(&pod, &shared.snapshot(), &writes.previous, Timestamp::now());
        if writes.last.as_ref() != Some(&status)
            && !writes.write(&shared, &api, &params, status).await
        {
            return;
        }
        if finishing && !writes.retry {
            return;
        }
        if finishing {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The conditions of `pod` this agent owns, as last written (the base of the next status).
fn owned_conditions(pod: &Pod) -> Vec<PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| status::OWNED_CONDITIONS.contains(&c.type_.as_str()))
        .collect()
}

/// What [`status_writer`] remembers between writes.
struct StatusWrites {
    /// Told once the first status is written.
    first_written: Option<tokio::sync::oneshot::Sender<()>>,
    /// The owned conditions last written.
    previous: Vec<PodCondition>,
    /// The status last written.
    last: Option<PodStatus>,
    /// The last write failed: try again soon.
    retry: bool,
}

impl StatusWrites {
    /// Tells the service proxy the pod's readiness and patches `status`; `false` when the pod
    /// is gone.
    async fn write(
        &mut self,
        shared: &PodShared,
        api: &Api<Pod>,
        params: &PatchParams,
        status: PodStatus,
    ) -> bool {
        // The proxy learns readiness before the API shows it.
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let entry = shared
            .pod_ip
            .parse()
            .ok()
            .filter(|_| ready)
            .map(|ip| (ip, shared.pod.clone()));
        shared.ctx.ready.set(&shared.uid, entry);
        let patch = json!({ "status": status });
        match api
            .patch_status(&shared.name, params, &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                if let Some(tx) = self.first_written.take() {
                    let _ = tx.send(());
                }
                debug!(
                    phase = status.phase.as_deref().unwrap_or_default(),
                    "pod status written"
                );
                self.previous = status.conditions.clone().unwrap_or_default();
                self.last = Some(status);
                self.retry = false;
            }
            Err(kube::Error::Api(response)) if response.code == 404 => return false,
            Err(error) => {
                warn!(error = %error, "pod status not written (retried)");
                self.retry = true;
            }
        }
        true
    }
}

/// Takes the pod out of the service proxy when dropped.
struct Unready<'a>(&'a PodShared);

impl Drop for Unready<'_> {
    fn drop(&mut self) {
        self.0.ctx.ready.set(&self.0.uid, None);
    }
}

/// A pod IP, given back once (explicitly or when dropped).
struct IpLease {
    ctx: Arc<Ctx>,
    ip: Ipv4Addr,
    held: bool,
}

impl IpLease {
    fn release(&mut self) {
        if self.held {
            self.held = false;
            self.ctx.release_ip(self.ip);
        }
    }
}

impl Drop for IpLease {
    fn drop(&mut self) {
        self.release();
    }
}

/// Deletes the pod with grace 0 and a UID precondition, as the kubelet does once its
/// containers have stopped.
async fn delete_pod(api: &Api<Pod>, name: &str, uid: &str) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => info!("pod deleted"),
        Err(kube::Error::Api(response)) if matches!(response.code, 404 | 409) => {}
        Err(error) => warn!(error = %error, "pod not deleted"),
    }
}
