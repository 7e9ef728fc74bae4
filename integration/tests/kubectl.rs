//! Unmodified `kubectl` against the stand-in: apply, get, scale, cordon, drain, delete.
//! `.ci/run` provides kubectl (Debian's kubernetes-client when none is installed); set
//! `KUBECTL` to pick a binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use futures::StreamExt;
use integration::standin::{StandIn, StandInConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::runtime::{WatchStreamExt, watcher};

const MANIFEST: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: virtual-node-eci
  namespace: kube-system
spec:
  replicas: 1
  serviceName: virtual-node-eci
  selector: {matchLabels: {app: virtual-node-eci}}
  template:
    metadata: {labels: {app: virtual-node-eci}}
    spec:
      containers: [{name: virtual-node-eci, image: virtual-node-eci:dev}]
---
apiVersion: v1
kind: Node
metadata: {name: virtual-node-eci-0, labels: {type: virtual-kubelet}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: default, labels: {app: web}}
spec:
  nodeName: virtual-node-eci-0
  containers: [{name: app, image: nginx:1.27}]
"#;

fn kubectl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBECTL") {
        return PathBuf::from(path);
    }
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        found,
        "kubectl is needed for this test: install Debian's kubernetes-client (.ci/run does) or set KUBECTL"
    );
    PathBuf::from("kubectl")
}

fn kubectl(binary: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(binary)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_unmodified() {
    let binary = kubectl_binary();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let manifest = dir.path().join("manifest.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let stand_in = StandIn::start(StandInConfig {
        kubeconfig: Some(kubeconfig.clone()),
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let client = stand_in.client().await.unwrap();

    // Plays the kubelet: a pod that is being deleted goes once its containers "stopped".
    let pods: Api<Pod> = Api::all(client.clone());
    let kubelet = tokio::spawn(async move {
        let mut events = watcher(pods.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(pod)) = events.next().await {
            if pod.metadata.deletion_timestamp.is_some() {
                let namespaced: Api<Pod> = Api::namespaced(
                    pods.clone().into_client(),
                    pod.metadata.namespace.as_deref().unwrap(),
                );
                let _ = namespaced
                    .delete(
                        pod.metadata.name.as_deref().unwrap(),
                        &DeleteParams::default().grace_period(0),
                    )
                    .await;
            }
        }
    });

    let run = |args: &[&str]| {
        let (binary, kubeconfig) = (binary.clone(), kubeconfig.clone());
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                kubectl(
                    &binary,
                    &kubeconfig,
                    &args.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            })
            .await
            .unwrap()
        }
    };
    let path = manifest.to_str().unwrap();
    let applied = run(&["apply", "-f", path]).await;
    assert!(
        applied.contains("statefulset.apps/virtual-node-eci created"),
        "{applied}"
    );
    let again = run(&["apply", "-f", path]).await;
    assert!(again.contains("unchanged"), "{again}");
    let nodes = run(&["get", "nodes"]).await;
    assert!(
        nodes.contains("virtual-node-eci-0") && nodes.contains("STATUS"),
        "kubectl prints the server's table: {nodes}"
    );
    assert!(
        run(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=virtual-node-eci-0",
            "-l",
            "app=web"
        ])
        .await
        .contains("web-0")
    );
    run(&[
        "-n",
        "kube-system",
        "scale",
        "statefulset",
        "virtual-node-eci",
        "--replicas=3",
    ])
    .await;
    assert_eq!(
        run(&[
            "-n",
            "kube-system",
            "get",
            "statefulset",
            "virtual-node-eci",
            "-o",
            "jsonpath={.spec.replicas}"
        ])
        .await,
        "3"
    );
    run(&["cordon", "virtual-node-eci-0"]).await;
    assert_eq!(
        run(&[
            "get",
            "node",
            "virtual-node-eci-0",
            "-o",
            "jsonpath={.spec.unschedulable}"
        ])
        .await,
        "true"
    );
    let drained = run(&[
        "drain",
        "virtual-node-eci-0",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=60s",
    ])
    .await;
    assert!(
        drained.contains("evicting pod default/web-0") || drained.contains("pod/web-0 evicted"),
        "{drained}"
    );
    let remaining = run(&["get", "pods", "-A", "-o", "name"]).await;
    assert!(remaining.trim().is_empty(), "drain left {remaining}");
    run(&["uncordon", "virtual-node-eci-0"]).await;
    run(&["delete", "-f", path, "--ignore-not-found"]).await;
    assert!(
        !run(&["get", "nodes", "-o", "name"])
            .await
            .contains("virtual-node-eci-0")
    );
    kubelet.abort();
    stand_in.stop().await;
}
