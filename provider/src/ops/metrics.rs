//! Prometheus metrics of the daemon.

use parking_lot::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The media type of what [`Telemetry::render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of a result counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or a short error class.
    pub result: String,
}

/// Labels of ECI calls.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EciLabels {
    /// The action.
    pub action: &'static str,
    /// `ok` or the ECI error code.
    pub result: String,
}

/// Labels of the pods gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// Pod phase.
    pub phase: String,
}

/// Labels of Kubernetes API requests.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeLabels {
    /// e.g. `lease_renew`, `node_status_patch`.
    pub operation: &'static str,
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

/// The daemon's metrics.
#[derive(Debug)]
pub struct Telemetry {
    registry: Mutex<Registry>,
    /// 1 while ECI answers.
    pub eci_reachable: Gauge,
    /// 1 while the node reports Ready=True.
    pub node_ready: Gauge,
    /// ECI probes by result.
    pub eci_probes: Family<ResultLabels, Counter>,
    /// Lease renewals by result.
    pub lease_renewals: Family<ResultLabels, Counter>,
    /// Requests to the Kubernetes API by operation.
    pub kube_requests: Family<KubeLabels, Counter>,
    /// ECI calls by action and result.
    pub eci_calls: Family<EciLabels, Counter>,
    /// Pods of this node by phase.
    pub pods: Family<PhaseLabels, Gauge>,
    /// Pod seen → ECI accepted its group.
    pub pod_create_seconds: Histogram,
    /// ECI status change → pod status written.
    pub pod_status_propagation_seconds: Histogram,
    /// Creation attempts that had to be retried.
    pub pod_create_retries: Counter,
    /// Orphaned container groups (node and pod gone) deleted by the cluster-wide collector.
    pub orphan_groups_deleted: Counter,
    /// Pods found deleted when a (re)list of this node's pods completed: deleted while the
    /// watch was broken (410 Gone, an API server restart) or the daemon stopped.
    pub pods_deleted_during_watch_gap: Counter,
    /// Admission reviews by result (`patched`, `allowed`, `invalid`).
    pub admission_reviews: Family<ResultLabels, Counter>,
    /// Time to answer an admission review inside the daemon.
    pub admission_seconds: Histogram,
    /// Background events dropped because their queue was full.
    pub events_dropped: Counter,
    /// Background events queued and not yet being published.
    pub events_waiting: Gauge,
    /// Pods placed by a ResourcePolicy, by policy, unit and how.
    pub placement_pods_placed: Family<PlacementLabels, Counter>,
    /// Binds refused because the unit filled up meanwhile (the scheduler retries the pod).
    pub placement_bind_refusals: Counter,
    /// Time to answer the scheduler extender, by verb.
    pub placement_extender_seconds: Family<VerbLabels, Histogram, HistogramMaker>,
    /// Service account token refreshes by result (`ok`, `retry`, `failed`).
    pub token_refreshes: Family<ResultLabels, Counter>,
    /// Pods the last decommission drain was waiting for (0 when none ran or it emptied the node).
    pub drain_pods_left: Gauge,
    /// Finished decommission drains by result (`drained`, `timed_out`).
    pub drains: Family<ResultLabels, Counter>,
    /// Live replicas this one shares ECI's per-account quotas with (itself included).
    pub eci_quota_replicas: Gauge,
}

fn extender_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

/// Pod latencies: finer where the service levels are (200 ms to accept a pod, 2 s to show an
/// ECI change on it), so "how many pods within target" is a bucket, not an estimate.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0,
        5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

impl Telemetry {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("virtual_node_eci");
        let telemetry = Self {
            registry: Mutex::new(Registry::default()),
            eci_reachable: Gauge::default(),
            node_ready: Gauge::default(),
            eci_probes: Family::default(),
            lease_renewals: Family::default(),
            kube_requests: Family::default(),
            eci_calls: Family::default(),
            pods: Family::default(),
            pod_create_seconds: latency_histogram(),
            pod_status_propagation_seconds: latency_histogram(),
            pod_create_retries: Counter::default(),
            orphan_groups_deleted: Counter::default(),
            pods_deleted_during_watch_gap: Counter::default(),
            admission_reviews: Family::default(),
            admission_seconds: Histogram::new(exponential_buckets(0.000_05, 1.5, 28)),
            events_dropped: Counter::default(),
            events_waiting: Gauge::default(),
            placement_pods_placed: Family::default(),
            placement_bind_refusals: Counter::default(),
            placement_extender_seconds: Family::new_with_constructor(extender_histogram),
            token_refreshes: Family::default(),
            drain_pods_left: Gauge::default(),
            drains: Family::default(),
            eci_quota_replicas: Gauge::default(),
        };
        telemetry.eci_quota_replicas.set(1);
        telemetry.register_node_and_eci(&mut registry);
        telemetry.register_pods(&mut registry);
        telemetry.register_admission(&mut registry);
        telemetry.register_events(&mut registry);
        telemetry.register_placement(&mut registry);
        telemetry.register_lifecycle(&mut registry);
        *telemetry.registry.lock() = registry;
        telemetry
    }

    /// The node's health and the ECI account: reachability, lease, API calls and quota sharing.
    fn register_node_and_eci(&self, registry: &mut Registry) {
        registry.register(
            "eci_quota_replicas",
            "Live replicas sharing the account's ECI quotas (this one included): each paces every action to 1/N of its documented quota",
            self.eci_quota_replicas.clone(),
        );
        registry.register(
            "eci_reachable",
            "1 while the ECI API answers the periodic probe",
            self.eci_reachable.clone(),
        );
        registry.register(
            "node_ready",
            "1 while the virtual node reports Ready=True",
            self.node_ready.clone(),
        );
        registry.register(
            "eci_probes",
            "ECI reachability probes by result",
            self.eci_probes.clone(),
        );
        registry.register(
            "lease_renewals",
            "Node Lease renewals by result",
            self.lease_renewals.clone(),
        );
        registry.register(
            "kube_requests",
            "Requests to the Kubernetes API by operation",
            self.kube_requests.clone(),
        );
        registry.register(
            "eci_calls",
            "ECI calls by action and result (ok or the ECI error code)",
            self.eci_calls.clone(),
        );
    }

    /// The pods' lifecycle: phases, latencies, retries and clean-ups.
    fn register_pods(&self, registry: &mut Registry) {
        registry.register(
            "pods",
            "Pods bound to this node by phase",
            self.pods.clone(),
        );
        registry.register(
            "pod_create_seconds",
            "Time from seeing a pod to ECI accepting its container group",
            self.pod_create_seconds.clone(),
        );
        registry.register(
            "pod_status_propagation_seconds",
            "Time from an ECI status change to the pod status written",
            self.pod_status_propagation_seconds.clone(),
        );
        registry.register(
            "pod_create_retries",
            "Container group creations retried after a transient failure",
            self.pod_create_retries.clone(),
        );
        registry.register(
            "orphan_groups_deleted",
            "Container groups of this cluster deleted because their node and pod were both gone",
            self.orphan_groups_deleted.clone(),
        );
        registry.register(
            "pods_deleted_during_watch_gap",
            "Pods found deleted when a list of this node's pods completed (deleted while the watch was broken or the daemon stopped); their container groups were deleted",
            self.pods_deleted_during_watch_gap.clone(),
        );
    }

    /// The Selector admission webhook.
    fn register_admission(&self, registry: &mut Registry) {
        registry.register(
            "admission_reviews",
            "Admission reviews answered by the Selector webhook, by result",
            self.admission_reviews.clone(),
        );
        registry.register(
            "admission_seconds",
            "Time to answer an admission review inside the daemon",
            self.admission_seconds.clone(),
        );
    }

    /// The background Event queue.
    fn register_events(&self, registry: &mut Registry) {
        registry.register(
            "events_dropped",
            "Events not published because the background queue was full (they are best-effort)",
            self.events_dropped.clone(),
        );
        registry.register(
            "events_waiting",
            "Events queued for background publication and not yet sent (routine ones wait while pod writes do)",
            self.events_waiting.clone(),
        );
    }

    /// ResourcePolicy placement and the scheduler extender.
    fn register_placement(&self, registry: &mut Registry) {
        registry.register(
            "placement_pods_placed",
            "Pods placed in a ResourcePolicy unit, by policy, unit (1-based) and how (extender at bind, admission without one)",
            self.placement_pods_placed.clone(),
        );
        registry.register(
            "placement_bind_refusals",
            "Scheduler binds refused because the ResourcePolicy unit reached its max meanwhile (the scheduler retries)",
            self.placement_bind_refusals.clone(),
        );
        registry.register(
            "placement_extender_seconds",
            "Time to answer kube-scheduler's extender calls, by verb",
            self.placement_extender_seconds.clone(),
        );
    }

    /// Token refreshes and decommission drains.
    fn register_lifecycle(&self, registry: &mut Registry) {
        registry.register(
            "token_refreshes",
            "Service account token refreshes by result: ok, retry (failed, retried with back-off), failed (given up: the tokens expire in the group)",
            self.token_refreshes.clone(),
        );
        registry.register(
            "drain_pods_left",
            "Pods the last decommission drain of this node was waiting for: 0 when none ran or it emptied the node",
            self.drain_pods_left.clone(),
        );
        registry.register(
            "drains",
            "Finished decommission drains by result: drained, timed_out (the node stays cordoned with pods left)",
            self.drains.clone(),
        );
    }

    /// Counts one Kubernetes API request.
    pub fn kube_request(&self, operation: &'static str) {
        self.kube_requests
            .get_or_create(&KubeLabels { operation })
            .inc();
    }

    /// Counts one result of a result-labelled counter.
    pub fn count(family: &Family<ResultLabels, Counter>, result: &str) {
        family
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// The text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}
