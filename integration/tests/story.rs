//! The story users follow, end to end with real controllers and the real kubectl: install
//! `deploy/overlays/local`, run a Deployment on virtual nodes through the webhook and the
//! scheduler, scale the daemon StatefulSet out to 4, `kubectl drain` three virtual nodes under
//! a PodDisruptionBudget, scale in to 1 — and nothing is stranded or leaked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::time::Duration;

use integration::harness::deploy::{
    Mock, VIRTUAL_NODE_SELECTOR, apply_local_overlay, is_ready, wait_installed,
};
use integration::harness::mock_admin::{groups, tag};
use integration::harness::{ClusterKind, Harness, HarnessError};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(300);

async fn kubectl(h: &Harness, args: &[&str]) -> Result<String, HarnessError> {
    let output = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .output()
        .await
        .map_err(|source| HarnessError::Io {
            what: format!("kubectl {}", args.join(" ")),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(HarnessError::Setup(format!(
            "kubectl {} failed: {text}",
            args.join(" ")
        )))
    }
}

async fn virtual_nodes(h: &Harness) -> Vec<Node> {
    let nodes: Api<Node> = Api::all(h.client());
    nodes
        .list(&ListParams::default().labels(VIRTUAL_NODE_SELECTOR))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

async fn web_pods(h: &Harness) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(h.client(), "demo");
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// `count` web pods Running, all on nodes named in `allowed`.
async fn wait_web_running(
    h: &Harness,
    count: usize,
    allowed: &BTreeSet<String>,
) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("{count} web pods Running on {allowed:?}"),
        WAIT,
        |h| async move {
            let pods = web_pods(h).await;
            pods.len() == count
                && pods
                    .iter()
                    .all(|p| running(p) && allowed.contains(&node_of(p)))
        },
    )
    .await
}

fn live(group: &Value) -> bool {
    !matches!(
        group["status"].as_str(),
        Some("Deleted" | "Deleting" | "Expired")
    )
}

async fn story(h: &mut Harness) -> Result<(), HarnessError> {
    let version = kubectl(h, &["version"]).await?;
    assert!(
        version.contains("Server Version: v1.37.2"),
        "the server built from upstream: {version}"
    );

    apply_local_overlay(
        h.kubectl(),
        h.kubeconfig(),
        h.dir(),
        2,
        &h.placement_env(),
        Mock::InCluster(&[]),
    )
    .await?;
    let mock = wait_installed(&h.client(), 2, WAIT).await?;
    let admin = format!("http://{mock}:8080");

    kubectl(h, &["create", "namespace", "demo"]).await?;
    kubectl(
        h,
        &[
            "label",
            "namespace",
            "demo",
            "virtual-node-affinity-injection=enabled",
        ],
    )
    .await?;
    // The default ServiceAccount must exist before pods can be created.
    h.wait_for("demo's default ServiceAccount", WAIT, |h| async move {
        kubectl(h, &["-n", "demo", "get", "serviceaccount", "default"])
            .await
            .is_ok()
    })
    .await?;
    // The webhook learns namespace labels from a watch: wait until a dry run in `demo` shows
    // the label took effect, so the Deployment's pods cannot beat it.
    h.wait_for(
        "the namespace label to reach the webhook",
        WAIT,
        |h| async move {
            kubectl(
                h,
                &[
                    "-n",
                    "demo",
                    "run",
                    "probe",
                    "--image=nginx",
                    "--dry-run=server",
                    "-o",
                    "jsonpath={.spec.tolerations[*].key}",
                ],
            )
            .await
            .is_ok_and(|keys| keys.contains("k8s.aliyun.com/vnode"))
        },
    )
    .await?;
    kubectl(
        h,
        &[
            "-n",
            "demo",
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=4",
        ],
    )
    .await?;
    let first_two: BTreeSet<String> = ["virtual-node-eci-0", "virtual-node-eci-1"]
        .map(String::from)
        .into();
    wait_web_running(h, 4, &first_two).await?;
    let used: BTreeSet<String> = web_pods(h).await.iter().map(node_of).collect();
    assert_eq!(
        used, first_two,
        "kube-scheduler spreads the pods over both virtual nodes"
    );

    kubectl(
        h,
        &[
            "-n",
            "kube-system",
            "scale",
            "statefulset",
            "virtual-node-eci",
            "--replicas=4",
        ],
    )
    .await?;
    h.wait_for("four Ready virtual nodes", WAIT, |h| async move {
        let nodes = virtual_nodes(h).await;
        nodes.len() == 4 && nodes.iter().all(is_ready)
    })
    .await?;

    kubectl(
        h,
        &[
            "-n",
            "demo",
            "create",
            "poddisruptionbudget",
            "web",
            "--selector=app=web",
            "--min-available=3",
        ],
    )
    .await?;
    // Eviction only honours a budget whose status the disruption controller has computed.
    h.wait_for("the budget's status", WAIT, |h| async move {
        kubectl(
            h,
            &[
                "-n",
                "demo",
                "get",
                "pdb",
                "web",
                "-o",
                "jsonpath={.status.disruptionsAllowed}",
            ],
        )
        .await
        .is_ok_and(|allowed| allowed.trim() == "1")
    })
    .await?;
    let drained = kubectl(
        h,
        &[
            "drain",
            "virtual-node-eci-1",
            "virtual-node-eci-2",
            "virtual-node-eci-3",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=300s",
        ],
    )
    .await?;
    assert!(
        drained.contains("disruption budget"),
        "the budget made the drain wait: {drained}"
    );
    let first: BTreeSet<String> = ["virtual-node-eci-0".to_owned()].into();
    wait_web_running(h, 4, &first).await?;

    kubectl(
        h,
        &[
            "-n",
            "kube-system",
            "scale",
            "statefulset",
            "virtual-node-eci",
            "--replicas=1",
        ],
    )
    .await?;
    h.wait_for(
        "the three drained Nodes to go away by themselves",
        WAIT,
        |h| async move {
            let nodes = virtual_nodes(h).await;
            nodes.len() == 1
                && nodes[0].metadata.name.as_deref() == Some("virtual-node-eci-0")
                && is_ready(&nodes[0])
        },
    )
    .await?;
    wait_web_running(h, 4, &first).await?;

    let pods: Api<Pod> = Api::all(h.client());
    h.wait_for(
        "mock-eci to hold exactly one live group per existing pod",
        WAIT,
        |_| {
            let pods = pods.clone();
            let admin = admin.clone();
            async move {
                let uids: BTreeSet<String> = pods
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| p.metadata.uid)
                    .collect();
                let live: Vec<String> = groups(&admin)
                    .await
                    .unwrap_or_default()
                    .iter()
                    .filter(|g| live(g))
                    .map(|g| tag(g, "k8s.aliyun.com/pod-uid").to_owned())
                    .collect();
                let distinct: BTreeSet<&String> = live.iter().collect();
                live.len() == 4 && distinct.len() == 4 && live.iter().all(|u| uids.contains(u))
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_drain_under_a_budget_and_scale_in_strand_nothing() {
    let mut h = Harness::start().await.expect("the harness starts");
    // deploy/overlays/local runs the daemons as processes of the fixture's host node; on an
    // existing cluster (E2E_KUBECONFIG) this story fails here rather than pass unchecked.
    assert_eq!(
        h.kind(),
        ClusterKind::Fixture,
        "the story installs deploy/overlays/local, which needs the fixture's host node"
    );
    let result = story(&mut h).await;
    h.finish(result).await;
}
