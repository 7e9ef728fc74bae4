//! mock-eci throughput benchmark: a real `mock-eci` process (release build) on loopback.
//!
//! Measures creates per second with rate limits off, the server's memory with N groups, and
//! the latency of DescribeContainerGroupStatus pages (200 groups each) over all of them.
//!
//! Run: `cargo bench -p mock-eci --bench throughput` (`MOCK_ECI_BENCH_GROUPS` sets N, default
//! 20000; `MOCK_ECI_BENCH_CONCURRENCY` the number of calls in flight, default 64).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use eci_proto::v20180808::eci_client::EciClient;
use eci_proto::v20180808::{
    Container, CreateContainerGroupRequest, DescribeContainerGroupStatusRequest, Tag,
};
use tonic::transport::Channel;

const REGION: &str = "cn-hangzhou";

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

fn request(index: usize) -> CreateContainerGroupRequest {
    CreateContainerGroupRequest {
        region_id: REGION.into(),
        security_group_id: "sg-bench".into(),
        v_switch_id: "vsw-bench".into(),
        container_group_name: format!("bench-{index}"),
        client_token: format!("uid-{index}"),
        tag: vec![
            Tag {
                key: "cluster".into(),
                value: "bench".into(),
            },
            Tag {
                key: "node".into(),
                value: "virtual-node-eci-0".into(),
            },
            Tag {
                key: "namespace".into(),
                value: "default".into(),
            },
            Tag {
                key: "pod".into(),
                value: format!("bench-{index}"),
            },
        ],
        container: vec![Container {
            name: "app".into(),
            image: "registry.example.com/app:1".into(),
            cpu: Some(0.5),
            memory: Some(1.0),
            ..Container::default()
        }],
        ..CreateContainerGroupRequest::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

#[tokio::main]
async fn main() {
    let groups = env_number("MOCK_ECI_BENCH_GROUPS", 20_000);
    let concurrency = env_number("MOCK_ECI_BENCH_CONCURRENCY", 64);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_mock-eci"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--no-rate-limits",
            "--provisioning-delay",
            "1s",
            "--scheduling-delay",
            "100ms",
            "--ip-cidr",
            "10.0.0.0/8",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("mock-eci starts");
    let pid = child.id();
    let _server = Server(child);
    let endpoint = format!("http://127.0.0.1:{port}");
    let channel = loop {
        // Large HTTP/2 windows: a 200-group page is ~100 KB, more than the 64 KiB default.
        let endpoint = Channel::from_shared(endpoint.clone())
            .unwrap()
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(8 << 20));
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let idle_rss = rss_kib(pid, "VmRSS:");

    // Creates, `concurrency` in flight.
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..concurrency {
        let mut client = EciClient::new(channel.clone());
        let next = next.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if index >= groups {
                    break latencies;
                }
                let call = Instant::now();
                client
                    .create_container_group(request(index))
                    .await
                    .expect("create succeeds");
                latencies.push(call.elapsed());
            }
        });
    }
    let mut create_latencies: Vec<Duration> = Vec::new();
    while let Some(result) = tasks.join_next().await {
        create_latencies.extend(result.unwrap());
    }
    let create_elapsed = started.elapsed();
    create_latencies.sort();

    // Let every group reach Running, then read the status of all of them page by page.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut client = EciClient::new(channel.clone());
    let mut page_latencies = Vec::new();
    let mut running = 0;
    for pass in 0..5 {
        let mut token = String::new();
        loop {
            let call = Instant::now();
            let page = client
                .describe_container_group_status(DescribeContainerGroupStatusRequest {
                    region_id: REGION.into(),
                    tag: vec![Tag {
                        key: "node".into(),
                        value: "virtual-node-eci-0".into(),
                    }],
                    limit: Some(200),
                    next_token: token.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            page_latencies.push(call.elapsed());
            if pass == 0 {
                running += page
                    .data
                    .iter()
                    .filter(|group| group.status == "Running")
                    .count();
            }
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
    }
    page_latencies.sort();

    // The cheap steady-state poll: only what changed in the last 2 seconds (nothing here).
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let mut since_latencies = Vec::new();
    for _ in 0..200 {
        let call = Instant::now();
        client
            .describe_container_group_status(DescribeContainerGroupStatusRequest {
                region_id: REGION.into(),
                since_second: Some(2),
                ..Default::default()
            })
            .await
            .unwrap();
        since_latencies.push(call.elapsed());
    }
    since_latencies.sort();

    let loaded_rss = rss_kib(pid, "VmRSS:");
    let peak_rss = rss_kib(pid, "VmHWM:");
    println!(
        "mock-eci benchmark: {groups} groups, {concurrency} creates in flight, one loopback HTTP/2 connection"
    );
    println!(
        "creates: {:.0}/s over {:.2}s (latency p50 {:?}, p99 {:?})",
        groups as f64 / create_elapsed.as_secs_f64(),
        create_elapsed.as_secs_f64(),
        percentile(&create_latencies, 0.5),
        percentile(&create_latencies, 0.99),
    );
    println!("running after provisioning: {running}/{groups}");
    println!(
        "DescribeContainerGroupStatus, 200 per page, tag filter: {} pages, p50 {:?}, p99 {:?}, max {:?}",
        page_latencies.len(),
        percentile(&page_latencies, 0.5),
        percentile(&page_latencies, 0.99),
        page_latencies.last().unwrap(),
    );
    println!(
        "DescribeContainerGroupStatus since_second=2 (nothing changed): p50 {:?}, p99 {:?}",
        percentile(&since_latencies, 0.5),
        percentile(&since_latencies, 0.99),
    );
    println!(
        "server RSS: idle {:.1} MiB, with {groups} groups {:.1} MiB (peak {:.1} MiB)",
        idle_rss as f64 / 1024.0,
        loaded_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    );
}
