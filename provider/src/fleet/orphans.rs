//! The cluster-wide safety net against leaked instances: container groups of this cluster whose
//! node no longer exists *and* whose pod no longer exists (a replica removed without a drain, a
//! decommission that crashed) are deleted. One replica does it, elected through a Lease, on a
//! slow schedule and a per-round cap. A group whose pod exists is never touched: its node's
//! replica, or the pod's deletion, decides about it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use eci_proto::EciError;
use eci_proto::v20180808::{
    ContainerGroupStatus, DeleteContainerGroupRequest, DescribeContainerGroupStatusRequest, Tag,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Settings;
use crate::eci::Backend;
use crate::ops::metrics::Telemetry;
use crate::pods::to_eci::naming;

/// Name of the election Lease (in the daemon's namespace).
pub const GC_LEASE: &str = "virtual-node-eci-orphan-gc";

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

/// Whether `me` may lead given the election Lease as it is (pure): it is ours, or its holder
/// stopped renewing it.
pub fn may_lead(lease: &Value, me: &str, now: SystemTime) -> bool {
    let holder = lease
        .pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if holder == me || holder.is_empty() {
        return true;
    }
    let renewed = lease
        .pointer("/spec/renewTime")
        .and_then(Value::as_str)
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    let duration = lease
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    renewed.is_none_or(|at| at + Duration::from_secs(duration) <= now)
}

/// The collector.
pub struct OrphanCollector {
    client: kube::Client,
    backend: Backend,
    settings: Settings,
    telemetry: std::sync::Arc<Telemetry>,
}

impl std::fmt::Debug for OrphanCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrphanCollector")
            .field("node", &self.settings.node_name)
            .finish_non_exhaustive()
    }
}

impl OrphanCollector {
    /// A collector for this replica.
    pub fn new(
        client: kube::Client,
        backend: Backend,
        settings: Settings,
        telemetry: std::sync::Arc<Telemetry>,
    ) -> Self {
        Self {
            client,
            backend,
            settings,
            telemetry,
        }
    }

    /// Runs rounds every `orphan_gc_interval` until cancelled (never fails: a failed round is
    /// logged and the next one tries again).
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let interval = self.settings.config.orphan_gc_interval;
        if interval.is_zero() {
            stop.cancelled().await;
            return Ok(());
        }
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first round waits one interval: a fleet starting together settles first.
        ticks.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            match self.lead().await {
                Ok(true) => {}
                Ok(false) => {
                    debug!("another replica collects orphaned groups");
                    continue;
                }
                Err(error) => {
                    warn!(%error, "cannot take part in the orphan collector election; skipping this round");
                    continue;
                }
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                result = self.round() => match result {
                    Ok(deleted) if deleted > 0 => info!(deleted, "orphan collection round finished"),
                    Ok(_) => debug!("orphan collection round found nothing"),
                    Err(error) => warn!(%error, "orphan collection round failed; the next one retries"),
                },
            }
        }
    }

    /// Takes or renews the election Lease; false when another replica leads.
    async fn lead(&self) -> Result<bool, kube::Error> {
        let namespace = &self.settings.config.pod_namespace;
        let me = &self.settings.node_name;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        // Three intervals: a leader that misses one round keeps the role.
        let duration = i32::try_from(
            self.settings
                .config
                .orphan_gc_interval
                .as_secs()
                .saturating_mul(3)
                .max(15),
        )
        .unwrap_or(i32::MAX);
        let now = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
        self.telemetry.kube_request("gc_lease_get");
        let existing = leases.get_opt(GC_LEASE).await?;
        let mut desired = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": GC_LEASE, "namespace": namespace},
            "spec": {"holderIdentity": me, "leaseDurationSeconds": duration, "renewTime": now},
        });
        let result = match existing {
            None => {
                desired["spec"]["acquireTime"] = json!(now);
                self.telemetry.kube_request("gc_lease_create");
                leases
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(desired).map_err(kube::Error::SerdeError)?,
                    )
                    .await
            }
            Some(lease) => {
                let current = serde_json::to_value(&lease).unwrap_or_default();
                if !may_lead(&current, me, SystemTime::now()) {
                    return Ok(false);
                }
                let ours = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(me.as_str());
                desired["metadata"]["resourceVersion"] = json!(lease.resource_version());
                desired["spec"]["acquireTime"] = if ours {
                    current
                        .pointer("/spec/acquireTime")
                        .cloned()
                        .unwrap_or_else(|| json!(now))
                } else {
                    json!(now)
                };
                self.telemetry.kube_request("gc_lease_renew");
                leases
                    .replace(
                        GC_LEASE,
                        &PostParams::default(),
                        &serde_json::from_value(desired).map_err(kube::Error::SerdeError)?,
                    )
                    .await
            }
        };
        match result {
            Ok(_) => Ok(true),
            // Someone else wrote first: they lead this round.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn cluster_groups(&self) -> Result<Vec<ContainerGroupStatus>, EciError> {
        let mut groups = Vec::new();
        let mut next_token = String::new();
        loop {
            let page = self
                .backend
                .describe_container_group_status(DescribeContainerGroupStatusRequest {
                    region_id: self.settings.config.region.clone(),
                    tag: vec![Tag {
                        key: naming::TAG_CLUSTER.into(),
                        value: self.settings.cluster_name.clone(),
                    }],
                    limit: Some(200),
                    next_token: next_token.clone(),
                    ..DescribeContainerGroupStatusRequest::default()
                })
                .await?;
            groups.extend(page.data);
            if page.next_token.is_empty() {
                return Ok(groups);
            }
            next_token = page.next_token;
        }
    }

    /// One round; returns how many groups it deleted.
    pub async fn round(&self) -> Result<usize, RoundError> {
        let groups = self.cluster_groups().await.map_err(RoundError::Eci)?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut existing = BTreeSet::new();
        for node in nodes_of(&groups) {
            self.telemetry.kube_request("node_get");
            if nodes
                .get_opt(&node)
                .await
                .map_err(RoundError::Kube)?
                .is_some()
            {
                existing.insert(node);
            }
        }
        let mut deleted = 0;
        let mut kept: BTreeMap<String, usize> = BTreeMap::new();
        for candidate in candidates(&groups, &existing) {
            if deleted >= self.settings.config.orphan_gc_max_deletions {
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
                    region_id: self.settings.config.region.clone(),
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
            self.telemetry.orphan_groups_deleted.inc();
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
    #[error("cannot list this cluster's container groups: {0}")]
    Eci(#[source] EciError),
    /// Reading nodes failed.
    #[error("cannot read nodes: {0}")]
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
    fn the_election_goes_to_the_holder_or_past_a_silent_one() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
        let lease = json!({"spec": {
            "holderIdentity": "vn-0",
            "leaseDurationSeconds": 30,
            "renewTime": humantime::format_rfc3339_micros(at(0)).to_string(),
        }});
        assert!(may_lead(&lease, "vn-0", at(5)));
        assert!(!may_lead(&lease, "vn-1", at(5)));
        assert!(may_lead(&lease, "vn-1", at(30)));
        assert!(may_lead(&json!({"spec": {}}), "vn-1", at(0)));
    }
}
