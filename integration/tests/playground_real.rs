//! The playground in real-runtime mode (`playground --runtime real`), end to end on its real
//! control plane: a busybox pod runs on `virtual-node-eci-0` with a non-loopback pod IP;
//! `kubectl logs` through the apiserver shows what the container printed; `kubectl exec`
//! through the apiserver runs in the group (its host name); a Service in front of the pod has
//! the pod's address in its EndpointSlice; and when the playground stops, its interface and
//! everything named after mock-eci's prefix are gone. `kubectl port-forward` reaches an HTTP
//! server listening in a group's network namespace.
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
use tokio::io::{AsyncBufReadExt as _, BufReader};

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

/// A started playground and what tests use of it.
struct Session {
    playground: Playground,
    env: BTreeMap<String, String>,
    kubeconfig: String,
    kubectl: PathBuf,
    client: kube::Client,
}

impl Session {
    async fn start(dir: &Path) -> Self {
        let playground = Playground::start(dir).await;
        let env = read_env(&dir.join("playground/env"));
        let kubeconfig = env["KUBECONFIG"].clone();
        let kubectl = PathBuf::from(env["PATH"].split(':').next().unwrap()).join("kubectl");
        let config = integration::cluster::config_for(Path::new(&kubeconfig))
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        Self {
            playground,
            env,
            kubeconfig,
            kubectl,
            client,
        }
    }

    /// Creates namespace `name`, which the playground's eci-profile sends to virtual nodes (and
    /// their pulls to its registry).
    async fn virtual_namespace(&self, name: &str) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"virtual-node-affinity-injection": "enabled"}},
        }))
        .unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
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

/// The body of `GET url`, sent straight (no proxy), when its status is a success.
async fn fetch(url: &str) -> Result<String, reqwest::Error> {
    reqwest::Client::builder()
        .no_proxy()
        .build()?
        .get(url)
        .timeout(Duration::from_secs(30))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await
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
    let session = Session::start(dir.path()).await;
    let (kubeconfig, kubectl_path) = (session.kubeconfig.clone(), session.kubectl.clone());
    let client = session.client.clone();
    let registry = session.env["REGISTRY"].clone();
    let link = session.env["PLAYGROUND_LINK"].clone();
    let prefix = session.env["PLAYGROUND_RUNTIME_PREFIX"].clone();

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

    session.virtual_namespace("real").await;
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
    let served = fetch(&format!("http://{pod_ip}:8080/hostname"))
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
    let log = session.playground.stop().await;
    let left: Vec<String> = interfaces_and_namespaces()
        .into_iter()
        .filter(|name| *name == link || name.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}\n{log}");
}

/// Runs `kubectl port-forward pod/POD :PORT` (over WebSockets or, when `websockets` is false,
/// SPDY: the two protocols kubectl speaks to the apiserver, which the kubelet API serves apart)
/// and answers the body of `GET path` sent through it, or what failed with what kubectl said.
async fn through_port_forward(
    session: &Session,
    (namespace, pod, port): (&str, &str, u16),
    path: &str,
    websockets: bool,
) -> Result<String, String> {
    let mut forward = tokio::process::Command::new(&session.kubectl)
        .arg("--kubeconfig")
        .arg(&session.kubeconfig)
        .args(["-n", namespace, "port-forward", "--address", "127.0.0.1"])
        .arg(format!("pod/{pod}"))
        .arg(format!(":{port}"))
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // kubectl picks the local port and names it: "Forwarding from 127.0.0.1:41234 -> 80".
    let mut lines = BufReader::new(forward.stdout.take().unwrap()).lines();
    let local = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                return rest.split_whitespace().next()?.parse::<u16>().ok();
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let answer = match local {
        Some(local) => fetch(&format!("http://127.0.0.1:{local}{path}"))
            .await
            .map_err(|error| format!("GET {path}: {error}")),
        None => Err("kubectl named no local port".to_owned()),
    };
    let _ = forward.kill().await;
    let said = forward.wait_with_output().await.unwrap();
    answer.map_err(|error| {
        format!(
            "{error}; kubectl said: {}",
            String::from_utf8_lossy(&said.stderr)
        )
    })
}

/// `kubectl port-forward` reaches the real server in the group's network namespace: busybox
/// `httpd` on port 80 of the group's address (nothing listens there on this machine), a file
/// it serves that names the pod, over both protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_reaches_the_server_in_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let session = Session::start(dir.path()).await;
    session.virtual_namespace("forward").await;
    let registry = session.env["REGISTRY"].clone();
    let serve =
        "mkdir -p /www && echo served by $(hostname) >/www/page.txt && exec httpd -f -p 80 -h /www";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "containers": [{
                "name": "httpd",
                "image": format!("{registry}/library/busybox:1.37"),
                "command": ["sh", "-c", serve],
                "ports": [{"containerPort": 80}],
            }],
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), "forward");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    running(&pods, "web").await;

    for websockets in [true, false] {
        // The server may still be starting when the pod turns Running.
        let deadline = Instant::now() + Duration::from_secs(60);
        let body = loop {
            match through_port_forward(&session, ("forward", "web", 80), "/page.txt", websockets)
                .await
            {
                Ok(body) => break body,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "port-forward (websockets: {websockets}) for 60 s: {error}"
                    );
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        assert_eq!(body.trim(), "served by web", "websockets: {websockets}");
    }
    session.playground.stop().await;
}
