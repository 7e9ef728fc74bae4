//! The product installed as a user installs it: `kubectl apply -k` of `deploy/overlays/local`
//! (mock-eci and the virtual-node-eci StatefulSet on the fixture's host node), then waits for
//! mock-eci and the virtual nodes. Used by the playground and the end-to-end story.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, ListParams, PostParams};

use super::HarnessError;

/// The label every virtual node carries.
pub const VIRTUAL_NODE_SELECTOR: &str = "type=virtual-kubelet";

/// Where mock-eci runs.
#[derive(Debug, Clone, Copy)]
pub enum Mock<'a> {
    /// The overlay's Deployment, with this environment added to its container (the
    /// playground turns on its echo listeners this way).
    InCluster(&'a [(String, String)]),
    /// Outside the cluster: the Deployment and Service are left out, and the daemons reach
    /// the mock-eci the caller runs (`env` names it in `ECI_BACKEND`), as the playground's
    /// real-runtime mode does.
    Outside,
}

/// Writes a kustomization in `dir` over `deploy/overlays/local` with `replicas` daemon replicas
/// and `env` set in the daemon's container (added, or replacing the manifest's value), mock-eci
/// where `mock` says, and applies it with `kubectl`.
pub async fn apply_local_overlay(
    kubectl: &Path,
    kubeconfig: &Path,
    dir: &Path,
    replicas: u32,
    env: &[(String, String)],
    mock: Mock<'_>,
) -> Result<(), HarnessError> {
    let (overlay, local) = overlay_paths(dir)?;
    let mut kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [local],
        "replicas": [{"name": "virtual-node-eci", "count": replicas}],
    });
    let patches = overlay_patches(env, mock);
    if !patches.is_empty() {
        kustomization["patches"] = serde_json::Value::Array(patches);
    }
    // JSON is YAML.
    std::fs::write(
        overlay.join("kustomization.yaml"),
        kustomization.to_string(),
    )
    .map_err(io("write the overlay"))?;
    kubectl_apply_k(kubectl, kubeconfig, &overlay).await
}

/// Maps an I/O error to [`HarnessError::Io`] saying `what` failed.
fn io(what: &str) -> impl FnOnce(std::io::Error) -> HarnessError {
    let what = what.to_owned();
    move |source| HarnessError::Io { what, source }
}

/// Creates the overlay's directory under `dir`; answers it (canonical) and
/// `deploy/overlays/local` as a path relative to it.
fn overlay_paths(dir: &Path) -> Result<(PathBuf, String), HarnessError> {
    let overlay = dir.join("overlay");
    std::fs::create_dir_all(&overlay).map_err(io("create the overlay directory"))?;
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/overlays/local");
    let local = std::fs::canonicalize(&local).map_err(io("find deploy/overlays/local"))?;
    let overlay = std::fs::canonicalize(&overlay).map_err(io("find the overlay directory"))?;
    // kustomize refuses absolute resource paths: climb from the overlay to / and descend.
    let climb = "../".repeat(overlay.components().count().saturating_sub(1));
    let local = format!(
        "{climb}{}",
        local.display().to_string().trim_start_matches('/')
    );
    Ok((overlay, local))
}

/// The kustomization's patches: mock-eci's Deployment and Service deleted when it runs
/// outside, then the daemon's and mock-eci's environment.
fn overlay_patches(env: &[(String, String)], mock: Mock<'_>) -> Vec<serde_json::Value> {
    let mut patches = Vec::new();
    let mock_env = match mock {
        Mock::InCluster(mock_env) => mock_env,
        Mock::Outside => {
            for (api_version, kind) in [("apps/v1", "Deployment"), ("v1", "Service")] {
                let patch = serde_json::json!({
                    "apiVersion": api_version,
                    "kind": kind,
                    "metadata": {"name": "mock-eci", "namespace": "kube-system"},
                    "$patch": "delete",
                });
                patches.push(serde_json::json!({"patch": patch.to_string()}));
            }
            &[]
        }
    };
    for (kind, name, env) in [
        ("StatefulSet", "virtual-node-eci", env),
        ("Deployment", "mock-eci", mock_env),
    ] {
        if env.is_empty() {
            continue;
        }
        patches.push(env_patch(kind, name, env));
    }
    patches
}

/// A strategic merge patch setting `env` in the container named `name` of `kind` `name`:
/// `env` merges by name.
fn env_patch(kind: &str, name: &str, env: &[(String, String)]) -> serde_json::Value {
    let env: Vec<_> = env
        .iter()
        .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
        .collect();
    let patch = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"template": {"spec": {"containers": [{"name": name, "env": env}]}}},
    });
    serde_json::json!({"patch": patch.to_string()})
}

/// Runs `kubectl apply -k overlay`.
async fn kubectl_apply_k(
    kubectl: &Path,
    kubeconfig: &Path,
    overlay: &Path,
) -> Result<(), HarnessError> {
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "-k"])
        .arg(overlay)
        .output()
        .await
        .map_err(io("run kubectl apply -k"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Setup(format!(
            "kubectl apply -k deploy/overlays/local failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// Whether the Node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Polls `condition` with back-off (up to 500 ms) until it holds or `timeout` passes.
pub async fn wait<F, Fut>(what: &str, timeout: Duration, condition: F) -> Result<(), HarnessError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    while !condition().await {
        if tokio::time::Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                what: what.to_owned(),
                timeout,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    Ok(())
}

/// Waits until the apiserver's admission chain applies the daemons' webhook: a server-side dry
/// run of a pod labelled `alibabacloud.com/eci: "true"` (a built-in Selector) comes back with
/// the virtual-node toleration. Registration, the Service proxy and the webhook's caches all
/// have to be in place for that, and a user's first pod must not beat them.
pub async fn wait_webhook(client: &kube::Client, timeout: Duration) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let probe: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "webhook-probe-", "labels": {"alibabacloud.com/eci": "true"}},
        "spec": {"containers": [{"name": "probe", "image": "nginx"}]},
    }))
    .map_err(|e| HarnessError::Setup(e.to_string()))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait("the webhook to mutate pods", timeout, || {
        let (pods, probe, dry_run) = (pods.clone(), probe.clone(), dry_run.clone());
        async move {
            pods.create(&dry_run, &probe).await.is_ok_and(|pod| {
                pod.spec.and_then(|s| s.tolerations).is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key.as_deref() == Some("k8s.aliyun.com/vnode"))
                })
            })
        }
    })
    .await
}

/// Waits until mock-eci is available and exactly `replicas` virtual nodes are Ready (and, with
/// replicas, their webhook mutates pods); answers
/// mock-eci's Service address (the host agent's proxy serves gRPC on 50051, admin on 8080).
pub async fn wait_installed(
    client: &kube::Client,
    replicas: u32,
    timeout: Duration,
) -> Result<String, HarnessError> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    wait("mock-eci to be available", timeout, || {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt("mock-eci")
                .await
                .ok()
                .flatten()
                .is_some_and(|d| d.status.and_then(|s| s.available_replicas).unwrap_or(0) >= 1)
        }
    })
    .await?;
    wait_virtual_nodes(client, replicas, timeout).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    services
        .get("mock-eci")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| HarnessError::Setup("mock-eci's Service has no cluster IP".into()))
}

/// Waits until exactly `replicas` virtual nodes are Ready and, with replicas, their webhook
/// mutates pods.
pub async fn wait_virtual_nodes(
    client: &kube::Client,
    replicas: u32,
    timeout: Duration,
) -> Result<(), HarnessError> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait(
        &format!("{replicas} Ready virtual node(s)"),
        timeout,
        || {
            let nodes = nodes.clone();
            async move {
                let Ok(list) = nodes
                    .list(&ListParams::default().labels(VIRTUAL_NODE_SELECTOR))
                    .await
                else {
                    return false;
                };
                list.items.len() == replicas as usize && list.items.iter().all(is_ready)
            }
        },
    )
    .await?;
    if replicas > 0 {
        wait_webhook(client, timeout).await?;
    }
    Ok(())
}
