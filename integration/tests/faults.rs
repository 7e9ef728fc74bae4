//! The fault suite (issue 20): each case breaks something the way real clusters break — on the
//! real control plane (kube-apiserver, kube-controller-manager, kube-scheduler and etcd built
//! from upstream), with two daemon replicas of a real StatefulSet and mock-eci as the ECI —
//! then waits for the system to converge and checks the invariants by reading the apiserver
//! and mock-eci directly (`integration::harness::invariants`): no pod lost, no group leaked or
//! duplicated, none stuck Terminating, every live replica's node Ready, the daemons' counters
//! agreeing with what was observed.
//!
//! `cargo test -p integration --test faults [-- FILTER…]` runs it alone (`-- --list` names the
//! cases). Each case is bounded in time and removes what it made. Cases share the test binary's
//! cluster; those that disturb the whole control plane (restarting kube-apiserver or etcd, a
//! cluster-wide webhook) run alone, before the others, which then run side by side
//! (`FAULTS_PARALLEL`, default 4). With `RELIABILITY_OUT=<file>` one JSON object per case is
//! appended to that file: `case`, `description`, `converge_seconds`, `pods_lost`,
//! `groups_leaked`, `duplicates`, `stuck_terminating`, `passed`, `notes`. A failing case writes
//! the harness's dump and the processes' logs under `FAULTS_DUMP_DIR` (default
//! `$TMPDIR/virtual-node-eci-faults`).
//!
//! It runs without the libtest harness: libtest would run at most as many cases at once as
//! there are cores, and most cases spend their time waiting on a fault (a two-minute ECI
//! outage, a frozen daemon outliving its Lease), not computing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    clippy::print_stdout
)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use integration::harness::invariants::{
    CallCounts, Convergence, Expect, calls_by_result, histogram_tail, sample,
};
use integration::harness::{ClusterKind, Component, Harness, HarnessError, Stop};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// mock-eci answering quickly: groups run within a second, deletions take at most a second.
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
    "--max-grace-period",
    "1s",
];
/// The daemons' settings in every case (on top of the harness's short Lease: 8 s, renewed
/// every second). ResourcePolicy placement is off: its CRD is not installed here and it is
/// not what these faults are about.
const DAEMON_ENV: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "500ms"),
    ("POD_RESYNC_INTERVAL", "5s"),
    ("ORPHAN_GC_INTERVAL", "5s"),
    ("DRAIN_TIMEOUT", "120s"),
    ("PLACEMENT_ENABLED", "false"),
];
/// After converging, the invariants must still hold — and the daemons write no pod status —
/// this long: more than a full resync (`POD_RESYNC_INTERVAL`).
const CONFIRM: Duration = Duration::from_secs(7);
const VNODE_TAINT: &str = "k8s.aliyun.com/vnode";
/// The Lease the harness gives the daemons, and kube-controller-manager's
/// `--node-monitor-grace-period` in the fixture.
const LEASE_DURATION: Duration = Duration::from_secs(8);
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);
/// A pod may stay Terminating this long past its grace period (1 s in every case).
const TERMINATING_BOUND: Duration = Duration::from_secs(60);
/// Waits for a condition the cluster reaches by itself.
const WAIT: Duration = Duration::from_secs(180);
/// Convergence after a fault, on a busy 2-core machine.
const CONVERGE: Duration = Duration::from_secs(360);
/// A whole case, setup and cleanup included.
const CASE_LIMIT: Duration = Duration::from_secs(20 * 60);

// ---------------------------------------------------------------------------------------------
// Results

/// One line of the reliability report.
#[derive(Debug, Clone)]
struct Record {
    case: String,
    description: String,
    converge_seconds: f64,
    pods_lost: usize,
    groups_leaked: usize,
    duplicates: usize,
    stuck_terminating: usize,
    passed: bool,
    notes: Vec<String>,
}

impl Record {
    fn json(&self) -> Value {
        json!({
            "case": self.case,
            "description": self.description,
            "converge_seconds": (self.converge_seconds * 10.0).round() / 10.0,
            "pods_lost": self.pods_lost,
            "groups_leaked": self.groups_leaked,
            "duplicates": self.duplicates,
            "stuck_terminating": self.stuck_terminating,
            "passed": self.passed,
            "notes": self.notes.join("; "),
        })
    }
}

/// What a case reports: its records, in order (a case may report more than one phase).
#[derive(Debug, Default)]
struct Report {
    records: Vec<Record>,
}

impl Report {
    /// Records a convergence: passed when it converged and every `checks` entry holds (each
    /// is a claim about the fault having happened, with its evidence as a note).
    fn phase(
        &mut self,
        case: &str,
        description: &str,
        convergence: &Convergence,
        checks: Vec<(bool, String)>,
        mut notes: Vec<String>,
    ) {
        let report = &convergence.report;
        let mut passed = convergence.converged;
        if !convergence.converged {
            notes.push(format!("did not converge within the bound: {report}"));
        }
        for (holds, claim) in checks {
            if !holds {
                passed = false;
                notes.push(format!("FAILED: {claim}"));
            }
        }
        self.records.push(Record {
            case: case.to_owned(),
            description: description.to_owned(),
            converge_seconds: convergence.seconds,
            pods_lost: report.pods_lost,
            groups_leaked: report.groups_leaked,
            duplicates: report.duplicates,
            stuck_terminating: report.stuck_terminating,
            passed,
            notes,
        });
    }

    fn passed(&self) -> bool {
        !self.records.is_empty() && self.records.iter().all(|r| r.passed)
    }
}

/// Appends `record` to `RELIABILITY_OUT` (one JSON object a line) when it is set.
fn write_record(record: &Record) {
    static FILE: Mutex<()> = Mutex::new(());
    let Some(path) = std::env::var_os("RELIABILITY_OUT") else {
        return;
    };
    let _one_writer = FILE.lock();
    let line = format!("{}\n", record.json());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(error) = written {
        eprintln!(
            "cannot append to RELIABILITY_OUT {}: {error}",
            PathBuf::from(path).display()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn setup_error(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// Polls `condition` with back-off (up to 500 ms) until it holds or `timeout` passes.
async fn until<F, Fut>(what: &str, timeout: Duration, condition: F) -> Result<(), HarnessError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        if condition().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                what: what.to_owned(),
                timeout,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// How a process ended, for a case's notes.
fn exit_text(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        None => "had not exited within the bound".to_owned(),
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(signal)) => format!("was ended by signal {signal}"),
            (None, None) => format!("ended ({status})"),
        },
    }
}

/// The daemons' environment: [`DAEMON_ENV`], `RUST_LOG` from `FAULTS_RUST_LOG` when that is
/// set (to debug a case), then `extra`.
fn daemon_env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    static RUST_LOG: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let mut env = DAEMON_ENV.to_vec();
    if let Some(filter) = RUST_LOG.get_or_init(|| std::env::var("FAULTS_RUST_LOG").ok()) {
        env.push(("RUST_LOG", filter.as_str()));
    }
    for (key, value) in extra {
        env.retain(|(k, _)| k != key);
        env.push((key, value));
    }
    env
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| t.key == key)
}

async fn node(h: &Harness, name: &str) -> Option<Node> {
    Api::<Node>::all(h.client())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// Ready, not cordoned, and no taint but ours: the scheduler may place pods there.
async fn schedulable(h: &Harness, name: &str) -> bool {
    node(h, name).await.is_some_and(|n| {
        is_ready(&n)
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
            && n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .all(|t| t.key == VNODE_TAINT)
    })
}

async fn pods_in(h: &Harness, ns: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(h.client(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// A pod for a virtual node: one small container, a grace period of 1 s, bound to `node` by
/// `spec.nodeName` (a burst this size goes faster without the scheduler) or, with `None`,
/// left to kube-scheduler. It mounts its service account token as users' pods do (admission
/// adds the projected volume, the daemon asks for the token with a TokenRequest before the
/// create): a fault during a create then meets the token path too. No Service links.
fn bare_pod(name: &str, node: Option<&str>, tolerations: &[Value]) -> Pod {
    let mut all = vec![
        json!({"key": VNODE_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}),
    ];
    all.extend_from_slice(tolerations);
    let mut spec = json!({
        "terminationGracePeriodSeconds": 1,
        "enableServiceLinks": false,
        "tolerations": all,
        "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "burst"}},
        "spec": spec,
    }))
    .unwrap()
}

/// `count` pods `<prefix>-NNNN`, alternating over `nodes`.
fn spread(prefix: &str, count: usize, nodes: &[String]) -> Vec<Pod> {
    (0..count)
        .map(|i| {
            bare_pod(
                &format!("{prefix}-{i:04}"),
                Some(&nodes[i % nodes.len()]),
                &[],
            )
        })
        .collect()
}

/// Creates `pods` in `ns`, 32 at a time, each retried (through an apiserver restart, an etcd
/// restart) until it exists or `timeout` passes; how many exist.
async fn create_pods(client: kube::Client, ns: String, pods: Vec<Pod>, timeout: Duration) -> usize {
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let deadline = Instant::now() + timeout;
    futures::stream::iter(pods)
        .map(|pod| {
            let api = api.clone();
            async move {
                let mut pause = Duration::from_millis(100);
                loop {
                    match api.create(&PostParams::default(), &pod).await {
                        Ok(_) => return true,
                        Err(kube::Error::Api(status)) if status.code == 409 => return true,
                        Err(_) if Instant::now() < deadline => {
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(2));
                        }
                        Err(_) => return false,
                    }
                }
            }
        })
        .buffer_unordered(32)
        .filter(|created| std::future::ready(*created))
        .count()
        .await
}

/// [`create_pods`] in the background: the burst goes on while the case breaks things.
fn burst(h: &Harness, ns: &str, pods: Vec<Pod>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(create_pods(h.client(), ns.to_owned(), pods, WAIT))
}

/// Creates `pods` one every `every`, in the background (a burst that lasts long enough for
/// something to happen during it); how many exist in the end.
fn paced_burst(
    h: &Harness,
    ns: &str,
    pods: Vec<Pod>,
    every: Duration,
) -> tokio::task::JoinHandle<usize> {
    let (client, ns) = (h.client(), ns.to_owned());
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        let mut creations = Vec::new();
        for pod in pods {
            ticks.tick().await;
            creations.push(tokio::spawn(create_pods(
                client.clone(),
                ns.clone(),
                vec![pod],
                WAIT,
            )));
        }
        let mut created = 0;
        for creation in creations {
            created += creation.await.unwrap_or(0);
        }
        created
    })
}

/// Deletes the named pods (gracefully: their grace period, 1 s), 32 at a time.
async fn delete_pods(h: &Harness, ns: &str, names: &[String], force: bool) {
    let api: Api<Pod> = Api::namespaced(h.client(), ns);
    let params = if force {
        DeleteParams::default().grace_period(0)
    } else {
        DeleteParams::default()
    };
    futures::stream::iter(names.iter().cloned())
        .for_each_concurrent(32, |name| {
            let (api, params) = (api.clone(), params.clone());
            async move {
                let _ = api.delete(&name, &params).await;
            }
        })
        .await;
}

/// mock-eci's count of `action` calls answered `result`.
async fn mock_calls(h: &Harness, action: &str, result: &str) -> f64 {
    let text = h.mock_metrics().await.unwrap_or_default();
    sample(
        &text,
        "mock_eci_calls_total",
        &format!(r#"action="{action}",result="{result}""#),
    )
}

/// Waits until mock-eci has answered at least `at_least` `action` calls `ok`.
async fn wait_calls(h: &Harness, action: &str, at_least: f64) -> Result<(), HarnessError> {
    until(
        &format!("mock-eci to have answered {at_least} {action} calls"),
        WAIT,
        || async move { mock_calls(h, action, "ok").await >= at_least },
    )
    .await
}

/// A short account of mock-eci's answers other than `ok`, for notes.
async fn mock_trouble(h: &Harness) -> String {
    let text = h.mock_metrics().await.unwrap_or_default();
    let mut parts = Vec::new();
    for (action, results) in calls_by_result(&text, "mock_eci_calls_total") {
        for (result, count) in results {
            if result != "ok" {
                parts.push(format!("{action} {result} ×{count}"));
            }
        }
    }
    if parts.is_empty() {
        "mock-eci answered every call ok".into()
    } else {
        format!("mock-eci answered {}", parts.join(", "))
    }
}

/// What every case starts from: a namespace, mock-eci, the daemon StatefulSet with two
/// replicas, and two daemon processes whose nodes are Ready and schedulable.
struct Scene {
    ns: String,
    nodes: Vec<String>,
    /// The current process of each replica.
    daemons: Vec<String>,
}

impl Scene {
    async fn start(
        h: &mut Harness,
        suffix: &str,
        mock_flags: &[&str],
        env: &[(&'static str, &'static str)],
    ) -> Result<Self, HarnessError> {
        let ns = h.create_namespace(suffix).await?;
        h.start_mock_eci(&[FAST_MOCK, mock_flags].concat()).await?;
        h.create_daemon_statefulset(2).await?;
        let nodes: Vec<String> = (0..2).map(|o| h.node_name(o)).collect();
        // A replica learns from its own pod that it belongs to the set (and so tells a
        // scale-in from a restart): the StatefulSet controller must have made them first.
        until("the StatefulSet's two pods", WAIT, || {
            let client = h.client();
            let nodes = nodes.clone();
            async move {
                let pods: Api<Pod> = Api::namespaced(client, "kube-system");
                for name in nodes {
                    let made = pods.get_opt(&name).await.ok().flatten().is_some_and(|p| {
                        p.owner_references().iter().any(|o| o.kind == "StatefulSet")
                    });
                    if !made {
                        return false;
                    }
                }
                true
            }
        })
        .await?;
        let env = daemon_env(env);
        let mut daemons = Vec::new();
        for ordinal in 0..2 {
            daemons.push(h.start_daemon(ordinal, &env)?);
        }
        for name in &nodes {
            until(&format!("node {name} Ready and schedulable"), WAIT, || {
                schedulable(h, name)
            })
            .await?;
        }
        Ok(Self { ns, nodes, daemons })
    }

    /// The live daemons and their nodes, for [`Expect::daemons`].
    fn live(&self) -> Vec<(String, String)> {
        self.daemons
            .iter()
            .cloned()
            .zip(self.nodes.iter().cloned())
            .collect()
    }

    fn expect(&self, h: &Harness, pods: usize, exact_calls: bool) -> Expect {
        let mut expect = Expect::new(h, &self.ns, pods);
        expect.daemons = self.live();
        expect.exact_calls = exact_calls;
        expect.terminating_bound = TERMINATING_BOUND;
        expect.confirm = CONFIRM;
        expect
    }

    /// Kills replica `ordinal` with SIGKILL and starts it again at once (what the StatefulSet
    /// controller and a kubelet do after a crash, minus their back-off).
    async fn crash_and_restart(
        &mut self,
        h: &mut Harness,
        ordinal: usize,
    ) -> Result<(), HarnessError> {
        let process = self.daemons[ordinal].clone();
        h.process(&process)
            .ok_or_else(|| setup_error(format!("no process {process}")))?
            .kill()
            .await;
        self.daemons[ordinal] =
            h.start_daemon(u32::try_from(ordinal).unwrap(), &daemon_env(&[]))?;
        Ok(())
    }
}

/// Daemon `process` logged a line containing every one of `needles`.
fn logged(h: &Harness, process: &str, needles: &[&str]) -> bool {
    h.process_output(process)
        .is_some_and(|o| o.lines().any(|l| needles.iter().all(|n| l.contains(n))))
}

/// Daemon `process`'s WARN and ERROR lines, counted by message (the text before its first
/// `key=value` field, spans and targets cut), most frequent first, at most eight: a summary
/// for the notes, e.g. `could not renew the node Lease ×20`.
fn complaints(h: &Harness, process: &str) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for line in h.process_output(process).unwrap_or_default().lines() {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
            continue;
        };
        // Spans (`reconcile{pod=… uid=…}`) name the pod: left out, so lines count together.
        let mut plain = String::new();
        let mut depth = 0usize;
        for c in line[at + 1..].chars() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        // `LEVEL span: target: message field=value …`: the message is after the last `: `
        // before the first field.
        let fields_at = plain
            .match_indices(' ')
            .map(|(i, _)| i + 1)
            .find(|i| {
                plain[*i..].split_once('=').is_some_and(|(key, _)| {
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
            })
            .unwrap_or(plain.len());
        let head = &plain[..fields_at];
        let message = head.rsplit_once(": ").map_or(head, |(_, m)| m).trim();
        *counts
            .entry(message.chars().take(80).collect())
            .or_default() += 1;
    }
    if counts.is_empty() {
        return "nothing".into();
    }
    let mut sorted: Vec<(String, usize)> = counts.into_iter().collect();
    sorted.sort_by_key(|e| std::cmp::Reverse(e.1));
    let shown: Vec<String> = sorted
        .iter()
        .take(8)
        .map(|(message, count)| format!("{message} ×{count}"))
        .collect();
    let more = sorted.len().saturating_sub(8);
    if more > 0 {
        format!("{} (and {more} other kinds)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

// ---------------------------------------------------------------------------------------------
// The cases

const KILL9: &str = "kill -9 of a replica in the middle of a 1,000-pod burst (500 pods bound to each of the two virtual nodes), the replica restarted at once";
const KILL9_DELETION: &str = "after kill9_mid_burst: all 1,000 pods deleted (32 requests at a time) and the other replica killed with -9 once 300 of the groups are gone, restarted at once";

async fn kill9_burst_and_deletion(
    h: &mut Harness,
    report: &mut Report,
) -> Result<(), HarnessError> {
    const PODS: usize = 1000;
    let mut scene = Scene::start(h, "kill9", &[], &[]).await?;
    let ns = scene.ns.clone();
    let started = Instant::now();
    let creating = burst(h, &ns, spread("p", PODS, &scene.nodes));
    wait_calls(h, "CreateContainerGroup", 300.0).await?;
    let at = mock_calls(h, "CreateContainerGroup", "ok").await;
    scene.crash_and_restart(h, 1).await?;
    let created = creating.await.map_err(|e| setup_error(e.to_string()))?;
    let convergence = h.converge(&scene.expect(h, PODS, false), CONVERGE).await;
    let notes = vec![
        format!(
            "replica 1 killed after {at} groups were created; the test created {created} pods in {:.0} s",
            started.elapsed().as_secs_f64()
        ),
        format!(
            "restarted replica adopted its groups: {}",
            logged(
                h,
                &scene.daemons[1],
                &["adopted this node's container groups"]
            )
        ),
        mock_trouble(h).await,
    ];
    report.phase(
        "kill9_mid_burst",
        KILL9,
        &convergence,
        vec![(
            created == PODS,
            format!("the burst created all {PODS} pods"),
        )],
        notes,
    );
    if !convergence.converged {
        return Ok(());
    }

    // Deletion of everything; replica 0 killed when ~300 groups are gone.
    let deletes_before = mock_calls(h, "DeleteContainerGroup", "ok").await;
    // Each pod by name, 32 at a time, as `kubectl delete pods --all` does, until every one is
    // marked. One DeleteCollection request deletes the pods one after another and, on a
    // loaded machine, outlasted the apiserver's 60 s request timeout time after time (504),
    // stopping where it was cut off.
    let pods = Api::<Pod>::namespaced(h.client(), &ns);
    until("every pod to be marked for deletion", CONVERGE, || async {
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return false;
        };
        let unmarked: Vec<String> = list
            .items
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter_map(|pod| pod.metadata.name.clone())
            .collect();
        if unmarked.is_empty() {
            return true;
        }
        delete_pods(h, &ns, &unmarked, false).await;
        false
    })
    .await?;
    wait_calls(h, "DeleteContainerGroup", deletes_before + 300.0).await?;
    let at = mock_calls(h, "DeleteContainerGroup", "ok").await - deletes_before;
    scene.crash_and_restart(h, 0).await?;
    let convergence = h.converge(&scene.expect(h, 0, false), CONVERGE).await;
    let notes = vec![
        format!("replica 0 killed after {at} groups were deleted"),
        mock_trouble(h).await,
    ];
    let left = pods_in(h, &ns).await.len();
    report.phase(
        "kill9_mid_deletion",
        KILL9_DELETION,
        &convergence,
        vec![(left == 0, format!("every pod removed ({left} left)"))],
        notes,
    );
    Ok(())
}

const SCALE_IN: &str = "SIGTERM scale-in in the middle of a burst: a 300-replica Deployment placed by kube-scheduler over both virtual nodes; once 60 groups exist the StatefulSet is scaled to 1 and replica 1 gets SIGTERM, so its drain (cordon, evictions) races the ReplicaSet's creations";

async fn sigterm_scale_in(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    const REPLICAS: usize = 300;
    // The drain's deadline is the product's default here, not the suite's short one: on a
    // loaded two-core machine evicting and removing ~150 pods can take past two minutes, and
    // what this case judges is that the drain completes, not how fast.
    let scene = Scene::start(
        h,
        "scale-in",
        &[],
        &[
            ("DRAIN_EVICT_UNMANAGED_PODS", "true"),
            ("DRAIN_TIMEOUT", "5m"),
        ],
    )
    .await?;
    let ns = scene.ns.clone();
    let mut spec = serde_json::to_value(bare_pod("x", None, &[]).spec).unwrap();
    spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": scene.nodes}]}],
    }}});
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec},
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(h.client(), &ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    wait_calls(h, "CreateContainerGroup", 60.0).await?;
    let (first, last) = (scene.nodes[0].clone(), scene.nodes[1].clone());
    let on_last = pods_in(h, &ns)
        .await
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(last.as_str()))
        .count();
    let stopping = Instant::now();
    h.scale_daemon_statefulset(1).await?;
    let leaving = scene.daemons[1].clone();
    h.process(&leaving).unwrap().signal_term();
    let status = h
        .process(&leaving)
        .unwrap()
        .wait_exit(Duration::from_secs(360))
        .await;
    let drained_in = stopping.elapsed();
    let mut expect = scene.expect(h, REPLICAS, false);
    expect.ready_nodes = vec![first.clone()];
    expect.daemons = vec![(scene.daemons[0].clone(), first.clone())];
    let convergence = h.converge(&expect, CONVERGE).await;
    let node_gone = node(h, &last).await.is_none();
    let lease_gone = Api::<Lease>::namespaced(h.client(), "kube-node-lease")
        .get_opt(&last)
        .await
        .ok()
        .flatten()
        .is_none();
    let notes = vec![
        format!(
            "{on_last} pods were on replica 1's node when it got SIGTERM; it {} after {:.1} s",
            exit_text(status),
            drained_in.as_secs_f64()
        ),
        format!("replica 1 complained: {}", complaints(h, &leaving)),
        mock_trouble(h).await,
    ];
    report.phase(
        "sigterm_scale_in_mid_burst",
        SCALE_IN,
        &convergence,
        vec![
            (
                status.is_some_and(|s| s.success()),
                "the drained replica exits 0".into(),
            ),
            (node_gone, "the drained node is deleted".into()),
            (lease_gone, "the drained node's Lease is deleted".into()),
        ],
        notes,
    );
    Ok(())
}

const APISERVER: &str = "kube-apiserver restart (the fixture's own: SIGTERM, then started again with the same flags) in the middle of a 400-pod burst; the burst goes on through the restart";
const ETCD: &str = "etcd restart (SIGKILL, then started again on the same data) in the middle of a 400-pod burst; the burst goes on through the restart";

async fn control_plane_restart(
    h: &mut Harness,
    report: &mut Report,
    component: Component,
) -> Result<(), HarnessError> {
    const PODS: usize = 400;
    if h.kind() != ClusterKind::Fixture {
        return Err(setup_error(
            "restarting the control plane needs the fixture (unset E2E_KUBECONFIG)",
        ));
    }
    let (suffix, case, description, stop) = match component {
        Component::KubeApiserver => (
            "apiserver",
            "kube_apiserver_restart_mid_burst",
            APISERVER,
            Stop::Term(Duration::from_secs(20)),
        ),
        Component::Etcd => ("etcd", "etcd_restart_mid_burst", ETCD, Stop::Kill),
    };
    let scene = Scene::start(h, suffix, &[], &[]).await?;
    let ns = scene.ns.clone();
    let creating = burst(h, &ns, spread("p", PODS, &scene.nodes));
    wait_calls(h, "CreateContainerGroup", 100.0).await?;
    let at = mock_calls(h, "CreateContainerGroup", "ok").await;
    let restarted = h.restart_control_plane(component, stop, WAIT).await?;
    let created = creating.await.map_err(|e| setup_error(e.to_string()))?;
    let convergence = h.converge(&scene.expect(h, PODS, true), CONVERGE).await;
    let mut notes = vec![
        format!(
            "{} stopped {:.1} s after the signal and served again {:.1} s after it, {at} groups in",
            component_name(component),
            restarted.stopped_after.as_secs_f64(),
            restarted.serving_after.as_secs_f64()
        ),
        mock_trouble(h).await,
    ];
    for daemon in &scene.daemons {
        notes.push(format!("{daemon} complained: {}", complaints(h, daemon)));
    }
    report.phase(
        case,
        description,
        &convergence,
        vec![(
            created == PODS,
            format!("the burst created all {PODS} pods"),
        )],
        notes,
    );
    Ok(())
}

fn component_name(component: Component) -> &'static str {
    match component {
        Component::Etcd => "etcd",
        Component::KubeApiserver => "kube-apiserver",
    }
}

const COMPACTION: &str = "watch expiry forced by etcd compaction, mid-burst: both replicas talk to a second kube-apiserver without a watch cache (every watch served from etcd); with 100 of 300 groups made it crashes, 30 pods are force-deleted and 50 more created meanwhile, etcd is compacted to its current revision and the apiserver restarts: the daemons' watches resume from a compacted resourceVersion, get 410 Gone and relist";

async fn watch_expiry_by_compaction(
    h: &mut Harness,
    report: &mut Report,
) -> Result<(), HarnessError> {
    const PODS: usize = 300;
    if h.kind() != ClusterKind::Fixture {
        return Err(setup_error(
            "compacting etcd needs the fixture (unset E2E_KUBECONFIG)",
        ));
    }
    let second = h.start_second_apiserver(&["--watch-cache=false"]).await?;
    let kubeconfig: &'static str = Box::leak(
        second
            .daemon_kubeconfig
            .display()
            .to_string()
            .into_boxed_str(),
    );
    let scene = Scene::start(h, "compaction", &[], &[("KUBECONFIG", kubeconfig)]).await?;
    let ns = scene.ns.clone();
    let creating = burst(h, &ns, spread("p", PODS, &scene.nodes));
    wait_calls(h, "CreateContainerGroup", 100.0).await?;
    let before: Vec<usize> = scene
        .daemons
        .iter()
        .map(|d| h.process_output(d).unwrap_or_default().len())
        .collect();
    h.kill_second_apiserver().await;
    let doomed: Vec<String> = (0..30).map(|i| format!("p-{i:04}")).collect();
    delete_pods(h, &ns, &doomed, true).await;
    let more = create_pods(h.client(), ns.clone(), spread("q", 50, &scene.nodes), WAIT).await;
    let revision = h.compact_etcd().await?;
    h.restart_second_apiserver(&second).await?;
    let created = creating.await.map_err(|e| setup_error(e.to_string()))?;
    let convergence = h
        .converge(&scene.expect(h, PODS - 30 + 50, true), CONVERGE)
        .await;
    let mut checks = vec![(
        created == PODS && more == 50,
        "every pod of the burst and of the gap created".to_owned(),
    )];
    let mut notes = vec![
        format!("etcd compacted to revision {revision}"),
        mock_trouble(h).await,
    ];
    for (daemon, offset) in scene.daemons.iter().zip(before) {
        let output = h.process_output(daemon).unwrap_or_default();
        let after = &output[offset.min(output.len())..];
        let expired = after.lines().any(|l| {
            l.contains("shared watch failed")
                && l.contains("this node")
                && (l.contains("too old") || l.contains("410") || l.contains("Expired"))
        });
        let relisted = after
            .lines()
            .find(|l| l.contains("resync complete") && l.contains("relist=true"));
        notes.push(format!(
            "{daemon}: 410 Gone seen {expired}; relist: {}",
            relisted.map_or("none".to_owned(), |l| l
                .split_once("resync complete")
                .map_or(l, |(_, r)| r.trim_start_matches([':', ' ']))
                .trim()
                .to_owned())
        ));
        checks.push((
            relisted.is_some(),
            format!("{daemon} relisted after the gap"),
        ));
    }
    report.phase(
        "watch_expiry_410_mid_burst",
        COMPACTION,
        &convergence,
        checks,
        notes,
    );
    Ok(())
}

const SIGSTOP: &str = "a replica cut off longer than its Lease: SIGSTOP (40 pods on each node, half of replica 1's tolerating the unreachable taint for only 5 s), SIGCONT once the Lease (8 s) and the node monitor's grace (40 s) are over and the node lifecycle controller has tainted the node and evicted those pods; 10 pods bound to the node while it was frozen";

async fn sigstop_beyond_the_lease(
    h: &mut Harness,
    report: &mut Report,
) -> Result<(), HarnessError> {
    let scene = Scene::start(h, "sigstop", &[], &[]).await?;
    let ns = scene.ns.clone();
    let (first, frozen) = (scene.nodes[0].clone(), scene.nodes[1].clone());
    let short = json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5});
    let mut pods: Vec<Pod> = (0..40)
        .map(|i| bare_pod(&format!("a-{i:02}"), Some(&first), &[]))
        .collect();
    pods.extend((0..20).map(|i| {
        bare_pod(
            &format!("evicted-{i:02}"),
            Some(&frozen),
            std::slice::from_ref(&short),
        )
    }));
    pods.extend((0..20).map(|i| bare_pod(&format!("kept-{i:02}"), Some(&frozen), &[])));
    create_pods(h.client(), ns.clone(), pods, WAIT).await;
    let settled = h.converge(&scene.expect(h, 80, true), CONVERGE).await;
    if !settled.converged {
        return Err(setup_error(format!(
            "the pods never ran before the freeze: {}",
            settled.report
        )));
    }

    let frozen_at = Instant::now();
    h.signal_process(&scene.daemons[1], "STOP")?;
    let shared: &Harness = h;
    until(
        "the node lifecycle controller to taint the frozen node unreachable",
        WAIT,
        || {
            let frozen = frozen.clone();
            async move {
                node(shared, &frozen)
                    .await
                    .is_some_and(|n| has_taint(&n, "node.kubernetes.io/unreachable"))
            }
        },
    )
    .await?;
    let tainted_after = frozen_at.elapsed();
    until(
        "the taint manager to evict the pods tolerating 5 s",
        WAIT,
        || {
            let ns = ns.clone();
            async move {
                pods_in(shared, &ns)
                    .await
                    .iter()
                    .filter(|p| {
                        p.name_any().starts_with("evicted-")
                            && p.metadata.deletion_timestamp.is_some()
                    })
                    .count()
                    == 20
            }
        },
    )
    .await?;
    let late: Vec<Pod> = (0..10)
        .map(|i| bare_pod(&format!("late-{i:02}"), Some(&frozen), &[]))
        .collect();
    create_pods(h.client(), ns.clone(), late, WAIT).await;
    // Past the Lease and the grace, whatever the taint's timing.
    let beyond = LEASE_DURATION + NODE_MONITOR_GRACE + Duration::from_secs(5);
    if let Some(rest) = beyond.checked_sub(frozen_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let not_ready_pods = pods_in(h, &ns)
        .await
        .iter()
        .filter(|p| p.name_any().starts_with("kept-"))
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "False")
        })
        .count();
    let frozen_for = frozen_at.elapsed();
    h.signal_process(&scene.daemons[1], "CONT")?;
    let convergence = h
        .converge(&scene.expect(h, 40 + 20 + 10, true), CONVERGE)
        .await;
    let notes = vec![
        format!(
            "frozen {:.0} s; the node was tainted unreachable {:.0} s after SIGSTOP; the node lifecycle controller had marked {not_ready_pods} of the 20 surviving pods not Ready",
            frozen_for.as_secs_f64(),
            tainted_after.as_secs_f64()
        ),
        format!(
            "replica 1 complained: {:?}",
            complaints(h, &scene.daemons[1])
        ),
        mock_trouble(h).await,
    ];
    report.phase(
        "sigstop_beyond_lease",
        SIGSTOP,
        &convergence,
        vec![(
            frozen_for > LEASE_DURATION + NODE_MONITOR_GRACE,
            "frozen longer than the Lease plus the grace".into(),
        )],
        notes,
    );
    Ok(())
}

const OUTAGE: &str = "mock-eci unavailable for 2 minutes (its process stopped; groups kept in its state file) in the middle of a 300-pod burst; during the outage up to 40 of the pods that were running are deleted and 60 more created; then it comes back";

async fn eci_outage_two_minutes(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    const OUTAGE_FOR: Duration = Duration::from_secs(120);
    let state = h.dir().join("mock-eci-state.json").display().to_string();
    let state: &'static str = Box::leak(state.into_boxed_str());
    let scene = Scene::start(h, "outage", &["--state-file", state], &[]).await?;
    let ns = scene.ns.clone();
    let creating = burst(h, &ns, spread("p", 300, &scene.nodes));
    wait_calls(h, "CreateContainerGroup", 100.0).await?;
    // The daemons' counts while mock-eci is down are the baseline its fresh counters meet.
    h.stop_mock_eci().await?;
    let down_at = Instant::now();
    let daemons_then = {
        let mut sum = CallCounts::default();
        for daemon in &scene.daemons {
            let text = h.daemon_metrics(daemon).await.unwrap_or_default();
            sum = sum + CallCounts::in_metrics(&text, "virtual_node_eci_eci_calls_total");
        }
        sum
    };
    let created = creating.await.map_err(|e| setup_error(e.to_string()))?;
    // Pods that ran before the outage, deleted during it.
    let running: Vec<String> = pods_in(h, &ns)
        .await
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(ResourceExt::name_any)
        .take(40)
        .collect();
    delete_pods(h, &ns, &running, false).await;
    let more = create_pods(h.client(), ns.clone(), spread("q", 60, &scene.nodes), WAIT).await;
    let shared: &Harness = h;
    let nodes_said = until(
        "both nodes to report ECI unreachable",
        Duration::from_secs(60),
        || {
            let nodes = scene.nodes.clone();
            async move {
                for name in &nodes {
                    if node(shared, name).await.is_none_or(|n| is_ready(&n)) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await
    .is_ok();
    if let Some(rest) = OUTAGE_FOR.checked_sub(down_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    h.restart_mock_eci().await?;
    let outage = down_at.elapsed();
    let mut expect = scene.expect(h, 300 - running.len() + 60, true);
    expect.baseline = Some((daemons_then, CallCounts::default()));
    let convergence = h.converge(&expect, CONVERGE).await;
    let mut notes = vec![format!(
        "mock-eci down {:.0} s; {} running pods deleted and {more} created during the outage; both nodes NotReady (EciUnreachable) during it: {nodes_said}",
        outage.as_secs_f64(),
        running.len()
    )];
    for daemon in &scene.daemons {
        notes.push(format!("{daemon} complained: {}", complaints(h, daemon)));
    }
    report.phase(
        "eci_unavailable_2m_mid_burst",
        OUTAGE,
        &convergence,
        vec![
            (created == 300 && more == 60, "every pod created".into()),
            (
                !running.is_empty(),
                "running pods deleted during the outage".into(),
            ),
            (outage >= OUTAGE_FOR, "the outage lasted 2 minutes".into()),
        ],
        notes,
    );
    Ok(())
}

const DELETES_FAILING: &str = "ECI refusing every DeleteContainerGroup (ServiceUnavailable) for 4 minutes, longer than the daemon's retries of one deletion: 20 of 60 running pods deleted gracefully and 10 force-deleted meanwhile, and 10 new pods created during it";

async fn eci_deletions_failing(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    const FAILING_FOR: Duration = Duration::from_secs(240);
    let scene = Scene::start(h, "no-deletes", &[], &[]).await?;
    let ns = scene.ns.clone();
    create_pods(h.client(), ns.clone(), spread("p", 60, &scene.nodes), WAIT).await;
    let settled = h.converge(&scene.expect(h, 60, true), CONVERGE).await;
    if !settled.converged {
        return Err(setup_error(format!(
            "the pods never ran before the fault: {}",
            settled.report
        )));
    }
    set_faults(
        h,
        json!({"DeleteContainerGroup": {"error_rate": 1.0, "error_code": "ServiceUnavailable"}}),
    )
    .await?;
    let failing_since = Instant::now();
    let graceful: Vec<String> = (0..20).map(|i| format!("p-{i:04}")).collect();
    let forced: Vec<String> = (20..30).map(|i| format!("p-{i:04}")).collect();
    delete_pods(h, &ns, &graceful, false).await;
    delete_pods(h, &ns, &forced, true).await;
    let asked = Instant::now();
    create_pods(h.client(), ns.clone(), spread("q", 10, &scene.nodes), WAIT).await;
    let shared: &Harness = h;
    let new_ran = until(
        "the pods created during the fault to run",
        FAILING_FOR,
        || {
            let ns = ns.clone();
            async move {
                pods_in(shared, &ns)
                    .await
                    .iter()
                    .filter(|p| p.name_any().starts_with("q-"))
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count()
                    == 10
            }
        },
    )
    .await
    .map(|()| asked.elapsed());
    if let Some(rest) = FAILING_FOR.checked_sub(failing_since.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let refused = mock_calls(h, "DeleteContainerGroup", "ServiceUnavailable").await;
    set_faults(h, json!({"DeleteContainerGroup": {}})).await?;
    let convergence = h
        .converge(&scene.expect(h, 60 - 30 + 10, true), CONVERGE)
        .await;
    let mut notes = vec![
        format!(
            "mock-eci refused {refused} deletions over {:.0} s",
            failing_since.elapsed().as_secs_f64()
        ),
        match new_ran {
            Ok(after) => format!(
                "the 10 pods created during the fault ran {:.1} s after they were created",
                after.as_secs_f64()
            ),
            Err(_) => {
                format!("the 10 pods created during the fault did not run within {FAILING_FOR:?}")
            }
        },
    ];
    for daemon in &scene.daemons {
        notes.push(format!("{daemon} complained: {}", complaints(h, daemon)));
    }
    report.phase(
        "eci_deletions_failing_4m",
        DELETES_FAILING,
        &convergence,
        vec![(
            new_ran.is_ok(),
            "pods created while deletions fail still run".into(),
        )],
        notes,
    );
    Ok(())
}

const THROTTLING: &str = "throttling at 10× the quota: mock-eci allows a tenth of ECI's documented quotas (CreateContainerGroup and DeleteContainerGroup 100/min, DescribeContainerGroups 200/min, DescribeContainerGroupStatus 1,000/min) while both replicas pace to the documented ones; a 150-pod burst";
const THROTTLING_DELETION: &str =
    "after throttling_10x_quota, under the same quotas: 50 of its pods deleted";

async fn throttling_ten_times(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    let flags = [
        "--rate-limit",
        "CreateContainerGroup=100/10",
        "--rate-limit",
        "DeleteContainerGroup=100/10",
        "--rate-limit",
        "DescribeContainerGroups=200/20",
        "--rate-limit",
        "DescribeContainerGroupStatus=1000/100",
    ];
    let scene = Scene::start(h, "throttle", &flags, &[]).await?;
    let ns = scene.ns.clone();
    let started = Instant::now();
    let created = create_pods(h.client(), ns.clone(), spread("p", 150, &scene.nodes), WAIT).await;
    let convergence = h.converge(&scene.expect(h, 150, true), CONVERGE).await;
    let ran_in = started.elapsed();
    let throttled = mock_calls(h, "CreateContainerGroup", "Throttling.User").await;
    let notes = vec![
        format!(
            "150 pods running {:.0} s after the burst began",
            ran_in.as_secs_f64()
        ),
        mock_trouble(h).await,
    ];
    report.phase(
        "throttling_10x_quota",
        THROTTLING,
        &convergence,
        vec![
            (created == 150, "every pod created".into()),
            (throttled > 0.0, "mock-eci throttled creations".into()),
        ],
        notes,
    );
    if !convergence.converged {
        return Ok(());
    }
    let doomed: Vec<String> = (0..50).map(|i| format!("p-{i:04}")).collect();
    delete_pods(h, &ns, &doomed, false).await;
    let convergence = h.converge(&scene.expect(h, 100, true), CONVERGE).await;
    // Whether ECI throttles these deletions depends on how they spread over time: no claim,
    // mock-eci's answers are in the notes.
    report.phase(
        "throttling_10x_quota_deletion",
        THROTTLING_DELETION,
        &convergence,
        Vec::new(),
        vec![mock_trouble(h).await],
    );
    Ok(())
}

const SLOW: &str = "slow answers: every mock-eci call takes 20 ms and 1.5 % of them 5 s (p99 5 s), through a 300-pod burst";
const SLOW_DELETION: &str =
    "after slow_answers_p99_5s, with the same slow answers: 100 of its pods deleted";

async fn slow_answers(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    let scene = Scene::start(h, "slow", &[], &[]).await?;
    set_faults(
        h,
        json!({"*": {"latency_ms": 20, "slow_rate": 0.015, "slow_latency_ms": 5000}}),
    )
    .await?;
    let ns = scene.ns.clone();
    let created = create_pods(h.client(), ns.clone(), spread("p", 300, &scene.nodes), WAIT).await;
    let convergence = h.converge(&scene.expect(h, 300, true), CONVERGE).await;
    let text = h.mock_metrics().await.unwrap_or_default();
    // mock-eci's buckets end at 1.6 s: the share above the last one is the slow tail.
    let tail = histogram_tail(&text, "mock_eci_call_duration_seconds");
    let slow_share = tail.map_or(0.0, |(_, share, _)| share);
    report.phase(
        "slow_answers_p99_5s",
        SLOW,
        &convergence,
        vec![
            (created == 300, "every pod created".into()),
            (
                slow_share >= 0.005,
                "at least half a percent of the calls were slow (the p99 is the 5 s tail)".into(),
            ),
        ],
        vec![match tail {
            Some((bound, share, count)) => format!(
                "{:.2} % of mock-eci's {count} calls took longer than {bound} s (injected: 1.5 % at 5 s, the rest 20 ms)",
                share * 100.0
            ),
            None => "mock-eci timed no call".into(),
        }],
    );
    if !convergence.converged {
        return Ok(());
    }
    let doomed: Vec<String> = (0..100).map(|i| format!("p-{i:04}")).collect();
    delete_pods(h, &ns, &doomed, false).await;
    let convergence = h.converge(&scene.expect(h, 200, true), CONVERGE).await;
    report.phase(
        "slow_answers_p99_5s_deletion",
        SLOW_DELETION,
        &convergence,
        Vec::new(),
        vec![mock_trouble(h).await],
    );
    Ok(())
}

const LOST: &str = "answers lost after the work was done: 30 % of CreateContainerGroup answers are lost once the group exists (the daemon sees a dropped connection and retries with the same ClientToken), through a 200-pod burst";
const LOST_DELETE: &str = "after lost_create_answers: 30 % of DeleteContainerGroup answers are lost once the deletion has begun, while 100 of its pods are deleted";

async fn lost_answers(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    let scene = Scene::start(h, "lost", &[], &[]).await?;
    set_faults(
        h,
        json!({"CreateContainerGroup": {"lost_answer_rate": 0.3}}),
    )
    .await?;
    let ns = scene.ns.clone();
    let created = create_pods(h.client(), ns.clone(), spread("p", 200, &scene.nodes), WAIT).await;
    let convergence = h.converge(&scene.expect(h, 200, true), CONVERGE).await;
    let lost = mock_calls(h, "CreateContainerGroup", "AnswerLost").await;
    report.phase(
        "lost_create_answers",
        LOST,
        &convergence,
        vec![
            (created == 200, "every pod created".into()),
            (lost > 0.0, "answers were lost".into()),
        ],
        vec![
            format!("{lost} CreateContainerGroup answers lost after the group was made"),
            mock_trouble(h).await,
        ],
    );
    if !convergence.converged {
        return Ok(());
    }
    set_faults(
        h,
        json!({"CreateContainerGroup": {}, "DeleteContainerGroup": {"lost_answer_rate": 0.3}}),
    )
    .await?;
    let doomed: Vec<String> = (0..100).map(|i| format!("p-{i:04}")).collect();
    delete_pods(h, &ns, &doomed, false).await;
    let convergence = h.converge(&scene.expect(h, 100, true), CONVERGE).await;
    let lost = mock_calls(h, "DeleteContainerGroup", "AnswerLost").await;
    report.phase(
        "lost_delete_answers",
        LOST_DELETE,
        &convergence,
        vec![(lost > 0.0, "answers were lost".into())],
        vec![
            format!("{lost} DeleteContainerGroup answers lost after the deletion began"),
            mock_trouble(h).await,
        ],
    );
    Ok(())
}

async fn set_faults(h: &Harness, faults: Value) -> Result<(), HarnessError> {
    let admin = h
        .mock_eci()
        .ok_or_else(|| setup_error("mock-eci is not running"))?
        .admin;
    reqwest::Client::new()
        .patch(format!("{admin}/admin/controls"))
        .json(&json!({"faults": faults}))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| setup_error(format!("mock-eci's controls: {e}")))?;
    Ok(())
}

const TWO: &str = "two daemon processes for one node name, mid-burst (200 pods): a second process for replica 0's node while it renews its Lease (must refuse to start); then replica 0 frozen (SIGSTOP) and a successor started for its node (takes the Lease over), 50 more pods, and the old process thawed (must notice it lost the Lease and stop without touching anything)";

async fn two_processes_one_node(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    let mut scene = Scene::start(h, "two", &[], &[]).await?;
    let ns = scene.ns.clone();
    let node0 = scene.nodes[0].clone();
    let creating = burst(h, &ns, spread("p", 200, &scene.nodes));
    wait_calls(h, "CreateContainerGroup", 50.0).await?;

    // A duplicate while the holder is alive: it must refuse.
    let duplicate = h.start_daemon(0, &daemon_env(&[]))?;
    let refused = h
        .process(&duplicate)
        .unwrap()
        .wait_exit(Duration::from_secs(60))
        .await;
    let refused_cleanly = refused.is_some_and(|s| !s.success())
        && logged(
            h,
            &duplicate,
            &["already served by another virtual-node-eci process"],
        );

    // The holder frozen: a successor takes over; the old one, thawed, must stand down.
    let old = scene.daemons[0].clone();
    h.signal_process(&old, "STOP")?;
    let successor = h.start_daemon(0, &daemon_env(&[]))?;
    let shared: &Harness = h;
    until("the successor to hold the node Lease", WAIT, || {
        let successor = successor.clone();
        async move { logged(shared, &successor, &["holding the node Lease"]) }
    })
    .await?;
    create_pods(
        h.client(),
        ns.clone(),
        (0..50)
            .map(|i| bare_pod(&format!("q-{i:02}"), Some(&node0), &[]))
            .collect(),
        WAIT,
    )
    .await;
    h.signal_process(&old, "CONT")?;
    let stood_down = h
        .process(&old)
        .unwrap()
        .wait_exit(Duration::from_secs(60))
        .await;
    scene.daemons[0] = successor.clone();
    let created = creating.await.map_err(|e| setup_error(e.to_string()))?;
    let convergence = h.converge(&scene.expect(h, 250, false), CONVERGE).await;
    let lost_lease = logged(h, &old, &["took over the Lease"]);
    let notes = vec![
        format!("the duplicate {}", exit_text(refused)),
        format!(
            "the thawed holder {}; it logged losing the Lease: {lost_lease}",
            exit_text(stood_down)
        ),
        format!("the thawed holder complained: {}", complaints(h, &old)),
        mock_trouble(h).await,
    ];
    report.phase(
        "two_processes_one_node",
        TWO,
        &convergence,
        vec![
            (created == 200, "every pod of the burst created".into()),
            (
                refused_cleanly,
                "a second process for a live holder's node refuses to start".into(),
            ),
            (
                stood_down.is_some() && lost_lease,
                "the thawed holder stops once it sees the Lease taken over".into(),
            ),
        ],
        notes,
    );
    Ok(())
}

const CHURN: &str = "Selector and ConfigMap churn during a burst: both replicas run as StatefulSet pods of the local overlay on the host node, serving the Selector webhook the apiserver calls; 200 pods (half steered by a Selector, half by the eci-profile ConfigMap, none tolerating the virtual nodes by themselves) are created over 20 s while a higher-priority Selector is created and deleted, the stable Selector's effect edited and the ConfigMap rewritten (every third version invalid), over and over; then both replicas must answer for the final state";
/// Labels this case's daemon pods, Service and Selectors.
const RUN_LABEL: &str = "virtual-node-eci.aliyun.com/e2e-run";

/// The local overlay's StatefulSet, made this case's own (as `provider/tests/e2e_webhook.rs`
/// does): its name, labels and selector, mock-eci's address, webhook objects named after it,
/// its own eci-profile ConfigMap, short timings.
async fn overlay_statefulset(
    h: &Harness,
    mock: &str,
    profile: &str,
) -> Result<Value, HarnessError> {
    let overlay = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/overlays/local");
    let output = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(["create", "--dry-run=client", "-o", "json", "-k"])
        .arg(&overlay)
        .output()
        .await
        .map_err(|source| HarnessError::Io {
            what: "run kubectl create -k".into(),
            source,
        })?;
    if !output.status.success() {
        return Err(setup_error(format!(
            "kubectl create -k the local overlay: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut set = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .filter_map(Result::ok)
        .find(|o| o["kind"] == "StatefulSet")
        .ok_or_else(|| setup_error("the local overlay has no StatefulSet"))?;
    let name = h.daemon_set_name();
    set["metadata"]["name"] = json!(name);
    set["metadata"]["labels"][RUN_LABEL] = json!(name);
    let spec = &mut set["spec"];
    spec["replicas"] = json!(2);
    spec["serviceName"] = json!(name);
    spec["selector"]["matchLabels"][RUN_LABEL] = json!(name);
    let template = &mut spec["template"];
    template["metadata"]["labels"][RUN_LABEL] = json!(name);
    template["spec"]["terminationGracePeriodSeconds"] = json!(120);
    let container = &mut template["spec"]["containers"][0];
    if let Some(container) = container.as_object_mut() {
        container.remove("envFrom");
    }
    let env = container["env"]
        .as_array_mut()
        .ok_or_else(|| setup_error("the daemon container has no env"))?;
    let grpc = format!("grpc://{}", mock.trim_start_matches("http://"));
    let profile = format!("kube-system/{profile}");
    let cluster = h.cluster_name();
    let secret = format!("{name}-webhook-tls");
    for (key, value) in [
        ("ECI_BACKEND", grpc.as_str()),
        // Plain gRPC and ws:// exec streams to the local mock-eci.
        ("ECI_ALLOW_INSECURE_ENDPOINT", "true"),
        ("ECI_CLUSTER_NAME", cluster.as_str()),
        ("ECI_VSWITCH", "vsw-e2e"),
        ("ECI_SECURITY_GROUP", "sg-e2e"),
        ("WEBHOOK_SERVICE", name.as_str()),
        ("WEBHOOK_CONFIGURATION", name.as_str()),
        ("WEBHOOK_SECRET", secret.as_str()),
        ("ECI_PROFILE_CONFIGMAP", profile.as_str()),
        ("POD_STATUS_POLL_INTERVAL", "500ms"),
        ("POD_RESYNC_INTERVAL", "5s"),
        ("ORPHAN_GC_INTERVAL", "5s"),
        ("DRAIN_TIMEOUT", "60s"),
        ("DRAIN_EVICT_UNMANAGED_PODS", "true"),
        ("PLACEMENT_ENABLED", "false"),
        ("LOG_FORMAT", "text"),
        ("RUST_LOG", "info"),
        // The read-only port is off in the manifests; the test reads each replica's /metrics.
        ("METRICS_ADDR", "$(POD_IP):10255"),
    ] {
        env.retain(|v| v["name"] != key);
        env.push(json!({"name": key, "value": value}));
    }
    Ok(set)
}

fn selector_api(h: &Harness, ns: &str) -> Api<kube::core::DynamicObject> {
    let resource = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "eci.aliyun.com",
        "v1beta1",
        "Selector",
    ));
    Api::namespaced_with(h.client(), ns, &resource)
}

async fn put_selector(h: &Harness, ns: &str, name: &str, spec: Value) -> Result<(), HarnessError> {
    let object: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "eci.aliyun.com/v1beta1", "kind": "Selector",
        "metadata": {"name": name, "labels": {RUN_LABEL: h.daemon_set_name()}}, "spec": spec,
    }))
    .map_err(|e| setup_error(e.to_string()))?;
    let params = kube::api::PatchParams::apply("faults").force();
    selector_api(h, ns)
        .patch(name, &params, &kube::api::Patch::Apply(object))
        .await?;
    Ok(())
}

async fn put_profile(h: &Harness, profile: &str, selectors: &str) -> Result<(), HarnessError> {
    let map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": profile, "namespace": "kube-system", "labels": {RUN_LABEL: h.daemon_set_name()}},
        "data": {"selectors": selectors},
    }))
    .map_err(|e| setup_error(e.to_string()))?;
    let params = kube::api::PatchParams::apply("faults").force();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(h.client(), "kube-system")
        .patch(profile, &params, &kube::api::Patch::Apply(map))
        .await?;
    Ok(())
}

/// The eci-profile content: the stable entry (pods labelled `churn-cm=yes`, annotated with
/// `mark`) and an entry of the churn that matches nothing.
fn profile_selectors(mark: &str, extra: usize) -> String {
    json!([
        {"name": "stable", "objectSelector": {"matchLabels": {"churn-cm": "yes"}}, "effect": {"annotations": {"e2e.churn/cm": mark}}},
        {"name": format!("extra-{extra}"), "objectSelector": {"matchLabels": {"never": "x"}}},
    ])
    .to_string()
}

/// A pod of the burst: no toleration of its own (the webhook must give it one), and a node
/// affinity to this case's virtual nodes only.
fn churn_pod(name: &str, labels: &Value, nodes: &[String]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": false,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}],
            }}},
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
        },
    }))
    .unwrap()
}

/// What replica `ip`'s webhook makes of `pod` (a dry-run AdmissionReview sent to it directly,
/// trusting `ca`): the pod after its patch.
async fn admitted_by(h: &Harness, ip: &str, ca: &[u8], ns: &str, pod: &Pod) -> Option<Value> {
    let host = format!("{}.kube-system.svc", h.daemon_set_name());
    let address = std::net::SocketAddr::new(ip.parse().ok()?, 9443);
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).ok()?)
        .resolve(&host, address)
        .timeout(Duration::from_secs(5))
        .build()
        .ok()?;
    let mut object = serde_json::to_value(pod).ok()?;
    object["metadata"]["namespace"] = json!(ns);
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uuid::Uuid::new_v4().to_string(),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "dryRun": true,
            "userInfo": {"username": "faults"},
            "object": object,
        },
    });
    let answer: Value = client
        .post(format!("https://{host}:9443/mutate-pods"))
        .json(&review)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let Some(patch) = answer["response"]["patch"].as_str() else {
        return Some(object);
    };
    use base64::Engine as _;
    let patch: json_patch::Patch = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(patch)
            .ok()?,
    )
    .ok()?;
    json_patch::patch(&mut object, &patch).ok()?;
    Some(object)
}

fn tolerates_virtual_nodes(pod: &Value) -> bool {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == VNODE_TAINT)
}

async fn webhook_churn(h: &mut Harness, report: &mut Report) -> Result<(), HarnessError> {
    if h.kind() != ClusterKind::Fixture {
        return Err(setup_error(
            "the webhook case runs the daemons on the fixture's host node (unset E2E_KUBECONFIG)",
        ));
    }
    let ns = h.create_namespace("churn").await?;
    let mock = h.start_mock_eci(FAST_MOCK).await?;
    let name = h.daemon_set_name();
    let profile = format!("{name}-profile");
    let outcome = webhook_churn_inner(h, report, &ns, &mock.grpc, &profile).await;
    // Teardown, the product's way: the pods first (force), then the StatefulSet, whose
    // replicas see an uninstall, drain their (empty) nodes and delete them.
    cleanup(h).await;
    let client = h.client();
    let _ =
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), "kube-system")
            .delete(&name, &DeleteParams::background())
            .await;
    let selector = format!("{RUN_LABEL}={name}");
    let _ = until("the daemon pods to go", WAIT, || {
        let (client, selector) = (client.clone(), selector.clone());
        async move {
            Api::<Pod>::namespaced(client, "kube-system")
                .list(&ListParams::default().labels(&selector))
                .await
                .is_ok_and(|l| l.items.is_empty())
        }
    })
    .await;
    let _ = selector_api(h, &ns)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await;
    let _ = Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
        client.clone(),
    )
    .delete(&name, &DeleteParams::default())
    .await;
    let _ = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "kube-system")
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "kube-system")
        .delete(&format!("{name}-webhook-tls"), &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kube-system")
        .delete(&profile, &DeleteParams::default())
        .await;
    for ordinal in 0..2 {
        let node = h.node_name(ordinal);
        let _ = Api::<Node>::all(client.clone())
            .delete(&node, &DeleteParams::default())
            .await;
        let _ = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
            .delete(&node, &DeleteParams::default())
            .await;
    }
    outcome
}

async fn webhook_churn_inner(
    h: &mut Harness,
    report: &mut Report,
    ns: &str,
    mock: &str,
    profile: &str,
) -> Result<(), HarnessError> {
    const PODS: usize = 200;
    let name = h.daemon_set_name();
    let nodes: Vec<String> = (0..2).map(|o| h.node_name(o)).collect();
    // The stable rules first: every pod of the burst is steered by one of them, whatever the
    // churn is doing.
    put_profile(h, profile, &profile_selectors("stable", 0)).await?;
    put_selector(h, ns, "stable", json!({"objectLabels": {"matchLabels": {"churn": "yes"}}, "priority": 10, "effect": {"labels": {"churn-by": "stable"}}})).await?;
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-system", "labels": {RUN_LABEL: name}},
        "spec": {
            "selector": {"app.kubernetes.io/name": "virtual-node-eci", RUN_LABEL: name},
            "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook"}],
        },
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &service)
        .await?;
    let set: k8s_openapi::api::apps::v1::StatefulSet =
        serde_json::from_value(overlay_statefulset(h, mock, profile).await?)
            .map_err(|e| setup_error(e.to_string()))?;
    let deploying = Instant::now();
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &set)
        .await?;
    let shared: &Harness = h;
    let selector = format!("{RUN_LABEL}={name}");
    let daemon_pods = || {
        let selector = selector.clone();
        async move {
            Api::<Pod>::namespaced(shared.client(), "kube-system")
                .list(&ListParams::default().labels(&selector))
                .await
                .map(|l| l.items)
                .unwrap_or_default()
        }
    };
    until(
        "both daemon pods Ready on the host node",
        Duration::from_secs(300),
        || async {
            daemon_pods()
                .await
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
                .count()
                == 2
        },
    )
    .await?;
    for node_name in &nodes {
        until(&format!("node {node_name} Ready"), WAIT, || {
            schedulable(shared, node_name)
        })
        .await?;
    }
    let pods_api: Api<Pod> = Api::namespaced(shared.client(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for (labels, what) in [
        (json!({"churn": "yes"}), "the Selector"),
        (json!({"churn-cm": "yes"}), "the eci-profile ConfigMap"),
    ] {
        let probe = churn_pod("probe", &labels, &nodes);
        // Either replica may answer (the Service picks): five in a row.
        until(
            &format!("five admissions in a row steered by {what}"),
            WAIT,
            || {
                let (pods_api, dry_run, probe) = (pods_api.clone(), dry_run.clone(), probe.clone());
                async move {
                    for _ in 0..5 {
                        let steered = pods_api.create(&dry_run, &probe).await.is_ok_and(|p| {
                            tolerates_virtual_nodes(&serde_json::to_value(&p).unwrap_or_default())
                        });
                        if !steered {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await?;
    }
    let serving_after = deploying.elapsed();

    // The burst, and the churn while it lasts.
    let pods: Vec<Pod> = (0..PODS)
        .map(|i| {
            let labels = if i % 2 == 0 {
                json!({"churn": "yes"})
            } else {
                json!({"churn-cm": "yes"})
            };
            churn_pod(&format!("p-{i:04}"), &labels, &nodes)
        })
        .collect();
    let creating = paced_burst(shared, ns, pods, Duration::from_millis(100));
    let mut generation = 0usize;
    let mut churn_errors = 0usize;
    while !creating.is_finished() {
        generation += 1;
        let steps = [
            put_selector(shared, ns, "flip", json!({"objectLabels": {"matchLabels": {"churn": "yes"}}, "priority": 20, "effect": {"labels": {"churn-by": format!("flip-{generation}")}}})).await,
            put_selector(shared, ns, "stable", json!({"objectLabels": {"matchLabels": {"churn": "yes"}}, "priority": 10, "effect": {"labels": {"churn-by": "stable"}, "annotations": {"e2e.churn/gen": generation.to_string()}}})).await,
            if generation % 3 == 0 {
                put_profile(shared, profile, "[{ not json").await
            } else {
                put_profile(shared, profile, &profile_selectors(&format!("gen-{generation}"), generation)).await
            },
            selector_api(shared, ns).delete("flip", &DeleteParams::default()).await.map(|_| ()).map_err(HarnessError::from),
        ];
        churn_errors += steps.iter().filter(|s| s.is_err()).count();
    }
    let created = creating.await.map_err(|e| setup_error(e.to_string()))?;
    // The final state.
    put_selector(shared, ns, "stable", json!({"objectLabels": {"matchLabels": {"churn": "yes"}}, "priority": 10, "effect": {"labels": {"churn-by": "stable"}, "annotations": {"e2e.churn/gen": "final"}}})).await?;
    put_profile(shared, profile, &profile_selectors("final", 0)).await?;
    let churned_until = Instant::now();

    // Both replicas' caches reach the final state.
    let secret =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(shared.client(), "kube-system")
            .get(&format!("{name}-webhook-tls"))
            .await?;
    let ca = secret
        .data
        .and_then(|d| d.get("ca.crt").map(|c| c.0.clone()))
        .ok_or_else(|| setup_error("the webhook Secret has no ca.crt"))?;
    let ips: Vec<String> = daemon_pods()
        .await
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let final_state = until(
        "both replicas to admit by the final Selector and ConfigMap",
        Duration::from_secs(60),
        || {
            let (ips, ca) = (ips.clone(), ca.clone());
            let nodes = nodes.clone();
            async move {
                for ip in &ips {
                    let by_selector = admitted_by(
                        shared,
                        ip,
                        &ca,
                        ns,
                        &churn_pod("probe", &json!({"churn": "yes"}), &nodes),
                    )
                    .await;
                    let by_profile = admitted_by(
                        shared,
                        ip,
                        &ca,
                        ns,
                        &churn_pod("probe", &json!({"churn-cm": "yes"}), &nodes),
                    )
                    .await;
                    let selector_ok = by_selector.is_some_and(|p| {
                        p["metadata"]["labels"]["churn-by"] == "stable"
                            && p["metadata"]["annotations"]["e2e.churn/gen"] == "final"
                            && tolerates_virtual_nodes(&p)
                    });
                    let profile_ok = by_profile.is_some_and(|p| {
                        p["metadata"]["annotations"]["e2e.churn/cm"] == "final"
                            && tolerates_virtual_nodes(&p)
                    });
                    if !(selector_ok && profile_ok) {
                        return false;
                    }
                }
                ips.len() == 2
            }
        },
    )
    .await;
    let consistent_after = churned_until.elapsed();

    let mut expect = Expect::new(shared, ns, PODS);
    expect.nodes = nodes.clone();
    expect.ready_nodes = nodes.clone();
    let mut daemons = Vec::new();
    for pod in daemon_pods().await {
        if let (Some(ip), Some(node_name)) = (
            pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            Some(pod.name_any()),
        ) {
            daemons.push((format!("http://{ip}:10255"), node_name));
        }
    }
    expect.daemons = daemons;
    expect.exact_calls = true;
    expect.terminating_bound = TERMINATING_BOUND;
    expect.confirm = CONFIRM;
    let convergence = shared.converge(&expect, CONVERGE).await;
    let admitted = pods_in(shared, ns).await;
    let unmarked = admitted
        .iter()
        .filter(|p| {
            let labels = p.labels();
            if labels.get("churn").is_some_and(|v| v == "yes") {
                !labels
                    .get("churn-by")
                    .is_some_and(|v| v == "stable" || v.starts_with("flip-"))
            } else {
                !p.annotations().contains_key("e2e.churn/cm")
            }
        })
        .count();
    report.phase(
        "webhook_selector_configmap_churn",
        CHURN,
        &convergence,
        vec![
            (created == PODS, format!("every pod of the burst created ({created})")),
            (unmarked == 0, format!("every pod admitted with a Selector's or the ConfigMap's effect ({unmarked} without)")),
            (final_state.is_ok(), "both replicas admit by the final Selector and ConfigMap once the churn stops".into()),
        ],
        vec![
            format!("the replicas served the webhook {:.0} s after the StatefulSet was created", serving_after.as_secs_f64()),
            format!("{generation} churn rounds (4 writes each, {churn_errors} failed) during the burst"),
            format!("both replicas answered for the final state {:.1} s after the last change", consistent_after.as_secs_f64()),
        ],
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The runner

type CaseFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HarnessError>> + Send + 'a>>;
type CaseFn = for<'a> fn(&'a mut Harness, &'a mut Report) -> CaseFuture<'a>;

struct Case {
    name: &'static str,
    /// Disturbs the whole control plane (or every namespace): runs alone.
    exclusive: bool,
    run: CaseFn,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "kube_apiserver_restart",
            exclusive: true,
            run: |h, r| Box::pin(control_plane_restart(h, r, Component::KubeApiserver)),
        },
        Case {
            name: "etcd_restart",
            exclusive: true,
            run: |h, r| Box::pin(control_plane_restart(h, r, Component::Etcd)),
        },
        Case {
            name: "webhook_selector_configmap_churn",
            exclusive: true,
            run: |h, r| Box::pin(webhook_churn(h, r)),
        },
        Case {
            name: "eci_unavailable_2m",
            exclusive: false,
            run: |h, r| Box::pin(eci_outage_two_minutes(h, r)),
        },
        Case {
            name: "eci_deletions_failing_4m",
            exclusive: false,
            run: |h, r| Box::pin(eci_deletions_failing(h, r)),
        },
        Case {
            name: "sigstop_beyond_lease",
            exclusive: false,
            run: |h, r| Box::pin(sigstop_beyond_the_lease(h, r)),
        },
        Case {
            name: "kill9_burst_and_deletion",
            exclusive: false,
            run: |h, r| Box::pin(kill9_burst_and_deletion(h, r)),
        },
        Case {
            name: "throttling_10x_quota",
            exclusive: false,
            run: |h, r| Box::pin(throttling_ten_times(h, r)),
        },
        Case {
            name: "two_processes_one_node",
            exclusive: false,
            run: |h, r| Box::pin(two_processes_one_node(h, r)),
        },
        Case {
            name: "sigterm_scale_in_mid_burst",
            exclusive: false,
            run: |h, r| Box::pin(sigterm_scale_in(h, r)),
        },
        Case {
            name: "watch_expiry_410_mid_burst",
            exclusive: false,
            run: |h, r| Box::pin(watch_expiry_by_compaction(h, r)),
        },
        Case {
            name: "slow_answers_p99_5s",
            exclusive: false,
            run: |h, r| Box::pin(slow_answers(h, r)),
        },
        Case {
            name: "lost_answers",
            exclusive: false,
            run: |h, r| Box::pin(lost_answers(h, r)),
        },
    ]
}

fn dump_dir() -> PathBuf {
    std::env::var_os("FAULTS_DUMP_DIR").map_or_else(
        || std::env::temp_dir().join("virtual-node-eci-faults"),
        PathBuf::from,
    )
}

/// Runs one case on a fresh harness, bounded by [`CASE_LIMIT`]; writes its records; on failure
/// keeps the dump and the processes' logs. Whether it passed.
async fn run_case(case: &Case) -> bool {
    let started = Instant::now();
    eprintln!("faults: {} starting", case.name);
    let mut h = match Harness::start().await {
        Ok(h) => h,
        Err(error) => {
            eprintln!("faults: {}: the harness does not start: {error}", case.name);
            return false;
        }
    };
    let mut report = Report::default();
    let outcome = tokio::time::timeout(CASE_LIMIT, (case.run)(&mut h, &mut report)).await;
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error.to_string()),
        Err(_) => Some(format!("the case did not finish within {CASE_LIMIT:?}")),
    };
    if let Some(error) = &error {
        report.records.push(Record {
            case: case.name.to_owned(),
            description: format!("{} (did not run to its end)", case.name),
            converge_seconds: started.elapsed().as_secs_f64(),
            pods_lost: 0,
            groups_leaked: 0,
            duplicates: 0,
            stuck_terminating: 0,
            passed: false,
            notes: vec![format!("error: {error}")],
        });
    }
    let passed = report.passed();
    if !passed {
        keep_evidence(&h, case.name).await;
    }
    cleanup(&h).await;
    h.shutdown(Duration::from_secs(10)).await;
    for record in &report.records {
        write_record(record);
        eprintln!(
            "faults: {} — {}: converged in {:.1} s, lost {}, leaked {}, duplicates {}, stuck terminating {}{}",
            record.case,
            if record.passed { "passed" } else { "FAILED" },
            record.converge_seconds,
            record.pods_lost,
            record.groups_leaked,
            record.duplicates,
            record.stuck_terminating,
            if record.notes.is_empty() {
                String::new()
            } else {
                format!("\n    {}", record.notes.join("\n    "))
            },
        );
    }
    eprintln!(
        "faults: {} {} after {:.0} s",
        case.name,
        if passed { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    passed
}

/// Whether the shared control plane is ready (kube-apiserver's `/readyz`, etcd included)
/// within [`WAIT`].
async fn cluster_ready() -> Result<(), HarnessError> {
    let h = Harness::start().await?;
    let ready = h.wait_ready(WAIT).await;
    h.shutdown(Duration::from_secs(1)).await;
    ready
}

/// Force-deletes the case's pods (their daemons delete the groups), so nothing of it weighs on
/// the shared cluster once the harness removes its namespace and nodes.
async fn cleanup(h: &Harness) {
    for ns in h.started_namespaces() {
        let _ = Api::<Pod>::namespaced(h.client(), &ns)
            .delete_collection(
                &DeleteParams::default().grace_period(0),
                &ListParams::default(),
            )
            .await;
    }
}

async fn keep_evidence(h: &Harness, case: &str) {
    let dir = dump_dir().join(format!("{case}-{}", h.daemon_set_name()));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let _ = std::fs::write(dir.join("dump.txt"), h.dump().await);
    if let Ok(entries) = std::fs::read_dir(h.dir()) {
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let _ = std::fs::copy(&path, dir.join(entry.file_name()));
            }
        }
    }
    eprintln!("faults: {case}: dump and logs kept in {}", dir.display());
}

struct Args {
    filters: Vec<String>,
    skip: Vec<String>,
    exact: bool,
    list: bool,
    ignored_only: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        filters: Vec::new(),
        skip: Vec::new(),
        exact: false,
        list: false,
        ignored_only: false,
    };
    let mut raw = std::env::args().skip(1);
    while let Some(arg) = raw.next() {
        match arg.as_str() {
            "--list" => args.list = true,
            "--exact" => args.exact = true,
            "--ignored" => args.ignored_only = true,
            "--skip" => args.skip.extend(raw.next()),
            // libtest's options that take a value: the value is not a filter.
            "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" | "--report-time" => {
                let _ = raw.next();
            }
            other if other.starts_with('-') => {}
            filter => args.filters.push(filter.to_owned()),
        }
    }
    args
}

fn selected(args: &Args, name: &str) -> bool {
    let matches = |f: &String| {
        if args.exact {
            name == f
        } else {
            name.contains(f.as_str())
        }
    };
    (args.filters.is_empty() || args.filters.iter().any(matches))
        && !args.skip.iter().any(|s| name.contains(s.as_str()))
}

fn main() -> std::process::ExitCode {
    let args = parse_args();
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| selected(&args, c.name))
        .collect();
    if args.list {
        for case in &cases {
            println!("{}: test", case.name);
        }
        return std::process::ExitCode::SUCCESS;
    }
    if args.ignored_only || cases.is_empty() {
        println!("running 0 fault cases");
        return std::process::ExitCode::SUCCESS;
    }
    let parallel: usize = std::env::var("FAULTS_PARALLEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let started = Instant::now();
    println!(
        "running {} fault cases ({} at a time besides those that run alone)",
        cases.len(),
        parallel
    );
    let results: Arc<Mutex<Vec<(&'static str, bool)>>> = Arc::new(Mutex::new(Vec::new()));
    runtime.block_on(async {
        // The cluster first, once, before any case's clock starts.
        match Harness::start().await {
            Ok(h) => h.shutdown(Duration::from_secs(1)).await,
            Err(error) => {
                eprintln!("faults: the cluster does not start: {error}");
                results.lock().push(("cluster", false));
                return;
            }
        }
        for case in cases.iter().filter(|c| c.exclusive) {
            let passed = run_case(case).await;
            results.lock().push((case.name, passed));
        }
        let shared = cases.iter().filter(|c| !c.exclusive);
        // The cases alone restart parts of the control plane: one that did not come back would
        // have every later case wait out its bound.
        if let Err(error) = cluster_ready().await {
            eprintln!("faults: the control plane does not serve after the cases run alone, so the others do not run: {error}");
            results.lock().extend(shared.map(|case| (case.name, false)));
            return;
        }
        futures::stream::iter(shared)
            .for_each_concurrent(parallel, |case| {
                let results = Arc::clone(&results);
                async move {
                    let passed = run_case(case).await;
                    results.lock().push((case.name, passed));
                }
            })
            .await;
    });
    let results = results.lock().clone();
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, p)| !p)
        .map(|(n, _)| *n)
        .collect();
    println!(
        "fault suite: {} passed, {} failed ({}) in {:.0} s",
        results.len() - failed.len(),
        failed.len(),
        failed.join(", "),
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(101)
    }
}
