//! Metrics benchmark: the cost of one `/metrics/resource` scrape of a virtual node running
//! 3,000 pods — ECI calls, time, bytes — with the daemon's own scraper (the code behind the
//! route, paced and metered as the daemon paces ECI) against an in-process mock-eci holding
//! 3,000 running groups, its rate limits at the documented quotas.
//!
//! Run: `cargo bench -p virtual-node-eci --bench kubelet_metrics` (`METRICS_BENCH_PODS`,
//! `METRICS_BENCH_LATENCY_MS` — added to every metric call, as a real endpoint's round trip —
//! and `METRICS_BENCH_ROUNDS` override 3000, 0 and 5). Reports, per scrape: the ECI calls
//! mock-eci served (its own count), the refresh time (median and worst of the rounds), the
//! time to write the text, the bytes of `/metrics/resource` and `/stats/summary`; then what a
//! scrape within the cache lifetime costs, and what 20 scrapes at once cost.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use eci_proto::v20180808::{Container, CreateContainerGroupRequest, Tag};
use futures::StreamExt as _;
use mock_eci::{MockConfig, MockServer};
use virtual_node_eci::eci::{Backend, GrpcBackend, Paced};
use virtual_node_eci::kubelet::resource_metrics::{CACHE_TTL, Scraper, SharedIndex};
use virtual_node_eci::ops::metrics::Telemetry;
use virtual_node_eci::pods::GroupDirectory;
use vne_core::kubelet_metrics::{PodEntry, resource_metrics, summary};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// DescribeMultiContainerGroupMetric calls mock-eci has served, by its own metrics.
fn metric_calls(server: &MockServer) -> u64 {
    server
        .mock()
        .render_metrics()
        .lines()
        .filter(|l| l.starts_with("mock_eci_calls_total{"))
        .filter(|l| l.contains("action=\"DescribeMultiContainerGroupMetric\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let pods = usize::try_from(env_number("METRICS_BENCH_PODS", 3_000)).unwrap();
    let latency_ms = env_number("METRICS_BENCH_LATENCY_MS", 0);
    let rounds = usize::try_from(env_number("METRICS_BENCH_ROUNDS", 5)).unwrap();

    let mut config = MockConfig::defaults();
    config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    config.scheduling_delay = Duration::from_millis(10);
    config.provisioning_delay = "50ms".parse().unwrap();
    // Creating the groups is set-up, not what is measured: no quota for it.
    config.no_rate_limits = true;
    let server = MockServer::start(config).await.unwrap();
    let region = MockConfig::defaults().region;
    let grpc: Backend = Arc::new(GrpcBackend::connect_lazy(&server.endpoint()).unwrap());

    let started = Instant::now();
    let ids: Vec<String> = futures::stream::iter(0..pods)
        .map(|i| {
            let (grpc, region) = (Arc::clone(&grpc), region.clone());
            async move {
                grpc.create_container_group(CreateContainerGroupRequest {
                    region_id: region,
                    security_group_id: "sg-bench".into(),
                    v_switch_id: "vsw-bench".into(),
                    container_group_name: format!("bench-pod-{i}"),
                    container: vec![Container {
                        name: "app".into(),
                        image: "registry.example.com/app:1".into(),
                        cpu: Some(0.5),
                        memory: Some(1.0),
                        ..Container::default()
                    }],
                    tag: vec![Tag {
                        key: "bench".into(),
                        value: "metrics".into(),
                    }],
                    client_token: format!("bench-{i}"),
                    ..CreateContainerGroupRequest::default()
                })
                .await
                .unwrap()
                .container_group_id
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    while server
        .mock()
        .groups()
        .iter()
        .filter(|g| g.status == "Running")
        .count()
        < pods
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{pods} groups created and running in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // From here on the documented quotas apply (DescribeMultiContainerGroupMetric: 2,000 a
    // minute), and each metric call takes the round trip asked for.
    let mut patch = serde_json::json!({"rate_limits_enabled": true});
    if latency_ms > 0 {
        patch["faults"] = serde_json::json!({
            "DescribeMultiContainerGroupMetric": {"error_rate": 0.0, "latency_ms": latency_ms}
        });
    }
    server
        .mock()
        .patch_controls(&serde_json::from_value(patch).unwrap())
        .unwrap();

    // The daemon's view: one running pod per group, and ECI paced and metered as in the daemon.
    let index = Arc::new(SharedIndex::default());
    index.write(|index| {
        for i in 0..ids.len() {
            index.upsert(PodEntry {
                namespace: format!("ns-{}", i % 50),
                name: format!("bench-pod-{i}"),
                uid: format!("uid-{i}"),
                running: true,
                start_time: Some(jiff::Timestamp::now()),
                containers: vec![("app".into(), jiff::Timestamp::now())],
            });
        }
        index.mark_listed();
    });
    // The pod controller's record of which group runs which pod.
    let groups = GroupDirectory::fixed(
        ids.iter()
            .enumerate()
            .map(|(i, id)| (format!("uid-{i}"), id.clone())),
    );
    let eci: Backend = Arc::new(Paced::new(
        Arc::clone(&grpc),
        Some(Arc::new(virtual_node_eci::eci::Pacer::default())),
        Arc::new(Telemetry::new()),
    ));
    // A lifetime of zero: every scrape refreshes (what each of metrics-server's scrapes does,
    // being further apart than the daemon's cache lifetime).
    let cold = Scraper::new(
        Arc::clone(&eci),
        region.clone(),
        Arc::clone(&index),
        groups.clone(),
        Duration::ZERO,
    );

    let mut refreshes = Vec::new();
    let mut renders = Vec::new();
    let (mut text_bytes, mut summary_bytes, mut calls) = (0, 0, 0);
    for _ in 0..rounds {
        let before = metric_calls(&server);
        let started = Instant::now();
        let snapshot = cold.snapshot().await.unwrap();
        refreshes.push(started.elapsed());
        calls = metric_calls(&server) - before;
        assert_eq!(snapshot.pods.len(), pods, "every pod measured");
        assert_eq!(snapshot.failed_calls, 0, "{:?}", snapshot.error);
        let started = Instant::now();
        let text = resource_metrics(&snapshot.node, &snapshot.pods, snapshot.scrape_error());
        renders.push(started.elapsed());
        text_bytes = text.len();
        let json = serde_json::to_vec(&summary(
            "bench-node",
            jiff::Timestamp::now(),
            &snapshot.node,
            &snapshot.pods,
            false,
        ))
        .unwrap();
        summary_bytes = json.len();
        // metrics-server's scrapes are at least 10 s apart; the pacer refills meanwhile.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    println!(
        "one scrape of {pods} pods: {calls} DescribeMultiContainerGroupMetric calls (20 groups a call), refresh {:.0} ms median / {:.0} ms worst of {rounds}, text written in {:.1} ms; /metrics/resource {:.0} KiB, /stats/summary {:.0} KiB",
        median(refreshes.clone()).as_secs_f64() * 1e3,
        refreshes.iter().max().unwrap().as_secs_f64() * 1e3,
        median(renders).as_secs_f64() * 1e3,
        text_bytes as f64 / 1024.0,
        summary_bytes as f64 / 1024.0,
    );

    // The daemon's lifetime: scrapes within it cost no call; 20 at once after it, one refresh.
    let cached = Scraper::new(
        Arc::clone(&eci),
        region,
        Arc::clone(&index),
        groups,
        CACHE_TTL,
    );
    cached.snapshot().await.unwrap();
    let before = metric_calls(&server);
    let started = Instant::now();
    for _ in 0..100 {
        let snapshot = cached.snapshot().await.unwrap();
        let _ = resource_metrics(&snapshot.node, &snapshot.pods, snapshot.scrape_error());
    }
    println!(
        "100 scrapes within the cache lifetime ({CACHE_TTL:?}): {} calls, {:.1} ms each (the text written every time)",
        metric_calls(&server) - before,
        started.elapsed().as_secs_f64() * 1e3 / 100.0
    );
    tokio::time::sleep(CACHE_TTL).await;
    let before = metric_calls(&server);
    let started = Instant::now();
    let scrapes: Vec<_> = (0..20)
        .map(|_| {
            let cached = cached.clone();
            tokio::spawn(async move { cached.snapshot().await.unwrap().pods.len() })
        })
        .collect();
    for scrape in scrapes {
        assert_eq!(scrape.await.unwrap(), pods);
    }
    println!(
        "20 concurrent scrapes after it: {} calls in all, {:.0} ms",
        metric_calls(&server) - before,
        started.elapsed().as_secs_f64() * 1e3
    );
    server.stop().await.unwrap();
}
