//! Pod lifecycle benchmark, side by side on one real control plane: N pods driven to Running
//! and deleted again, first by kwok (which writes pod status and nothing else, so it shows what
//! this apiserver allows), then by the daemon against mock-eci (rate limits off, and with
//! mock-eci's documented per-account quotas when asked). The phases run one after the other in
//! one process, on the same apiserver, so they do not compete; release builds of the daemon and
//! mock-eci.
//!
//! Run: `cargo bench -p virtual-node-eci --bench pods`. Environment:
//! - `PODS_BENCH_SIZES=1000,10000`: the sizes (one full comparison each);
//! - `PODS_BENCH_REPLICAS=1`: the pods are spread over this many daemon replicas (and as many
//!   kwok nodes);
//! - `PODS_BENCH_QUOTAS=off` (`off`, `on` or `off,on`): the daemon phases to run;
//! - `PODS_BENCH_RATE=0`: pods created per second (0: as fast as the apiserver takes them);
//! - `PODS_BENCH_TOKENS=off`: `on` makes every pod mount its service account's token, as users'
//!   pods do by default (the daemon then issues a TokenRequest and reads the namespace's
//!   `kube-root-ca.crt` per pod, as a kubelet does; kwok does neither). Off by default, so runs
//!   stay comparable with the recorded ones;
//! - `PODS_BENCH_ORDER=kwok-first`: `ours-first` runs the daemon's phases before kwok's, to
//!   see what the order costs (each phase inherits an apiserver and etcd that the one before
//!   it has just churned);
//! - `PODS_BENCH_DISRUPTION=none`: what is done to the daemons while the pods are created —
//!   `kill9`: once half the pods are created, the middle replica is killed with SIGKILL and
//!   started again at once (a crash); `rolling`: every replica in turn, highest ordinal first
//!   as a StatefulSet's RollingUpdate goes, is stopped with SIGTERM and started again, the
//!   next once its successor is ready and a further share of the pods is created (replica k
//!   of n once k/(n+1) of them are: the upgrade spans the rollout). Such a run also asserts, at
//!   all Running, that nothing was lost, leaked or duplicated (the fault suite's invariants,
//!   read from the apiserver and mock-eci), that no pod was ever seen failed, no container
//!   restarted and no group deleted (a recreated pod would show as one). Its CPU and memory
//!   figures count the processes alive at the end only;
//! - `PODS_BENCH_WORKER_THREADS=1`: each daemon's `WORKER_THREADS`. 1 is what the manifests
//!   give a replica (their CPU request, 100m, rounded up); 0 starts a worker per core, as a
//!   replica without a CPU request does;
//! - `PODS_BENCH_OUT=path` or `-- --out path`: also write the figures as JSON.
//!
//! Each phase reports the time from the first create to every pod Running and from the first
//! delete to every pod gone, per-pod create → Running p50/p99 (from the benchmark's own pod
//! watch), and the apiserver's own `apiserver_request_total` per pod by verb and resource (its
//! `/metrics` read before and after the phase: everything the cluster asked during it, the
//! benchmark's creates, deletes and one watch included). Daemon phases add ECI calls per pod by
//! action (mock-eci's counters), status writes per pod, the daemon's CPU seconds and peak RSS.
//! A table of ratios (ours / kwok) ends the run. No figure is asserted; the run fails when a
//! pod never reaches Running, never goes, or leaves a container group behind.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use integration::harness::{FixtureOptions, Harness};
use integration::measure::{
    self, cpu_seconds, descendants_named, diff, grouped, proc_status_kib, quantile,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

/// mock-eci's provisioning delay in these runs (creation → Running of a group).
const PROVISIONING_DELAY: &str = "500ms";

/// The label the benchmark's pods carry (its value names the phase).
const PHASE_LABEL: &str = "bench.virtual-node-eci/phase";

// ---------------------------------------------------------------------------------------------
// Prometheus text

/// What the apiserver's `/metrics` says at one moment, reduced to what the benchmark compares.
#[derive(Debug, Clone, Default)]
struct ApiserverCounts {
    /// Requests by "VERB resource[/subresource]".
    requests: BTreeMap<String, f64>,
    /// Requests answered 429 (flow control or max-inflight).
    throttled: f64,
    /// Pod writes answered 409 (a precondition or an apply conflict), by "VERB resource".
    conflicts: BTreeMap<String, f64>,
    /// Seconds and count of pod writes (POST, PUT, PATCH, DELETE on pods and their subresources).
    pod_write_seconds: f64,
    pod_writes: f64,
    /// Seconds and count of pod creates (the benchmark's own: what the create rate waits on).
    pod_create_seconds: f64,
    pod_creates: f64,
}

impl ApiserverCounts {
    fn parse(text: &str) -> Self {
        let pod_write = |l: &BTreeMap<String, String>| {
            (l.get("resource").map(String::as_str) == Some("pods")
                && matches!(
                    l.get("verb").map(String::as_str),
                    Some("POST" | "PUT" | "PATCH" | "DELETE")
                ))
            .then(String::new)
        };
        let total = |name: &str| grouped(text, name, pod_write).values().sum::<f64>();
        let pod_create = |l: &BTreeMap<String, String>| {
            (l.get("resource").map(String::as_str) == Some("pods")
                && l.get("subresource").is_none_or(String::is_empty)
                && l.get("verb").map(String::as_str) == Some("POST"))
            .then(String::new)
        };
        let creates = |name: &str| grouped(text, name, pod_create).values().sum::<f64>();
        Self {
            requests: measure::apiserver_requests(text),
            throttled: grouped(text, "apiserver_request_total", |l| {
                (l.get("code").map(String::as_str) == Some("429")).then(String::new)
            })
            .values()
            .sum(),
            conflicts: grouped(text, "apiserver_request_total", |l| {
                (l.get("code").map(String::as_str) == Some("409"))
                    .then(|| measure::verb_resource(l))
                    .flatten()
            }),
            pod_write_seconds: total("apiserver_request_duration_seconds_sum"),
            pod_writes: total("apiserver_request_duration_seconds_count"),
            pod_create_seconds: creates("apiserver_request_duration_seconds_sum"),
            pod_creates: creates("apiserver_request_duration_seconds_count"),
        }
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            requests: diff(&self.requests, &before.requests),
            throttled: self.throttled - before.throttled,
            conflicts: diff(&self.conflicts, &before.conflicts),
            pod_write_seconds: self.pod_write_seconds - before.pod_write_seconds,
            pod_writes: self.pod_writes - before.pod_writes,
            pod_create_seconds: self.pod_create_seconds - before.pod_create_seconds,
            pod_creates: self.pod_creates - before.pod_creates,
        }
    }
}

/// Picks a latency's seconds and count out of the apiserver's figures.
type SumAndCount = fn(&ApiserverCounts) -> (f64, f64);

async fn apiserver_counts(client: &kube::Client) -> ApiserverCounts {
    let text = measure::apiserver_metrics(client)
        .await
        .expect("the apiserver's /metrics (as the administrator)");
    ApiserverCounts::parse(&text)
}

/// Waits until no pod write has reached the apiserver for [`QUIET_FOR`] (bounded), so a phase
/// does not start while the last one's stragglers still load the cluster: kwok v0.8.0 sends a
/// second `DELETE` for each pod it removed (answered 404), and at 10,000 pods and more those
/// trail its phase by minutes, counted in the next phase's requests and CPU until this wait.
async fn wait_for_pod_writes_to_settle(client: &kube::Client) {
    const QUIET_FOR: Duration = Duration::from_secs(3);
    const AT_MOST: Duration = Duration::from_secs(600);
    let started = Instant::now();
    let first = apiserver_counts(client).await.pod_writes;
    let (mut last, mut quiet_since) = (first, Instant::now());
    while quiet_since.elapsed() < QUIET_FOR && started.elapsed() < AT_MOST {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = apiserver_counts(client).await.pod_writes;
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    let settled = quiet_since.elapsed() >= QUIET_FOR;
    println!(
        "pod writes before the phase: {} more in {:.1} s, {}",
        last - first,
        started.elapsed().as_secs_f64(),
        if settled {
            "then quiet"
        } else {
            "still going: measured anyway"
        }
    );
}

/// Samples the apiserver's in-flight and queued requests every 2 s until aborted; the peaks
/// are left in `peaks` ("inflight mutating", "inflight readOnly", "queued").
fn sample_apiserver_load(
    client: kube::Client,
    peaks: Arc<Mutex<BTreeMap<String, f64>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(text) = measure::apiserver_metrics(&client).await {
                let mut now = grouped(&text, "apiserver_current_inflight_requests", |l| {
                    l.get("request_kind").map(|k| format!("inflight {k}"))
                });
                let queued: f64 = grouped(
                    &text,
                    "apiserver_flowcontrol_current_inqueue_requests",
                    |_| Some(String::new()),
                )
                .values()
                .sum();
                now.insert("queued".into(), queued);
                let mut peaks = peaks.lock();
                for (k, v) in now {
                    let peak = peaks.entry(k).or_insert(0.0);
                    *peak = peak.max(v);
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

/// The daemons' largest resident set, sampled every half second from `started` on, as
/// (seconds since `started`, MiB): shows which part of the phase its peak belongs to.
fn sample_daemon_rss(
    pids: Arc<Mutex<Vec<u32>>>,
    started: Instant,
    samples: Arc<Mutex<Vec<(f64, f64)>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let mib = pids
                .lock()
                .iter()
                .map(|p| proc_status_kib(*p, "VmRSS:") / 1024.0)
                .fold(0.0, f64::max);
            samples.lock().push((started.elapsed().as_secs_f64(), mib));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// The part of a phase its largest sample fell in: creating (until the last create
/// returned), starting (until all Running), deleting (after the first delete).
fn peak_stage(samples: &[(f64, f64)], created: f64, running: f64, deleting: f64) -> Value {
    let Some(&(at, mib)) = samples.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Value::Null;
    };
    let stage = if at <= created {
        "creating"
    } else if at <= running {
        "starting"
    } else if at < deleting {
        "all Running"
    } else {
        "deleting"
    };
    json!({"at_s": at, "mib": mib, "stage": stage})
}

async fn fetch(url: &str) -> String {
    reqwest::get(url)
        .await
        .and_then(reqwest::Response::error_for_status)
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Processes

// ---------------------------------------------------------------------------------------------
// The pods' watch

/// When each pod was created, seen Running and seen gone, from one watch of the phase's pods.
#[derive(Debug, Default)]
struct Timeline {
    created: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
    gone: HashMap<String, Instant>,
    /// Pods whose phase is neither Pending nor Running (a failure to report).
    failed: BTreeMap<String, String>,
    /// Pods a container of which was seen restarted, with the highest count seen.
    restarted: BTreeMap<String, i32>,
}

type Shared = Arc<Mutex<Timeline>>;

fn lock(timeline: &Shared) -> parking_lot::MutexGuard<'_, Timeline> {
    timeline.lock()
}

/// Watches the phase's pods until aborted, recording first-Running and deletion times; returns
/// once the watch's first list is in.
async fn watch_pods(
    pods: Api<WatchedPod>,
    phase: &str,
    timeline: Shared,
) -> tokio::task::JoinHandle<()> {
    let config = watcher::Config::default().labels(&format!("{PHASE_LABEL}={phase}"));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let handle = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut stream = watcher(pods, config).boxed();
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let status = pod.status.unwrap_or_default();
                    let restarts = status
                        .container_statuses
                        .iter()
                        .map(|c| c.restart_count)
                        .max()
                        .unwrap_or(0);
                    let phase = status.phase.unwrap_or_default();
                    let mut t = lock(&timeline);
                    if restarts > 0 {
                        t.restarted.insert(name.clone(), restarts);
                    }
                    match phase.as_str() {
                        "Running" => {
                            t.running.entry(name).or_insert(now);
                        }
                        "" | "Pending" => {}
                        other => {
                            t.failed.insert(name, other.to_owned());
                        }
                    }
                }
                Ok(watcher::Event::Delete(pod)) => {
                    let name = pod.metadata.name.unwrap_or_default();
                    lock(&timeline).gone.entry(name).or_insert(now);
                }
                Ok(watcher::Event::Init) => {}
                // The watcher relists by itself; a gap only delays what it sees.
                Err(error) => println!("(pod watch: {error}; it retries)"),
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(60), ready_rx)
        .await
        .expect("the pod watch's first list")
        .expect("the pod watch task");
    handle
}

/// Waits (checking the watch's record, no API calls) until `done` holds, or fails the run.
async fn wait_for(
    what: &str,
    timeout: Duration,
    timeline: &Shared,
    done: impl Fn(&Timeline) -> bool,
) {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let t = lock(timeline);
            if done(&t) {
                return;
            }
            let failed: Vec<_> = t.failed.iter().take(5).collect();
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}: {} created, {} seen Running, \
                 {} gone, {} failed (e.g. {failed:?})",
                t.created.len(),
                t.running.len(),
                t.gone.len(),
                t.failed.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// One phase

/// Who drives the pods to Running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    Kwok,
    Ours { quotas: bool },
}

impl Driver {
    fn label(self) -> &'static str {
        match self {
            Driver::Kwok => "kwok",
            Driver::Ours { quotas: false } => "ours (quotas off)",
            Driver::Ours { quotas: true } => "ours (quotas on)",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Load {
    size: usize,
    replicas: u32,
    /// Pods per second (0: as fast as the apiserver takes them).
    rate: f64,
    /// The pods mount their service account's token.
    tokens: bool,
    /// What is done to the daemons while the pods are created.
    disruption: Disruption,
}

/// What is done to the daemon replicas while the pods are created (`PODS_BENCH_DISRUPTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disruption {
    None,
    /// Once half the pods are created, the middle replica is killed with SIGKILL and started
    /// again at once.
    Kill9,
    /// Each replica in turn, highest ordinal first, is stopped with SIGTERM and started again;
    /// the next once its successor is ready and a further share of the pods is created.
    Rolling,
}

impl Disruption {
    fn parse(text: &str) -> Self {
        match text.trim() {
            "none" | "" => Self::None,
            "kill9" => Self::Kill9,
            "rolling" => Self::Rolling,
            other => panic!("PODS_BENCH_DISRUPTION: {other:?} is none of none, kill9, rolling"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Kill9 => "kill9",
            Self::Rolling => "rolling",
        }
    }
}

/// The figures of one phase.
#[derive(Debug, Default)]
struct Figures {
    created_in: f64,
    all_running: f64,
    all_gone: f64,
    running_p50: f64,
    running_p99: f64,
    apiserver: ApiserverCounts,
    /// mock-eci's calls by action (every result), and those answered `Throttling*`.
    eci_calls: BTreeMap<String, f64>,
    eci_throttled: f64,
    /// The apiserver's peak requests in flight (by kind) and waiting in its flow-control
    /// queues, sampled every 2 s through the phase.
    apiserver_peaks: BTreeMap<String, f64>,
    status_writes: Option<f64>,
    /// The daemons' own API requests by operation (their `kube_requests_total`), summed over
    /// the replicas: which part of the daemon asked for what the apiserver counted.
    daemon_requests: BTreeMap<String, f64>,
    events_dropped: Option<f64>,
    /// Routine Events still queued in the daemons when every pod was Running (they yield to
    /// pod writes), and by when the queues were empty, seconds after the first create (polled
    /// from all gone on: an earlier end reads as the time all were gone).
    events_waiting_at_running: Option<f64>,
    events_sent_by: Option<f64>,
    cpu_to_running: Option<f64>,
    /// The largest replica's resident set when every pod was Running.
    rss_at_running_mib: Option<f64>,
    cpu_total: Option<f64>,
    peak_rss_mib: Option<f64>,
    /// CPU seconds this benchmark process (creates, deletes, the pod watch) used in the phase.
    bench_cpu: f64,
    /// CPU seconds each other process on the machine used from the first create to all
    /// Running, by command name ([`COMPONENTS`]): on these two cores they share with the
    /// apiserver, so this shows where the cores went.
    components_to_running: BTreeMap<String, f64>,
    /// When the daemons' sampled resident set was largest: [`peak_stage`].
    rss_peak: Value,
    /// What was done to the daemons and what held afterwards ([`after_disruption`]).
    disruption: Option<Value>,
}

/// The processes besides the daemons and this benchmark that work during a phase, by command
/// name as `/proc/<pid>/comm` gives it (kube-controller-manager's is cut at 15 bytes). kwok runs
/// in both phases (it watches every pod, including ours); mock-eci only in ours, where it
/// stands in for a service that runs elsewhere in production.
const COMPONENTS: [&str; 6] = [
    "kube-apiserver",
    "etcd",
    "kube-controller",
    "kube-scheduler",
    "kwok",
    "mock-eci",
];

/// CPU seconds used so far by this benchmark's processes of each [`COMPONENTS`] name.
fn components_cpu() -> BTreeMap<String, f64> {
    COMPONENTS
        .iter()
        .map(|name| {
            let pids = descendants_named(std::process::id(), name);
            ((*name).to_owned(), pids.into_iter().map(cpu_seconds).sum())
        })
        .collect()
}

/// A daemon replica of a phase: its ordinal, environment, process name and ops URLs.
struct Replica {
    ordinal: u32,
    /// What [`Harness::start_daemon`] is given, again for a restart (the same ops address).
    env: Vec<(String, String)>,
    process: String,
    metrics: String,
    ready: String,
}

impl Replica {
    fn start(&mut self, h: &mut Harness) {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.process = h.start_daemon(self.ordinal, &env).unwrap();
    }

    fn pid(&self, h: &mut Harness) -> u32 {
        h.process(&self.process).unwrap().pid().unwrap()
    }
}

fn pod_manifest(name: &str, node: &str, phase: &str, tokens: bool) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "metadata": {"name": name, "labels": {PHASE_LABEL: phase}},
        "spec": {
            "nodeName": node, "automountServiceAccountToken": tokens,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "app", "image": "registry.example.com/app:1",
                // The mock's container stops at once when asked to.
                "env": [{"name": "MOCK_ECI_STOP_AFTER", "value": "0s"}]}],
        },
    }))
    .unwrap()
}

/// What the benchmark reads of a pod: its name, its resourceVersion (the watch resumes from
/// it) and its phase. The benchmark's process shares the machine's two cores with everything
/// it measures, so it decodes nothing more: whole `Pod`s (managed fields and all, in a debug
/// build) from its watch and from every create and delete answer were 60–74 CPU seconds of a
/// 30,000-pod phase, as much as two thirds of what the apiserver used.
#[derive(Clone, Debug, serde::Deserialize)]
struct WatchedPod {
    #[serde(deserialize_with = "name_and_version")]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<WatchedStatus>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchedStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    container_statuses: Vec<WatchedContainer>,
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchedContainer {
    #[serde(default)]
    restart_count: i32,
}

/// A pod's metadata with only what the watch needs (the rest is skipped, not decoded).
fn name_and_version<'de, D: serde::Deserializer<'de>>(from: D) -> Result<ObjectMeta, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Read {
        name: Option<String>,
        namespace: Option<String>,
        resource_version: Option<String>,
    }
    let read = <Read as serde::Deserialize>::deserialize(from)?;
    Ok(ObjectMeta {
        name: read.name,
        namespace: read.namespace,
        resource_version: read.resource_version,
        ..ObjectMeta::default()
    })
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group((): &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version((): &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural((): &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Sends `request` (a create or a delete) and leaves its answer undecoded (see [`WatchedPod`]).
async fn send_undecoded(client: &kube::Client, request: http::Request<Vec<u8>>) {
    client.request_text(request).await.unwrap();
}

/// Waits for what a token-mounting pod needs in `namespace`, both made by
/// kube-controller-manager: the `default` ServiceAccount (admission refuses the pod without it)
/// and the `kube-root-ca.crt` ConfigMap (its projected volume's CA).
async fn wait_for_token_sources(client: &kube::Client, namespace: &str) {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut pause = Duration::from_millis(50);
    while accounts.get_opt("default").await.unwrap().is_none()
        || config_maps
            .get_opt("kube-root-ca.crt")
            .await
            .unwrap()
            .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{namespace}: no default ServiceAccount or kube-root-ca.crt after 120 s"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// A kwok-run node for `pods` pods, like the fixture's ECS nodes but with that pod capacity.
async fn register_kwok_node(client: &kube::Client, name: &str, pods: usize) {
    let nodes: Api<Node> = Api::all(client.clone());
    let (label, value) = integration::cluster::KWOK_NODE_LABEL;
    let capacity = json!({"cpu": "1000", "memory": "4Ti", "pods": pods.to_string()});
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {label: value, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

async fn node_ready(client: &kube::Client, name: &str) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .is_some_and(|node| {
            node.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

async fn wait_nodes_ready(h: &Harness, names: &[String]) {
    for name in names {
        h.wait_for(
            &format!("node {name} Ready"),
            Duration::from_secs(120),
            |h| async move { node_ready(&h.client(), name).await },
        )
        .await
        .unwrap();
    }
}

/// Starts mock-eci and `replicas` daemons; returns them once their nodes are Ready.
async fn start_ours(h: &mut Harness, load: Load, quotas: bool) -> Vec<Replica> {
    let mut mock_args = vec![
        "--provisioning-delay",
        PROVISIONING_DELAY,
        "--scheduling-delay",
        "50ms",
        "--ip-cidr",
        "10.0.0.0/8",
    ];
    if !quotas {
        mock_args.push("--no-rate-limits");
    }
    h.start_mock_eci(&mock_args).await.unwrap();
    if load.replicas > 1 || load.disruption != Disruption::None {
        // Replicas learn how many share the account's quotas from the StatefulSet, and from
        // it whether a stop signal is a restart (the node stays) or a scale-in (it drains).
        h.create_daemon_statefulset(i32::try_from(load.replicas).unwrap())
            .await
            .unwrap();
    }
    let per_node = load.size.div_ceil(load.replicas as usize);
    let quota_pods = (per_node + 100).to_string();
    let worker_threads = env_or("PODS_BENCH_WORKER_THREADS", 1_usize).to_string();
    let mut replicas = Vec::new();
    for ordinal in 0..load.replicas {
        let port = integration::harness::free_port().unwrap();
        let addr = format!("127.0.0.1:{port}");
        let mut env: Vec<(&str, &str)> = vec![
            ("POD_STATUS_POLL_INTERVAL", "500ms"),
            ("POD_RESYNC_INTERVAL", "60s"),
            ("MAX_CONCURRENT_CREATES", "64"),
            ("METRICS_ADDR", addr.as_str()),
            ("ECI_QUOTA_POD", quota_pods.as_str()),
            ("RUST_LOG", "warn"),
            ("WORKER_THREADS", worker_threads.as_str()),
            // The product's defaults, not the harness's test timings (1 s Lease renewals and
            // 250 ms probes would load the apiserver and ECI for nothing a user runs).
            ("LEASE_DURATION_SECONDS", ""),
            ("LEASE_RENEW_INTERVAL", ""),
            ("ECI_PROBE_INTERVAL", ""),
            ("ECI_UNREACHABLE_THRESHOLD", ""),
            ("NODE_STATUS_MAX_INTERVAL", ""),
        ];
        if !quotas {
            env.push(("NO_ECI_CLIENT_RATE_LIMITS", "true"));
        }
        let mut replica = Replica {
            ordinal,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            process: String::new(),
            metrics: format!("http://{addr}/metrics"),
            ready: format!("http://{addr}/readyz"),
        };
        replica.start(h);
        replicas.push(replica);
    }
    let nodes: Vec<String> = (0..load.replicas).map(|i| h.node_name(i)).collect();
    wait_nodes_ready(h, &nodes).await;
    replicas
}

/// Runs one phase on a harness of its own (the binary's shared control plane).
async fn run_phase(driver: Driver, load: Load) -> Figures {
    // kwok has no replicas to disrupt: its phase is the undisturbed reference.
    let load = match driver {
        Driver::Kwok => Load {
            disruption: Disruption::None,
            ..load
        },
        Driver::Ours { .. } => load,
    };
    // Unaudited: the fixture's audit log records the daemon's requests and not kwok's.
    let mut h = Harness::start_with(FixtureOptions {
        without_audit_log: true,
        ..FixtureOptions::default()
    })
    .await
    .unwrap();
    let client = h.client();
    let phase = format!("{}-{}", h.daemon_set_name(), load.size);
    let (nodes, mut replicas) = match driver {
        Driver::Kwok => {
            let names: Vec<String> = (0..load.replicas)
                .map(|i| format!("kwok-{}", h.node_name(i)))
                .collect();
            let per_node = load.size.div_ceil(load.replicas as usize).max(110);
            for name in &names {
                register_kwok_node(&client, name, per_node).await;
            }
            wait_nodes_ready(&h, &names).await;
            (names, Vec::new())
        }
        Driver::Ours { quotas } => {
            let replicas = start_ours(&mut h, load, quotas).await;
            (
                (0..load.replicas).map(|i| h.node_name(i)).collect(),
                replicas,
            )
        }
    };
    let namespace = h.create_namespace("bench").await.unwrap();
    if load.tokens {
        wait_for_token_sources(&client, &namespace).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let timeline: Shared = Arc::default();
    let watch = watch_pods(
        Api::namespaced(client.clone(), &namespace),
        &phase,
        timeline.clone(),
    )
    .await;
    let pods_url = kube::core::Request::new(pods.resource_url());
    // Let the node's first status and Lease writes settle out of the phase's counts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for_pod_writes_to_settle(&client).await;
    let mock_before = match h.mock_eci() {
        Some(m) => fetch(&format!("{}/metrics", m.admin)).await,
        None => String::new(),
    };
    let before = apiserver_counts(&client).await;
    let peaks: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
    let sampler = sample_apiserver_load(client.clone(), Arc::clone(&peaks));
    let bench_cpu = cpu_seconds(std::process::id());
    let components_before = components_cpu();
    let size = load.size;
    let names: Vec<String> = (0..size).map(|i| format!("bench-{i:05}")).collect();
    let live_pids: Arc<Mutex<Vec<u32>>> =
        Arc::new(Mutex::new(replicas.iter().map(|r| r.pid(&mut h)).collect()));

    let started = Instant::now();
    let rss_samples: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
    let rss_sampler = sample_daemon_rss(Arc::clone(&live_pids), started, Arc::clone(&rss_samples));
    let paced_start = tokio::time::Instant::now();
    let creates =
        futures::stream::iter(names.iter().enumerate()).for_each_concurrent(64, |(i, name)| {
            let create = pods_url
                .create(
                    &PostParams::default(),
                    pod_manifest(name, &nodes[i % nodes.len()], &phase, load.tokens),
                )
                .unwrap();
            let client = &client;
            let due = (load.rate > 0.0)
                .then(|| paced_start + Duration::from_secs_f64(i as f64 / load.rate));
            let timeline = timeline.clone();
            async move {
                if let Some(due) = due {
                    tokio::time::sleep_until(due).await;
                }
                lock(&timeline).created.insert(name.clone(), Instant::now());
                send_undecoded(client, create).await;
            }
        });
    let disruption = disrupt(&mut h, &mut replicas, load, &timeline, &live_pids);
    let ((), disruption_notes) = tokio::join!(creates, disruption);
    let created_in = started.elapsed();
    let bound =
        Duration::from_secs(300) + Duration::from_millis(100) * u32::try_from(size).unwrap();
    wait_for("every pod Running", bound, &timeline, |t| {
        t.running.len() == size
    })
    .await;
    let (all_running, latencies) = {
        let t = lock(&timeline);
        let last = t.running.values().max().copied().unwrap_or(started);
        let mut latencies: Vec<f64> = t
            .running
            .iter()
            .map(|(name, at)| at.duration_since(t.created[name]).as_secs_f64())
            .collect();
        latencies.sort_by(f64::total_cmp);
        (last.duration_since(started), latencies)
    };
    let pids = live_pids.lock().clone();
    let cpu_to_running: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    let components_to_running = diff(&components_cpu(), &components_before);
    // Resident now, against the peak read at the end: a peak far above it is a burst's
    // transient memory (queues, answers in flight, the allocator's arenas), not what is kept.
    let rss_at_running = pids
        .iter()
        .map(|p| proc_status_kib(*p, "VmRSS:") / 1024.0)
        .fold(0.0, f64::max);
    let events_waiting_at_running = events_waiting(&replicas).await;
    let disruption_checks = if load.disruption == Disruption::None {
        None
    } else {
        Some(after_disruption(&h, &namespace, size, &timeline, &mock_before).await)
    };

    let deleting = Instant::now();
    let deleting_from = deleting.duration_since(started).as_secs_f64();
    futures::stream::iter(names.iter())
        .for_each_concurrent(64, |name| {
            let delete = pods_url.delete(name, &DeleteParams::default()).unwrap();
            let client = &client;
            async move { send_undecoded(client, delete).await }
        })
        .await;
    wait_for("every pod gone", bound, &timeline, |t| t.gone.len() == size).await;
    let all_gone = {
        let t = lock(&timeline);
        t.gone
            .values()
            .max()
            .copied()
            .unwrap_or(deleting)
            .duration_since(deleting)
    };
    // The Events that waited for the pods' writes go now: counted in this phase's requests.
    let events_sent_by = if replicas.is_empty() {
        None
    } else {
        let deadline = Instant::now() + Duration::from_secs(600);
        while events_waiting(&replicas).await > 0.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Some(started.elapsed().as_secs_f64())
    };
    let after = apiserver_counts(&client).await;
    sampler.abort();
    rss_sampler.abort();
    watch.abort();
    let left = pods
        .list_metadata(&ListParams::default().labels(&format!("{PHASE_LABEL}={phase}")))
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(
        left, 0,
        "{left} pods left behind after every pod was seen deleted"
    );

    let mut figures = Figures {
        created_in: created_in.as_secs_f64(),
        all_running: all_running.as_secs_f64(),
        all_gone: all_gone.as_secs_f64(),
        running_p50: quantile(&latencies, 0.5),
        running_p99: quantile(&latencies, 0.99),
        apiserver: after.since(&before),
        apiserver_peaks: peaks.lock().clone(),
        bench_cpu: cpu_seconds(std::process::id()) - bench_cpu,
        components_to_running,
        rss_peak: if pids.is_empty() {
            Value::Null
        } else {
            peak_stage(
                &rss_samples.lock(),
                created_in.as_secs_f64(),
                all_running.as_secs_f64(),
                deleting_from,
            )
        },
        ..Figures::default()
    };
    if !replicas.is_empty() {
        daemon_figures(&mut h, &replicas, &pids, &mock_before, &mut figures).await;
        figures.cpu_to_running = Some(cpu_to_running);
        figures.rss_at_running_mib = Some(rss_at_running);
        figures.events_waiting_at_running = Some(events_waiting_at_running);
        figures.events_sent_by = events_sent_by;
        figures.disruption = disruption_checks.map(|mut checks| {
            checks["done"] = json!(disruption_notes);
            checks
        });
        no_group_left(&h).await;
    }
    if driver == Driver::Kwok {
        let api: Api<Node> = Api::all(client.clone());
        for name in &nodes {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
    }
    h.shutdown(Duration::from_secs(10)).await;
    figures
}

/// Does the load's disruption to `replicas` while the pods are created (see the module's doc),
/// keeping `live_pids` on the processes that run; returns what it did.
async fn disrupt(
    h: &mut Harness,
    replicas: &mut [Replica],
    load: Load,
    timeline: &Shared,
    live_pids: &Mutex<Vec<u32>>,
) -> Vec<String> {
    let bound =
        Duration::from_secs(300) + Duration::from_millis(20) * u32::try_from(load.size).unwrap();
    let created = || lock(timeline).created.len();
    let mut done = Vec::new();
    match load.disruption {
        Disruption::None => {}
        Disruption::Kill9 => {
            let half = load.size / 2;
            wait_for("half the pods created", bound, timeline, |t| {
                t.created.len() >= half
            })
            .await;
            let replica = &mut replicas[replicas.len() / 2];
            h.process(&replica.process).unwrap().kill().await;
            let at = created();
            replica.start(h);
            live_pids.lock()[replica.ordinal as usize] = replica.pid(h);
            done.push(format!(
                "replica {} killed with SIGKILL after {at} creates and started again at once",
                replica.ordinal
            ));
        }
        Disruption::Rolling => {
            // Spread over the rollout: replica k of n goes once k/(n+1) of the pods are
            // created, so each replacement meets pods at every stage of their start.
            let turns = replicas.len() + 1;
            for (turn, replica) in replicas.iter_mut().rev().enumerate() {
                let due = load.size * (turn + 1) / turns;
                wait_for("the replica's turn", bound, timeline, |t| {
                    t.created.len() >= due
                })
                .await;
                let at = created();
                let stopping = Instant::now();
                let exit = h
                    .process(&replica.process)
                    .unwrap()
                    .terminate(Duration::from_secs(120))
                    .await;
                assert!(
                    exit.is_some_and(|e| e.success()),
                    "replica {} did not stop cleanly on SIGTERM: {exit:?}",
                    replica.ordinal
                );
                let stopped_in = stopping.elapsed();
                replica.start(h);
                live_pids.lock()[replica.ordinal as usize] = replica.pid(h);
                wait_ready(&replica.ready, Duration::from_secs(120)).await;
                done.push(format!(
                    "replica {}: SIGTERM after {at} creates, stopped in {:.1} s, successor \
                     ready {:.1} s after the signal",
                    replica.ordinal,
                    stopped_in.as_secs_f64(),
                    stopping.elapsed().as_secs_f64()
                ));
            }
        }
    }
    done
}

/// Waits until a daemon's `/readyz` answers 200 (its node registered and its Lease held).
async fn wait_ready(url: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let ready = reqwest::get(url)
            .await
            .is_ok_and(|answer| answer.status().is_success());
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} not ready after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What must hold at all Running after a disruption, asserted: the fault suite's invariants
/// (none lost, leaked or duplicated; every pod Running and Ready on its node), no pod ever
/// seen failed, no container restarted, no group deleted (so none recreated). Returns the
/// figures for the report.
async fn after_disruption(
    h: &Harness,
    namespace: &str,
    size: usize,
    timeline: &Shared,
    mock_before: &str,
) -> Value {
    let deletes = |text: &str| {
        grouped(text, "mock_eci_calls_total", |l| {
            (l.get("action").map(String::as_str) == Some("DeleteContainerGroup")).then(String::new)
        })
        .values()
        .sum::<f64>()
    };
    let mock_now = fetch(&format!("{}/metrics", h.mock_eci().unwrap().admin)).await;
    let deleted = deletes(&mock_now) - deletes(mock_before);
    let checking = Instant::now();
    let convergence = h
        .converge(
            &integration::harness::invariants::Expect::new(h, namespace, size),
            Duration::from_secs(600),
        )
        .await;
    let (failed, restarted) = {
        let t = lock(timeline);
        (t.failed.clone(), t.restarted.clone())
    };
    println!(
        "after the disruption: {}; failed {}, restarted {}, groups deleted {deleted} (checked \
         in {:.1} s)",
        convergence.report,
        failed.len(),
        restarted.len(),
        checking.elapsed().as_secs_f64()
    );
    assert!(
        convergence.converged,
        "the invariants did not hold: {}",
        convergence.report
    );
    assert!(failed.is_empty(), "pods seen failed: {failed:?}");
    assert!(restarted.is_empty(), "containers restarted: {restarted:?}");
    assert!(
        deleted == 0.0,
        "{deleted} DeleteContainerGroup calls before the delete phase"
    );
    json!({
        "converged_in_s": convergence.seconds,
        "invariants": convergence.report.to_string(),
        "pods_failed": failed.len(),
        "pods_restarted": restarted.len(),
        "groups_deleted": deleted,
    })
}

/// The routine Events the replicas hold queued now.
async fn events_waiting(replicas: &[Replica]) -> f64 {
    let mut waiting = 0.0;
    for replica in replicas {
        let text = fetch(&replica.metrics).await;
        waiting += grouped(&text, "virtual_node_eci_events_waiting", |_| {
            Some(String::new())
        })
        .values()
        .sum::<f64>();
    }
    waiting
}

/// ECI calls, status writes, CPU and memory of a daemon phase (after every pod is gone).
async fn daemon_figures(
    h: &mut Harness,
    replicas: &[Replica],
    pids: &[u32],
    mock_before: &str,
    figures: &mut Figures,
) {
    let mock_after = fetch(&format!("{}/metrics", h.mock_eci().unwrap().admin)).await;
    let by_action =
        |text: &str| grouped(text, "mock_eci_calls_total", |l| l.get("action").cloned());
    let throttled = |text: &str| -> f64 {
        grouped(text, "mock_eci_calls_total", |l| {
            l.get("result")
                .filter(|r| r.starts_with("Throttling"))
                .map(|_| String::new())
        })
        .values()
        .sum()
    };
    figures.eci_calls = diff(&by_action(&mock_after), &by_action(mock_before));
    figures.eci_throttled = throttled(&mock_after) - throttled(mock_before);
    let mut dropped = 0.0;
    for replica in replicas {
        let text = fetch(&replica.metrics).await;
        let requests = grouped(&text, "virtual_node_eci_kube_requests_total", |l| {
            l.get("operation").cloned()
        });
        for (operation, count) in requests {
            *figures.daemon_requests.entry(operation).or_default() += count;
        }
        dropped += grouped(&text, "virtual_node_eci_events_dropped_total", |_| {
            Some(String::new())
        })
        .values()
        .sum::<f64>();
    }
    figures.status_writes = Some(
        figures
            .daemon_requests
            .get("pod_status_patch")
            .copied()
            .unwrap_or(0.0),
    );
    figures.events_dropped = Some(dropped);
    figures.cpu_total = Some(pids.iter().map(|p| cpu_seconds(*p)).sum());
    // VmHWM: the process's peak resident set; the largest replica's.
    figures.peak_rss_mib = Some(
        pids.iter()
            .map(|p| proc_status_kib(*p, "VmHWM:") / 1024.0)
            .fold(0.0, f64::max),
    );
}

/// Fails the run when mock-eci still holds a group of this phase's cluster after a while.
async fn no_group_left(h: &Harness) {
    let admin = h.mock_eci().unwrap().admin;
    let cluster = h.cluster_name();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let groups: Vec<Value> =
            serde_json::from_str(&fetch(&format!("{admin}/admin/groups")).await)
                .expect("mock-eci's groups as JSON");
        let ours = groups
            .iter()
            .filter(|g| {
                g["tags"].as_array().is_some_and(|tags| {
                    tags.iter().any(|t| {
                        t["key"] == integration::harness::invariants::TAG_CLUSTER
                            && t["value"] == cluster.as_str()
                    })
                })
            })
            .count();
        if ours == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{ours} container groups left in mock-eci 120 s after every pod was gone"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The report

fn ratio(ours: f64, kwok: f64) -> String {
    if kwok > 0.0 {
        format!("{:.2}×", ours / kwok)
    } else if ours > 0.0 {
        "(kwok 0)".to_owned()
    } else {
        "–".to_owned()
    }
}

fn row(name: &str, kwok: f64, ours: &[f64], unit: &str, digits: usize) -> Vec<String> {
    let mut cells = vec![name.to_owned(), format!("{kwok:.digits$}{unit}")];
    for value in ours {
        cells.push(format!("{value:.digits$}{unit}"));
        cells.push(ratio(*value, kwok));
    }
    cells
}

fn opt_row(name: &str, ours: &[Option<f64>], unit: &str, digits: usize) -> Vec<String> {
    let mut cells = vec![name.to_owned(), "–".to_owned()];
    for value in ours {
        cells.push(value.map_or("–".into(), |v| format!("{v:.digits$}{unit}")));
        cells.push(String::new());
    }
    cells
}

/// The comparison of `kwok` and the daemon phases as a Markdown table.
fn table(load: Load, kwok: &Figures, ours: &[(Driver, Figures)]) -> String {
    let n = load.size as f64;
    let mut header = vec!["per run".to_owned(), "kwok".to_owned()];
    for (driver, _) in ours {
        header.push(driver.label().to_owned());
        header.push("ratio".to_owned());
    }
    let pick = |f: &dyn Fn(&Figures) -> f64| ours.iter().map(|(_, o)| f(o)).collect::<Vec<_>>();
    let mut rows = vec![
        row(
            "create calls done (s)",
            kwok.created_in,
            &pick(&|f: &Figures| f.created_in),
            "",
            1,
        ),
        row(
            "first create → all Running (s)",
            kwok.all_running,
            &pick(&|f: &Figures| f.all_running),
            "",
            1,
        ),
        row(
            "first delete → all gone (s)",
            kwok.all_gone,
            &pick(&|f: &Figures| f.all_gone),
            "",
            1,
        ),
        row(
            "create → Running p50 (s)",
            kwok.running_p50,
            &pick(&|f: &Figures| f.running_p50),
            "",
            2,
        ),
        row(
            "create → Running p99 (s)",
            kwok.running_p99,
            &pick(&|f: &Figures| f.running_p99),
            "",
            2,
        ),
    ];
    let mut keys: Vec<&String> = kwok.apiserver.requests.keys().collect();
    for (_, o) in ours {
        keys.extend(o.apiserver.requests.keys());
    }
    keys.sort();
    keys.dedup();
    let per_pod =
        |f: &Figures, key: &str| f.apiserver.requests.get(key).copied().unwrap_or(0.0) / n;
    let total = |f: &Figures| f.apiserver.requests.values().sum::<f64>() / n;
    rows.push(row(
        "apiserver requests / pod, all",
        total(kwok),
        &pick(&total),
        "",
        2,
    ));
    // Requests below one per hundred pods in every column are housekeeping that happened to
    // fall in the phase (the namespace controller emptying the previous phase's namespace,
    // discovery, Lease renewals): summed in one row rather than listed kind by kind.
    let (listed, other): (Vec<&String>, Vec<&String>) = keys.into_iter().partition(|key| {
        per_pod(kwok, key) >= 0.01 || ours.iter().any(|(_, o)| per_pod(o, key) >= 0.01)
    });
    for key in listed {
        let ours: Vec<f64> = ours.iter().map(|(_, o)| per_pod(o, key)).collect();
        rows.push(row(
            &format!("  {key} / pod"),
            per_pod(kwok, key),
            &ours,
            "",
            3,
        ));
    }
    if !other.is_empty() {
        let summed = |f: &Figures| other.iter().map(|key| per_pod(f, key)).sum::<f64>();
        rows.push(row(
            &format!("  {} other kinds, each < 0.01 / pod", other.len()),
            summed(kwok),
            &pick(&summed),
            "",
            3,
        ));
    }
    let means: [(&str, SumAndCount); 2] = [
        ("apiserver pod-write latency, mean (ms)", |a| {
            (a.pod_write_seconds, a.pod_writes)
        }),
        ("  of which pod creates, mean (ms)", |a| {
            (a.pod_create_seconds, a.pod_creates)
        }),
    ];
    for (name, sum_and_count) in means {
        let mean_ms = |f: &Figures| {
            let (seconds, count) = sum_and_count(&f.apiserver);
            1000.0 * seconds / count.max(1.0)
        };
        rows.push(row(name, mean_ms(kwok), &pick(&mean_ms), "", 1));
    }
    for what in ["inflight mutating", "inflight readOnly", "queued"] {
        let peak = |f: &Figures| f.apiserver_peaks.get(what).copied().unwrap_or(0.0);
        rows.push(row(
            &format!("apiserver requests {what}, peak"),
            peak(kwok),
            &pick(&peak),
            "",
            0,
        ));
    }
    rows.push(row(
        "apiserver 429s",
        kwok.apiserver.throttled,
        &pick(&|f: &Figures| f.apiserver.throttled),
        "",
        0,
    ));
    let conflicts = |f: &Figures| f.apiserver.conflicts.values().fold(0.0, |a, b| a + b);
    rows.push(row(
        "apiserver 409s",
        conflicts(kwok),
        &pick(&conflicts),
        "",
        0,
    ));
    let mut actions: Vec<&String> = ours.iter().flat_map(|(_, o)| o.eci_calls.keys()).collect();
    actions.sort();
    actions.dedup();
    for action in actions {
        let values: Vec<Option<f64>> = ours
            .iter()
            .map(|(_, o)| Some(o.eci_calls.get(action).copied().unwrap_or(0.0) / n))
            .collect();
        rows.push(opt_row(&format!("ECI {action} / pod"), &values, "", 3));
    }
    let opt =
        |f: &dyn Fn(&Figures) -> Option<f64>| ours.iter().map(|(_, o)| f(o)).collect::<Vec<_>>();
    rows.push(opt_row(
        "ECI calls throttled",
        &opt(&|f: &Figures| Some(f.eci_throttled)),
        "",
        0,
    ));
    // With quotas on, ECI's own rate limit bounds the run: the floor is the burst at once and
    // the rest at the documented rate (the target: within 10 % of it).
    let floor = |driver: &Driver, action: &str| match driver {
        Driver::Ours { quotas: true } => Some(quota_floor(action, n)),
        _ => None,
    };
    for (action, what, took) in [
        (
            "CreateContainerGroup",
            "creates",
            (|f: &Figures| f.all_running) as fn(&Figures) -> f64,
        ),
        ("DeleteContainerGroup", "deletes", |f: &Figures| f.all_gone),
    ] {
        let floors: Vec<Option<f64>> = ours.iter().map(|(d, _)| floor(d, action)).collect();
        let ratios: Vec<Option<f64>> = ours
            .iter()
            .zip(&floors)
            .map(|((_, f), floor)| floor.map(|floor| took(f) / floor))
            .collect();
        rows.push(opt_row(
            &format!("ECI quota floor for {n} {what} (s)"),
            &floors,
            "",
            1,
        ));
        rows.push(opt_row(
            &format!("  measured / floor ({what})"),
            &ratios,
            "×",
            2,
        ));
    }
    rows.push(opt_row(
        "daemon status writes / pod",
        &opt(&|f: &Figures| f.status_writes.map(|w| w / load.size as f64)),
        "",
        2,
    ));
    rows.push(opt_row(
        "Events dropped",
        &opt(&|f: &Figures| f.events_dropped),
        "",
        0,
    ));
    rows.push(opt_row(
        "Events still queued at all Running",
        &opt(&|f: &Figures| f.events_waiting_at_running),
        "",
        0,
    ));
    rows.push(opt_row(
        "Event queue empty by, s after the first create (polled from all gone on)",
        &opt(&|f: &Figures| f.events_sent_by),
        "",
        1,
    ));
    rows.push(opt_row(
        "daemon CPU to all Running (s)",
        &opt(&|f: &Figures| f.cpu_to_running),
        "",
        1,
    ));
    rows.push(opt_row(
        "daemon CPU, whole run (s)",
        &opt(&|f: &Figures| f.cpu_total),
        "",
        1,
    ));
    rows.push(opt_row(
        "daemon RSS at all Running, largest replica (MiB)",
        &opt(&|f: &Figures| f.rss_at_running_mib),
        "",
        1,
    ));
    rows.push(opt_row(
        "daemon peak RSS, largest replica (MiB)",
        &opt(&|f: &Figures| f.peak_rss_mib),
        "",
        1,
    ));
    rows.push(opt_row(
        "  sampled peak, s after the first create (stage in the JSON)",
        &opt(&|f: &Figures| f.rss_peak["at_s"].as_f64()),
        "",
        1,
    ));
    rows.push(row(
        "benchmark process CPU (s)",
        kwok.bench_cpu,
        &pick(&|f: &Figures| f.bench_cpu),
        "",
        1,
    ));
    for name in COMPONENTS {
        let used = |f: &Figures| f.components_to_running.get(name).copied().unwrap_or(0.0);
        rows.push(row(
            &format!("{name} CPU to all Running (s)"),
            used(kwok),
            &pick(&used),
            "",
            1,
        ));
    }
    // Everything measured, over the time to all Running: how many of the machine's cores were
    // busy (the daemons' share is counted from process start, a little more than the phase's).
    let cores = |f: &Figures| {
        let used = f.components_to_running.values().sum::<f64>() + f.cpu_to_running.unwrap_or(0.0);
        used / f.all_running
    };
    rows.push(row(
        "cores busy to all Running (the above and the daemons)",
        cores(kwok),
        &pick(&cores),
        "",
        2,
    ));
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push_str(&format!("|{}\n", " --- |".repeat(header.len())));
    for cells in rows {
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// The shortest time ECI's documented quota for `action` allows `n` calls in: a burst at once,
/// the rest at the per-minute rate.
fn quota_floor(action: &str, n: f64) -> f64 {
    let per_minute = eci_proto::quota::per_minute(action).unwrap_or(1);
    let burst = f64::from(eci_proto::quota::burst(per_minute));
    (n - burst).max(0.0) / f64::from(per_minute) * 60.0
}

fn to_json(f: &Figures, size: usize) -> Value {
    let n = size as f64;
    let per_pod = |m: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        m.iter().map(|(k, v)| (k.clone(), v / n)).collect()
    };
    json!({
        "created_in_s": f.created_in,
        "all_running_s": f.all_running,
        "all_gone_s": f.all_gone,
        "create_to_running_p50_s": f.running_p50,
        "create_to_running_p99_s": f.running_p99,
        "apiserver_requests_per_pod": per_pod(&f.apiserver.requests),
        "apiserver_429": f.apiserver.throttled,
        "apiserver_409_per_pod": per_pod(&f.apiserver.conflicts),
        "daemon_requests_per_pod": per_pod(&f.daemon_requests),
        "apiserver_peaks": f.apiserver_peaks,
        "apiserver_pod_write_mean_s": f.apiserver.pod_write_seconds / f.apiserver.pod_writes.max(1.0),
        "apiserver_pod_create_mean_s": f.apiserver.pod_create_seconds / f.apiserver.pod_creates.max(1.0),
        "eci_calls_per_pod": per_pod(&f.eci_calls),
        "eci_throttled": f.eci_throttled,
        "status_writes_per_pod": f.status_writes.map(|w| w / n),
        "events_dropped": f.events_dropped,
        "events_waiting_at_running": f.events_waiting_at_running,
        "events_sent_by_s": f.events_sent_by,
        "daemon_cpu_to_running_s": f.cpu_to_running,
        "daemon_rss_at_running_mib": f.rss_at_running_mib,
        "daemon_cpu_total_s": f.cpu_total,
        "daemon_peak_rss_mib": f.peak_rss_mib,
        "bench_process_cpu_s": f.bench_cpu,
        "cpu_to_running_s_by_process": f.components_to_running,
        "daemon_rss_sampled_peak": f.rss_peak,
        "disruption": f.disruption,
    })
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    integration::harness::build_binaries().expect("the binaries build");
    let sizes: Vec<usize> = std::env::var("PODS_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let quotas: Vec<bool> = std::env::var("PODS_BENCH_QUOTAS")
        .unwrap_or_else(|_| "off".into())
        .split(',')
        .map(|s| match s.trim() {
            "on" => true,
            "off" => false,
            other => panic!("PODS_BENCH_QUOTAS: {other:?} is neither on nor off"),
        })
        .collect();
    let replicas: u32 = env_or("PODS_BENCH_REPLICAS", 1).max(1);
    let rate: f64 = env_or("PODS_BENCH_RATE", 0.0);
    let tokens = match std::env::var("PODS_BENCH_TOKENS").as_deref() {
        Ok("on") => true,
        Ok("off") | Err(_) => false,
        Ok(other) => panic!("PODS_BENCH_TOKENS: {other:?} is neither on nor off"),
    };
    let disruption = Disruption::parse(&std::env::var("PODS_BENCH_DISRUPTION").unwrap_or_default());
    let ours_first = match std::env::var("PODS_BENCH_ORDER").as_deref() {
        Ok("ours-first") => true,
        Ok("kwok-first") | Err(_) => false,
        Ok(other) => panic!("PODS_BENCH_ORDER: {other:?} is neither kwok-first nor ours-first"),
    };
    // cargo bench passes `--bench`; only `--out PATH` is ours.
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var("PODS_BENCH_OUT").ok());
    let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load_avg.trim());
    let mut report = Vec::new();
    for size in sizes {
        let load = Load {
            size,
            replicas,
            rate,
            tokens,
            disruption,
        };
        let kwok_phase = || async {
            println!("== {size} pods over {replicas} node(s): kwok ==");
            run_phase(Driver::Kwok, load).await
        };
        let kwok_before = if ours_first {
            None
        } else {
            Some(kwok_phase().await)
        };
        let mut ours = Vec::new();
        for quotas in &quotas {
            let driver = Driver::Ours { quotas: *quotas };
            println!(
                "== {size} pods over {replicas} replica(s): {} ==",
                driver.label()
            );
            ours.push((driver, run_phase(driver, load).await));
        }
        let kwok = match kwok_before {
            Some(kwok) => kwok,
            None => kwok_phase().await,
        };
        let pace = if rate > 0.0 {
            format!("created at {rate} pods/s")
        } else {
            "created as fast as the apiserver takes them".to_owned()
        };
        let mounts = if tokens {
            "each mounting its service account's token"
        } else {
            "no service account token"
        };
        let order = if ours_first {
            "the daemon's phases first, then kwok's"
        } else {
            "kwok's phase first"
        };
        println!(
            "\n{size} pods over {replicas} node(s), {pace}, {mounts}, {order}; mock-eci \
             provisioning delay {PROVISIONING_DELAY}; load average now {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        println!("{}", table(load, &kwok, &ours));
        for (driver, figures) in &ours {
            if let Some(disruption) = &figures.disruption {
                println!(
                    "disruption ({}), {}: {disruption}",
                    load.disruption.label(),
                    driver.label()
                );
            }
        }
        let mut entry = json!({"pods": size, "replicas": replicas, "rate": rate,
            "tokens": tokens, "disruption": disruption.label(), "ours_first": ours_first, "kwok": to_json(&kwok, size)});
        for (driver, figures) in &ours {
            entry[driver.label()] = to_json(figures, size);
            if *driver == (Driver::Ours { quotas: true }) {
                let n = size as f64;
                entry[driver.label()]["create_quota_floor_s"] =
                    json!(quota_floor("CreateContainerGroup", n));
                entry[driver.label()]["delete_quota_floor_s"] =
                    json!(quota_floor("DeleteContainerGroup", n));
            }
        }
        report.push(entry);
    }
    if let Some(path) = out {
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        println!("figures written to {path}");
    }
}
