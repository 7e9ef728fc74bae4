//! End to end: the embedded Selector webhook through the API stand-in's admission chain (the
//! stand-in calls the daemon's HTTPS endpoint through a loopback Service, as kube-apiserver
//! would through the cluster network).
//!
//! These scenarios need the API server to reach the daemon processes the harness runs on this
//! machine, which a remote cluster cannot do: with `E2E_KUBECONFIG` they stop at the start and
//! say so instead of passing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use integration::harness::{ClusterKind, Harness, HarnessError};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "200ms",
    "--scheduling-delay",
    "50ms",
];

async fn with_harness<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let mut h = Harness::start().await.expect("the harness starts");
    assert!(
        h.kind() == ClusterKind::StandIn,
        "the webhook scenarios need an API server that can reach processes on this machine; unset E2E_KUBECONFIG"
    );
    let result = scenario(&mut h).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    h.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Installs the committed CRD and the webhook Service (loopback clusterIP → `port`).
async fn install(h: &Harness, port: u16) -> Result<(), HarnessError> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/selector-crd.yaml"
    ))
    .unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
    Api::<CustomResourceDefinition>::all(h.client())
        .create(&PostParams::default(), &crd)
        .await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "virtual-node-eci", "namespace": "kube-system"},
        "spec": {"clusterIP": "127.0.0.1", "selector": {"app.kubernetes.io/name": "virtual-node-eci"},
                 "ports": [{"name": "webhook", "port": 443, "targetPort": port}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &service)
        .await?;
    Ok(())
}

fn webhook_env(port: u16) -> Vec<(String, String)> {
    [
        ("WEBHOOK_ENABLED", "true".to_owned()),
        ("WEBHOOK_ADDR", format!("127.0.0.1:{port}")),
        ("POD_STATUS_POLL_INTERVAL", "250ms".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn start(h: &mut Harness, ordinal: u32, port: u16) -> Result<String, HarnessError> {
    let env = webhook_env(port);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.start_daemon(ordinal, &env)
}

async fn wait_registered(h: &Harness) -> Result<(), HarnessError> {
    h.wait_for(
        "the webhook registered with a caBundle",
        WAIT,
        |h| async move {
            Api::<MutatingWebhookConfiguration>::all(h.client())
                .get_opt("virtual-node-eci")
                .await
                .ok()
                .flatten()
                .and_then(|c| c.webhooks)
                .and_then(|w| w.first().and_then(|w| w.client_config.ca_bundle.clone()))
                .is_some()
        },
    )
    .await
}

async fn wait_log(h: &Harness, process: &str, needle: &str) -> Result<(), HarnessError> {
    h.wait_for(
        &format!("{process} to log {needle:?}"),
        WAIT,
        |h| async move {
            h.process_output(process)
                .is_some_and(|o| o.contains(needle))
        },
    )
    .await
}

async fn create_selector(h: &Harness, name: &str, spec: Value) -> Result<(), HarnessError> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "eci.aliyun.com",
        "v1beta1",
        "Selector",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(h.client(), "default", &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "eci.aliyun.com/v1beta1", "kind": "Selector", "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

fn mk_pod(name: &str, labels: &Value, node: Option<&str>) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1"}]},
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    serde_json::from_value(pod).unwrap()
}

fn view(pod: &Pod) -> Value {
    serde_json::to_value(pod).unwrap()
}

fn vnode_tolerations(pod: &Value) -> usize {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["key"] == "k8s.aliyun.com/vnode")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelled_namespaces_go_to_virtual_nodes_and_fair_effects_land_before_the_group() {
    with_harness(async |h| {
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        let port = free_port();
        install(h, port).await?;
        let replica = start(h, 0, port)?;
        let node = h.node_name(0);
        wait_registered(h).await?;

        let namespaces: Api<Namespace> = Api::all(h.client());
        namespaces
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "eci-apps", "labels": {"alibabacloud.com/eci": "true"}}})).unwrap())
            .await?;
        // The namespace cache must have seen it; until then a pod is admitted untouched.
        let pods: Api<Pod> = Api::namespaced(h.client(), "eci-apps");
        let mut attempt = 0;
        let admitted = loop {
            let created = pods.create(&PostParams::default(), &mk_pod(&format!("web-{attempt}"), &json!({"app": "web"}), None)).await?;
            if vnode_tolerations(&view(&created)) > 0 || attempt == 50 {
                break view(&created);
            }
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
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

        // A fair Selector: toleration at admission, its effect once bound to our node.
        create_selector(h, "test-fair", json!({
            "objectLabels": {"matchLabels": {"app": "nginx"}},
            "effect": {"annotations": {"k8s.aliyun.com/eci-use-specs": "2-4Gi"}, "labels": {"eci-schedulable": "true"}},
            "policy": {"fair": {}},
        }))
        .await?;
        wait_log(h, &replica, "valid=1").await?;
        let default_pods: Api<Pod> = Api::namespaced(h.client(), "default");
        let created = default_pods.create(&PostParams::default(), &mk_pod("nginx", &json!({"app": "nginx"}), Some(&node))).await?;
        let created = view(&created);
        assert_eq!(vnode_tolerations(&created), 1);
        assert!(created["metadata"]["labels"].get("eci-schedulable").is_none(), "not before binding");
        h.wait_for("the effect on the pod and the pod running", WAIT, |h| async move {
            let pod = Api::<Pod>::namespaced(h.client(), "default").get("nginx").await.map(|p| view(&p));
            pod.is_ok_and(|p| {
                p["metadata"]["labels"]["eci-schedulable"] == "true"
                    && p["metadata"]["annotations"].get("virtual-node-eci.aliyun.com/pending-effect").is_none()
                    && p["status"]["phase"] == "Running"
            })
        })
        .await?;
        let groups: Vec<Value> = reqwest::get(format!("{}/admin/groups", mock.admin)).await.unwrap().json().await.unwrap();
        let group = groups.iter().find(|g| g["container_group_name"].as_str().unwrap_or_default().contains("nginx")).unwrap();
        assert_eq!((group["cpu"].as_f64(), group["memory"].as_f64()), (Some(2.0), Some(4.0)), "the group was created with the effect");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_certificate_and_an_unschedulable_prefer_pod_is_patched_once() {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        let (port0, port1) = (free_port(), free_port());
        install(h, port0).await?;
        let first = start(h, 0, port0)?;
        let second = start(h, 1, port1)?;
        wait_registered(h).await?;
        wait_log(h, &first, "serving the Selector admission webhook").await?;
        wait_log(h, &second, "serving the Selector admission webhook").await?;

        // One Secret; both replicas serve a certificate its CA vouches for, for the Service name.
        let secret = Api::<Secret>::namespaced(h.client(), "kube-system").get("virtual-node-eci-webhook-tls").await?;
        let ca = secret.data.unwrap()["ca.crt"].0.clone();
        let generated = [&first, &second]
            .iter()
            .filter(|p| h.process_output(p).unwrap().contains("generated the shared webhook certificate"))
            .count();
        assert_eq!(generated, 1, "exactly one replica generated it");
        for port in [port0, port1] {
            let client = reqwest::Client::builder()
                .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
                .resolve("virtual-node-eci.kube-system.svc", std::net::SocketAddr::from(([127, 0, 0, 1], port)))
                .build()
                .unwrap();
            let answer = client
                .post(format!("https://virtual-node-eci.kube-system.svc:{port}/mutate-pods"))
                .body("{not json")
                .send()
                .await
                .expect("TLS with the shared CA");
            assert_eq!(answer.status(), 400, "a malformed review is refused with a reason");
            assert!(answer.text().await.unwrap().contains("malformed AdmissionReview"));
        }

        create_selector(h, "prefer", json!({"objectLabels": {"matchLabels": {"app": "batch"}}, "policy": {"normalNodePrefer": {}}})).await?;
        wait_log(h, &first, "valid=1").await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), "default");
        let created = view(&pods.create(&PostParams::default(), &mk_pod("batch", &json!({"app": "batch"}), None)).await?);
        assert_eq!(vnode_tolerations(&created), 0, "normal nodes first");
        assert_eq!(
            created["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]["matchExpressions"][0],
            json!({"key": "k8s.aliyun.com/vnode", "operator": "NotIn", "values": ["true"]})
        );
        // The scheduler's verdict.
        pods.patch_status(
            "batch",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}})),
        )
        .await?;
        h.wait_for("the toleration patched on", WAIT, |h| async move {
            Api::<Pod>::namespaced(h.client(), "default").get("batch").await.is_ok_and(|p| vnode_tolerations(&view(&p)) == 1)
        })
        .await?;
        // Both replicas saw the same pod; one patch landed, the other hit a conflict.
        // The winner logs, then publishes its Event.
        h.wait_for("the winning replica's log line and Event", WAIT, |h| {
            let (first, second) = (first.clone(), second.clone());
            async move {
                let spilled = |p: &str| h.process_output(p).unwrap_or_default().matches("it may now use virtual nodes").count();
                let events = Api::<Event>::all(h.client()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
                let published = events.iter().filter(|e| e.reason.as_deref() == Some("SpillToVirtualNodes")).count();
                spilled(&first) + spilled(&second) == 1 && published == 1
            }
        })
        .await?;
        let pod = view(&pods.get("batch").await?);
        assert_eq!(vnode_tolerations(&pod), 1);
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_webhook_down_pods_are_still_created() {
    with_harness(async |h| {
        h.start_mock_eci(FAST_MOCK).await?;
        let port = free_port();
        install(h, port).await?;
        let replica = start(h, 0, port)?;
        wait_registered(h).await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), "default");
        let labels = json!({"alibabacloud.com/eci": "true"});
        let up = view(
            &pods
                .create(&PostParams::default(), &mk_pod("while-up", &labels, None))
                .await?,
        );
        assert_eq!(
            vnode_tolerations(&up),
            1,
            "the webhook is in the chain while it runs"
        );
        h.process(&replica)
            .unwrap()
            .terminate(Duration::from_secs(10))
            .await;
        let created = pods
            .create(
                &PostParams::default(),
                &mk_pod("while-down", &json!({"alibabacloud.com/eci": "true"}), None),
            )
            .await?;
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
