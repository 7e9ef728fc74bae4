//! `churn`: the load held (issue 20, part 5). Two daemon replicas on the real control plane
//! (the harness's fixture, release builds of the daemon and mock-eci) under sustained pod
//! churn — bare pods created at `--rate` per second, alternately on each virtual node, each
//! deleted `--live / --rate` seconds after its creation, so about `--live` pods are alive once
//! the ramp is over — for `--duration`. Every `--sample-every` it samples each daemon's RSS
//! (`/proc/<pid>/status` VmRSS), open descriptors (`/proc/<pid>/fd`), established TCP
//! connections (its socket inodes in `/proc/<pid>/net/tcp{,6}` with state 01), CPU time and its
//! ECI calls (`virtual_node_eci_eci_calls_total` from its `/metrics`), plus the live pods and
//! mock-eci's own call counter. At the end it stops the churn, deletes what is left, waits for
//! the pods and groups to go, and writes a JSON summary: the samples and, per metric and
//! daemon, the least-squares slope per hour over the steady part (after the ramp) with its
//! standard error and a verdict against the limit [`Threshold`] explains (leak, flat or
//! inconclusive). It exits 2 when a leak is flagged or a pod or group is left behind.
//!
//! `cargo run -p integration --bin churn --release -- --duration 10m --out churn.json`
//!
//! Not part of `cargo test` (ten minutes), nor of CI: a one-minute smoke has no steady part to
//! fit (the ramp alone takes `--live / --rate` = 60 s) and so could show no leak, only that the
//! binary runs; clippy's `--all-targets` keeps it compiling. The reliability report runs it.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool's output

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use integration::daemon_figures::{Layout, daemon_figures};
use integration::harness::{Harness, build_binaries, free_port};
use integration::measure;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// Sustained pod churn against two daemon replicas; samples their RSS, descriptors,
/// connections and ECI call rates, and fits a slope to each.
#[derive(Debug, Parser)]
#[command(name = "churn")]
struct Args {
    /// How long the churn runs (after the setup).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Pods created (and, once the ramp is over, deleted) per second.
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    /// Pods alive at once in the steady state (each lives `live / rate` seconds).
    #[arg(long, default_value_t = 300)]
    live: u32,
    /// Time between samples.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// Write the JSON summary here (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Mock-eci as fast as the e2e suite runs it: groups run within half a second and stop within a
/// second of their delete.
const MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
    "--max-grace-period",
    "1s",
];

/// What counts as a leak, per hour of churn, over the steady part of the run. A metric is
/// flagged as a leak when its slope is above the limit by more than two standard errors (the
/// fit is sure of it), called flat when it is below by as much, and inconclusive in between —
/// what a short run gives (two minutes leave ~5 points to fit).
///
/// - **RSS: 16 MiB/h.** At 5 pods/s the daemons see 18,000 pods an hour (9,000 each); a
///   daemon keeping ~1 KiB per pod it has seen and forgotten — less than its slim per-pod
///   record — grows ~9 MiB/h, and anything per pod bigger than 2 KiB crosses 16 MiB/h. Below
///   it, a 10-minute run cannot tell a leak from the allocator's drift (freed memory an
///   allocator keeps resident moves RSS by a few MiB at steady state).
/// - **Open descriptors and established connections: 60/h**, i.e. one per 300 churned pods of a
///   daemon, or 10 over a 10-minute run: the connection pools (to the apiserver, to mock-eci)
///   breathe by a handful; a descriptor lost per pod, per retry or per reconnect is far above.
/// - **ECI call rate and CPU: 20 % of their mean per hour.** The churn is steady, so the calls a
///   second and the CPU they take should be too; a rate that grows a fifth an hour (doubling in
///   ~5 h) means work growing with history (groups polled after their pod left, retries that
///   never stop, a list scanned whole for every pod), not with load. CPU is read in ticks of
///   10 ms, a tenth of a point of a core over 10 s, and a fifth of an idle daemon's small
///   share of a core is finer than that: its limit is at least 2 points of a core an hour.
#[derive(Debug, Clone, Copy)]
enum Threshold {
    /// An absolute slope per hour.
    PerHour(f64),
    /// A slope per hour as a share of the metric's mean, but at least the second figure.
    ShareOfMean(f64, f64),
}

impl Threshold {
    fn limit(self, mean: f64) -> f64 {
        match self {
            Self::PerHour(limit) => limit,
            Self::ShareOfMean(share, floor) => (share * mean.abs()).max(floor),
        }
    }
}

/// The sampled metrics of a daemon: name, unit, threshold.
const METRICS: &[(&str, &str, Threshold)] = &[
    ("rss_mib", "MiB", Threshold::PerHour(16.0)),
    ("open_fds", "descriptors", Threshold::PerHour(60.0)),
    ("tcp_established", "connections", Threshold::PerHour(60.0)),
    (
        "eci_calls_per_s",
        "calls/s",
        Threshold::ShareOfMean(0.2, 0.0),
    ),
    (
        "cpu_percent",
        "% of a core",
        Threshold::ShareOfMean(0.2, 2.0),
    ),
];

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("churn: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(&args));
    runtime.shutdown_timeout(Duration::from_secs(2));
    match outcome {
        Ok(summary) => {
            let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
            match &args.out {
                Some(path) => {
                    if let Err(error) = std::fs::write(path, &text) {
                        eprintln!("churn: write {}: {error}", path.display());
                        return ExitCode::FAILURE;
                    }
                    eprintln!("churn: summary in {}", path.display());
                }
                None => println!("{text}"),
            }
            if summary["leaks"].as_array().is_some_and(|l| !l.is_empty())
                || summary["end"]["groups_left"].as_u64() != Some(0)
                || summary["end"]["pods_left"].as_u64() != Some(0)
            {
                eprintln!("churn: a leak was flagged or something was left behind");
                return ExitCode::from(2);
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("churn: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(line: &str) {
    eprintln!("[churn] {line}");
}

/// One daemon's figures at one instant.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct DaemonSample {
    rss_mib: f64,
    open_fds: u64,
    tcp_established: u64,
    cpu_seconds: f64,
    eci_calls_total: f64,
    /// Calls per second since the previous sample.
    eci_calls_per_s: f64,
    /// CPU used since the previous sample, in percent of one core.
    cpu_percent: f64,
}

async fn run(args: &Args) -> anyhow::Result<Value> {
    anyhow::ensure!(args.rate > 0.0, "--rate must be positive");
    say("building the release binaries (daemon, mock-eci, playground)");
    tokio::task::spawn_blocking(build_binaries).await??;
    say("starting the control plane");
    let mut h = Harness::start().await.context("start the harness")?;
    let result = churn(&mut h, args).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    h.shutdown(Duration::from_secs(10)).await;
    result
}

async fn churn(h: &mut Harness, args: &Args) -> anyhow::Result<Value> {
    let ns = h.create_namespace("churn").await?;
    let mock = h.start_mock_eci(MOCK).await?;
    let (daemons, nodes) = start_replicas(h).await?;
    say(&format!(
        "{} daemons up (pids {:?}); churning {} pods/s with ~{} live for {:?}",
        daemons.len(),
        daemons.iter().map(|d| d.1).collect::<Vec<_>>(),
        args.rate,
        args.live,
        args.duration
    ));

    let lifetime = Duration::from_secs_f64(f64::from(args.live) / args.rate);
    let api: Api<Pod> = Api::namespaced(h.client(), &ns);
    let counters = Arc::new(Counters::default());
    let mut sampler = Sampler {
        h,
        ns: &ns,
        admin: &mock.admin,
        daemons: &daemons,
        previous: vec![None; daemons.len()],
        started: Instant::now(),
    };
    let churned = churn_pods(&mut sampler, &api, &nodes, &counters, args, lifetime).await?;
    say("churn over; deleting what is left and waiting for the pods and groups to go");
    let end = remove_leftovers(h, &api, &mock.admin, churned.alive).await;

    // The fit starts 30 s after the ramp (one lifetime), once the deletions run too.
    let warmup = lifetime + Duration::from_secs(30);
    let fits = fit_slopes(&daemons, &churned.samples, warmup);
    let mock_calls = mock_calls_total(&mock.admin).await;
    Ok(json!({
        "config": {
            "duration_seconds": args.duration.as_secs_f64(),
            "rate_per_second": args.rate,
            "live": args.live,
            "pod_lifetime_seconds": lifetime.as_secs_f64(),
            "sample_every_seconds": args.sample_every.as_secs_f64(),
            "fit_from_seconds": warmup.as_secs_f64(),
            "replicas": daemons.len(),
        },
        "totals": {
            "churn_seconds": churned.elapsed.as_secs_f64(),
            "created": counters.created.load(Ordering::Relaxed),
            "create_errors": counters.create_errors.load(Ordering::Relaxed),
            "deleted": counters.deleted.load(Ordering::Relaxed),
            "delete_errors": counters.delete_errors.load(Ordering::Relaxed),
            "mock_eci_calls": mock_calls,
        },
        "end": {
            "converge_seconds": end.converge.as_secs_f64(),
            "settled": end.settled,
            "pods_left": end.pods_left,
            "groups_left": end.groups_left,
        },
        "thresholds": METRICS.iter().map(|(m, u, t)| json!({"metric": m, "unit": u, "threshold": format!("{t:?}")})).collect::<Vec<_>>(),
        "slopes": fits.slopes,
        "leaks": fits.leaks,
        "inconclusive": fits.inconclusive,
        "samples": churned.samples,
    }))
}

/// A daemon replica: its process name, pid and metrics address.
type Replica = (String, u32, String);

/// Starts the two daemon replicas and waits for their nodes to be Ready; returns them and the
/// nodes' names.
async fn start_replicas(h: &mut Harness) -> anyhow::Result<(Vec<Replica>, Vec<String>)> {
    h.create_daemon_statefulset(2).await?;
    let mut daemons = Vec::new();
    for ordinal in 0..2 {
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let process = h.start_daemon(
            ordinal,
            &[
                // The daemon's own defaults otherwise (status poll 1 s, resync 60 s, info logs),
                // but the harness's short Lease timings.
                ("METRICS_ADDR", metrics.as_str()),
                ("PLACEMENT_ENABLED", "false"),
            ],
        )?;
        let pid = h
            .process(&process)
            .and_then(|p| p.pid())
            .context("the daemon's pid")?;
        daemons.push((process, pid, metrics));
    }
    let nodes: Vec<String> = (0..2).map(|o| h.node_name(o)).collect();
    for name in &nodes {
        h.wait_node_ready(name, Duration::from_secs(120)).await?;
    }
    Ok((daemons, nodes))
}

/// Where and since when [`sample`] reads, with each daemon's previous reading (for rates).
struct Sampler<'a> {
    h: &'a Harness,
    ns: &'a str,
    admin: &'a str,
    daemons: &'a [Replica],
    previous: Vec<Option<(Instant, f64, f64)>>,
    started: Instant,
}

impl Sampler<'_> {
    async fn take(&mut self) -> Value {
        sample(
            self.h,
            self.ns,
            self.admin,
            self.daemons,
            &mut self.previous,
            self.started,
        )
        .await
    }
}

/// What the churn left: the pods still alive, the samples, and how long it ran.
struct Churned {
    alive: VecDeque<(String, Instant)>,
    samples: Vec<Value>,
    elapsed: Duration,
}

/// The churn itself: a pod created per tick (alternately on each node), each deleted once
/// `lifetime` old, the daemons sampled every `--sample-every`, until `--duration` is over.
async fn churn_pods(
    sampler: &mut Sampler<'_>,
    api: &Api<Pod>,
    nodes: &[String],
    counters: &Arc<Counters>,
    args: &Args,
    lifetime: Duration,
) -> anyhow::Result<Churned> {
    let started = sampler.started;
    let stop_at = started + args.duration;
    let mut alive: VecDeque<(String, Instant)> = VecDeque::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sample_tick = tokio::time::interval(args.sample_every);
    sample_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples: Vec<Value> = Vec::new();
    let mut serial: u64 = 0;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= stop_at {
                    break;
                }
                while alive.front().is_some_and(|(_, born)| now.duration_since(*born) >= lifetime) {
                    if let Some((name, _)) = alive.pop_front() {
                        spawn_delete(&mut tasks, api, counters, name);
                    }
                }
                let node = &nodes[usize::try_from(serial % 2).unwrap_or(0)];
                let name = format!("churn-{serial}");
                serial += 1;
                spawn_create(&mut tasks, api, counters, pod(&name, node)?);
                alive.push_back((name, now));
                while tasks.try_join_next().is_some() {}
            }
            _ = sample_tick.tick() => {
                let sample = sampler.take().await;
                say(&format!("t={:>4}s {}", sample["t"], brief(&sample)));
                samples.push(sample);
            }
        }
    }
    let elapsed = started.elapsed();
    while tasks.join_next().await.is_some() {}
    samples.push(sampler.take().await);
    Ok(Churned {
        alive,
        samples,
        elapsed,
    })
}

/// Deletes pod `name` in the background, counting the outcome.
fn spawn_delete(
    tasks: &mut tokio::task::JoinSet<()>,
    api: &Api<Pod>,
    counters: &Arc<Counters>,
    name: String,
) {
    let (api, counters) = (api.clone(), counters.clone());
    tasks.spawn(async move {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => counters.deleted.fetch_add(1, Ordering::Relaxed),
            Err(_) => counters.delete_errors.fetch_add(1, Ordering::Relaxed),
        };
    });
}

/// Creates `pod` in the background, counting the outcome.
fn spawn_create(
    tasks: &mut tokio::task::JoinSet<()>,
    api: &Api<Pod>,
    counters: &Arc<Counters>,
    pod: Pod,
) {
    let (api, counters) = (api.clone(), counters.clone());
    tasks.spawn(async move {
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => counters.created.fetch_add(1, Ordering::Relaxed),
            Err(_) => counters.create_errors.fetch_add(1, Ordering::Relaxed),
        };
    });
}

/// How the end went: how long the pods and groups took to go, and what was left.
struct End {
    converge: Duration,
    settled: bool,
    pods_left: u64,
    groups_left: u64,
}

/// Deletes the pods still `alive` and waits for every pod and group to go.
async fn remove_leftovers(
    h: &Harness,
    api: &Api<Pod>,
    admin: &str,
    alive: VecDeque<(String, Instant)>,
) -> End {
    let end = Instant::now();
    for (name, _) in alive {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
    let settled = h
        .wait_for(
            "every churned pod and group gone",
            Duration::from_secs(300),
            |_| {
                let (api, admin) = (api.clone(), admin.to_owned());
                async move {
                    pods_in(&api).await.is_some_and(|p| p == 0)
                        && group_count(&admin).await.is_some_and(|g| g == 0)
                }
            },
        )
        .await;
    End {
        converge: end.elapsed(),
        settled: settled.is_ok(),
        pods_left: pods_in(api).await.unwrap_or(u64::MAX),
        groups_left: group_count(admin).await.unwrap_or(u64::MAX),
    }
}

/// The slopes fitted per daemon and metric, and the leaks and inconclusive fits among them.
struct Fits {
    slopes: serde_json::Map<String, Value>,
    leaks: Vec<String>,
    inconclusive: Vec<String>,
}

/// Fits a slope to each daemon's each metric over the samples from `warmup` on, and judges it
/// against the metric's threshold.
fn fit_slopes(daemons: &[Replica], samples: &[Value], warmup: Duration) -> Fits {
    let mut fits = Fits {
        slopes: serde_json::Map::new(),
        leaks: Vec::new(),
        inconclusive: Vec::new(),
    };
    for (index, (process, _, _)) in daemons.iter().enumerate() {
        let mut per_metric = serde_json::Map::new();
        for (metric, unit, threshold) in METRICS {
            let points: Vec<(f64, f64)> = samples
                .iter()
                .filter(|s| s["t"].as_f64().unwrap_or(0.0) >= warmup.as_secs_f64())
                .filter_map(|s| {
                    let value = s["daemons"][index][metric].as_f64()?;
                    Some((s["t"].as_f64()?, value))
                })
                .collect();
            let fit = Fit::of(&points);
            let limit = fit.as_ref().map(|f| threshold.limit(f.mean));
            let verdict = match (&fit, limit) {
                (Some(fit), Some(limit)) => fit.verdict(limit),
                _ => "inconclusive",
            };
            if verdict == "leak" {
                fits.leaks.push(format!(
                    "{process} {metric}: {:+.2} ± {:.2} {unit}/h over the limit {:.2}",
                    fit.as_ref().map_or(0.0, |f| f.slope_per_hour),
                    fit.as_ref().map_or(0.0, |f| f.stderr_per_hour),
                    limit.unwrap_or_default()
                ));
            }
            if verdict == "inconclusive" {
                fits.inconclusive.push(format!("{process} {metric}"));
            }
            let summary = fit_summary(unit, &points, fit.as_ref(), limit, verdict);
            per_metric.insert((*metric).to_owned(), summary);
        }
        fits.slopes
            .insert(process.clone(), Value::Object(per_metric));
    }
    fits
}

/// One metric's fit as the summary shows it.
fn fit_summary(
    unit: &str,
    points: &[(f64, f64)],
    fit: Option<&Fit>,
    limit: Option<f64>,
    verdict: &str,
) -> Value {
    json!({
        "unit": unit,
        "points": points.len(),
        "slope_per_hour": fit.map(|f| f.slope_per_hour),
        "slope_stderr_per_hour": fit.map(|f| f.stderr_per_hour),
        "mean": fit.map(|f| f.mean),
        "min": fit.map(|f| f.min),
        "max": fit.map(|f| f.max),
        "first": points.first().map(|p| p.1),
        "last": points.last().map(|p| p.1),
        "limit_per_hour": limit,
        "verdict": verdict,
    })
}

#[derive(Debug, Default)]
struct Counters {
    created: AtomicU64,
    create_errors: AtomicU64,
    deleted: AtomicU64,
    delete_errors: AtomicU64,
}

fn pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "churn"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
        },
    }))?)
}

async fn pods_in(api: &Api<Pod>) -> Option<u64> {
    api.list(&ListParams::default())
        .await
        .ok()
        .map(|l| l.items.len() as u64)
}

async fn pod_phases(api: &Api<Pod>) -> BTreeMap<String, u64> {
    let mut phases = BTreeMap::new();
    if let Ok(list) = api.list(&ListParams::default()).await {
        for pod in list.items {
            let phase = if pod.metadata.deletion_timestamp.is_some() {
                "Terminating".to_owned()
            } else {
                pod.status
                    .and_then(|s| s.phase)
                    .unwrap_or_else(|| "Unknown".into())
            };
            *phases.entry(phase).or_default() += 1;
        }
    }
    phases
}

async fn group_count(admin: &str) -> Option<u64> {
    let groups: Vec<Value> = reqwest::get(format!("{admin}/admin/groups"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(groups.len() as u64)
}

async fn mock_calls_total(admin: &str) -> Option<f64> {
    let text = reqwest::get(format!("{admin}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(measure::total(&text, "mock_eci_calls_total"))
}

async fn sample(
    h: &Harness,
    ns: &str,
    admin: &str,
    daemons: &[(String, u32, String)],
    previous: &mut [Option<(Instant, f64, f64)>],
    started: Instant,
) -> Value {
    let now = Instant::now();
    let mut per_daemon = Vec::new();
    for (index, (_, pid, metrics)) in daemons.iter().enumerate() {
        let mut sample = proc_sample(*pid);
        let text = match reqwest::get(format!("http://{metrics}/metrics")).await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        sample.eci_calls_total = measure::total(&text, "virtual_node_eci_eci_calls_total");
        if let Some((at, calls, cpu)) = previous[index] {
            let seconds = now.duration_since(at).as_secs_f64();
            if seconds > 0.0 {
                sample.eci_calls_per_s = (sample.eci_calls_total - calls) / seconds;
                sample.cpu_percent = (sample.cpu_seconds - cpu) / seconds * 100.0;
            }
        }
        previous[index] = Some((now, sample.eci_calls_total, sample.cpu_seconds));
        per_daemon.push(sample);
    }
    let api: Api<Pod> = Api::namespaced(h.client(), ns);
    json!({
        "t": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "daemons": per_daemon,
        "pods": pod_phases(&api).await,
        "groups": group_count(admin).await,
        "mock_eci_calls_total": mock_calls_total(admin).await,
    })
}

/// RSS, descriptors, established TCP connections and CPU time of `pid`, from `/proc`.
fn proc_sample(pid: u32) -> DaemonSample {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let mut sockets = std::collections::BTreeSet::new();
    let mut open_fds = 0;
    if let Ok(entries) = std::fs::read_dir(proc_dir.join("fd")) {
        for entry in entries.filter_map(Result::ok) {
            open_fds += 1;
            if let Ok(target) = std::fs::read_link(entry.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|t| t.strip_suffix(']'))
                {
                    sockets.insert(inode.to_owned());
                }
            }
        }
    }
    let mut tcp_established = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(proc_dir.join("net").join(table)).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if fields.len() > 9 && fields[3] == "01" && sockets.contains(fields[9]) {
                tcp_established += 1;
            }
        }
    }
    DaemonSample {
        rss_mib: rss_kib / 1024.0,
        open_fds,
        tcp_established,
        cpu_seconds: measure::cpu_seconds(pid),
        ..DaemonSample::default()
    }
}

fn brief(sample: &Value) -> String {
    let daemons = daemon_figures(sample, Layout::Brief);
    format!(
        "pods {} groups {} {}",
        sample["pods"],
        sample["groups"],
        daemons.join(" ")
    )
}

/// A least-squares line through `(seconds, value)` points.
#[derive(Debug)]
struct Fit {
    slope_per_hour: f64,
    stderr_per_hour: f64,
    mean: f64,
    min: f64,
    max: f64,
}

impl Fit {
    #[allow(clippy::cast_precision_loss)] // a few hundred points
    fn of(points: &[(f64, f64)]) -> Option<Self> {
        if points.len() < 3 {
            return None;
        }
        let n = points.len() as f64;
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let slope = sxy / sxx;
        let intercept = mean_y - slope * mean_x;
        let residuals: f64 = points
            .iter()
            .map(|p| (p.1 - (intercept + slope * p.0)).powi(2))
            .sum();
        let stderr = (residuals / (n - 2.0) / sxx).sqrt();
        Some(Self {
            slope_per_hour: slope * 3600.0,
            stderr_per_hour: stderr * 3600.0,
            mean: mean_y,
            min: points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min),
            max: points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

impl Fit {
    /// `leak` when the slope is above `limit` by more than two standard errors, `flat` when
    /// below by as much, `inconclusive` otherwise.
    fn verdict(&self, limit: f64) -> &'static str {
        if self.slope_per_hour - 2.0 * self.stderr_per_hour > limit {
            "leak"
        } else if self.slope_per_hour + 2.0 * self.stderr_per_hour <= limit {
            "flat"
        } else {
            "inconclusive"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_fits_exactly() {
        let points: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i) * 10.0, 5.0 + f64::from(i)))
            .collect();
        let fit = Fit::of(&points).unwrap_or_else(|| panic!("a fit"));
        assert!((fit.slope_per_hour - 360.0).abs() < 1e-9);
        assert!(fit.stderr_per_hour.abs() < 1e-9);
        assert_eq!(fit.verdict(100.0), "leak");
        assert_eq!(fit.verdict(400.0), "flat");
    }
}
