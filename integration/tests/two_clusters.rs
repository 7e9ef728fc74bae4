//! Two clusters, one ECI account (issue 26): two independent real control planes whose daemons
//! serve the *same node names* (and whose pods have the same namespaces and names) share one
//! mock-eci, with different cluster names. Each cluster's replicas start, run pods, restart
//! (relist and adopt), one cluster scales in (drain and delete its node's groups) and both run
//! the orphan collector every second. Throughout, a group is only ever adopted, deleted or
//! touched by its own cluster:
//!
//! - the other cluster's group of the same node and pod name is neither adopted on relist nor
//!   deleted as "its pod is gone" (its pod's UID is another);
//! - cluster B's drain of node `…-1` leaves cluster A's groups of node `…-1`;
//! - cluster B's collector, which sees no node `…-2` and (after its drain) no node `…-1`, never
//!   collects A's groups there, while A's own collector does collect A's orphan;
//! - every group keeps its id (nothing recreated), every pod its own cluster's group, and no
//!   daemon's log names a group of the other cluster.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::Duration;

use integration::harness::deploy::is_ready;
use integration::harness::mock_admin::{self, tag};
use integration::harness::{Harness, HarnessError};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
];
const DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("DRAIN_TIMEOUT", "60s"),
    // The pods are bare: the drain evicts them rather than waiting for the deadline.
    ("DRAIN_EVICT_UNMANAGED_PODS", "true"),
    // Every replica's collector runs (the elected one collects) from the start.
    ("ORPHAN_GC_INTERVAL", "1s"),
];
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";
const TAG_CLUSTER: &str = "k8s.aliyun.com/cluster";
const TAG_NAMESPACE: &str = "k8s.aliyun.com/namespace";
const TAG_POD_NAME: &str = "k8s.aliyun.com/pod-name";
const TAG_NODE: &str = "k8s.aliyun.com/node-name";

fn failed(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// One group as mock-eci's admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    id: String,
    node: String,
    status: String,
}

/// The live groups of namespace `ns` (deleted ones left out), by (cluster, pod name).
async fn groups(
    admin: &str,
    ns: &str,
) -> Result<BTreeMap<(String, String), Vec<Group>>, HarnessError> {
    let all = mock_admin::groups(admin).await?;
    let mut by_pod: BTreeMap<(String, String), Vec<Group>> = BTreeMap::new();
    for group in &all {
        let status = group["status"].as_str().unwrap_or_default();
        if tag(group, TAG_NAMESPACE) != ns || matches!(status, "Deleted" | "Deleting") {
            continue;
        }
        by_pod
            .entry((
                tag(group, TAG_CLUSTER).to_owned(),
                tag(group, TAG_POD_NAME).to_owned(),
            ))
            .or_default()
            .push(Group {
                id: group["container_group_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                node: tag(group, TAG_NODE).to_owned(),
                status: status.to_owned(),
            });
    }
    Ok(by_pod)
}

/// A bare pod `name` on `node`.
async fn create_pod(h: &Harness, ns: &str, name: &str, node: &str) -> Result<(), HarnessError> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// The pod's group id, once it runs with one recorded.
async fn running_group(h: &Harness, ns: &str, name: &str) -> Option<String> {
    let pod = h.pod_json(ns, name).await?;
    let running = pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
    let id = pod["metadata"]["annotations"][INSTANCE_ID].as_str()?;
    running.then(|| id.to_owned())
}

async fn wait_nodes_ready(h: &Harness, names: &[String]) -> Result<(), HarnessError> {
    h.wait_for(&format!("nodes {names:?} Ready"), WAIT, |h| async move {
        let nodes: Api<Node> = Api::all(h.client());
        for name in names {
            if !nodes
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| is_ready(&n))
            {
                return false;
            }
        }
        true
    })
    .await
}

/// Waits until every pod in `pods` runs, and returns their group ids.
async fn wait_running(
    h: &Harness,
    ns: &str,
    pods: &[&str],
) -> Result<BTreeMap<String, String>, HarnessError> {
    h.wait_for(
        &format!("{} pods {pods:?} running", h.cluster_name()),
        WAIT,
        |h| async move {
            for pod in pods {
                if running_group(h, ns, pod).await.is_none() {
                    return false;
                }
            }
            true
        },
    )
    .await?;
    let mut ids = BTreeMap::new();
    for pod in pods {
        ids.insert(
            (*pod).to_owned(),
            running_group(h, ns, pod).await.unwrap_or_default(),
        );
    }
    Ok(ids)
}

/// A cluster's expected groups: its name, its pods' group ids, and (pod, node) of the pods
/// that should have one now.
type ClusterGroups<'a> = (
    &'a str,
    &'a BTreeMap<String, String>,
    &'a [(&'a str, String)],
);

/// The groups expected now: for each cluster, its pods' ids (one live group each, on the
/// pod's node, Running).
fn expected(clusters: &[ClusterGroups<'_>]) -> BTreeMap<(String, String), Vec<Group>> {
    let mut want = BTreeMap::new();
    for (cluster, ids, placement) in clusters {
        for (pod, node) in *placement {
            want.insert(
                ((*cluster).to_owned(), (*pod).to_owned()),
                vec![Group {
                    id: ids[*pod].clone(),
                    node: node.clone(),
                    status: "Running".to_owned(),
                }],
            );
        }
    }
    want
}

/// Restarts daemon `ordinal` of `h` (SIGTERM while the StatefulSet still counts it: a
/// restart, which leaves node and pods to the successor), returning the new process's name.
async fn restart(h: &mut Harness, process: &str, ordinal: u32) -> Result<String, HarnessError> {
    let status = h
        .process(process)
        .ok_or_else(|| failed(format!("no process {process}")))?
        .terminate(Duration::from_secs(30))
        .await;
    if !status.is_some_and(|s| s.success()) {
        return Err(failed(format!("{process} stopped with {status:?}")));
    }
    h.start_daemon(ordinal, DAEMON)
}

/// The renew time of `h`'s orphan-collector election Lease: it moves on every round the
/// elected replica runs (`ORPHAN_GC_INTERVAL`).
async fn collector_round(h: &Harness) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(h.client(), "kube-system");
    let lease = leases.get_opt("virtual-node-eci-orphan-gc").await.ok()??;
    let value = serde_json::to_value(&lease).ok()?;
    value["spec"]["renewTime"].as_str().map(str::to_owned)
}

/// Waits for `rounds` more rounds of `h`'s orphan collector.
async fn wait_collector_rounds(h: &Harness, rounds: usize) -> Result<(), HarnessError> {
    for _ in 0..rounds {
        let before = collector_round(h).await;
        h.wait_for(
            &format!("a round of {}'s orphan collector", h.cluster_name()),
            WAIT,
            |h| {
                let before = before.clone();
                async move {
                    collector_round(h)
                        .await
                        .is_some_and(|now| Some(now) != before)
                }
            },
        )
        .await?;
    }
    Ok(())
}

async fn scenario(a: &mut Harness, b: &mut Harness, admin: &str) -> Result<(), HarnessError> {
    assert_ne!(a.cluster_name(), b.cluster_name());
    assert_eq!(a.node_name(1), b.node_name(1), "the same node names");
    // The same namespace name in both clusters: pods of the same name on the same node.
    let ns = a.create_namespace("shared").await?;
    assert_eq!(b.create_namespace("shared").await?, ns);
    let nodes: Vec<String> = (0..3).map(|o| a.node_name(o)).collect();

    // A: replicas 0, 1, 2 with pods p0, p1, p2. B: replicas 0, 1 with pods p0, p1.
    a.create_daemon_statefulset(3).await?;
    b.create_daemon_statefulset(2).await?;
    let mut a_procs = Vec::new();
    for ordinal in 0..3 {
        a_procs.push(a.start_daemon(ordinal, DAEMON)?);
    }
    let mut b_procs = Vec::new();
    for ordinal in 0..2 {
        b_procs.push(b.start_daemon(ordinal, DAEMON)?);
    }
    wait_nodes_ready(a, &nodes).await?;
    wait_nodes_ready(b, &nodes[..2]).await?;
    for (ordinal, node) in nodes.iter().enumerate() {
        create_pod(a, &ns, &format!("p{ordinal}"), node).await?;
        if ordinal < 2 {
            create_pod(b, &ns, &format!("p{ordinal}"), node).await?;
        }
    }
    let a_ids = wait_running(a, &ns, &["p0", "p1", "p2"]).await?;
    let b_ids = wait_running(b, &ns, &["p0", "p1"]).await?;
    let (ca, cb) = (a.cluster_name(), b.cluster_name());
    let a_all = [
        ("p0", nodes[0].clone()),
        ("p1", nodes[1].clone()),
        ("p2", nodes[2].clone()),
    ];
    let b_all = [("p0", nodes[0].clone()), ("p1", nodes[1].clone())];
    let want = expected(&[(&ca, &a_ids, &a_all), (&cb, &b_ids, &b_all)]);
    assert_eq!(
        groups(admin, &ns).await?,
        want,
        "one group per pod, each tagged with its cluster"
    );

    // Restart every replica of both clusters: each relists and adopts its own groups only.
    for (ordinal, process) in a_procs.iter_mut().enumerate() {
        *process = restart(a, process, u32::try_from(ordinal).unwrap()).await?;
    }
    for (ordinal, process) in b_procs.iter_mut().enumerate() {
        *process = restart(b, process, u32::try_from(ordinal).unwrap()).await?;
    }
    wait_nodes_ready(a, &nodes).await?;
    wait_nodes_ready(b, &nodes[..2]).await?;
    // The successors relisted when they started; their collectors run after it.
    wait_collector_rounds(a, 2).await?;
    wait_collector_rounds(b, 2).await?;
    assert_eq!(
        wait_running(a, &ns, &["p0", "p1", "p2"]).await?,
        a_ids,
        "A's pods keep their groups"
    );
    assert_eq!(
        wait_running(b, &ns, &["p0", "p1"]).await?,
        b_ids,
        "B's pods keep their groups"
    );
    assert_eq!(
        groups(admin, &ns).await?,
        want,
        "after both clusters restarted"
    );

    // B scales in: replica 1 drains node …-1 (its pod evicted, its group deleted, the node
    // removed). A's group of the same node and pod name stays.
    b.scale_daemon_statefulset(1).await?;
    let drained = b_procs.pop().unwrap();
    let status = b
        .process(&drained)
        .unwrap()
        .terminate(Duration::from_secs(90))
        .await;
    assert!(
        status.is_some_and(|s| s.success()),
        "B's replica 1 drained: {status:?}"
    );
    b.wait_for("B's node 1 removed and its pod gone", WAIT, |h| {
        let (node, ns) = (nodes[1].clone(), ns.clone());
        async move {
            Api::<Node>::all(h.client())
                .get_opt(&node)
                .await
                .ok()
                .flatten()
                .is_none()
                && h.pod_json(&ns, "p1").await.is_none()
        }
    })
    .await?;
    let b_kept = [("p0", nodes[0].clone())];
    let want = expected(&[(&ca, &a_ids, &a_all), (&cb, &b_ids, &b_kept)]);
    assert_eq!(
        groups(admin, &ns).await?,
        want,
        "B's drain deleted B's group of node 1 only"
    );

    // A loses replica 2 without a drain, its node and pod: A's collector deletes that orphan.
    // B's collector sees neither node …-1 nor …-2 in its cluster, and must leave A's groups
    // there alone, round after round.
    let lost = a_procs.pop().unwrap();
    a.process(&lost).unwrap().kill().await;
    Api::<Node>::all(a.client())
        .delete(&nodes[2], &DeleteParams::default())
        .await?;
    Api::<Pod>::namespaced(a.client(), &ns)
        .delete(
            "p2",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
    let a_kept = [("p0", nodes[0].clone()), ("p1", nodes[1].clone())];
    let want = expected(&[(&ca, &a_ids, &a_kept), (&cb, &b_ids, &b_kept)]);
    a.wait_for("A's collector to delete A's orphan", WAIT, |_| {
        let (ns, want) = (ns.clone(), want.clone());
        async move { groups(admin, &ns).await.is_ok_and(|now| now == want) }
    })
    .await?;
    wait_collector_rounds(b, 3).await?;
    assert_eq!(
        groups(admin, &ns).await?,
        want,
        "B's collector took nothing of A's"
    );
    assert_eq!(
        wait_running(a, &ns, &["p0", "p1"]).await?,
        a_ids
            .iter()
            .filter(|(p, _)| *p != "p2")
            .map(|(p, i)| (p.clone(), i.clone()))
            .collect()
    );
    assert_eq!(
        wait_running(b, &ns, &["p0"]).await?,
        b_ids
            .iter()
            .filter(|(p, _)| *p == "p0")
            .map(|(p, i)| (p.clone(), i.clone()))
            .collect()
    );

    // No daemon's log names a group of the other cluster (adopting, deleting, updating,
    // restarting or describing one would).
    for (h, theirs) in [(&*a, &b_ids), (&*b, &a_ids)] {
        let names: Vec<String> = (0..3).map(|o| h.node_name(o)).collect();
        for name in names {
            for suffix in ["", ".1"] {
                let process = format!("{name}{suffix}");
                let Some(output) = h.process_output(&process) else {
                    continue;
                };
                for id in theirs.values() {
                    assert!(
                        !output.contains(id.as_str()),
                        "{} daemon {process} names the other cluster's group {id}",
                        h.cluster_name()
                    );
                }
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_on_one_account_never_touch_each_others_groups() {
    let mut a = Harness::start().await.expect("cluster A starts");
    let mock = a.start_mock_eci(MOCK).await.expect("mock-eci starts");
    let mut b = a
        .start_independent_cluster()
        .await
        .expect("cluster B starts");
    let result = scenario(&mut a, &mut b, &mock.admin).await;
    if result.is_err() {
        eprintln!("==== cluster A ====\n{}", a.dump().await);
        eprintln!("==== cluster B ====\n{}", b.dump().await);
    }
    b.shutdown(Duration::from_secs(10)).await;
    a.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}
