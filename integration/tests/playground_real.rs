//! The playground in real-runtime mode (`playground --runtime real`), end to end on its real
//! control plane: a busybox pod runs on `virtual-node-eci-0` with a non-loopback pod IP;
//! `kubectl logs` through the apiserver shows what the container printed; `kubectl exec`
//! through the apiserver runs in the group (its host name); a Service in front of the pod has
//! the pod's address in its EndpointSlice; and when the playground stops, its interface and
//! everything named after mock-eci's prefix are gone.
//!
//! Needs root, runc, iproute2 and Debian's busybox-static, as the real runtime does (.ci/run
//! installs them and runs the tests as root). Without them the test fails saying what is
//! missing: it never passes without having run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const NODE: &str = "virtual-node-eci-0";
/// What the container prints first, so its log is recognisably its own.
const MARKER: &str = "real-runtime-marker-7f3a";

/// Polls `check` every 500 ms until it answers `Some` or `timeout` passes.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `export NAME=value` lines of the playground's env file.
fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("export ")?.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// Runs the playground's kubectl; answers stdout, panicking with stderr when it fails.
async fn kubectl(kubectl: &Path, kubeconfig: &str, args: &[&str]) -> String {
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The names of this machine's interfaces and network namespaces.
fn interfaces_and_namespaces() -> Vec<String> {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut names = integration::local_net::link_names(&run(&["-o", "link", "show"]));
    names.extend(
        run(&["netns", "list"])
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .map(str::to_owned),
    );
    names
}

struct Playground {
    child: tokio::process::Child,
    dir: PathBuf,
}

impl Playground {
    /// Starts it with one virtual node and waits for its env file. Not killed when dropped: the
    /// test holds its stdin, and however the test ends the pipe closes and the playground stops
    /// itself, removing what it made on the machine.
    async fn start(dir: &Path) -> Self {
        let binary = integration::process::binary("integration", "playground").unwrap();
        let log = std::fs::File::create(dir.join("playground.log")).unwrap();
        let child = tokio::process::Command::new(binary)
            .args([
                "--runtime",
                "real",
                "--replicas",
                "1",
                "--ecs-nodes",
                "1",
                "--metrics-server",
                "false",
                "--placement-extender",
                "false",
                "--audit-log",
                "false",
                "--stop-on-stdin-eof",
                "--dir",
            ])
            .arg(dir.join("playground"))
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut playground = Self {
            child,
            dir: dir.to_owned(),
        };
        let env = dir.join("playground/env");
        let deadline = Instant::now() + Duration::from_secs(900);
        while !env.exists() {
            if let Some(status) = playground.child.try_wait().unwrap() {
                panic!("the playground exited ({status}): {}", playground.log());
            }
            assert!(Instant::now() < deadline, "not ready: {}", playground.log());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        playground
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("playground.log")).unwrap_or_default()
    }

    /// Closes its stdin (its signal to stop) and waits for it to exit.
    async fn stop(mut self) -> String {
        drop(self.child.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(180), self.child.wait())
            .await
            .expect("the playground stops within 3 minutes")
            .unwrap();
        assert!(status.success(), "the playground failed: {}", self.log());
        self.log()
    }
}

fn busybox_pod(registry: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "hello", "labels": {"app": "hello"}},
        "spec": {
            "containers": [{
                "name": "app",
                "image": format!("{registry}/library/busybox:1.37"),
                "command": ["sh", "-c",
                    format!("echo {MARKER} from $(hostname); exec httpd -f -p 8080 -h /etc")],
                "ports": [{"containerPort": 8080}],
            }],
        },
    }))
    .unwrap()
}

/// The pod once Running; panics with its status when it fails.
async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(
        &format!("pod {name} Running"),
        Duration::from_secs(180),
        || async {
            let pod = pods.get(name).await.ok()?;
            let phase = pod.status.as_ref()?.phase.clone().unwrap_or_default();
            assert!(phase != "Failed", "pod {name} failed: {:?}", pod.status);
            (phase == "Running" && pod.status.as_ref()?.pod_ip.is_some()).then_some(pod)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_a_virtual_node_runs_and_is_reached_through_the_apiserver() {
    let dir = tempfile::tempdir().unwrap();
    let playground = Playground::start(dir.path()).await;
    let env = read_env(&dir.path().join("playground/env"));
    let kubeconfig = env["KUBECONFIG"].clone();
    let registry = env["REGISTRY"].clone();
    let link = env["PLAYGROUND_LINK"].clone();
    let prefix = env["PLAYGROUND_RUNTIME_PREFIX"].clone();
    let kubectl_path = PathBuf::from(env["PATH"].split(':').next().unwrap()).join("kubectl");
    let config = integration::cluster::config_for(Path::new(&kubeconfig))
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();

    // The node's InternalIP (where the apiserver reaches its kubelet API) is off loopback.
    let node = Api::<Node>::all(client.clone()).get(NODE).await.unwrap();
    let internal: Ipv4Addr = node
        .status
        .unwrap()
        .addresses
        .unwrap()
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .unwrap()
        .address
        .parse()
        .unwrap();
    assert!(!internal.is_loopback(), "node InternalIP {internal}");

    // A namespace the playground's eci-profile sends to virtual nodes (and its registry).
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "real", "labels": {"virtual-node-affinity-injection": "enabled"}},
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "real");
    pods.create(&PostParams::default(), &busybox_pod(&registry))
        .await
        .unwrap();
    let pod = running(&pods, "hello").await;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(NODE));
    let pod_ip: Ipv4Addr = pod.status.unwrap().pod_ip.unwrap().parse().unwrap();
    assert!(
        !pod_ip.is_loopback() && pod_ip.is_private(),
        "pod IP {pod_ip}"
    );

    // kubectl goes through the apiserver, which proxies to the node's kubelet API.
    let logs = eventually(
        "the container's output in kubectl logs",
        Duration::from_secs(60),
        || {
            let (kubectl_path, kubeconfig) = (kubectl_path.clone(), kubeconfig.clone());
            async move {
                let logs =
                    kubectl(&kubectl_path, &kubeconfig, &["-n", "real", "logs", "hello"]).await;
                logs.contains(MARKER).then_some(logs)
            }
        },
    )
    .await;
    assert!(
        logs.contains(&format!("{MARKER} from hello")),
        "logs: {logs}"
    );
    let hostname = kubectl(
        &kubectl_path,
        &kubeconfig,
        &["-n", "real", "exec", "hello", "--", "hostname"],
    )
    .await;
    assert_eq!(hostname.trim(), "hello");
    let etc_hostname = kubectl(
        &kubectl_path,
        &kubeconfig,
        &["-n", "real", "exec", "hello", "--", "cat", "/etc/hostname"],
    )
    .await;
    assert_eq!(etc_hostname.trim(), "hello");

    // A Service selecting the pod: its EndpointSlice has the pod's address.
    let services: Api<Service> = Api::namespaced(client.clone(), "real");
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "hello"},
        "spec": {"selector": {"app": "hello"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "real");
    let listed = ListParams::default().labels("kubernetes.io/service-name=hello");
    eventually(
        "the pod's IP in the Service's EndpointSlice",
        Duration::from_secs(60),
        || {
            let (slices, listed) = (slices.clone(), listed.clone());
            async move {
                let list = slices.list(&listed).await.ok()?;
                list.items
                    .iter()
                    .flat_map(|slice| &slice.endpoints)
                    .any(|endpoint| endpoint.addresses.contains(&pod_ip.to_string()))
                    .then_some(())
            }
        },
    )
    .await;
    // And the address serves: this machine reaches the group on its bridge.
    let served = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{pod_ip}:8080/hostname"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(served.trim(), "hello");

    let before = interfaces_and_namespaces();
    assert!(
        before.contains(&link),
        "the interface {link} exists while running"
    );
    assert!(
        before.iter().any(|name| name.starts_with(&prefix)),
        "mock-eci's bridge and the group's namespace exist while running: {before:?}"
    );
    let log = playground.stop().await;
    let left: Vec<String> = interfaces_and_namespaces()
        .into_iter()
        .filter(|name| *name == link || name.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}\n{log}");
}
