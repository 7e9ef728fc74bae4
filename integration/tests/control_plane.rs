//! The control-plane fixture itself: real components come up, report the version built, run
//! the scheduler and controllers, and kwok's ECS nodes take pods.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration::cluster::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
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
