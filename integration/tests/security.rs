//! Security checks on the real control plane (issue 20, part 4): the daemon runs as deploy/'s
//! ServiceAccount under the real RBAC authorizer (the harness applies `deploy/base`'s RBAC and
//! starts every daemon with a token of that account).
//!
//! - **audit**: two replicas do a representative workload — pods through kube-scheduler (one
//!   placed by a ResourcePolicy through the daemon's extender), Running, their Secrets,
//!   ConfigMaps and projected tokens, `kubectl logs` and `exec` through the apiserver to the
//!   kubelet API, a bearer token checked by TokenReview, metrics and `/pods` through the node
//!   proxy, the webhook and the orphan collector on, then a scale-in (drain, Node and Lease
//!   deleted) and deletion — and kube-apiserver's audit log (the fixture logs every request of
//!   the daemon's user, `integration::cluster::audit_policy`) shows no request of that user
//!   answered 403.
//! - **can-i**: `kubectl auth can-i --list --as=<the daemon's user>`, cluster-wide and in
//!   `kube-system` and `kube-node-lease`, equals `virtual_node_eci::app::rbac::required()`
//!   (which `provider/tests/deploy.rs` holds deploy/'s RBAC to) plus what every service account
//!   gets anyway.
//! - **credentials**: the daemons on the OpenAPI backend with a known fake AccessKey and STS
//!   token (and two more replicas with a wrong secret and a wrong token) do a workload with ECI
//!   failures; then no daemon log, mock-eci log, Event, Pod, Node, `/metrics` or kubelet `/pods`
//!   answer contains a secret or a token.
//! - **tls**: the kubelet API, the webhook and (when this daemon is elected) the scheduler
//!   extender answer no plain HTTP and refuse TLS 1.1 and 1.0 — with openssl's `-msg` trace
//!   proving the ClientHello went out and the server's `protocol_version` alert came back.
//!
//! With `SECURITY_OUT=<file>` each check appends one JSON object (`check`, `status`: `pass`,
//! `fail` or `not run`, `summary`, `details`) to the file: the reliability report reads them.
//! With `E2E_KUBECONFIG` the audit check is NOT RUN (that cluster's audit log is not ours to
//! read) and says so; the others run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use integration::cluster::DAEMON_USER;
use integration::harness::mock_admin::groups;
use integration::harness::{
    E2E_ACCESS_KEY_ID, E2E_ACCESS_KEY_SECRET, EciApi, FixtureOptions, Harness, HarnessError,
    free_port,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use virtual_node_eci::k8s::access::Scope;

const WAIT: Duration = Duration::from_secs(120);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
    "--max-grace-period",
    "1s",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("KUBELET_LOG_POLL_INTERVAL", "250ms"),
    ("DRAIN_TIMEOUT", "120s"),
];
const VNODE_TAINT: &str = "k8s.aliyun.com/vnode";
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";

// ---- shared plumbing ----

/// Every test of this binary asks for the same fixture (the first one to start decides): the
/// scheduler extender is on, so the audit workload can place a pod by ResourcePolicy.
async fn start() -> Harness {
    Harness::start_with(FixtureOptions {
        placement_extender: true,
        ..FixtureOptions::default()
    })
    .await
    .expect("the harness starts")
}

fn failed(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// One check's outcome, printed and appended to `SECURITY_OUT` when set.
fn record(check: &str, status: &str, summary: &str, details: &Value) {
    eprintln!("[security] {check}: {} — {summary}", status.to_uppercase());
    let Some(path) = std::env::var_os("SECURITY_OUT") else {
        return;
    };
    let line = json!({"check": check, "status": status, "summary": summary, "details": details});
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("SECURITY_OUT can be opened");
    writeln!(file, "{line}").expect("SECURITY_OUT can be written");
}

/// Runs `scenario` on a fresh harness; prints the dump on failure; always shuts down. The
/// scenario's own error (or panic) fails the test after the cleanup.
async fn run<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    use futures::FutureExt as _;
    let mut h = start().await;
    let result = std::panic::AssertUnwindSafe(scenario(&mut h))
        .catch_unwind()
        .await;
    if !matches!(result, Ok(Ok(()))) {
        eprintln!("{}", h.dump().await);
    }
    h.shutdown(Duration::from_secs(10)).await;
    match result {
        Ok(outcome) => outcome.unwrap(),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

struct Output {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn command(program: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{} runs: {e}", program.display()));
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin).await;
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} ends within 60 s", program.display()))
        .unwrap();
    Output {
        ok: output.status.success(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// kubectl as the administrator.
async fn kubectl(h: &Harness, args: &[&str]) -> Output {
    let kubeconfig = h.kubeconfig().display().to_string();
    let mut all = vec!["--kubeconfig", kubeconfig.as_str()];
    all.extend_from_slice(args);
    command(h.kubectl(), &all, b"").await
}

fn env(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn node(h: &Harness, name: &str) -> Option<Node> {
    Api::<Node>::all(h.client())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

fn schedulable(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let spec = node.spec.as_ref();
    ready
        && !spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .all(|t| t.key == VNODE_TAINT)
}

async fn wait_schedulable(h: &Harness, name: &str) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("node {name} Ready and schedulable"),
        WAIT,
        |h| async move { node(h, name).await.is_some_and(|n| schedulable(&n)) },
    )
    .await
}

/// Waits until the StatefulSet controller made the placeholder pods of `ordinals` (a replica
/// learns from its own pod that it belongs to the set, and so tells a scale-in from a restart).
async fn wait_daemon_pods(h: &Harness, ordinals: &[u32]) -> Result<(), HarnessError> {
    let names: Vec<String> = ordinals.iter().map(|o| h.node_name(*o)).collect();
    h.wait_for(&format!("the StatefulSet's pods {names:?}"), WAIT, |h| {
        let names = names.clone();
        async move {
            let pods: Api<Pod> = Api::namespaced(h.client(), "kube-system");
            for name in names {
                if !pods.get_opt(&name).await.ok().flatten().is_some_and(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.owner_references().iter().any(|o| o.kind == "StatefulSet")
                }) {
                    return false;
                }
            }
            true
        }
    })
    .await
}

/// A pod spec for the test's virtual nodes.
fn pod_spec(nodes: &[String], extra: &Value) -> Value {
    let mut spec = json!({
        "tolerations": [{"key": VNODE_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes},
            ]}],
        }}},
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
    });
    for (key, value) in extra.as_object().into_iter().flatten() {
        spec[key] = value.clone();
    }
    spec
}

async fn create_deployment(
    h: &Harness,
    ns: &str,
    name: &str,
    replicas: i32,
    spec: &Value,
) -> Result<(), HarnessError> {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    Ok(())
}

async fn pods(h: &Harness, ns: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(h.client(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

async fn wait_running(h: &Harness, ns: &str, count: usize) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("{count} pods running in {ns}"),
        WAIT,
        |h| async move {
            let pods = pods(h, ns).await;
            pods.iter().filter(|p| running(p)).count() == count
                && pods.iter().all(|p| p.metadata.deletion_timestamp.is_none())
        },
    )
    .await
}

async fn wait_no_pods(h: &Harness, ns: &str) -> Result<(), HarnessError> {
    h.wait_for(&format!("every pod of {ns} gone"), WAIT, |h| async move {
        pods(h, ns).await.is_empty()
    })
    .await
}

/// The webhook's settings for a daemon of this test: its own configuration and Secret names
/// (the daemon registers them cluster-wide; removed by [`remove_webhook`]) on a port of its
/// own. The configuration points at the `kube-system/<name>` Service, which does not exist
/// here: `failurePolicy: Ignore` lets the API server go on without it.
fn webhook_env(name: &str, port: u16) -> Vec<(String, String)> {
    owned(&[
        ("WEBHOOK_ENABLED", "true"),
        ("WEBHOOK_ADDR", &format!("127.0.0.1:{port}")),
        ("WEBHOOK_CONFIGURATION", name),
        ("WEBHOOK_SECRET", &format!("{name}-webhook-tls")),
        ("WEBHOOK_SERVICE", name),
    ])
}

async fn remove_webhook(h: &Harness, name: &str) {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(h.client());
    let _ = configurations.delete(name, &DeleteParams::default()).await;
    let secrets: Api<Secret> = Api::namespaced(h.client(), "kube-system");
    let _ = secrets
        .delete(&format!("{name}-webhook-tls"), &DeleteParams::default())
        .await;
}

// ---- 1. the audit log: no request of the daemon denied ----

/// One request of the audit log (its `ResponseComplete` event, or `ResponseStarted` for a
/// watch still open).
#[derive(Debug, Clone)]
struct Audited {
    verb: String,
    group: String,
    resource: String,
    namespace: String,
    name: String,
    uri: String,
    code: i64,
}

impl Audited {
    fn resource_key(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

/// Every request of the daemon's user in the audit log (all rotated files beside it), by audit
/// ID; and how many lines were read and could not be parsed.
fn audited_requests(log: &Path) -> (Vec<Audited>, usize) {
    let dir = log.parent().unwrap_or(Path::new("."));
    let mut by_id: BTreeMap<String, (u8, Audited)> = BTreeMap::new();
    let mut unparsed = 0;
    let files = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "log"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                unparsed += 1;
                continue;
            };
            if event["user"]["username"] != DAEMON_USER || !event["impersonatedUser"].is_null() {
                continue;
            }
            let rank = match event["stage"].as_str() {
                Some("ResponseComplete" | "Panic") => 2,
                Some("ResponseStarted") => 1,
                _ => 0,
            };
            let object = &event["objectRef"];
            let resource = match (object["resource"].as_str(), object["subresource"].as_str()) {
                (Some(r), Some(s)) => format!("{r}/{s}"),
                (Some(r), None) => r.to_owned(),
                (None, _) => String::new(),
            };
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            let request = Audited {
                verb: text(&event["verb"]),
                group: text(&object["apiGroup"]),
                resource,
                namespace: text(&object["namespace"]),
                name: text(&object["name"]),
                uri: text(&event["requestURI"]),
                code: event["responseStatus"]["code"].as_i64().unwrap_or(0),
            };
            let id = text(&event["auditID"]);
            match by_id.get(&id) {
                Some((seen, _)) if *seen >= rank => {}
                _ => {
                    by_id.insert(id, (rank, request));
                }
            }
        }
    }
    (by_id.into_values().map(|(_, r)| r).collect(), unparsed)
}

/// The documented accesses as `(group, resource, verb)`, whatever their scope.
fn documented() -> BTreeSet<(String, String, String)> {
    virtual_node_eci::app::rbac::required()
        .into_iter()
        .map(|(_, g, r, v)| (g.to_owned(), r.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_shows_no_request_of_the_daemon_denied() {
    run(async |h| {
        let Some(audit_log) = h.audit_log().map(Path::to_path_buf) else {
            record(
                "audit",
                "not run",
                "E2E_KUBECONFIG: the cluster's audit log is not the fixture's to read; run without it",
                &json!({}),
            );
            return Ok(());
        };
        let started = Instant::now();
        let ns = h.create_namespace("audit").await?;
        let ns = ns.as_str();
        let mock = h
            .start_mock_eci(&[FAST_MOCK, &["--ip-cidr", "127.78.0.0/16"]].concat())
            .await?;
        install_resource_policy_crd(h).await?;
        h.create_daemon_statefulset(2).await?;
        wait_daemon_pods(h, &[0, 1]).await?;
        let webhook = h.daemon_set_name();
        let mut processes = Vec::new();
        let mut metrics = Vec::new();
        for ordinal in 0..2 {
            let metrics_addr = format!("127.0.0.1:{}", free_port()?);
            let mut extra = owned(FAST_DAEMON);
            extra.extend(h.placement_env());
            extra.extend(webhook_env(&webhook, free_port()?));
            extra.extend(owned(&[
                ("METRICS_ADDR", &metrics_addr),
                ("ORPHAN_GC_INTERVAL", "5s"),
            ]));
            processes.push(h.start_daemon(ordinal, &env(&extra))?);
            metrics.push(metrics_addr);
        }
        let nodes: Vec<String> = (0..2).map(|o| h.node_name(o)).collect();
        for name in &nodes {
            wait_schedulable(h, name).await?;
        }

        // What a pod references: a Secret, a ConfigMap, the projected service-account token
        // (every pod has `kube-api-access-*`).
        let secrets: Api<Secret> = Api::namespaced(h.client(), ns);
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}})).unwrap(),
            )
            .await?;
        let configmaps: Api<ConfigMap> = Api::namespaced(h.client(), ns);
        configmaps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"mode": "audit"}})).unwrap(),
            )
            .await?;
        let spec = pod_spec(
            &nodes,
            &json!({
                "topologySpreadConstraints": [{
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "nodeTaintsPolicy": "Honor",
                    "labelSelector": {"matchLabels": {"app": "web"}},
                }],
                "containers": [{
                    "name": "app",
                    "image": "registry.example.com/app:1",
                    "env": [
                        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                    ],
                }],
            }),
        );
        create_deployment(h, ns, "web", 6, &spec).await?;
        // One Deployment placed by a ResourcePolicy (the extender filters and binds).
        let policy_placed = create_policy(h, ns).await;
        if policy_placed {
            create_deployment(h, ns, "placed", 2, &pod_spec(&nodes, &json!({}))).await?;
        }
        let expected = if policy_placed { 8 } else { 6 };
        wait_running(h, ns, expected).await?;
        eprintln!("{expected} pods running after {:?}", started.elapsed());

        // The kubelet API through the apiserver (client certificate → SubjectAccessReview).
        let box_pod = pods(h, ns)
            .await
            .into_iter()
            .find(|p| node_of(p) == nodes[0] && p.labels().get("app").is_some_and(|a| a == "web"))
            .ok_or_else(|| failed("a web pod on the first node"))?;
        let box_name = box_pod.name_any();
        h.wait_pod(ns, &box_name, "its group recorded", WAIT, |p| {
            p["metadata"]["annotations"][INSTANCE_ID].is_string()
        })
        .await?;
        let logs = kubectl(h, &["-n", ns, "logs", &box_name, "--tail=3"]).await;
        if !logs.ok {
            return Err(failed(format!("kubectl logs: {}", logs.stderr)));
        }
        let exec = kubectl(h, &["-n", ns, "exec", &box_name, "--", "sh", "-c", "exit 3"]).await;
        if exec.code != Some(3) {
            return Err(failed(format!("kubectl exec exited {:?}: {}", exec.code, exec.stderr)));
        }
        // Metrics, the summary and /pods as metrics-server reads them: straight to the kubelet
        // API with a client certificate (the administrator's; the apiserver refuses to proxy to
        // a node at a loopback address).
        let kubelet = h.kubelet_port(&processes[0]).ok_or_else(|| failed("kubelet port"))?;
        for path in ["metrics/resource", "stats/summary", "pods"] {
            let (status, _) = kubelet_get(h, kubelet, path).await?;
            if status != 200 {
                return Err(failed(format!("the kubelet API's /{path} answered {status}")));
            }
        }
        // A bearer token straight to the kubelet API: the daemon asks TokenReview who it is,
        // then SubjectAccessReview (this account may not use nodes/proxy: the kubelet API says
        // 403 — its answer, not the apiserver's).
        let token = daemon_token(h)?;
        let insecure = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let answer = insecure
            .get(format!("https://127.0.0.1:{kubelet}/pods"))
            .bearer_auth(&token)
            .send()
            .await
            .map_err(|e| failed(format!("the kubelet API: {e}")))?;
        eprintln!("the kubelet API answered the daemon's own token {}", answer.status());

        // Scale-in of the second replica: it drains (evictions), deletes its Node and Lease.
        h.scale_daemon_statefulset(1).await?;
        h.process(&processes[1]).unwrap().signal_term();
        let status = h.process(&processes[1]).unwrap().wait_exit(Duration::from_secs(180)).await;
        if !status.is_some_and(|s| s.success()) {
            return Err(failed(format!("the scaled-in replica ended {status:?}")));
        }
        wait_running(h, ns, expected).await?;
        if pods(h, ns).await.iter().any(|p| node_of(p) == nodes[1]) {
            return Err(failed("a pod is left on the removed node"));
        }
        eprintln!("scale-in done after {:?}", started.elapsed());

        // Deletion: the groups, then the pods.
        for name in ["web", "placed"] {
            let _ = Api::<Deployment>::namespaced(h.client(), ns)
                .delete(name, &DeleteParams::foreground())
                .await;
        }
        wait_no_pods(h, ns).await?;
        let admin = mock.admin.clone();
        h.wait_for("mock-eci's groups deleted", WAIT, |_| {
            let admin = admin.clone();
            async move { groups(&admin).await.is_ok_and(|g| g.is_empty()) }
        })
        .await?;
        // The remaining replica restarts (SIGTERM while the set still wants it): it releases
        // its Lease and exits without touching anything.
        h.process(&processes[0]).unwrap().signal_term();
        let _ = h.process(&processes[0]).unwrap().wait_exit(Duration::from_secs(30)).await;
        let _ = Api::<DynamicObject>::namespaced_with(h.client(), ns, &policy_resource())
            .delete("placed", &DeleteParams::default())
            .await;
        remove_webhook(h, &webhook).await;
        eprintln!("workload done after {:?}", started.elapsed());

        // The log is written as each request completes ("blocking" mode).
        let (requests, unparsed) = audited_requests(&audit_log);
        let denied: Vec<&Audited> = requests.iter().filter(|r| r.code == 403).collect();
        let mut by_access: BTreeMap<String, usize> = BTreeMap::new();
        let mut by_code: BTreeMap<i64, usize> = BTreeMap::new();
        for request in &requests {
            *by_access.entry(format!("{} {}", request.verb, request.resource_key())).or_default() += 1;
            *by_code.entry(request.code).or_default() += 1;
        }
        let exercised: BTreeSet<(String, String, String)> = requests
            .iter()
            .map(|r| (r.group.clone(), r.resource.clone(), r.verb.clone()))
            .collect();
        let documented = documented();
        let covered: Vec<String> = documented
            .iter()
            .filter(|a| exercised.contains(*a))
            .map(|(g, r, v)| format!("{v} {r}{}{g}", if g.is_empty() { "" } else { "." }))
            .collect();
        let not_covered: Vec<String> = documented
            .iter()
            .filter(|a| !exercised.contains(*a))
            .map(|(g, r, v)| format!("{v} {r}{}{g}", if g.is_empty() { "" } else { "." }))
            .collect();
        let undocumented: Vec<String> = exercised
            .iter()
            .filter(|a| !documented.contains(*a))
            .map(|(g, r, v)| format!("{v} {r}{}{g}", if g.is_empty() { "" } else { "." }))
            .collect();
        let denials: Vec<String> = denied
            .iter()
            .map(|r| format!("{} {} {}/{} ({})", r.verb, r.resource_key(), r.namespace, r.name, r.uri))
            .collect();
        let details = json!({
            "requests": requests.len(),
            "denied": denials,
            "by_code": by_code.iter().map(|(c, n)| (c.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "by_access": by_access,
            "documented_accesses": documented.len(),
            "exercised_documented": covered,
            "not_exercised_documented": not_covered,
            "exercised_undocumented": undocumented,
            "unparsed_lines": unparsed,
            "seconds": started.elapsed().as_secs(),
        });
        eprintln!("audit: {}", serde_json::to_string_pretty(&details).unwrap());
        let status = if requests.is_empty() || !denials.is_empty() { "fail" } else { "pass" };
        record(
            "audit",
            status,
            &format!(
                "{} requests of {DAEMON_USER} audited, {} answered 403; {} of the {} documented accesses exercised",
                requests.len(),
                denials.len(),
                covered.len(),
                documented.len()
            ),
            &details,
        );
        if requests.is_empty() {
            return Err(failed("the audit log holds no request of the daemon: is auditing on?"));
        }
        if !denials.is_empty() {
            return Err(failed(format!("requests of the daemon denied:\n{}", denials.join("\n"))));
        }
        Ok(())
    })
    .await;
}

/// `GET https://127.0.0.1:<port>/<path>` of a daemon's kubelet API as the administrator (the
/// client certificate of the fixture's admin kubeconfig; its certificate is self-signed unless
/// approved, so not verified): the status and the body.
async fn kubelet_get(h: &Harness, port: u16, path: &str) -> Result<(u16, String), HarnessError> {
    let text = std::fs::read_to_string(h.kubeconfig())
        .map_err(|e| failed(format!("read the kubeconfig: {e}")))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| {
        failed(format!(
            "the admin kubeconfig is not the fixture's JSON: {e}"
        ))
    })?;
    let file = |key: &str| -> Result<Vec<u8>, HarnessError> {
        let path = config["users"][0]["user"][key]
            .as_str()
            .ok_or_else(|| failed(format!("the admin kubeconfig has no {key} file")))?;
        std::fs::read(path).map_err(|e| failed(format!("read {path}: {e}")))
    };
    let mut pem = file("client-certificate")?;
    pem.extend(file("client-key")?);
    let identity = reqwest::Identity::from_pem(&pem).map_err(|e| failed(e.to_string()))?;
    let client = reqwest::Client::builder()
        .identity(identity)
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(20))
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let response = client
        .get(format!("https://127.0.0.1:{port}/{path}"))
        .send()
        .await
        .map_err(|e| failed(format!("the kubelet API /{path}: {e}")))?;
    let status = response.status().as_u16();
    Ok((status, response.text().await.unwrap_or_default()))
}

/// A token of the daemon's ServiceAccount (the harness's daemon kubeconfig carries one).
fn daemon_token(h: &Harness) -> Result<String, HarnessError> {
    let text = std::fs::read_to_string(h.daemon_kubeconfig())
        .map_err(|e| failed(format!("read the daemon kubeconfig: {e}")))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
    config["users"][0]["user"]["token"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| failed("the daemon kubeconfig holds no token"))
}

fn policy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.alibabacloud.com", "v1alpha1", "ResourcePolicy"),
        "resourcepolicies",
    )
}

async fn install_resource_policy_crd(h: &Harness) -> Result<(), HarnessError> {
    let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/resourcepolicy-crd.yaml");
    let crd = crd.display().to_string();
    let output = kubectl(
        h,
        &["apply", "--server-side", "--force-conflicts", "-f", &crd],
    )
    .await;
    if !output.ok {
        return Err(failed(format!(
            "apply the ResourcePolicy CRD: {}",
            output.stderr
        )));
    }
    let output = kubectl(
        h,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/resourcepolicies.scheduling.alibabacloud.com",
        ],
    )
    .await;
    if output.ok {
        Ok(())
    } else {
        Err(failed(format!(
            "the ResourcePolicy CRD established: {}",
            output.stderr
        )))
    }
}

/// A ResourcePolicy sending `app=placed` pods to the virtual nodes (an `eci` unit); false when
/// the API refuses it (the placement feature changed), which only drops that part of the
/// workload.
async fn create_policy(h: &Harness, ns: &str) -> bool {
    let api: Api<DynamicObject> = Api::namespaced_with(h.client(), ns, &policy_resource());
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
        "kind": "ResourcePolicy",
        "metadata": {"name": "placed", "namespace": ns},
        "spec": {"selector": {"app": "placed"}, "units": [{"resource": "eci"}]},
    }))
    .unwrap();
    match api.create(&PostParams::default(), &policy).await {
        Ok(_) => true,
        Err(error) => {
            eprintln!("the ResourcePolicy was refused ({error}); the workload goes on without it");
            false
        }
    }
}

// ---- 2. kubectl auth can-i --list equals the documented set ----

/// One line of `kubectl auth can-i --list`: `(group, resource, verb)` for resource rules
/// (`resource` with `/subresource`, `[names]` appended when the rule names objects), and the
/// non-resource URLs apart.
fn parse_can_i(text: &str) -> (BTreeSet<(String, String, String)>, BTreeSet<String>) {
    let mut resources = BTreeSet::new();
    let mut urls = BTreeSet::new();
    for line in text.lines().skip(1) {
        let Some(open) = line.find('[') else { continue };
        let name = line[..open].trim();
        let brackets: Vec<&str> = line[open..]
            .split('[')
            .filter_map(|part| part.split_once(']').map(|(inside, _)| inside.trim()))
            .collect();
        let [non_resource, names, verbs] = brackets[..] else {
            continue;
        };
        for verb in verbs.split_whitespace() {
            if name.is_empty() {
                for url in non_resource.split_whitespace() {
                    urls.insert(format!("{verb} {url}"));
                }
                continue;
            }
            // `resource.group/subresource` (kubectl's combineResourceGroup).
            let (head, sub) = name
                .split_once('/')
                .map_or((name, None), |(h, s)| (h, Some(s)));
            let (resource, group) = head.split_once('.').unwrap_or((head, ""));
            let mut resource = match sub {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            };
            if !names.is_empty() {
                resource = format!("{resource}[{names}]");
            }
            resources.insert((group.to_owned(), resource, verb.to_owned()));
        }
    }
    (resources, urls)
}

fn show(set: &BTreeSet<(String, String, String)>) -> Vec<String> {
    set.iter()
        .map(|(g, r, v)| format!("{v} {r}{}{g}", if g.is_empty() { "" } else { "." }))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_i_list_equals_the_documented_set() {
    run(async |h| {
        let required = virtual_node_eci::app::rbac::required();
        let scoped = |scopes: &[Scope]| -> BTreeSet<(String, String, String)> {
            required
                .iter()
                .filter(|(s, ..)| scopes.contains(s))
                .map(|(_, g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
                .collect()
        };
        // What every service account of kube-system may do without any binding of ours:
        // `system:basic-user` (self subject access and rules reviews), `system:discovery`,
        // `system:public-info-viewer` (non-resource URLs) bound to `system:authenticated`, and
        // `authentication.k8s.io/selfsubjectreviews` — read from a service account that has no
        // binding at all (impersonating a name nobody created gives exactly the groups a real
        // one would have: system:serviceaccounts, system:serviceaccounts:kube-system,
        // system:authenticated) and subtracted, so the comparison is about deploy/'s RBAC only.
        let nobody = format!("system:serviceaccount:kube-system:{}-nobody", h.daemon_set_name());
        let mut results = Vec::new();
        let mut all_ok = true;
        for (label, namespace, scopes) in [
            ("cluster-wide (namespace default)", "default", vec![Scope::Cluster]),
            ("kube-system", "kube-system", vec![Scope::Cluster, Scope::OwnNamespace]),
            ("kube-node-lease", "kube-node-lease", vec![Scope::Cluster, Scope::NodeLeases]),
        ] {
            let ours = kubectl(h, &["auth", "can-i", "--list", "-n", namespace, &format!("--as={DAEMON_USER}")]).await;
            let baseline = kubectl(h, &["auth", "can-i", "--list", "-n", namespace, &format!("--as={nobody}")]).await;
            if !ours.ok || !baseline.ok {
                return Err(failed(format!("kubectl auth can-i --list: {}{}", ours.stderr, baseline.stderr)));
            }
            let (observed, _) = parse_can_i(&ours.stdout);
            let (defaults, _) = parse_can_i(&baseline.stdout);
            let observed: BTreeSet<_> = observed.difference(&defaults).cloned().collect();
            let expected = scoped(&scopes);
            let extra: BTreeSet<_> = observed.difference(&expected).cloned().collect();
            let missing: BTreeSet<_> = expected.difference(&observed).cloned().collect();
            let ok = extra.is_empty() && missing.is_empty();
            all_ok &= ok;
            eprintln!(
                "can-i in {label}: {} granted beyond the defaults, {} documented; extra {:?}, missing {:?}; defaults subtracted {:?}",
                observed.len(),
                expected.len(),
                show(&extra),
                show(&missing),
                show(&defaults)
            );
            results.push(json!({
                "scope": label,
                "granted": observed.len(),
                "documented": expected.len(),
                "extra": show(&extra),
                "missing": show(&missing),
                "defaults_subtracted": show(&defaults),
            }));
        }
        let summary = results
            .iter()
            .map(|r| format!("{}: {} = {}{}", r["scope"].as_str().unwrap_or_default(), r["granted"], r["documented"],
                if r["extra"].as_array().is_some_and(Vec::is_empty) && r["missing"].as_array().is_some_and(Vec::is_empty) { "" } else { " (DIFFERENT)" }))
            .collect::<Vec<_>>()
            .join("; ");
        record(
            "can-i",
            if all_ok { "pass" } else { "fail" },
            &format!("(group, resource, verb) granted beyond every account's defaults vs documented — {summary}"),
            &json!(results),
        );
        if all_ok {
            Ok(())
        } else {
            Err(failed(format!("kubectl auth can-i --list differs from rbac::required(): {}", serde_json::to_string_pretty(&results).unwrap())))
        }
    })
    .await;
}

// ---- 3. fake credentials leak nowhere ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_credentials_appear_in_no_log_event_status_or_metric() {
    run(async |h| {
        let started = Instant::now();
        let sts_token = format!("e2e-sts-token-{}", uuid::Uuid::new_v4().simple());
        let wrong_secret = format!("e2e-wrong-secret-{}", uuid::Uuid::new_v4().simple());
        let wrong_token = format!("e2e-wrong-sts-token-{}", uuid::Uuid::new_v4().simple());
        h.use_eci_api(EciApi::OpenApi);
        let ns = h.create_namespace("creds").await?;
        let ns = ns.as_str();
        let mock = h
            .start_mock_eci(&[FAST_MOCK, &["--ip-cidr", "127.79.0.0/16", "--openapi-security-token", &sts_token]].concat())
            .await?;
        let mut processes = Vec::new();
        let mut metrics = Vec::new();
        // Replica 0 logs everything at debug level (what an operator turns on to investigate);
        // replica 1 at the default info. Both sign with the key and the STS token.
        for (ordinal, level) in [(0, "debug"), (1, "info")] {
            let metrics_addr = format!("127.0.0.1:{}", free_port()?);
            let mut extra = owned(FAST_DAEMON);
            extra.extend(owned(&[
                ("METRICS_ADDR", &metrics_addr),
                ("ECI_SECURITY_TOKEN", &sts_token),
                ("RUST_LOG", level),
                ("PLACEMENT_ENABLED", "false"),
            ]));
            processes.push(h.start_daemon(ordinal, &env(&extra))?);
            metrics.push(metrics_addr);
        }
        let nodes: Vec<String> = (0..2).map(|o| h.node_name(o)).collect();
        for name in &nodes {
            wait_schedulable(h, name).await?;
        }
        // Two more replicas the front refuses: a wrong secret (SignatureDoesNotMatch) and a
        // wrong STS token (InvalidSecurityToken.Mismatch). Their errors are logged; neither
        // value may be.
        for (ordinal, key, value) in [(2, "ECI_SECRET_KEY", wrong_secret.as_str()), (3, "ECI_SECURITY_TOKEN", wrong_token.as_str())] {
            let metrics_addr = format!("127.0.0.1:{}", free_port()?);
            let mut extra = owned(FAST_DAEMON);
            extra.extend(owned(&[
                ("METRICS_ADDR", &metrics_addr),
                ("ECI_SECURITY_TOKEN", &sts_token),
                ("RUST_LOG", "debug"),
                ("PLACEMENT_ENABLED", "false"),
            ]));
            extra.retain(|(k, _)| k != key);
            extra.push((key.to_owned(), value.to_owned()));
            processes.push(h.start_daemon(ordinal, &env(&extra))?);
            metrics.push(metrics_addr);
        }

        // The workload: pods running (one referencing a Secret), logs and exec through the
        // kubelet API, ECI failures (a 30 s storm of InternalError on creates, then a refused
        // spec), deletion.
        let secrets: Api<Secret> = Api::namespaced(h.client(), ns);
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "app"}, "stringData": {"token": "pod-secret-value"}})).unwrap(),
            )
            .await?;
        let spec = pod_spec(&nodes, &json!({"containers": [{
            "name": "app",
            "image": "registry.example.com/app:1",
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "app", "key": "token"}}}],
        }]}));
        create_deployment(h, ns, "web", 4, &spec).await?;
        wait_running(h, ns, 4).await?;
        let first = pods(h, ns).await.into_iter().next().ok_or_else(|| failed("a pod"))?.name_any();
        h.wait_pod(ns, &first, "its group recorded", WAIT, |p| p["metadata"]["annotations"][INSTANCE_ID].is_string())
            .await?;
        let logs = kubectl(h, &["-n", ns, "logs", &first, "--tail=2"]).await;
        let exec = kubectl(h, &["-n", ns, "exec", &first, "--", "sh", "-c", "echo hi"]).await;
        if !logs.ok || !exec.ok {
            return Err(failed(format!("logs/exec: {}{}", logs.stderr, exec.stderr)));
        }
        let client = reqwest::Client::new();
        client
            .patch(format!("{}/admin/controls", mock.admin))
            .json(&json!({"faults": {"CreateContainerGroup": {"error_rate": 1.0, "error_code": "InternalError"}}}))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| failed(format!("mock-eci controls: {e}")))?;
        Api::<Deployment>::namespaced(h.client(), ns)
            .patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"spec": {"replicas": 6}})))
            .await?;
        tokio::time::sleep(Duration::from_secs(20)).await;
        client
            .patch(format!("{}/admin/controls", mock.admin))
            .json(&json!({"faults": {"CreateContainerGroup": {"error_rate": 0.0}}}))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| failed(format!("mock-eci controls: {e}")))?;
        wait_running(h, ns, 6).await?;
        // A spec ECI refuses: the pod fails with ECI's message on it.
        let refused: Pod = serde_json::from_value(json!({
            "metadata": {"name": "refused"},
            "spec": pod_spec(&nodes, &json!({"containers": [{"name": "app", "image": "registry.example.com/app:1",
                "resources": {"limits": {"cpu": "1000", "memory": "1Ti"}}}]})),
        }))
        .unwrap();
        Api::<Pod>::namespaced(h.client(), ns).create(&PostParams::default(), &refused).await?;
        let refused_pod = h
            .wait_pod(ns, "refused", "failed or pending with a reason", WAIT, |p| {
                p["status"]["phase"] == "Failed" || p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["reason"].is_string() && c["type"] == "PodScheduled" && c["status"] == "False")
                    || p["status"]["reason"].is_string()
            })
            .await;
        eprintln!("the refused pod: {:?}", refused_pod.map(|p| p["status"].clone()));
        // The refused replicas have logged their errors by now (they probe ECI every 250 ms).
        for process in &processes[2..] {
            let output = h.process_output(process).unwrap_or_default();
            if !output.contains("SignatureDoesNotMatch") && !output.contains("InvalidSecurityToken") {
                return Err(failed(format!("{process} never logged its refusal:\n{}", tail(&output, 20))));
            }
        }

        // Everything the checks read, collected before the cleanup deletes it.
        let mut sources: Vec<(String, String)> = Vec::new();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        for (process, metrics_addr) in processes.iter().zip(&metrics) {
            let text = match http.get(format!("http://{metrics_addr}/metrics")).send().await {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(error) => format!("<{error}>"),
            };
            sources.push((format!("/metrics of {process}"), text));
        }
        for process in &processes[..2] {
            let port = h.kubelet_port(process).ok_or_else(|| failed("kubelet port"))?;
            for path in ["pods", "metrics/resource", "stats/summary"] {
                let (status, body) = kubelet_get(h, port, path).await?;
                sources.push((format!("the kubelet API /{path} of {process} ({status})"), body));
            }
        }
        let mock_metrics = match http.get(format!("{}/metrics", mock.admin)).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(error) => format!("<{error}>"),
        };
        sources.push(("mock-eci /metrics".into(), mock_metrics));
        sources.push(("mock-eci groups".into(), groups(&mock.admin).await.map_or_else(|e| format!("<{e}>"), |g| Value::Array(g).to_string())));
        let events: Vec<Event> = Api::<Event>::all(h.client()).list(&ListParams::default()).await?.items;
        let events_count = events.len();
        sources.push(("every Event in the cluster".into(), serde_json::to_string(&events).unwrap_or_default()));
        let all_pods: Vec<Pod> = Api::<Pod>::all(h.client()).list(&ListParams::default()).await?.items;
        let pods_count = all_pods.len();
        sources.push(("every Pod in the cluster".into(), serde_json::to_string(&all_pods).unwrap_or_default()));
        let all_nodes: Vec<Node> = Api::<Node>::all(h.client()).list(&ListParams::default()).await?.items;
        sources.push(("every Node".into(), serde_json::to_string(&all_nodes).unwrap_or_default()));

        // Deletion, then the daemons stop; their logs are read last, with everything in them.
        let _ = Api::<Deployment>::namespaced(h.client(), ns).delete("web", &DeleteParams::foreground()).await;
        let _ = Api::<Pod>::namespaced(h.client(), ns).delete("refused", &DeleteParams::default()).await;
        wait_no_pods(h, ns).await?;
        for process in &processes {
            if let Some(p) = h.process(process) {
                p.terminate(Duration::from_secs(10)).await;
            }
        }
        let mut log_bytes = 0;
        for process in processes.iter().chain(std::iter::once(&"mock-eci".to_owned())) {
            let output = h.process_output(process).unwrap_or_default();
            log_bytes += output.len();
            sources.push((format!("the log of {process}"), output));
        }

        // The secret, the STS token and the two wrong values must appear nowhere. The AccessKey
        // id is an identifier, not a secret (it travels in clear in every request, as the
        // `AccessKeyId` parameter, and Alibaba Cloud's consoles and ActionTrail show it): the
        // daemon names it in its one start-up line ("using the Alibaba Cloud ECI OpenAPI …
        // credentials=AccessKey <id> …" / "STS token for AccessKey <id>") so an operator can
        // tell which key a replica uses while rotating. It must appear nowhere else: not in
        // Events, Pods, Nodes, metrics, the kubelet API, mock-eci's answers, and in a daemon's
        // log only on lines that describe its credentials.
        let forbidden = [
            ("the AccessKey secret", E2E_ACCESS_KEY_SECRET),
            ("the STS token", sts_token.as_str()),
            ("the wrong secret", wrong_secret.as_str()),
            ("the wrong STS token", wrong_token.as_str()),
        ];
        // Each as written, base64-encoded and URL-encoded (a logged request body or header).
        let forbidden: Vec<(String, String)> = forbidden
            .iter()
            .flat_map(|(what, value)| {
                use base64::Engine as _;
                let url: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
                [
                    ((*what).to_owned(), (*value).to_owned()),
                    (format!("{what} (base64)"), base64::engine::general_purpose::STANDARD.encode(value).trim_end_matches('=').to_owned()),
                    (format!("{what} (URL-encoded)"), url),
                ]
            })
            .collect();
        let mut leaks: Vec<String> = Vec::new();
        let mut id_leaks: Vec<String> = Vec::new();
        let mut id_lines: Vec<String> = Vec::new();
        for (source, text) in &sources {
            let mut seen = BTreeSet::new();
            for (what, value) in &forbidden {
                let count = text.matches(value.as_str()).count();
                if count > 0 && seen.insert(value.clone()) {
                    let line = text.lines().find(|l| l.contains(value.as_str())).unwrap_or_default();
                    leaks.push(format!("{what} ×{count} in {source}: {}", shorten(line)));
                }
            }
            let is_daemon_log = source.starts_with("the log of ") && !source.ends_with("mock-eci");
            let (mut stray, mut first) = (0, None);
            for line in text.lines().filter(|l| l.contains(E2E_ACCESS_KEY_ID)) {
                let describes_credentials = line.contains("using the Alibaba Cloud ECI OpenAPI")
                    || line.contains("credentials (re)loaded");
                if is_daemon_log && describes_credentials {
                    id_lines.push(format!("{source}: {}", shorten(line)));
                } else {
                    stray += 1;
                    first.get_or_insert_with(|| shorten(line));
                }
            }
            if let Some(first) = first {
                id_leaks.push(format!("the AccessKey id on {stray} line(s) of {source}, the first: {first}"));
            }
        }
        let details = json!({
            "sources": sources.iter().map(|(s, t)| json!({"source": s, "bytes": t.len()})).collect::<Vec<_>>(),
            "events": events_count,
            "pods": pods_count,
            "log_bytes": log_bytes,
            "leaks": leaks,
            "access_key_id_elsewhere": id_leaks,
            "access_key_id_lines": id_lines,
            "seconds": started.elapsed().as_secs(),
        });
        eprintln!("credentials: {}", serde_json::to_string_pretty(&details).unwrap());
        let passed = leaks.is_empty() && id_leaks.is_empty();
        record(
            "credentials",
            if passed { "pass" } else { "fail" },
            &format!(
                "{} sources scanned ({log_bytes} bytes of daemon and mock-eci logs, {events_count} Events, {pods_count} Pods, the /metrics of 4 daemons): the secret, the STS token or a wrong one found in {} of them; the AccessKey id outside its credential-description line in {} ({} such lines)",
                sources.len(),
                leaks.len(),
                id_leaks.len(),
                id_lines.len()
            ),
            &details,
        );
        leaks.extend(id_leaks);
        if leaks.is_empty() {
            Ok(())
        } else {
            Err(failed(format!("credentials leaked:\n{}", leaks.join("\n"))))
        }
    })
    .await;
}

fn shorten(line: &str) -> String {
    line.chars().take(300).collect()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---- 4. no plain HTTP, no TLS below 1.2 ----

/// What a plain HTTP request to a TLS port got back.
async fn plain_http(port: u16) -> String {
    let Ok(Ok(mut stream)) = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    else {
        return "no connection".into();
    };
    let _ = stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    if answer.starts_with(b"HTTP/") {
        format!(
            "an HTTP answer: {}",
            String::from_utf8_lossy(&answer)
                .lines()
                .next()
                .unwrap_or_default()
        )
    } else if answer.first() == Some(&0x15) {
        format!(
            "a TLS alert record ({} bytes: {:02x?})",
            answer.len(),
            &answer[..answer.len().min(7)]
        )
    } else if answer.is_empty() {
        "the connection closed with no answer".into()
    } else {
        format!(
            "{} bytes that are not HTTP: {:02x?}",
            answer.len(),
            &answer[..answer.len().min(8)]
        )
    }
}

/// The outcome of one `openssl s_client` handshake attempt.
#[derive(Debug)]
enum Handshake {
    /// The handshake completed with this protocol.
    Completed(String),
    /// The ClientHello went out and the server answered with a fatal alert (its description).
    Refused(String),
    /// Anything else (the client did not offer the version, the connection failed …).
    Unclear(String),
}

impl std::fmt::Display for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Completed(protocol) => write!(f, "completed ({protocol})"),
            Self::Refused(alert) => write!(f, "ClientHello sent, refused: {alert}"),
            Self::Unclear(output) => write!(f, "unclear: {output}"),
        }
    }
}

async fn handshake(port: u16, version_flag: &str) -> Handshake {
    let connect = format!("127.0.0.1:{port}");
    // SECLEVEL=0: OpenSSL 3 refuses to offer TLS 1.0/1.1 at its default security level, which
    // would end the attempt on our side without any ClientHello.
    let mut args = vec![
        "s_client",
        "-connect",
        connect.as_str(),
        version_flag,
        "-msg",
    ];
    if version_flag != "-tls1_2" {
        args.extend(["-cipher", "DEFAULT:@SECLEVEL=0"]);
    }
    let out = command(Path::new("openssl"), &args, b"").await;
    let all = format!("{}\n{}", out.stdout, out.stderr);
    let hello_sent = all
        .lines()
        .any(|l| l.starts_with(">>> ") && l.contains("ClientHello"));
    let alert = all
        .lines()
        .find(|l| l.starts_with("<<< ") && l.contains("Alert"))
        .map(str::to_owned)
        .or_else(|| {
            all.lines()
                .find(|l| l.contains("alert") && l.contains("SSL alert number"))
                .map(str::to_owned)
        });
    let protocol = all
        .lines()
        .find(|l| l.trim_start().starts_with("Protocol") && l.contains(':'))
        .map(|l| l.split(':').nth(1).unwrap_or_default().trim().to_owned());
    // A completed handshake prints `New, TLSv1.2, Cipher is …`; a failed one `New, (NONE)`.
    let completed = all.lines().any(|l| l.starts_with("New, TLSv"));
    match (hello_sent, alert, protocol) {
        (true, Some(alert), _) => Handshake::Refused(alert.trim().to_owned()),
        (true, None, Some(protocol)) if completed => Handshake::Completed(protocol),
        _ => Handshake::Unclear(tail(&all, 8)),
    }
}

/// What one endpoint answered to plain HTTP and to TLS 1.2, 1.1 and 1.0 ClientHellos.
struct Probes {
    plain: String,
    tls12: Handshake,
    tls11: Handshake,
    tls10: Handshake,
    /// How many rounds it took to find a listener for all four.
    rounds: u32,
}

impl Probes {
    /// A round in which some probe found nobody listening says nothing about the endpoint: the
    /// extender's address changes hands with the placement Lease (another test's daemons may
    /// have held it and just stopped).
    fn found_no_listener(&self) -> bool {
        let absent = |h: &Handshake| matches!(h, Handshake::Unclear(_));
        self.plain == "no connection"
            || absent(&self.tls12)
            || absent(&self.tls11)
            || absent(&self.tls10)
    }

    fn ok(&self) -> bool {
        !self.plain.starts_with("an HTTP answer")
            && self.plain != "no connection"
            && matches!(self.tls12, Handshake::Completed(_))
            && matches!(self.tls11, Handshake::Refused(_))
            && matches!(self.tls10, Handshake::Refused(_))
    }
}

impl std::fmt::Display for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plain HTTP → {}; TLS 1.2 → {}; TLS 1.1 → {}; TLS 1.0 → {} (round {})",
            self.plain, self.tls12, self.tls11, self.tls10, self.rounds
        )
    }
}

/// Probes `port` once a TLS 1.2 handshake completes there (the webhook serves once its
/// certificate is shared through its Secret; the extender once a daemon is elected), and again
/// (at most three rounds) while a round finds no listener: a listener's answer, whatever it
/// is, is what gets judged.
async fn probe_endpoint(h: &Harness, name: &str, port: u16) -> Result<Probes, HarnessError> {
    const ROUNDS: u32 = 3;
    let mut rounds = 0;
    loop {
        rounds += 1;
        h.wait_for(
            &format!("{name} to complete a TLS 1.2 handshake"),
            WAIT,
            |_| async move { matches!(handshake(port, "-tls1_2").await, Handshake::Completed(_)) },
        )
        .await?;
        let probes = Probes {
            plain: plain_http(port).await,
            tls12: handshake(port, "-tls1_2").await,
            tls11: handshake(port, "-tls1_1").await,
            tls10: handshake(port, "-tls1").await,
            rounds,
        };
        if !probes.found_no_listener() || rounds == ROUNDS {
            return Ok(probes);
        }
        eprintln!("{name} (:{port}): round {rounds} found no listener, probing again: {probes}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_endpoints_refuse_plain_http_and_tls_below_1_2() {
    run(async |h| {
        let version = command(Path::new("openssl"), &["version"], b"").await;
        if !version.ok {
            record("tls", "not run", "openssl is not installed", &json!({}));
            return Ok(());
        }
        h.start_mock_eci(FAST_MOCK).await?;
        // The daemon serves the extender too once elected (the placement Lease is the
        // cluster's: the audit check's daemons may hold it, and then serve the same address).
        install_resource_policy_crd(h).await?;
        let webhook = format!("{}-tls", h.daemon_set_name());
        let webhook_port = free_port()?;
        let mut extra = owned(FAST_DAEMON);
        extra.extend(webhook_env(&webhook, webhook_port));
        extra.extend(h.placement_env());
        let process = h.start_daemon(0, &env(&extra))?;
        wait_schedulable(h, &h.node_name(0)).await?;
        let kubelet_port = h.kubelet_port(&process).ok_or_else(|| failed("kubelet port"))?;
        let mut endpoints = vec![("the kubelet API", kubelet_port), ("the webhook", webhook_port)];
        let mut not_checked = Vec::new();
        if let Some(extender) = h.placement_extender() {
            let port = extender.addr.port();
            let served = h
                .wait_for("a daemon to serve the scheduler extender", Duration::from_secs(60), |_| async move {
                    matches!(handshake(port, "-tls1_2").await, Handshake::Completed(_))
                })
                .await;
            if served.is_ok() {
                endpoints.push(("the scheduler extender", port));
            } else {
                not_checked.push("the scheduler extender (no daemon elected within 60 s)");
            }
        } else {
            not_checked.push("the scheduler extender (not in this cluster)");
        }
        let mut results = Vec::new();
        let mut all_ok = true;
        for (name, port) in &endpoints {
            let probes = probe_endpoint(h, name, *port).await?;
            all_ok &= probes.ok();
            eprintln!("{name} (:{port}): {probes}");
            results.push(json!({
                "endpoint": name,
                "plain_http": probes.plain,
                "tls1_2": probes.tls12.to_string(),
                "tls1_1": probes.tls11.to_string(),
                "tls1_0": probes.tls10.to_string(),
                "rounds": probes.rounds,
                "ok": probes.ok(),
            }));
        }
        remove_webhook(h, &webhook).await;
        let names: Vec<&str> = endpoints.iter().map(|(n, _)| *n).collect();
        record(
            "tls",
            if all_ok { "pass" } else { "fail" },
            &format!(
                "{}: plain HTTP gets no HTTP answer; TLS 1.2 completes (control); TLS 1.1 and 1.0 ClientHellos sent by {} are answered with a fatal alert{}",
                names.join(", "),
                version.stdout.trim(),
                if not_checked.is_empty() { String::new() } else { format!("; not checked: {}", not_checked.join(", ")) }
            ),
            &json!(results),
        );
        if all_ok {
            Ok(())
        } else {
            Err(failed(format!("an endpoint accepts plain HTTP or old TLS: {}", serde_json::to_string_pretty(&results).unwrap())))
        }
    })
    .await;
}

#[test]
fn can_i_tables_parse() {
    let table = "Resources                                       Non-Resource URLs   Resource Names   Verbs\n\
        selfsubjectreviews.authentication.k8s.io        []                  []               [create]\n\
        pods/status                                     []                  []               [patch]\n\
        resourcepolicies.scheduling.alibabacloud.com/status []             []               [patch]\n\
        nodes                                           []                  []               [get list watch]\n\
        configmaps                                      []                  [eci-profile]    [get]\n\
                                                        [/healthz]          []               [get]\n";
    let (resources, urls) = parse_can_i(table);
    let has =
        |g: &str, r: &str, v: &str| resources.contains(&(g.to_owned(), r.to_owned(), v.to_owned()));
    assert!(has("authentication.k8s.io", "selfsubjectreviews", "create"));
    assert!(has("", "pods/status", "patch"));
    assert!(has(
        "scheduling.alibabacloud.com",
        "resourcepolicies/status",
        "patch"
    ));
    assert!(has("", "nodes", "watch"));
    assert!(has("", "configmaps[eci-profile]", "get"));
    assert_eq!(resources.len(), 7);
    assert!(urls.contains("get /healthz"));
}

// ---- listeners: slow unauthenticated callers (issue 45, attack 6) ----

/// Accepts any server certificate: the attacker does not care who answers.
#[derive(Debug)]
struct AnyServer(rustls::crypto::CryptoProvider);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// An HTTP/1.1-only TLS client without a certificate, trusting any server.
fn anonymous_tls() -> tokio_rustls::TlsConnector {
    let provider = rustls::crypto::ring::default_provider();
    let mut config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider.clone()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer(provider)))
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// What one slow caller does after connecting.
#[derive(Debug, Clone, Copy)]
enum Slow {
    /// Declares an 8 MiB body and sends all of it but the last byte as fast as the server
    /// takes it, then stalls.
    Push,
    /// Declares an 8 MiB body and sends a byte every 200 ms.
    Trickle,
    /// Sends half a request head and stalls.
    Head,
}

const SLOW_BODY: usize = 8 * 1024 * 1024;

/// One slow caller on `port` (TLS unless `plain`): `Ok(elapsed)` when the server closed the
/// connection, `Err(why)` when it did not within `limit` (or the connection failed to open).
async fn slow_caller(
    port: u16,
    plain: bool,
    path: &str,
    how: Slow,
    limit: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let stream: Box<dyn AsyncStream> = if plain {
        Box::new(tcp)
    } else {
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
        match tokio::time::timeout(limit, anonymous_tls().connect(name, tcp)).await {
            Ok(Ok(tls)) => Box::new(tls),
            // The server ended the handshake: closed, as wanted.
            Ok(Err(_)) => return Ok(started.elapsed()),
            Err(_) => return Err("the TLS handshake neither completed nor failed".into()),
        }
    };
    let (mut reader, mut writer) = tokio::io::split(stream);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {SLOW_BODY}\r\n\r\n"
    );
    let write = async move {
        match how {
            Slow::Head => {
                let _ = writer.write_all(&head.as_bytes()[..head.len() / 2]).await;
            }
            Slow::Push => {
                if writer.write_all(head.as_bytes()).await.is_ok() {
                    let chunk = vec![b' '; 64 * 1024];
                    let mut sent = 0;
                    while sent + chunk.len() < SLOW_BODY {
                        if writer.write_all(&chunk).await.is_err() {
                            break;
                        }
                        sent += chunk.len();
                    }
                }
            }
            Slow::Trickle => {
                if writer.write_all(head.as_bytes()).await.is_ok() {
                    while writer.write_all(b" ").await.is_ok() && writer.flush().await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        // Stall: keep the connection open, send nothing more.
        std::future::pending::<()>().await;
    };
    let closed = async move {
        let mut sink = vec![0_u8; 16 * 1024];
        loop {
            match reader.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        () = write => unreachable!("the writer stalls forever"),
        outcome = tokio::time::timeout(limit, closed) => match outcome {
            Ok(()) => Ok(started.elapsed()),
            Err(_) => Err(format!("{how:?}: still open after {limit:?}")),
        },
    }
}

trait AsyncStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncStream for T {}

/// The daemon's resident set, KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// 100 slow callers on each listener at once; the largest RSS seen meanwhile (KiB) and each
/// caller's outcome.
async fn slow_attack(
    pid: u32,
    listeners: &[(&'static str, u16, bool, &'static str)],
    limit: Duration,
) -> (u64, Vec<(&'static str, Result<Duration, String>)>) {
    let mut callers = tokio::task::JoinSet::new();
    for (name, port, plain, path) in listeners.iter().copied() {
        for i in 0..100 {
            let how = [Slow::Push, Slow::Trickle, Slow::Head][i % 3];
            callers.spawn(async move { (name, slow_caller(port, plain, path, how, limit).await) });
        }
    }
    let mut peak = 0;
    let mut outcomes = Vec::new();
    let mut sample = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = sample.tick() => peak = peak.max(rss_kib(pid).unwrap_or(0)),
            joined = callers.join_next() => match joined {
                Some(joined) => outcomes.push(joined.expect("a caller does not panic")),
                None => break,
            },
        }
    }
    (peak.max(rss_kib(pid).unwrap_or(0)), outcomes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_unauthenticated_callers_neither_grow_memory_nor_stay_connected() {
    run(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        install_resource_policy_crd(h).await?;
        let webhook = format!("{}-slow", h.daemon_set_name());
        let webhook_port = free_port()?;
        let health_port = free_port()?;
        let mut extra = owned(FAST_DAEMON);
        extra.extend(webhook_env(&webhook, webhook_port));
        extra.extend(h.placement_env());
        // The probes on a port of their own; METRICS_ADDR unset (the harness sets it): the
        // read-only port as a default install has it.
        extra.push(("HEALTH_ADDR".into(), format!("127.0.0.1:{health_port}")));
        extra.push(("METRICS_ADDR".into(), String::new()));
        let process = h.start_daemon(0, &env(&extra))?;
        wait_schedulable(h, &h.node_name(0)).await?;
        let kubelet_port = h.kubelet_port(&process).ok_or_else(|| failed("kubelet port"))?;
        h.wait_for("the webhook to serve TLS", WAIT, |_| async move {
            matches!(handshake(webhook_port, "-tls1_2").await, Handshake::Completed(_))
        })
        .await?;
        let mut listeners = vec![
            ("the webhook", webhook_port, false, "/mutate-pods"),
            ("the kubelet API", kubelet_port, false, "/pods"),
            ("the probes", health_port, true, "/healthz"),
        ];
        if let Some(extender) = h.placement_extender() {
            let port = extender.addr.port();
            let served = h
                .wait_for("the scheduler extender to serve TLS", Duration::from_secs(60), |_| async move {
                    matches!(handshake(port, "-tls1_2").await, Handshake::Completed(_))
                })
                .await;
            if served.is_ok() {
                listeners.push(("the scheduler extender", port, false, "/resourcepolicy/filter"));
            }
        }
        // Nothing on the read-only port unless opted in.
        let read_only = h.metrics_address(&process);
        let port_10255 = plain_http(10255).await;
        let pid = h
            .process(&process)
            .and_then(|p| p.pid())
            .ok_or_else(|| failed("the daemon's pid"))?;
        // Idle: the largest of a few samples once every listener is up.
        let mut idle = 0;
        for _ in 0..10 {
            idle = idle.max(rss_kib(pid).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let limit = Duration::from_secs(60);
        let (peak, outcomes) = slow_attack(pid, &listeners, limit).await;
        let growth_mib = peak.saturating_sub(idle) as f64 / 1024.0;
        let mut per_listener = Vec::new();
        let mut all_closed = true;
        for (name, ..) in &listeners {
            let mine: Vec<_> = outcomes.iter().filter(|(n, _)| n == name).collect();
            let open: Vec<&String> = mine.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
            let slowest = mine
                .iter()
                .filter_map(|(_, r)| r.as_ref().ok())
                .max()
                .copied()
                .unwrap_or_default();
            all_closed &= open.is_empty();
            eprintln!("{name}: {} callers, {} not closed by the server, slowest close {slowest:?}", mine.len(), open.len());
            per_listener.push(json!({
                "listener": name,
                "callers": mine.len(),
                "not_closed": open.len(),
                "examples": open.iter().take(3).collect::<Vec<_>>(),
                "slowest_close_ms": slowest.as_millis(),
            }));
        }
        let quiet = read_only.is_none() && port_10255 == "no connection";
        let ok = growth_mib <= 20.0 && all_closed && quiet;
        eprintln!(
            "RSS idle {} MiB, peak {} MiB (+{growth_mib:.1} MiB); read-only port: {read_only:?}, :10255 → {port_10255}",
            idle / 1024,
            peak / 1024
        );
        remove_webhook(h, &webhook).await;
        let details = json!({
            "idle_rss_kib": idle,
            "peak_rss_kib": peak,
            "growth_mib": growth_mib,
            "listeners": per_listener,
            "read_only_port": read_only,
            "port_10255": port_10255,
        });
        record(
            "listeners",
            if ok { "pass" } else { "fail" },
            &format!("100 slow unauthenticated callers on each listener: RSS +{growth_mib:.1} MiB (bound 20), all closed by the server: {all_closed}; read-only port off: {quiet}"),
            &details,
        );
        if ok {
            Ok(())
        } else {
            Err(failed(format!("slow callers: {}", serde_json::to_string_pretty(&details).unwrap())))
        }
    })
    .await;
}
