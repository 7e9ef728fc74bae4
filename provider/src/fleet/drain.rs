//! Decommissioning a node on scale-in, the way `kubectl drain` would: cordon, evict through the
//! Eviction API (PodDisruptionBudgets honoured), wait until no pod is left — while the pod
//! controller keeps running, so evicted pods leave ECI gracefully — then delete the Lease and
//! the Node. Past the deadline it gives up, leaving the node cordoned and everything whose pod
//! still exists in place.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;
use tracing::{info, warn};

use super::FleetMetrics;
use crate::config::{FleetArgs, WithSite};
use crate::node::lease::LEASE_NAMESPACE;
use crate::node::shape::{self, DECOMMISSION_ANNOTATION};
use crate::ops::events::EventPublisher;
use crate::ops::metrics::{MetricSet as _, Telemetry};

/// How often the drain looks at what is left.
const ROUND: Duration = Duration::from_millis(500);
/// Longest wait between two eviction attempts of one pod a budget protects.
const MAX_EVICTION_BACKOFF: Duration = Duration::from_secs(15);
/// The first wait after a refused eviction (doubling from there).
const FIRST_EVICTION_BACKOFF: Duration = Duration::from_secs(1);
/// Evictions in flight at once.
const EVICTIONS_IN_FLIGHT: usize = 32;
/// How many names an Event or log line lists before it says "and N more".
const LISTED: usize = 10;

/// Decommissioning failed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// A call the decommission depends on failed.
    #[error("decommissioning node {node}: could not {action}")]
    Api {
        /// The node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// A pod to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a drain round has to do (pure, from the node's pods).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DrainPlan {
    /// Pods to evict now.
    pub evict: Vec<Target>,
    /// Pods already terminating: waited for.
    pub terminating: Vec<Target>,
    /// Pods no controller owns, kept (nothing would recreate them): waited for and reported.
    pub unmanaged: Vec<Target>,
    /// DaemonSet and mirror pods: never run here, do not hold the drain up.
    pub ignored: Vec<Target>,
}

impl DrainPlan {
    /// Pods still holding the node.
    pub fn left(&self) -> usize {
        self.evict.len() + self.terminating.len() + self.unmanaged.len()
    }

    /// The pods still holding the node, for messages.
    pub fn describe_left(&self) -> String {
        let mut parts = Vec::new();
        for (what, list) in [
            ("to evict", &self.evict),
            ("terminating", &self.terminating),
            ("without a controller", &self.unmanaged),
        ] {
            if !list.is_empty() {
                parts.push(format!("{} {what} ({})", list.len(), names(list)));
            }
        }
        parts.join("; ")
    }
}

fn names(targets: &[Target]) -> String {
    let mut text = targets
        .iter()
        .take(LISTED)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if targets.len() > LISTED {
        text += &format!(" and {} more", targets.len() - LISTED);
    }
    text
}

fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Sorts the node's pods the way `kubectl drain` does.
pub fn plan(pods: &[Pod], evict_unmanaged: bool) -> DrainPlan {
    let mut plan = DrainPlan::default();
    for pod in pods {
        let target = Target {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
        };
        let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
        let controller = owners.iter().find(|o| o.controller == Some(true));
        let mirror = pod
            .annotations()
            .contains_key("kubernetes.io/config.mirror");
        if mirror || controller.is_some_and(|o| o.kind == "DaemonSet") {
            plan.ignored.push(target);
        } else if pod.metadata.deletion_timestamp.is_some() {
            plan.terminating.push(target);
        } else if controller.is_none() && !evict_unmanaged && !is_finished(pod) {
            plan.unmanaged.push(target);
        } else {
            plan.evict.push(target);
        }
    }
    plan
}

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainEnd {
    /// No pod is left: the node can go.
    Drained,
    /// The deadline passed first; these pods are left.
    TimedOut {
        /// What was left, described.
        left: String,
    },
}

/// Per-pod eviction back-off after a refusal (a budget, or an error).
#[derive(Debug, Default)]
struct Refusals {
    by_pod: HashMap<String, (u32, Instant)>,
}

impl Refusals {
    fn may_try(&self, key: &str, now: Instant) -> bool {
        self.by_pod.get(key).is_none_or(|(_, next)| *next <= now)
    }

    /// Records a refusal; true on the first one (report it once, not every round).
    fn refused(&mut self, key: &str, now: Instant) -> bool {
        let entry = self.by_pod.entry(key.to_owned()).or_insert((0, now));
        entry.0 += 1;
        let wait = crate::ops::retry::nth(
            crate::ops::retry::doubling(FIRST_EVICTION_BACKOFF, MAX_EVICTION_BACKOFF),
            entry.0.saturating_sub(1),
        );
        entry.1 = now + wait;
        entry.0 == 1
    }
}

/// Drives one node's decommission.
pub struct Decommission {
    client: kube::Client,
    config: WithSite<FleetArgs>,
    telemetry: std::sync::Arc<Telemetry>,
    metrics: FleetMetrics,
    recorder: EventPublisher,
}

impl std::fmt::Debug for Decommission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decommission")
            .field("node", &self.config.site.node_name)
            .finish_non_exhaustive()
    }
}

impl Decommission {
    /// `client` should not retry `429` by itself: a budget's refusal must reach the drain
    /// loop, which reports it and backs off per pod.
    pub fn new(
        client: kube::Client,
        config: WithSite<FleetArgs>,
        telemetry: std::sync::Arc<Telemetry>,
    ) -> Self {
        let reporter = Reporter {
            controller: crate::k8s::FIELD_MANAGER.into(),
            instance: Some(config.site.node_name.clone()),
        };
        Self {
            recorder: EventPublisher::new(
                client.clone(),
                reporter,
                std::sync::Arc::clone(&telemetry),
            ),
            client,
            config,
            metrics: FleetMetrics::of(&telemetry),
            telemetry,
        }
    }

    fn api_error(&self, action: &'static str) -> impl Fn(kube::Error) -> DrainError + '_ {
        move |source| DrainError::Api {
            node: self.config.site.node_name.clone(),
            action,
            source,
        }
    }

    async fn node_event(&self, kind: EventType, reason: &str, note: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Ok(Some(node)) = nodes.get_opt(&self.config.site.node_name).await else {
            return;
        };
        self.publish(&node.object_ref(&()), kind, reason, note)
            .await;
    }

    async fn publish(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        kind: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_: kind,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Drain".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, reference).await {
            warn!(%error, reason, "could not publish an event");
        }
    }

    /// Cordons the node (unless someone already did), recording that the cordon is ours.
    async fn cordon(&self, why: &str) -> Result<(), DrainError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.telemetry.kube_request("node_get");
        let Some(current) = nodes
            .get_opt(&self.config.site.node_name)
            .await
            .map_err(self.api_error("read the node"))?
        else {
            return Ok(());
        };
        let cordoned = current
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if !cordoned {
            self.telemetry.kube_request("node_patch");
            nodes
                .patch(
                    &self.config.site.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "metadata": {"annotations": {DECOMMISSION_ANNOTATION: shape::rfc3339(std::time::SystemTime::now())}},
                        "spec": {"unschedulable": true},
                    })),
                )
                .await
                .map_err(self.api_error("cordon the node"))?;
        }
        info!(node = %self.config.site.node_name, already_cordoned = cordoned, %why, "decommissioning: node cordoned");
        self.publish(
            &current.object_ref(&()),
            EventType::Normal,
            "Decommissioning",
            &format!("{why}: node cordoned; draining its pods before removing it"),
        )
        .await;
        Ok(())
    }

    async fn node_pods(&self) -> Result<Vec<Pod>, kube::Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        self.telemetry.kube_request("pod_list");
        let params =
            ListParams::default().fields(&format!("spec.nodeName={}", self.config.site.node_name));
        Ok(pods.list(&params).await?.items)
    }

    /// Cordons and drains until no pod is left or the deadline passes.
    pub async fn drain(&self, why: &str) -> Result<DrainEnd, DrainError> {
        let started = Instant::now();
        let deadline = started + self.config.args.drain_timeout;
        self.cordon(why).await?;
        let mut refusals = Refusals::default();
        let mut reported_unmanaged = false;
        loop {
            let pods = match self.node_pods().await {
                Ok(pods) => pods,
                Err(error) if Instant::now() < deadline => {
                    warn!(%error, "cannot list the node's pods; retrying");
                    tokio::time::sleep(ROUND).await;
                    continue;
                }
                Err(error) => return Err(self.api_error("list the node's pods")(error)),
            };
            let plan = plan(&pods, self.config.args.drain_evict_unmanaged_pods);
            self.metrics
                .drain_pods_left
                .set(i64::try_from(plan.left()).unwrap_or(i64::MAX));
            if plan.left() == 0 {
                Telemetry::count(&self.metrics.drains, "drained");
                info!(node = %self.config.site.node_name, elapsed = ?started.elapsed(), ignored = plan.ignored.len(), "drained: no pod is left on the node");
                return Ok(DrainEnd::Drained);
            }
            if Instant::now() >= deadline {
                Telemetry::count(&self.metrics.drains, "timed_out");
                let left = plan.describe_left();
                warn!(node = %self.config.site.node_name, %left, timeout = ?self.config.args.drain_timeout, "the drain deadline passed: leaving the node cordoned with its remaining pods");
                self.node_event(
                    EventType::Warning,
                    "DecommissionTimedOut",
                    &format!(
                        "drain not finished within {:?}; the node stays cordoned and nothing whose pod exists was deleted. Left: {left}. Scaling out again re-adopts the node",
                        self.config.args.drain_timeout
                    ),
                )
                .await;
                return Ok(DrainEnd::TimedOut { left });
            }
            if !plan.unmanaged.is_empty() && !reported_unmanaged {
                reported_unmanaged = true;
                let note = format!(
                    "waiting for {} pod(s) without a controller, which nothing would recreate: {}. Delete them, or set DRAIN_EVICT_UNMANAGED_PODS=true",
                    plan.unmanaged.len(),
                    names(&plan.unmanaged)
                );
                warn!(node = %self.config.site.node_name, "{note}");
                self.node_event(EventType::Warning, "DrainWaiting", &note)
                    .await;
            }
            self.evict_round(&plan.evict, &mut refusals).await;
            tokio::time::sleep(ROUND).await;
        }
    }

    async fn evict_round(&self, targets: &[Target], refusals: &mut Refusals) {
        let now = Instant::now();
        let due: Vec<&Target> = targets
            .iter()
            .filter(|t| refusals.may_try(&t.to_string(), now))
            .collect();
        // Bounded: a thousand evictions at once would meet the API server's own flow control
        // (429s that would read like budget refusals).
        let results: Vec<_> = futures::stream::iter(due)
            .map(|target| async move {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
                self.telemetry.kube_request("pod_evict");
                (
                    target,
                    pods.evict(&target.name, &EvictParams::default()).await,
                )
            })
            .buffer_unordered(EVICTIONS_IN_FLIGHT)
            .collect()
            .await;
        for (target, result) in results {
            let key = target.to_string();
            match result {
                Ok(_) => info!(pod = %key, "evicted"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    if refusals.refused(&key, Instant::now()) {
                        let note = format!(
                            "eviction refused, retrying with back-off: {}",
                            status.message
                        );
                        warn!(pod = %key, reason = %status.message, "the eviction was refused (429: a disruption budget or API throttling); the decommission waits and retries");
                        let reference = k8s_openapi::api::core::v1::ObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Pod".into()),
                            namespace: Some(target.namespace.clone()),
                            name: Some(target.name.clone()),
                            ..Default::default()
                        };
                        self.publish(&reference, EventType::Warning, "EvictionBlocked", &note)
                            .await;
                        self.node_event(
                            EventType::Warning,
                            "DrainBlocked",
                            &format!("the decommission waits for {key}: {}", status.message),
                        )
                        .await;
                    }
                }
                Err(error) => {
                    refusals.refused(&key, Instant::now());
                    warn!(pod = %key, %error, "could not evict; retrying with back-off");
                }
            }
        }
    }

    /// Deletes the Lease and the Node: the last step of a finished drain.
    pub async fn remove_node(&self) -> Result<(), DrainError> {
        let name = &self.config.site.node_name;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        self.telemetry.kube_request("lease_delete");
        match leases.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(self.api_error("delete the node Lease")(error)),
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.telemetry.kube_request("node_delete");
        match nodes.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(self.api_error("delete the node")(error)),
        }
        info!(node = %name, "decommissioned: Node and Lease deleted");
        Ok(())
    }
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["get", "patch", "delete"],
        why: "cordon the node on scale-in, delete it when drained",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "pods",
        verbs: &["list"],
        why: "see what is left on the node while draining",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "pods/eviction",
        verbs: &["create"],
        why: "evict pods honouring PodDisruptionBudgets",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::NodeLeases,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["delete"],
        why: "remove the node Lease when decommissioned",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_pod(name: &str, owner: Option<&str>) -> Pod {
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "nginx"}], "nodeName": "vn-2"},
            "status": {"phase": "Running"},
        });
        if let Some(kind) = owner {
            pod["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": kind, "name": "owner", "uid": "o-1", "controller": true
            }]);
        }
        serde_json::from_value(pod).unwrap()
    }

    fn names_of(targets: &[Target]) -> Vec<&str> {
        targets.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn drain_sorts_pods_like_kubectl_drain() {
        let mut terminating =
            serde_json::to_value(mk_pod("terminating", Some("ReplicaSet"))).unwrap();
        terminating["metadata"]["deletionTimestamp"] = json!("2026-11-21T00:00:00Z");
        let terminating: Pod = serde_json::from_value(terminating).unwrap();
        let mut mirror = mk_pod("mirror", None);
        mirror.metadata.annotations = Some(
            [("kubernetes.io/config.mirror".to_owned(), "x".to_owned())]
                .into_iter()
                .collect(),
        );
        let mut finished_bare = mk_pod("finished-bare", None);
        finished_bare.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let pods = vec![
            mk_pod("web", Some("ReplicaSet")),
            mk_pod("job", Some("Job")),
            mk_pod("agent", Some("DaemonSet")),
            mk_pod("bare", None),
            terminating,
            mirror,
            finished_bare,
        ];
        let plan = plan(&pods, false);
        assert_eq!(names_of(&plan.evict), ["web", "job", "finished-bare"]);
        assert_eq!(names_of(&plan.terminating), ["terminating"]);
        assert_eq!(names_of(&plan.unmanaged), ["bare"]);
        assert_eq!(names_of(&plan.ignored), ["agent", "mirror"]);
        assert_eq!(plan.left(), 5);
        assert!(
            plan.describe_left()
                .contains("1 without a controller (default/bare)")
        );

        let forced = super::plan(&pods, true);
        assert_eq!(
            names_of(&forced.evict),
            ["web", "job", "bare", "finished-bare"]
        );
        assert!(forced.unmanaged.is_empty());
    }

    #[test]
    fn an_empty_node_or_one_with_only_agents_is_drained() {
        assert_eq!(plan(&[], false).left(), 0);
        assert_eq!(plan(&[mk_pod("agent", Some("DaemonSet"))], false).left(), 0);
    }

    #[test]
    fn long_lists_are_cut_in_messages() {
        let targets: Vec<Target> = (0..12)
            .map(|i| Target {
                namespace: "ns".into(),
                name: format!("p{i}"),
            })
            .collect();
        let text = names(&targets);
        assert!(text.starts_with("ns/p0, ns/p1"));
        assert!(text.ends_with("ns/p9 and 2 more"));
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_back_off_per_pod_and_report_once() {
        let mut refusals = Refusals::default();
        let now = Instant::now();
        assert!(refusals.may_try("a", now));
        assert!(refusals.refused("a", now), "the first refusal is reported");
        assert!(!refusals.may_try("a", now));
        assert!(refusals.may_try("b", now), "other pods are not held up");
        assert!(refusals.may_try("a", now + Duration::from_secs(1)));
        assert!(
            !refusals.refused("a", now),
            "later refusals are not reported again"
        );
        for _ in 0..10 {
            refusals.refused("a", now);
        }
        assert!(refusals.may_try("a", now + MAX_EVICTION_BACKOFF));
    }

    #[test]
    fn an_api_error_says_its_part_once() {
        let error = DrainError::Api {
            node: "vn-0".into(),
            action: "cordon the node",
            source: kube::Error::Api(
                kube::core::Status::failure("boom", "Conflict")
                    .with_code(409)
                    .boxed(),
            ),
        };
        assert_eq!(
            error.to_string(),
            "decommissioning node vn-0: could not cordon the node"
        );
        assert!(crate::ops::chain::says_each_part_once(&error));
    }
}
