//! Scale-in benchmark: how long a replica takes to decommission a node with N pods — cordon,
//! evict every pod, delete each group gracefully, delete the pods, the Lease and the Node.
//! Real processes (the real control plane, mock-eci, two daemon replicas; release builds).
//!
//! Run: `cargo bench -p virtual-node-eci --bench decommission` (`DECOMMISSION_BENCH_PODS=100,500`
//! sets the sizes). Containers stop 1 s after SIGTERM, as a well-behaved app would.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use integration::harness::Harness;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

async fn wait_until<F: AsyncFnMut() -> bool>(what: &str, timeout: Duration, mut condition: F) {
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run(size: usize) {
    let mut h = Harness::start().await.unwrap();
    h.start_mock_eci(&[
        "--no-rate-limits",
        "--provisioning-delay",
        "200ms",
        "--ip-cidr",
        "10.0.0.0/8",
    ])
    .await
    .unwrap();
    h.create_daemon_statefulset(2).await.unwrap();
    let env = [("POD_STATUS_POLL_INTERVAL", "500ms"), ("RUST_LOG", "warn")];
    h.start_daemon(0, &env).unwrap();
    let last = h.node_name(1);
    h.start_daemon(1, &env).unwrap();
    let nodes: Api<Node> = Api::all(h.client());
    wait_until("the node", Duration::from_secs(60), async || {
        nodes.get_opt(&last).await.ok().flatten().is_some()
    })
    .await;

    let maps: Api<ConfigMap> = Api::namespaced(h.client(), "default");
    let owner = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "workload"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client(), "default");
    for i in 0..size {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("app-{i:04}"), "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "workload", "uid": owner.uid(), "controller": true}]},
            "spec": {"nodeName": last, "automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "registry.example.com/app:1", "env": [{"name": "MOCK_ECI_STOP_AFTER", "value": "1s"}]}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    wait_until("every pod running", Duration::from_secs(300), async || {
        pods.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count()
                == size
        })
    })
    .await;

    let started = Instant::now();
    h.scale_daemon_statefulset(1).await.unwrap();
    h.process(&last).unwrap().signal_term();
    wait_until("every pod gone", Duration::from_secs(600), async || {
        pods.list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await;
    let drained = started.elapsed();
    let status = h
        .process(&last)
        .unwrap()
        .wait_exit(Duration::from_secs(60))
        .await;
    let exited = started.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "the decommission exits 0"
    );
    assert!(
        nodes.get_opt(&last).await.unwrap().is_none(),
        "the node is deleted"
    );
    println!(
        "decommission of a node with {size} pods: all pods gone after {:.2}s, Node and Lease deleted and the process exited after {:.2}s",
        drained.as_secs_f64(),
        exited.as_secs_f64()
    );
    h.shutdown(Duration::from_secs(10)).await;
}

#[tokio::main]
async fn main() {
    integration::harness::build_binaries().expect("the binaries build");
    let sizes: Vec<usize> = std::env::var("DECOMMISSION_BENCH_PODS")
        .unwrap_or_else(|_| "100".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    for size in sizes {
        run(size).await;
    }
}
