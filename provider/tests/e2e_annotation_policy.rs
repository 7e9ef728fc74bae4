//! End to end on the real control plane: the administrators' say over who runs what here.
//! Under an annotation policy (ConfigMap) and a namespace scope (`NAMESPACE_SELECTOR`), a pod
//! with a restricted annotation in a namespace the policy does not allow, and a plain pod of a
//! namespace outside the scope, stay Pending with a condition and a Warning Event, and mock-eci
//! never gets a group for them; labelling their namespaces lets them run, with no restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use integration::harness::mock_admin;
use integration::harness::{Harness, HarnessError};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const RAM_ROLE: &str = "k8s.aliyun.com/eci-ram-role-name";
const TRUSTED: &str = "e2e.virtual-node-eci/trusted";
const SERVED: &str = "e2e.virtual-node-eci/served";

fn pod(name: &str, node: &str, annotations: &Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
        },
    }))
    .unwrap()
}

async fn label(h: &Harness, ns: &str, key: &str, value: &str) -> Result<(), HarnessError> {
    let namespaces: Api<Namespace> = Api::all(h.client());
    let patch = json!({"metadata": {"labels": {key: value}}});
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// mock-eci's groups carrying `uid` as their pod-UID tag.
async fn groups_of(admin: &str, uid: &str) -> usize {
    let groups = mock_admin::groups(admin).await.unwrap();
    groups
        .iter()
        .filter(|g| mock_admin::tag(g, "k8s.aliyun.com/pod-uid") == uid)
        .count()
}

/// Waits until the pod is Pending with `reason` on its condition and a Warning Event with
/// that reason naming `naming`, then checks mock-eci holds no group for it; returns its UID.
async fn wait_refused(
    h: &Harness,
    admin: &str,
    ns: &str,
    name: &str,
    reason: &str,
    naming: &str,
) -> Result<String, HarnessError> {
    let refused = h
        .wait_refused((ns, name), "Pending", reason, &[naming], WAIT)
        .await?;
    let uid = refused["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(
        groups_of(admin, &uid).await,
        0,
        "no group for refused pod {name}"
    );
    Ok(uid)
}

async fn wait_running(h: &Harness, ns: &str, name: &str) -> Result<(), HarnessError> {
    h.wait_pod(ns, name, "Running", WAIT, |p| {
        p["status"]["phase"] == "Running"
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pods_wait_with_a_reason_and_run_once_their_namespace_is_allowed() {
    let mut h = Harness::start().await.expect("the harness starts");
    let policy_name = format!("{}-annotation-policy", h.daemon_set_name());
    let result = scenario(&mut h, &policy_name).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(h.client(), "kube-system");
    let _ = config_maps
        .delete(&policy_name, &DeleteParams::default())
        .await;
    h.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}

async fn scenario(h: &mut Harness, policy_name: &str) -> Result<(), HarnessError> {
    let tenant = h.create_namespace("tenant").await?;
    let outside = h.create_namespace("outside").await?;
    label(h, &tenant, SERVED, "yes").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(h.client(), "kube-system");
    let policy: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "data": {
            "eci-ram-role-name": format!("{TRUSTED}=true"),
            "eci-security-group": format!("{TRUSTED}=true"),
        },
    }))
    .unwrap();
    config_maps.create(&PostParams::default(), &policy).await?;
    let mock = h
        .start_mock_eci(&[
            "--provisioning-delay",
            "300ms",
            "--scheduling-delay",
            "50ms",
        ])
        .await?;
    let served = format!("{SERVED}=yes");
    h.start_daemon(
        0,
        &[
            ("POD_STATUS_POLL_INTERVAL", "250ms"),
            ("POD_RESYNC_INTERVAL", "2s"),
            ("ANNOTATION_POLICY_CONFIGMAP", policy_name),
            ("NAMESPACE_SELECTOR", &served),
        ],
    )?;
    let node = h.node_name(0);
    let (tenant_pods, outside_pods): (Api<Pod>, Api<Pod>) = (
        Api::namespaced(h.client(), &tenant),
        Api::namespaced(h.client(), &outside),
    );
    let create = PostParams::default();
    // An unrestricted pod of a served namespace runs as before.
    tenant_pods
        .create(&create, &pod("plain", &node, &json!({})))
        .await?;
    tenant_pods
        .create(
            &create,
            &pod("role", &node, &json!({RAM_ROLE: "admin-role"})),
        )
        .await?;
    outside_pods
        .create(&create, &pod("outsider", &node, &json!({})))
        .await?;
    wait_running(h, &tenant, "plain").await?;
    let role = wait_refused(
        h,
        &mock.admin,
        &tenant,
        "role",
        "AnnotationNotAllowed",
        RAM_ROLE,
    )
    .await?;
    let outsider = wait_refused(
        h,
        &mock.admin,
        &outside,
        "outsider",
        "NamespaceNotServed",
        &outside,
    )
    .await?;
    // Labelling the namespaces (an administrator's act) lets both run, judged again on the
    // label change alone.
    label(h, &tenant, TRUSTED, "true").await?;
    label(h, &outside, SERVED, "yes").await?;
    wait_running(h, &tenant, "role").await?;
    wait_running(h, &outside, "outsider").await?;
    assert_eq!(groups_of(&mock.admin, &role).await, 1);
    assert_eq!(groups_of(&mock.admin, &outsider).await, 1);
    let running = h.pod_json(&tenant, "role").await.unwrap();
    assert!(
        running["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|c| c["type"] != "ContainerInstanceCreated" || c["status"] != "False"),
        "the refusal's condition is gone once the group runs: {}",
        running["status"]
    );
    Ok(())
}
