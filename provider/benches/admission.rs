//! Admission benchmark: the daemon's webhook with 1,000 Selectors and 5,000 namespaces in its
//! caches, answering AdmissionReviews at a steady 500 requests/s over HTTPS. Real processes
//! (the real control plane, mock-eci, the daemon; release builds).
//!
//! Run: `cargo bench -p virtual-node-eci --bench admission` (`ADMISSION_BENCH_RATE`,
//! `ADMISSION_BENCH_SECONDS`, `ADMISSION_BENCH_SELECTORS`, `ADMISSION_BENCH_NAMESPACES` override
//! the defaults 500, 10, 1000, 5000). Reports latency inside the daemon (its
//! `admission_seconds` histogram: bucket upper bounds), latency at the client, and the daemon's
//! RSS before and after the caches filled.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use integration::harness::Harness;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The upper bound of the bucket holding quantile `q` of a Prometheus histogram.
fn quantile(metrics: &str, name: &str, q: f64) -> f64 {
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                },
                count,
            ))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map_or(f64::NAN, |b| b.0)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    integration::harness::build_binaries().expect("the binaries build");
    let rate = env_number("ADMISSION_BENCH_RATE", 500);
    let seconds = env_number("ADMISSION_BENCH_SECONDS", 10);
    let selector_count = env_number("ADMISSION_BENCH_SELECTORS", 1000);
    let namespace_count = env_number("ADMISSION_BENCH_NAMESPACES", 5000);

    let mut h = Harness::start().await.unwrap();
    h.start_mock_eci(&[]).await.unwrap();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/selector-crd.yaml"
    ))
    .unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
    Api::<CustomResourceDefinition>::all(h.client())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    let port = free_port();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "virtual-node-eci", "namespace": "kube-system"},
        "spec": {"clusterIP": "127.0.0.1", "ports": [{"port": 443, "targetPort": port}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &service)
        .await
        .unwrap();

    let metrics_port = free_port();
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    let (webhook_addr, metrics_addr) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{metrics_port}"),
    );
    let name = h
        .start_daemon(
            0,
            &[
                ("WEBHOOK_ENABLED", "true"),
                ("WEBHOOK_ADDR", &webhook_addr),
                ("METRICS_ADDR", &metrics_addr),
                ("RUST_LOG", "warn"),
            ],
        )
        .unwrap();
    let pid = h.process(&name).unwrap().pid().unwrap();
    while reqwest::get(&metrics).await.is_err() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_empty = rss_mib(pid);

    // The caches' contents: namespaces with a few labels, Selectors with varied matching.
    let namespaces: Api<Namespace> = Api::all(h.client());
    futures::stream::iter(0..namespace_count)
        .for_each_concurrent(32, |i| {
            let namespaces = namespaces.clone();
            async move {
                let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": format!("team-{i:05}"), "labels": {"team": format!("t{}", i % 100), "env": if i % 2 == 0 { "prod" } else { "dev" }}}})).unwrap();
                namespaces.create(&PostParams::default(), &ns).await.unwrap();
            }
        })
        .await;
    let resource =
        ApiResource::from_gvk(&GroupVersionKind::gvk("eci.aliyun.com", "v1", "Selector"));
    let selectors: Api<DynamicObject> = Api::namespaced_with(h.client(), "default", &resource);
    futures::stream::iter(0..selector_count)
        .for_each_concurrent(32, |i| {
            let selectors = selectors.clone();
            async move {
                let policy = match i % 4 { 0 => json!({"fair": {}}), 1 => json!({"virtualNodeOnly": {}}), 2 => json!({"normalNodeOnly": {}}), _ => json!({"normalNodePrefer": {}}) };
                let selector: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "eci.aliyun.com/v1", "kind": "Selector", "metadata": {"name": format!("s-{i:04}")},
                    "spec": {
                        "objectLabels": {"matchLabels": {"app": format!("app-{}", i % 200)}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]},
                        "namespaceLabels": {"matchExpressions": [{"key": "env", "operator": "Exists"}]},
                        "effect": {"labels": {"selected-by": format!("s-{i:04}")}},
                        "policy": policy,
                        "priority": i % 10,
                    },
                }))
                .unwrap();
                selectors.create(&PostParams::default(), &selector).await.unwrap();
            }
        })
        .await;
    // Let the watches catch up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_full = rss_mib(pid);

    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(h.client(), "kube-system")
        .get("virtual-node-eci-webhook-tls")
        .await
        .unwrap();
    let ca = secret.data.unwrap()["ca.crt"].0.clone();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .resolve(
            "virtual-node-eci.kube-system.svc",
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        )
        .build()
        .unwrap();
    let url = format!("https://virtual-node-eci.kube-system.svc:{port}/mutate-pods");
    let total = rate * seconds;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let started = Instant::now();
    let latencies: Vec<Duration> = futures::stream::iter(0..total)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                tokio::time::sleep_until((started + interval * u32::try_from(i).unwrap()).into()).await;
                let body = json!({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "request": {
                        "uid": format!("r-{i}"), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": format!("team-{:05}", i % namespace_count), "operation": "CREATE", "userInfo": {},
                        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "bench-", "labels": {"app": format!("app-{}", i % 250), "tier": "web"}},
                                   "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]}},
                    },
                });
                let sent = Instant::now();
                let answer = client.post(&url).json(&body).send().await.unwrap();
                assert!(answer.status().is_success());
                let _ = answer.bytes().await.unwrap();
                sent.elapsed()
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut sorted = latencies;
    sorted.sort();
    let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
    let name = "virtual_node_eci_admission_seconds";
    println!(
        "admission at {rate}/s for {seconds}s ({total} reviews in {:.1}s) with {selector_count} Selectors and {namespace_count} namespaces cached:",
        elapsed.as_secs_f64()
    );
    println!(
        "  inside the daemon: p50 ≤{:.2} ms, p99 ≤{:.2} ms, p99.9 ≤{:.2} ms",
        quantile(&text, name, 0.5) * 1000.0,
        quantile(&text, name, 0.99) * 1000.0,
        quantile(&text, name, 0.999) * 1000.0
    );
    println!(
        "  at the client (HTTPS, keep-alive): p50 {:.2} ms, p99 {:.2} ms",
        percentile(&sorted, 0.5).as_secs_f64() * 1000.0,
        percentile(&sorted, 0.99).as_secs_f64() * 1000.0
    );
    let reviews = |result: &str| {
        let prefix = format!("virtual_node_eci_admission_reviews_total{{result=\"{result}\"}}");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("0")
            .to_owned()
    };
    println!(
        "  answers: {} patched (a Selector matched), {} allowed unchanged",
        reviews("patched"),
        reviews("allowed")
    );
    println!(
        "  daemon RSS: {rss_empty:.1} MiB with empty caches, {rss_full:.1} MiB with them full, {:.1} MiB after the run",
        rss_mib(pid)
    );
    h.shutdown(Duration::from_secs(10)).await;
}
