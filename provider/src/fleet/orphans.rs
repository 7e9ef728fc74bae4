//! The cluster-wide safety net against leaked instances: container groups of this cluster whose
//! node no longer exists *and* whose pod no longer exists (a replica removed without a drain, a
//! decommission that crashed) are deleted. One replica does it, elected through a Lease, on a
//! slow schedule and a per-round cap. A group whose pod exists is never touched: its node's
//! replica, or the pod's deletion, decides about it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use eci_proto::EciError;
use eci_proto::v20180808::{
    ContainerGroupStatus, DeleteContainerGroupRequest, DescribeContainerGroupStatusRequest, Tag,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::FleetMetrics;
use crate::config::{FleetArgs, WithSite};
use crate::eci::Backend;
use crate::k8s::election::{self, Acquire, LeaseLock, Request};
use crate::ops::chain::Chain;
use crate::ops::metrics::{MetricSet as _, Telemetry};
use vne_core::to_eci::naming;

/// Name of the election Lease (in the daemon's namespace).
pub const GC_LEASE: &str = "virtual-node-eci-orphan-gc";
/// How long a stopping leader tries to release the election.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// A group the collector may delete once its pod is confirmed gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The ECI id.
    pub group_id: String,
    /// The node it was created for.
    pub node: String,
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod's name.
    pub name: String,
    /// Its pod's uid.
    pub uid: String,
}

fn tag<'a>(group: &'a ContainerGroupStatus, key: &str) -> Option<&'a str> {
    group
        .tags
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.value.as_str())
        .filter(|v| !v.is_empty())
}

/// The groups tagged with `cluster` (pure). ECI is asked by that tag already; an answer that
/// holds another cluster's group anyway (a proxy, a service change) must not make this
/// collector judge — and delete — it.
pub fn of_cluster(groups: Vec<ContainerGroupStatus>, cluster: &str) -> Vec<ContainerGroupStatus> {
    groups
        .into_iter()
        .filter(|group| tag(group, naming::TAG_CLUSTER) == Some(cluster))
        .collect()
}

/// The node names the groups were created for (pure).
pub fn nodes_of(groups: &[ContainerGroupStatus]) -> BTreeSet<String> {
    groups
        .iter()
        .filter_map(|g| tag(g, naming::TAG_NODE).map(str::to_owned))
        .collect()
}

/// Groups of missing nodes that name their pod fully (pure). Groups without our tags are not
/// ours to judge.
pub fn candidates(
    groups: &[ContainerGroupStatus],
    existing_nodes: &BTreeSet<String>,
) -> Vec<Candidate> {
    groups
        .iter()
        .filter_map(|group| {
            let node = tag(group, naming::TAG_NODE)?;
            if existing_nodes.contains(node) {
                return None;
            }
            Some(Candidate {
                group_id: group.container_group_id.clone(),
                node: node.to_owned(),
                namespace: tag(group, naming::TAG_NAMESPACE)?.to_owned(),
                name: tag(group, naming::TAG_POD_NAME)?.to_owned(),
                uid: tag(group, naming::TAG_POD_UID)?.to_owned(),
            })
        })
        .collect()
}

/// This replica as a candidate for the election: its node name is its identity (one process
/// per node, the node Lease sees to it); the Lease lasts three rounds, so a leader that misses
/// one keeps the role.
pub fn election_candidate(node_name: &str, interval: Duration) -> election::Candidate {
    election::Candidate {
        holder: node_name.to_owned(),
        instance: None,
        duration: interval.saturating_mul(3).max(Duration::from_secs(15)),
        renew_interval: interval,
        owner: None,
    }
}

/// The metric name of an election request.
fn operation(request: Request) -> &'static str {
    match request {
        Request::Get => "gc_lease_get",
        Request::Create => "gc_lease_create",
        Request::TakeOver => "gc_lease_take_over",
        Request::Renew => "gc_lease_renew",
        Request::Release => "gc_lease_release",
    }
}

/// The collector.
pub struct OrphanCollector {
    client: kube::Client,
    backend: Backend,
    config: WithSite<FleetArgs>,
    telemetry: std::sync::Arc<Telemetry>,
    metrics: FleetMetrics,
    election: LeaseLock,
}

impl std::fmt::Debug for OrphanCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrphanCollector")
            .field("node", &self.config.site.node_name)
            .finish_non_exhaustive()
    }
}

impl OrphanCollector {
    /// A collector for this replica.
    pub fn new(
        client: kube::Client,
        backend: Backend,
        config: WithSite<FleetArgs>,
        telemetry: std::sync::Arc<Telemetry>,
    ) -> Self {
        let election = LeaseLock::new(
            client.clone(),
            &config.site.pod_namespace,
            GC_LEASE,
            election_candidate(&config.site.node_name, config.args.orphan_gc_interval),
        );
        Self {
            client,
            backend,
            config,
            metrics: FleetMetrics::of(&telemetry),
            telemetry,
            election,
        }
    }

    /// Runs rounds every `orphan_gc_interval` until cancelled (never fails: a failed round is
    /// logged and the next one tries again). A leader releases the election when it stops, so
    /// another replica leads from its next round.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let interval = self.config.args.orphan_gc_interval;
        if interval.is_zero() {
            stop.cancelled().await;
            return Ok(());
        }
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first round waits one interval: a fleet starting together settles first.
        ticks.tick().await;
        let mut leading: Option<Lease> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            leading = match self.lead().await {
                Ok(Acquire::Acquired(lease)) => Some(*lease),
                Ok(Acquire::Held(_) | Acquire::Contended) => {
                    debug!("another replica collects orphaned groups");
                    continue;
                }
                Err(error) => {
                    warn!(error = %Chain(&error), "cannot take part in the orphan collector election; skipping this round");
                    continue;
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                result = self.round() => match result {
                    Ok(deleted) if deleted > 0 => info!(deleted, "orphan collection round finished"),
                    Ok(_) => debug!("orphan collection round found nothing"),
                    Err(error) => warn!(error = %Chain(&error), "orphan collection round failed; the next one retries"),
                },
            }
        }
        if let Some(held) = leading {
            let count = |request| self.telemetry.kube_request(operation(request));
            // Bounded: a stop must not wait on an unreachable apiserver for a courtesy.
            let release = self.election.release(&held, &count);
            match tokio::time::timeout(RELEASE_TIMEOUT, release).await {
                Ok(Ok(_)) => info!("released the orphan collector election"),
                Ok(Err(error)) => {
                    debug!(error = %Chain(&error), "could not release the orphan collector election; it expires instead");
                }
                Err(_) => {
                    debug!("releasing the orphan collector election timed out; it expires instead");
                }
            }
        }
        Ok(())
    }

    /// Takes or renews the election Lease.
    async fn lead(&self) -> Result<Acquire, kube::Error> {
        let count = |request| self.telemetry.kube_request(operation(request));
        self.election.try_acquire(&count).await
    }

    /// The groups of this cluster whose node is gone and that name their pod, read a page at a
    /// time: a page's groups are judged and dropped before the next is asked for, so what the
    /// round holds is the orphans found, not every group of the cluster (thousands of full
    /// statuses, each several KiB decoded). Each node is looked up once per round.
    async fn orphan_candidates(&self) -> Result<Vec<Candidate>, RoundError> {
        let cluster = &self.config.site.cluster_name;
        let mut checked = BTreeSet::new();
        let mut existing = BTreeSet::new();
        let mut found = Vec::new();
        let mut next_token = String::new();
        loop {
            let page = self
                .backend
                .describe_container_group_status(DescribeContainerGroupStatusRequest {
                    region_id: self.config.site.region.clone(),
                    tag: vec![Tag {
                        key: naming::TAG_CLUSTER.into(),
                        value: cluster.clone(),
                    }],
                    limit: Some(200),
                    next_token: next_token.clone(),
                    ..DescribeContainerGroupStatusRequest::default()
                })
                .await
                .map_err(RoundError::Eci)?;
            let groups = of_cluster(page.data, cluster);
            for node in nodes_of(&groups) {
                if checked.insert(node.clone()) && self.node_exists(&node).await? {
                    existing.insert(node);
                }
            }
            found.extend(candidates(&groups, &existing));
            if page.next_token.is_empty() {
                return Ok(found);
            }
            next_token = page.next_token;
        }
    }

    async fn node_exists(&self, node: &str) -> Result<bool, RoundError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.telemetry.kube_request("node_get");
        let found = nodes.get_opt(node).await.map_err(RoundError::Kube)?;
        Ok(found.is_some())
    }

    /// One round; returns how many groups it deleted.
    pub async fn round(&self) -> Result<usize, RoundError> {
        let orphans = self.orphan_candidates().await?;
        let mut deleted = 0;
        let mut kept: BTreeMap<String, usize> = BTreeMap::new();
        for candidate in orphans {
            if deleted >= self.config.args.orphan_gc_max_deletions {
                info!(
                    limit = deleted,
                    "orphan collection: per-round limit reached; the next round continues"
                );
                break;
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &candidate.namespace);
            self.telemetry.kube_request("pod_get");
            match pods.get_opt(&candidate.name).await {
                Ok(Some(pod)) if pod.uid().as_deref() == Some(candidate.uid.as_str()) => {
                    *kept.entry(candidate.node.clone()).or_default() += 1;
                    continue;
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(%error, eci_id = %candidate.group_id, "cannot confirm whether the group's pod exists; keeping the group");
                    continue;
                }
            }
            let result = self
                .backend
                .delete_container_group(DeleteContainerGroupRequest {
                    region_id: self.config.site.region.clone(),
                    container_group_id: candidate.group_id.clone(),
                    force: true,
                    ..DeleteContainerGroupRequest::default()
                })
                .await;
            match result {
                Ok(_) => {}
                Err(error) if error.is_not_found() => continue,
                Err(error) => {
                    warn!(%error, eci_id = %candidate.group_id, "could not delete an orphaned group; the next round retries");
                    continue;
                }
            }
            deleted += 1;
            self.metrics.orphan_groups_deleted.inc();
            info!(
                eci_id = %candidate.group_id,
                node = %candidate.node,
                pod = %format!("{}/{}", candidate.namespace, candidate.name),
                "deleted an orphaned container group: its node and its pod are both gone"
            );
        }
        for (node, count) in kept {
            info!(%node, groups = count, "node is gone but its pods still exist; their groups are kept until the pods go");
        }
        Ok(deleted)
    }
}

/// A collection round failed.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// Listing the cluster's groups failed.
    #[error("cannot list this cluster's container groups")]
    Eci(#[source] EciError),
    /// Reading nodes failed.
    #[error("cannot read nodes")]
    Kube(#[source] kube::Error),
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::OwnNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        why: "elect the one replica that collects orphaned groups",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["get"],
        why: "check whether a group's node still exists",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "pods",
        verbs: &["get"],
        why: "never delete a group whose pod exists",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_group(id: &str, tags: &[(&str, &str)]) -> ContainerGroupStatus {
        ContainerGroupStatus {
            container_group_id: id.into(),
            tags: tags
                .iter()
                .map(|(k, v)| Tag {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..ContainerGroupStatus::default()
        }
    }

    fn owned(id: &str, node: &str) -> ContainerGroupStatus {
        mk_group(
            id,
            &[
                (naming::TAG_CLUSTER, "c"),
                (naming::TAG_NODE, node),
                (naming::TAG_NAMESPACE, "default"),
                (naming::TAG_POD_NAME, id),
                (naming::TAG_POD_UID, &format!("uid-{id}")),
            ],
        )
    }

    #[test]
    fn only_groups_of_missing_nodes_that_name_their_pod_are_candidates() {
        let groups = vec![
            owned("a", "vn-0"),
            owned("b", "vn-2"),
            mk_group("foreign", &[(naming::TAG_CLUSTER, "c")]),
            mk_group(
                "no-uid",
                &[(naming::TAG_NODE, "vn-2"), (naming::TAG_POD_NAME, "x")],
            ),
        ];
        assert_eq!(
            nodes_of(&groups),
            ["vn-0", "vn-2"].map(String::from).into_iter().collect()
        );
        let existing: BTreeSet<String> = ["vn-0".to_owned()].into_iter().collect();
        let found = candidates(&groups, &existing);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].group_id, "b");
        assert_eq!(found[0].uid, "uid-b");
        assert!(candidates(&groups, &nodes_of(&groups)).is_empty());
    }

    #[test]
    fn groups_of_another_cluster_are_never_judged() {
        let mut foreign = owned("theirs", "vn-9");
        foreign.tags[0].value = "other".into();
        let untagged = mk_group("untagged", &[(naming::TAG_NODE, "vn-9")]);
        let ours = of_cluster(vec![owned("a", "vn-9"), foreign, untagged], "c");
        let ids: Vec<&str> = ours.iter().map(|g| g.container_group_id.as_str()).collect();
        assert_eq!(ids, ["a"]);
        let found = candidates(&ours, &BTreeSet::new());
        assert_eq!(found.len(), 1, "vn-9 is gone: only our group of it goes");
    }

    #[test]
    fn the_election_goes_to_the_holder_or_past_a_silent_one() {
        use crate::k8s::election::{Claim, claimed, judge};
        let at =
            |s: u64| std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
        let interval = Duration::from_secs(10);
        let (vn0, vn1) = (
            election_candidate("vn-0", interval),
            election_candidate("vn-1", interval),
        );
        assert_eq!(vn0.duration, Duration::from_secs(30), "three rounds");
        assert_eq!(
            election_candidate("vn-0", Duration::from_secs(1)).duration,
            Duration::from_secs(15),
            "at least 15 s"
        );
        let lease = claimed(GC_LEASE, "ns", &vn0, None, at(0));
        assert_eq!(judge(&lease, &vn0, at(5)), Claim::Ours);
        assert!(matches!(judge(&lease, &vn1, at(5)), Claim::Held(_)));
        assert_eq!(
            judge(&lease, &vn1, at(30)),
            Claim::Free,
            "silent for three rounds"
        );
        let mut nobody = lease;
        nobody.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(judge(&nobody, &vn1, at(0)), Claim::Free);
    }

    #[test]
    fn round_errors_say_their_part_once() {
        let error = RoundError::Eci(EciError::new("Throttling", "slow down"));
        assert_eq!(
            Chain(&error).to_string(),
            "cannot list this cluster's container groups: ECI error Throttling: slow down (RequestId: )"
        );
    }
}
