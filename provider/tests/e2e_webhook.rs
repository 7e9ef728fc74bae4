//! End to end: the embedded Selector webhook, called by kube-apiserver itself. The daemon
//! replicas run as pods of the local overlay's StatefulSet (renamed per test) on the fixture's
//! host node, as their ServiceAccount under deploy/'s RBAC; the API server reaches them through
//! their Service's ClusterIP (the host agent's service proxy) and checks their certificate
//! against the caBundle they registered. kube-scheduler places the pods.
//!
//! Only the fixture has the host node: with `E2E_KUBECONFIG` these scenarios stop at the start
//! and say so instead of passing. They run one at a time: a registered webhook sees every
//! namespace's pods and Selectors apply cluster-wide, so two at once would steer each other's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "common/kustomize.rs"]
mod kustomize;

use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use integration::harness::mock_admin;
use integration::harness::{ClusterKind, Harness, HarnessError, MockEciEndpoints};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

/// A condition the cluster reaches by itself (admission, scheduling, a status).
const WAIT: Duration = Duration::from_secs(120);
/// Pods starting, draining or going away on a loaded machine.
const SLOW: Duration = Duration::from_secs(300);
/// Quick groups, whose containers stop within a second of SIGTERM (drains end in seconds).
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
    "--max-grace-period",
    "1s",
];
/// Labels this test's daemon pods, Service and Selectors (and nothing of any other test).
const RUN_LABEL: &str = "virtual-node-eci.aliyun.com/e2e-run";
const CONTAINER: &str = "virtual-node-eci";

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The test's webhook deployment: StatefulSet, Service and MutatingWebhookConfiguration share
/// the test-unique name of the harness's daemon set (so its replicas serve `h.node_name(i)`).
#[derive(Debug)]
struct Webhook {
    name: String,
    secret: String,
    replicas: i32,
    /// Settings of the daemon beyond the test's usual ones.
    env: Vec<(&'static str, &'static str)>,
}

impl Webhook {
    fn new(h: &Harness, replicas: i32) -> Self {
        let name = h.daemon_set_name();
        Self {
            secret: format!("{name}-webhook-tls"),
            name,
            replicas,
            env: Vec::new(),
        }
    }

    /// Replica `ordinal`'s pod, and its node.
    fn pod(&self, ordinal: i32) -> String {
        format!("{}-{ordinal}", self.name)
    }

    fn label_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.name)
    }

    /// What replica `ordinal` logged so far.
    fn log(&self, h: &Harness, ordinal: i32) -> String {
        h.pod_log("kube-system", &self.pod(ordinal), CONTAINER)
    }

    async fn pods(&self, h: &Harness) -> Vec<Pod> {
        Api::<Pod>::namespaced(h.client(), "kube-system")
            .list(&ListParams::default().labels(&self.label_selector()))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }
}

/// Runs `scenario` against `replicas` daemon pods and mock-eci; on failure prints the harness
/// dump and the daemons' logs; always removes what it installed.
async fn with_webhook<F>(replicas: i32, scenario: F)
where
    F: AsyncFnOnce(&mut Harness, &Webhook) -> Result<(), HarnessError>,
{
    with_webhook_env(replicas, &[], scenario).await;
}

/// [`with_webhook`] with `env` added to the daemons' settings.
async fn with_webhook_env<F>(replicas: i32, env: &[(&'static str, &'static str)], scenario: F)
where
    F: AsyncFnOnce(&mut Harness, &Webhook) -> Result<(), HarnessError>,
{
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let mut h = Harness::start().await.expect("the harness starts");
    assert!(
        h.kind() == ClusterKind::Fixture,
        "the webhook scenarios run the daemons on the fixture's host node; unset E2E_KUBECONFIG"
    );
    let started = Instant::now();
    let mut w = Webhook::new(&h, replicas);
    w.env.extend_from_slice(env);
    let result = AssertUnwindSafe(async {
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        deploy(&h, &w, &mock).await?;
        eprintln!(
            "{} replica(s) serving after {:?}",
            replicas,
            started.elapsed()
        );
        scenario(&mut h, &w).await
    })
    .catch_unwind()
    .await;
    if !matches!(result, Ok(Ok(()))) {
        eprintln!("{}", h.dump().await);
        for ordinal in 0..w.replicas {
            eprintln!(
                "---- log of {} ----\n{}",
                w.pod(ordinal),
                tail(&w.log(&h, ordinal), 60)
            );
        }
        let playground =
            std::fs::read_to_string(h.fixture_dir().join("playground.log")).unwrap_or_default();
        eprintln!(
            "---- playground (host agent) ----\n{}",
            tail(&playground, 60)
        );
    }
    eprintln!("scenario done after {:?}", started.elapsed());
    teardown(&h, &w).await;
    let refused = refusals(&h, &w);
    h.shutdown(Duration::from_secs(10)).await;
    eprintln!("scenario and teardown took {:?}", started.elapsed());
    match result {
        Ok(outcome) => outcome.unwrap(),
        Err(panic) => std::panic::resume_unwind(panic),
    }
    assert!(
        refused.is_empty(),
        "deploy/'s RBAC refused the daemon:\n{}",
        refused.join("\n")
    );
}

/// The replicas' log lines (their whole lives, the drains at the end included) about a request
/// the authorizer refused; prints every warning and error on the way.
fn refusals(h: &Harness, w: &Webhook) -> Vec<String> {
    let mut refused = Vec::new();
    for ordinal in 0..w.replicas {
        let log = w.log(h, ordinal);
        let complaints: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        if !complaints.is_empty() {
            eprintln!("{} complained:\n{}", w.pod(ordinal), complaints.join("\n"));
        }
        refused.extend(
            log.lines()
                .filter(|l| l.to_lowercase().contains("forbidden"))
                .map(str::to_owned),
        );
    }
    refused
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The local overlay's StatefulSet, made the test's own: its name, a selector of its own,
/// mock-eci's address instead of the overlay's ConfigMap, webhook objects named after it, and
/// drains short enough for a test.
fn statefulset(w: &Webhook, mock: &MockEciEndpoints) -> StatefulSet {
    let mut set = kustomize::overlay("local")
        .into_iter()
        .find(|o| o["kind"] == "StatefulSet")
        .expect("the local overlay has the daemon's StatefulSet");
    set["metadata"]["name"] = json!(w.name);
    set["metadata"]["labels"][RUN_LABEL] = json!(w.name);
    let spec = &mut set["spec"];
    spec["replicas"] = json!(w.replicas);
    spec["serviceName"] = json!(w.name);
    spec["selector"]["matchLabels"][RUN_LABEL] = json!(w.name);
    let template = &mut spec["template"];
    template["metadata"]["labels"][RUN_LABEL] = json!(w.name);
    template["spec"]["terminationGracePeriodSeconds"] = json!(120);
    let container = &mut template["spec"]["containers"][0];
    assert_eq!(container["name"], CONTAINER);
    container.as_object_mut().unwrap().remove("envFrom");
    let env = container["env"].as_array_mut().unwrap();
    let grpc = format!("grpc://{}", mock.grpc.trim_start_matches("http://"));
    for (name, value) in [
        // mock-eci runs on the host, whose network the host agent's pods share.
        ("ECI_BACKEND", grpc.as_str()),
        // Plain gRPC and ws:// exec streams to the local mock-eci.
        ("ECI_ALLOW_INSECURE_ENDPOINT", "true"),
        ("ECI_CLUSTER_NAME", &format!("e2e-{}", w.name)),
        // The ConfigMap (dropped above) would give them; mock-eci checks them as ECI does.
        ("ECI_VSWITCH", "vsw-e2e"),
        ("ECI_SECURITY_GROUP", "sg-e2e"),
        ("WEBHOOK_SERVICE", &w.name),
        ("WEBHOOK_CONFIGURATION", &w.name),
        ("WEBHOOK_SECRET", &w.secret),
        ("POD_STATUS_POLL_INTERVAL", "250ms"),
        ("DRAIN_TIMEOUT", "60s"),
        ("DRAIN_EVICT_UNMANAGED_PODS", "true"),
        ("LOG_FORMAT", "text"),
        ("RUST_LOG", "info"),
    ]
    .into_iter()
    .chain(w.env.iter().copied())
    {
        env.retain(|v| v["name"] != name);
        env.push(json!({"name": name, "value": value}));
    }
    serde_json::from_value(set).unwrap()
}

/// The Service the webhook is registered by, in front of this test's replicas only.
fn service(w: &Webhook) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": w.name, "namespace": "kube-system", "labels": {RUN_LABEL: w.name}},
        "spec": {
            "selector": {"app.kubernetes.io/name": "virtual-node-eci", RUN_LABEL: w.name},
            "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook"}],
        },
    }))
    .unwrap()
}

fn is_true(conditions: Option<&Value>, kind: &str) -> bool {
    conditions
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// Creates the Service and the StatefulSet and waits for every replica's pod to be Ready, its
/// node Ready and the webhook registered with a caBundle.
async fn deploy(h: &Harness, w: &Webhook, mock: &MockEciEndpoints) -> Result<(), HarnessError> {
    Api::<Service>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &service(w))
        .await?;
    Api::<StatefulSet>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &statefulset(w, mock))
        .await?;
    h.wait_for(
        &format!("{} Ready daemon pod(s) on the host node", w.replicas),
        SLOW,
        |h| async move {
            let pods = w.pods(h).await;
            pods.iter()
                .filter(|p| is_true(view(p).pointer("/status/conditions"), "Ready"))
                .count()
                == usize::try_from(w.replicas).unwrap()
        },
    )
    .await?;
    for ordinal in 0..w.replicas {
        let node = w.pod(ordinal);
        h.wait_for(&format!("node {node} Ready"), WAIT, |h| {
            let node = node.clone();
            async move {
                Api::<Node>::all(h.client())
                    .get_opt(&node)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|n| is_true(view(&n).pointer("/status/conditions"), "Ready"))
            }
        })
        .await?;
    }
    h.wait_for(
        "the webhook registered with a caBundle",
        WAIT,
        |h| async move {
            configuration(h, w)
                .await
                .and_then(|c| c.webhooks)
                .and_then(|w| w.first().and_then(|w| w.client_config.ca_bundle.clone()))
                .is_some()
        },
    )
    .await
}

async fn configuration(h: &Harness, w: &Webhook) -> Option<MutatingWebhookConfiguration> {
    Api::<MutatingWebhookConfiguration>::all(h.client())
        .get_opt(&w.name)
        .await
        .ok()
        .flatten()
}

/// Removes what [`deploy`] and the scenario installed, the product's way first: deleting the
/// StatefulSet makes each replica drain and remove its node. Problems are reported, not raised
/// (the scenario's outcome is what counts), but the next scenario only starts once no replica
/// or node of this one is left.
async fn teardown(h: &Harness, w: &Webhook) {
    let report = |what: &str, result: Result<(), HarnessError>| {
        if let Err(error) = result {
            eprintln!("teardown: {what}: {error}");
        }
    };
    let resource = selector_resource();
    let selectors: Api<DynamicObject> = Api::all_with(h.client(), &resource);
    if let Ok(list) = selectors
        .list(&ListParams::default().labels(&w.label_selector()))
        .await
    {
        for selector in list.items {
            let api: Api<DynamicObject> = Api::namespaced_with(
                h.client(),
                &selector.namespace().unwrap_or_default(),
                &resource,
            );
            let _ = api
                .delete(&selector.name_any(), &DeleteParams::default())
                .await;
        }
    }
    let _ = Api::<StatefulSet>::namespaced(h.client(), "kube-system")
        .delete(&w.name, &DeleteParams::background())
        .await;
    report(
        "the daemon pods to go",
        h.wait_for("the daemon pods to go", SLOW, |h| async move {
            w.pods(h).await.is_empty()
        })
        .await,
    );
    let _ = Api::<MutatingWebhookConfiguration>::all(h.client())
        .delete(&w.name, &DeleteParams::default())
        .await;
    let _ = Api::<Service>::namespaced(h.client(), "kube-system")
        .delete(&w.name, &DeleteParams::default())
        .await;
    let _ = Api::<Secret>::namespaced(h.client(), "kube-system")
        .delete(&w.secret, &DeleteParams::default())
        .await;
    let nodes: Api<Node> = Api::all(h.client());
    let leases: Api<Lease> = Api::namespaced(h.client(), "kube-node-lease");
    for ordinal in 0..w.replicas {
        let node = w.pod(ordinal);
        let removed = h
            .wait_for(&format!("node {node} to be removed"), WAIT, |_| {
                let (nodes, node) = (nodes.clone(), node.clone());
                async move { nodes.get_opt(&node).await.is_ok_and(|n| n.is_none()) }
            })
            .await;
        if removed.is_err() {
            report(&format!("node {node}"), removed);
            eprintln!("---- log of {node} ----\n{}", tail(&w.log(h, ordinal), 40));
            let _ = nodes.delete(&node, &DeleteParams::default()).await;
            let _ = leases.delete(&node, &DeleteParams::default()).await;
        }
    }
}

fn selector_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "eci.aliyun.com",
        "v1beta1",
        "Selector",
    ))
}

async fn create_selector(
    h: &Harness,
    w: &Webhook,
    namespace: &str,
    name: &str,
    spec: Value,
) -> Result<(), HarnessError> {
    let api: Api<DynamicObject> = Api::namespaced_with(h.client(), namespace, &selector_resource());
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "eci.aliyun.com/v1beta1", "kind": "Selector",
        "metadata": {"name": name, "labels": {RUN_LABEL: w.name}}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// A pod with `labels`; `spec` is merged into its spec.
fn mk_pod(name: &str, labels: &Value, spec: &Value) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1"}]},
    });
    for (key, value) in spec.as_object().into_iter().flatten() {
        pod["spec"][key] = value.clone();
    }
    serde_json::from_value(pod).unwrap()
}

fn view<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).unwrap()
}

fn vnode_tolerations(pod: &Value) -> usize {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["key"] == "k8s.aliyun.com/vnode")
        .count()
}

/// Waits until a pod with `labels` is admitted as `admitted` says: dry-run creates go through
/// the whole admission chain (the webhook declares no side effects) and store nothing. Until
/// the daemon's caches have seen a Selector or a namespace label, pods are admitted untouched.
async fn wait_admitted(
    h: &Harness,
    namespace: &str,
    labels: &Value,
    what: &str,
    admitted: impl Fn(&Value) -> bool,
) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe = mk_pod("admission-probe", labels, &json!({}));
    h.wait_for(what, WAIT, |_| {
        let (pods, dry_run, probe, admitted) =
            (pods.clone(), dry_run.clone(), probe.clone(), &admitted);
        async move {
            pods.create(&dry_run, &probe)
                .await
                .is_ok_and(|p| admitted(&view(&p)))
        }
    })
    .await
}

/// Waits until pod `namespace/name` satisfies `condition`; answers it.
async fn wait_pod(
    h: &Harness,
    namespace: &str,
    name: &str,
    what: &str,
    condition: impl Fn(&Value) -> bool,
) -> Result<Value, HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), namespace);
    h.wait_for(&format!("pod {name}: {what}"), WAIT, |_| {
        let (pods, condition) = (pods.clone(), &condition);
        async move { pods.get(name).await.is_ok_and(|p| condition(&view(&p))) }
    })
    .await?;
    Ok(view(&pods.get(name).await?))
}

async fn wait_log(
    h: &Harness,
    w: &Webhook,
    ordinal: i32,
    needle: &str,
) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("{} to log {needle:?}", w.pod(ordinal)),
        WAIT,
        |h| async move { w.log(h, ordinal).contains(needle) },
    )
    .await
}

/// The admission reviews replica `ordinal` answered so far (every result), by its `/metrics`
/// on the read-only port (`METRICS_ADDR` set); 0 until it answers.
async fn admission_reviews(h: &Harness, w: &Webhook, ordinal: i32) -> f64 {
    let log = w.log(h, ordinal);
    let Some(address) = log
        .lines()
        .filter(|l| l.contains("serving /healthz"))
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("address="))
        })
    else {
        return 0.0;
    };
    let text = h
        .daemon_metrics(&format!("http://{address}"))
        .await
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("virtual_node_eci_admission_reviews_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Events about pod `namespace/name` with `reason`.
async fn events(h: &Harness, namespace: &str, name: &str, reason: &str) -> usize {
    Api::<Event>::namespaced(h.client(), namespace)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelled_namespaces_go_to_virtual_nodes_and_fair_effects_land_before_the_group() {
    // The read-only port's /metrics counts the reviews (see `admission_reviews`).
    with_webhook_env(1, &[("METRICS_ADDR", "127.0.0.1:0")], async |h, w| {
        let mock = h.mock_eci().unwrap();
        let node = w.pod(0);

        // A namespace labelled for ECI: its pods get the toleration and the node selector.
        let eci = h.create_namespace("eci").await?;
        Api::<Namespace>::all(h.client())
            .patch(&eci, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"alibabacloud.com/eci": "true"}}})))
            .await?;
        let web_labels = json!({"app": "web"});
        wait_admitted(h, &eci, &web_labels, "the namespace label to steer pods", |p| vnode_tolerations(p) > 0).await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &eci);
        let admitted = view(&pods.create(&PostParams::default(), &mk_pod("web", &web_labels, &json!({}))).await?);
        assert_eq!(vnode_tolerations(&admitted), 1, "{admitted}");
        let toleration = admitted["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["key"] == "k8s.aliyun.com/vnode")
            .unwrap();
        assert_eq!(
            toleration,
            &json!({"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"})
        );
        assert_eq!(admitted["spec"]["nodeSelector"], json!({"k8s.aliyun.com/vnode": "true"}));
        // kube-scheduler can only send it to the virtual node, whose daemon runs it on ECI.
        wait_pod(h, &eci, "web", "scheduled to the virtual node and running", |p| {
            p["spec"]["nodeName"] == node.as_str() && p["status"]["phase"] == "Running"
        })
        .await?;
        // An update replacing the tolerations (kubectl apply or replace of the manifest)
        // passes and keeps the virtual-node toleration: the API server refuses an update that
        // removes one, so the webhook puts it back.
        // An ordinary update (a label) is not sent to the webhook at all: its registration's
        // match condition passes only updates that leave out a virtual-node toleration.
        let reviews_before = admission_reviews(h, w, 0).await;
        assert!(reviews_before > 0.0, "/metrics counts the reviews (the pod's create was one)");
        pods.patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})))
            .await?;
        assert_eq!(admission_reviews(h, w, 0).await, reviews_before, "a label update reached the webhook");
        let mut current = pods.get("web").await?;
        current.spec.as_mut().unwrap().tolerations = Some(vec![
            serde_json::from_value(json!({"key": "team", "operator": "Exists", "effect": "NoSchedule"})).unwrap(),
        ]);
        let replaced = view(&pods.replace("web", &PostParams::default(), &current).await?);
        assert_eq!(vnode_tolerations(&replaced), 1, "{replaced}");
        assert!(admission_reviews(h, w, 0).await > reviews_before, "the replace was not reviewed");
        assert!(
            replaced["spec"]["tolerations"].as_array().unwrap().iter().any(|t| t["key"] == "team"),
            "{replaced}"
        );

        // A fair Selector: the toleration at admission, its effect once bound to a virtual node.
        let plain = h.create_namespace("plain").await?;
        create_selector(h, w, &plain, "test-fair", json!({
            "objectLabels": {"matchLabels": {"app": "nginx"}},
            "effect": {"annotations": {"k8s.aliyun.com/eci-use-specs": "2-4Gi"}, "labels": {"eci-schedulable": "true"}},
            "policy": {"fair": {}},
        }))
        .await?;
        let nginx_labels = json!({"app": "nginx"});
        wait_admitted(h, &plain, &nginx_labels, "the fair Selector to apply", |p| vnode_tolerations(p) == 1).await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &plain);
        // fair leaves the choice to kube-scheduler; this pod's own node selector makes it ours.
        let created = pods
            .create(&PostParams::default(), &mk_pod("nginx", &nginx_labels, &json!({"nodeSelector": {"kubernetes.io/hostname": node}})))
            .await?;
        let created = view(&created);
        assert_eq!(vnode_tolerations(&created), 1, "{created}");
        assert!(created["metadata"]["labels"].get("eci-schedulable").is_none(), "not before binding: {created}");
        assert!(created["spec"].get("nodeName").is_none_or(Value::is_null), "bound by the scheduler");
        h.wait_for("the effect on the pod and the pod running", WAIT, |h| {
            let (plain, node) = (plain.clone(), node.clone());
            async move {
                let pod = Api::<Pod>::namespaced(h.client(), &plain).get("nginx").await.map(|p| view(&p));
                pod.is_ok_and(|p| {
                    p["spec"]["nodeName"] == node.as_str()
                        && p["metadata"]["labels"]["eci-schedulable"] == "true"
                        && p["metadata"]["annotations"].get("virtual-node-eci.aliyun.com/pending-effect").is_none()
                        && p["status"]["phase"] == "Running"
                })
            }
        })
        .await?;
        let groups = mock_admin::groups(&mock.admin).await?;
        let group = groups
            .iter()
            .find(|g| g["container_group_name"] == format!("{plain}-nginx"))
            .unwrap_or_else(|| panic!("no group for nginx in {groups:?}"));
        assert_eq!((group["cpu"].as_f64(), group["memory"].as_f64()), (Some(2.0), Some(4.0)), "the group was created with the effect");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_certificate_and_an_unschedulable_prefer_pod_is_patched_once() {
    with_webhook(2, async |h, w| {
        for ordinal in 0..2 {
            wait_log(h, w, ordinal, "serving the Selector admission webhook").await?;
        }

        // One Secret; both replicas serve a certificate its CA vouches for, for the Service name,
        // at their pod IPs and behind the Service's ClusterIP (the API server's way in).
        let secret = Api::<Secret>::namespaced(h.client(), "kube-system").get(&w.secret).await?;
        let ca = secret.data.unwrap()["ca.crt"].0.clone();
        let generated = (0..2)
            .filter(|o| w.log(h, *o).contains("generated the shared webhook certificate"))
            .count();
        assert_eq!(generated, 1, "exactly one replica generated it");
        let mut addresses = Vec::new();
        for pod in w.pods(h).await {
            let ip: IpAddr = pod.status.and_then(|s| s.pod_ip).unwrap().parse().unwrap();
            addresses.push(SocketAddr::new(ip, 9443));
        }
        assert_eq!(addresses.len(), 2);
        let service = Api::<Service>::namespaced(h.client(), "kube-system").get(&w.name).await?;
        let cluster_ip: IpAddr = service.spec.and_then(|s| s.cluster_ip).unwrap().parse().unwrap();
        addresses.push(SocketAddr::new(cluster_ip, 443));
        let host = format!("{}.kube-system.svc", w.name);
        for address in addresses {
            let client = reqwest::Client::builder()
                .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
                .resolve(&host, address)
                .build()
                .unwrap();
            // The proxy may not have seen the pods Ready yet: it closes connections until then.
            let deadline = Instant::now() + WAIT;
            let answer = loop {
                let sent = client
                    .post(format!("https://{host}:{}/mutate-pods", address.port()))
                    .body("{not json")
                    .send()
                    .await;
                match sent {
                    Ok(answer) => break answer,
                    Err(e) if Instant::now() > deadline => panic!("TLS with the shared CA at {address}: {e:?}"),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            };
            assert_eq!(answer.status(), 400, "a malformed review is refused with a reason");
            assert!(answer.text().await.unwrap().contains("malformed AdmissionReview"));
        }

        let batch = h.create_namespace("batch").await?;
        create_selector(h, w, &batch, "prefer", json!({"objectLabels": {"matchLabels": {"app": "batch"}}, "policy": {"normalNodePrefer": {}}})).await?;
        // Either replica may admit the pod: both must have the Selector.
        for ordinal in 0..2 {
            wait_log(h, w, ordinal, "valid=1").await?;
        }
        let pods: Api<Pod> = Api::namespaced(h.client(), &batch);
        // More CPU than any normal node has (the kwok ECS nodes have 2; the host node is tainted).
        let big = json!({"containers": [{"name": "app", "image": "registry.example.com/app:1", "resources": {"requests": {"cpu": "3"}}}]});
        let created = view(&pods.create(&PostParams::default(), &mk_pod("batch", &json!({"app": "batch"}), &big)).await?);
        assert_eq!(vnode_tolerations(&created), 0, "normal nodes first");
        assert_eq!(
            created["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]["matchExpressions"][0],
            json!({"key": "k8s.aliyun.com/vnode", "operator": "NotIn", "values": ["true"]})
        );
        // kube-scheduler finds it unschedulable; a replica adds the toleration; kube-scheduler
        // then places it on a virtual node.
        let nodes = [w.pod(0), w.pod(1)];
        let placed = wait_pod(h, &batch, "batch", "spilled to a virtual node", |p| {
            vnode_tolerations(p) == 1 && nodes.iter().any(|n| p["spec"]["nodeName"] == n.as_str())
        })
        .await?;
        assert_eq!(vnode_tolerations(&placed), 1);
        // Both replicas saw the same pod; one patch landed, the other hit a conflict. The winner
        // logs, then publishes its Event.
        h.wait_for("the scheduler's verdict, the winning replica's log line and Event", WAIT, |h| {
            let batch = batch.clone();
            async move {
                let spilled = (0..2)
                    .map(|o| w.log(h, o).lines().filter(|l| l.contains("it may now use virtual nodes") && l.contains(&format!("{batch}/batch"))).count())
                    .sum::<usize>();
                spilled == 1
                    && events(h, &batch, "batch", "SpillToVirtualNodes").await == 1
                    && events(h, &batch, "batch", "FailedScheduling").await >= 1
            }
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_webhook_down_pods_are_still_created() {
    with_webhook(1, async |h, w| {
        let namespace = h.create_namespace("down").await?;
        let labels = json!({"alibabacloud.com/eci": "true"});
        wait_admitted(
            h,
            &namespace,
            &labels,
            "the webhook in the admission chain",
            |p| vnode_tolerations(p) == 1,
        )
        .await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &namespace);
        let up = view(
            &pods
                .create(
                    &PostParams::default(),
                    &mk_pod("while-up", &labels, &json!({})),
                )
                .await?,
        );
        assert_eq!(
            vnode_tolerations(&up),
            1,
            "the webhook is in the chain while it runs"
        );

        // Scaled in to zero: the replica drains and removes its node; no pod serves the Service.
        h.scale_daemon_statefulset(0).await?;
        h.wait_for("the daemon pod to go", SLOW, |h| async move {
            w.pods(h).await.is_empty()
        })
        .await?;
        let node = w.pod(0);
        h.wait_for("the scale-in to remove the node", WAIT, |h| {
            let node = node.clone();
            async move {
                Api::<Node>::all(h.client())
                    .get_opt(&node)
                    .await
                    .is_ok_and(|n| n.is_none())
            }
        })
        .await?;
        assert!(
            configuration(h, w).await.is_some(),
            "the webhook stays registered"
        );
        let asked = Instant::now();
        let created = pods
            .create(
                &PostParams::default(),
                &mk_pod("while-down", &labels, &json!({})),
            )
            .await?;
        eprintln!("created with the webhook down in {:?}", asked.elapsed());
        assert_eq!(created.name_any(), "while-down");
        assert_eq!(
            vnode_tolerations(&view(&created)),
            0,
            "created unmutated: failurePolicy Ignore"
        );
        Ok(())
    })
    .await;
}

/// Attack 5 of the tenancy review: a Selector is namespaced, so whoever may create one in their
/// own namespace must not reach pods elsewhere. Only a Selector in the daemon's own namespace
/// (kube-system here) applies to every namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_reaches_only_its_own_namespace_unless_it_lives_in_the_daemons() {
    with_webhook(1, async |h, w| {
        let tenant = h.create_namespace("tenant-a").await?;
        let victim = h.create_namespace("tenant-b").await?;
        let labels = json!({"app": "database-client"});
        let virtual_node_only = json!({
            "objectLabels": {"matchLabels": {"app": "database-client"}},
            "effect": {"labels": {"steered-by": "a-selector"}},
            "policy": {"virtualNodeOnly": {}},
        });
        let steered = |p: &Value| {
            vnode_tolerations(p) == 1 && p["metadata"]["labels"]["steered-by"] == "a-selector"
        };

        create_selector(h, w, &tenant, "steer-everyone", virtual_node_only.clone()).await?;
        // Once the tenant's own pods are steered, the daemon's cache holds the Selector: the
        // other namespace's pod is judged against the same cache.
        wait_admitted(
            h,
            &tenant,
            &labels,
            "the Selector to reach its own namespace",
            steered,
        )
        .await?;
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let probe = mk_pod("admission-probe", &labels, &json!({}));
        let elsewhere = view(
            &Api::<Pod>::namespaced(h.client(), &victim)
                .create(&dry_run, &probe)
                .await?,
        );
        assert!(
            !steered(&elsewhere) && vnode_tolerations(&elsewhere) == 0,
            "a Selector in {tenant} changed a pod in {victim}: {elsewhere}"
        );

        // The same Selector in the daemon's namespace is the administrator's: it reaches all.
        create_selector(
            h,
            w,
            "kube-system",
            &format!("{}-everyone", w.name),
            virtual_node_only,
        )
        .await?;
        wait_admitted(
            h,
            &victim,
            &labels,
            "a kube-system Selector to reach every namespace",
            steered,
        )
        .await?;
        Ok(())
    })
    .await;
}

/// Item 5 of the tenancy review: with `WEBHOOK_CALLERS` the webhook serves the API server only.
/// The fixture's apiserver presents its kubelet client certificate to webhooks of kube-system
/// (its admission configuration), as an operator sets it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_named_callers_only_the_api_server_has_reviews_answered() {
    let callers = [("WEBHOOK_CALLERS", "kube-apiserver-kubelet-client")];
    with_webhook_env(1, &callers, async |h, w| {
        // The API server still gets its answers: a labelled namespace's pods are steered.
        let eci = h.create_namespace("callers").await?;
        Api::<Namespace>::all(h.client())
            .patch(&eci, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"alibabacloud.com/eci": "true"}}})))
            .await?;
        wait_admitted(h, &eci, &json!({"app": "web"}), "the API server's reviews answered", |p| vnode_tolerations(p) == 1).await?;

        // Anyone else who reaches the port directly is refused before the body is read.
        let pod = w.pods(h).await.into_iter().next().expect("the daemon pod");
        let ip = view(&pod)["status"]["podIP"].as_str().unwrap().to_owned();
        let url = format!("https://{ip}:9443/mutate-pods");
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "forged"}});
        let insecure = reqwest::Client::builder().danger_accept_invalid_certs(true).build().unwrap();
        let anonymous = insecure.post(&url).json(&review).send().await.map_err(|e| HarnessError::Setup(e.to_string()))?;
        assert_eq!(anonymous.status(), 401, "no credentials");
        let tenant = h.create_tenant("caller").await?;
        let with_token = insecure
            .post(&url)
            .bearer_auth(tenant.token())
            .json(&review)
            .send()
            .await
            .map_err(|e| HarnessError::Setup(e.to_string()))?;
        let status = with_token.status();
        let body = with_token.text().await.unwrap_or_default();
        assert_eq!(status, 403, "a tenant's token is a known user, not a named caller: {body}");
        assert!(body.contains("may not call this webhook"), "{body}");
        Ok(())
    })
    .await;
}
