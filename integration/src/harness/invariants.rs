//! What must hold after any fault, read from the apiserver and mock-eci directly — never from
//! a daemon's own view of things:
//!
//! - every pod bound to one of the run's virtual nodes has exactly one container group, tagged
//!   with its UID and its node (none missing: **lost**; more than one: **duplicates**);
//! - no group of the run's cluster whose pod is gone, or whose node tag is not its pod's node
//!   (**leaked**), once the orphan collector had its interval;
//! - no pod Terminating longer than its grace period plus a bound (**stuck terminating**), and
//!   none Terminating at all once converged (deletions finished);
//! - the case's pods all exist, bound, `Running` and `Ready`;
//! - the Node of every live replica `Ready`;
//! - the counters in the live daemons' `/metrics` agree with what was observed: the
//!   `CreateContainerGroup` and `DeleteContainerGroup` calls they count as answered `ok` with
//!   mock-eci's own count of them, and the pods they count as `Running` with the pods the
//!   apiserver shows running on their nodes.
//!
//! [`Harness::check_invariants`] takes one look; [`Harness::converge`] looks again (with
//! back-off, up to a deadline) until everything holds, then once more after a short
//! confirmation window, and says how long it took.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::mock_admin::tag;
use super::{Harness, HarnessError, deploy};
use crate::measure;

/// The tag naming the cluster a group belongs to (`core/src/to_eci/naming.rs`).
pub const TAG_CLUSTER: &str = "k8s.aliyun.com/cluster";
/// The tag naming the node a group was created for.
pub const TAG_NODE: &str = "k8s.aliyun.com/node-name";
/// The tag naming the pod's namespace.
pub const TAG_NAMESPACE: &str = "k8s.aliyun.com/namespace";
/// The tag naming the pod.
pub const TAG_POD_NAME: &str = "k8s.aliyun.com/pod-name";
/// The tag carrying the pod's UID (also the group's `ClientToken`).
pub const TAG_POD_UID: &str = "k8s.aliyun.com/pod-uid";

/// Examples kept per kind of violation (enough to debug, not a wall of text).
const EXAMPLES: usize = 5;

/// What a case expects once it has converged.
#[derive(Debug, Clone)]
pub struct Expect {
    /// The namespace the case's pods live in.
    pub namespace: String,
    /// How many pods (not terminating) must exist there, each bound to one of `nodes`,
    /// `Running` and `Ready`.
    pub pods: usize,
    /// The run's virtual nodes: their pods are checked against mock-eci's groups.
    pub nodes: Vec<String>,
    /// The nodes of live replicas: each must be `Ready`.
    pub ready_nodes: Vec<String>,
    /// Live daemon processes (as [`Harness::start_daemon`] named them, or the
    /// `http://HOST:PORT` of their ops listener) and their nodes: their `/metrics` are compared
    /// with what the apiserver and mock-eci show.
    pub daemons: Vec<(String, String)>,
    /// Whether the daemons' ECI call counts must equal mock-eci's (no replica's counters were
    /// lost since `baseline`: nobody was killed or restarted), or only not exceed them.
    pub exact_calls: bool,
    /// Counts to subtract before comparing (daemons', mock-eci's): taken when one side
    /// started counting again (a restarted mock-eci).
    pub baseline: Option<(CallCounts, CallCounts)>,
    /// How long past its `deletionTimestamp` (its grace period) a pod may still be there.
    pub terminating_bound: Duration,
    /// After everything held once, how long it must keep holding (a late duplicate or leak
    /// would show in this window).
    pub confirm: Duration,
}

impl Expect {
    /// `pods` pods in `namespace` on the harness's nodes, every node Ready, no daemon's
    /// metrics compared (set `daemons`), a 30 s bound on terminating pods and a 2 s
    /// confirmation window.
    pub fn new(h: &Harness, namespace: &str, pods: usize) -> Self {
        Self {
            namespace: namespace.to_owned(),
            pods,
            nodes: h.node_names.clone(),
            ready_nodes: h.node_names.clone(),
            daemons: Vec::new(),
            exact_calls: false,
            baseline: None,
            terminating_bound: Duration::from_secs(30),
            confirm: Duration::from_secs(2),
        }
    }
}

/// ECI calls answered `ok`, as one side counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallCounts {
    /// `CreateContainerGroup`.
    pub create_ok: f64,
    /// `DeleteContainerGroup`.
    pub delete_ok: f64,
}

impl CallCounts {
    /// The `ok` calls of the `*_calls_total` counter `family` in a Prometheus text exposition
    /// (`virtual_node_eci_eci_calls_total` for a daemon, `mock_eci_calls_total` for mock-eci).
    pub fn in_metrics(text: &str, family: &str) -> Self {
        let ok = |action: &str| sample(text, family, &format!(r#"action="{action}",result="ok""#));
        Self {
            create_ok: ok("CreateContainerGroup"),
            delete_ok: ok("DeleteContainerGroup"),
        }
    }
}

impl std::ops::Add for CallCounts {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            create_ok: self.create_ok + other.create_ok,
            delete_ok: self.delete_ok + other.delete_ok,
        }
    }
}

impl std::ops::Sub for CallCounts {
    type Output = Self;
    fn sub(self, other: Self) -> Self {
        Self {
            create_ok: self.create_ok - other.create_ok,
            delete_ok: self.delete_ok - other.delete_ok,
        }
    }
}

/// One look at the invariants.
#[derive(Debug, Clone, Default)]
pub struct Invariants {
    /// Pods bound to the run's nodes (terminating ones included).
    pub pods: usize,
    /// Of them, `Running` and `Ready`.
    pub running: usize,
    /// Groups of the run's cluster in mock-eci.
    pub groups: usize,
    /// Pods missing (fewer than expected) or bound without a group.
    pub pods_lost: usize,
    /// Groups whose pod is gone (or is on another node).
    pub groups_leaked: usize,
    /// Groups beyond the first of a pod.
    pub duplicates: usize,
    /// Pods Terminating past their grace period plus the bound.
    pub stuck_terminating: usize,
    /// Pods Terminating within that bound: deletions still in flight (the system has not
    /// converged while there are any).
    pub terminating: usize,
    /// Nodes of live replicas not `Ready`.
    pub not_ready_nodes: usize,
    /// The case's pods not (yet) bound, `Running` and `Ready`.
    pub pods_not_running: usize,
    /// Where a daemon's counters disagree with what was observed.
    pub metric_mismatches: Vec<String>,
    /// A few examples of each violation.
    pub details: Vec<String>,
}

impl Invariants {
    /// Whether every invariant holds.
    pub fn holds(&self) -> bool {
        self.pods_lost == 0
            && self.groups_leaked == 0
            && self.duplicates == 0
            && self.stuck_terminating == 0
            && self.terminating == 0
            && self.not_ready_nodes == 0
            && self.pods_not_running == 0
            && self.metric_mismatches.is_empty()
    }
}

impl fmt::Display for Invariants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} pods ({} running and ready, {} terminating), {} groups: lost {}, leaked {}, \
             duplicates {}, stuck terminating {}, not running {}, nodes not ready {}, metrics {}",
            self.pods,
            self.running,
            self.terminating,
            self.groups,
            self.pods_lost,
            self.groups_leaked,
            self.duplicates,
            self.stuck_terminating,
            self.pods_not_running,
            self.not_ready_nodes,
            if self.metric_mismatches.is_empty() {
                "agree".to_owned()
            } else {
                self.metric_mismatches.join("; ")
            }
        )?;
        for detail in &self.details {
            write!(f, "\n  {detail}")?;
        }
        Ok(())
    }
}

/// How [`Harness::converge`] ended.
#[derive(Debug, Clone)]
pub struct Convergence {
    /// Whether every invariant held (and kept holding through the confirmation window).
    pub converged: bool,
    /// From the call until the invariants first held (or until the deadline).
    pub seconds: f64,
    /// The last look.
    pub report: Invariants,
}

/// A group, as far as the invariants care.
#[derive(Debug)]
struct Group {
    id: String,
    uid: String,
    node: String,
    pod: String,
    status: String,
}

fn condition_true(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == kind && c.status == "True")
}

fn running_and_ready(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && condition_true(pod, "Ready")
}

fn node_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// The value of the sample `name{labels}` in a Prometheus text exposition (labels as written
/// there, e.g. `action="CreateContainerGroup",result="ok"`); 0 when absent.
pub fn sample(text: &str, name: &str, labels: &str) -> f64 {
    let wanted = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key == wanted).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

fn push_example(
    details: &mut Vec<String>,
    counts: &mut BTreeMap<&'static str, usize>,
    kind: &'static str,
    mut text: String,
) {
    let seen = counts.entry(kind).or_default();
    *seen += 1;
    if *seen <= EXAMPLES {
        text.insert_str(0, &format!("{kind}: "));
        details.push(text);
    }
}

/// Compares the daemons' `ok` create and delete calls (`ours`) with mock-eci's (`mock`), both
/// since `expect`'s baseline when it has one.
fn compare_call_counts(
    expect: &Expect,
    ours: CallCounts,
    mock: CallCounts,
    report: &mut Invariants,
) {
    let (ours, mock) = match expect.baseline {
        Some((ours_then, mock_then)) => (ours - ours_then, mock - mock_then),
        None => (ours, mock),
    };
    for (what, daemons, seen) in [
        ("CreateContainerGroup ok", ours.create_ok, mock.create_ok),
        ("DeleteContainerGroup ok", ours.delete_ok, mock.delete_ok),
    ] {
        let agree = if expect.exact_calls {
            (daemons - seen).abs() < 0.5
        } else {
            daemons <= seen + 0.5
        };
        if !agree {
            let relation = if expect.exact_calls { "=" } else { "≤" };
            report.metric_mismatches.push(format!(
                "{what}: the daemons count {daemons}, mock-eci {seen} (expected daemons {relation} mock-eci)"
            ));
        }
    }
}

/// The report of one look being built, with how many examples of each kind it has seen (so
/// [`push_example`] keeps only the first few).
#[derive(Default)]
struct Findings {
    report: Invariants,
    counts: BTreeMap<&'static str, usize>,
}

impl Findings {
    /// Records an example of a `kind` of violation.
    fn example(&mut self, kind: &'static str, text: String) {
        push_example(&mut self.report.details, &mut self.counts, kind, text);
    }

    /// Pods bound to the run's nodes: running, terminating (or stuck so), without a group
    /// (lost) or with more than one (duplicates).
    fn check_bound_pods(&mut self, expect: &Expect, bound: &[Pod], groups: &[Group]) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut by_uid: HashMap<&str, Vec<&Group>> = HashMap::new();
        for group in groups {
            by_uid.entry(group.uid.as_str()).or_default().push(group);
        }
        for pod in bound {
            let uid = pod.uid().unwrap_or_default();
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            let own = by_uid.get(uid.as_str()).map_or(0, Vec::len);
            if running_and_ready(pod) {
                self.report.running += 1;
            }
            if let Some(deleted) = &pod.metadata.deletion_timestamp {
                let over = now.duration_since(deleted.0).as_secs_f64();
                if over <= expect.terminating_bound.as_secs_f64() {
                    self.report.terminating += 1;
                } else {
                    self.report.stuck_terminating += 1;
                    self.example(
                        "stuck terminating",
                        format!(
                            "{key} on {} for {over:.0} s past its grace period ({own} group(s))",
                            node_of(pod)
                        ),
                    );
                }
            } else if own == 0 {
                self.report.pods_lost += 1;
                self.example(
                    "lost",
                    format!(
                        "{key} on {} has no group (phase {:?})",
                        node_of(pod),
                        pod.status.as_ref().and_then(|s| s.phase.clone())
                    ),
                );
            }
            if own > 1 {
                self.report.duplicates += own - 1;
                let ids: Vec<&str> = by_uid[uid.as_str()].iter().map(|g| g.id.as_str()).collect();
                self.example("duplicate", format!("{key} has {own} groups: {ids:?}"));
            }
        }
    }

    /// Groups whose pod is gone, or is on another node than the group's tag (leaked).
    fn check_groups(&mut self, bound: &[Pod], groups: &[Group]) {
        let pods_by_uid: HashMap<String, &Pod> =
            bound.iter().filter_map(|p| Some((p.uid()?, p))).collect();
        for group in groups {
            match pods_by_uid.get(&group.uid) {
                None => {
                    self.report.groups_leaked += 1;
                    self.example(
                        "leaked",
                        format!(
                            "{} ({}, node {}, status {}) has no pod",
                            group.id, group.pod, group.node, group.status
                        ),
                    );
                }
                Some(pod) if node_of(pod) != group.node => {
                    self.report.groups_leaked += 1;
                    self.example(
                        "leaked",
                        format!(
                            "{} ({}) is tagged for node {} but its pod is on {}",
                            group.id,
                            group.pod,
                            group.node,
                            node_of(pod)
                        ),
                    );
                }
                Some(_) => {}
            }
        }
    }

    /// The case's own pods (`in_namespace`): all there, bound, running and ready, and no more.
    fn check_case_pods(&mut self, expect: &Expect, in_namespace: &[Pod]) {
        let live: Vec<&Pod> = in_namespace
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if live.len() < expect.pods {
            let missing = expect.pods - live.len();
            self.report.pods_lost += missing;
            self.example(
                "lost",
                format!(
                    "{missing} of the {} pods expected in {} do not exist",
                    expect.pods, expect.namespace
                ),
            );
        }
        for pod in &live {
            let on_a_run_node = expect.nodes.iter().any(|n| n == node_of(pod));
            if !on_a_run_node || !running_and_ready(pod) {
                self.report.pods_not_running += 1;
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                self.example(
                    "not running",
                    format!(
                        "{}/{} on {:?}: phase {phase:?}, ready {}",
                        expect.namespace,
                        pod.name_any(),
                        node_of(pod),
                        condition_true(pod, "Ready")
                    ),
                );
            }
        }
        if live.len() > expect.pods {
            // More than the case made: a controller's replacement not yet gone, or a bug.
            self.report.pods_not_running += live.len() - expect.pods;
            self.example(
                "not running",
                format!(
                    "{} pods in {} where {} were expected",
                    live.len(),
                    expect.namespace,
                    expect.pods
                ),
            );
        }
    }
}

impl Harness {
    /// The name the daemons of this harness tag their groups with (`ECI_CLUSTER_NAME`).
    pub fn cluster_name(&self) -> String {
        self.cluster_name.clone()
    }

    /// The address of daemon `process`'s ops listener (`/metrics`), from the line it logs when
    /// it starts serving (`METRICS_ADDR` is `127.0.0.1:0` unless a test sets it).
    pub fn metrics_address(&self, process: &str) -> Option<String> {
        let output = self.process_output(process)?;
        output
            .lines()
            .filter(|l| l.contains("serving /healthz"))
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("address="))
            })
            .map(str::to_owned)
    }

    /// Daemon `process`'s `/metrics`, when it answers; `process` may also be the
    /// `http://HOST:PORT` of a daemon that is not the harness's process (a pod's).
    pub async fn daemon_metrics(&self, process: &str) -> Option<String> {
        let address = match process.strip_prefix("http://") {
            Some(address) => address.to_owned(),
            None => self.metrics_address(process)?,
        };
        reqwest::get(format!("http://{address}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    /// mock-eci's `/metrics`, when it answers.
    pub async fn mock_metrics(&self) -> Option<String> {
        let admin = self.mock.as_ref()?.admin.clone();
        reqwest::get(format!("{admin}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    /// The `ok` create and delete calls as the daemon processes `daemons` count them (summed)
    /// and as mock-eci counts them. `None` when a side does not answer.
    pub async fn call_counts(&self, daemons: &[String]) -> Option<(CallCounts, CallCounts)> {
        let mut ours = CallCounts::default();
        for process in daemons {
            let text = self.daemon_metrics(process).await?;
            ours = ours + CallCounts::in_metrics(&text, "virtual_node_eci_eci_calls_total");
        }
        let text = self.mock_metrics().await?;
        let mock = CallCounts::in_metrics(&text, "mock_eci_calls_total");
        Some((ours, mock))
    }

    /// mock-eci's groups of this run's cluster.
    async fn run_groups(&self) -> Result<Vec<Group>, HarnessError> {
        let admin = self
            .mock
            .as_ref()
            .ok_or_else(|| HarnessError::Setup("mock-eci is not running".into()))?
            .admin
            .clone();
        let groups = super::mock_admin::groups(&admin).await?;
        let cluster = self.cluster_name();
        Ok(groups
            .iter()
            .filter(|g| tag(g, TAG_CLUSTER) == cluster)
            .map(|g| Group {
                id: g["container_group_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                uid: tag(g, TAG_POD_UID).to_owned(),
                node: tag(g, TAG_NODE).to_owned(),
                pod: format!("{}/{}", tag(g, TAG_NAMESPACE), tag(g, TAG_POD_NAME)),
                status: g["status"].as_str().unwrap_or_default().to_owned(),
            })
            .collect())
    }

    /// One look at the invariants (see the module's documentation).
    pub async fn check_invariants(&self, expect: &Expect) -> Result<Invariants, HarnessError> {
        let mut findings = Findings::default();

        // Pods bound to the run's nodes, and the case's namespace.
        let all: Api<Pod> = Api::all(self.client());
        let mut bound: Vec<Pod> = Vec::new();
        for node in &expect.nodes {
            let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
            bound.extend(all.list(&params).await?.items);
        }
        let in_namespace: Vec<Pod> = Api::<Pod>::namespaced(self.client(), &expect.namespace)
            .list(&ListParams::default())
            .await?
            .items;
        // Groups next, so a pod created after the groups were read cannot look lost... but a
        // group created after the pods were read can look leaked: the next look settles it.
        let groups = self.run_groups().await?;
        findings.report.groups = groups.len();
        findings.report.pods = bound.len();

        findings.check_bound_pods(expect, &bound, &groups);
        findings.check_groups(&bound, &groups);
        findings.check_case_pods(expect, &in_namespace);
        self.check_ready_nodes(expect, &mut findings).await?;
        let mut report = findings.report;
        self.check_daemon_metrics(expect, &bound, &mut report).await;
        Ok(report)
    }

    /// Flags the replicas' nodes of `expect` that are not `Ready`.
    async fn check_ready_nodes(
        &self,
        expect: &Expect,
        findings: &mut Findings,
    ) -> Result<(), HarnessError> {
        let nodes: Api<Node> = Api::all(self.client());
        for name in &expect.ready_nodes {
            let ready = nodes
                .get_opt(name)
                .await?
                .is_some_and(|n| deploy::is_ready(&n));
            if !ready {
                findings.report.not_ready_nodes += 1;
                findings.example("node", format!("{name} is not Ready"));
            }
        }
        Ok(())
    }

    /// The daemons' counters against what was observed: their `ok` ECI calls against
    /// mock-eci's, and the pods each counts `Running` against the apiserver's `bound`.
    async fn check_daemon_metrics(&self, expect: &Expect, bound: &[Pod], report: &mut Invariants) {
        if expect.daemons.is_empty() {
            return;
        }
        let processes: Vec<String> = expect.daemons.iter().map(|(p, _)| p.clone()).collect();
        match self.call_counts(&processes).await {
            None => report
                .metric_mismatches
                .push("a daemon's or mock-eci's /metrics did not answer".into()),
            Some((ours, mock)) => compare_call_counts(expect, ours, mock, report),
        }
        for (process, node) in &expect.daemons {
            let Some(text) = self.daemon_metrics(process).await else {
                report
                    .metric_mismatches
                    .push(format!("{process}'s /metrics did not answer"));
                continue;
            };
            let counted = sample(&text, "virtual_node_eci_pods", r#"phase="Running""#);
            let shown = bound
                .iter()
                .filter(|p| {
                    node_of(p) == node
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .count();
            #[allow(clippy::cast_precision_loss)]
            if (counted - shown as f64).abs() > 0.5 {
                report.metric_mismatches.push(format!(
                    "{process} counts {counted} pods Running, the apiserver shows {shown} on {node}"
                ));
            }
        }
    }

    /// The pod status writes the daemons of `expect` made so far (their
    /// `virtual_node_eci_kube_requests_total{operation="pod_status_patch"}`); `None` when one
    /// does not answer, or there are none to ask.
    async fn status_writes(&self, expect: &Expect) -> Option<f64> {
        if expect.daemons.is_empty() {
            return None;
        }
        let mut sum = 0.0;
        for (process, _) in &expect.daemons {
            let text = self.daemon_metrics(process).await?;
            sum += sample(
                &text,
                "virtual_node_eci_kube_requests_total",
                r#"operation="pod_status_patch""#,
            );
        }
        Some(sum)
    }

    /// Looks at the invariants until they hold or `timeout` passes; answers how long that took
    /// and the last look. Once they hold they must hold again after `expect.confirm`, and the
    /// daemons must have written no pod status meanwhile (a converged node has nothing to
    /// write: a daemon that keeps rewriting statuses is a storm in the making). A look that
    /// fails (an apiserver restarting) counts as not holding.
    pub async fn converge(&self, expect: &Expect, timeout: Duration) -> Convergence {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut pause = Duration::from_millis(100);
        let mut last = Invariants::default();
        loop {
            match self.check_invariants(expect).await {
                Ok(report) if report.holds() => {
                    let seconds = started.elapsed().as_secs_f64();
                    let writes_before = self.status_writes(expect).await;
                    tokio::time::sleep(expect.confirm).await;
                    let writes_after = self.status_writes(expect).await;
                    match self.check_invariants(expect).await {
                        Ok(mut again) => {
                            if let (Some(before), Some(after)) = (writes_before, writes_after)
                                && after > before
                            {
                                again.metric_mismatches.push(format!(
                                    "the daemons wrote {} pod statuses in the {:?} after convergence, with nothing changing",
                                    after - before,
                                    expect.confirm
                                ));
                            }
                            if again.holds() {
                                return Convergence {
                                    converged: true,
                                    seconds,
                                    report: again,
                                };
                            }
                            last = again;
                        }
                        Err(error) => last.details = vec![format!("the check failed: {error}")],
                    }
                }
                Ok(report) => last = report,
                Err(error) => {
                    last.details = vec![format!("the check failed: {error}")];
                }
            }
            if Instant::now() >= deadline {
                return Convergence {
                    converged: false,
                    seconds: started.elapsed().as_secs_f64(),
                    report: last,
                };
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// The node names the harness started daemons for.
    pub fn started_nodes(&self) -> Vec<String> {
        self.node_names.clone()
    }

    /// The namespaces [`Harness::create_namespace`] made.
    pub fn started_namespaces(&self) -> Vec<String> {
        self.namespaces.clone()
    }
}

/// Counts of `result` labels per action in a `*_calls_total` family (e.g. mock-eci's
/// `mock_eci_calls_total`): action → result → count.
pub fn calls_by_result(text: &str, family: &str) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (mut labels, value) in measure::series(text, family) {
        let action = labels.remove("action").unwrap_or_default();
        let result = labels.remove("result").unwrap_or_default();
        *out.entry(action).or_default().entry(result).or_default() += value;
    }
    out
}

/// The tail of a Prometheus histogram `family` summed over every label set: the largest
/// finite bucket bound, the share of observations above it, and how many there were in all.
pub fn histogram_tail(text: &str, family: &str) -> Option<(f64, f64, f64)> {
    let by_bound = measure::grouped(text, &format!("{family}_bucket"), |labels| {
        labels.get("le").cloned()
    });
    let mut buckets: Vec<(f64, f64)> = by_bound
        .into_iter()
        .filter_map(|(le, count)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    let (bound, below) = buckets.iter().rev().find(|(b, _)| b.is_finite())?;
    (total > 0.0).then(|| (*bound, (total - below) / total, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP mock_eci_calls_total x
# TYPE mock_eci_calls_total counter
mock_eci_calls_total{action="CreateContainerGroup",result="ok"} 3
mock_eci_calls_total{action="CreateContainerGroup",result="Throttling"} 2
mock_eci_calls_total{action="DescribeContainerGroups",result="ok",zone="a"} 4.5
mock_eci_calls_total{action="DescribeContainerGroups",result="ok",zone="b"} 1
mock_eci_calls_totalx{action="CreateContainerGroup",result="ok"} 9
other_total{action="CreateContainerGroup",result="ok"} 9
latency_seconds_bucket{action="a",le="0.1"} 5
latency_seconds_bucket{action="a",le="1"} 8
latency_seconds_bucket{action="a",le="+Inf"} 10
latency_seconds_bucket{action="b",le="0.1"} 0
latency_seconds_bucket{action="b",le="1"} 1
latency_seconds_bucket{action="b",le="+Inf"} 10
latency_seconds_sum{action="a"} 3
latency_seconds_count{action="a"} 10
"#;

    #[test]
    fn ok_calls_are_read_per_family_and_add_up() {
        let counts = CallCounts::in_metrics(TEXT, "mock_eci_calls_total");
        assert_eq!(
            counts,
            CallCounts {
                create_ok: 3.0,
                delete_ok: 0.0
            }
        );
        assert_eq!((counts + counts).create_ok, 6.0);
        assert_eq!(
            CallCounts::in_metrics(TEXT, "other_total"),
            CallCounts {
                create_ok: 9.0,
                delete_ok: 0.0
            }
        );
    }

    #[test]
    fn calls_are_counted_by_action_and_result() {
        let calls = calls_by_result(TEXT, "mock_eci_calls_total");
        let create = &calls["CreateContainerGroup"];
        assert_eq!(create.get("ok"), Some(&3.0));
        assert_eq!(create.get("Throttling"), Some(&2.0));
        assert_eq!(calls["DescribeContainerGroups"].get("ok"), Some(&5.5));
        assert_eq!(calls.len(), 2);
        assert!(calls_by_result(TEXT, "absent_total").is_empty());
    }

    #[test]
    fn a_histogram_tail_sums_buckets_over_label_sets() {
        // 20 observations; 9 at most 1 s, so 11 of 20 above the largest finite bound.
        assert_eq!(
            histogram_tail(TEXT, "latency_seconds"),
            Some((1.0, 11.0 / 20.0, 20.0))
        );
        assert_eq!(histogram_tail(TEXT, "absent_seconds"), None);
        let empty = "h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\n";
        assert_eq!(histogram_tail(empty, "h"), None);
    }
}
