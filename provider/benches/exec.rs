//! Exec round-trip benchmark: `kubectl exec POD -- true` and `echo hi | kubectl exec -i POD --
//! cat` on a pod of a virtual node, through the real apiserver (kubectl → apiserver → SPDY to
//! the daemon's kubelet API → ECI ExecContainerCommand on mock-eci → its WebSocket → a real
//! process), one after another: what a user waits for, kubectl's own start included.
//!
//! Run: `cargo bench -p virtual-node-eci --bench exec` (`EXEC_BENCH_ROUNDS`, default 30).
//! Reports min, p50, p90 and max per form.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use integration::harness::Harness;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::AsyncWriteExt as _;

async fn exec(h: &Harness, ns: &str, args: &[&str], stdin: &[u8]) -> Duration {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(["exec", "-n", ns, "box"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    started.elapsed()
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: n={} min={:?} p50={:?} p90={:?} max={:?}",
        samples.len(),
        samples[0],
        at(0.5),
        at(0.9),
        samples[samples.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    integration::harness::build_binaries().expect("the binaries build");
    let rounds: usize = std::env::var("EXEC_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let mut h = Harness::start().await.expect("the harness starts");
    let ns = h.create_namespace("exec-bench").await.unwrap();
    h.start_mock_eci(&[
        "--provisioning-delay",
        "100ms",
        "--scheduling-delay",
        "10ms",
    ])
    .await
    .unwrap();
    h.start_daemon(
        0,
        &[("POD_STATUS_POLL_INTERVAL", "250ms"), ("RUST_LOG", "warn")],
    )
    .unwrap();
    let node = h.node_name(0);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "box"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Exists"}],
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    h.wait_for("pod box running", Duration::from_secs(120), |_| {
        let pods = pods.clone();
        async move {
            pods.get("box").await.is_ok_and(|p| {
                let p = serde_json::to_value(p).unwrap();
                p["status"]["containerStatuses"][0]["state"]["running"].is_object()
                    && p["metadata"]["annotations"]["k8s.aliyun.com/eci-instance-id"].is_string()
            })
        }
    })
    .await
    .unwrap();
    // One warm-up of each: kubectl's discovery cache, the daemon's review caches.
    exec(&h, &ns, &["--", "true"], b"").await;
    exec(&h, &ns, &["-i", "--", "cat"], b"hi\n").await;
    let mut oneshot = Vec::new();
    let mut stdin = Vec::new();
    for _ in 0..rounds {
        oneshot.push(exec(&h, &ns, &["--", "true"], b"").await);
        stdin.push(exec(&h, &ns, &["-i", "--", "cat"], b"hi\n").await);
    }
    report("kubectl exec POD -- true", oneshot);
    report("echo hi | kubectl exec -i POD -- cat", stdin);
    h.shutdown(Duration::from_secs(10)).await;
}
