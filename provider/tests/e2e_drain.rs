//! End to end: scaling the daemon StatefulSet in and out, restarts, deleted nodes and the
//! cluster-wide orphan collector — with real daemon and mock-eci processes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use integration::harness::{Harness, HarnessError};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("DRAIN_TIMEOUT", "120s"),
];
const NS: &str = "default";

async fn with_harness<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let mut h = Harness::start().await.expect("the harness starts");
    let result = scenario(&mut h).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    h.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}

fn env_with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env: Vec<(&str, &str)> = FAST_DAEMON.to_vec();
    env.extend_from_slice(extra);
    env
}

async fn start_replicas(
    h: &mut Harness,
    ordinals: &[u32],
    extra: &[(&str, &str)],
) -> Result<(), HarnessError> {
    for ordinal in ordinals {
        h.start_daemon(*ordinal, &env_with(extra))?;
    }
    for ordinal in ordinals {
        let name = h.node_name(*ordinal);
        h.wait_for(&format!("node {name} Ready"), WAIT, |h| {
            let name = name.clone();
            async move { node(h, &name).await.is_some_and(|n| is_ready(&n)) }
        })
        .await?;
    }
    Ok(())
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

async fn lease(h: &Harness, name: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(h.client(), "kube-node-lease")
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// The owner that makes test pods "managed" for the drain (any controller reference does, as
/// for `kubectl drain`); a ConfigMap keeps it alive on any cluster.
async fn workload_owner(h: &Harness) -> Result<Value, HarnessError> {
    let maps: Api<ConfigMap> = Api::namespaced(h.client(), NS);
    let owner = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "workload"}})).unwrap(),
        )
        .await?;
    Ok(
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "workload", "uid": owner.uid(), "controller": true}]),
    )
}

fn mk_pod(name: &str, node: &str, labels: &Value, owners: Option<&Value>) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
        },
    });
    if let Some(owners) = owners {
        pod["metadata"]["ownerReferences"] = owners.clone();
    }
    serde_json::from_value(pod).unwrap()
}

async fn create_pod(h: &Harness, pod: &Pod) -> Result<(), HarnessError> {
    Api::<Pod>::namespaced(h.client(), NS)
        .create(&PostParams::default(), pod)
        .await?;
    Ok(())
}

async fn pods(h: &Harness) -> Vec<Pod> {
    Api::<Pod>::namespaced(h.client(), NS)
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

async fn wait_all_running(h: &Harness, count: usize) -> Result<(), HarnessError> {
    h.wait_for(&format!("{count} pods running"), WAIT, |h| async move {
        let pods = pods(h).await;
        pods.len() == count && pods.iter().all(running)
    })
    .await
}

async fn groups(h: &Harness) -> Vec<Value> {
    let admin = h.mock_eci().unwrap().admin;
    reqwest::get(format!("{admin}/admin/groups"))
        .await
        .unwrap()
        .json()
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

fn group_tag(group: &Value, key: &str) -> String {
    group["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["key"] == key)
        .and_then(|t| t["value"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Pod uids that have a group, and the pods' uids: equal when nothing leaked or went missing.
async fn groups_match_pods(h: &Harness) -> bool {
    let grouped: BTreeSet<String> = groups(h)
        .await
        .iter()
        .map(|g| group_tag(g, "k8s.aliyun.com/pod-uid"))
        .collect();
    let pods: BTreeSet<String> = pods(h).await.iter().filter_map(ResourceExt::uid).collect();
    grouped == pods
}

async fn events_with_reason(h: &Harness, reason: &str) -> Vec<Event> {
    Api::<Event>::all(h.client())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_drains_the_highest_replica_honours_budgets_and_leaves_nothing_behind() {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        h.create_daemon_statefulset(3).await?;
        start_replicas(h, &[0, 1, 2], &[]).await?;
        let owners = workload_owner(h).await?;
        let last = h.node_name(2);
        for i in 0..30 {
            let guarded = i == 2 || i == 5; // both on the last node
            let labels = json!({"app": "web", "guard": if guarded { "yes" } else { "no" }});
            create_pod(h, &mk_pod(&format!("web-{i:02}"), &h.node_name(i % 3), &labels, Some(&owners))).await?;
        }
        wait_all_running(h, 30).await?;
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(h.client(), NS);
        budgets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "guard"}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"guard": "yes"}}}})).unwrap(),
            )
            .await?;

        // A ReplicaSet's part: every evicted pod comes back on a remaining node.
        let replacer = {
            let (client, last, targets) = (h.client(), last.clone(), [h.node_name(0), h.node_name(1)]);
            let owners = owners.clone();
            tokio::spawn(async move {
                let api: Api<Pod> = Api::namespaced(client, NS);
                let mut replaced = BTreeSet::new();
                loop {
                    for pod in api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
                        let name = pod.name_any();
                        if node_of(&pod) == last && pod.metadata.deletion_timestamp.is_some() && replaced.insert(name.clone()) {
                            let labels = serde_json::to_value(pod.labels()).unwrap();
                            let target = &targets[replaced.len() % 2];
                            let _ = api.create(&PostParams::default(), &mk_pod(&format!("{name}-moved"), target, &labels, Some(&owners))).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };

        let started = Instant::now();
        h.scale_daemon_statefulset(2).await?;
        h.process(&last).unwrap().signal_term();

        // Everything but the two pods the budget protects leaves; the drain waits and says why.
        h.wait_for("the node cordoned and drained down to the guarded pods", WAIT, |h| {
            let last = last.clone();
            async move {
                let left: Vec<Pod> = pods(h).await.into_iter().filter(|p| node_of(p) == last).collect();
                node(h, &last).await.is_some_and(|n| unschedulable(&n))
                    && left.len() == 2
                    && left.iter().all(|p| p.labels().get("guard").map(String::as_str) == Some("yes"))
            }
        })
        .await?;
        h.wait_for("the blocked evictions reported", WAIT, |h| async move {
            !events_with_reason(h, "EvictionBlocked").await.is_empty()
                && !events_with_reason(h, "DrainBlocked").await.is_empty()
        })
        .await?;
        assert!(
            h.process(&last).unwrap().exit_status().is_none(),
            "the budget holds the decommission up"
        );
        assert!(node(h, &last).await.is_some(), "the node stays while pods are left");

        budgets.delete("guard", &DeleteParams::default()).await?;
        let status = h.process(&last).unwrap().wait_exit(WAIT).await;
        assert!(status.is_some_and(|s| s.success()), "a finished decommission exits 0: {status:?}");
        eprintln!("decommission with 10 pods (2 held by a budget until it was deleted): {:?}", started.elapsed());
        assert!(node(h, &last).await.is_none(), "the node is deleted");
        assert!(lease(h, &last).await.is_none(), "the Lease is deleted");
        assert!(!events_with_reason(h, "Decommissioning").await.is_empty());

        wait_all_running(h, 30).await?;
        replacer.abort();
        assert!(pods(h).await.iter().all(|p| node_of(p) != last));
        h.wait_for("mock-eci to hold exactly the groups of the remaining pods", WAIT, groups_match_pods)
            .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_keeps_its_node_ready_with_the_same_uid_and_its_groups() {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        h.create_daemon_statefulset(1).await?;
        start_replicas(h, &[0], &[]).await?;
        let name = h.node_name(0);
        let owners = workload_owner(h).await?;
        for i in 0..3 {
            create_pod(
                h,
                &mk_pod(
                    &format!("app-{i}"),
                    &name,
                    &json!({"app": "a"}),
                    Some(&owners),
                ),
            )
            .await?;
        }
        wait_all_running(h, 3).await?;
        let uid = node(h, &name).await.unwrap().uid();
        let ids_before = group_ids(h).await;

        // Watch the Lease and Ready while the replica restarts.
        let monitor = {
            let (client, name) = (h.client(), name.clone());
            tokio::spawn(async move {
                let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
                let nodes: Api<Node> = Api::all(client);
                let (mut renewals, mut not_ready) = (Vec::new(), 0);
                for _ in 0..400 {
                    if let Ok(lease) = leases.get(&name).await {
                        let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
                        if let Some(renewed) = renewed
                            && renewals.last() != Some(&renewed)
                        {
                            renewals.push(renewed);
                        }
                    }
                    if nodes.get(&name).await.is_ok_and(|n| !is_ready(&n)) {
                        not_ready += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (renewals, not_ready)
            })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let stopping = Instant::now();
        let status = h
            .process(&name)
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
        let (renewals, not_ready) = monitor.await.unwrap();
        let gap = renewals
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).unsigned_abs())
            .max()
            .unwrap_or_default();
        eprintln!(
            "restart: longest gap between two Lease renewals {gap:?} over {} renewals",
            renewals.len()
        );
        assert_eq!(not_ready, 0, "the node never turned NotReady");
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
        wait_all_running(h, 3).await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_lost_without_drain_leaves_no_group_once_its_pods_are_gone() {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        start_replicas(h, &[0, 1], &[("ORPHAN_GC_INTERVAL", "1s")]).await?;
        let (kept, lost) = (h.node_name(0), h.node_name(1));
        let owners = workload_owner(h).await?;
        for i in 0..6 {
            let node = if i < 2 { &kept } else { &lost };
            create_pod(
                h,
                &mk_pod(&format!("p-{i}"), node, &json!({"app": "a"}), Some(&owners)),
            )
            .await?;
        }
        wait_all_running(h, 6).await?;
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

        // The pod garbage collector's part: force-delete them.
        let api: Api<Pod> = Api::namespaced(h.client(), NS);
        for pod in pods(h).await.iter().filter(|p| node_of(p) == lost) {
            api.delete(
                &pod.name_any(),
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await?;
        }
        h.wait_for("the orphaned groups collected", WAIT, |h| {
            groups_match_pods(h)
        })
        .await?;
        assert_eq!(groups(h).await.len(), 2);
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_under_a_live_replica_comes_back_and_removed_pods_lose_their_groups() {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        start_replicas(h, &[0], &[]).await?;
        let name = h.node_name(0);
        let owners = workload_owner(h).await?;
        for pod in ["a", "b"] {
            create_pod(h, &mk_pod(pod, &name, &json!({"app": "a"}), Some(&owners))).await?;
        }
        wait_all_running(h, 2).await?;
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
        h.wait_for("the Lease owned by the new Node", WAIT, |h| {
            let (name, new_uid) = (name.clone(), new_uid.clone());
            async move {
                lease(h, &name).await.is_some_and(|l| {
                    l.metadata
                        .owner_references
                        .unwrap_or_default()
                        .first()
                        .map(|o| Some(o.uid.clone()))
                        == Some(new_uid)
                })
            }
        })
        .await?;

        // The pod garbage collector removes a pod of the deleted node: its group goes too.
        Api::<Pod>::namespaced(h.client(), NS)
            .delete(
                "a",
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await?;
        h.wait_for("the removed pod's group deleted", WAIT, |h| {
            groups_match_pods(h)
        })
        .await?;
        assert_eq!(groups(h).await.len(), 1);
        wait_all_running(h, 1).await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_drain_keeps_the_node_cordoned_scale_out_readopts_and_the_manual_runbook_works()
 {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        h.create_daemon_statefulset(2).await?;
        start_replicas(h, &[0], &[]).await?;
        start_replicas(h, &[1], &[("DRAIN_TIMEOUT", "3s")]).await?;
        let last = h.node_name(1);
        let owners = workload_owner(h).await?;
        create_pod(
            h,
            &mk_pod("managed", &last, &json!({"app": "a"}), Some(&owners)),
        )
        .await?;
        create_pod(h, &mk_pod("bare", &last, &json!({"app": "b"}), None)).await?;
        wait_all_running(h, 2).await?;
        let bare_group = groups(h)
            .await
            .into_iter()
            .find(|g| group_tag(g, "k8s.aliyun.com/pod-name") == "bare")
            .unwrap()["container_group_id"]
            .clone();

        // Scale in: the managed pod is evicted, the bare one is waited for until the deadline.
        h.scale_daemon_statefulset(1).await?;
        h.process(&last).unwrap().signal_term();
        let status = h.process(&last).unwrap().wait_exit(WAIT).await;
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
        assert!(timed_out.iter().any(|e| {
            e.note
                .as_deref()
                .unwrap_or_default()
                .contains("default/bare")
        }));
        assert_eq!(
            pods(h)
                .await
                .iter()
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>(),
            ["bare"]
        );
        assert!(
            groups_match_pods(h).await,
            "the bare pod's group is kept, the evicted one's is gone"
        );

        // Scale out again: the node is served, uncordoned, and the pod adopted as it was.
        h.scale_daemon_statefulset(2).await?;
        h.start_daemon(1, FAST_DAEMON)?;
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
            .find(|g| group_tag(g, "k8s.aliyun.com/pod-name") == "bare")
            .unwrap();
        assert_eq!(adopted["container_group_id"], bare_group);

        // The manual runbook: kubectl drain (cordon, evict — --force for the bare pod), then scale.
        Api::<Node>::all(h.client())
            .patch(
                &last,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await?;
        Api::<Pod>::namespaced(h.client(), NS)
            .evict("bare", &EvictParams::default())
            .await?;
        h.wait_for("the node empty", WAIT, |h| async move {
            pods(h).await.is_empty()
        })
        .await?;
        h.scale_daemon_statefulset(1).await?;
        let name = format!("{last}.1");
        let stopping = Instant::now();
        let status = h.process(&name).unwrap().terminate(WAIT).await;
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
        assert!(groups(h).await.is_empty());
        Ok(())
    })
    .await;
}
