//! Pod lifecycle benchmark: N pods on one replica against mock-eci with rate limits off, all
//! real processes (the real control plane, mock-eci, the daemon; release builds).
//!
//! Run: `cargo bench -p virtual-node-eci --bench pods` (`PODS_BENCH_SIZES=1000,10000` sets the
//! sizes; `PODS_BENCH_RATE=1000` paces creation at that many pods per second, as a scheduler
//! binding them would, instead of as fast as the API server takes them). Reports watch-event →
//! ECI-accepted latency, ECI change → pod status latency, ECI calls and status writes per pod,
//! the daemon's RSS and CPU, and the time to resync after a restart.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use integration::harness::Harness;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

fn metric_lines(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| {
            l.rsplit_once(' ')
                .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(0.0)))
        })
        .collect()
}

fn sum(text: &str, prefix: &str) -> f64 {
    metric_lines(text, prefix).iter().map(|(_, v)| v).sum()
}

/// Quantile from a Prometheus histogram: the upper bound of the bucket where it falls.
fn quantile(text: &str, name: &str, q: f64) -> String {
    let buckets: Vec<(f64, f64)> = metric_lines(text, &format!("{name}_bucket"))
        .into_iter()
        .filter_map(|(k, v)| {
            let le = k.split("le=\"").nth(1)?.split('"').next()?;
            Some((
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                },
                v,
            ))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    let bound = buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map_or(f64::NAN, |b| b.0);
    format!("≤{:.0} ms", bound * 1000.0)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// CPU seconds (user + system) the process used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) — utime and stime are the
    // 14th and 15th fields of the line, the 12th and 13th after it.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks: f64 = fields.get(11..13).map_or(0.0, |t| {
        t.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    // USER_HZ is 100 on Linux.
    ticks / 100.0
}

async fn fetch(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

async fn wait_until<F: AsyncFnMut() -> bool>(what: &str, timeout: Duration, mut condition: F) {
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `rate`: pods created per second (0: as fast as the API server takes them).
async fn run(size: usize, rate: f64) {
    let mut h = Harness::start().await.unwrap();
    let mock = h
        .start_mock_eci(&[
            "--no-rate-limits",
            "--provisioning-delay",
            "500ms",
            "--scheduling-delay",
            "50ms",
            "--ip-cidr",
            "10.0.0.0/8",
        ])
        .await
        .unwrap();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let env = [
        ("NO_ECI_CLIENT_RATE_LIMITS", "true"),
        ("POD_STATUS_POLL_INTERVAL", "500ms"),
        ("POD_RESYNC_INTERVAL", "60s"),
        ("MAX_CONCURRENT_CREATES", "64"),
        ("METRICS_ADDR", metrics_addr.as_str()),
        ("ECI_QUOTA_POD", "20000"),
        ("RUST_LOG", "warn,virtual_node_eci::pods=info"),
    ];
    let daemon = h.start_daemon(0, &env).unwrap();
    let node = h.node_name(0);
    let daemon_metrics = format!("http://{metrics_addr}/metrics");
    wait_until("the daemon", Duration::from_secs(60), async || {
        reqwest::get(&daemon_metrics).await.is_ok()
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(h.client(), "default");
    let started = Instant::now();
    let paced_start = tokio::time::Instant::now();
    futures::stream::iter(0..size)
        .for_each_concurrent(64, |i| {
            let pods = pods.clone();
            #[allow(clippy::cast_precision_loss)]
            let due = (rate > 0.0).then(|| paced_start + Duration::from_secs_f64(i as f64 / rate));
            let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("bench-{i:05}")}, "spec": {
                "nodeName": node, "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "app", "image": "registry.example.com/app:1", "env": [{"name": "MOCK_ECI_STOP_AFTER", "value": "0s"}]}]}}))
            .unwrap();
            async move {
                if let Some(due) = due {
                    tokio::time::sleep_until(due).await;
                }
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
    let created_in = started.elapsed();
    // Count by metadata-only lists (a field selector rules out the API's remaining-item count,
    // and whole pods at 10,000 a list would make the benchmark measure itself).
    let count = async |fields: &str| {
        pods.list_metadata(&ListParams::default().fields(fields))
            .await
            .map_or(0, |l| l.items.len())
    };
    let running = async || count("status.phase=Running").await == size;
    wait_until("every pod Running", Duration::from_secs(1800), running).await;
    let all_running = started.elapsed();
    let pid = h.process(&daemon).unwrap().pid().unwrap();
    let rss = rss_mib(pid);
    let cpu = cpu_seconds(pid);
    let daemon_text = fetch(&daemon_metrics).await;

    // Restart: time until the new process has accounted for every pod and group.
    h.process(&daemon).unwrap().kill().await;
    let restarted = Instant::now();
    let again = h.start_daemon(0, &env).unwrap();
    wait_until("the resync", Duration::from_secs(600), async || {
        h.process(&again)
            .is_some_and(|p| p.output().contains("resync complete"))
    })
    .await;
    let resync = restarted.elapsed();

    // Delete everything (graceful; the containers stop at once).
    futures::stream::iter(0..size)
        .for_each_concurrent(64, |i| {
            let pods = pods.clone();
            async move {
                let _ = pods
                    .delete(&format!("bench-{i:05}"), &DeleteParams::default())
                    .await;
            }
        })
        .await;
    wait_until("every pod gone", Duration::from_secs(1800), async || {
        count("").await == 0
    })
    .await;
    let mock_text = fetch(&format!("{}/metrics", mock.admin)).await;
    let second_text = fetch(&daemon_metrics).await;
    let calls = |action: &str| {
        sum(
            &mock_text,
            &format!("mock_eci_calls_total{{action=\"{action}\""),
        )
    };
    let writes = sum(
        &daemon_text,
        "virtual_node_eci_kube_requests_total{operation=\"pod_status_patch\"}",
    ) + sum(
        &second_text,
        "virtual_node_eci_kube_requests_total{operation=\"pod_status_patch\"}",
    );
    #[allow(clippy::cast_precision_loss)]
    let n = size as f64;
    let pace = if rate > 0.0 {
        format!("created at {rate} pods/s")
    } else {
        "created as fast as the API server takes them".to_owned()
    };
    println!("== {size} pods on one replica (mock-eci, rate limits off; {pace}) ==");
    println!(
        "created {size} pods in {:.1}s; all Running after {:.1}s",
        created_in.as_secs_f64(),
        all_running.as_secs_f64()
    );
    println!(
        "pod seen → ECI accepted: p50 {}, p99 {}",
        quantile(&daemon_text, "virtual_node_eci_pod_create_seconds", 0.5),
        quantile(&daemon_text, "virtual_node_eci_pod_create_seconds", 0.99)
    );
    println!(
        "ECI change → pod status written: p50 {}, p99 {}",
        quantile(
            &daemon_text,
            "virtual_node_eci_pod_status_propagation_seconds",
            0.5
        ),
        quantile(
            &daemon_text,
            "virtual_node_eci_pod_status_propagation_seconds",
            0.99
        )
    );
    println!(
        "ECI calls per pod: create {:.2}, delete {:.2}, status reads {:.3}, describe {:.3}",
        calls("CreateContainerGroup") / n,
        calls("DeleteContainerGroup") / n,
        calls("DescribeContainerGroupStatus") / n,
        calls("DescribeContainerGroups") / n
    );
    println!(
        "pod status writes per pod (create → running, across the restart): {:.2}",
        writes / n
    );
    let mut by_operation = std::collections::BTreeMap::<String, f64>::new();
    for text in [&daemon_text, &second_text] {
        for (key, value) in metric_lines(text, "virtual_node_eci_kube_requests_total{") {
            let operation = key
                .split("operation=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("?");
            *by_operation.entry(operation.to_owned()).or_default() += value;
        }
    }
    let by_operation: Vec<String> = by_operation
        .iter()
        .map(|(operation, count)| format!("{operation} {:.2}", count / n))
        .collect();
    println!("kube API requests per pod: {}", by_operation.join(", "));
    println!(
        "Events dropped (publish queue full): {}",
        sum(&daemon_text, "virtual_node_eci_events_dropped_total")
            + sum(&second_text, "virtual_node_eci_events_dropped_total")
    );
    println!("daemon RSS with {size} pods: {rss:.1} MiB");
    println!("daemon CPU from start to every pod Running: {cpu:.1} s");
    println!("resync after a restart: {:.1}s", resync.as_secs_f64());
    h.shutdown(Duration::from_secs(10)).await;
}

#[tokio::main]
async fn main() {
    integration::harness::build_binaries().expect("the binaries build");
    let sizes: Vec<usize> = std::env::var("PODS_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rate: f64 = std::env::var("PODS_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0.0);
    for size in sizes {
        run(size, rate).await;
    }
}
