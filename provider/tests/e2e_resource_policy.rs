//! End to end: ResourcePolicy placement (`scheduling.alibabacloud.com/v1alpha1`, ACK's API) on
//! the real control plane. kube-scheduler runs with the daemon's extender (the fixture's
//! `placement_extender`), the kube-controller-manager's Deployment and ReplicaSet controllers
//! scale the workloads (with the built kubectl, as the seed does), kwok runs the ECS nodes each
//! scenario registers with labels of its own (2 CPU, 4 GiB), and a daemon process serves a
//! virtual node on mock-eci (the `eci` unit) and, elected, the extender.
//!
//! One extender serves the whole cluster (the replica holding Lease
//! `kube-system/virtual-node-eci-placement`), so the scenarios that need it — or need it
//! absent — take turns: a daemon of a scenario that ends would otherwise hand the extender over
//! (or leave it unserved, which kube-scheduler ignores) in the middle of another's scale-out.
//! They stay apart by namespace, node names and node labels too. The CRD scenario runs
//! alongside.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "common/kustomize.rs"]
mod kustomize;

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt as _};
use integration::harness::deploy::{Mock, apply_local_overlay, wait_installed};
use integration::harness::mock_admin;
use integration::harness::{ClusterKind, FixtureOptions, Harness, HarnessError, free_port};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};

/// A condition the cluster reaches by itself (scheduling, a status, a count).
const WAIT: Duration = Duration::from_secs(120);
/// Fifty pods through the scheduler, or a daemon pod starting on a loaded machine.
const SLOW: Duration = Duration::from_secs(300);
/// Quick groups, whose containers stop within a second of SIGTERM.
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
];

const UNIT: &str = "placement.virtual-node-eci.aliyun.com/unit";
const POLICY: &str = "placement.virtual-node-eci.aliyun.com/policy";
const PLACED_BY: &str = "placement.virtual-node-eci.aliyun.com/placed-by";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
const TEMPLATE_HASH: &str = "pod-template-hash";
/// Keeps a pod Terminating (kwok deletes pods at once) until the scenario lets it go.
const HOLD: &str = "e2e.virtual-node-eci.aliyun.com/hold";
const CRD_FILE: &str = "../deploy/base/resourcepolicy-crd.yaml";
const CRD_NAME: &str = "resourcepolicies.scheduling.alibabacloud.com";
const PLACEMENT_LEASE: &str = "virtual-node-eci-placement";

/// The scenarios that depend on who serves the extender, one at a time.
static EXTENDER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The CRD, applied once per test binary.
static CRD: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// What a scenario set up that the wrapper removes.
#[derive(Debug, Default)]
struct Scene {
    /// kwok nodes registered by the scenario.
    nodes: Vec<String>,
    /// Namespaces whose pods may carry [`HOLD`].
    held: Vec<String>,
    /// The daemon's metrics address, once started.
    metrics: String,
    /// The daemon's process name, once started.
    daemon: String,
}

fn policy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.alibabacloud.com", "v1alpha1", "ResourcePolicy"),
        "resourcepolicies",
    )
}

async fn start_harness() -> Harness {
    Harness::start_with(FixtureOptions {
        placement_extender: true,
        ..FixtureOptions::default()
    })
    .await
    .expect("the harness starts")
}

/// Runs `scenario` in its turn on a harness whose kube-scheduler calls the extender; on
/// failure prints the harness dump and the policies; always removes what it set up.
async fn with_placement<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness, &mut Scene) -> Result<(), HarnessError>,
{
    let _turn = EXTENDER_TURN.lock().await;
    let mut h = start_harness().await;
    assert!(
        h.kind() == ClusterKind::Fixture && h.placement_extender().is_some(),
        "these scenarios need the fixture's kube-scheduler with the extender; unset E2E_KUBECONFIG"
    );
    let started = Instant::now();
    let mut scene = Scene::default();
    let result = AssertUnwindSafe(async {
        install_crd(&h).await?;
        scenario(&mut h, &mut scene).await
    })
    .catch_unwind()
    .await;
    if !matches!(result, Ok(Ok(()))) {
        eprintln!("{}", h.dump().await);
        let policies: Api<DynamicObject> = Api::all_with(h.client(), &policy_resource());
        if let Ok(list) = policies.list(&ListParams::default()).await {
            eprintln!(
                "---- resource policies ----\n{}",
                serde_json::to_string_pretty(&list.items).unwrap_or_default()
            );
        }
        if let Some(output) = h.process_output(&scene.daemon) {
            eprintln!(
                "---- placement lines of {} ----\n{}",
                scene.daemon,
                output
                    .lines()
                    .filter(|l| l.contains("placement") || l.contains("extender"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    eprintln!("scenario done after {:?}", started.elapsed());
    let client = h.client();
    release_held(&client, &scene.held).await;
    h.shutdown(Duration::from_secs(10)).await;
    let nodes: Api<Node> = Api::all(client);
    for name in &scene.nodes {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    match result {
        Ok(outcome) => outcome.unwrap(),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// `kubectl apply` of the CRD as deploy/ ships it (the harness applies only the daemon's
/// RBAC and the Selector CRD), once, and waits for it to be served.
async fn install_crd(h: &Harness) -> Result<(), HarnessError> {
    CRD.get_or_try_init(|| async {
        let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join(CRD_FILE);
        h.apply_crd(&crd, CRD_NAME, WAIT).await
    })
    .await
    .map(|_| ())
}

struct Kubectl {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn kubectl(h: &Harness, args: &[&str]) -> Kubectl {
    kubectl_with_input(h, args, None).await
}

async fn kubectl_with_input(h: &Harness, args: &[&str], input: Option<&str>) -> Kubectl {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).await.unwrap();
    }
    drop(stdin);
    let output = child.wait_with_output().await.expect("kubectl runs");
    Kubectl {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `kubectl scale deployment/NAME --replicas=N`, as the seed does.
async fn scale(h: &Harness, ns: &str, name: &str, replicas: usize) -> Result<(), HarnessError> {
    let output = kubectl(
        h,
        &[
            "-n",
            ns,
            "scale",
            &format!("deployment/{name}"),
            &format!("--replicas={replicas}"),
        ],
    )
    .await;
    if output.ok {
        Ok(())
    } else {
        Err(HarnessError::Setup(format!(
            "kubectl scale: {}",
            output.stderr
        )))
    }
}

// ---- nodes and the daemon ----

fn is_true(conditions: &Value, kind: &str) -> bool {
    conditions
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

async fn node_json(h: &Harness, name: &str) -> Option<Value> {
    Api::<Node>::all(h.client())
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|n| serde_json::to_value(n).unwrap())
}

/// Ready, not cordoned, and no taint but `allowed` (the node lifecycle controller lifts
/// `not-ready` once it has seen the node Ready).
async fn wait_schedulable(h: &Harness, name: &str, allowed: &[&str]) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("node {name} Ready and schedulable"),
        WAIT,
        |h| async move {
            node_json(h, name).await.is_some_and(|n| {
                is_true(&n["status"]["conditions"], "Ready")
                    && n["spec"]["unschedulable"] != true
                    && n["spec"]["taints"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .all(|t| allowed.iter().any(|a| t["key"] == *a))
            })
        },
    )
    .await
}

/// Registers `count` kwok ECS nodes (2 CPU, 4 GiB, 110 pods, as the fixture's) named after the
/// test and `pool`, carrying `labels`, and waits until the scheduler may use them.
async fn add_pool(
    h: &Harness,
    scene: &mut Scene,
    pool: &str,
    count: usize,
    labels: &Value,
) -> Result<Vec<String>, HarnessError> {
    let nodes: Api<Node> = Api::all(h.client());
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("{}-{pool}-{i}", h.daemon_set_name());
        let mut all = json!({
            "type": "kwok",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node-role.kubernetes.io/worker": "",
        });
        for (key, value) in labels.as_object().into_iter().flatten() {
            all[key] = value.clone();
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": all,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            },
            "status": {
                "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            },
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await?;
        scene.nodes.push(name.clone());
        names.push(name);
    }
    for name in &names {
        wait_schedulable(h, name, &[]).await?;
    }
    Ok(names)
}

/// Starts mock-eci and daemon replica 0 serving the extender where the fixture's kube-scheduler
/// calls it, and waits for its virtual node and for the extender to answer.
async fn start_daemon(
    h: &mut Harness,
    scene: &mut Scene,
    extra: &[(&str, &str)],
) -> Result<(), HarnessError> {
    h.start_mock_eci(FAST_MOCK).await?;
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let mut env: Vec<(String, String)> = h.placement_env();
    assert!(!env.is_empty(), "the fixture has the extender");
    env.push(("METRICS_ADDR".into(), metrics.clone()));
    env.extend(
        FAST_DAEMON
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    scene.daemon = h.start_daemon(0, &env)?;
    scene.metrics = metrics;
    wait_schedulable(h, &h.node_name(0), &["k8s.aliyun.com/vnode"]).await?;
    let extender = h.placement_extender().unwrap();
    let ca = std::fs::read(extender.ca_file()).unwrap();
    // The probe calls as kube-scheduler does (its client certificate): the extender answers
    // nobody else.
    let mut identity = std::fs::read(extender.client_cert_file()).unwrap();
    identity.extend(std::fs::read(extender.client_key_file()).unwrap());
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let filter = format!("{}/filter", extender.url_prefix());
    let holder = h.node_name(0);
    h.wait_for("our daemon elected and serving the extender", WAIT, |h| {
        let (client, filter, holder) = (client.clone(), filter.clone(), holder.clone());
        async move {
            let elected = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
                h.client(),
                "kube-system",
            )
            .get_opt(PLACEMENT_LEASE)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .is_some_and(|id| id.contains(&holder));
            // A pod no policy selects passes every node.
            let answers = client
                .post(&filter)
                .json(&json!({"Pod": {"metadata": {"name": "probe", "namespace": "default"}}, "NodeNames": ["n"]}))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            elected && answers
        }
    })
    .await
}

/// `virtual_node_eci_placement_pods_placed_total` of `policy` and `unit` (1-based) as the
/// daemon counts it.
async fn placed_metric(scene: &Scene, policy: &str, unit: usize) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", scene.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let unit_label = format!("unit=\"{unit}\"");
    let policy_label = format!("policy=\"{policy}\"");
    text.lines()
        .filter(|l| l.starts_with("virtual_node_eci_placement_pods_placed_total{"))
        .filter(|l| l.contains(&unit_label) && l.contains(&policy_label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the daemon's placement counter shows, for `policy`, each `(unit, pods)` of
/// `expected`. A bind is counted once the apiserver's answer to it is back, and a watch of the
/// pods may see the binding before that: the counter is read until it agrees, never once.
async fn wait_placed(
    h: &Harness,
    scene: &Scene,
    policy: &str,
    expected: &[(usize, f64)],
) -> Result<(), HarnessError> {
    let what = format!("the placement counter of {policy} to show (unit, pods) {expected:?}");
    h.wait_for(&what, WAIT, |_| async move {
        for (unit, pods) in expected {
            if placed_metric(scene, policy, *unit).await != *pods {
                return false;
            }
        }
        true
    })
    .await
}

// ---- policies, workloads, pods ----

/// Creates the policy and waits until the daemon's controller has seen it (its status names
/// the generation), so pods created next are placed by it.
async fn create_policy(h: &Harness, ns: &str, name: &str, spec: Value) -> Result<(), HarnessError> {
    let api: Api<DynamicObject> = Api::namespaced_with(h.client(), ns, &policy_resource());
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
        "kind": "ResourcePolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await?;
    h.wait_for(
        &format!("the status of ResourcePolicy {ns}/{name}"),
        WAIT,
        |h| async move {
            policy(h, ns, name).await.is_some_and(|p| {
                !p["status"]["observedGeneration"].is_null()
                    && p["status"]["observedGeneration"] == p["metadata"]["generation"]
            })
        },
    )
    .await
}

async fn policy(h: &Harness, ns: &str, name: &str) -> Option<Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(h.client(), ns, &policy_resource());
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|p| serde_json::to_value(p).unwrap())
}

/// Waits until the policy's status counts `pods` per unit (and as many placed in all).
async fn wait_status(
    h: &Harness,
    ns: &str,
    name: &str,
    pods: &[i64],
) -> Result<Value, HarnessError> {
    let total: i64 = pods.iter().sum();
    h.wait_for(
        &format!("ResourcePolicy {ns}/{name} to count {pods:?}"),
        WAIT,
        |h| async move {
            policy(h, ns, name).await.is_some_and(|p| {
                let units: Vec<i64> = p["status"]["units"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|u| u["pods"].as_i64().unwrap_or(-1))
                    .collect();
                units == pods && p["status"]["placedPods"] == total
            })
        },
    )
    .await?;
    Ok(policy(h, ns, name).await.unwrap())
}

/// A pod template's spec: one container requesting (and limited to) `cpu`.
fn pod_spec(cpu: &str) -> Value {
    json!({
        "containers": [{
            "name": "nginx",
            "image": "nginx",
            "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}},
        }],
    })
}

fn with_vnode_toleration(mut spec: Value) -> Value {
    spec["tolerations"] = json!([{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    spec
}

/// A Deployment `name` of pods labelled `app: name` with `spec`.
async fn create_deployment(
    h: &Harness,
    ns: &str,
    name: &str,
    replicas: usize,
    spec: Value,
    strategy: Option<Value>,
) -> Result<(), HarnessError> {
    let mut deployment = json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    });
    if let Some(strategy) = strategy {
        deployment["spec"]["strategy"] = strategy;
    }
    let deployment: Deployment = serde_json::from_value(deployment).unwrap();
    Api::<Deployment>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    Ok(())
}

/// Changes the Deployment's pod template (a new `pod-template-hash`): a rolling update.
async fn roll(h: &Harness, ns: &str, name: &str, revision: &str) -> Result<(), HarnessError> {
    Api::<Deployment>::namespaced(h.client(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {"e2e/revision": revision}}}}})),
        )
        .await?;
    Ok(())
}

async fn pods(h: &Harness, ns: &str, app: &str) -> Vec<Value> {
    Api::<Pod>::namespaced(h.client(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect()
}

fn name_of(pod: &Value) -> String {
    pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or_default()
}

fn hash_of(pod: &Value) -> &str {
    pod["metadata"]["labels"][TEMPLATE_HASH]
        .as_str()
        .unwrap_or_default()
}

fn annotation<'a>(pod: &'a Value, key: &str) -> &'a str {
    pod["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or_default()
}

fn terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running" && !terminating(pod)
}

/// Waits until `app` has exactly `count` pods, every one bound, Running and not terminating
/// (and, with `hash`, of that template), and answers them.
async fn wait_settled(
    h: &Harness,
    ns: &str,
    app: &str,
    count: usize,
    hash: Option<&str>,
    timeout: Duration,
) -> Result<Vec<Value>, HarnessError> {
    let settled = Mutex::new(Vec::new());
    h.wait_for(
        &format!("{count} running pods of {ns}/{app}"),
        timeout,
        |h| {
            let settled = &settled;
            async move {
                let pods = pods(h, ns, app).await;
                let ok = pods.len() == count
                    && pods.iter().all(|p| {
                        running(p) && !node_of(p).is_empty() && hash.is_none_or(|x| hash_of(p) == x)
                    });
                if ok {
                    *settled.lock().unwrap() = pods;
                }
                ok
            }
        },
    )
    .await?;
    Ok(settled.into_inner().unwrap())
}

/// Names of `pods` bound to one of `nodes`.
fn on(pods: &[Value], nodes: &[String]) -> BTreeSet<String> {
    pods.iter()
        .filter(|p| nodes.iter().any(|n| n == node_of(p)))
        .map(name_of)
        .collect()
}

/// The pod carries what the extender sets at bind for `unit` (1-based) of `units`.
fn assert_placed(pod: &Value, policy: &str, unit: usize, units: usize, by: &str) {
    let name = name_of(pod);
    assert_eq!(annotation(pod, UNIT), unit.to_string(), "{name}: {pod}");
    assert_eq!(annotation(pod, POLICY), policy, "{name}: {pod}");
    assert_eq!(annotation(pod, PLACED_BY), by, "{name}: {pod}");
    assert_eq!(
        annotation(pod, DELETION_COST),
        (100 * (units + 1 - unit)).to_string(),
        "{name}: {pod}"
    );
}

/// The `Placed` Event's note on pod `name`, once published.
async fn placed_note(h: &Harness, ns: &str, name: &str) -> Result<String, HarnessError> {
    let note = Mutex::new(String::new());
    h.wait_for(&format!("the Placed Event of {ns}/{name}"), WAIT, |h| {
        let note = &note;
        async move {
            let found = Api::<Event>::namespaced(h.client(), ns)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("Placed")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .and_then(|e| e.note);
            if let Some(found) = found {
                *note.lock().unwrap() = found;
                true
            } else {
                false
            }
        }
    })
    .await?;
    Ok(note.into_inner().unwrap())
}

/// The container groups mock-eci holds for pods of namespace `ns`.
async fn groups_of(h: &Harness, ns: &str) -> Vec<Value> {
    let admin = h.mock_eci().unwrap().admin;
    let groups = mock_admin::groups(&admin).await.unwrap();
    let prefix = format!("{ns}-");
    groups
        .into_iter()
        .filter(|g| {
            g["container_group_name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect()
}

/// Lets every pod of `namespaces` held Terminating by [`HOLD`] go.
async fn release_held(client: &kube::Client, namespaces: &[String]) {
    for ns in namespaces {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for pod in list.items {
            if pod
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == HOLD))
            {
                let _ = release(&api, pod.metadata.name.as_deref().unwrap_or_default()).await;
            }
        }
    }
}

async fn hold(api: &Api<Pod>, name: &str) -> Result<(), HarnessError> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": [HOLD]}})),
    )
    .await?;
    Ok(())
}

async fn release(api: &Api<Pod>, name: &str) -> Result<(), HarnessError> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    Ok(())
}

// ---- a watch on every bind ----

/// What the watch saw of a namespace's pods.
#[derive(Debug, Default)]
struct Seen {
    /// The initial list is in.
    synced: bool,
    /// Pod name → (node, pod-template-hash, terminating or finished) of pods that exist.
    live: BTreeMap<String, (String, String, bool)>,
    /// Every bind, in order: (pod, node).
    binds: Vec<(String, String)>,
    /// Per pod-template-hash, the most pods (not terminating) that the capped nodes held at
    /// once, checked after every event.
    peak: BTreeMap<String, usize>,
    /// The pods behind each peak, for the failure message.
    peak_pods: BTreeMap<String, Vec<String>>,
}

/// Watches a namespace's pods from before a scale-out, so every bind is seen and checked.
struct BindWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BindWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl BindWatch {
    /// Starts watching `ns`; `capped` are the nodes whose per-hash count [`Seen::peak`] tracks.
    async fn start(h: &Harness, ns: &str, capped: &[String]) -> Result<Self, HarnessError> {
        let api: Api<Pod> = Api::namespaced(h.client(), ns);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let capped: BTreeSet<String> = capped.iter().cloned().collect();
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut events = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { continue };
                    let mut seen = seen.lock().unwrap();
                    match event {
                        watcher::Event::Apply(pod) => {
                            seen.apply(&serde_json::to_value(pod).unwrap(), &capped, true);
                        }
                        // Bound before the watch (or during a gap): not a bind seen.
                        watcher::Event::InitApply(pod) => {
                            seen.apply(&serde_json::to_value(pod).unwrap(), &capped, false);
                        }
                        watcher::Event::Delete(pod) => {
                            let name = pod.metadata.name.unwrap_or_default();
                            seen.live.remove(&name);
                        }
                        watcher::Event::Init => {}
                        watcher::Event::InitDone => seen.synced = true,
                    }
                }
            }
        });
        let watch = Self { seen, task };
        h.wait_for("the pod watch to list", WAIT, |_| {
            let seen = watch.seen.clone();
            async move { seen.lock().unwrap().synced }
        })
        .await?;
        Ok(watch)
    }

    fn binds(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().binds.clone()
    }

    fn peak(&self) -> (BTreeMap<String, usize>, BTreeMap<String, Vec<String>>) {
        let seen = self.seen.lock().unwrap();
        (seen.peak.clone(), seen.peak_pods.clone())
    }
}

impl Seen {
    fn apply(&mut self, pod: &Value, capped: &BTreeSet<String>, live_event: bool) {
        let name = name_of(pod);
        let node = node_of(pod).to_owned();
        let gone = terminating(pod)
            || matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
        let was_bound = self.live.get(&name).is_some_and(|(n, _, _)| !n.is_empty());
        if live_event && !node.is_empty() && !was_bound {
            self.binds.push((name.clone(), node.clone()));
        }
        self.live
            .insert(name, (node, hash_of(pod).to_owned(), gone));
        let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (pod, (node, hash, gone)) in &self.live {
            if !gone && capped.contains(node) {
                held.entry(hash.clone()).or_default().push(pod.clone());
            }
        }
        for (hash, pods) in held {
            let peak = self.peak.entry(hash.clone()).or_default();
            if pods.len() > *peak {
                *peak = pods.len();
                self.peak_pods.insert(hash, pods);
            }
        }
    }
}

// ---- the seed's scenarios ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_node_pools_fill_in_order_and_scale_in_in_reverse() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let ns = h.create_namespace("pools").await?;
        let run = h.daemon_set_name();
        let pool_a = add_pool(
            h,
            scene,
            "a",
            2,
            &json!({"e2e-nodepool": format!("{run}-a")}),
        )
        .await?;
        let pool_b = add_pool(
            h,
            scene,
            "b",
            2,
            &json!({"e2e-nodepool": format!("{run}-b")}),
        )
        .await?;
        start_daemon(h, scene, &[]).await?;
        let key = format!("{ns}/nginx");
        create_policy(
            h,
            &ns,
            "nginx",
            json!({
                "selector": {"app": "nginx"},
                "strategy": "prefer",
                "units": [
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-a")}},
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-b")}},
                ],
            }),
        )
        .await?;
        let watch = BindWatch::start(h, &ns, &[]).await?;
        eprintln!("set up after {:?}", started.elapsed());

        // 2 replicas of 2-CPU pods on 2-CPU nodes: both in pool A.
        let step = Instant::now();
        create_deployment(h, &ns, "nginx", 2, pod_spec("2"), None).await?;
        let two = wait_settled(h, &ns, "nginx", 2, None, WAIT).await?;
        eprintln!("2 replicas placed in {:?}", step.elapsed());
        let in_a = on(&two, &pool_a);
        assert_eq!(in_a.len(), 2, "both in pool A: {two:?}");
        for pod in &two {
            assert_placed(pod, &key, 1, 2, "extender");
        }

        // 4: pool A is full, the new two go to pool B.
        let step = Instant::now();
        scale(h, &ns, "nginx", 4).await?;
        let four = wait_settled(h, &ns, "nginx", 4, None, WAIT).await?;
        eprintln!("scaled to 4 in {:?}", step.elapsed());
        assert_eq!(on(&four, &pool_a), in_a, "pool A keeps its pods");
        let in_b = on(&four, &pool_b);
        assert_eq!(in_b.len(), 2, "the other two in pool B: {four:?}");
        let distinct: BTreeSet<&str> = four.iter().map(node_of).collect();
        assert_eq!(distinct.len(), 4, "one 2-CPU pod per 2-CPU node");
        for pod in four.iter().filter(|p| in_b.contains(&name_of(p))) {
            assert_placed(pod, &key, 2, 2, "extender");
            let note = placed_note(h, &ns, &name_of(pod)).await?;
            assert!(
                note.contains("placed in unit 2 (ecs e2e-nodepool=")
                    && note.contains("unit 1 (ecs e2e-nodepool="),
                "the Event says where and why not unit 1: {note}"
            );
        }
        let status = wait_status(h, &ns, "nginx", &[2, 2]).await?;
        assert_eq!(
            status["status"]["observedGeneration"],
            status["metadata"]["generation"]
        );
        wait_placed(h, scene, &key, &[(1, 2.0), (2, 2.0)]).await?;

        // Back to 2: pool B's pods go, pool A's stay.
        let step = Instant::now();
        scale(h, &ns, "nginx", 2).await?;
        let left = wait_settled(h, &ns, "nginx", 2, None, WAIT).await?;
        eprintln!("scaled in to 2 in {:?}", step.elapsed());
        let names: BTreeSet<String> = left.iter().map(name_of).collect();
        assert_eq!(names, in_a, "the pods of pool A remain");
        wait_status(h, &ns, "nginx", &[2, 0]).await?;

        let binds = watch.binds();
        assert_eq!(binds.len(), 4, "each pod bound once: {binds:?}");
        assert!(
            binds
                .iter()
                .all(|(_, node)| pool_a.contains(node) || pool_b.contains(node)),
            "only the policy's nodes: {binds:?}"
        );
        eprintln!("scenario took {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_then_pay_as_you_go_then_eci_and_back() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let ns = h.create_namespace("mixed").await?;
        let run = h.daemon_set_name();
        let subscription = format!("subscription-{run}");
        let payg = format!("pay-as-you-go-{run}");
        let sub_nodes = add_pool(h, scene, "sub", 2, &json!({"paidtype": subscription})).await?;
        let payg_nodes = add_pool(h, scene, "payg", 2, &json!({"paidtype": payg})).await?;
        start_daemon(h, scene, &[]).await?;
        let vnode = vec![h.node_name(0)];
        let key = format!("{ns}/nginx");
        create_policy(
            h,
            &ns,
            "nginx",
            json!({
                "selector": {"app": "nginx"},
                "strategy": "prefer",
                "units": [
                    {"resource": "ecs", "nodeSelector": {"paidtype": subscription}},
                    {"resource": "ecs", "nodeSelector": {"paidtype": payg}},
                    {"resource": "eci"},
                ],
            }),
        )
        .await?;
        let watch = BindWatch::start(h, &ns, &[]).await?;
        eprintln!("set up after {:?}", started.elapsed());
        // Without the webhook the pods tolerate the virtual node's taint themselves.
        let spec = with_vnode_toleration(pod_spec("2"));

        let step = Instant::now();
        create_deployment(h, &ns, "nginx", 2, spec, None).await?;
        let two = wait_settled(h, &ns, "nginx", 2, None, WAIT).await?;
        eprintln!("2 replicas placed in {:?}", step.elapsed());
        let in_sub = on(&two, &sub_nodes);
        assert_eq!(in_sub.len(), 2, "2 → subscription: {two:?}");

        let step = Instant::now();
        scale(h, &ns, "nginx", 4).await?;
        let four = wait_settled(h, &ns, "nginx", 4, None, WAIT).await?;
        eprintln!("scaled to 4 in {:?}", step.elapsed());
        assert_eq!(on(&four, &sub_nodes), in_sub);
        let in_payg = on(&four, &payg_nodes);
        assert_eq!(in_payg.len(), 2, "4 → + pay-as-you-go: {four:?}");

        let step = Instant::now();
        scale(h, &ns, "nginx", 6).await?;
        // Running on ECI: mock-eci's groups, their status through the daemon.
        let six = wait_settled(h, &ns, "nginx", 6, None, WAIT).await?;
        eprintln!("scaled to 6 (2 on ECI, Running) in {:?}", step.elapsed());
        assert_eq!(on(&six, &sub_nodes), in_sub);
        assert_eq!(on(&six, &payg_nodes), in_payg);
        let in_eci = on(&six, &vnode);
        assert_eq!(in_eci.len(), 2, "6 → + ECI: {six:?}");
        for pod in &six {
            let name = name_of(pod);
            let unit = if in_sub.contains(&name) {
                1
            } else if in_payg.contains(&name) {
                2
            } else {
                3
            };
            assert_placed(pod, &key, unit, 3, "extender");
        }
        let eci_pod = in_eci.iter().next().unwrap().clone();
        let note = placed_note(h, &ns, &eci_pod).await?;
        assert!(
            note.contains("placed in unit 3 (eci")
                && note.contains(&format!("unit 1 (ecs paidtype={subscription})"))
                && note.contains(&format!("unit 2 (ecs paidtype={payg})")),
            "{note}"
        );
        assert_eq!(groups_of(h, &ns).await.len(), 2, "a group per ECI pod");
        wait_status(h, &ns, "nginx", &[2, 2, 2]).await?;
        wait_placed(h, scene, &key, &[(1, 2.0), (2, 2.0), (3, 2.0)]).await?;

        // 6 → 4: the ECI pods go, and their groups with them.
        let step = Instant::now();
        scale(h, &ns, "nginx", 4).await?;
        let four = wait_settled(h, &ns, "nginx", 4, None, WAIT).await?;
        let names: BTreeSet<String> = four.iter().map(name_of).collect();
        assert_eq!(
            names,
            in_sub.union(&in_payg).cloned().collect(),
            "the ECI pods went first"
        );
        h.wait_for("mock-eci to hold no group for the pods", WAIT, |h| {
            let ns = ns.clone();
            async move { groups_of(h, &ns).await.is_empty() }
        })
        .await?;
        eprintln!(
            "scaled in to 4 (ECI groups deleted) in {:?}",
            step.elapsed()
        );
        wait_status(h, &ns, "nginx", &[2, 2, 0]).await?;

        // 4 → 2: the pay-as-you-go ones.
        let step = Instant::now();
        scale(h, &ns, "nginx", 2).await?;
        let two = wait_settled(h, &ns, "nginx", 2, None, WAIT).await?;
        eprintln!("scaled in to 2 in {:?}", step.elapsed());
        let names: BTreeSet<String> = two.iter().map(name_of).collect();
        assert_eq!(names, in_sub, "the subscription pods remain");
        wait_status(h, &ns, "nginx", &[2, 0, 0]).await?;
        assert!(groups_of(h, &ns).await.is_empty());

        let binds = watch.binds();
        assert_eq!(binds.len(), 6, "each pod bound once: {binds:?}");
        eprintln!("scenario took {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

// ---- max, per matchLabelKeys group ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_with_max_5_never_holds_more_than_5_per_template_in_a_burst_of_50() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let ns = h.create_namespace("burst").await?;
        let run = h.daemon_set_name();
        let first = add_pool(h, scene, "first", 1, &json!({"e2e-nodepool": format!("{run}-first")})).await?;
        let big = add_pool(h, scene, "big", 1, &json!({"e2e-nodepool": format!("{run}-big")})).await?;
        start_daemon(h, scene, &[]).await?;
        let key = format!("{ns}/burst");
        create_policy(h, &ns, "burst", json!({
            "selector": {"app": "burst"},
            "units": [
                {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-first")}, "max": 5},
                {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-big")}},
            ],
            "matchLabelKeys": [TEMPLATE_HASH],
        }))
        .await?;
        // Small pods: the first unit has room for far more than 5; only `max` holds them back.
        create_deployment(h, &ns, "burst", 0, pod_spec("10m"), None).await?;
        let watch = BindWatch::start(h, &ns, &first).await?;
        eprintln!("set up after {:?}", started.elapsed());

        let step = Instant::now();
        scale(h, &ns, "burst", 50).await?;
        let settled = wait_settled(h, &ns, "burst", 50, None, SLOW).await?;
        eprintln!("0 → 50 placed and running in {:?}", step.elapsed());
        let hash = hash_of(&settled[0]).to_owned();
        assert_eq!(on(&settled, &first).len(), 5, "the first unit filled to its max");
        assert_eq!(on(&settled, &big).len(), 45, "the rest in the next unit");
        let (peak, peak_pods) = watch.peak();
        assert_eq!(peak.get(&hash), Some(&5), "never more than 5 at any bind: {peak_pods:?}");
        let status = wait_status(h, &ns, "burst", &[5, 45]).await?;
        assert_eq!(status["status"]["units"][0]["groups"][format!("{TEMPLATE_HASH}={hash}")], 5, "{status}");

        // A rollout: the new template's pods are a group of their own with their own 5.
        let step = Instant::now();
        roll(h, &ns, "burst", "2").await?;
        h.wait_for("the rollout to give a new template", WAIT, |h| {
            let (ns, hash) = (ns.clone(), hash.clone());
            async move { pods(h, &ns, "burst").await.iter().any(|p| hash_of(p) != hash) }
        })
        .await?;
        let new_hash = pods(h, &ns, "burst")
            .await
            .iter()
            .map(|p| hash_of(p).to_owned())
            .find(|x| *x != hash)
            .unwrap();
        let settled = wait_settled(h, &ns, "burst", 50, Some(&new_hash), SLOW).await?;
        eprintln!("rollout of 50 done in {:?}", step.elapsed());
        assert_eq!(on(&settled, &first).len(), 5, "the new group's own 5 in the first unit");
        assert_eq!(on(&settled, &big).len(), 45);
        let (peak, peak_pods) = watch.peak();
        assert_eq!(peak.get(&hash), Some(&5), "{peak_pods:?}");
        assert_eq!(peak.get(&new_hash), Some(&5), "never more than 5 of the new group: {peak_pods:?}");
        let status = wait_status(h, &ns, "burst", &[5, 45]).await?;
        assert_eq!(status["status"]["units"][0]["groups"][format!("{TEMPLATE_HASH}={new_hash}")], 5, "{status}");
        let binds = watch.binds();
        assert_eq!(binds.len(), 100, "each pod bound once");
        wait_placed(h, scene, &key, &[(1, 10.0), (2, 90.0)]).await?;
        eprintln!("scenario took {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

// ---- whenTryNextUnits ----

/// The pod's `PodScheduled` condition, when False: its message.
fn unschedulable_message(pod: &Value) -> Option<String> {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable"
        })
        .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
}

/// Held back from kube-scheduler until the scenario lets it go.
const GATE: &str = "e2e.virtual-node-eci.aliyun.com/sequenced";

fn gated(pod: &Value) -> bool {
    pod["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| !g.is_empty())
}

async fn ungate(api: &Api<Pod>, name: &str) -> Result<(), HarnessError> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lack_resource_and_no_terminating_keeps_a_rolling_update_in_the_first_unit() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let ns = h.create_namespace("rolling").await?;
        scene.held.push(ns.clone());
        let run = h.daemon_set_name();
        let pool_a = add_pool(
            h,
            scene,
            "a",
            2,
            &json!({"e2e-nodepool": format!("{run}-a")}),
        )
        .await?;
        let pool_b = add_pool(
            h,
            scene,
            "b",
            2,
            &json!({"e2e-nodepool": format!("{run}-b")}),
        )
        .await?;
        start_daemon(h, scene, &[]).await?;
        create_policy(
            h,
            &ns,
            "web",
            json!({
                "selector": {"app": "web"},
                "units": [
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-a")}},
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-b")}},
                ],
                "whenTryNextUnits": {"policy": "LackResourceAndNoTerminating"},
            }),
        )
        .await?;
        // One old pod goes before its replacement comes (maxSurge 0): the replacement finds
        // pool A full while the old pod terminates. The Deployment controller scales the old
        // ReplicaSet down and the new one up in separate syncs, and the two ReplicaSet
        // controllers race: the replacement may reach kube-scheduler before the old pod is
        // marked for deletion (then nothing terminates and moving on is right). So the pods
        // carry a scheduling gate, lifted once the old pod is terminating.
        let strategy =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}});
        let mut spec = pod_spec("2");
        spec["schedulingGates"] = json!([{"name": GATE}]);
        create_deployment(h, &ns, "web", 2, spec, Some(strategy)).await?;
        let api: Api<Pod> = Api::namespaced(h.client(), &ns);
        h.wait_for("the first two pods", WAIT, |h| {
            let ns = ns.clone();
            async move { pods(h, &ns, "web").await.len() == 2 }
        })
        .await?;
        for pod in pods(h, &ns, "web").await {
            ungate(&api, &name_of(&pod)).await?;
        }
        let old = wait_settled(h, &ns, "web", 2, None, WAIT).await?;
        assert_eq!(on(&old, &pool_a).len(), 2, "{old:?}");
        let old_hash = hash_of(&old[0]).to_owned();
        // kwok deletes pods at once; the finalizer keeps them Terminating on their nodes.
        for pod in &old {
            hold(&api, &name_of(pod)).await?;
        }
        let watch = BindWatch::start(h, &ns, &[]).await?;
        eprintln!("set up after {:?}", started.elapsed());

        let step = Instant::now();
        roll(h, &ns, "web", "2").await?;
        for round in 1..=2 {
            let replacement = Mutex::new(String::new());
            h.wait_for(
                &format!("round {round}: an old pod terminating and its replacement created"),
                WAIT,
                |h| {
                    let (ns, old_hash, replacement) = (ns.clone(), old_hash.clone(), &replacement);
                    async move {
                        let pods = pods(h, &ns, "web").await;
                        let old_terminating = pods
                            .iter()
                            .any(|p| hash_of(p) == old_hash && terminating(p));
                        let new = pods.iter().find(|p| hash_of(p) != old_hash && gated(p));
                        match new {
                            Some(pod) if old_terminating => {
                                *replacement.lock().unwrap() = name_of(pod);
                                true
                            }
                            _ => false,
                        }
                    }
                },
            )
            .await?;
            let name = replacement.into_inner().unwrap();
            ungate(&api, &name).await?;
            // Pool A has no room while the old pod holds its node; pool B has, but the policy
            // waits for pool A while pods terminate there.
            let refused = h
                .wait_pod(
                    &ns,
                    &name,
                    "refused while the old pod terminates",
                    WAIT,
                    |p| unschedulable_message(p).is_some() || !node_of(p).is_empty(),
                )
                .await?;
            assert!(
                node_of(&refused).is_empty(),
                "not placed while unit 1 has a terminating pod: {refused}"
            );
            let message = unschedulable_message(&refused).unwrap();
            assert!(
                message.contains("terminating"),
                "refused because pods of unit 1 are terminating: {message}"
            );
            assert!(
                watch.binds().iter().all(|(_, node)| !pool_b.contains(node)),
                "nothing went to pool B: {:?}",
                watch.binds()
            );
            // The old pod goes; the new one takes its place in pool A.
            for old in pods(h, &ns, "web")
                .await
                .iter()
                .filter(|p| hash_of(p) == old_hash && terminating(p))
            {
                release(&api, &name_of(old)).await?;
            }
            let bound = h
                .wait_pod(&ns, &name, "bound", WAIT, |p| !node_of(p).is_empty())
                .await?;
            assert!(
                pool_a.iter().any(|n| n == node_of(&bound)),
                "{name} in pool A: {bound}"
            );
            assert_placed(&bound, &format!("{ns}/web"), 1, 2, "extender");
            eprintln!(
                "round {round}: replacement placed in pool A after {:?}",
                step.elapsed()
            );
        }
        let new = wait_settled(h, &ns, "web", 2, None, WAIT).await?;
        assert!(new.iter().all(|p| hash_of(p) != old_hash), "{new:?}");
        assert_eq!(
            on(&new, &pool_a).len(),
            2,
            "the rollout stayed in pool A: {new:?}"
        );
        let binds = watch.binds();
        assert_eq!(binds.len(), 2, "{binds:?}");
        assert!(
            binds.iter().all(|(_, node)| pool_a.contains(node)),
            "{binds:?}"
        );
        wait_status(h, &ns, "web", &[2, 0]).await?;
        eprintln!("scenario took {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

/// Seconds between two RFC 3339 timestamps of the API (second resolution).
fn seconds_between(from: &Value, to: &Value) -> i64 {
    let parse =
        |v: &Value| -> k8s_openapi::jiff::Timestamp { v.as_str().unwrap().parse().unwrap() };
    parse(to).as_second() - parse(from).as_second()
}

/// When the pod was bound: its `PodScheduled` condition's transition to True.
fn scheduled_at(pod: &Value) -> Value {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled" && c["status"] == "True")
        .map(|c| c["lastTransitionTime"].clone())
        .unwrap_or_default()
}

/// How long after a `TimeoutOrExceedMax` timeout kube-scheduler may take to try a waiting pod
/// again (README): within its back-off (10 s) when no node of the unit passed its own filters,
/// else on an event that may make room, or once it has been unschedulable for 5 minutes
/// (`--pod-max-in-unschedulable-pods-duration`, checked every 30 s).
const TIMEOUT_RETRY: Duration = Duration::from_secs(5 * 60 + 30);

fn bare_pod(name: &str, app: &str, spec: &Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": spec}),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_or_exceed_max_moves_on_after_the_timeout_or_at_once_when_full() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let ns = h.create_namespace("timeout").await?;
        let run = h.daemon_set_name();
        let pool_a = add_pool(
            h,
            scene,
            "a",
            1,
            &json!({"e2e-nodepool": format!("{run}-a")}),
        )
        .await?;
        let pool_b = add_pool(
            h,
            scene,
            "b",
            1,
            &json!({"e2e-nodepool": format!("{run}-b")}),
        )
        .await?;
        // The extender's "pod waits for its unit" lines (debug) show each retry in the dump.
        start_daemon(
            h,
            scene,
            &[("RUST_LOG", "info,virtual_node_eci::placement=debug")],
        )
        .await?;
        let key = format!("{ns}/batch");
        create_policy(h, &ns, "batch", json!({
            "selector": {"app": "batch"},
            "units": [
                {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-a")}, "max": 3},
                {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-b")}},
            ],
            "whenTryNextUnits": {"policy": "TimeoutOrExceedMax", "timeout": "20s"},
        }))
        .await?;
        let api: Api<Pod> = Api::namespaced(h.client(), &ns);
        eprintln!("set up after {:?}", started.elapsed());

        // 1.5 of pool A's 2 CPUs taken.
        api.create(
            &PostParams::default(),
            &bare_pod("first", "batch", &pod_spec("1500m")),
        )
        .await?;
        let first = h
            .wait_pod(&ns, "first", "bound", WAIT, |p| !node_of(p).is_empty())
            .await?;
        assert_eq!(node_of(&first), pool_a[0]);

        // Below max but no room: it waits in unit 1 for the timeout, then goes to unit 2.
        let created = Instant::now();
        api.create(
            &PostParams::default(),
            &bare_pod("waits", "batch", &pod_spec("1500m")),
        )
        .await?;
        let refused = h
            .wait_pod(&ns, "waits", "refused while it waits", WAIT, |p| {
                unschedulable_message(p).is_some() || !node_of(p).is_empty()
            })
            .await?;
        assert!(
            node_of(&refused).is_empty(),
            "not placed before the timeout: {refused}"
        );
        let bound = h
            .wait_pod(&ns, "waits", "bound", TIMEOUT_RETRY + WAIT, |p| {
                !node_of(p).is_empty()
            })
            .await?;
        let waited = created.elapsed();
        eprintln!("the pod below max waited {waited:?} before moving on");
        assert_eq!(node_of(&bound), pool_b[0], "{bound}");
        assert_placed(&bound, &key, 2, 2, "extender");
        let bound_after = seconds_between(
            &bound["metadata"]["creationTimestamp"],
            &scheduled_at(&bound),
        );
        assert!(
            bound_after >= 20,
            "bound {bound_after} s after its creation, not before the 20 s timeout: {bound}"
        );
        assert!(waited >= Duration::from_secs(19), "{waited:?}");
        // At kube-scheduler's first retry after the timeout: nothing makes it retry the pod at
        // the timeout itself (README), so the move comes on its own schedule.
        assert!(
            bound_after <= 20 + i64::try_from(TIMEOUT_RETRY.as_secs()).unwrap(),
            "moved on at the first retry after the 20 s timeout, not {bound_after} s after creation: {bound}"
        );
        let note = placed_note(h, &ns, "waits").await?;
        assert!(
            note.contains("placed in unit 2") && note.contains("timeout"),
            "{note}"
        );

        // Small pods fill unit 1 to its max (3: first, small-1, small-2); the next one moves on
        // at once: a full unit is not waited for.
        for name in ["small-1", "small-2"] {
            api.create(
                &PostParams::default(),
                &bare_pod(name, "batch", &pod_spec("100m")),
            )
            .await?;
            let pod = h
                .wait_pod(&ns, name, "bound", WAIT, |p| !node_of(p).is_empty())
                .await?;
            assert_eq!(node_of(&pod), pool_a[0], "{pod}");
        }
        let created = Instant::now();
        api.create(
            &PostParams::default(),
            &bare_pod("small-3", "batch", &pod_spec("100m")),
        )
        .await?;
        let pod = h
            .wait_pod(&ns, "small-3", "bound", WAIT, |p| !node_of(p).is_empty())
            .await?;
        eprintln!("the pod over max moved on after {:?}", created.elapsed());
        assert_eq!(node_of(&pod), pool_b[0], "{pod}");
        let bound_after =
            seconds_between(&pod["metadata"]["creationTimestamp"], &scheduled_at(&pod));
        assert!(
            bound_after < 15,
            "no wait when unit 1 is at its max: {bound_after} s"
        );
        let note = placed_note(h, &ns, "small-3").await?;
        assert!(
            note.contains("placed in unit 2") && note.contains("full (max 3)"),
            "{note}"
        );
        wait_status(h, &ns, "batch", &[3, 2]).await?;
        eprintln!("scenario took {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

/// Waits until the clock is past the second of `timestamp` (the API's second resolution), so
/// what is created next is later than it.
async fn after_second_of(h: &Harness, timestamp: &Value) -> Result<(), HarnessError> {
    let at: k8s_openapi::jiff::Timestamp = timestamp.as_str().unwrap().parse().unwrap();
    h.wait_for("the next second", Duration::from_secs(5), |_| async move {
        k8s_openapi::jiff::Timestamp::now().as_second() > at.as_second()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_previous_pod_leaves_pods_from_before_the_policy_out_of_the_counts() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let run = h.daemon_set_name();
        let pool_a = add_pool(h, scene, "a", 1, &json!({"e2e-nodepool": format!("{run}-a")})).await?;
        let pool_b = add_pool(h, scene, "b", 1, &json!({"e2e-nodepool": format!("{run}-b")})).await?;
        start_daemon(h, scene, &[]).await?;
        // The same pods and units in two namespaces; only the policy's ignorePreviousPod differs.
        let mut namespaces = Vec::new();
        for ignore in [true, false] {
            let ns = h.create_namespace(if ignore { "ignored" } else { "counted" }).await?;
            let api: Api<Pod> = Api::namespaced(h.client(), &ns);
            // Three pods on pool A before any policy (pinned there by their own selector).
            let mut last = Value::Null;
            for i in 0..3 {
                let mut spec = pod_spec("100m");
                spec["nodeSelector"] = json!({"e2e-nodepool": format!("{run}-a")});
                api.create(&PostParams::default(), &bare_pod(&format!("old-{i}"), "web", &spec)).await?;
                last = h.wait_pod(&ns, &format!("old-{i}"), "bound", WAIT, |p| !node_of(p).is_empty()).await?;
                assert_eq!(node_of(&last), pool_a[0]);
            }
            after_second_of(h, &last["metadata"]["creationTimestamp"]).await?;
            create_policy(h, &ns, "web", json!({
                "selector": {"app": "web"},
                "units": [
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-a")}, "max": 2},
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-b")}},
                ],
                "ignorePreviousPod": ignore,
            }))
            .await?;
            let policy = policy(h, &ns, "web").await.unwrap();
            after_second_of(h, &policy["metadata"]["creationTimestamp"]).await?;
            namespaces.push((ns, ignore));
        }
        eprintln!("set up after {:?}", started.elapsed());

        for (ns, ignore) in &namespaces {
            // The status counts what the policy counts: the earlier three only when not ignored.
            let expected = if *ignore { [0, 0] } else { [3, 0] };
            wait_status(h, ns, "web", &expected).await?;
            let api: Api<Pod> = Api::namespaced(h.client(), ns);
            let mut placed = Vec::new();
            for i in 0..3 {
                let name = format!("new-{i}");
                api.create(&PostParams::default(), &bare_pod(&name, "web", &pod_spec("100m"))).await?;
                let pod = h.wait_pod(ns, &name, "bound", WAIT, |p| !node_of(p).is_empty()).await?;
                placed.push(node_of(&pod).to_owned());
            }
            if *ignore {
                // max 2 counts only the new pods: two in pool A, the third in pool B.
                assert_eq!(placed, [pool_a[0].clone(), pool_a[0].clone(), pool_b[0].clone()], "{ns}");
                wait_status(h, ns, "web", &[2, 1]).await?;
            } else {
                // The three earlier pods already exceed max 2: every new pod goes to pool B.
                assert_eq!(placed, [pool_b[0].clone(), pool_b[0].clone(), pool_b[0].clone()], "{ns}");
                wait_status(h, ns, "web", &[3, 3]).await?;
            }
        }
        eprintln!("scenario took {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

// ---- without the extender ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_extender_down_the_webhook_places_pods_at_admission() {
    with_placement(async |h, scene| {
        let started = Instant::now();
        let ns = h.create_namespace("fallback").await?;
        let run = h.daemon_set_name();
        let pool_a = add_pool(
            h,
            scene,
            "a",
            2,
            &json!({"e2e-nodepool": format!("{run}-a")}),
        )
        .await?;
        let pool_b = add_pool(
            h,
            scene,
            "b",
            2,
            &json!({"e2e-nodepool": format!("{run}-b")}),
        )
        .await?;
        // The product as a user installs it, its replica told not to serve the extender:
        // kube-scheduler is configured with it but nothing answers (it is ignorable).
        let env = vec![("PLACEMENT_EXTENDER".to_owned(), "false".to_owned())];
        // Whatever happens, the installation goes before the next scenario's turn: its webhook
        // would place that scenario's pods, its replica contend for the placement Lease.
        let outcome =
            AssertUnwindSafe(async {
                apply_local_overlay(
                    h.kubectl(),
                    h.kubeconfig(),
                    h.dir(),
                    1,
                    &env,
                    Mock::InCluster(&[]),
                )
                .await?;
                wait_installed(&h.client(), 1, SLOW).await?;
                eprintln!("installed after {:?}", started.elapsed());
                let key = format!("{ns}/nginx");
                create_policy(h, &ns, "nginx", json!({
                "selector": {"app": "nginx"},
                "strategy": "prefer",
                "units": [
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-a")}},
                    {"resource": "ecs", "nodeSelector": {"e2e-nodepool": format!("{run}-b")}},
                ],
            }))
            .await?;
                let step = Instant::now();
                create_deployment(h, &ns, "nginx", 2, pod_spec("2"), None).await?;
                let two = wait_settled(h, &ns, "nginx", 2, None, WAIT).await?;
                eprintln!("2 replicas placed at admission in {:?}", step.elapsed());
                assert_eq!(on(&two, &pool_a).len(), 2, "{two:?}");
                for pod in &two {
                    assert_placed(pod, &key, 1, 2, "admission");
                }
                let step = Instant::now();
                scale(h, &ns, "nginx", 4).await?;
                let four = wait_settled(h, &ns, "nginx", 4, None, WAIT).await?;
                eprintln!("scaled to 4 in {:?}", step.elapsed());
                let in_a = on(&four, &pool_a);
                let in_b = on(&four, &pool_b);
                assert_eq!((in_a.len(), in_b.len()), (2, 2), "{four:?}");
                for pod in &four {
                    let unit = if in_a.contains(&name_of(pod)) { 1 } else { 2 };
                    assert_placed(pod, &key, unit, 2, "admission");
                }
                let in_b_pod = in_b.iter().next().unwrap();
                let note = placed_note(h, &ns, in_b_pod).await?;
                assert!(
                    note.contains("placed in unit 2 (ecs e2e-nodepool=")
                        && note.contains("at admission: PLACEMENT_EXTENDER=false"),
                    "the Event says where, why not unit 1, and that admission chose: {note}"
                );
                wait_status(h, &ns, "nginx", &[2, 2]).await?;
                let step = Instant::now();
                scale(h, &ns, "nginx", 2).await?;
                let two = wait_settled(h, &ns, "nginx", 2, None, WAIT).await?;
                eprintln!("scaled in to 2 in {:?}", step.elapsed());
                assert_eq!(two.iter().map(name_of).collect::<BTreeSet<_>>(), in_a);
                // The daemon says why the order is not enforced at scheduling time.
                let log = h.pod_log("kube-system", "virtual-node-eci-0", "virtual-node-eci");
                assert!(
                    log.lines().any(
                        |l| l.contains("cannot be enforced by the scheduler extender")
                            && l.contains("PLACEMENT_EXTENDER=false")
                    ),
                    "the daemon's log says why the extender does not enforce the order:\n{}",
                    log.lines()
                        .filter(|l| l.contains("extender"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                Ok::<(), HarnessError>(())
            })
            .catch_unwind()
            .await;
        if !matches!(outcome, Ok(Ok(()))) {
            let log = h.pod_log("kube-system", "virtual-node-eci-0", "virtual-node-eci");
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "---- log of virtual-node-eci-0 ----\n{}",
                lines[lines.len().saturating_sub(80)..].join("\n")
            );
        }
        uninstall(h).await;
        match outcome {
            Ok(outcome) => outcome,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
    .await;
}

/// Removes the local overlay's workloads and webhook (not the CRDs and RBAC other scenarios
/// share): deleting the StatefulSet makes its replica drain and remove its node.
async fn uninstall(h: &Harness) {
    let overlay = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/overlays/local");
    let _ = kubectl(
        h,
        &[
            "-n",
            "kube-system",
            "delete",
            "statefulset",
            "virtual-node-eci",
            "--wait=true",
            "--timeout=180s",
        ],
    )
    .await;
    for object in kustomize::kustomize(&overlay) {
        let kind = object["kind"].as_str().unwrap_or_default();
        if matches!(
            kind,
            "CustomResourceDefinition"
                | "ServiceAccount"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "Role"
                | "RoleBinding"
        ) {
            continue;
        }
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("kube-system");
        let _ = kubectl(
            h,
            &[
                "-n",
                namespace,
                "delete",
                kind,
                name,
                "--ignore-not-found",
                "--wait=false",
            ],
        )
        .await;
    }
    for (kind, name) in [
        ("mutatingwebhookconfiguration", "virtual-node-eci"),
        ("secret", "virtual-node-eci-webhook-tls"),
    ] {
        let _ = kubectl(
            h,
            &[
                "-n",
                "kube-system",
                "delete",
                kind,
                name,
                "--ignore-not-found",
            ],
        )
        .await;
    }
    let nodes: Api<Node> = Api::all(h.client());
    let _ = h
        .wait_for("the installed replica's node to go", WAIT, |_| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .get_opt("virtual-node-eci-0")
                    .await
                    .is_ok_and(|n| n.is_none())
            }
        })
        .await;
    let _ = nodes
        .delete("virtual-node-eci-0", &DeleteParams::default())
        .await;
}

// ---- validation ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_policy_is_refused_with_the_field_and_why() {
    let mut h = start_harness().await;
    let result = AssertUnwindSafe(async {
        install_crd(&h).await?;
        let ns = h.create_namespace("invalid").await?;
        let manifest = |name: &str, spec: Value| {
            json!({
                "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
                "kind": "ResourcePolicy",
                "metadata": {"name": name, "namespace": ns},
                "spec": spec,
            })
            .to_string()
        };
        // The seed's manifest, as written for ACK (deploy/examples), is accepted unchanged.
        let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/examples/resourcepolicy-ack.yaml");
        let ack = std::fs::read_to_string(example)
            .unwrap()
            .replace("namespace: default", &format!("namespace: {ns}"));
        let applied = kubectl_with_input(&h, &["apply", "-f", "-"], Some(&ack)).await;
        assert!(applied.ok, "the seed's manifest applies: {}", applied.stderr);

        for (name, spec, field, why) in [
            (
                "acs",
                json!({"units": [{"resource": "acs"}]}),
                "spec.units[0].resource",
                "resource: only 'ecs' and 'eci' units are supported",
            ),
            (
                "soon",
                json!({"units": [{"resource": "ecs"}], "whenTryNextUnits": {"policy": "TimeoutOrExceedMax", "timeout": "soon"}}),
                "spec.whenTryNextUnits.timeout",
                "whenTryNextUnits.timeout: must be a duration such as 30s, 1m or 1h30m",
            ),
        ] {
            let refused = kubectl_with_input(&h, &["apply", "-f", "-"], Some(&manifest(name, spec))).await;
            assert!(!refused.ok, "{name} is refused: {}", refused.stdout);
            assert!(
                refused.stderr.contains("is invalid") && refused.stderr.contains(field) && refused.stderr.contains(why),
                "{name}: the apiserver names {field} and why: {}",
                refused.stderr
            );
            let api: Api<DynamicObject> = Api::namespaced_with(h.client(), &ns, &policy_resource());
            assert!(api.get_opt(name).await?.is_none(), "{name} was not stored");
        }
        Ok::<(), HarnessError>(())
    })
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
