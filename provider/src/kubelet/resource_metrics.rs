//! The kubelet's metrics endpoints: the daemon's own at `/metrics`; from ECI, `/metrics/resource` (what metrics-server scrapes
//! for `kubectl top` and the HPA) and `/stats/summary`. Merged by `kubelet::router`, behind its
//! authentication and authorization (`nodes/metrics`, `nodes/stats`).
//!
//! The figures come from `DescribeMultiContainerGroupMetric`, 20 groups a call (the API's
//! maximum), for the running pods of this node (a watch of `spec.nodeName`, started by the
//! first scrape so a node nobody scrapes costs nothing), each pod's group as the pod
//! controller records it ([`GroupDirectory`], never the pod's user-writable annotation). One refresh is served for
//! [`CACHE_TTL`] and concurrent scrapes share it (single flight), so a refresh costs one ECI
//! call per 20 running pods however many clients ask. What the figures are — each sample
//! stamped with the time ECI measured it, the node's sums with counters that never go back, the
//! two shapes they are served in — is `vne_core::kubelet_metrics`'s; this is its edge: the
//! routes, the calls to ECI, the cache and the clock.

mod index;
#[cfg(test)]
mod tests;

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use eci_proto::EciError;
use eci_proto::v20180808::{
    DescribeMultiContainerGroupMetricRequest, DescribeMultiContainerGroupMetricResponse,
};
use futures::StreamExt as _;
use jiff::Timestamp;
use tokio::time::Instant;
use tracing::{debug, warn};
use vne_core::kubelet_metrics::{
    NodeCounters, NodeSample, PodEntry, PodSample, TEXT_CONTENT_TYPE, batches, by_group, merge,
    pod_sample, resource_metrics, summary,
};

pub use self::index::{PodIndex, SharedIndex};
use super::KubeletState;
use crate::eci::Backend;
use crate::k8s::access::{Access, Scope};
use crate::ops::chain::Chain;
use crate::pods::GroupDirectory;

/// The Kubernetes API accesses the metrics make.
pub const KUBE_API: &[Access] = &[Access {
    scope: Scope::Cluster,
    group: "",
    resource: "pods",
    verbs: &["list", "watch"],
    why: "the kubelet API's metrics: this node's pods, their ECI groups and container start times",
}];

/// How long one refresh is served: half of metrics-server's shortest resolution (10 s), so
/// each of its scrapes gets a fresh read while bursts — several scrapers, `/metrics/resource`
/// and `/stats/summary` together, retries — share one.
pub const CACHE_TTL: Duration = Duration::from_secs(5);
/// Calls in flight at once during a refresh (the ECI edge paces them further): a refresh
/// takes one round trip per 400 pods, so even a node of thousands of pods is read well inside
/// metrics-server's scrape timeout.
const CONCURRENT_CALLS: usize = 20;
/// One call's bound: metrics-server gives a whole scrape 10 s by default.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a pod whose call failed is still shown with its previous (older) sample.
const STALE_LIMIT: Duration = Duration::from_secs(120);
/// How long the first scrape waits for the pod watch's first list.
const LIST_WAIT: Duration = Duration::from_secs(5);

/// The metrics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Which groups to ask for is unknown until the pod watch has listed this node's pods.
    #[error("this node's pods are not listed yet")]
    NotListed,
    /// A `DescribeMultiContainerGroupMetric` call failed.
    #[error("DescribeMultiContainerGroupMetric of {groups} group(s) failed")]
    Eci {
        /// Groups in the call.
        groups: usize,
        /// ECI's answer.
        #[source]
        source: EciError,
    },
    /// A call did not answer in time.
    #[error(
        "DescribeMultiContainerGroupMetric of {groups} group(s) did not answer within {timeout:?}"
    )]
    Timeout {
        /// Groups in the call.
        groups: usize,
        /// The bound.
        timeout: Duration,
    },
    /// The shared refresh task panicked or was cancelled.
    #[error("the metrics refresh ended abnormally")]
    Task(#[source] tokio::task::JoinError),
}

/// One refresh: every running pod's newest figures and the node's sums.
#[derive(Debug)]
pub struct Snapshot {
    /// When it was taken (its age decides when the next refresh is due).
    pub taken: Instant,
    /// The pods' samples, by namespace and name.
    pub pods: Vec<PodSample>,
    /// The node's figures.
    pub node: NodeSample,
    /// ECI calls made.
    pub calls: usize,
    /// Calls that failed (their pods show their previous sample for a while).
    pub failed_calls: usize,
    /// The first failure, with its causes, when a call failed.
    pub error: Option<String>,
}

impl Snapshot {
    /// Whether any ECI call of this refresh failed (the kubelet's `resource_scrape_error`).
    pub fn scrape_error(&self) -> bool {
        self.failed_calls > 0
    }
}

/// Reads the figures of the pods in an index from ECI, one refresh per [`CACHE_TTL`] shared by
/// every caller. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Scraper {
    inner: Arc<Inner>,
}

struct Inner {
    eci: Backend,
    region: String,
    ttl: Duration,
    index: Arc<SharedIndex>,
    /// Which group runs which pod.
    groups: GroupDirectory,
    /// The newest refresh.
    current: Mutex<Option<Arc<Snapshot>>>,
    /// Held by the one refresh under way (single flight).
    gate: Arc<tokio::sync::Mutex<()>>,
    /// The node's counters; changed only under `gate`.
    counters: Mutex<NodeCounters>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scraper")
            .field("region", &self.region)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Scraper {
    /// A scraper of the pods in `index`, run by the groups `groups` names, refreshing at most
    /// once per `ttl`.
    pub fn new(
        eci: Backend,
        region: String,
        index: Arc<SharedIndex>,
        groups: GroupDirectory,
        ttl: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                eci,
                region,
                ttl,
                index,
                groups,
                current: Mutex::new(None),
                gate: Arc::new(tokio::sync::Mutex::new(())),
                counters: Mutex::new(NodeCounters::default()),
            }),
        }
    }

    /// The current figures: the cached refresh while it is younger than the TTL, else a new
    /// one — started by the first caller and awaited by the others, and finished even when
    /// the caller that started it goes away.
    pub async fn snapshot(&self) -> Result<Arc<Snapshot>, MetricsError> {
        if let Some(fresh) = self.inner.fresh() {
            return Ok(fresh);
        }
        let gate = Arc::clone(&self.inner.gate).lock_owned().await;
        // Whoever held the gate before us may just have refreshed.
        if let Some(fresh) = self.inner.fresh() {
            return Ok(fresh);
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let _gate = gate;
            inner.refresh().await
        })
        .await
        .map_err(MetricsError::Task)?
    }
}

impl Inner {
    fn fresh(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .as_ref()
            .filter(|snapshot| snapshot.taken.elapsed() < self.ttl)
            .cloned()
    }

    async fn call(
        &self,
        ids: Vec<String>,
    ) -> Result<DescribeMultiContainerGroupMetricResponse, MetricsError> {
        let groups = ids.len();
        let request = DescribeMultiContainerGroupMetricRequest {
            region_id: self.region.clone(),
            container_group_ids: ids,
            // Per-container records: metrics-server reads containers, not groups.
            metric_type: "all".into(),
            resource_group_id: String::new(),
        };
        match tokio::time::timeout(
            CALL_TIMEOUT,
            self.eci.describe_multi_container_group_metric(request),
        )
        .await
        {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(source)) => Err(MetricsError::Eci { groups, source }),
            Err(_) => Err(MetricsError::Timeout {
                groups,
                timeout: CALL_TIMEOUT,
            }),
        }
    }

    async fn refresh(&self) -> Result<Arc<Snapshot>, MetricsError> {
        let started = Instant::now();
        if !self.index.read(PodIndex::listed) && !self.index.wait_listed(LIST_WAIT).await {
            return Err(MetricsError::NotListed);
        }
        let pods: HashMap<String, PodEntry> = self
            .index
            .read(|index| by_group(index.pods(), |uid| self.groups.group_of(uid)));
        let batches = batches(pods.keys().map(String::as_str));
        let calls = batches.len();
        let answers: Vec<(Vec<String>, Result<_, MetricsError>)> = futures::stream::iter(batches)
            .map(|ids| async move {
                let answer = self.call(ids.clone()).await;
                (ids, answer)
            })
            .buffer_unordered(CONCURRENT_CALLS)
            .collect()
            .await;
        let mut fresh = Vec::with_capacity(pods.len());
        let mut failed = HashSet::new();
        let mut failed_calls = 0;
        let mut first_error = None;
        for (ids, answer) in answers {
            match answer {
                Ok(response) => fresh.extend(response.monitor_datas.iter().filter_map(|data| {
                    let pod = pods.get(&data.container_group_id)?;
                    pod_sample(pod, &data.records)
                })),
                Err(error) => {
                    failed_calls += 1;
                    failed.extend(ids.iter().filter_map(|id| Some(pods.get(id)?.uid.as_str())));
                    first_error.get_or_insert(error);
                }
            }
        }
        let previous = self.current.lock().clone();
        let now = Timestamp::now();
        let samples = merge(
            fresh,
            &failed,
            previous.as_ref().map_or(&[][..], |p| &p.pods),
            |old| now.duration_since(old.at).unsigned_abs() < STALE_LIMIT,
        );
        let on_node: HashSet<String> = self
            .index
            .read(|index| index.pods().map(|p| p.uid.clone()).collect());
        let node = self
            .counters
            .lock()
            .update(&samples, |uid| on_node.contains(uid));
        let error = first_error.as_ref().map(|e| Chain(e).to_string());
        if let Some(error) = &first_error {
            warn!(
                calls,
                failed_calls,
                error = %Chain(error),
                "metrics: ECI calls failed; their pods show their previous figures"
            );
        }
        debug!(
            pods = samples.len(),
            calls,
            failed_calls,
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "metrics refreshed from ECI"
        );
        let snapshot = Arc::new(Snapshot {
            taken: Instant::now(),
            pods: samples,
            node,
            calls,
            failed_calls,
            error,
        });
        *self.current.lock() = Some(Arc::clone(&snapshot));
        Ok(snapshot)
    }
}

/// What the routes share: the scraper, started by the first request (which brings the
/// client, ECI and the configuration). Its index reads this node's shared pod watch from then
/// on; joining makes that watch list once more, for every reader.
#[derive(Debug, Default)]
struct Lazy {
    source: OnceLock<Source>,
}

#[derive(Debug)]
struct Source {
    scraper: Scraper,
    /// When this node's metrics began to be served (the summary's node `startTime`).
    started: Timestamp,
}

impl Lazy {
    fn source(&self, state: &KubeletState) -> &Source {
        self.source.get_or_init(|| {
            let index = Arc::new(SharedIndex::default());
            state.node_pods.subscribe(Arc::clone(&index).reader());
            Source {
                scraper: Scraper::new(
                    Arc::clone(&state.eci),
                    state.config.site.region.clone(),
                    index,
                    state.groups.clone(),
                    CACHE_TTL,
                ),
                started: Timestamp::now(),
            }
        })
    }
}

/// The metrics routes: `/metrics`, `/metrics/resource` and `/stats/summary`.
pub fn routes() -> Router<KubeletState> {
    let lazy = Arc::new(Lazy::default());
    let for_summary = Arc::clone(&lazy);
    Router::new()
        // A kubelet serves its own process's metrics here, and the daemon is this node's
        // kubelet: its own metrics (Kubernetes' e2e framework reads them after each failed
        // test, and waits minutes on a node that does not answer).
        .route(
            "/metrics",
            get(|State(state): State<KubeletState>| async move {
                (
                    [(header::CONTENT_TYPE, crate::ops::metrics::CONTENT_TYPE)],
                    state.telemetry.render(),
                )
                    .into_response()
            }),
        )
        .route(
            "/metrics/resource",
            get(move |State(state): State<KubeletState>| async move {
                resource(lazy.source(&state)).await
            }),
        )
        .route(
            "/stats/summary",
            get(
                move |State(state): State<KubeletState>, Query(query): Query<SummaryQuery>| async move {
                    stats_summary(for_summary.source(&state), &state.config.site.node_name, &query).await
                },
            ),
        )
}

async fn resource(source: &Source) -> Response {
    let text = match source.scraper.snapshot().await {
        Ok(snapshot) => resource_metrics(&snapshot.node, &snapshot.pods, snapshot.scrape_error()),
        Err(error) => {
            warn!(error = %Chain(&error), "metrics: cannot read this node's figures");
            // What the kubelet answers when its stats provider fails: only the error gauge.
            resource_metrics(&NodeSample::default(), &[], true)
        }
    };
    ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], text).into_response()
}

/// `/stats/summary`'s query.
#[derive(Debug, Default, serde::Deserialize)]
struct SummaryQuery {
    /// Only CPU and memory (what metrics-server asked for before `/metrics/resource`).
    #[serde(default)]
    only_cpu_and_memory: bool,
}

async fn stats_summary(source: &Source, node: &str, query: &SummaryQuery) -> Response {
    match source.scraper.snapshot().await {
        Ok(snapshot) if snapshot.calls > 0 && snapshot.failed_calls == snapshot.calls => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Internal Error: failed to get stats from ECI: {}\n",
                snapshot.error.as_deref().unwrap_or("every call failed")
            ),
        )
            .into_response(),
        Ok(snapshot) => axum::Json(summary(
            node,
            source.started,
            &snapshot.node,
            &snapshot.pods,
            query.only_cpu_and_memory,
        ))
        .into_response(),
        Err(error) => {
            warn!(error = %Chain(&error), "metrics: cannot read this node's figures");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("Internal Error: failed to get stats: {}\n", Chain(&error)),
            )
                .into_response()
        }
    }
}
