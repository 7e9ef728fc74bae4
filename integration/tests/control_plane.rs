//! The control-plane fixture itself: real components come up, report the version built, run
//! the scheduler and controllers, and kwok's ECS nodes take pods.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use integration::cluster::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use serde_json::json;

async fn eventually<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

#[tokio::test]
async fn real_components_schedule_a_deployment_onto_kwok_ecs_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = ControlPlaneOptions::new(dir.path());
    options.ecs_nodes = 2;
    let plane = ControlPlane::start(options)
        .await
        .expect("control plane starts");
    let client = plane.client().await.unwrap();

    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.37.2", "the stamped version");
    let kubectl = plane.upstream().path("kubectl").unwrap().to_owned();
    let output = std::process::Command::new(&kubectl)
        .args(["version", "-o", "json", "--kubeconfig"])
        .arg(plane.kubeconfig())
        .output()
        .unwrap();
    let reported: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reported["serverVersion"]["gitVersion"], "v1.37.2");
    assert_eq!(reported["clientVersion"]["gitVersion"], "v1.37.2");

    let nodes: Api<Node> = Api::all(client.clone());
    eventually("two Ready ECS nodes", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            let list = nodes.list(&ListParams::default()).await.unwrap();
            list.items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count()
                == 2
        }
    })
    .await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually(
        "three Running pods placed by the scheduler on ecs nodes",
        Duration::from_secs(90),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app=web"))
                    .await
                    .unwrap();
                list.items.len() == 3
                    && list.items.iter().all(|p| {
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.as_deref())
                            .is_some_and(|n| n.starts_with("ecs-"))
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
            }
        },
    )
    .await;
    plane.stop(Duration::from_secs(10)).await;
}

/// Issue 44: kwok's ECS nodes must stay alive in the node lifecycle controller's eyes. The
/// fixture runs kwok's `heartbeat-with-lease` stage, which writes the node status only every
/// ~10 minutes and leaves liveness to the node's Lease; without a Lease the controller marks
/// the node unreachable one grace period after start, taints it and sets its pods unready.
/// A pod on `ecs-0` must therefore stay Ready, and its node Ready and untainted, for three
/// node-monitor grace periods, watched without a gap.
#[tokio::test]
async fn a_pod_on_an_ecs_node_stays_ready_across_three_node_monitor_grace_periods() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = ControlPlaneOptions::new(dir.path());
    options.ecs_nodes = 1;
    let grace = options.node_monitor_grace;
    let plane = ControlPlane::start(options)
        .await
        .expect("control plane starts");
    let client = plane.client().await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "steady"},
        "spec": {
            "nodeName": "ecs-0",
            "containers": [{"name": "web", "image": "nginx"}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ready = |pod: Option<&Pod>| pod.is_some_and(pod_is_ready);
    tokio::time::timeout(
        Duration::from_secs(90),
        await_condition(pods.clone(), "steady", ready),
    )
    .await
    .expect("the pod on ecs-0 becomes Ready within 90 s")
    .unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    hold_ready(pods, nodes, "steady", "ecs-0", grace * 3).await;

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = leases.get("ecs-0").await.expect("ecs-0 has a node Lease");
    let renewed = lease.spec.and_then(|s| s.renew_time).expect("a renew time");
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed.0);
    assert!(
        age.as_secs_f64() < grace.as_secs_f64(),
        "ecs-0's Lease was last renewed {age:?} ago, longer than the grace period {grace:?}"
    );
    plane.stop(Duration::from_secs(10)).await;
}

/// What one of the two watches saw.
enum Seen {
    Pod(Option<Box<Pod>>),
    Node(Option<Box<Node>>),
}

/// Watches the pod and its node for `span` and panics on the first state in which the pod is
/// not Ready, the node is not Ready or the node carries the unreachable taint. Each watch
/// starts with the object's current state, so the hold checks both at once as well.
async fn hold_ready(pods: Api<Pod>, nodes: Api<Node>, pod: &str, node: &str, span: Duration) {
    let pod_states = watcher::watch_object(pods, pod).map_ok(|p| Seen::Pod(p.map(Box::new)));
    let node_states = watcher::watch_object(nodes, node).map_ok(|n| Seen::Node(n.map(Box::new)));
    let mut seen = std::pin::pin!(futures::stream::select(pod_states, node_states));
    let start = tokio::time::Instant::now();
    let (mut pod_states_seen, mut node_states_seen) = (0_u32, 0_u32);
    while let Ok(next) = tokio::time::timeout_at(start + span, seen.next()).await {
        let elapsed = start.elapsed();
        match next.expect("the watches run until dropped") {
            Err(error) => eprintln!("a watch failed and restarts with a fresh list: {error}"),
            Ok(Seen::Pod(state)) => {
                pod_states_seen += 1;
                let state = state.unwrap_or_else(|| panic!("{pod} vanished after {elapsed:?}"));
                let conditions = state.status.as_ref().and_then(|s| s.conditions.as_ref());
                assert!(
                    pod_is_ready(&state),
                    "{pod} turned not Ready after {elapsed:?} of the hold: {conditions:?}"
                );
            }
            Ok(Seen::Node(state)) => {
                node_states_seen += 1;
                let state = state.unwrap_or_else(|| panic!("{node} vanished after {elapsed:?}"));
                let status = state.status.as_ref();
                let conditions = status.and_then(|s| s.conditions.as_ref());
                assert!(
                    conditions.is_some_and(|c| ready_in(c.iter().map(|c| (&c.type_, &c.status)))),
                    "{node} turned not Ready after {elapsed:?} of the hold: {conditions:?}"
                );
                let taints = state.spec.as_ref().and_then(|s| s.taints.as_ref());
                assert!(
                    !taints.is_some_and(|t| t.iter().any(|t| t.key == UNREACHABLE)),
                    "{node} was tainted unreachable after {elapsed:?} of the hold: {taints:?}"
                );
            }
        }
    }
    assert!(
        pod_states_seen > 0 && node_states_seen > 0,
        "both watches delivered the current state ({pod_states_seen} pod, {node_states_seen} node)"
    );
}

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

fn pod_is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| ready_in(c.iter().map(|c| (&c.type_, &c.status))))
}

/// Whether a list of (type, status) conditions has `Ready=True`.
fn ready_in<'a>(mut conditions: impl Iterator<Item = (&'a String, &'a String)>) -> bool {
    conditions.any(|(kind, status)| kind == "Ready" && status == "True")
}
