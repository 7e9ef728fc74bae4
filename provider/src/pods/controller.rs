//! Runs the pods bound to this node as ECI container groups.
//!
//! - One level-triggered sync per pod ([`PodController::sync`]): a watch of this node's pods
//!   (`spec.nodeName=<node>`), the status polls, a full listing's resync and the times
//!   something falls due only store what they saw in the pod's entry and queue the pod; the
//!   sync steps its [`Lifecycle`] by the copy kept (create, delete, stop, nothing) and queues
//!   the pod's status write, which writes where the status differs from its group's state.
//! - Creation: fetch what the pod references, translate ([`vne_core::to_eci`]), create with
//!   `ClientToken` = pod UID (idempotent across retries and restarts), retrying throttling and
//!   server errors with back-off; a request that can never work fails the pod with
//!   `ProviderFailed`, one that may work later leaves it Pending with the reason.
//! - Status: one `DescribeContainerGroupStatus` per interval for the whole node with
//!   `since_second`, plus a periodic full listing; a pod's status is written only when it
//!   changed ([`vne_core::from_eci`]).
//! - Deletion: a pod with a deletionTimestamp gets its group deleted (grace period honoured),
//!   then the Pod is deleted with grace 0 and a UID precondition.
//! - Start-up: groups tagged with this cluster and node are adopted by pod UID; groups whose pod
//!   no longer exists are deleted; nothing of other nodes or clusters is ever touched.

mod carried;
mod create;
mod deadline;
mod delete;
mod describe;
mod eci_events;
mod gate;
mod misconfigured;
mod notice;
mod slim;
mod status_writes;

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::{ExponentialBuilder, Retryable as _};
use eci_proto::EciError;
use eci_proto::v20180808::{ContainerGroupStatus, DescribeContainerGroupStatusRequest, Tag};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::events::Reporter;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn};

use crate::config::{PodsArgs, WithSite};
use crate::eci::Backend;
use crate::k8s::FIELD_MANAGER;
use crate::k8s::shared_watch::SharedWatch;
use crate::k8s::write_share::WriteShare;
use crate::ops::events::EventPublisher;
use crate::ops::metrics::{MetricSet as _, Telemetry};
use crate::ops::supervisor::Supervisor;
use crate::pods::PodMetrics;
use crate::pods::workqueue::WorkQueue;
use create::{CreateJob, WriteBack};
use vne_core::from_eci;
use vne_core::lifecycle::{self, Effect, Lifecycle, Trigger};
use vne_core::to_eci::naming;

/// Annotation recording the pod's ECI instance.
pub const INSTANCE_ANNOTATION: &str = "k8s.aliyun.com/eci-instance-id";
/// Reason of pod conditions and events when ECI cannot run a pod.
pub const PROVIDER_FAILED: &str = "ProviderFailed";
/// Pod status writes in flight at most, for the whole fleet: each replica writes its share
/// ([`WriteShare`]; each pod's writes are sequential).
const STATUS_WRITERS: usize = 32;
/// Pod removals sent to the API server at once, as many as status writers, for the whole
/// fleet (each replica its share): unbounded, a scale-in sends every removal at once, each on
/// a connection of its own (HTTP/1.1), and fills the apiserver's mutating in-flight limit
/// ahead of the status writes. A budget of its own rather than a part of the status writes':
/// with one budget for both, replicas that divide it write statuses on more permits, faster
/// than a pod's states coalesce, and the apiserver takes creates slower (docs/performance.md).
const POD_DELETES_IN_FLIGHT: usize = STATUS_WRITERS;
/// A replica's share of the status writes or removals never falls below this.
const WRITE_SHARE_FLOOR: usize = 2;
/// How long per-pod work in flight (deletions, status writes) may take after a stop.
const IN_FLIGHT_GRACE: Duration = Duration::from_secs(5);
/// Annotation writes in flight at most. Each first reads its group, and the reads made at
/// the same time share DescribeContainerGroups calls of up to 20 ids: twice that many
/// writers keep a call full under a burst while the previous one is in flight.
const ANNOTATION_WRITERS: usize = 40;
/// Pods synced at once. A sync waits on nothing but the few writes it makes itself (a pod
/// skipped, stopped or lost); the status writes have their own workers.
const SYNC_WORKERS: usize = STATUS_WRITERS;

#[derive(Debug, Default)]
struct PodEntry {
    /// The latest copy of the pod: whole until its group exists, then slim and packed.
    pod: Option<slim::PodCopy>,
    /// Where the pod is in its life on this node (and its group, where one exists).
    lifecycle: Lifecycle,
    /// Hash of the status last written (a hash, not the JSON: memory per pod matters at
    /// thousands of pods).
    written: Option<u64>,
    /// The newest ECI event already turned into an Event.
    events: eci_events::EventWatermark,
    /// The group's state as the polls last showed it, and whether the status writers have yet
    /// to apply it (see [`status_writes::SeenGroup`]).
    group: status_writes::SeenGroup,
    /// Hash of the refusal last shown on the pod, while the namespace scope or the
    /// annotation policy refuses it.
    held: Option<u64>,
    /// Where the kept copy came from: the watch, or one of our writes' answers the watch has
    /// not delivered yet (see [`Origin`]).
    origin: Origin,
    /// The annotations of ours the pod's status applies carry (see [`carried`]).
    carried: carried::OwnAnnotations,
    /// What the pod is to show in place of its group's state, until a status writer writes
    /// it (boxed: most pods never have one).
    notice: Option<Box<notice::Notice>>,
}

/// Where the kept copy of a pod came from. The apiserver answers a write with the object as
/// it now is; its watch delivers the same change later, in order. Until the watch brings the
/// answer's resourceVersion, what it delivers is older than the copy held: keeping it would
/// make the next write carry an outdated resourceVersion (a 409, a read, a second write) and
/// would look like someone wrote over our status (a third). Versions are compared only for
/// equality (they are opaque) and kept as hashes (memory per pod matters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Origin {
    /// From the watch (or a list): the newest the watch has shown.
    #[default]
    Watched,
    /// Our write's answer, at the version with this hash; the watch has not shown it yet.
    Answered(u64),
}

/// What to do with a copy of a pod the watch delivers (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Newer than the kept copy, or the kept copy's own version: keep it.
    Keep,
    /// Older than the answer kept: leave the kept copy as it is.
    Older,
}

impl Origin {
    /// The watch delivers a copy at the version with hash `version`; `listed`: from a list,
    /// which shows the current state (it follows no order with our writes).
    fn deliver(self, version: u64, listed: bool) -> Delivery {
        match self {
            Self::Answered(answered) if answered != version && !listed => Delivery::Older,
            _ => Delivery::Keep,
        }
    }
}

impl PodEntry {
    /// Stores the latest copy of the pod; once its group exists, only what the controller
    /// still reads of it (memory per pod matters at thousands of pods).
    fn keep(&mut self, pod: &Arc<Pod>) {
        if self
            .pod
            .as_ref()
            .is_some_and(|kept| kept.is(pod) || kept.packs_version_of(pod))
        {
            return;
        }
        self.pod = Some(if self.lifecycle.group().is_some() {
            slim::PodCopy::packed(pod)
        } else {
            slim::PodCopy::whole(pod)
        });
    }

    /// Packs a whole copy once the group exists. Otherwise that waits for the pod's next watch
    /// event, which after a burst of creations can be a status write a long queue away, and
    /// the whole copies waiting that long are a large share of the burst's peak memory.
    fn slim_down(&mut self) {
        if let Some(slim::PodCopy::Whole(pod)) = &self.pod
            && self.lifecycle.group().is_some()
        {
            self.pod = Some(slim::PodCopy::packed(pod));
        }
    }

    /// Keeps the copy a write of ours was answered with, when the kept copy is still the one
    /// the write was computed from (at version `basis`). A copy the watch stored meanwhile is
    /// at least as new as the answer: the write carried `basis` as its precondition, so any
    /// other write in between would have failed it; that copy stays, and if it shows someone
    /// writing over ours, the sync it queued finds that out.
    fn keep_answer(&mut self, pod: &Arc<Pod>, basis: u64) {
        let version = slim::version_of(pod);
        let Some(kept) = self.pod.as_ref() else {
            return;
        };
        if kept.version() == version || kept.version() != basis {
            return;
        }
        self.keep(pod);
        self.origin = Origin::Answered(version);
    }

    /// After a restart: what a pod showing its group's id carries of ours stays on it. Read from
    /// the copy the watch delivers, as the kept copy has no managed fields.
    fn adopt_carried(&mut self, pod: &Pod) {
        let Some(group) = self.lifecycle.live_group() else {
            return;
        };
        let shown = pod.annotations();
        // The id is checked against the group; the others count only if our writes own them
        // (a pod author may have set them).
        self.carried.adopt(group, |key| {
            (key == INSTANCE_ANNOTATION || carried::written_by(pod, FIELD_MANAGER, key))
                .then(|| shown.get(key).map(String::as_str))
                .flatten()
        });
    }

    /// What the pod shows is no longer known to be ours: the next full listing gives the
    /// status writers the group's state again, and they write where they differ.
    fn forget_status(&mut self) {
        self.written = None;
        self.group.forget();
    }

    /// Moves the pod's lifecycle on by `event`: what to do, or `None` when the transition
    /// cannot happen (logged; the state stays as it was).
    fn on(&mut self, uid: &str, event: Trigger<'_>) -> Option<Effect> {
        match std::mem::take(&mut self.lifecycle).on(event) {
            Ok(step) => {
                self.lifecycle = step.next;
                Some(step.effect)
            }
            Err((state, impossible)) => {
                self.lifecycle = state;
                warn!(pod_uid = %uid, %impossible, "ignoring an event the pod's state does not allow");
                None
            }
        }
    }
}

/// What adoption and orphan collection need of a listed group.
#[derive(Debug, Clone)]
struct Adopted {
    id: String,
    uid: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl Adopted {
    /// The group, when it carries this cluster's and this node's tags (ECI is asked by them;
    /// an answer holding another cluster's group anyway must not make it ours to delete).
    fn from_group(group: &ContainerGroupStatus, cluster: &str, node: &str) -> Option<Self> {
        let ours = tag(group, naming::TAG_CLUSTER).as_deref() == Some(cluster)
            && tag(group, naming::TAG_NODE).as_deref() == Some(node);
        if !ours {
            return None;
        }
        Some(Self {
            id: group.container_group_id.clone(),
            uid: tag(group, naming::TAG_POD_UID)?,
            namespace: tag(group, naming::TAG_NAMESPACE),
            name: tag(group, naming::TAG_POD_NAME),
        })
    }
}

/// Which container group runs which pod of this node, by pod UID: the groups this controller
/// created (`ClientToken` = pod UID) or adopted by their own cluster, node and pod-UID tags —
/// never what a pod's annotations say, which whoever may edit the pod can write. The kubelet
/// API and the metrics read it. Cheap to clone; readers see the controller's state as it is.
#[derive(Clone, Default)]
pub struct GroupDirectory {
    pods: Arc<Mutex<HashMap<String, PodEntry>>>,
}

impl GroupDirectory {
    /// The group running the pod with `pod_uid`, once created or adopted.
    pub fn group_of(&self, pod_uid: &str) -> Option<String> {
        self.pods
            .lock()
            .get(pod_uid)?
            .lifecycle
            .group()
            .map(str::to_owned)
    }

    /// A directory of fixed (pod UID, group id) pairs, for tools and tests that run the kubelet
    /// API or the metrics without a controller.
    pub fn fixed(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        let pods = pairs
            .into_iter()
            .map(|(uid, group)| {
                let tracked = PodEntry {
                    lifecycle: Lifecycle::Created {
                        group: group.into(),
                        annotated: false,
                    },
                    ..PodEntry::default()
                };
                (uid, tracked)
            })
            .collect();
        Self {
            pods: Arc::new(Mutex::new(pods)),
        }
    }
}

impl std::fmt::Debug for GroupDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupDirectory").finish_non_exhaustive()
    }
}

/// The controller.
#[derive(Clone)]
pub struct PodController {
    inner: Arc<Inner>,
}

/// What the annotation writers record: the pod (namespace and name) and what to write on it.
type Annotation = ((String, String), WriteBack);

struct Inner {
    config: WithSite<PodsArgs>,
    client: kube::Client,
    backend: Backend,
    telemetry: Arc<Telemetry>,
    metrics: PodMetrics,
    events: EventPublisher,
    /// Shared with the readers of [`GroupDirectory`].
    pods: Arc<Mutex<HashMap<String, PodEntry>>>,
    /// Pods waiting for their group to be created, by pod UID.
    creations: Arc<WorkQueue<String, CreateJob>>,
    /// Group ids to record on their pods (namespace and name), by pod UID.
    annotations: Arc<WorkQueue<String, Annotation>>,
    /// Pods to sync, by UID ([`PodController::sync`]): the watch, the polls, the annotation
    /// writers and the times something falls due only queue them.
    syncs: Arc<WorkQueue<String, ()>>,
    /// Pods whose status is to be brought in line with their group, by UID (see
    /// [`status_writes`]): their syncs queue them. Served within this replica's share of the
    /// fleet's status writes, so a pod that changed twice before its turn is written once.
    statuses: Arc<WorkQueue<String, ()>>,
    /// Work beside the queues (a relist's settling, the sweep after a lost create answer, the
    /// shared group reads): owned, so a stop lets in-flight ECI calls finish before the
    /// process ends.
    pod_tasks: TaskTracker,
    /// Cancelled once in-flight work had its grace after a stop: what is still waiting then
    /// (a deletion waiting for its group to go) is left to the successor, which resumes it.
    abandon: CancellationToken,
    /// This replica's shares of the apiserver writes the fleet makes together.
    shares: Shares,
    /// The live replicas the shares are divided among.
    replicas: watch::Receiver<u32>,
    /// Deletions of pods and groups whose next step is a group's deletion, one step at a time
    /// (see [`delete`]).
    deletions: Arc<WorkQueue<delete::DeletionKey, delete::Deletion>>,
    /// Deletions whose next step is the pod's removal (see [`delete`]).
    pod_removals: Arc<WorkQueue<delete::DeletionKey, delete::Deletion>>,
    /// Deletions waiting for their group to go, by group id.
    awaiting_removal: Mutex<HashMap<String, delete::AwaitingGone>>,
    /// DescribeContainerGroups lookups of single groups, sharing calls.
    group_reads: describe::ReadsByLookup,
    /// Keeps the groups' service account tokens fresh (one timer queue for all pods).
    tokens: crate::pods::tokens::TokenRefresher,
    /// The Services ECI pods see in their environment (one watch).
    services: crate::pods::services::ServiceCache,
    /// The namespace scope and annotation policy, as currently known.
    tenancy: crate::pods::tenancy::PolicyFeed,
    /// What ECI says of the daemon's configuration, shared with the node status.
    misconfig: Arc<crate::eci::misconfig::Monitor>,
    /// This node's pods: the replica's one watch of them (the kubelet API reads it too).
    node_pods: Arc<SharedWatch<Pod>>,
}

impl std::fmt::Debug for PodController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodController")
            .field("node", &self.inner.config.site.node_name)
            .finish_non_exhaustive()
    }
}

fn tag(group: &ContainerGroupStatus, key: &str) -> Option<String> {
    group
        .tags
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.value.clone())
}

/// Whether this node's pod writes wait: statuses or instance ids to write, or every pod-removal
/// turn taken. ECI's routine events yield to them: a pod's
/// status is what its owner waits for, its events are not. (Creations waiting are left out:
/// they wait for ECI's quota, not for the apiserver.)
fn pod_writes_waiting(
    annotations: &Arc<WorkQueue<String, Annotation>>,
    statuses: &Arc<WorkQueue<String, ()>>,
    removals: &Arc<WriteShare>,
) -> crate::ops::events::Precedence {
    let (annotations, statuses, removals) = (
        Arc::clone(annotations),
        Arc::clone(statuses),
        Arc::clone(removals),
    );
    Arc::new(move || !statuses.is_empty() || !annotations.is_empty() || removals.all_taken())
}

/// This replica's shares of the apiserver writes the fleet makes together (see
/// [`WriteShare`]): the fleet's budgets are the constants above, divided among the live
/// replicas as ECI's quotas are.
#[derive(Debug)]
struct Shares {
    /// Pod status writes ([`STATUS_WRITERS`]).
    statuses: Arc<WriteShare>,
    /// Pod removals, the grace-0 delete after the group is gone ([`POD_DELETES_IN_FLIGHT`]).
    removals: Arc<WriteShare>,
    /// Background Event publications ([`crate::ops::events::MAX_WINDOW`]).
    events: Arc<WriteShare>,
}

impl Shares {
    fn new() -> Self {
        Self {
            statuses: WriteShare::new("pod statuses", STATUS_WRITERS, WRITE_SHARE_FLOOR),
            removals: WriteShare::new("pod removals", POD_DELETES_IN_FLIGHT, WRITE_SHARE_FLOOR),
            events: WriteShare::new("events", crate::ops::events::MAX_WINDOW, 1),
        }
    }

    /// Keeps every share at this replica's part until `stop`.
    async fn follow(&self, replicas: &watch::Receiver<u32>, stop: &CancellationToken) {
        tokio::join!(
            self.statuses.follow(replicas.clone(), stop.clone()),
            self.removals.follow(replicas.clone(), stop.clone()),
            self.events.follow(replicas.clone(), stop.clone()),
        );
    }
}

/// Namespace and name, as the annotation writers address a pod.
fn pod_key_parts(pod: &Pod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Retry delays of per-pod work (creations, deletions, lookups): doubling from 200 ms up to
/// 20 s, each with up to as much again of random jitter, so that the retries of many pods
/// that failed together (an outage) spread apart.
fn retry_delays() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(20))
        .with_jitter()
        .without_max_times()
}

/// The delay before retry `attempt` (from 0) of work that is queued again rather than retried
/// in a loop (a creation waits out its delay outside the workers).
fn backoff(attempt: u32) -> Duration {
    crate::ops::retry::nth(retry_delays(), attempt)
}

/// The pod controller's reader of this node's pod watch: it runs on the watch's task, so it
/// only updates the tracked pods and hands slow work (ECI calls, reads) to tasks and queues.
struct PodReader {
    controller: PodController,
    /// Adopted groups whose pod was not seen yet, by pod UID: their tags name the pod, so
    /// that its absence can be confirmed with a direct read.
    unseen: HashMap<String, Adopted>,
    /// The pods of the list in progress.
    listed: HashSet<String>,
    /// Whether a list was settled before (the next one is a relist).
    relist: bool,
    /// The controller's stop: after it, events are left to the successor.
    stop: CancellationToken,
}

impl PodReader {
    fn on(&mut self, event: &watcher::Event<Pod>) {
        if self.stop.is_cancelled() {
            return;
        }
        let controller = &self.controller;
        match event {
            watcher::Event::Init => self.listed.clear(),
            watcher::Event::InitApply(pod) => {
                let uid = pod.uid().unwrap_or_default();
                self.unseen.remove(&uid);
                self.listed.insert(uid);
                controller.observe_from(&kept_copy(pod), true);
            }
            watcher::Event::InitDone => self.settle(),
            watcher::Event::Apply(pod) => {
                if let Some(uid) = pod.uid() {
                    self.unseen.remove(&uid);
                }
                controller.observe(&kept_copy(pod));
            }
            watcher::Event::Delete(pod) => controller.forget(pod),
        }
    }

    /// A list is complete: confirming that the unlisted pods are gone takes a read each
    /// (thousands after a long gap), so it runs beside the watch, which goes on meanwhile.
    fn settle(&mut self) {
        let controller = &self.controller;
        let missing = controller.unlisted(&self.listed, &self.unseen);
        {
            let tracked = controller.tracked();
            self.unseen.retain(|uid, _| tracked.contains_key(uid));
        }
        let (settling, pods, relist) = (controller.clone(), self.listed.len(), self.relist);
        controller.spawn_pod_task(async move {
            let gone = settling.settle_list(missing).await;
            info!(
                pods,
                gone, relist, "resync complete: every pod and group of this node accounted for"
            );
        });
        self.relist = true;
        // Not needed until the next list, which may be days away.
        self.listed = HashSet::new();
    }
}

/// The copy of a watched pod the controller keeps (whole until its group exists): without its
/// managed fields, which nothing here reads and which are a large part of a pod (the kept
/// copies of watched pods are the largest share of the daemon's memory; measured:
/// docs/performance.md).
/// Every field but the managed ones is listed, so they are never cloned only to be dropped
/// (this runs for every watch event of the node's pods).
fn kept_copy(pod: &Pod) -> Arc<Pod> {
    let meta = &pod.metadata;
    Arc::new(Pod {
        metadata: ObjectMeta {
            annotations: meta.annotations.clone(),
            creation_timestamp: meta.creation_timestamp.clone(),
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            deletion_timestamp: meta.deletion_timestamp.clone(),
            finalizers: meta.finalizers.clone(),
            generate_name: meta.generate_name.clone(),
            generation: meta.generation,
            labels: meta.labels.clone(),
            managed_fields: None,
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            owner_references: meta.owner_references.clone(),
            resource_version: meta.resource_version.clone(),
            self_link: meta.self_link.clone(),
            uid: meta.uid.clone(),
        },
        spec: pod.spec.clone(),
        status: pod.status.clone(),
    })
}

impl PodController {
    /// A controller for `config.site.node_name`.
    pub fn new(
        config: WithSite<PodsArgs>,
        client: kube::Client,
        backend: Backend,
        telemetry: Arc<Telemetry>,
        node_pods: Arc<SharedWatch<Pod>>,
        replicas: watch::Receiver<u32>,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(config.site.node_name.clone()),
        };
        let annotations: Arc<WorkQueue<String, Annotation>> = Arc::default();
        let statuses: Arc<WorkQueue<String, ()>> = Arc::default();
        let shares = Shares::new();
        let precedence = pod_writes_waiting(&annotations, &statuses, &shares.removals);
        Self {
            inner: Arc::new(Inner {
                events: EventPublisher::yielding_to(
                    client.clone(),
                    reporter,
                    Arc::clone(&telemetry),
                    precedence,
                    Arc::clone(&shares.events),
                ),
                tokens: crate::pods::tokens::TokenRefresher::new(
                    client.clone(),
                    Arc::clone(&backend),
                    config.clone(),
                    Arc::clone(&telemetry),
                ),
                services: crate::pods::services::ServiceCache::new(),
                tenancy: crate::pods::tenancy::PolicyFeed::new(tenancy_settings(&config)),
                config,
                client,
                backend,
                metrics: PodMetrics::of(&telemetry),
                telemetry,
                pods: Arc::default(),
                creations: Arc::default(),
                annotations,
                syncs: Arc::default(),
                statuses,
                shares,
                replicas,
                deletions: Arc::default(),
                pod_removals: Arc::default(),
                awaiting_removal: Mutex::new(HashMap::new()),
                group_reads: describe::ReadsByLookup::default(),
                pod_tasks: TaskTracker::new(),
                abandon: CancellationToken::new(),
                misconfig: Arc::default(),
                node_pods,
            }),
        }
    }

    /// What ECI says of the daemon's configuration, as this controller's creations found it
    /// (the node status reports it and adds its own probes' findings).
    pub fn misconfig_monitor(&self) -> Arc<crate::eci::misconfig::Monitor> {
        Arc::clone(&self.inner.misconfig)
    }

    /// Which group runs which pod, as this controller knows it (for the kubelet API).
    pub fn groups(&self) -> GroupDirectory {
        GroupDirectory {
            pods: Arc::clone(&self.inner.pods),
        }
    }

    fn tracked(&self) -> MutexGuard<'_, HashMap<String, PodEntry>> {
        self.inner.pods.lock()
    }

    /// Whether the pod with `uid` has a group (created, adopted or found by its tags).
    fn has_group(&self, uid: &str) -> bool {
        self.tracked()
            .get(uid)
            .is_some_and(|t| t.lifecycle.group().is_some())
    }

    /// Moves the lifecycle of the pod with `uid` on by `event`, when it is tracked; what to do
    /// is the caller's (see [`PodEntry::on`]).
    fn advance(&self, uid: &str, event: Trigger<'_>) -> Option<Effect> {
        self.tracked().get_mut(uid)?.on(uid, event)
    }

    /// ECI created group `id` for the pod: the lifecycle's effect, and the kept copy slimmed
    /// (the whole pod was for the creation).
    fn record_created(&self, uid: &str, id: &str) -> Option<Effect> {
        let mut tracked = self.tracked();
        let entry = tracked.get_mut(uid)?;
        let effect = entry.on(uid, Trigger::Created(id));
        entry.slim_down();
        effect
    }

    fn node_tags(&self) -> Vec<Tag> {
        vec![
            Tag {
                key: naming::TAG_CLUSTER.into(),
                value: self.inner.config.site.cluster_name.clone(),
            },
            Tag {
                key: naming::TAG_NODE.into(),
                value: self.inner.config.site.node_name.clone(),
            },
        ]
    }

    /// Every group of this node changed within `since_second` (all of them when `None`), one
    /// page at a time: a whole group's description is large, and holding every page at once
    /// would cost memory in proportion to the node's groups.
    async fn visit_groups(
        &self,
        since_second: Option<i32>,
        mut visit: impl FnMut(Vec<ContainerGroupStatus>),
    ) -> Result<(), EciError> {
        let mut next_token = String::new();
        loop {
            let page = self
                .inner
                .backend
                .describe_container_group_status(DescribeContainerGroupStatusRequest {
                    region_id: self.inner.config.site.region.clone(),
                    tag: self.node_tags(),
                    limit: Some(200),
                    next_token: next_token.clone(),
                    since_second,
                    ..DescribeContainerGroupStatusRequest::default()
                })
                .await?;
            visit(page.data);
            if page.next_token.is_empty() {
                return Ok(());
            }
            next_token = page.next_token;
        }
    }

    /// Runs until cancelled: adopt, watch pods, poll statuses. Each loop is a task of its own
    /// (see [`Supervisor`]): the first to fail stops the others, and its error names it.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut loops = Supervisor::new(&stop);
        let stop = loops.stop().clone();
        // What pods are made of and who may run them starts first: adoption does not need it.
        self.spawn_feeds(&mut loops, &stop);
        let listed_at = tokio::time::Instant::now();
        let Some(adopted) = self.list_own_groups(&stop).await else {
            return Ok(());
        };
        self.adopt(&adopted);
        loops.spawn("watch", self.clone().watch_pods(adopted, stop.clone()));
        loops.spawn("poll", self.clone().poll_statuses(listed_at, stop.clone()));
        loops.spawn("syncs", self.clone().sync_pods(stop.clone()));
        loops.spawn("status writes", self.clone().write_statuses(stop.clone()));
        loops.spawn("creators", self.clone().create_groups(stop.clone()));
        loops.spawn("annotators", self.clone().annotate_pods(stop.clone()));
        loops.spawn("deleters", self.clone().delete_all(stop.clone()));
        loops.spawn("removals", self.clone().watch_removals(stop.clone()));
        loops.spawn("requeues", self.clone().requeue_held(stop));
        let outcome = loops.join().await;
        self.finish_pod_tasks().await;
        outcome?;
        Ok(())
    }

    /// The loops that keep what pods are made of and who may run them current: token
    /// refreshes, volume sources, the Service cache, the tenancy policy, the write shares.
    fn spawn_feeds(&self, loops: &mut Supervisor, stop: &CancellationToken) {
        let inner = &self.inner;
        let (tokens, stop_tokens) = (inner.tokens.clone(), stop.clone());
        loops.spawn("tokens", async move {
            tokens.run(stop_tokens).await;
            Ok(())
        });
        if inner.config.args.volume_updates {
            let (tokens, client, stop) = (inner.tokens.clone(), inner.client.clone(), stop.clone());
            loops.spawn("volume sources", async move {
                crate::pods::sources::watch(client, tokens, stop).await;
                Ok(())
            });
        }
        let (services, client, stop_services) =
            (inner.services.clone(), inner.client.clone(), stop.clone());
        loops.spawn("services", async move {
            Ok(services.run(client, stop_services).await?)
        });
        let (tenancy, client, stop_tenancy) =
            (inner.tenancy.clone(), inner.client.clone(), stop.clone());
        loops.spawn("tenancy", async move {
            Ok(tenancy.run(client, stop_tenancy).await?)
        });
        let (this, stop_shares) = (self.clone(), stop.clone());
        loops.spawn("write shares", async move {
            let inner = &this.inner;
            inner.shares.follow(&inner.replicas, &stop_shares).await;
            Ok(())
        });
    }

    /// This node's groups as ECI lists them, retried until ECI answers; `None` after `stop`.
    async fn list_own_groups(&self, stop: &CancellationToken) -> Option<Vec<Adopted>> {
        let list = || async {
            let config = &self.inner.config;
            let mut adopted = Vec::new();
            self.visit_groups(None, |page| {
                adopted.extend(page.iter().filter_map(|group| {
                    Adopted::from_group(group, &config.site.cluster_name, &config.site.node_name)
                }));
            })
            .await
            .map(|()| adopted)
        };
        let listed = list
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(500))
                    .with_max_delay(Duration::from_secs(10))
                    .with_jitter()
                    .without_max_times(),
            )
            .notify(|error, wait| {
                warn!(%error, retry_in = ?wait, "cannot list this node's container groups yet");
            });
        tokio::select! {
            () = stop.cancelled() => None,
            adopted = listed => adopted.ok(),
        }
    }

    /// Tracks the groups listed at start-up by their pod's UID, and hands their tokens to the
    /// refresher.
    fn adopt(&self, adopted: &[Adopted]) {
        {
            let mut tracked = self.tracked();
            let now = SystemTime::now();
            for group in adopted {
                let entry = tracked.entry(group.uid.clone()).or_default();
                entry.on(&group.uid, Trigger::Adopted(&group.id));
                // The previous process published what happened before.
                entry.events = eci_events::EventWatermark::since(now);
            }
        }
        info!(
            groups = adopted.len(),
            "adopted this node's container groups"
        );
        self.inner.tokens.adopt(adopted.iter().filter_map(|g| {
            Some((
                g.uid.clone(),
                g.id.clone(),
                g.namespace.clone()?,
                g.name.clone()?,
            ))
        }));
    }

    /// Runs `work` as a task of this controller: a stop waits for it (up to
    /// [`IN_FLIGHT_GRACE`]), then abandons it.
    pub(super) fn spawn_pod_task(
        &self,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let abandon = self.inner.abandon.clone();
        self.inner.pod_tasks.spawn(async move {
            tokio::select! {
                () = abandon.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// After the loops stopped: lets per-pod work in flight (an ECI delete, a status write)
    /// finish within [`IN_FLIGHT_GRACE`], then abandons what is left and waits for it to end.
    async fn finish_pod_tasks(&self) {
        let tasks = &self.inner.pod_tasks;
        tasks.close();
        if tokio::time::timeout(IN_FLIGHT_GRACE, tasks.wait())
            .await
            .is_err()
        {
            warn!(
                left = tasks.len(),
                grace = ?IN_FLIGHT_GRACE,
                "per-pod work still running after the stop; leaving it to the successor"
            );
            self.inner.abandon.cancel();
            tasks.wait().await;
        }
    }

    /// Reads this node's pods from the replica's shared watch of them until `stop`. Every
    /// (re)list — at start, and whenever the watch could not resume (410 Gone after etcd
    /// compaction, an API server restart) — ends with [`PodController::settle_list`]: pods
    /// tracked but not listed were deleted while nobody watched, and their groups go. At start,
    /// "tracked" is the groups adopted from ECI.
    async fn watch_pods(
        self,
        adopted: Vec<Adopted>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let mut reader = PodReader {
            controller: self.clone(),
            unseen: adopted.into_iter().map(|g| (g.uid.clone(), g)).collect(),
            listed: HashSet::new(),
            relist: false,
            stop: stop.clone(),
        };
        self.inner
            .node_pods
            .subscribe(Box::new(move |event| reader.on(event)));
        stop.cancelled().await;
        Ok(())
    }

    fn observe(&self, pod: &Arc<Pod>) {
        self.observe_from(pod, false);
    }

    /// The watch delivers `pod` (`listed`: from a list, which shows the current state and
    /// follows no order with our writes; see [`Origin`]): the entry keeps it, unless it is
    /// older than our answer, and the pod's sync decides what it asks for.
    fn observe_from(&self, pod: &Arc<Pod>, listed: bool) {
        let Some(uid) = pod.uid() else { return };
        {
            let mut tracked = self.tracked();
            let entry = tracked.entry(uid.clone()).or_default();
            // An older copy than the answer kept would only make the next write conflict, and
            // it asks for nothing the kept copy does not.
            if entry.origin.deliver(slim::version_of(pod), listed) == Delivery::Older {
                return;
            }
            entry.adopt_carried(pod);
            entry.keep(pod);
            entry.origin = Origin::Watched;
        }
        // Labels and annotations shown in downward API files follow the pod, as the kubelet's.
        if pod.metadata.deletion_timestamp.is_none() {
            self.inner.tokens.pod_observed(pod);
        }
        self.inner.syncs.push(uid, ());
    }

    /// Queues every tracked pod's sync (after a full poll): a failed step may have left a pod
    /// that nothing else wakes. A pod removed meanwhile has no entry, and its sync does
    /// nothing.
    pub(super) fn resync(&self) {
        let tracked: Vec<String> = self.tracked().keys().cloned().collect();
        for uid in tracked {
            self.inner.syncs.push(uid, ());
        }
    }

    /// The sync workers: one pod at a time each. They never wait on the status writes (which
    /// wait their turn in the fleet's share): a burst's creations are decided as its pods come.
    pub(super) async fn sync_pods(self, stop: CancellationToken) -> anyhow::Result<()> {
        let this = self.clone();
        self.inner
            .syncs
            .serve(SYNC_WORKERS, &stop, move |uid, ()| {
                let this = this.clone();
                async move { this.sync(&uid).await }
            })
            .await;
        Ok(())
    }

    /// Brings pod `uid` in line with what is known of it, from what its entry holds: steps its
    /// lifecycle by the copy kept, carries out the step ([`Self::act`]), queues its status
    /// write when the status writers have work for it ([`Self::write_status_of`] decides what
    /// it writes), and queues it again for when something falls due. Everything else only
    /// queues the pod, so this is the one place its lifecycle moves by what the pod shows.
    /// The step reads the copy's [`slim::Glance`]; the copy is unpacked only for a step that
    /// acts (most do not: watch echoes, repeated polls, resyncs).
    pub(super) async fn sync(&self, uid: &str) {
        let Some(copy) = self.tracked().get(uid).and_then(|entry| entry.pod.clone()) else {
            return;
        };
        let glance = copy.glance();
        let Some(Stepped {
            effect,
            deadline,
            asks,
        }) = self.step(uid, &glance)
        else {
            return;
        };
        if !matches!(effect, None | Some(Effect::Nothing)) {
            // Unpacked outside the lock: the watch and the polls wait on it.
            let Some(pod) = copy.pod() else { return };
            let span = info_span!("reconcile", pod = %pod_key(&pod), uid = %uid);
            span.in_scope(|| self.act(&pod, uid, effect));
        }
        if asks.want_a_write(&glance) {
            self.inner.statuses.push(uid.to_owned(), ());
        }
        self.requeue(uid, deadline);
    }

    /// Moves the pod's lifecycle on by what its kept copy shows (`glance`): what to do, when
    /// its deadline is to be looked at (see [`deadline`]), and what the status writers would
    /// find. `None`: the pod is not tracked.
    fn step(&self, uid: &str, glance: &slim::Glance) -> Option<Stepped> {
        let observed = lifecycle::Observed {
            terminating: glance.terminating,
            finished: glance.finished(),
            unfit: glance.unfit,
            annotation: glance.instance_id.as_deref(),
        };
        let now = tokio::time::Instant::now();
        let mut tracked = self.tracked();
        let entry = tracked.get_mut(uid)?;
        let effect = entry.on(uid, Trigger::Observed(observed));
        let (effect, deadline) = self.mind_deadline(entry, uid, glance, effect);
        let asks = status_writes::Asks::of(entry, now, self.annotation_wait());
        Some(Stepped {
            effect,
            deadline,
            asks,
        })
    }

    /// Queues the pod's next sync for the earlier of `at` (its deadline, or a step to try
    /// again) and the end of its annotations' wait (see [`carried`]), or for a time asked
    /// before that is sooner still: the sync works out the next time again, and a time asked
    /// elsewhere (annotations queued) never puts a deadline off.
    fn requeue(&self, uid: &str, at: Option<SystemTime>) {
        let annotations = self.tracked().get(uid).and_then(|entry| {
            entry
                .carried
                .due_in(tokio::time::Instant::now(), self.annotation_wait())
        });
        let at = at.map(|at| at.duration_since(SystemTime::now()).unwrap_or_default());
        if let Some(after) = annotations.into_iter().chain(at).min() {
            self.inner.syncs.push_by(uid.to_owned(), (), after);
        }
    }

    /// Carries out what a lifecycle step decided for `pod`: queues the work that waits on ECI
    /// or on a budget of its own (creations, instance ids, deletions) and what the pod is to
    /// show ([`notice`]).
    fn act(&self, pod: &Arc<Pod>, uid: &str, effect: Option<Effect>) {
        match effect {
            None | Some(Effect::Nothing) => {}
            Some(Effect::Create) => {
                self.inner
                    .creations
                    .push(uid.to_owned(), CreateJob::fresh());
            }
            Some(Effect::Annotate(id)) => {
                if let Some(shown) = pod.annotations().get(INSTANCE_ANNOTATION) {
                    warn!(shown, eci_id = %id, "the pod's instance-id annotation was changed; writing the pod's own group back");
                }
                let record = (pod_key_parts(pod), WriteBack::new(&id, ""));
                self.inner.annotations.push(uid.to_owned(), record);
            }
            // The group as known now: the pod's removal may reach `forget` before the deletion
            // runs, and it leaves the group to this deletion.
            Some(Effect::Delete(group)) => {
                let target = delete::DeletionTarget::of(pod);
                let deletion = delete::Deletion::of_pod(target, group.map(String::from));
                self.queue_deletion(delete::DeletionKey::Pod(uid.to_owned()), deletion);
            }
            Some(Effect::Skip(reason)) => self.explain_skip(pod, reason),
            Some(Effect::ShowLost(group)) => self.show_lost(pod, &group),
            Some(Effect::DeleteGroup(id)) => self.delete_group_eventually(id.into()),
            Some(Effect::Stop(group)) => self.stop_at_deadline(pod, uid, group.map(String::from)),
        }
    }
}

/// What a pod's step decided ([`PodController::step`]).
struct Stepped {
    /// What to do.
    effect: Option<Effect>,
    /// When its deadline is to be looked at.
    deadline: Option<SystemTime>,
    /// What the status writers would find.
    asks: status_writes::Asks,
}

enum Failure {
    Retry(String),
    Permanent(String),
    /// A pod annotation's value is malformed (the message names it): never created.
    InvalidAnnotation(String),
    /// ECI refuses the daemon's configuration: not the pod's fault; it waits.
    Misconfigured(crate::eci::misconfig::Misconfiguration),
    /// ECI refuses a parameter the pod chose: the pod's alone; it waits and is retried.
    Refused(misconfigured::PodRefusal),
    /// No zone of the pod's vSwitches has stock (ECI's message): its fail strategy decides.
    NoStock(String),
    /// ConfigMaps, Secrets or keys the pod needs do not exist (yet): it waits and is retried.
    Absent(Vec<vne_core::refs::Absent>),
    /// A cloud disk the pod mounts is attached to another group (ECI's message): it waits
    /// until that group is deleted, retried.
    DiskInUse(String),
    /// A setting of `container` cannot be resolved as the pod stands (a `subPathExpr`'s
    /// variables): it waits, shown as the kubelet's `CreateContainerConfigError`, and is
    /// retried.
    ContainerConfig {
        container: String,
        message: String,
    },
}

impl Failure {
    fn message(&self) -> String {
        match self {
            Self::Retry(message)
            | Self::Permanent(message)
            | Self::InvalidAnnotation(message)
            | Self::NoStock(message)
            | Self::DiskInUse(message)
            | Self::ContainerConfig { message, .. } => message.clone(),
            Self::Misconfigured(found) => found.describe(),
            Self::Refused(refusal) => refusal.describe(),
            Self::Absent(absent) => absent_message(absent),
        }
    }
}

/// What a pod waiting for references is told: each missing one.
fn absent_message(absent: &[vne_core::refs::Absent]) -> String {
    let each: Vec<String> = absent.iter().map(ToString::to_string).collect();
    format!("{}; the pod waits for them and is retried", each.join("; "))
}

/// The fingerprint of the part of the pod's status this daemon writes, as the pod shows it
/// (compared with the fingerprint of what was last written).
fn shown(pod: &Pod) -> Option<u64> {
    let status = serde_json::to_value(pod.status.as_ref()?).ok()?;
    Some(from_eci::fingerprint(&from_eci::owned(&status)))
}

/// An in-process hash (never persisted).
fn hash_of<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher as _;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The administrators' settings of the namespace scope and annotation policy. A scope that
/// does not parse (the configuration checks it first) selects no namespace: closed, not open.
fn tenancy_settings(config: &WithSite<PodsArgs>) -> crate::pods::tenancy::Settings {
    use vne_core::tenancy::Written;
    let given = |flag: &Option<String>| flag.clone().filter(|text| !text.trim().is_empty());
    let scope = given(&config.args.namespace_selector)
        .map(|text| Written::parse(&text).unwrap_or_else(|_| Written::nobody()));
    let policy = given(&config.args.annotation_policy_configmap)
        .map(|name| (config.site.pod_namespace.clone(), name));
    crate::pods::tenancy::Settings { scope, policy }
}

/// Pods that must not become container groups, and why.
fn not_for_virtual_nodes(pod: &Pod) -> Option<&'static str> {
    if pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror")
    {
        return Some("static (mirror) pods belong to a kubelet and do not run on virtual nodes");
    }
    let daemon_set = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    daemon_set.then_some("DaemonSet pods do not run on virtual nodes: each virtual node is a pool of ECI instances, not a machine to put an agent on")
}

/// The API accesses of the pod controller (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch", "patch", "delete"],
        why: "watch this node's pods, annotate them, remove them once their group is gone",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "pods/status",
        verbs: &["patch"],
        why: "report the ECI status on the pod",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch"],
        why: "ConfigMaps a pod references, read when it is created; their metadata watched to keep running pods' volumes current",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "secrets",
        verbs: &["get", "list", "watch"],
        why: "Secrets a pod references (env, volumes, image pull secrets), read when it is created; their metadata watched to keep running pods' volumes current",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get"],
        why: "PersistentVolumeClaims a pod mounts, read when it is created",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "persistentvolumes",
        verbs: &["get"],
        why: "the PersistentVolume each claim a pod mounts is bound to, read when it is created",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "serviceaccounts/token",
        verbs: &["create"],
        why: "service account tokens for projected volumes",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "namespaces",
        verbs: &["list", "watch"],
        why: "namespace labels, judged by --namespace-selector and the annotation policy (only watched when one is set)",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::OwnNamespace,
        group: "",
        resource: "configmaps",
        verbs: &["list", "watch"],
        why: "the annotation policy ConfigMap (--annotation-policy-configmap), one object watched",
    },
];

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    #[test]
    fn retries_wait_twice_as_long_each_time_up_to_twenty_seconds_with_jitter() {
        for attempt in 0..40 {
            let floor = Duration::from_millis(200)
                .saturating_mul(1 << attempt.min(8))
                .min(Duration::from_secs(20));
            let delay = backoff(attempt);
            assert!(
                delay >= floor && delay <= floor * 2,
                "attempt {attempt}: {delay:?}, floor {floor:?}"
            );
        }
    }

    use eci_proto::v20180808::*;
    use serde_json::json;

    use super::*;
    use crate::eci::EciBackend;

    /// An ECI whose DeleteContainerGroup answers ServiceUnavailable until it recovers; every
    /// other call answers nothing (no group listed).
    #[derive(Debug, Default)]
    pub(super) struct RefusingDeletes {
        recovered: AtomicBool,
        refused: AtomicUsize,
        deleted: Mutex<Vec<String>>,
    }

    fn unexpected<T>() -> Result<T, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }

    #[async_trait::async_trait]
    impl EciBackend for RefusingDeletes {
        async fn create_container_group(
            &self,
            _: CreateContainerGroupRequest,
        ) -> Result<CreateContainerGroupResponse, EciError> {
            unexpected()
        }
        async fn describe_container_groups(
            &self,
            _: DescribeContainerGroupsRequest,
        ) -> Result<DescribeContainerGroupsResponse, EciError> {
            Ok(DescribeContainerGroupsResponse::default())
        }
        async fn describe_container_group_status(
            &self,
            _: DescribeContainerGroupStatusRequest,
        ) -> Result<DescribeContainerGroupStatusResponse, EciError> {
            Ok(DescribeContainerGroupStatusResponse::default())
        }
        async fn delete_container_group(
            &self,
            request: DeleteContainerGroupRequest,
        ) -> Result<DeleteContainerGroupResponse, EciError> {
            if !self.recovered.load(Ordering::SeqCst) {
                self.refused.fetch_add(1, Ordering::SeqCst);
                return Err(EciError::new("ServiceUnavailable", "try later"));
            }
            self.deleted.lock().push(request.container_group_id);
            Ok(DeleteContainerGroupResponse::default())
        }
        async fn update_container_group(
            &self,
            _: UpdateContainerGroupRequest,
        ) -> Result<UpdateContainerGroupResponse, EciError> {
            unexpected()
        }
        async fn restart_container_group(
            &self,
            _: RestartContainerGroupRequest,
        ) -> Result<RestartContainerGroupResponse, EciError> {
            unexpected()
        }
        async fn describe_container_log(
            &self,
            _: DescribeContainerLogRequest,
        ) -> Result<DescribeContainerLogResponse, EciError> {
            unexpected()
        }
        async fn exec_container_command(
            &self,
            _: ExecContainerCommandRequest,
        ) -> Result<ExecContainerCommandResponse, EciError> {
            unexpected()
        }
        async fn describe_container_group_metric(
            &self,
            _: DescribeContainerGroupMetricRequest,
        ) -> Result<DescribeContainerGroupMetricResponse, EciError> {
            unexpected()
        }
        async fn describe_multi_container_group_metric(
            &self,
            _: DescribeMultiContainerGroupMetricRequest,
        ) -> Result<DescribeMultiContainerGroupMetricResponse, EciError> {
            unexpected()
        }
    }

    /// A controller over `eci` and an API server that answers every request with success,
    /// recording `METHOD path` of each.
    pub(super) fn controller(
        eci: Arc<RefusingDeletes>,
    ) -> (PodController, Arc<Mutex<Vec<String>>>) {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            seen.lock()
                .push(format!("{} {}", request.method(), request.uri().path()));
            async move {
                let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .status(200)
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        (
            controller_over(eci, kube::Client::new(service, "default")),
            requests,
        )
    }

    /// A controller of node `vn-0` over `eci` and the API server behind `client`.
    pub(super) fn controller_over(
        eci: Arc<RefusingDeletes>,
        client: kube::Client,
    ) -> PodController {
        use clap::Parser as _;
        let settings = crate::config::Config::parse_from([
            "virtual-node-eci",
            "--node-name=vn-0",
            "--cluster-name=c",
            "--region=cn-test",
            "--vswitch=vsw",
            "--security-group=sg",
            "--kube-proxy=false",
            "--volume-updates=false",
            "--max-concurrent-creates=1",
            "--eci=grpc://127.0.0.1:9",
            "--eci-allow-insecure-endpoint",
        ])
        .settings()
        .unwrap();
        let config = settings.with_site(&settings.config.pods);
        PodController::new(
            config,
            client,
            eci,
            Arc::new(Telemetry::new()),
            SharedWatch::new("test pod"),
            watch::channel(1).1,
        )
    }

    pub(super) fn terminating_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-0", "namespace": "default", "uid": "u-1",
                "deletionTimestamp": "2026-11-21T03:00:00Z", "deletionGracePeriodSeconds": 1,
            },
            "spec": {"nodeName": "vn-0", "containers": [{"name": "app", "image": "nginx:1.27"}]},
        }))
        .unwrap()
    }

    fn track(controller: &PodController, deleting: bool) {
        let lifecycle = if deleting {
            Lifecycle::Deleting {
                group: Some("eci-1".into()),
            }
        } else {
            Lifecycle::Created {
                group: "eci-1".into(),
                annotated: true,
            }
        };
        controller.tracked().insert(
            "u-1".into(),
            PodEntry {
                lifecycle,
                ..PodEntry::default()
            },
        );
    }

    fn running_pod() -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1"},
                "spec": {"nodeName": "vn-0", "containers": [{"name": "app", "image": "nginx:1.27"}]},
                "status": {"phase": "Running"},
            }))
            .unwrap(),
        )
    }

    /// Runs every sync ready, then every status write they queued, as the workers would.
    pub(super) async fn sync_all(controller: &PodController) {
        let inner = &controller.inner;
        while let Some((uid, ())) = inner.syncs.try_next() {
            controller.sync(&uid).await;
            inner.syncs.done(&uid);
        }
        while let Some((uid, ())) = inner.statuses.try_next() {
            controller.write_status_of(&uid).await;
            inner.statuses.done(&uid);
        }
    }

    fn status_writes(requests: &Mutex<Vec<String>>) -> usize {
        let writes = requests.lock();
        writes.iter().filter(|r| r.ends_with("/status")).count()
    }

    /// A resync (after a full poll) queues the sync of each tracked pod, which works from the
    /// copy its entry holds at that moment: a pod the watch removed is not brought back (else
    /// it is counted, and a stale copy driven, forever), and the copy is neither replaced nor
    /// packed again (that would cost a serialisation and an allocation per tracked pod on
    /// every full poll).
    #[tokio::test]
    async fn a_resync_syncs_what_the_entries_hold_and_brings_nothing_back() {
        let (controller, _) = controller(Arc::new(RefusingDeletes::default()));
        track(&controller, false);
        let pod = running_pod();
        controller.tracked().get_mut("u-1").unwrap().keep(&pod);
        let before = controller.tracked()["u-1"].pod.clone().unwrap();
        assert!(before.is_slim(), "a pod with a group is kept packed");
        controller.resync();
        assert_eq!(controller.inner.syncs.len(), 1);
        sync_all(&controller).await;
        let after = controller.tracked()["u-1"].pod.clone().unwrap();
        assert!(
            after.same_copy(&before),
            "neither replaced nor packed again"
        );

        controller.forget(&pod);
        controller.resync();
        sync_all(&controller).await;
        assert!(
            !controller.tracked().contains_key("u-1"),
            "a removed pod is not tracked again"
        );
    }

    /// After a restart the first poll can find an adopted group before the watch lists its pod:
    /// the state waits in the entry, and the sync the pod's first copy queues applies it.
    #[tokio::test]
    async fn a_state_polled_before_its_pods_first_copy_is_synced_when_the_copy_comes() {
        let (controller, requests) = controller(Arc::new(RefusingDeletes::default()));
        controller
            .tracked()
            .entry("u-1".into())
            .or_default()
            .on("u-1", lifecycle::Trigger::Adopted("eci-1"));
        let mut polled = group("Running", true);
        polled.tags = vec![Tag {
            key: naming::TAG_POD_UID.into(),
            value: "u-1".into(),
        }];
        controller.queue_changed(vec![polled]);
        sync_all(&controller).await;
        assert_eq!(status_writes(&requests), 0, "no pod to write to yet");
        controller.observe(&running_pod());
        sync_all(&controller).await;
        assert_eq!(status_writes(&requests), 1, "the pod's copy queues it");
    }

    /// Runs every sync ready, then every status write they queued: how many they queued.
    async fn status_writes_queued(controller: &PodController) -> usize {
        let inner = &controller.inner;
        while let Some((uid, ())) = inner.syncs.try_next() {
            controller.sync(&uid).await;
            inner.syncs.done(&uid);
        }
        let queued = inner.statuses.len();
        sync_all(controller).await;
        queued
    }

    /// A sync queues a status write only for work the status writers have: not for a pod
    /// showing what was written last (the echo of our own write, a resync), but for a pod
    /// someone wrote over and for a group state polled.
    #[tokio::test]
    async fn a_sync_queues_a_status_write_only_for_work_the_writers_have() {
        let (controller, requests) = controller(Arc::new(RefusingDeletes::default()));
        track(&controller, false);
        let pod = running_pod();
        controller.observe(&pod);
        controller.tracked().get_mut("u-1").unwrap().written = shown(&pod);
        assert_eq!(status_writes_queued(&controller).await, 0, "it shows ours");
        controller.resync();
        assert_eq!(status_writes_queued(&controller).await, 0, "nothing new");

        let mut written_over = (*pod).clone();
        written_over.status.as_mut().unwrap().phase = Some("Pending".into());
        written_over.metadata.resource_version = Some("7".into());
        controller.observe(&Arc::new(written_over));
        assert_eq!(status_writes_queued(&controller).await, 1, "written over");
        assert_eq!(status_writes(&requests), 0, "no state to write back yet");

        let mut polled = group("Running", true);
        polled.tags = vec![Tag {
            key: naming::TAG_POD_UID.into(),
            value: "u-1".into(),
        }];
        controller.queue_changed(vec![polled]);
        assert_eq!(
            status_writes_queued(&controller).await,
            1,
            "a state to apply"
        );
        assert_eq!(status_writes(&requests), 1);
    }

    /// A pod that does not run on virtual nodes (here a DaemonSet's) is told so by its sync:
    /// one status write, nothing queued for creation, and nothing more for it however often it
    /// is synced.
    #[tokio::test]
    async fn a_pod_not_for_virtual_nodes_is_told_so_once_by_its_sync() {
        let (controller, requests) = controller(Arc::new(RefusingDeletes::default()));
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "agent-0", "namespace": "default", "uid": "u-1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "agent", "uid": "ds-1"}]},
            "spec": {"nodeName": "vn-0", "containers": [{"name": "app", "image": "nginx:1.27"}]},
        }))
        .unwrap();
        controller.observe(&Arc::new(pod));
        sync_all(&controller).await;
        controller.resync();
        sync_all(&controller).await;
        let written: Vec<String> = requests.lock().clone();
        let status = "PATCH /api/v1/namespaces/default/pods/agent-0/status";
        assert_eq!(
            written.iter().filter(|r| *r == status).count(),
            1,
            "{written:?}"
        );
        assert!(controller.inner.creations.is_empty());
        assert_eq!(controller.tracked()["u-1"].lifecycle, Lifecycle::GivenUp);
    }

    /// A write's answer is newer than the copy the write was computed from, and nothing else:
    /// a copy the watch stored while the write was in flight is at least as new (any other
    /// write in between would have failed the write's precondition). It must stay, or a
    /// status someone wrote over ours right after would be hidden behind our older answer.
    #[test]
    fn an_answer_replaces_only_the_copy_its_write_was_computed_from() {
        let pending = served(&json!({"phase": "Pending"}));
        let v = |s: &str| slim::version_of(&at_version(&pending, s));
        let mut entry = PodEntry::default();
        entry.keep(&at_version(&pending, "10"));
        entry.keep_answer(&at_version(&pending, "12"), v("10"));
        assert_eq!(entry.pod.as_ref().unwrap().version(), v("12"));
        assert_eq!(entry.origin, Origin::Answered(v("12")));

        let mut entry = PodEntry::default();
        entry.keep(&at_version(&pending, "10"));
        // The watch delivered a newer copy while the write was in flight.
        entry.keep(&at_version(&pending, "13"));
        entry.keep_answer(&at_version(&pending, "12"), v("10"));
        assert_eq!(
            entry.pod.as_ref().unwrap().version(),
            v("13"),
            "the watch's stays"
        );
        assert_eq!(entry.origin, Origin::Watched);
    }

    #[test]
    fn a_tracked_pod_costs_no_more_than_it_must() {
        // One `PodEntry` per pod of the node, so its size is memory per pod and a field must
        // earn its bytes: the lifecycle enum keeps the group as a boxed str; the group's
        // state seen is what lets the sync read what is rather than be handed it (the state
        // waiting for the sync lived in a queue before, at the same cost); the kept copy's
        // version and origin save a conflict, a read and up to two writes per pod; the
        // annotations the status applies carry save a pod write per pod, and when they were
        // queued lets their own write be queued for when it falls due rather than looked for
        // by every poll; the notice (a pointer) is what lets the status writers be the one
        // writer of pod status; the packed copy's glance is what lets a sync that acts on
        // nothing skip unpacking it. The bound makes growing it a choice.
        assert!(
            std::mem::size_of::<PodEntry>() <= 296,
            "{}",
            std::mem::size_of::<PodEntry>()
        );
    }

    #[test]
    fn only_groups_tagged_with_this_cluster_and_node_are_adopted() {
        let group = |cluster: &str, node: &str| ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            tags: [
                (naming::TAG_CLUSTER, cluster),
                (naming::TAG_NODE, node),
                (naming::TAG_POD_UID, "u-1"),
            ]
            .into_iter()
            .map(|(key, value)| Tag {
                key: key.into(),
                value: value.into(),
            })
            .collect(),
            ..ContainerGroupStatus::default()
        };
        assert!(Adopted::from_group(&group("c", "vn-0"), "c", "vn-0").is_some());
        // Another cluster with the same StatefulSet node names, on the same account.
        assert!(Adopted::from_group(&group("other", "vn-0"), "c", "vn-0").is_none());
        assert!(Adopted::from_group(&group("c", "vn-1"), "c", "vn-0").is_none());
    }

    /// Runs `controller`'s deletion workers and removal watch until the token is cancelled.
    fn serve_deletions(controller: &PodController) -> CancellationToken {
        let stop = CancellationToken::new();
        tokio::spawn(controller.clone().delete_all(stop.clone()));
        tokio::spawn(controller.clone().watch_removals(stop.clone()));
        stop
    }

    fn delete_pod(controller: &PodController) {
        let target = delete::DeletionTarget::of(&terminating_pod());
        let deletion = delete::Deletion::of_pod(target, Some("eci-1".into()));
        controller
            .inner
            .deletions
            .push(delete::DeletionKey::Pod("u-1".into()), deletion);
    }

    const POD_REMOVAL: &str = "DELETE /api/v1/namespaces/default/pods/web-0";

    #[tokio::test(start_paused = true)]
    async fn a_pod_whose_group_eci_will_not_delete_stays_until_it_does() {
        let eci = Arc::new(RefusingDeletes::default());
        let (controller, requests) = controller(Arc::clone(&eci));
        track(&controller, true);
        let stop = serve_deletions(&controller);
        delete_pod(&controller);
        // Ten minutes of refusals: far past the eight tries a pod removal gets.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(eci.refused.load(Ordering::SeqCst) > 16, "still trying");
        assert!(
            requests.lock().iter().all(|r| !r.starts_with("DELETE")),
            "the pod is not removed from under its group: {requests:?}"
        );
        assert_eq!(
            controller.inner.deletions.delayed_len(),
            1,
            "a timer, not a task"
        );
        // ECI deletes again: group, then pod.
        eci.recovered.store(true, Ordering::SeqCst);
        let removed = async {
            while !requests.lock().contains(&POD_REMOVAL.to_owned()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(120), removed)
            .await
            .expect("the pod is removed once ECI deletes its group");
        assert!(eci.deleted.lock().contains(&"eci-1".to_owned()));
        assert!(
            controller
                .tracked()
                .get("u-1")
                .is_some_and(|entry| entry.lifecycle.group().is_none()),
            "the lifecycle knows the group is gone"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_pods_group_is_deleted_in_the_background_until_eci_deletes_it() {
        let eci = Arc::new(RefusingDeletes::default());
        let (controller, _) = controller(Arc::clone(&eci));
        track(&controller, false);
        let stop = serve_deletions(&controller);
        let before = tokio::time::Instant::now();
        controller.forget(&terminating_pod());
        assert_eq!(
            before.elapsed(),
            Duration::ZERO,
            "the watch does not wait on ECI"
        );
        assert!(controller.tracked().is_empty());
        // Ten minutes of refusals: far past the eight tries a pod removal gets.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(eci.refused.load(Ordering::SeqCst) > 16, "still trying");
        assert!(eci.deleted.lock().is_empty());
        eci.recovered.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(*eci.deleted.lock(), ["eci-1"]);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_removed_while_its_deletion_runs_costs_one_delete() {
        // A grace period of 0: the watch shows the deletionTimestamp and then the removal, so
        // `forget` may run before or while the deletion does.
        let eci = Arc::new(RefusingDeletes::default());
        eci.recovered.store(true, Ordering::SeqCst);
        let (controller, requests) = controller(Arc::clone(&eci));
        track(&controller, true);
        let stop = serve_deletions(&controller);
        controller.forget(&terminating_pod());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            eci.deleted.lock().is_empty(),
            "the removal leaves the group to the deletion under way"
        );
        delete_pod(&controller);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            *eci.deleted.lock(),
            ["eci-1"],
            "one delete, by the deletion"
        );
        assert!(requests.lock().contains(&POD_REMOVAL.to_owned()));
        stop.cancel();
    }

    fn group(status: &str, ready: bool) -> ContainerGroupStatus {
        ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            status: status.into(),
            intranet_ip: "192.168.0.2".into(),
            creation_time: "2026-11-21T02:59:58Z".into(),
            containers: vec![ContainerInfo {
                name: "app".into(),
                ready,
                started: status == "Running",
                current_state: Some(ContainerState {
                    state: if status == "Running" {
                        "Running"
                    } else {
                        "Waiting"
                    }
                    .into(),
                    start_time: "2026-11-21T03:00:00Z".into(),
                    ..ContainerState::default()
                }),
                container_id: "app-id".into(),
                ..ContainerInfo::default()
            }],
            ..ContainerGroupStatus::default()
        }
    }

    /// The pod as the API server answers after `status` was applied: the fields of others
    /// (`qosClass`) and the `lastProbeTime: null` it adds to every condition included.
    fn served(status: &serde_json::Value) -> Pod {
        let mut status = status.clone();
        status["qosClass"] = json!("BestEffort");
        for c in status["conditions"].as_array_mut().into_iter().flatten() {
            c["lastProbeTime"] = serde_json::Value::Null;
        }
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1"},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_shows_what_was_written_until_someone_writes_over_it() {
        let base = served(&json!({"phase": "Pending"}));
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let running = from_eci::pod_status(&base, &group("Running", true), now);
        let written = from_eci::fingerprint(&running);
        assert_eq!(
            shown(&served(&running)),
            Some(written),
            "our own write, echoed"
        );
        // A late writer's older view (the group still starting) over ours.
        let stale = from_eci::pod_status(&base, &group("Pending", false), now);
        assert_ne!(shown(&served(&stale)), Some(written));
        // The node lifecycle controller's mark on a pod of a node it lost touch with.
        let mut marked = running;
        for c in marked["conditions"].as_array_mut().unwrap() {
            if c["type"] == "Ready" {
                c["status"] = json!("False");
            }
        }
        assert_ne!(shown(&served(&marked)), Some(written));
    }

    #[test]
    fn the_watch_is_behind_our_answer_until_it_delivers_the_answers_version() {
        use Delivery::{Keep, Older};
        // (where the kept copy came from, the version delivered, from a list) → what to do
        let table = [
            (Origin::Watched, 1, false, Keep),
            (Origin::Watched, 2, true, Keep),
            // The watch catching up: an event from before our write.
            (Origin::Answered(2), 1, false, Older),
            // Our write's own event: the watch has caught up.
            (Origin::Answered(2), 2, false, Keep),
            // A list shows the current state, in no order with our writes.
            (Origin::Answered(2), 1, true, Keep),
        ];
        for (origin, version, listed, expected) in table {
            assert_eq!(
                origin.deliver(version, listed),
                expected,
                "{origin:?} delivered {version} (listed: {listed})"
            );
        }
    }

    fn at_version(pod: &Pod, version: &str) -> Arc<Pod> {
        let mut pod = pod.clone();
        pod.metadata.resource_version = Some(version.into());
        Arc::new(pod)
    }

    /// Under load the watch delivers changes seconds after the writes that made them. An
    /// event older than our status write's answer (here the instance-id annotation's) must not
    /// replace that answer: the next status write would carry an outdated resourceVersion (a
    /// 409, a read, a second write), and the older status it shows would read as someone
    /// writing over ours (a third write).
    #[tokio::test]
    async fn a_copy_older_than_our_answer_neither_replaces_it_nor_reads_as_written_over() {
        let (controller, _) = controller(Arc::new(RefusingDeletes::default()));
        track(&controller, false);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pending = served(&json!({"phase": "Pending"}));
        let running = from_eci::pod_status(&pending, &group("Running", true), now);
        controller
            .tracked()
            .get_mut("u-1")
            .unwrap()
            .keep(&at_version(&pending, "10"));

        // Our status write is answered at version 12 and recorded.
        let written = from_eci::fingerprint(&running);
        let v10 = slim::version_of(&at_version(&pending, "10"));
        controller.remember("u-1", (*at_version(&served(&running), "12")).clone(), v10);
        controller.tracked().get_mut("u-1").unwrap().written = Some(written);
        let version = |c: &PodController| c.tracked()["u-1"].pod.as_ref().unwrap().version();
        let v = |s: &str| slim::version_of(&at_version(&pending, s));

        // The annotation's change (version 11) arrives late, still showing Pending.
        controller.observe(&at_version(&pending, "11"));
        assert_eq!(version(&controller), v("12"), "the answer stays");
        assert!(
            controller.inner.syncs.is_empty(),
            "an older copy is not someone writing over us"
        );

        // Our write's own event: the watch has caught up; what follows is newer.
        controller.observe(&at_version(&served(&running), "12"));
        assert_eq!(controller.tracked()["u-1"].origin, Origin::Watched);
        controller.observe(&at_version(&served(&running), "13"));
        assert_eq!(version(&controller), v("13"));

        // A write that changed nothing is answered at the version held: nothing to wait for.
        controller.remember(
            "u-1",
            (*at_version(&served(&running), "13")).clone(),
            v("13"),
        );
        assert_eq!(controller.tracked()["u-1"].origin, Origin::Watched);
    }

    #[test]
    fn a_kept_copy_leaves_the_managed_fields_behind() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1",
                "annotations": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                    "apiVersion": "v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:annotations": {"f:a": {}}}}}]},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
        }))
        .unwrap();
        let kept = kept_copy(&pod);
        assert!(kept.metadata.managed_fields.is_none());
        let mut expected = pod;
        expected.metadata.managed_fields = None;
        assert_eq!(*kept, expected, "everything else is kept");
    }
}
