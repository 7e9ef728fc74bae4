//! End to end: real daemon processes against the real control plane (the test binary's, or
//! `E2E_KUBECONFIG`'s), authenticated as their ServiceAccount, and a mock-eci process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use integration::harness::{Harness, HarnessError, run_scenario};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const VNODE_TAINT: &str = "k8s.aliyun.com/vnode";

/// Runs `scenario`; on failure prints the harness dump; always cleans up.
async fn node(h: &Harness, name: &str) -> Option<Value> {
    let nodes: Api<Node> = Api::all(h.client());
    nodes
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|n| serde_json::to_value(n).unwrap())
}

fn ready(node: &Value) -> (String, String) {
    let condition = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    (
        condition["status"].as_str().unwrap_or_default().to_owned(),
        condition["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

async fn wait_ready(
    h: &Harness,
    name: &str,
    status: &str,
    reason: &str,
) -> Result<Value, HarnessError> {
    h.wait_for(
        &format!("node {name} Ready={status} ({reason})"),
        WAIT,
        |h| async move {
            node(h, name)
                .await
                .is_some_and(|n| ready(&n) == (status.to_owned(), reason.to_owned()))
        },
    )
    .await?;
    Ok(node(h, name).await.unwrap())
}

/// Waits until node `name` satisfies `check`, and answers it.
async fn wait_node(
    h: &Harness,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value, HarnessError> {
    h.wait_for(&format!("node {name}: {what}"), WAIT, |h| {
        let check = &check;
        async move { node(h, name).await.is_some_and(|n| check(&n)) }
    })
    .await?;
    Ok(node(h, name).await.unwrap())
}

async fn lease(h: &Harness, name: &str) -> Value {
    let leases: Api<Lease> = Api::namespaced(h.client(), "kube-node-lease");
    serde_json::to_value(leases.get(name).await.unwrap()).unwrap()
}

/// The value of a Kubernetes quantity ("3k", "6000", "12Gi", "500m"): the apiserver answers
/// in canonical form, not as written.
fn quantity(value: &Value) -> f64 {
    let text = value.as_str().unwrap_or_default();
    virtual_node_eci::k8s::quantity::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

const INSTANCE: &str = "virtual-node-eci.aliyun.com/holder-instance";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_give_three_ready_tainted_nodes_that_survive_restarts() {
    run_scenario(async |h| {
        h.start_mock_eci(&[]).await?;
        for ordinal in 0..3 {
            h.start_daemon(ordinal, &[])?;
        }
        for ordinal in 0..3 {
            let name = h.node_name(ordinal);
            wait_ready(h, &name, "True", "EciReachable").await?;
            // The apiserver's TaintNodesByCondition admission registers every new Node with
            // `node.kubernetes.io/not-ready:NoSchedule`, which the node lifecycle controller lifts
            // once it has seen the node Ready; then our taint is the only one.
            let ours = json!([{"key": VNODE_TAINT, "value": "true", "effect": "NoSchedule"}]);
            let node = wait_node(h, &name, "our taint and no other", |n| n["spec"]["taints"] == ours).await?;
            assert_eq!(ready(&node), ("True".to_owned(), "EciReachable".to_owned()));
            let labels = &node["metadata"]["labels"];
            assert_eq!(labels["k8s.aliyun.com/vnode"], "true");
            assert_eq!(labels["type"], "virtual-kubelet");
            assert_eq!(labels["kubernetes.io/hostname"], name.as_str());
            // The apiserver answers quantities in canonical form ("3000" comes back as "3k").
            assert_eq!(quantity(&node["status"]["capacity"]["pods"]), 3000.0, "{node}");
            assert_eq!(quantity(&node["status"]["allocatable"]["cpu"]), 6000.0, "{node}");
            assert_eq!(node["status"]["addresses"], json!([{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}]));
            // The port the harness gave this daemon's kubelet API (one per process on the host).
            let kubelet_port = h.kubelet_port(&name).expect("the harness started this daemon");
            assert_eq!(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"], kubelet_port);
            assert_eq!(lease(h, &name).await["spec"]["holderIdentity"], name.as_str());
        }

        // The Lease renews.
        let name = h.node_name(0);
        let renewed = lease(h, &name).await["spec"]["renewTime"].clone();
        h.wait_for("the Lease to be renewed", WAIT, |h| {
            let (name, renewed) = (name.clone(), renewed.clone());
            async move { lease(h, &name).await["spec"]["renewTime"] != renewed }
        })
        .await?;

        // A user's label and a cordon survive a restart of the replica; the Node keeps its uid.
        let name = h.node_name(1);
        let nodes: Api<Node> = Api::all(h.client());
        nodes.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "payments"}}, "spec": {"unschedulable": true}}))).await?;
        let uid = node(h, &name).await.unwrap()["metadata"]["uid"].clone();
        let holder = lease(h, &name).await["metadata"]["annotations"][INSTANCE].clone();
        let status = h.process(&name).unwrap().terminate(Duration::from_secs(10)).await;
        assert!(status.is_some_and(|s| s.success()), "SIGTERM ends the daemon cleanly: {status:?}");
        h.start_daemon(1, &[])?;
        h.wait_for("the restarted replica to hold the Lease", WAIT, |h| {
            let (name, holder) = (name.clone(), holder.clone());
            async move { lease(h, &name).await["metadata"]["annotations"][INSTANCE] != holder }
        })
        .await?;
        let after = wait_ready(h, &name, "True", "EciReachable").await?;
        assert_eq!(after["metadata"]["uid"], uid, "the same Node object");
        assert_eq!(after["metadata"]["labels"]["team"], "payments");
        assert_eq!(after["spec"]["unschedulable"], true);
        let taints = after["spec"]["taints"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            taints.iter().filter(|t| t["key"] == VNODE_TAINT).count(),
            1,
            "our taint, once: {taints:?}"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eci_outage_turns_the_node_not_ready_and_recovery_ready_again() {
    run_scenario(async |h| {
        h.start_mock_eci(&[]).await?;
        h.start_daemon(0, &[])?;
        let name = h.node_name(0);
        wait_ready(h, &name, "True", "EciReachable").await?;
        h.stop_mock_eci().await?;
        let down = wait_ready(h, &name, "False", "EciUnreachable").await?;
        let message = down["status"]["conditions"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains("has failed every call since"), "{message}");
        h.restart_mock_eci().await?;
        wait_ready(h, &name, "True", "EciReachable").await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_for_a_served_node_refuses_to_start() {
    run_scenario(async |h| {
        h.start_mock_eci(&[]).await?;
        h.start_daemon(0, &[])?;
        let name = h.node_name(0);
        wait_ready(h, &name, "True", "EciReachable").await?;
        let intruder = h.start_daemon(0, &[])?;
        let deadline = tokio::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = h.process(&intruder).unwrap().exit_status() {
                break status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the second process kept running"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(!status.success());
        let output = h.process(&intruder).unwrap().output();
        assert!(
            output.contains("is already served by another virtual-node-eci process"),
            "{output}"
        );
        assert!(
            h.process(&name).unwrap().exit_status().is_none(),
            "the first process still serves the node"
        );
        Ok(())
    })
    .await;
}
