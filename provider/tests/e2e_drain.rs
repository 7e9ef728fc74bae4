//! End to end on the real control plane: scaling the daemon StatefulSet in and out, restarts,
//! deleted nodes and the cluster-wide orphan collector — with real daemon and mock-eci
//! processes. The scheduler places the pods (they tolerate the virtual-node taint and select
//! the test's nodes), ReplicaSets and Deployments own the managed ones, the Eviction API and the
//! disruption controller enforce the budgets, and the pod garbage collector removes the pods of
//! a Node that is gone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integration::harness::mock_admin;
use integration::harness::{Harness, HarnessError, run_scenario};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
/// The pod garbage collector deletes the pods of a missing Node after a 40 s quarantine, on a
/// 20 s period.
const POD_GC_WAIT: Duration = Duration::from_secs(240);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("DRAIN_TIMEOUT", "180s"),
];
const VNODE_TAINT: &str = "k8s.aliyun.com/vnode";
const TAG_NODE: &str = "k8s.aliyun.com/node-name";
const TAG_POD_NAME: &str = "k8s.aliyun.com/pod-name";
const TAG_POD_UID: &str = "k8s.aliyun.com/pod-uid";

fn env_with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env: Vec<(&str, &str)> = FAST_DAEMON.to_vec();
    env.extend_from_slice(extra);
    env
}

/// Waits until the StatefulSet controller created the daemon pods of `ordinals`: a replica
/// learns from its own pod that it belongs to the set (and so tells a scale-in from a restart).
async fn wait_daemon_pods(h: &Harness, ordinals: &[u32]) -> Result<(), HarnessError> {
    let names: Vec<String> = ordinals.iter().map(|o| h.node_name(*o)).collect();
    h.wait_for(&format!("the StatefulSet's pods {names:?}"), WAIT, |h| {
        let names = names.clone();
        async move {
            let pods: Api<Pod> = Api::namespaced(h.client(), "kube-system");
            for name in names {
                if !pods.get_opt(&name).await.ok().flatten().is_some_and(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.owner_references().iter().any(|o| o.kind == "StatefulSet")
                }) {
                    return false;
                }
            }
            true
        }
    })
    .await
}

/// Starts the replicas and waits until the scheduler may place pods on their nodes: Ready, not
/// cordoned, and no taint but ours (the node lifecycle controller lifts `not-ready` after Ready).
async fn start_replicas(
    h: &mut Harness,
    ordinals: &[u32],
    extra: &[(&str, &str)],
) -> Result<Vec<String>, HarnessError> {
    let mut processes = Vec::new();
    for ordinal in ordinals {
        processes.push(h.start_daemon(*ordinal, &env_with(extra))?);
    }
    for ordinal in ordinals {
        let name = h.node_name(*ordinal);
        wait_schedulable(h, &name).await?;
    }
    Ok(processes)
}

async fn wait_schedulable(h: &Harness, name: &str) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("node {name} Ready and schedulable"),
        WAIT,
        |h| async move { node(h, name).await.is_some_and(|n| schedulable(&n)) },
    )
    .await
}

async fn node(h: &Harness, name: &str) -> Option<Node> {
    Api::<Node>::all(h.client())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn schedulable(node: &Node) -> bool {
    is_ready(node)
        && !unschedulable(node)
        && node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .all(|t| t.key == VNODE_TAINT)
}

async fn lease(h: &Harness, name: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(h.client(), "kube-node-lease")
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// A pod spec for the virtual nodes: it tolerates their taint, and `placement` (a nodeSelector
/// or an affinity) keeps it on the test's own nodes.
fn pod_spec(placement: &Value) -> Value {
    let mut spec = json!({
        "tolerations": [{"key": VNODE_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
    });
    for (key, value) in placement.as_object().unwrap() {
        spec[key] = value.clone();
    }
    spec
}

/// Placement on one node.
fn on_node(node: &str) -> Value {
    json!({"nodeSelector": {"kubernetes.io/hostname": node}})
}

/// Placement on any of `nodes`.
fn on_any_of(nodes: &[String]) -> Value {
    json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes},
        ]}],
    }}}})
}

/// A bare pod (no controller: nothing recreates it).
async fn create_bare_pod(
    h: &Harness,
    ns: &str,
    name: &str,
    placement: &Value,
) -> Result<(), HarnessError> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": pod_spec(placement),
    }))
    .unwrap();
    Api::<Pod>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

fn workload(name: &str, replicas: i32, spec: &Value) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    })
}

async fn create_deployment(
    h: &Harness,
    ns: &str,
    name: &str,
    replicas: i32,
    spec: &Value,
) -> Result<(), HarnessError> {
    let deployment: Deployment = serde_json::from_value(workload(name, replicas, spec)).unwrap();
    Api::<Deployment>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    Ok(())
}

async fn create_replica_set(
    h: &Harness,
    ns: &str,
    name: &str,
    replicas: i32,
    spec: &Value,
) -> Result<(), HarnessError> {
    let set: ReplicaSet = serde_json::from_value(workload(name, replicas, spec)).unwrap();
    Api::<ReplicaSet>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &set)
        .await?;
    Ok(())
}

async fn pods(h: &Harness, ns: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(h.client(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn node_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

async fn wait_all_running(h: &Harness, ns: &str, count: usize) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("{count} pods running in {ns}"),
        WAIT,
        |h| async move {
            let pods = pods(h, ns).await;
            pods.len() == count
                && pods
                    .iter()
                    .all(|p| running(p) && p.metadata.deletion_timestamp.is_none())
        },
    )
    .await
}

async fn groups(h: &Harness) -> Vec<Value> {
    mock_admin::groups(&h.mock_eci().unwrap().admin)
        .await
        .unwrap()
}

async fn group_ids(h: &Harness) -> BTreeSet<String> {
    groups(h)
        .await
        .iter()
        .map(|g| {
            g["container_group_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Pod uids that have a group, and the pods' uids: equal when nothing leaked or went missing.
async fn groups_match_pods(h: &Harness, ns: &str) -> bool {
    let grouped: BTreeSet<String> = groups(h)
        .await
        .iter()
        .map(|g| mock_admin::tag(g, TAG_POD_UID).to_owned())
        .collect();
    let pods: BTreeSet<String> = pods(h, ns)
        .await
        .iter()
        .filter_map(ResourceExt::uid)
        .collect();
    grouped == pods
}

/// The events this test's replicas published with `reason` (other tests share the cluster).
async fn events_with_reason(h: &Harness, reason: &str) -> Vec<Event> {
    let ours = format!("{}-", h.daemon_set_name());
    Api::<Event>::all(h.client())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.reporting_instance
                    .as_deref()
                    .is_some_and(|i| i.starts_with(&ours))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_drains_the_highest_replica_honours_budgets_and_leaves_nothing_behind() {
    run_scenario(async |h| {
        let ns = h.create_namespace("scale-in").await?;
        let ns = ns.as_str();
        h.start_mock_eci(FAST_MOCK).await?;
        h.create_daemon_statefulset(3).await?;
        wait_daemon_pods(h, &[0, 1, 2]).await?;
        start_replicas(h, &[0, 1, 2], &[]).await?;
        let nodes: Vec<String> = (0..3).map(|o| h.node_name(o)).collect();
        let last = h.node_name(2);

        // 30 replicas spread evenly by the scheduler over the three nodes (10 each); a node that
        // is cordoned (tainted unschedulable) leaves the spread, so replacements go elsewhere.
        let mut spec = pod_spec(&on_any_of(&nodes));
        spec["topologySpreadConstraints"] = json!([{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "nodeTaintsPolicy": "Honor",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }]);
        create_deployment(h, ns, "web", 30, &spec).await?;
        wait_all_running(h, ns, 30).await?;
        let on_last: Vec<Pod> = pods(h, ns).await.into_iter().filter(|p| node_of(p) == last).collect();
        assert_eq!(on_last.len(), 10, "the scheduler spread the replicas evenly");

        // Two of the last node's pods are guarded by a budget that allows no disruption.
        let api: Api<Pod> = Api::namespaced(h.client(), ns);
        let guarded: BTreeSet<String> = on_last.iter().take(2).map(ResourceExt::name_any).collect();
        for name in &guarded {
            api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"guard": "yes"}}})))
                .await?;
        }
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(h.client(), ns);
        budgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "guard"}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"guard": "yes"}}}})).unwrap(),
            )
            .await?;
        // The Eviction API judges by the budget's status, which the disruption controller writes.
        h.wait_for("the disruption controller to compute the budget", WAIT, |h| async move {
            let budgets: Api<PodDisruptionBudget> = Api::namespaced(h.client(), ns);
            budgets.get_opt("guard").await.ok().flatten().is_some_and(|b| {
                let generation = b.metadata.generation;
                b.status.is_some_and(|s| {
                    s.observed_generation == generation
                        && s.current_healthy == 2
                        && s.disruptions_allowed == 0
                })
            })
        })
        .await?;

        let started = Instant::now();
        h.scale_daemon_statefulset(2).await?;
        h.process(&last).unwrap().signal_term();

        // Everything but the two pods the budget protects leaves; the drain waits and says why.
        h.wait_for("the node cordoned and drained down to the guarded pods", WAIT, |h| {
            let (last, guarded) = (last.clone(), guarded.clone());
            async move {
                let left: BTreeSet<String> = pods(h, ns)
                    .await
                    .iter()
                    .filter(|p| node_of(p) == last)
                    .map(ResourceExt::name_any)
                    .collect();
                node(h, &last).await.is_some_and(|n| unschedulable(&n)) && left == guarded
            }
        })
        .await?;
        h.wait_for("the blocked evictions reported", WAIT, |h| async move {
            !events_with_reason(h, "EvictionBlocked").await.is_empty()
                && !events_with_reason(h, "DrainBlocked").await.is_empty()
        })
        .await?;
        // The evicted replicas came back on the remaining nodes.
        h.wait_for("the ReplicaSet's replacements running on the remaining nodes", WAIT, |h| {
            let last = last.clone();
            async move {
                let pods = pods(h, ns).await;
                pods.iter().filter(|p| node_of(p) != last && running(p)).count() == 28
            }
        })
        .await?;
        assert!(
            h.process(&last).unwrap().exit_status().is_none(),
            "the budget holds the decommission up"
        );
        assert!(node(h, &last).await.is_some(), "the node stays while pods are left");
        let guarded_left: BTreeSet<String> = pods(h, ns)
            .await
            .iter()
            .filter(|p| node_of(p) == last)
            .map(ResourceExt::name_any)
            .collect();
        assert_eq!(guarded_left, guarded, "the guarded pods were never evicted");

        budgets.delete("guard", &DeleteParams::default()).await?;
        let status = h.process(&last).unwrap().wait_exit(WAIT).await;
        assert!(status.is_some_and(|s| s.success()), "a finished decommission exits 0: {status:?}");
        eprintln!("decommission with 10 pods (2 held by a budget until it was deleted): {:?}", started.elapsed());
        assert!(node(h, &last).await.is_none(), "the node is deleted");
        assert!(lease(h, &last).await.is_none(), "the Lease is deleted");
        assert!(!events_with_reason(h, "Decommissioning").await.is_empty());

        wait_all_running(h, ns, 30).await?;
        assert!(pods(h, ns).await.iter().all(|p| node_of(p) != last));
        h.wait_for("mock-eci to hold exactly the groups of the remaining pods", WAIT, |h| groups_match_pods(h, ns))
            .await?;
        assert!(
            groups(h).await.iter().all(|g| mock_admin::tag(g, TAG_NODE) != last),
            "no group is left for the removed node"
        );
        Ok(())
    })
    .await;
}

/// What the restart monitor saw of the node and its Lease.
#[derive(Debug, Default)]
struct Observed {
    /// Every distinct renewTime, in order.
    renewals: Vec<k8s_openapi::jiff::Timestamp>,
    /// The holder instance at each of them.
    holders: Vec<String>,
    /// Samples in which the node was not Ready.
    not_ready: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_keeps_its_node_ready_with_the_same_uid_and_its_groups() {
    run_scenario(async |h| {
        let ns = h.create_namespace("restart").await?;
        let ns = ns.as_str();
        h.start_mock_eci(FAST_MOCK).await?;
        h.create_daemon_statefulset(1).await?;
        wait_daemon_pods(h, &[0]).await?;
        let process = start_replicas(h, &[0], &[]).await?.remove(0);
        let name = h.node_name(0);
        create_deployment(h, ns, "app", 3, &pod_spec(&on_node(&name))).await?;
        wait_all_running(h, ns, 3).await?;
        let uid = node(h, &name).await.unwrap().uid();
        let ids_before = group_ids(h).await;

        // Watch the Lease and Ready while the replica restarts.
        let observed = Arc::new(Mutex::new(Observed::default()));
        let stop = tokio_util::sync::CancellationToken::new();
        let monitor = {
            let (client, name) = (h.client(), name.clone());
            let (observed, stop) = (Arc::clone(&observed), stop.clone());
            tokio::spawn(async move {
                let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
                let nodes: Api<Node> = Api::all(client);
                while !stop.is_cancelled() {
                    if let Ok(lease) = leases.get(&name).await {
                        let holder = lease
                            .annotations()
                            .get("virtual-node-eci.aliyun.com/holder-instance")
                            .cloned()
                            .unwrap_or_default();
                        let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
                        let mut seen = observed.lock().unwrap();
                        if let Some(renewed) = renewed
                            && seen.renewals.last() != Some(&renewed)
                        {
                            seen.renewals.push(renewed);
                            seen.holders.push(holder);
                        }
                    }
                    if nodes.get(&name).await.is_ok_and(|n| !is_ready(&n)) {
                        observed.lock().unwrap().not_ready += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        h.wait_for("the monitor to see the Lease renewed", WAIT, |_| {
            let observed = Arc::clone(&observed);
            async move { observed.lock().unwrap().renewals.len() >= 3 }
        })
        .await?;
        let first_holder = observed.lock().unwrap().holders[0].clone();
        let stopping = Instant::now();
        let status = h
            .process(&process)
            .unwrap()
            .terminate(Duration::from_secs(20))
            .await;
        assert!(
            status.is_some_and(|s| s.success()),
            "a restart exits 0 promptly: {status:?}"
        );
        eprintln!(
            "restart: the old replica stopped {:?} after SIGTERM",
            stopping.elapsed()
        );
        h.start_daemon(0, FAST_DAEMON)?;
        h.wait_for("the successor to renew the Lease a few times", WAIT, |_| {
            let (observed, first_holder) = (Arc::clone(&observed), first_holder.clone());
            async move {
                let seen = observed.lock().unwrap();
                seen.holders
                    .iter()
                    .filter(|holder| **holder != first_holder)
                    .count()
                    >= 3
            }
        })
        .await?;
        stop.cancel();
        monitor.await.unwrap();
        let observed = std::mem::take(&mut *observed.lock().unwrap());
        let gap = observed
            .renewals
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).unsigned_abs())
            .max()
            .unwrap_or_default();
        eprintln!(
            "restart: longest gap between two Lease renewals {gap:?} over {} renewals",
            observed.renewals.len()
        );
        assert_eq!(observed.not_ready, 0, "the node never turned NotReady");
        assert!(
            gap < Duration::from_secs(8),
            "the successor renewed within the Lease duration: {gap:?}"
        );
        let after = node(h, &name).await.unwrap();
        assert_eq!(after.uid(), uid, "the same Node object");
        assert!(!unschedulable(&after));
        let ids_after = group_ids(h).await;
        assert_eq!(
            ids_before, ids_after,
            "the groups were adopted, not recreated"
        );
        wait_all_running(h, ns, 3).await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_lost_without_drain_leaves_no_group_once_its_pods_are_gone() {
    run_scenario(async |h| {
        let ns = h.create_namespace("lost").await?;
        let ns = ns.as_str();
        h.start_mock_eci(FAST_MOCK).await?;
        start_replicas(h, &[0, 1], &[("ORPHAN_GC_INTERVAL", "1s")]).await?;
        let (kept, lost) = (h.node_name(0), h.node_name(1));
        for i in 0..6 {
            let node = if i < 2 { &kept } else { &lost };
            create_bare_pod(h, ns, &format!("p-{i}"), &on_node(node)).await?;
        }
        wait_all_running(h, ns, 6).await?;
        h.process(&lost).unwrap().kill().await;
        Api::<Node>::all(h.client())
            .delete(&lost, &DeleteParams::default())
            .await?;

        // Node gone, pods still there: their groups stay.
        h.wait_for(
            "a collector round to see the pods of the missing node",
            WAIT,
            |h| {
                let kept = kept.clone();
                async move {
                    h.process_output(&kept)
                        .is_some_and(|o| o.contains("node is gone but its pods still exist"))
                }
            },
        )
        .await?;
        assert_eq!(
            groups(h).await.len(),
            6,
            "no group whose pod exists is deleted"
        );

        // The pod garbage collector's part: it deletes the pods bound to a Node that is gone.
        h.wait_for(
            "the pod garbage collector to delete the missing node's pods",
            POD_GC_WAIT,
            |h| {
                let lost = lost.clone();
                async move { pods(h, ns).await.iter().all(|p| node_of(p) != lost) }
            },
        )
        .await?;
        h.wait_for("the orphaned groups collected", WAIT, |h| {
            groups_match_pods(h, ns)
        })
        .await?;
        assert_eq!(groups(h).await.len(), 2);
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_under_a_live_replica_comes_back_and_removed_pods_lose_their_groups() {
    run_scenario(async |h| {
        let ns = h.create_namespace("recreated").await?;
        let ns = ns.as_str();
        h.start_mock_eci(FAST_MOCK).await?;
        start_replicas(h, &[0], &[]).await?;
        let name = h.node_name(0);
        for pod in ["a", "b"] {
            create_bare_pod(h, ns, pod, &on_node(&name)).await?;
        }
        wait_all_running(h, ns, 2).await?;
        let old_uid = node(h, &name).await.unwrap().uid();
        Api::<Node>::all(h.client())
            .delete(&name, &DeleteParams::default())
            .await?;
        h.wait_for("the node registered again and Ready", WAIT, |h| {
            let (name, old_uid) = (name.clone(), old_uid.clone());
            async move {
                node(h, &name)
                    .await
                    .is_some_and(|n| n.uid() != old_uid && is_ready(&n))
            }
        })
        .await?;
        let new_uid = node(h, &name).await.unwrap().uid();
        h.wait_for("a NodeRecreated event", WAIT, |h| async move {
            !events_with_reason(h, "NodeRecreated").await.is_empty()
        })
        .await?;
        // The garbage collector removes a Lease whose owner is gone; the replica keeps one owned
        // by the Node that exists, renewed.
        h.wait_for("the Lease owned by the new Node and renewed", WAIT, |h| {
            let (name, new_uid) = (name.clone(), new_uid.clone());
            async move {
                lease(h, &name).await.is_some_and(|l| {
                    let renewed = l
                        .spec
                        .as_ref()
                        .and_then(|s| s.renew_time.as_ref())
                        .is_some_and(|t| {
                            k8s_openapi::jiff::Timestamp::now()
                                .duration_since(t.0)
                                .unsigned_abs()
                                < Duration::from_secs(5)
                        });
                    renewed
                        && l.owner_references().first().map(|o| Some(o.uid.clone()))
                            == Some(new_uid)
                })
            }
        })
        .await?;
        // The Node is back at once, so the pod garbage collector leaves its pods alone.
        wait_all_running(h, ns, 2).await?;
        assert!(groups_match_pods(h, ns).await, "the pods kept their groups");

        // A pod removed without the replica (force-deleted, as the pod garbage collector does):
        // its group goes too.
        Api::<Pod>::namespaced(h.client(), ns)
            .delete(
                "a",
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await?;
        h.wait_for("the removed pod's group deleted", WAIT, |h| {
            groups_match_pods(h, ns)
        })
        .await?;
        assert_eq!(groups(h).await.len(), 1);
        wait_all_running(h, ns, 1).await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_drain_keeps_the_node_cordoned_scale_out_readopts_and_the_manual_runbook_works()
 {
    run_scenario(async |h| {
        let ns = h.create_namespace("runbook").await?;
        let ns = ns.as_str();
        h.start_mock_eci(FAST_MOCK).await?;
        h.create_daemon_statefulset(2).await?;
        wait_daemon_pods(h, &[0, 1]).await?;
        start_replicas(h, &[0], &[]).await?;
        let last_process = start_replicas(h, &[1], &[("DRAIN_TIMEOUT", "3s")])
            .await?
            .remove(0);
        let (first, last) = (h.node_name(0), h.node_name(1));

        // A ReplicaSet's pod, on the last node (preferred) while it is schedulable, on the first
        // otherwise; and a bare pod on the last node.
        let mut managed = pod_spec(&on_any_of(&[first.clone(), last.clone()]));
        managed["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = json!([{
            "weight": 100,
            "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [last]}]},
        }]);
        create_replica_set(h, ns, "managed", 1, &managed).await?;
        create_bare_pod(h, ns, "bare", &on_node(&last)).await?;
        wait_all_running(h, ns, 2).await?;
        assert!(
            pods(h, ns).await.iter().all(|p| node_of(p) == last),
            "both pods run on the last node"
        );
        let bare_group = groups(h)
            .await
            .into_iter()
            .find(|g| mock_admin::tag(g, TAG_POD_NAME) == "bare")
            .unwrap()["container_group_id"]
            .clone();

        // Scale in: the managed pod is evicted, the bare one is waited for until the deadline.
        h.scale_daemon_statefulset(1).await?;
        h.process(&last_process).unwrap().signal_term();
        let status = h.process(&last_process).unwrap().wait_exit(WAIT).await;
        assert!(
            status.is_some_and(|s| !s.success()),
            "an unfinished decommission is a failure: {status:?}"
        );
        let cordoned = node(h, &last).await.expect("the node stays");
        assert!(unschedulable(&cordoned));
        assert!(lease(h, &last).await.is_some(), "the Lease stays");
        assert!(
            !events_with_reason(h, "DrainWaiting").await.is_empty(),
            "the bare pod was reported"
        );
        let timed_out = events_with_reason(h, "DecommissionTimedOut").await;
        let bare_ref = format!("{ns}/bare");
        assert!(timed_out.iter().any(|e| {
            e.note
                .as_deref()
                .unwrap_or_default()
                .contains(&bare_ref)
        }));
        assert_eq!(
            pods(h, ns)
                .await
                .iter()
                .filter(|p| node_of(p) == last && p.metadata.deletion_timestamp.is_none())
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>(),
            ["bare"],
            "the managed pod was evicted from the node (gone, or still terminating if the short \
             deadline cut its graceful exit short)"
        );
        // Its ReplicaSet replaced it on the node that stays.
        h.wait_for("the managed pod's replacement running on the first node", WAIT, |h| {
            let first = first.clone();
            async move {
                pods(h, ns).await.iter().any(|p| {
                    p.labels().get("app").map(String::as_str) == Some("managed")
                        && node_of(p) == first
                        && running(p)
                })
            }
        })
        .await?;
        h.wait_for(
            "the bare pod's group kept, the evicted one's gone, the replacement's created",
            WAIT,
            |h| groups_match_pods(h, ns),
        )
        .await?;
        assert!(
            groups(h)
                .await
                .iter()
                .any(|g| g["container_group_id"] == bare_group),
            "the bare pod's group is kept"
        );

        // Scale out again: the node is served, uncordoned, and the pod adopted as it was.
        h.scale_daemon_statefulset(2).await?;
        wait_daemon_pods(h, &[1]).await?;
        let successor = h.start_daemon(1, FAST_DAEMON)?;
        h.wait_for("the node uncordoned by its replica", WAIT, |h| {
            let last = last.clone();
            async move {
                node(h, &last)
                    .await
                    .is_some_and(|n| !unschedulable(&n) && is_ready(&n))
            }
        })
        .await?;
        let adopted = groups(h)
            .await
            .into_iter()
            .find(|g| mock_admin::tag(g, TAG_POD_NAME) == "bare")
            .unwrap();
        assert_eq!(adopted["container_group_id"], bare_group);

        // The manual runbook: kubectl drain (cordon, evict — --force for the bare pod), then scale.
        let output = tokio::process::Command::new(h.kubectl())
            .arg("--kubeconfig")
            .arg(h.kubeconfig())
            .args([
                "drain",
                &last,
                "--force",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=120s",
            ])
            .output()
            .await
            .expect("kubectl runs");
        assert!(
            output.status.success(),
            "kubectl drain: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(unschedulable(&node(h, &last).await.unwrap()), "kubectl drain cordoned it");
        h.wait_for("the node empty", WAIT, |h| {
            let last = last.clone();
            async move { pods(h, ns).await.iter().all(|p| node_of(p) != last) }
        })
        .await?;
        h.scale_daemon_statefulset(1).await?;
        let stopping = Instant::now();
        let status = h.process(&successor).unwrap().terminate(WAIT).await;
        assert!(status.is_some_and(|s| s.success()), "{status:?}");
        eprintln!(
            "manual runbook: empty node removed {:?} after SIGTERM",
            stopping.elapsed()
        );
        assert!(
            node(h, &last).await.is_none(),
            "no kubectl delete node needed"
        );
        assert!(lease(h, &last).await.is_none());
        h.wait_for("mock-eci to hold exactly the groups of the remaining pods", WAIT, |h| {
            groups_match_pods(h, ns)
        })
        .await?;
        assert!(
            groups(h).await.iter().all(|g| mock_admin::tag(g, TAG_NODE) != last),
            "nothing of the removed node is left in ECI"
        );
        Ok(())
    })
    .await;
}
