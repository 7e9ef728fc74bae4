//! End to end on the real control plane with metrics-server (built from upstream, scraping
//! every node's kubelet API as its manifests set it up): the figures of pods on a virtual node,
//! from mock-eci's metric calls, reach `kubectl top` and the HPA.
//!
//! - `kubectl top pod` and `kubectl top node` follow the load a test sets in mock-eci — high,
//!   then low — within a few scrape intervals; `/metrics/resource` and `/stats/summary` answer
//!   through the apiserver's node proxy in the kubelet's shapes;
//! - an HPA (autoscaling/v2, CPU utilisation) scales a Deployment running on ECI out while its
//!   pods are busy and back in once they are idle.
//!
//! With `E2E_KUBECONFIG` the cluster must already serve the Metrics API (metrics-server with
//! `--kubelet-use-node-status-port --kubelet-preferred-address-types=InternalIP
//! --kubelet-insecure-tls`, able to reach this machine's 127.0.0.1); the tests say so when it
//! does not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::{Duration, Instant};

use integration::cluster::metrics_server::{API_SERVICE, RESOLUTION, available};
use integration::harness::{ClusterKind, EciApi, FixtureOptions, Harness, HarnessError};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
];
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";
const MIB: u64 = 1024 * 1024;

async fn with_harness<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let mut h = Harness::start_with(FixtureOptions {
        metrics_server: true,
        ..FixtureOptions::default()
    })
    .await
    .expect("the harness starts");
    let result = scenario(&mut h).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
        let log = h.fixture_dir().join("metrics-server.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        eprintln!(
            "---- last lines of {} ----\n{}",
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    h.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}

fn failed(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// How often metrics-server scrapes: the fixture's resolution, else (an existing cluster's
/// metrics-server, whose flags we cannot read) the upstream default.
fn resolution(h: &Harness) -> Duration {
    match h.kind() {
        ClusterKind::Fixture => RESOLUTION,
        ClusterKind::External => Duration::from_secs(60),
    }
}

/// Fails clearly when the cluster has no Metrics API.
async fn require_metrics_api(h: &Harness) -> Result<(), HarnessError> {
    let api_services: Api<APIService> = Api::all(h.client());
    if api_services.get_opt(API_SERVICE).await?.is_none() {
        return Err(failed(match h.kind() {
            ClusterKind::Fixture => format!(
                "the fixture has no APIService {API_SERVICE}: it was started without metrics-server (the first harness of this test binary decides)"
            ),
            ClusterKind::External => format!(
                "metrics-server is not installed in the E2E_KUBECONFIG cluster (no APIService {API_SERVICE}); install it with --kubelet-use-node-status-port --kubelet-preferred-address-types=InternalIP --kubelet-insecure-tls, reaching this machine's 127.0.0.1, to run these tests"
            ),
        }));
    }
    h.wait_for(
        &format!("APIService {API_SERVICE} Available"),
        Duration::from_secs(60),
        |_| {
            let api_services = api_services.clone();
            async move { available(&api_services).await }
        },
    )
    .await
}

/// What a scenario works with.
struct Scene {
    ns: String,
    node: String,
    admin: String,
    /// The daemon's kubelet API, `https://127.0.0.1:PORT`.
    kubelet: String,
}

/// The test's namespace, mock-eci (reached through `api`) and one daemon.
async fn start(h: &mut Harness, suffix: &str, api: EciApi) -> Result<Scene, HarnessError> {
    require_metrics_api(h).await?;
    let ns = h.create_namespace(suffix).await?;
    h.use_eci_api(api);
    let mock = h.start_mock_eci(FAST_MOCK).await?;
    let process = h.start_daemon(0, FAST_DAEMON)?;
    let port = h
        .kubelet_port(&process)
        .ok_or_else(|| failed("the daemon has no kubelet port"))?;
    Ok(Scene {
        ns,
        node: h.node_name(0),
        admin: mock.admin,
        kubelet: format!("https://127.0.0.1:{port}"),
    })
}

/// A pod template kube-scheduler places on `node`: one container `app` asking for one core
/// (so ECI gives its group one core, and 90 % of it is 900m).
fn template(labels: &Value, node: &str) -> Value {
    json!({
        "metadata": {"labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "registry.example.com/app:1",
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
            }],
        },
    })
}

/// Sets the load of every container `app` of groups whose name starts with `prefix` (the
/// daemon names groups `<namespace>-<pod>`), through mock-eci's admin API.
async fn set_load(
    scene: &Scene,
    prefix: &str,
    cores: f64,
    memory: u64,
) -> Result<(), HarnessError> {
    let response = reqwest::Client::new()
        .put(format!("{}/admin/usage", scene.admin))
        .json(&json!({"rules": [{
            "group_name_prefix": prefix,
            "container": "app",
            "cpu": cores,
            "memory_bytes": memory,
        }]}))
        .send()
        .await
        .map_err(|e| failed(format!("mock-eci admin: {e}")))?;
    if response.status() != 200 {
        return Err(failed(format!(
            "setting the load: {} {}",
            response.status(),
            response.text().await.unwrap_or_default()
        )));
    }
    Ok(())
}

/// A token of a new ServiceAccount allowed `get` on `nodes/metrics` and `nodes/stats` of the
/// scene's node (what metrics-server's role grants, for one node).
async fn scraper_token(h: &Harness, scene: &Scene) -> Result<String, HarnessError> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(h.client(), &scene.ns);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "scraper"}})).unwrap(),
        )
        .await?;
    // Cluster-scoped, named after the test's namespace; removed by `forget_scraper`.
    let name = format!("{}-scraper", scene.ns);
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(h.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "rules": [{
                    "apiGroups": [""],
                    "resources": ["nodes/metrics", "nodes/stats"],
                    "resourceNames": [scene.node],
                    "verbs": ["get"],
                }],
            }))
            .unwrap(),
        )
        .await?;
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(h.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": scene.ns}],
            }))
            .unwrap(),
        )
        .await?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .unwrap();
    accounts
        .create_token_request("scraper", &PostParams::default(), &request)
        .await?
        .status
        .map(|status| status.token)
        .ok_or_else(|| failed("TokenRequest without a token"))
}

/// Removes the cluster-scoped grant of [`scraper_token`].
async fn forget_scraper(h: &Harness, ns: &str) {
    let name = format!("{ns}-scraper");
    let params = kube::api::DeleteParams::default();
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(h.client())
        .delete(&name, &params)
        .await;
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(h.client())
        .delete(&name, &params)
        .await;
}

/// A client of the kubelet API that does not check its self-signed certificate (as
/// metrics-server with --kubelet-insecure-tls).
fn kubelet_client() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
}

struct Kubectl {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn kubectl(h: &Harness, args: &[&str]) -> Kubectl {
    let output = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .output()
        .await
        .expect("kubectl runs");
    Kubectl {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `250m` → 250, `2` → 2000.
fn millicores(text: &str) -> Option<u64> {
    match text.strip_suffix('m') {
        Some(milli) => milli.parse().ok(),
        None => text.parse::<u64>().ok().map(|cores| cores * 1000),
    }
}

/// `200Mi` → bytes.
fn bytes(text: &str) -> Option<u64> {
    let units = [("Ki", 1024), ("Mi", MIB), ("Gi", 1024 * MIB)];
    units
        .iter()
        .find_map(|(suffix, factor)| Some(text.strip_suffix(suffix)?.parse::<u64>().ok()? * factor))
        .or_else(|| text.parse().ok())
}

/// What `kubectl top` shows for one row: (millicores, bytes), else what it said.
async fn top(h: &Harness, args: &[&str]) -> Result<(u64, u64), String> {
    let mut all = vec!["top"];
    all.extend_from_slice(args);
    all.push("--no-headers");
    let out = kubectl(h, &all).await;
    if !out.ok {
        return Err(out.stderr);
    }
    let fields: Vec<&str> = out.stdout.split_whitespace().collect();
    // pod: NAME CPU MEMORY; node: NAME CPU CPU% MEMORY MEMORY%.
    let (cpu, memory) = match fields.len() {
        3 => (fields[1], fields[2]),
        5 => (fields[1], fields[3]),
        _ => return Err(out.stdout),
    };
    millicores(cpu)
        .zip(bytes(memory))
        .ok_or_else(|| out.stdout.clone())
}

/// Waits until `kubectl top <args>` shows CPU in `cpu` and memory in `memory`; how long it took.
async fn wait_top(
    h: &Harness,
    args: &[&str],
    cpu: std::ops::RangeInclusive<u64>,
    memory: std::ops::RangeInclusive<u64>,
) -> Result<Duration, HarnessError> {
    let started = Instant::now();
    let what = format!("kubectl top {args:?} showing {cpu:?} millicores and {memory:?} bytes");
    let last = std::sync::Mutex::new(Err(String::new()));
    h.wait_for(&what, WAIT, |h| {
        let (cpu, memory, last) = (cpu.clone(), memory.clone(), &last);
        async move {
            let seen = top(h, args).await;
            let good = seen
                .as_ref()
                .is_ok_and(|(c, m)| cpu.contains(c) && memory.contains(m));
            *last.lock().unwrap() = seen;
            good
        }
    })
    .await
    .map_err(|error| {
        failed(format!(
            "{error}; last seen (millicores, bytes): {:?}",
            last.lock().unwrap()
        ))
    })?;
    Ok(started.elapsed())
}

/// Creates the pod `busy` on the scene's node and waits until it runs with its group recorded.
async fn run_busy_pod(h: &Harness, scene: &Scene) -> Result<(), HarnessError> {
    let labels = json!({"app": "busy"});
    let mut pod = template(&labels, &scene.node);
    pod["metadata"]["name"] = json!("busy");
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
    pods.create(&PostParams::default(), &pod).await?;
    h.wait_for("pod busy running, its group recorded", WAIT, |_| {
        let pods = pods.clone();
        async move {
            pods.get_opt("busy").await.ok().flatten().is_some_and(|p| {
                p.status.and_then(|s| s.phase).as_deref() == Some("Running")
                    && p.metadata
                        .annotations
                        .is_some_and(|a| a.contains_key(INSTANCE_ID))
            })
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_follows_the_load_of_pods_on_eci() {
    with_harness(async |h| {
        let scene = start(h, "top", EciApi::Grpc).await?;
        run_busy_pod(h, &scene).await?;
        let prefix = format!("{}-busy", scene.ns);
        let bound = resolution(h) * 3;

        // High: 800m and 300Mi.
        set_load(&scene, &prefix, 0.8, 300 * MIB).await?;
        let pod_args = ["pod", "busy", "-n", scene.ns.as_str()];
        let took = wait_top(h, &pod_args, 700..=900, 290 * MIB..=310 * MIB).await?;
        eprintln!("kubectl top pod showed the high load after {took:?}");
        assert!(
            took <= bound,
            "{took:?} > {bound:?}: slower than the scrapes"
        );
        // The node is the sum of its pods: this one.
        let node_args = ["node", scene.node.as_str()];
        wait_top(h, &node_args, 700..=900, 290 * MIB..=310 * MIB).await?;

        // The kubelet's endpoints, called directly as a scraper does: a ServiceAccount allowed
        // nodes/metrics and nodes/stats of this node, nothing else. (The apiserver's node
        // proxy refuses loopback node addresses, which every node of this host has.)
        let token = scraper_token(h, &scene).await?;
        let kubelet = kubelet_client();
        let mut answers = Vec::new();
        for path in ["/metrics/resource", "/stats/summary", "/pods"] {
            let response = kubelet
                .get(format!("{}{path}", scene.kubelet))
                .bearer_auth(&token)
                .send()
                .await
                .map_err(|e| failed(format!("GET {path}: {e}")));
            answers.push(match response {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let kind = response
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    Ok((status, kind, response.text().await.unwrap_or_default()))
                }
                Err(error) => Err(error),
            });
        }
        forget_scraper(h, &scene.ns).await;
        let [resource, summary, pods] = <[_; 3]>::try_from(answers).ok().unwrap();
        let (status, kind, text) = resource?;
        assert_eq!(status, 200, "{text}");
        assert_eq!(kind, "text/plain; version=0.0.4; charset=utf-8");
        let series = format!(
            "container_cpu_usage_seconds_total{{container=\"app\",namespace=\"{}\",pod=\"busy\"}} ",
            scene.ns
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        let fields: Vec<&str> = line[series.len()..].split(' ').collect();
        assert!(fields[0].parse::<f64>().unwrap() > 0.0, "{line}");
        let stamp: i64 = fields[1].parse().expect("a millisecond timestamp");
        let age = jiff::Timestamp::now().as_millisecond() - stamp;
        assert!((0..120_000).contains(&age), "the sample's own time: {line}");
        assert!(text.contains("# TYPE node_cpu_usage_seconds_total counter\n"));
        assert!(text.contains("\nresource_scrape_error 0\n"), "{text}");
        // Only what it was granted: the pod list is nodes/pods or nodes/proxy.
        let (status, _, text) = pods?;
        assert_eq!(status, 403, "{text}");
        let (status, _, summary) = summary?;
        assert_eq!(status, 200, "{summary}");
        let summary: Value = serde_json::from_str(&summary).unwrap();
        assert_eq!(summary["node"]["nodeName"], scene.node.as_str());
        let stats = summary["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["podRef"]["name"] == "busy")
            .expect("the pod in the summary");
        assert_eq!(stats["podRef"]["namespace"], scene.ns.as_str());
        assert_eq!(stats["containers"][0]["cpu"]["usageNanoCores"], 800_000_000);
        assert_eq!(
            stats["containers"][0]["memory"]["workingSetBytes"],
            300 * MIB
        );
        assert!(stats["network"]["rxBytes"].is_u64());
        assert!(stats["ephemeral-storage"]["usedBytes"].is_u64());
        assert!(
            summary["node"]["cpu"]["usageCoreNanoSeconds"]
                .as_u64()
                .unwrap()
                > 0
        );

        // Low: 100m and 50Mi — and the figures drop.
        set_load(&scene, &prefix, 0.1, 50 * MIB).await?;
        let took = wait_top(h, &pod_args, 50..=150, 45 * MIB..=55 * MIB).await?;
        eprintln!("kubectl top pod showed the low load after {took:?}");
        assert!(
            took <= bound,
            "{took:?} > {bound:?}: slower than the scrapes"
        );
        wait_top(h, &node_args, 50..=150, 45 * MIB..=55 * MIB).await?;
        Ok(())
    })
    .await;
}

/// The same figures over the Alibaba Cloud OpenAPI backend (mock-eci's signed HTTPS front):
/// the metric call's JSON shape reaches `kubectl top` as the gRPC contract's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_works_over_the_openapi_backend() {
    with_harness(async |h| {
        let scene = start(h, "openapi", EciApi::OpenApi).await?;
        run_busy_pod(h, &scene).await?;
        set_load(&scene, &format!("{}-busy", scene.ns), 0.5, 100 * MIB).await?;
        let pod_args = ["pod", "busy", "-n", scene.ns.as_str()];
        wait_top(h, &pod_args, 400..=600, 95 * MIB..=105 * MIB).await?;
        Ok(())
    })
    .await;
}

/// The Deployment's desired replicas.
async fn replicas(deployments: &Api<Deployment>) -> Option<i32> {
    deployments
        .get_opt("web")
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_scales_a_deployment_on_eci_out_and_back_in() {
    with_harness(async |h| {
        let scene = start(h, "hpa", EciApi::Grpc).await?;
        let labels = json!({"app": "web"});
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": template(&labels, &scene.node),
            },
        }))
        .unwrap();
        let deployments: Api<Deployment> = Api::namespaced(h.client(), &scene.ns);
        deployments
            .create(&PostParams::default(), &deployment)
            .await?;
        // Busy from the start: 900m of the one core each pod asks for, its successors too.
        let prefix = format!("{}-web-", scene.ns);
        set_load(&scene, &prefix, 0.9, 200 * MIB).await?;
        let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1,
                "maxReplicas": 3,
                "metrics": [{
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}},
                }],
                // Scale in as soon as the figures say so (upstream waits 5 minutes).
                "behavior": {"scaleDown": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}],
                }},
            },
        }))
        .unwrap();
        Api::<HorizontalPodAutoscaler>::namespaced(h.client(), &scene.ns)
            .create(&PostParams::default(), &hpa)
            .await?;

        let started = Instant::now();
        h.wait_for("the HPA scaling web out to 3", WAIT * 2, |_| {
            let deployments = deployments.clone();
            async move { replicas(&deployments).await == Some(3) }
        })
        .await?;
        eprintln!("scaled out to 3 after {:?}", started.elapsed());
        // The new pods run on the virtual node, as ECI groups.
        let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
        h.wait_for("3 web pods running on ECI", WAIT, |_| {
            let (pods, node) = (pods.clone(), scene.node.clone());
            async move {
                pods.list(&ListParams::default().labels("app=web"))
                    .await
                    .is_ok_and(|list| {
                        list.items
                            .iter()
                            .filter(|p| {
                                p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                                    == Some(node.as_str())
                                    && p.status.as_ref().and_then(|s| s.phase.as_deref())
                                        == Some("Running")
                                    && p.metadata
                                        .annotations
                                        .as_ref()
                                        .is_some_and(|a| a.contains_key(INSTANCE_ID))
                            })
                            .count()
                            == 3
                    })
            }
        })
        .await?;

        // Idle: 50m each, 5 % — back to one.
        set_load(&scene, &prefix, 0.05, 200 * MIB).await?;
        let started = Instant::now();
        h.wait_for("the HPA scaling web back in to 1", WAIT * 2, |_| {
            let deployments = deployments.clone();
            async move { replicas(&deployments).await == Some(1) }
        })
        .await?;
        eprintln!("scaled back in to 1 after {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

#[test]
fn quantities_as_kubectl_top_prints_them() {
    assert_eq!(millicores("250m"), Some(250));
    assert_eq!(millicores("2"), Some(2000));
    assert_eq!(millicores("x"), None);
    assert_eq!(bytes("200Mi"), Some(200 * MIB));
    assert_eq!(bytes("3Gi"), Some(3 * 1024 * MIB));
    assert_eq!(bytes("12Ki"), Some(12 * 1024));
    assert_eq!(bytes("1000"), Some(1000));
}
