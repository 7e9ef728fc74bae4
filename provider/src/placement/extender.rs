//! The kube-scheduler extender (filter, prioritize, bind), served over HTTPS by the elected
//! replica. Filter keeps only the nodes of the unit the pod goes to; prioritize prefers earlier
//! units; bind re-checks the unit's cap atomically, marks the pod (unit labels and
//! annotations, deletion cost) and creates the Binding. Pods no policy selects pass filter and
//! prioritize untouched, and bind refuses them: the extender binds only the pods it places
//! (kube-scheduler, with the extender `ignorable`, then binds them itself).
//!
//! Every call is authenticated and authorized first ([`caller`]: kube-scheduler's client
//! certificate or a token of someone who may create `pods/binding` everywhere).
//!
//! The cap holds at filter time: kube-scheduler filters one pod at a time, and a pod the filter
//! places takes its place in the same critical section, so the next pod's filter counts it.
//! Bind re-checks (another scheduler, a restarted leader); note that with `ignorable: true`
//! kube-scheduler binds a pod itself when our bind refuses it, so the filter is the guard.
//!
//! The wire types are kube-scheduler's `extender/v1` (Go field names, no JSON tags); no
//! maintained Rust crate has them, so they are written here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::{debug, info};
use vne_core::placement::decide::{self, Destination};

use super::state::{Grant, PLACED_BY_ANNOTATION, PlacementIndex, PodEntry, PolicyEntry, Refusal};
use crate::ops::events::EventPublisher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::ops::metrics::MetricSet;

pub mod caller;

/// The path prefix the scheduler's `urlPrefix` names.
pub const PREFIX: &str = "/resourcepolicy";
/// The largest cluster Kubernetes supports, in nodes.
const MAX_NODES: usize = 5_000;
/// A generous Node as kube-scheduler sends it: it drops `managedFields` from its cache, so
/// what is left is dominated by `status.images` — at most 50 (the kubelet's default
/// `nodeStatusMaxImages`) of typically a tag and a digest (~200 bytes each: ~10 KiB) — plus
/// labels, annotations, conditions, addresses, capacity and nodeInfo (a few KiB).
const NODE_BYTES: usize = 16 * 1024;
/// The pod: no stored object exceeds etcd's default request limit of 1.5 MiB.
const POD_BYTES: usize = 1536 * 1024;
/// The largest request body taken. kube-scheduler's largest call is filter (or prioritize)
/// without `nodeCacheCapable`: `ExtenderArgs` with the pod and every candidate Node whole,
/// and with `percentageOfNodesToScore: 100` every node of a 5,000-node cluster can be a
/// candidate: 5,000 × 16 KiB + 1.5 MiB + some room for the envelope ≈ 80 MiB. With
/// `nodeCacheCapable: true` (what deploy/examples configure) the same call carries names
/// only, well under 1 MiB. Beyond it: 413.
pub const BODY_LIMIT: usize = MAX_NODES * NODE_BYTES + POD_BYTES + 64 * 1024;
/// kube-scheduler's best extender score.
const MAX_SCORE: i64 = 10;
/// How long filter and bind wait for a listing of nodes and pods under way: well within
/// kube-scheduler's extender `httpTimeout` (30 s by default).
const LISTING_WAIT: Duration = Duration::from_secs(10);

/// `ExtenderArgs`.
#[derive(Debug, Deserialize, Serialize, Default)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Option<Pod>,
    /// The candidate nodes, when the extender is not `nodeCacheCapable`.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// The candidate nodes' names (`nodeCacheCapable`).
    #[serde(rename = "NodeNames", alias = "nodenames", default)]
    pub node_names: Option<Vec<String>>,
}

/// A `NodeList` reduced to what is read of it.
#[derive(Debug, Deserialize, Serialize, Default)]
pub struct NodeList {
    /// The nodes.
    #[serde(default)]
    pub items: Vec<k8s_openapi::api::core::v1::Node>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Deserialize, Serialize, Default, PartialEq)]
pub struct FilterResult {
    /// The nodes that may take the pod.
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
    /// Nodes ruled out, with why (preemption may help).
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes ruled out that preemption cannot help.
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// A failure of the extender itself.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// `HostPriority`.
#[derive(Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct HostPriority {
    /// The node.
    #[serde(rename = "Host")]
    pub host: String,
    /// 0 to 10.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// `ExtenderBindingArgs`.
#[derive(Debug, Deserialize, Serialize, Default)]
pub struct BindingArgs {
    /// The pod's name.
    #[serde(rename = "PodName", alias = "podName")]
    pub pod_name: String,
    /// Its namespace.
    #[serde(rename = "PodNamespace", alias = "podNamespace")]
    pub pod_namespace: String,
    /// Its UID.
    #[serde(rename = "PodUID", alias = "podUID")]
    pub pod_uid: String,
    /// The node chosen.
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Deserialize, Serialize, Default, PartialEq, Eq)]
pub struct BindingResult {
    /// Why the bind failed (empty: bound).
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// A bind that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The pod could not be read.
    #[error("cannot read pod {pod}")]
    ReadPod {
        /// `namespace/name`.
        pod: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// The pod is gone or was replaced by another of the same name.
    #[error("pod {pod} with UID {uid} no longer exists")]
    Gone {
        /// `namespace/name`.
        pod: String,
        /// The UID bound for.
        uid: String,
    },
    /// No ResourcePolicy selects the pod: not the extender's to bind.
    #[error(
        "pod {pod} is matched by no ResourcePolicy; the extender binds only the pods it places"
    )]
    NoPolicy {
        /// `namespace/name`.
        pod: String,
    },
    /// The unit has no place left, or the node is in no unit.
    #[error("refused")]
    Refused(#[source] Refusal),
    /// Marking the pod for its unit failed.
    #[error("cannot mark pod {pod} for its unit")]
    Mark {
        /// `namespace/name`.
        pod: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// Creating the Binding failed.
    #[error("cannot bind pod {pod} to {node}")]
    Bind {
        /// `namespace/name`.
        pod: String,
        /// The node.
        node: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// The bind's task ended without an answer (it panicked or was cancelled).
    #[error("the bind of pod {pod} ended without an answer: {message}")]
    Task {
        /// `namespace/name`.
        pod: String,
        /// What ended it.
        message: String,
    },
}

/// Labels of ResourcePolicy placements.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    /// The policy (`namespace/name`).
    pub policy: String,
    /// The unit, 1-based.
    pub unit: String,
    /// `extender` (at bind) or `admission` (webhook-only placement).
    pub by: &'static str,
}

/// Labels of the scheduler extender's calls.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
}

/// A histogram constructor a `Family` can hold.
pub type HistogramMaker = fn() -> Histogram;

fn extender_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

/// ResourcePolicy placement's metrics: what the extender placed, refused, and how fast.
#[derive(Debug, Clone)]
pub struct PlacementMetrics {
    /// Pods placed by a ResourcePolicy, by policy, unit and how.
    pub placement_pods_placed: Family<PlacementLabels, Counter>,
    /// Binds refused because the unit filled up meanwhile (the scheduler retries the pod).
    pub placement_bind_refusals: Counter,
    /// Time to answer the scheduler extender, by verb.
    pub placement_extender_seconds: Family<VerbLabels, Histogram, HistogramMaker>,
}

impl MetricSet for PlacementMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            placement_pods_placed: Family::default(),
            placement_bind_refusals: Counter::default(),
            placement_extender_seconds: Family::new_with_constructor(extender_histogram),
        };
        registry.register(
            "placement_pods_placed",
            "Pods placed in a ResourcePolicy unit, by policy, unit (1-based) and how (extender at bind, admission without one)",
            metrics.placement_pods_placed.clone(),
        );
        registry.register(
            "placement_bind_refusals",
            "Scheduler binds refused because the ResourcePolicy unit reached its max meanwhile (the scheduler retries)",
            metrics.placement_bind_refusals.clone(),
        );
        registry.register(
            "placement_extender_seconds",
            "Time to answer kube-scheduler's extender calls, by verb",
            metrics.placement_extender_seconds.clone(),
        );
        metrics
    }
}

/// What the handlers share.
pub struct Extender {
    /// The index.
    pub index: Arc<PlacementIndex>,
    /// The API client (binds as the daemon).
    pub client: kube::Client,
    /// Placement's metrics.
    pub metrics: PlacementMetrics,
    /// Events on pods.
    pub events: EventPublisher,
    /// The binds under way (see the `bind` handler).
    pub binds: tokio_util::task::TaskTracker,
}

impl std::fmt::Debug for Extender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extender").finish_non_exhaustive()
    }
}

/// What any caller may hold on the extender's port: bodies as large as [`BODY_LIMIT`] (for
/// kube-scheduler without `nodeCacheCapable`), two at a time; `caller::guard` refuses an
/// unknown caller before its body is read, which frees its share at once.
pub fn limits() -> tls_serve::Limits {
    let body_bytes = BODY_LIMIT as u64;
    tls_serve::Limits {
        body_bytes,
        buffered_bytes: 2 * body_bytes,
        ..tls_serve::Limits::default()
    }
}

/// The routes under [`PREFIX`], each behind `callers` (who may call, how large a body).
pub fn router(extender: Arc<Extender>, callers: Arc<caller::CallerGuard>) -> Router {
    Router::new()
        .route(&format!("{PREFIX}/filter"), post(filter))
        .route(&format!("{PREFIX}/prioritize"), post(prioritize))
        .route(&format!("{PREFIX}/bind"), post(bind))
        // Without `nodeCacheCapable` every call carries whole Node objects: tens of MiB on a
        // large cluster, beyond axum's 2 MiB default. This holds a body sent without a length
        // to the limit; `caller::guard` refuses one declared too long before reading it.
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .route_layer(axum::middleware::from_fn_with_state(callers, caller::guard))
        .with_state(extender)
}

fn observe(metrics: &PlacementMetrics, verb: &'static str, started: Instant) {
    metrics
        .placement_extender_seconds
        .get_or_create(&VerbLabels { verb })
        .observe(started.elapsed().as_secs_f64());
}

fn candidate_names(args: &ExtenderArgs) -> Vec<String> {
    match (&args.node_names, &args.nodes) {
        (Some(names), _) => names.clone(),
        (None, Some(list)) => list
            .items
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect(),
        (None, None) => Vec::new(),
    }
}

/// Waits, bounded, for a listing of nodes and pods under way when `pod` has a policy (the
/// first policy just appeared, or this replica just started): counts taken before it would miss
/// pods, so a place would be refused and the pod left to the scheduler's back-off.
async fn settle(index: &PlacementIndex, pod: Option<&Pod>) {
    if index.is_listed() {
        return;
    }
    let has_policy = pod.is_some_and(|pod| {
        let entry = PodEntry::of(pod);
        index.policy_for(&entry.namespace, &entry.labels).is_some()
    });
    if has_policy {
        index.wait_listed(LISTING_WAIT).await;
    }
}

async fn filter(
    State(extender): State<Arc<Extender>>,
    axum::Json(args): axum::Json<ExtenderArgs>,
) -> axum::Json<FilterResult> {
    let started = Instant::now();
    settle(&extender.index, args.pod.as_ref()).await;
    let result = filter_nodes(&extender.index, &args, SystemTime::now());
    observe(&extender.metrics, "filter", started);
    axum::Json(result)
}

/// The filter's answer (pure but for the index).
pub fn filter_nodes(index: &PlacementIndex, args: &ExtenderArgs, now: SystemTime) -> FilterResult {
    let candidates = candidate_names(args);
    let pass = || FilterResult {
        node_names: Some(candidates.clone()),
        ..FilterResult::default()
    };
    let Some(pod) = &args.pod else {
        return pass();
    };
    let entry = PodEntry::of(pod);
    let Some(policy) = index.policy_for(&entry.namespace, &entry.labels) else {
        return pass();
    };
    let all_failed = |why: &str| -> BTreeMap<String, String> {
        candidates
            .iter()
            .map(|n| (n.clone(), why.to_owned()))
            .collect()
    };
    // The place is taken now, not at bind: see `choose_and_reserve`.
    let reserve_as = (!entry.uid.is_empty()).then_some(entry.uid.as_str());
    let (choice, members) =
        match index.choose_and_reserve(&policy, &entry, Some(&candidates), now, reserve_as) {
            Ok(chosen) => chosen,
            Err(refusal) => {
                return FilterResult {
                    node_names: Some(Vec::new()),
                    failed_and_unresolvable_nodes: all_failed(&refusal.to_string()),
                    ..FilterResult::default()
                };
            }
        };
    let spec = &policy.policy.spec;
    let explanation = decide::explain(spec, &choice);
    index.remember_explanation(&entry.uid, explanation.clone());
    let because = format!("ResourcePolicy {}: {explanation}", policy.key);
    match choice.destination {
        Destination::Place(unit) => {
            let keep = &members[unit];
            let failed = candidates
                .iter()
                .filter(|n| !keep.contains(n))
                .map(|n| (n.clone(), because.clone()))
                .collect();
            FilterResult {
                node_names: Some(keep.clone()),
                failed_nodes: failed,
                ..FilterResult::default()
            }
        }
        Destination::Wait { .. } => {
            debug!(pod = %entry.name, namespace = %entry.namespace, %explanation, "pod waits for its unit");
            FilterResult {
                node_names: Some(Vec::new()),
                failed_nodes: all_failed(&because),
                ..FilterResult::default()
            }
        }
        Destination::Nowhere => FilterResult {
            node_names: Some(Vec::new()),
            failed_nodes: all_failed(&because),
            ..FilterResult::default()
        },
    }
}

async fn prioritize(
    State(extender): State<Arc<Extender>>,
    axum::Json(args): axum::Json<ExtenderArgs>,
) -> axum::Json<Vec<HostPriority>> {
    let started = Instant::now();
    let result = prioritize_nodes(&extender.index, &args);
    observe(&extender.metrics, "prioritize", started);
    axum::Json(result)
}

/// Scores: the first unit 10, later units less, nodes in no unit 0.
pub fn prioritize_nodes(index: &PlacementIndex, args: &ExtenderArgs) -> Vec<HostPriority> {
    let candidates = candidate_names(args);
    let policy = args.pod.as_ref().and_then(|pod| {
        let entry = PodEntry::of(pod);
        index.policy_for(&entry.namespace, &entry.labels)
    });
    candidates
        .into_iter()
        .map(|host| {
            let score = policy
                .as_ref()
                .and_then(|policy| {
                    let spec = &policy.policy.spec;
                    let labels = index.node_labels(&host)?;
                    let unit = decide::unit_of_node(spec, &labels, index.vnodes())?;
                    let count = i64::try_from(spec.units.len()).ok()?.max(1);
                    let unit = i64::try_from(unit).ok()?;
                    Some(MAX_SCORE * (count - unit) / count)
                })
                .unwrap_or(0);
            HostPriority { host, score }
        })
        .collect()
}

async fn bind(
    State(extender): State<Arc<Extender>>,
    axum::Json(args): axum::Json<BindingArgs>,
) -> axum::Json<BindingResult> {
    let started = Instant::now();
    // The bind runs as a task of its own: kube-scheduler stops waiting at its extender timeout
    // and closes the connection, which drops this handler; a bind dropped half-way would leave
    // a binding made but not counted, or a reservation never released.
    let args = Arc::new(args);
    let running = {
        let (binder, args) = (Arc::clone(&extender), Arc::clone(&args));
        extender
            .binds
            .spawn(async move { binder.bind(&args).await })
    };
    let outcome = running.await.unwrap_or_else(|error| {
        Err(BindError::Task {
            pod: format!("{}/{}", args.pod_namespace, args.pod_name),
            message: error.to_string(),
        })
    });
    let result = match outcome {
        Ok(()) => BindingResult::default(),
        Err(error) => {
            let error = crate::ops::chain::Chain(&error).to_string();
            info!(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node, %error, "bind refused; the scheduler retries the pod");
            BindingResult { error }
        }
    };
    observe(&extender.metrics, "bind", started);
    axum::Json(result)
}

impl Extender {
    async fn bind(&self, args: &BindingArgs) -> Result<(), BindError> {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let pod = read_pod(&pods, args, &key).await?;
        let entry = PodEntry::of(&pod);
        let Some(policy) = self.index.policy_for(&entry.namespace, &entry.labels) else {
            return Err(BindError::NoPolicy { pod: key });
        };
        // The policy is known already: only the listing may still be under way.
        self.index.wait_listed(LISTING_WAIT).await;
        let placement = self
            .index
            .reserve_on_node(&policy, &entry, &args.node, &entry.uid)
            .map_err(|refusal| {
                if matches!(refusal, Refusal::Full { .. }) {
                    self.metrics.placement_bind_refusals.inc();
                }
                BindError::Refused(refusal)
            })?;
        if let Err(error) = self.mark_and_bind(&pods, args, &key, &placement).await {
            self.index.release(&entry.uid);
            return Err(error);
        }
        self.record_placement(args, &policy, &placement, &entry.uid);
        Ok(())
    }

    /// Writes the unit's labels and annotations on the pod, then binds it.
    async fn mark_and_bind(
        &self,
        pods: &Api<Pod>,
        args: &BindingArgs,
        key: &str,
        placement: &Grant,
    ) -> Result<(), BindError> {
        let mut annotations = placement.annotations.clone();
        annotations.insert(PLACED_BY_ANNOTATION.into(), "extender".into());
        let patch = json!({"metadata": {"labels": placement.labels, "annotations": annotations}});
        pods.patch(
            &args.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| BindError::Mark {
            pod: key.to_owned(),
            source,
        })?;
        self.create_binding(pods, args, key).await
    }

    /// A bound pod: counted, logged and told (an Event on the pod).
    fn record_placement(
        &self,
        args: &BindingArgs,
        policy: &PolicyEntry,
        placement: &Grant,
        uid: &str,
    ) {
        self.metrics
            .placement_pods_placed
            .get_or_create(&PlacementLabels {
                policy: policy.key.clone(),
                unit: (placement.unit + 1).to_string(),
                by: "extender",
            })
            .inc();
        let note = self.index.take_explanation(uid).unwrap_or_else(|| {
            format!(
                "placed in unit {} ({})",
                placement.unit + 1,
                placement.description
            )
        });
        info!(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node, policy = %policy.key, %note, "bound");
        self.events.publish_later(
            Event {
                type_: EventType::Normal,
                reason: "Placed".into(),
                note: Some(format!("ResourcePolicy {}: {note}", policy.key)),
                action: "Bind".into(),
                secondary: None,
            },
            ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(args.pod_namespace.clone()),
                name: Some(args.pod_name.clone()),
                uid: Some(uid.to_owned()),
                ..ObjectReference::default()
            },
        );
    }

    async fn create_binding(
        &self,
        pods: &Api<Pod>,
        args: &BindingArgs,
        key: &str,
    ) -> Result<(), BindError> {
        let binding: Binding = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": args.pod_uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }))
        .unwrap_or_default();
        pods.create_subresource::<_, serde_json::Value>(
            "binding",
            &args.pod_name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
        .map_err(|source| BindError::Bind {
            pod: key.to_owned(),
            node: args.node.clone(),
            source,
        })
    }
}

/// The pod to bind, read from the API: the index may lag the pod's creation, and the pod's
/// labels decide its policy. Gone when it is missing or another pod took its name.
async fn read_pod(pods: &Api<Pod>, args: &BindingArgs, key: &str) -> Result<Pod, BindError> {
    pods.get_opt(&args.pod_name)
        .await
        .map_err(|source| BindError::ReadPod {
            pod: key.to_owned(),
            source,
        })?
        .filter(|p| args.pod_uid.is_empty() || p.metadata.uid.as_deref() == Some(&args.pod_uid))
        .ok_or_else(|| BindError::Gone {
            pod: key.to_owned(),
            uid: args.pod_uid.clone(),
        })
}

#[cfg(test)]
mod tests;
