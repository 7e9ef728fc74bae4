//! End to end: a configuration ECI refuses (credentials, RAM permissions, clock skew, arrears,
//! a proxy that is not ECI) is the node's problem. For each such answer, the node gets the
//! `EciMisconfigured` condition and the `virtual-node.eci/misconfigured:NoSchedule` taint (so
//! kube-scheduler places nothing there), a pod already bound to it stays Pending with the code
//! and the fix instead of failing, and once the configuration is fixed — the fault cleared, or
//! the mounted credentials Secret corrected — the pod runs, with no daemon restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::Path;
use std::time::Duration;

use integration::harness::{
    E2E_ACCESS_KEY_ID, E2E_ACCESS_KEY_SECRET, EciApi, Harness, HarnessError,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const CONDITION: &str = "EciMisconfigured";
const TAINT: &str = "virtual-node.eci/misconfigured";
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
];

/// The answers that mean "misconfigured", and the reason each is shown with.
const CODES: &[(&str, &str)] = &[
    ("Forbidden.RAM", "EciPermissionDenied"),
    ("Forbidden.NoPermission", "EciPermissionDenied"),
    ("InvalidAccessKeyId.NotFound", "EciCredentialsRefused"),
    ("InvalidAccessKeyId.Inactive", "EciCredentialsRefused"),
    ("SignatureDoesNotMatch", "EciCredentialsRefused"),
    ("InvalidTimeStamp.Expired", "EciClockSkew"),
    ("Account.Arrearage", "EciAccountSuspended"),
    ("SDK.ForeignResponse", "EciEndpointNotEci"),
];

async fn with_harness<F>(api: EciApi, scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let mut h = Harness::start().await.expect("the harness starts");
    h.use_eci_api(api);
    let result = scenario(&mut h).await;
    h.finish(result).await;
}

async fn node(h: &Harness, name: &str) -> Option<Value> {
    let nodes: Api<Node> = Api::all(h.client());
    nodes
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|n| serde_json::to_value(n).unwrap())
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn tainted(node: &Value) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|taints| {
        taints
            .iter()
            .any(|t| t["key"] == TAINT && t["effect"] == "NoSchedule")
    })
}

/// Waits until the node shows the misconfiguration `code` (condition and taint), and answers
/// the node.
async fn wait_misconfigured(
    h: &Harness,
    name: &str,
    code: &str,
    reason: &str,
) -> Result<Value, HarnessError> {
    h.wait_for(
        &format!("node {name}: {CONDITION}=True ({code}) and tainted"),
        WAIT,
        |h| async move {
            node(h, name).await.is_some_and(|n| {
                condition(&n, CONDITION).is_some_and(|c| {
                    c["status"] == "True"
                        && c["reason"] == reason
                        && c["message"].as_str().unwrap_or_default().contains(code)
                }) && tainted(&n)
            })
        },
    )
    .await?;
    Ok(node(h, name).await.unwrap())
}

async fn wait_configured(h: &Harness, name: &str) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("node {name}: {CONDITION}=False and untainted"),
        WAIT,
        |h| async move {
            node(h, name).await.is_some_and(|n| {
                condition(&n, CONDITION).is_some_and(|c| c["status"] == "False") && !tainted(&n)
            })
        },
    )
    .await
}

fn container() -> Value {
    json!({"name": "app", "image": "registry.example.com/app:1"})
}

/// A pod already bound to `node` (`spec.nodeName`), as one bound just before the problem began.
async fn create_bound(h: &Harness, ns: &str, name: &str, node: &str) -> Result<(), HarnessError> {
    create(h, ns, json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [container()]}})).await
}

/// A pod for kube-scheduler to place on `node` (tolerating the virtual nodes' own taint, not
/// the misconfiguration's).
async fn create_placed(h: &Harness, ns: &str, name: &str, node: &str) -> Result<(), HarnessError> {
    create(h, ns, json!({"metadata": {"name": name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "containers": [container()],
    }}))
    .await
}

async fn create(h: &Harness, ns: &str, pod: Value) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await?;
    Ok(())
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

/// Waits until the bound pod shows the misconfiguration, and checks it is Pending, not Failed.
async fn wait_pod_waiting(
    h: &Harness,
    ns: &str,
    name: &str,
    code: &str,
    reason: &str,
) -> Result<(), HarnessError> {
    let pod = h
        .wait_pod(
            ns,
            name,
            &format!("Pending with {reason} ({code})"),
            WAIT,
            |p| p["status"]["reason"] == reason,
        )
        .await?;
    assert_eq!(phase(&pod), "Pending", "{pod}");
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(code) && message.contains("Fix:"), "{pod}");
    Ok(())
}

/// Waits until kube-scheduler says the pod cannot go anywhere because of a taint (its message
/// counts untolerated taints without naming them; the pod tolerates every other taint of its
/// only candidate node, so the one it does not is ours).
async fn wait_unschedulable(h: &Harness, ns: &str, name: &str) -> Result<(), HarnessError> {
    let pod = h
        .wait_pod(
            ns,
            name,
            "unschedulable for an untolerated taint",
            WAIT,
            |p| {
                condition(p, "PodScheduled").is_some_and(|c| {
                    c["status"] == "False"
                        && c["reason"] == "Unschedulable"
                        && c["message"]
                            .as_str()
                            .unwrap_or_default()
                            .contains("untolerated taint")
                })
            },
        )
        .await?;
    assert!(pod["spec"]["nodeName"].is_null(), "{pod}");
    Ok(())
}

async fn wait_running(h: &Harness, ns: &str, name: &str) -> Result<(), HarnessError> {
    h.wait_pod(ns, name, "Running", WAIT, |p| phase(p) == "Running")
        .await?;
    Ok(())
}

async fn set_controls(admin: &str, controls: Value) {
    reqwest::Client::new()
        .patch(format!("{admin}/admin/controls"))
        .json(&controls)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

async fn each_refusal_keeps_pods_waiting_until_it_is_fixed(api: EciApi) {
    with_harness(api, async |h| {
        let ns = h.create_namespace("misconfig").await?;
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        let process = h.start_daemon(0, FAST_DAEMON)?;
        let name = h.node_name(0);
        wait_configured(h, &name).await?;
        for (i, (code, reason)) in CODES.iter().enumerate() {
            set_controls(
                &mock.admin,
                json!({"faults": {"*": {"error_rate": 1.0, "error_code": code}}}),
            )
            .await;
            let refused = wait_misconfigured(h, &name, code, reason).await?;
            let ready = condition(&refused, "Ready").unwrap();
            assert_eq!(
                ready["status"], "True",
                "ECI answers, so no eviction: {refused}"
            );

            let (bound, placed) = (format!("bound-{i}"), format!("placed-{i}"));
            create_bound(h, &ns, &bound, &name).await?;
            wait_pod_waiting(h, &ns, &bound, code, reason).await?;
            create_placed(h, &ns, &placed, &name).await?;
            wait_unschedulable(h, &ns, &placed).await?;

            set_controls(&mock.admin, json!({"faults": {"*": {"error_rate": 0.0}}})).await;
            wait_running(h, &ns, &bound).await?;
            wait_configured(h, &name).await?;
            wait_running(h, &ns, &placed).await?;
        }
        let output = h.process_output(&process).unwrap_or_default();
        assert_eq!(
            output
                .matches("virtual-node-eci is serving its node")
                .count(),
            1,
            "one daemon run throughout"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_over_the_openapi_keeps_pods_waiting_until_it_is_fixed() {
    each_refusal_keeps_pods_waiting_until_it_is_fixed(EciApi::OpenApi).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_over_grpc_keeps_pods_waiting_until_it_is_fixed() {
    each_refusal_keeps_pods_waiting_until_it_is_fixed(EciApi::Grpc).await;
}

/// Writes a version of the credentials the way kubelet updates a mounted Secret: files in a
/// new directory, the `..data` link swapped to it atomically, the names links through it.
fn mount_secret(dir: &Path, version: u32, secret: &str) {
    let data = dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("ECI_ACCESS_KEY"), E2E_ACCESS_KEY_ID).unwrap();
    std::fs::write(data.join("ECI_SECRET_KEY"), secret).unwrap();
    let staged = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..v{version}"), &staged).unwrap();
    std::fs::rename(&staged, dir.join("..data")).unwrap();
    for name in ["ECI_ACCESS_KEY", "ECI_SECRET_KEY"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

/// A rotation gone wrong and put right, both through the mounted Secret only. (A daemon that
/// starts with refused credentials reports the node the same way, but creates nothing — nor
/// marks its pods — until its start-up listing of the node's groups succeeds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_fixed_by_correcting_the_mounted_secret_without_a_restart() {
    with_harness(EciApi::OpenApi, async |h| {
        let ns = h.create_namespace("credentials").await?;
        h.start_mock_eci(FAST_MOCK).await?;
        let secret_dir = h.dir().join("eci-credentials");
        std::fs::create_dir_all(&secret_dir).unwrap();
        mount_secret(&secret_dir, 1, E2E_ACCESS_KEY_SECRET);
        let path = secret_dir.display().to_string();
        let mut env = FAST_DAEMON.to_vec();
        env.extend([
            // Unset: not the harness's static pair but the mounted Secret signs.
            ("ECI_ACCESS_KEY", ""),
            ("ECI_SECRET_KEY", ""),
            ("ECI_CREDENTIALS_PATH", path.as_str()),
        ]);
        let process = h.start_daemon(0, &env)?;
        let name = h.node_name(0);
        wait_configured(h, &name).await?;
        create_bound(h, &ns, "before", &name).await?;
        wait_running(h, &ns, "before").await?;

        // The right AccessKey id with the wrong secret: the service answers SignatureDoesNotMatch.
        mount_secret(&secret_dir, 2, "not-the-secret");
        wait_misconfigured(h, &name, "SignatureDoesNotMatch", "EciCredentialsRefused").await?;
        create_bound(h, &ns, "waiting", &name).await?;
        wait_pod_waiting(
            h,
            &ns,
            "waiting",
            "SignatureDoesNotMatch",
            "EciCredentialsRefused",
        )
        .await?;
        let before = h.pod_json(&ns, "before").await.unwrap();
        assert_eq!(
            phase(&before),
            "Running",
            "a running pod is left alone: {before}"
        );

        mount_secret(&secret_dir, 3, E2E_ACCESS_KEY_SECRET);
        wait_configured(h, &name).await?;
        wait_running(h, &ns, "waiting").await?;
        let output = h.process_output(&process).unwrap_or_default();
        assert!(
            output.contains("credentials file"),
            "the mounted Secret signed the calls"
        );
        assert_eq!(
            output
                .matches("virtual-node-eci is serving its node")
                .count(),
            1,
            "no restart"
        );
        Ok(())
    })
    .await;
}
