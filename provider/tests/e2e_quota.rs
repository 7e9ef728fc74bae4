//! End to end on the real control plane: ten daemon replicas share one ECI account's quotas.
//! mock-eci enforces the documented per-account quotas (token buckets: a tenth of a minute's
//! calls as burst, then the per-minute rate); ten replicas serve ten virtual nodes, a burst of
//! pods is created on all of them at once and then deleted. mock-eci's own counters
//! (`mock_eci_calls_total`, every answer whatever its result) are sampled throughout: in every
//! window between two samples, the calls of each action summed over the replicas stay within
//! the quota (burst + rate × window), and the service throttled (next to) none of them.
//!
//! The burst is sized so that a replica pacing itself to the *whole* quota (as each did before
//! the quotas were shared) overshoots it several-fold: 25 creations per replica are a quarter
//! of one replica's burst, but 250 together are two and a half times the account's. So that
//! the demand does not depend on how fast this machine's API server takes pods, the replicas
//! are frozen (SIGSTOP) while the pods are created, and while they are deleted, and thawed
//! together.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use integration::harness::invariants::{calls_by_result, sample};
use integration::harness::{Harness, HarnessError, run_scenario};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const REPLICAS: u32 = 10;
const PODS_PER_REPLICA: u32 = 25;
const WAIT: Duration = Duration::from_secs(300);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
];
const DAEMON_ENV: &[(&str, &str)] = &[
    // The harness probes every 250 ms and calls ECI unreachable after 1 s; ten replicas
    // under a shared quota wait a little for their probes' turn, which is not an outage.
    ("ECI_PROBE_INTERVAL", "1s"),
    ("ECI_UNREACHABLE_THRESHOLD", "10s"),
    // The replicas are frozen for a few seconds while pods are created: longer than the
    // harness's 8 s Lease would make that a takeover test.
    ("LEASE_DURATION_SECONDS", "40"),
];
const VNODE_TAINT: &str = "k8s.aliyun.com/vnode";
const REPLICAS_METRIC: &str = "virtual_node_eci_eci_quota_replicas";

/// mock-eci's calls by action (every result summed), at one instant.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    calls: BTreeMap<String, f64>,
}

/// The worst window of one action: calls made in it beyond what the quota allows (negative
/// when within), over which seconds, and how many calls.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Window {
    excess: f64,
    seconds: f64,
    calls: f64,
}

/// Calls the measurement itself may be off by: a sample's instant is when the test read the
/// counter, not when mock-eci counted the calls (and calls drawn from the replicas' buckets in
/// order may reach mock-eci a little out of order) — half a second of the action's rate.
fn allowance(per_minute: u32) -> f64 {
    (f64::from(per_minute) / 120.0).max(2.0)
}

/// Over every pair of samples, the window whose calls of `action` most exceed `burst` +
/// the rate × its length (pure).
fn worst_window(samples: &[Sample], action: &str, per_minute: u32, burst: u32) -> Option<Window> {
    let count = |s: &Sample| s.calls.get(action).copied().unwrap_or(0.0);
    let mut worst: Option<Window> = None;
    for (i, from) in samples.iter().enumerate() {
        for to in &samples[i + 1..] {
            let seconds = to.at.duration_since(from.at).as_secs_f64();
            let calls = count(to) - count(from);
            let allowed = f64::from(burst) + f64::from(per_minute) / 60.0 * seconds;
            let excess = calls - allowed;
            if worst.is_none_or(|w| excess > w.excess) {
                worst = Some(Window {
                    excess,
                    seconds,
                    calls,
                });
            }
        }
    }
    worst
}

/// Samples mock-eci's counters until `stop`.
async fn sample_calls(admin: String, samples: Arc<Mutex<Vec<Sample>>>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Ok(response) = reqwest::get(format!("{admin}/metrics")).await else {
            continue;
        };
        let at = Instant::now();
        let Ok(text) = response.text().await else {
            continue;
        };
        let calls = calls_by_result(&text, "mock_eci_calls_total")
            .into_iter()
            .map(|(action, results)| (action, results.values().sum()))
            .collect();
        samples.lock().unwrap().push(Sample { at, calls });
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

async fn running_pods(h: &Harness, ns: &str) -> Option<usize> {
    let pods = Api::<Pod>::namespaced(h.client(), ns)
        .list(&ListParams::default())
        .await
        .ok()?;
    Some(
        pods.items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count(),
    )
}

async fn mock_calls(h: &Harness, action: &str, result: &str) -> f64 {
    let text = h.mock_metrics().await.unwrap_or_default();
    sample(
        &text,
        "mock_eci_calls_total",
        &format!(r#"action="{action}",result="{result}""#),
    )
}

/// Creates `PODS_PER_REPLICA` pods bound to each node at once (a few dozen requests in flight).
async fn create_pods(h: &Harness, ns: &str, nodes: &[String]) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    let specs: Vec<Pod> = (0..PODS_PER_REPLICA)
        .flat_map(|i| nodes.iter().map(move |node| (i, node.clone())))
        .map(|(i, node)| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-{i}")},
                "spec": {
                    "nodeName": node,
                    "automountServiceAccountToken": false,
                    "tolerations": [{"key": VNODE_TAINT, "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
                },
            }))
            .unwrap()
        })
        .collect();
    futures::stream::iter(specs)
        .map(|pod| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Runs `work` with every daemon stopped (SIGSTOP), then continues them all (SIGCONT), also
/// when `work` failed.
async fn frozen(
    h: &mut Harness,
    daemons: &[String],
    work: impl AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
) -> Result<(), HarnessError> {
    for daemon in daemons {
        h.signal_process(daemon, "STOP")?;
    }
    let result = work(h).await;
    for daemon in daemons {
        h.signal_process(daemon, "CONT")?;
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_replicas_together_stay_within_the_accounts_quotas() {
    run_scenario(async |h: &mut Harness| {
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        let mut daemons = Vec::new();
        for ordinal in 0..REPLICAS {
            daemons.push(h.start_daemon(ordinal, DAEMON_ENV)?);
        }
        let nodes: Vec<String> = (0..REPLICAS).map(|o| h.node_name(o)).collect();
        for node in &nodes {
            h.wait_for(&format!("node {node} Ready"), WAIT, |h| async move {
                Api::<Node>::all(h.client())
                    .get_opt(node)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|n| is_ready(&n))
            })
            .await?;
        }
        // Every replica knows it is one of ten before the load starts.
        for daemon in &daemons {
            h.wait_for(
                &format!("{daemon} to count {REPLICAS} live replicas"),
                WAIT,
                |h| async move {
                    h.daemon_metrics(daemon)
                        .await
                        .is_some_and(|text| sample(&text, REPLICAS_METRIC, "") == f64::from(REPLICAS))
                },
            )
            .await?;
        }

        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let sampler = tokio::spawn(sample_calls(
            mock.admin.clone(),
            Arc::clone(&samples),
            stop.clone(),
        ));
        let total = usize::try_from(REPLICAS * PODS_PER_REPLICA).unwrap();
        let ns = h.create_namespace("quota").await?;
        // The replicas are frozen while the pods are created and thawed together, so each
        // sees its 25 pods at once: the demand is the whole burst, whatever the speed of this
        // machine's API server.
        let started = Instant::now();
        frozen(h, &daemons, async |h: &mut Harness| create_pods(h, &ns, &nodes).await).await?;
        h.wait_for(&format!("{total} pods Running"), WAIT, |h| {
            let ns = ns.clone();
            async move { running_pods(h, &ns).await == Some(total) }
        })
        .await?;
        let running_after = started.elapsed();
        let deleting = Instant::now();
        frozen(h, &daemons, async |h: &mut Harness| {
            Api::<Pod>::namespaced(h.client(), &ns)
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
            Ok(())
        })
        .await?;
        h.wait_for("every pod gone", WAIT, |h| {
            let ns = ns.clone();
            async move {
                Api::<Pod>::namespaced(h.client(), &ns)
                    .list(&ListParams::default())
                    .await
                    .is_ok_and(|l| l.items.is_empty())
            }
        })
        .await?;
        let gone_after = deleting.elapsed();
        #[allow(clippy::cast_precision_loss)]
        let expected = total as f64;
        h.wait_for("mock-eci to have deleted every group", WAIT, |h| async move {
            mock_calls(h, "DeleteContainerGroup", "ok").await >= expected
        })
        .await?;
        stop.cancel();
        sampler.await.unwrap();

        let samples = samples.lock().unwrap().clone();
        let text = h.mock_metrics().await.unwrap_or_default();
        let results = calls_by_result(&text, "mock_eci_calls_total");
        let mut report = vec![format!(
            "{total} pods over {REPLICAS} replicas: Running after {running_after:.1?}, gone {gone_after:.1?} after deletion; {} samples",
            samples.len()
        )];
        let mut failures = Vec::new();
        // Without samples no window is checked at all.
        if samples.len() < 10 {
            failures.push(format!("only {} samples of mock-eci's counters were read", samples.len()));
        }
        for (action, by_result) in &results {
            let Some(per_minute) = eci_proto::quota::per_minute(action) else {
                continue;
            };
            let burst = eci_proto::quota::burst(per_minute);
            let throttled: f64 = by_result
                .iter()
                .filter(|(result, _)| result.starts_with("Throttling"))
                .map(|(_, count)| count)
                .sum();
            let worst = worst_window(&samples, action, per_minute, burst);
            report.push(format!(
                "{action}: {by_result:?}; quota {per_minute}/min burst {burst}; worst window {worst:?}"
            ));
            let slack = allowance(per_minute);
            if worst.is_some_and(|w| w.excess > slack) {
                failures.push(format!(
                    "{action}: the replicas together exceeded the quota by more than {slack} calls: {worst:?}"
                ));
            }
            if throttled > slack {
                failures.push(format!(
                    "{action}: mock-eci throttled {throttled} calls (allowance {slack})"
                ));
            }
        }
        eprintln!("{}", report.join("\n"));
        if failures.is_empty() {
            Ok(())
        } else {
            Err(HarnessError::Setup(format!(
                "{}\n{}",
                failures.join("\n"),
                report.join("\n")
            )))
        }
    })
    .await;
}

#[test]
fn the_worst_window_is_found_and_judged_against_burst_plus_rate() {
    let start = Instant::now();
    let at = |ms: u64, calls: f64| Sample {
        at: start + Duration::from_millis(ms),
        calls: BTreeMap::from([("CreateContainerGroup".to_owned(), calls)]),
    };
    // 1000/min, burst 100: 100 at once, then 16.7 a second.
    let within = [
        at(0, 0.0),
        at(100, 100.0),
        at(1_100, 116.0),
        at(2_100, 132.0),
    ];
    let w = worst_window(&within, "CreateContainerGroup", 1_000, 100).unwrap();
    assert!(w.excess <= 0.0, "{w:?}");
    // 250 in two seconds is 250 − (100 + 33.3) too many.
    let over = [at(0, 0.0), at(1_000, 150.0), at(2_000, 250.0)];
    let w = worst_window(&over, "CreateContainerGroup", 1_000, 100).unwrap();
    assert!(
        (w.excess - (250.0 - 100.0 - 2.0 * 1_000.0 / 60.0)).abs() < 1e-6,
        "{w:?}"
    );
    assert!(worst_window(&over[..1], "CreateContainerGroup", 1_000, 100).is_none());
    assert!((allowance(1_000) - 1_000.0 / 120.0).abs() < 1e-9);
    assert!((allowance(60) - 2.0).abs() < 1e-9);
}
