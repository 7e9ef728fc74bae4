//! Smoke test of the end-to-end harness: the real control plane (the test binary's, or
//! `E2E_KUBECONFIG`'s) and a mock-eci process, both reachable, a daemon replica registering a
//! Ready node against them as its ServiceAccount, kubectl seeing it, everything cleaned up
//! afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use eci_proto::v20180808::eci_client::EciClient;
use eci_proto::v20180808::{
    Container, CreateContainerGroupRequest, DescribeContainerGroupsRequest,
};
use integration::harness::{Harness, HarnessError};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

async fn scenario(h: &mut Harness) -> Result<(), HarnessError> {
    let mock = h
        .start_mock_eci(&[
            "--provisioning-delay",
            "300ms",
            "--scheduling-delay",
            "100ms",
        ])
        .await?;

    let ns = h.create_namespace("smoke").await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(h.client(), &ns);
    let name = "e2e-smoke";
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"hello": "world"}}))
            .unwrap();
    configmaps.create(&PostParams::default(), &cm).await?;
    assert_eq!(configmaps.get(name).await?.data.unwrap()["hello"], "world");
    configmaps.delete(name, &DeleteParams::default()).await?;

    let mut eci = EciClient::connect(mock.grpc.clone())
        .await
        .map_err(|e| HarnessError::Setup(e.to_string()))?;
    let id = eci
        .create_container_group(CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg-e2e".into(),
            v_switch_id: "vsw-e2e".into(),
            container_group_name: "e2e-smoke".into(),
            container: vec![Container {
                name: "app".into(),
                image: "nginx".into(),
                ..Container::default()
            }],
            ..CreateContainerGroupRequest::default()
        })
        .await
        .map_err(|status| HarnessError::Setup(status.to_string()))?
        .into_inner()
        .container_group_id;

    // The daemon registers its node against this API and this mock-eci.
    h.start_daemon(0, &[])?;
    let node = h.node_name(0);
    h.wait_node_ready(&node, Duration::from_secs(90)).await?;

    // The built kubectl, with the harness's kubeconfig, sees the node Ready.
    let output = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(["get", "node", &node, "--no-headers"])
        .output()
        .await
        .map_err(|source| HarnessError::Io {
            what: "run kubectl".into(),
            source,
        })?;
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kubectl get node: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        listed
            .split_whitespace()
            .take(2)
            .eq([node.as_str(), "Ready"]),
        "{listed}"
    );

    h.wait_for(
        "the container group to run",
        Duration::from_secs(60),
        |_| {
            let (mut eci, id) = (eci.clone(), id.clone());
            async move {
                let groups = eci
                    .describe_container_groups(DescribeContainerGroupsRequest {
                        region_id: "cn-hangzhou".into(),
                        container_group_ids: vec![id],
                        ..DescribeContainerGroupsRequest::default()
                    })
                    .await;
                groups.is_ok_and(|r| {
                    r.into_inner()
                        .container_groups
                        .first()
                        .is_some_and(|g| g.status == "Running")
                })
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_runs_the_api_and_mock_eci_as_processes() {
    let mut h = Harness::start().await.expect("the harness starts");
    let result = scenario(&mut h).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    let dir = h.dir().to_owned();
    h.shutdown(Duration::from_secs(5)).await;
    result.unwrap();
    assert!(!dir.exists(), "the harness removes its files");
}
