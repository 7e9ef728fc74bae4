//! The host-node agent on the real control plane: the real scheduler puts a Deployment's pod on
//! `host-0`, the agent runs mock-eci as a local process with its own IP, a real
//! ServiceAccount token and the Service reachable through the proxy; deletion, restarts,
//! configuration errors and shutdown behave like a kubelet's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration::cluster::{ControlPlane, ControlPlaneOptions};
use integration::host::{HOST_LABEL, HOST_TAINT_KEY, HostAgent, HostConfig};
use integration::proc_stat::ProcStat;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event as CoreEvent, Namespace, Node, Pod, Secret, Service, ServiceAccount,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "host-0";
const NS: &str = "host-agent-e2e";

/// Polls `check` until it yields a value, failing after `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// Scheduling constraints for the host node.
fn on_host() -> Value {
    json!({
        "nodeSelector": { HOST_LABEL.0: HOST_LABEL.1 },
        "tolerations": [{ "key": HOST_TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule" }],
    })
}

fn mock_eci_deployment() -> Deployment {
    let mut spec = on_host();
    spec["terminationGracePeriodSeconds"] = json!(10);
    spec["containers"] = json!([{
        "name": "mock-eci",
        "image": "virtual-node-eci:latest",
        "command": ["/usr/local/bin/mock-eci"],
        "env": [
            { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
            { "name": "MOCK_ECI_LISTEN", "value": "$(POD_IP):50051" },
            { "name": "MOCK_ECI_ADMIN_LISTEN", "value": "$(POD_IP):8080" },
            { "name": "MOCK_ECI_STATE_FILE", "value": "/var/lib/mock-eci/state.json" },
        ],
        "ports": [
            { "name": "grpc", "containerPort": 50051 },
            { "name": "admin", "containerPort": 8080 },
        ],
        "readinessProbe": { "httpGet": { "path": "/healthz", "port": "admin" }, "periodSeconds": 1 },
        "livenessProbe": { "tcpSocket": { "port": "grpc" }, "periodSeconds": 5 },
        "securityContext": { "runAsUser": 65532, "readOnlyRootFilesystem": true },
        "volumeMounts": [{ "name": "state", "mountPath": "/var/lib/mock-eci" }],
    }]);
    spec["volumes"] = json!([{ "name": "state", "emptyDir": {} }]);
    object(json!({
        "metadata": { "name": "mock-eci" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "mock-eci" } },
            "template": { "metadata": { "labels": { "app": "mock-eci" } }, "spec": spec },
        },
    }))
}

fn pod_dir(root: &Path, pod: &str) -> PathBuf {
    root.join("pods").join(format!("{NS}_{pod}"))
}

fn read_pid(root: &Path, pod: &str, container: &str) -> Option<u32> {
    std::fs::read_to_string(pod_dir(root, pod).join(format!("{container}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| ProcStat::parse(&stat).is_some_and(|s| s.runs()))
}

/// Runs `command` inside the mount namespace of process `pid` (what the container sees).
fn in_container(pid: u32, command: &[&str]) -> String {
    let output = std::process::Command::new("nsenter")
        .args(["--target", &pid.to_string(), "--mount", "--"])
        .args(command)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{command:?} in the container: {output:?}"
    );
    String::from_utf8(output.stdout).unwrap()
}

async fn running_pods(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_agent_runs_pods_like_a_kubelet() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,integration::host=info")
            }),
        )
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let plane_dir = dir.path().join("plane");
    std::fs::create_dir_all(&plane_dir).unwrap();
    let plane = ControlPlane::start(ControlPlaneOptions::new(&plane_dir))
        .await
        .expect("control plane starts");
    let client = plane.client().await.unwrap();

    let mock_eci = integration::process::binary("mock-eci", "mock-eci").unwrap();
    let bin_dir = mock_eci.parent().unwrap().to_owned();
    let host_dir = dir.path().join("host");
    let pod_network = integration::cluster::random_in(1..=99);
    let agent = HostAgent::start(
        client.clone(),
        HostConfig {
            node_name: NODE.into(),
            images: BTreeMap::from([
                ("virtual-node-eci".to_owned(), bin_dir.clone()),
                ("mock-eci".to_owned(), bin_dir.clone()),
            ]),
            dir: host_dir.clone(),
            api_host: "127.0.0.1".into(),
            api_port: plane.api_port(),
            restart_backoff: (Duration::from_secs(1), Duration::from_secs(4)),
            pod_network: integration::host::loopback_pod_network(pod_network),
        },
    )
    .await
    .expect("host agent starts");

    // The node: registered, labelled, tainted, Ready (and kept so by its Lease).
    let nodes: Api<Node> = Api::all(client.clone());
    let node = eventually("host-0 Ready", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get_opt(NODE).await.unwrap()?;
            let ready = node
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(node)
        }
    })
    .await;
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()[HOST_LABEL.0],
        HOST_LABEL.1
    );
    assert!(
        node.spec
            .as_ref()
            .unwrap()
            .taints
            .iter()
            .flatten()
            .any(|t| t.key == HOST_TAINT_KEY && t.effect == "NoSchedule")
    );

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &object(json!({ "metadata": { "name": NS } })),
        )
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    eventually(
        "the default ServiceAccount",
        Duration::from_secs(60),
        || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.unwrap().map(|_| ()) }
        },
    )
    .await;

    // mock-eci as a Deployment, with its Service.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments
        .create(&PostParams::default(), &mock_eci_deployment())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let service = services
        .create(
            &PostParams::default(),
            &object(json!({
                "metadata": { "name": "mock-eci" },
                "spec": {
                    "selector": { "app": "mock-eci" },
                    "ports": [
                        { "name": "grpc", "port": 50051, "targetPort": "grpc" },
                        { "name": "admin", "port": 8080, "targetPort": "admin" },
                    ],
                },
            })),
        )
        .await
        .unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = eventually(
        "a Ready mock-eci pod on host-0",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                running_pods(&pods, "mock-eci")
                    .await
                    .into_iter()
                    .find(|p| condition(p, "Ready").as_deref() == Some("True"))
            }
        },
    )
    .await;
    let pod_name = pod.metadata.name.clone().unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(NODE),
        "the real scheduler chose host-0"
    );
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let pod_ip = status.pod_ip.clone().unwrap();
    assert!(
        pod_ip.starts_with(&format!("127.{pod_network}.")) && pod_ip != "127.0.0.1",
        "own loopback IP: {pod_ip}"
    );
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    for type_ in [
        "PodScheduled",
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
    ] {
        assert_eq!(condition(&pod, type_).as_deref(), Some("True"), "{type_}");
    }
    let container_status = &status.container_statuses.as_ref().unwrap()[0];
    assert!(container_status.ready && container_status.state.as_ref().unwrap().running.is_some());
    let pid = read_pid(&host_dir, &pod_name, "mock-eci").expect("pid file");
    assert!(alive(pid));
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let port_var = format!("KUBERNETES_SERVICE_PORT={}", plane.api_port());
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|var| var == port_var.as_bytes()),
        "the container's environment has {port_var}"
    );
    assert_eq!(
        container_status.container_id.as_deref(),
        Some(format!("host://{pid}").as_str())
    );

    // What the container sees: the ServiceAccount files, a token the API server accepts, the
    // Services in /etc/hosts, the emptyDir.
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(
        in_container(pid, &["cat", &format!("{sa_dir}/namespace")]),
        NS
    );
    assert!(in_container(pid, &["cat", &format!("{sa_dir}/ca.crt")]).contains("BEGIN CERTIFICATE"));
    let token = in_container(pid, &["cat", &format!("{sa_dir}/token")]);
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = reviews
        .create(
            &PostParams::default(),
            &object(json!({ "spec": { "token": token } })),
        )
        .await
        .unwrap();
    let review_status = review.status.unwrap();
    assert_eq!(review_status.authenticated, Some(true), "{review_status:?}");
    let user = review_status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{NS}:default").as_str())
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec![pod_name.clone()]),
        "bound to the pod"
    );
    let hosts = in_container(pid, &["cat", "/etc/hosts"]);
    assert!(
        hosts.contains(&format!(
            "{cluster_ip}\tmock-eci.{NS}.svc\tmock-eci.{NS}.svc.cluster.local\tmock-eci"
        )),
        "{hosts}"
    );
    assert!(hosts.contains(&format!("{pod_ip}\t{pod_name}")), "{hosts}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    assert!(
        mounts.contains(" /var/lib/mock-eci "),
        "the emptyDir is mounted: {mounts}"
    );

    // The Service through the proxy.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{cluster_ip}:8080/healthz");
    let body = eventually("the Service answering", Duration::from_secs(30), || {
        let (http, url) = (http.clone(), url.clone());
        async move { http.get(&url).send().await.ok()?.text().await.ok() }
    })
    .await;
    assert_eq!(body.trim(), "ok");

    // A missing ConfigMap key: CreateContainerConfigError until it appears; a container that
    // exits 3 under restartPolicy Always is restarted with back-off.
    let mut crasher_spec = on_host();
    crasher_spec["terminationGracePeriodSeconds"] = json!(2);
    crasher_spec["containers"] = json!([{
        "name": "crasher",
        "image": "mock-eci",
        "command": ["/bin/sh", "-c", "echo \"value=$VALUE node=$(NODE)\"; exit 3"],
        "env": [
            { "name": "NODE", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
            { "name": "VALUE", "valueFrom": { "configMapKeyRef": { "name": "crasher", "key": "value" } } },
        ],
    }]);
    pods.create(
        &PostParams::default(),
        &object(json!({ "metadata": { "name": "crasher", "labels": { "app": "crasher" } }, "spec": crasher_spec })),
    )
    .await
    .unwrap();
    let waiting = eventually(
        "CreateContainerConfigError",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get("crasher").await.unwrap();
                let waiting = pod
                    .status?
                    .container_statuses?
                    .first()?
                    .state
                    .clone()?
                    .waiting?;
                (waiting.reason.as_deref() == Some("CreateContainerConfigError")).then_some(waiting)
            }
        },
    )
    .await;
    assert!(
        waiting.message.unwrap().contains("crasher"),
        "the message names the ConfigMap"
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    config_maps
        .create(
            &PostParams::default(),
            &object(
                json!({ "metadata": { "name": "crasher" }, "data": { "value": "from-configmap" } }),
            ),
        )
        .await
        .unwrap();
    let crashed = eventually("two restarts", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("crasher").await.unwrap();
            let status = pod.status.clone()?.container_statuses?.first()?.clone();
            (status.restart_count >= 2).then_some((pod, status))
        }
    })
    .await;
    let (crasher, crasher_status) = crashed;
    let last = crasher_status.last_state.unwrap().terminated.unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
    assert_eq!(crasher.status.unwrap().phase.as_deref(), Some("Running"));
    let log = std::fs::read_to_string(pod_dir(&host_dir, "crasher").join("crasher.log")).unwrap();
    assert!(log.contains("value=from-configmap node=host-0"), "{log}");
    eventually("CrashLoopBackOff", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("crasher").await.unwrap();
            let waiting = pod
                .status?
                .container_statuses?
                .first()?
                .state
                .clone()?
                .waiting?;
            (waiting.reason.as_deref() == Some("CrashLoopBackOff")).then_some(())
        }
    })
    .await;

    // Volumes and init containers: an init container writes to an emptyDir, the container
    // reads it and its Secret (items, mode), ConfigMap and downward API volumes, then exits 0
    // under restartPolicy Never: the pod Succeeds.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(
            &PostParams::default(),
            &object(json!({ "metadata": { "name": "demo" }, "stringData": { "user": "alice" } })),
        )
        .await
        .unwrap();
    config_maps
        .create(
            &PostParams::default(),
            &object(
                json!({ "metadata": { "name": "demo" }, "data": { "settings.conf": "mode=fast" } }),
            ),
        )
        .await
        .unwrap();
    let mut volumes_spec = on_host();
    volumes_spec["restartPolicy"] = json!("Never");
    volumes_spec["initContainers"] = json!([{
        "name": "init",
        "image": "mock-eci",
        "command": ["/bin/sh", "-c", "echo from-init > /work/greeting"],
        "volumeMounts": [{ "name": "work", "mountPath": "/work" }],
    }]);
    volumes_spec["containers"] = json!([{
        "name": "main",
        "image": "mock-eci",
        "command": ["/bin/sh", "-c", concat!(
            "cat /work/greeting; echo; cat /etc/secret/user; echo; cat /etc/config/settings.conf; echo; ",
            "cat /etc/podinfo/labels; echo; stat -c mode=%a /etc/secret/user; echo host=$(hostname); ",
            "touch /etc/config/x 2>/dev/null && echo config-writable || echo config-read-only",
        )],
        "volumeMounts": [
            { "name": "work", "mountPath": "/work" },
            { "name": "secret", "mountPath": "/etc/secret" },
            { "name": "config", "mountPath": "/etc/config" },
            { "name": "podinfo", "mountPath": "/etc/podinfo" },
        ],
    }]);
    volumes_spec["volumes"] = json!([
        { "name": "work", "emptyDir": {} },
        { "name": "secret", "secret": { "secretName": "demo", "items": [{ "key": "user", "path": "user", "mode": 256 }] } },
        { "name": "config", "configMap": { "name": "demo" } },
        { "name": "podinfo", "downwardAPI": { "items": [{ "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } }] } },
    ]);
    pods.create(
        &PostParams::default(),
        &object(json!({ "metadata": { "name": "volumes", "labels": { "app": "volumes" } }, "spec": volumes_spec })),
    )
    .await
    .unwrap();
    let done = eventually("the volumes pod Succeeded", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("volumes").await.unwrap();
            let phase = pod.status.as_ref()?.phase.clone()?;
            assert_ne!(phase, "Failed", "{:?}", pod.status);
            (phase == "Succeeded").then_some(pod)
        }
    })
    .await;
    assert_eq!(condition(&done, "Initialized").as_deref(), Some("True"));
    assert_eq!(condition(&done, "Ready").as_deref(), Some("False"));
    let init = &done
        .status
        .as_ref()
        .unwrap()
        .init_container_statuses
        .as_ref()
        .unwrap()[0];
    let init_end = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (init_end.exit_code, init_end.reason.as_deref()),
        (0, Some("Completed"))
    );
    let log = std::fs::read_to_string(pod_dir(&host_dir, "volumes").join("main.log")).unwrap();
    for want in [
        "from-init",
        "alice",
        "mode=fast",
        "app=\"volumes\"",
        "mode=400",
        "host=volumes",
        "config-read-only",
    ] {
        assert!(log.contains(want), "{want:?} in {log}");
    }

    // The kubelet's Events, as `kubectl describe` shows them.
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), NS);
    let reasons = eventually("the crasher's Events", Duration::from_secs(30), || {
        let events = events.clone();
        async move {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=crasher"))
                .await
                .unwrap();
            let reasons: Vec<String> = list.items.into_iter().filter_map(|e| e.reason).collect();
            ["Failed", "Pulled", "Created", "Started", "BackOff"]
                .iter()
                .all(|want| reasons.iter().any(|r| r == want))
                .then_some(reasons)
        }
    })
    .await;
    assert!(!reasons.is_empty());

    // Deletion: the process gets SIGTERM and is gone within the grace period, the pod object
    // disappears, the Deployment's replacement comes up Ready.
    let started = tokio::time::Instant::now();
    pods.delete(&pod_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the mock-eci process ended",
        Duration::from_secs(15),
        || async move { (!alive(pid)).then_some(()) },
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(11),
        "within the grace period (10 s)"
    );
    eventually(
        "the deleted pod gone from the API",
        Duration::from_secs(30),
        || {
            let (pods, name) = (pods.clone(), pod_name.clone());
            async move { pods.get_opt(&name).await.unwrap().is_none().then_some(()) }
        },
    )
    .await;
    let replacement = eventually("a Ready replacement", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            running_pods(&pods, "mock-eci")
                .await
                .into_iter()
                .find(|p| condition(p, "Ready").as_deref() == Some("True"))
        }
    })
    .await;
    let replacement_name = replacement.metadata.name.clone().unwrap();
    assert_ne!(replacement_name, pod_name);
    let replacement_pid = read_pid(&host_dir, &replacement_name, "mock-eci").unwrap();
    let body = eventually(
        "the Service answering from the replacement",
        Duration::from_secs(30),
        || {
            let (http, url) = (http.clone(), url.clone());
            async move { http.get(&url).send().await.ok()?.text().await.ok() }
        },
    )
    .await;
    assert_eq!(body.trim(), "ok");

    // Node shutdown: every container stopped, nothing left behind.
    agent.stop(Duration::from_secs(5)).await;
    assert!(!alive(replacement_pid), "the agent's stop ended mock-eci");
    // Every container process had this control plane's port in its environment.
    let marker = format!("KUBERNETES_SERVICE_PORT={}", plane.api_port());
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| {
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let found = environ
                .split(|b| *b == 0)
                .any(|var| var == marker.as_bytes());
            let pid: u32 = entry.file_name().to_string_lossy().parse().ok()?;
            (found && alive(pid)).then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect();
    assert!(
        left.is_empty(),
        "container processes left running: {left:?}"
    );
    let after = pods.get(&replacement_name).await.unwrap();
    let status = after.status.unwrap();
    assert_eq!(
        status.phase.as_deref(),
        Some("Failed"),
        "terminated by the node shutdown"
    );
    assert_eq!(status.reason.as_deref(), Some("Terminated"));
    plane.stop(Duration::from_secs(5)).await;
}
