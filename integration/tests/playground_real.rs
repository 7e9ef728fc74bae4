//! The playground in real-runtime mode (`playground --runtime real`), end to end on its real
//! control plane: a busybox pod runs on `virtual-node-eci-0` with a non-loopback pod IP;
//! `kubectl logs` through the apiserver shows what the container printed; `kubectl exec`
//! through the apiserver runs in the group (its host name); a Service in front of the pod has
//! the pod's address in its EndpointSlice; and when the playground stops, its interface and
//! everything named after mock-eci's prefix are gone. `kubectl port-forward` reaches an HTTP
//! server listening in a group's network namespace. And a pod sees its own sandbox and only
//! it: env, ConfigMap files and modes, resolv.conf, its own processes and files, another pod
//! at its address, probes and preStop hooks that run in it, `kubectl top` from its cgroups.
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

use integration::proc_stat::ProcStat;
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
    /// Starts it with one virtual node (and metrics-server when `metrics_server`) and waits
    /// for its env file. Not killed when dropped: the test holds its stdin, and however the
    /// test ends the pipe closes and the playground stops itself, removing what it made on the
    /// machine.
    async fn start(dir: &Path, metrics_server: bool) -> Self {
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
                if metrics_server { "true" } else { "false" },
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
        Self::start_with(dir, false).await
    }

    async fn start_with(dir: &Path, metrics_server: bool) -> Self {
        let playground = Playground::start(dir, metrics_server).await;
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

    /// The virtual node's InternalIP, where the apiserver reaches its kubelet API (for logs,
    /// exec, port-forward), once the node reports it.
    async fn node_address(&self) -> Ipv4Addr {
        let nodes = Api::<Node>::all(self.client.clone());
        eventually(
            "the virtual node's InternalIP",
            Duration::from_secs(120),
            || async {
                let node = nodes.get(NODE).await.ok()?;
                let addresses = node.status?.addresses?;
                let internal = addresses.iter().find(|a| a.type_ == "InternalIP")?;
                internal.address.parse().ok()
            },
        )
        .await
    }

    /// Runs the playground's kubectl; answers stdout, panicking with stderr when it fails.
    async fn kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.kubectl, &self.kubeconfig, args).await
    }

    /// Runs the playground's kubectl; answers stdout, or stderr when it fails.
    async fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        let output = tokio::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .await
            .unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// `kubectl exec` of `argv` in `pod`'s `container` in `namespace`: its stdout.
    async fn exec(&self, (namespace, pod, container): (&str, &str, &str), argv: &[&str]) -> String {
        let mut args = vec!["-n", namespace, "exec", pod, "-c", container, "--"];
        args.extend(argv);
        self.kubectl(&args).await
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

/// The pod of the tour, as a user writes it: its image named as on Docker Hub, which the
/// playground's mock-eci pulls from its registry (its Docker Hub mirror).
fn busybox_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "hello", "labels": {"app": "hello"}},
        "spec": {
            "containers": [{
                "name": "app",
                "image": "busybox:1.37",
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
    let link = session.env["PLAYGROUND_LINK"].clone();
    let prefix = session.env["PLAYGROUND_RUNTIME_PREFIX"].clone();

    // The node's InternalIP (where the apiserver reaches its kubelet API) is off loopback.
    let internal = session.node_address().await;
    assert!(!internal.is_loopback(), "node InternalIP {internal}");

    session.virtual_namespace("real").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "real");
    pods.create(&PostParams::default(), &busybox_pod())
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
    // And the address serves: this machine reaches the group on its bridge (httpd is exec'd
    // after the marker line, so its socket may come a moment after the logs).
    let url = format!("http://{pod_ip}:8080/hostname");
    let served = eventually(
        "the pod's server at its IP",
        Duration::from_secs(30),
        || {
            let url = url.clone();
            async move { fetch(&url).await.ok() }
        },
    )
    .await;
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

/// The command of the alpha tenant's app container: a file of its own, a line whose
/// `$(GREETING)` Kubernetes expands (unexpanded, the shell would run a command `GREETING`), then
/// a process `ps` can tell apart.
const ALPHA_APP: &str =
    "echo secret-alpha >/tmp/alpha-file; echo \"arg-$(GREETING)\"; exec sleep 100001";
/// The beta pod: a file of its own, 16 MiB held in a memory-backed emptyDir, an HTTP server on
/// 8080 serving a page that names the pod, a process `ps` can tell apart.
const BETA_APP: &str = "echo secret-beta >/tmp/beta-file; \
    dd if=/dev/zero of=/mem/hold bs=1048576 count=16; mkdir -p /www; \
    echo page of $(hostname) >/www/index.html; httpd -p 8080 -h /www; exec sleep 200002";

/// Namespace alpha's tenant: downward-API env and `$(VAR)` expansion, a ConfigMap volume with
/// file modes, and a preStop hook writing into an emptyDir that a second container watches
/// (and prints).
fn alpha_tenant(registry: &str) -> Pod {
    let image = format!("{registry}/library/busybox:1.37");
    serde_json::from_value(json!({
        "metadata": {"name": "tenant"},
        "spec": {
            "terminationGracePeriodSeconds": 60,
            "volumes": [
                {"name": "config", "configMap": {
                    "name": "settings", "defaultMode": 0o640,
                    "items": [
                        {"key": "plain", "path": "plain.txt"},
                        {"key": "script", "path": "bin/run.sh", "mode": 0o755},
                    ],
                }},
                {"name": "shared", "emptyDir": {}},
            ],
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "command": ["sh", "-c", ALPHA_APP],
                    "env": [
                        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "GREETING", "value": "hello $(MY_NAME)"},
                        {"name": "ESCAPED", "value": "$$(MY_NAME)"},
                    ],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/config"},
                        {"name": "shared", "mountPath": "/shared"},
                    ],
                    "lifecycle": {"preStop": {"exec": {"command":
                        ["sh", "-c", "echo prestop-ran-in-$MY_NAME >/shared/prestop"]}}},
                },
                {
                    "name": "watcher",
                    "image": image,
                    "command": ["sh", "-c",
                        "until [ -f /shared/prestop ]; do sleep 1; done; \
                         echo -n 'watcher saw: '; cat /shared/prestop; exec sleep 100003"],
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                },
            ],
        },
    }))
    .unwrap()
}

/// Namespace beta's pod: `dnsPolicy: Default` with a search domain and an option of its own;
/// idle but for the memory it holds.
fn beta_pod(registry: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "other"},
        "spec": {
            "dnsPolicy": "Default",
            "dnsConfig": {"searches": ["corp.example"], "options": [{"name": "ndots", "value": "2"}]},
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}],
            "containers": [{
                "name": "app",
                "image": format!("{registry}/library/busybox:1.37"),
                "command": ["sh", "-c", BETA_APP],
                "volumeMounts": [{"name": "mem", "mountPath": "/mem"}],
            }],
        },
    }))
    .unwrap()
}

/// A pod whose exec liveness probe passes while /tmp/ok exists, which the container removes
/// after 5 s: only the probe, run in the container, can restart it (it would sleep on).
fn probed_pod(registry: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "sick"},
        "spec": {
            "containers": [{
                "name": "app",
                "image": format!("{registry}/library/busybox:1.37"),
                "command": ["sh", "-c", "touch /tmp/ok; sleep 5; rm /tmp/ok; exec sleep 100004"],
                "livenessProbe": {
                    "exec": {"command": ["cat", "/tmp/ok"]},
                    "initialDelaySeconds": 1, "periodSeconds": 2, "failureThreshold": 1,
                },
            }],
        },
    }))
    .unwrap()
}

/// A pod that fills 128 MiB of a memory-backed emptyDir, then burns a core.
fn burner_pod(registry: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "burner"},
        "spec": {
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}],
            "containers": [{
                "name": "app",
                "image": format!("{registry}/library/busybox:1.37"),
                "command": ["sh", "-c",
                    "dd if=/dev/zero of=/mem/fill bs=1048576 count=128 && while :; do :; done"],
                "resources": {"limits": {"cpu": "1", "memory": "512Mi"}},
                "volumeMounts": [{"name": "mem", "mountPath": "/mem"}],
            }],
        },
    }))
    .unwrap()
}

/// The command lines `ps` lists in a container, without `ps` itself.
async fn processes(session: &Session, at: (&str, &str, &str)) -> Vec<String> {
    session
        .exec(at, &["ps", "-o", "pid,args"])
        .await
        .lines()
        .skip(1)
        .filter_map(|line| Some(line.trim().split_once(' ')?.1.trim().to_owned()))
        .filter(|args| args != "ps -o pid,args")
        .collect()
}

/// Files named `name` anywhere in a container's file system (/proc and /sys aside).
async fn find_files(session: &Session, at: (&str, &str, &str), name: &str) -> Vec<String> {
    let find = format!(
        "find / -path /proc -prune -o -path /sys -prune -o -name {name} -print 2>/dev/null; true"
    );
    session
        .exec(at, &["sh", "-c", &find])
        .await
        .lines()
        .map(str::to_owned)
        .collect()
}

/// This machine's resolvers a group can reach: the IPv4 nameservers of /etc/resolv.conf that
/// are not loopback (a group's loopback is its own).
fn host_nameservers() -> Vec<Ipv4Addr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("nameserver")?.trim().parse().ok())
        .filter(|ip: &Ipv4Addr| !ip.is_loopback())
        .collect()
}

/// `kubectl top pod` figures of a pod: millicores and MiB, once metrics-server has them.
async fn top(session: &Session, namespace: &str, pod: &str) -> Option<(u64, u64)> {
    let out = session
        .try_kubectl(&["-n", namespace, "top", "pod", pod, "--no-headers"])
        .await
        .ok()?;
    let mut words = out.split_whitespace().skip(1);
    let cpu = words.next()?.strip_suffix('m')?.parse().ok()?;
    let memory = words.next()?.strip_suffix("Mi")?.parse().ok()?;
    Some((cpu, memory))
}

/// What kubectl top shows of the container at `at` (millicores, MiB) after three of
/// metrics-server's scrapes, and the least and most millicores its first process was given
/// over any span of at least one scrape interval meanwhile (its utime and stime in /proc,
/// counted in clock ticks of 10 ms, read after every look at kubectl top). The figure is a rate
/// over one such span of its own; on a loaded machine the loop's share swings from one span to
/// the next, so the figure is held to the spans, not to the whole time's average.
async fn top_against_proc(
    session: &Session,
    at: (&str, &str, &str),
) -> (u64, u64, std::ops::RangeInclusive<u64>) {
    let (namespace, pod, _) = at;
    let resolution = integration::cluster::metrics_server::RESOLUTION;
    let mut used = vec![(Instant::now(), cpu_ticks(session, at).await)];
    let mut shown = None;
    while used[0].0.elapsed() < 3 * resolution {
        shown = top(session, namespace, pod).await.or(shown);
        used.push((Instant::now(), cpu_ticks(session, at).await));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (cpu, memory) = shown.unwrap_or_else(|| panic!("{pod} left kubectl top"));
    (cpu, memory, given_over_spans(&used, resolution))
}

/// The least and most millicores given between two of the `(when, ticks)` readings at least
/// `span` apart.
fn given_over_spans(used: &[(Instant, u64)], span: Duration) -> std::ops::RangeInclusive<u64> {
    let mut rates = used.iter().enumerate().flat_map(|(i, (from, before))| {
        used[i + 1..]
            .iter()
            .filter(move |(to, _)| to.duration_since(*from) >= span)
            .map(move |(to, after)| {
                let ticks = after
                    .checked_sub(*before)
                    .expect("the container's first process is the one read before");
                let millis = to.duration_since(*from).as_millis().max(1);
                u64::try_from(u128::from(ticks) * 10_000 / millis).unwrap_or(u64::MAX)
            })
    });
    let first = rates.next().expect("readings a span apart");
    let (least, most) = rates.fold((first, first), |(l, m), r| (l.min(r), m.max(r)));
    least..=most
}

/// The clock ticks (10 ms) of CPU the first process of the container at `at` has used, from
/// its /proc/1/stat.
async fn cpu_ticks(session: &Session, at: (&str, &str, &str)) -> u64 {
    let stat = session.exec(at, &["cat", "/proc/1/stat"]).await;
    ProcStat::parse(&stat)
        .and_then(|s| s.cpu_ticks())
        .unwrap_or_else(|| panic!("/proc/1/stat: {stat}"))
}

/// What a pod sees, through the apiserver on the real-runtime playground: env with the
/// downward API and `$(VAR)` expansion, a ConfigMap volume's files with their modes,
/// /etc/resolv.conf (the machine's resolvers, the pod's dnsConfig merged in), only its own
/// processes and files (two namespaces, each blind to the other), another pod reached at its
/// address; a failing exec liveness probe restarts a container; `kubectl top` figures from
/// the cgroups (a pod burning CPU and holding 128 MiB against an idle one); a preStop hook
/// runs on deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_see_their_own_sandbox_and_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let session = Session::start_with(dir.path(), true).await;
    let registry = session.env["REGISTRY"].clone();
    for namespace in ["alpha", "beta"] {
        session.virtual_namespace(namespace).await;
    }
    let settings: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"},
        "data": {"plain": "plain-value", "script": "#!/bin/sh\necho run\n"},
    }))
    .unwrap();
    Api::namespaced(session.client.clone(), "alpha")
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();
    let alpha: Api<Pod> = Api::namespaced(session.client.clone(), "alpha");
    let beta: Api<Pod> = Api::namespaced(session.client.clone(), "beta");
    for pod in [alpha_tenant(&registry), probed_pod(&registry)] {
        alpha.create(&PostParams::default(), &pod).await.unwrap();
    }
    beta.create(&PostParams::default(), &beta_pod(&registry))
        .await
        .unwrap();
    let tenant = running(&alpha, "tenant").await;
    let other = running(&beta, "other").await;
    let tenant_ip = tenant.status.unwrap().pod_ip.unwrap();
    let other_ip = other.status.unwrap().pod_ip.unwrap();
    let app = ("alpha", "tenant", "app");
    let beta_app = ("beta", "other", "app");
    // kubectl exec goes through the apiserver to the node's address.
    session.node_address().await;

    // Env: the downward API (metadata.name by the daemon, status.podIP by ECI) and `$(VAR)`.
    let env = session.exec(app, &["env"]).await;
    for expected in [
        "MY_NAME=tenant".to_owned(),
        format!("MY_IP={tenant_ip}"),
        "GREETING=hello tenant".to_owned(),
        "ESCAPED=$(MY_NAME)".to_owned(),
    ] {
        assert!(
            env.lines().any(|line| line == expected),
            "{expected} in env:\n{env}"
        );
    }
    let s = &session;
    let logs = eventually(
        "the app's first line",
        Duration::from_secs(60),
        move || async move {
            let logs = s
                .kubectl(&["-n", "alpha", "logs", "tenant", "-c", "app"])
                .await;
            logs.contains("arg-").then_some(logs)
        },
    )
    .await;
    assert_eq!(logs.trim(), "arg-hello tenant", "the command's $(GREETING)");

    // The ConfigMap's files, their contents and modes (items' own, else defaultMode).
    let stat = [
        "stat",
        "-L",
        "-c",
        "%a %n",
        "/config/plain.txt",
        "/config/bin/run.sh",
    ];
    assert_eq!(
        session.exec(app, &stat).await,
        "640 /config/plain.txt\n755 /config/bin/run.sh\n"
    );
    assert_eq!(
        session.exec(app, &["cat", "/config/plain.txt"]).await,
        "plain-value"
    );

    // resolv.conf: this machine's resolvers (no cluster DNS runs here), beta's own search
    // domain and option merged in.
    let nameservers = host_nameservers();
    assert!(
        !nameservers.is_empty(),
        "this machine has no usable resolver to expect"
    );
    let expected: String = nameservers
        .iter()
        .map(|ip| format!("nameserver {ip}\n"))
        .collect();
    let resolv = session.exec(app, &["cat", "/etc/resolv.conf"]).await;
    assert_eq!(resolv, expected, "alpha's resolv.conf");
    let resolv = session.exec(beta_app, &["cat", "/etc/resolv.conf"]).await;
    assert!(
        resolv.starts_with(&expected)
            && resolv.lines().any(|l| l.starts_with("search corp.example"))
            && resolv.lines().any(|l| l == "options ndots:2"),
        "beta's resolv.conf:\n{resolv}"
    );

    // Processes: each container lists its own only (the watcher of the same pod is apart too).
    let alpha_seen = processes(&session, app).await;
    assert_eq!(alpha_seen, ["sleep 100001"], "alpha's app sees");
    let beta_seen = processes(&session, beta_app).await;
    assert!(
        beta_seen.contains(&"sleep 200002".to_owned())
            && beta_seen
                .iter()
                .all(|p| p == "sleep 200002" || p.starts_with("httpd")),
        "beta sees: {beta_seen:?}"
    );
    // Files: each finds its own, not the other's.
    assert_eq!(
        find_files(&session, app, "alpha-file").await,
        ["/tmp/alpha-file"]
    );
    assert_eq!(
        find_files(&session, beta_app, "beta-file").await,
        ["/tmp/beta-file"]
    );
    assert_eq!(
        find_files(&session, app, "beta-file").await,
        Vec::<String>::new()
    );
    assert_eq!(
        find_files(&session, beta_app, "alpha-file").await,
        Vec::<String>::new()
    );

    // One pod reaches another at its address (the server may still be starting).
    let url = format!("http://{other_ip}:8080/index.html");
    let url = &url;
    let page = eventually(
        "alpha fetches beta's page",
        Duration::from_secs(60),
        move || async move {
            let wget = [
                "-n", "alpha", "exec", "tenant", "-c", "app", "--", "timeout", "10", "wget", "-q",
                "-O", "-", url,
            ];
            s.try_kubectl(&wget).await.ok()
        },
    )
    .await;
    assert_eq!(page.trim(), "page of other");

    // A failing exec liveness probe restarts the container.
    let pods = &alpha;
    let restarted = eventually(
        "sick restarted by its probe",
        Duration::from_secs(180),
        move || async move {
            let pod = pods.get("sick").await.ok()?;
            let status = pod.status?.container_statuses?.into_iter().next()?;
            (status.restart_count >= 1).then_some(status)
        },
    )
    .await;
    assert!(
        restarted.last_state.and_then(|s| s.terminated).is_some(),
        "the restarted container's last state is terminated"
    );

    // kubectl top: 128 MiB and the CPU the burner's loop was given, against an idle pod holding
    // 16 MiB, as the cgroups count them (simulated figures are shares of the pods' sizes:
    // hundreds of MiB and millicores whatever the pod does). On a loaded machine the loop gets
    // less than its core, so its CPU is judged against what its own process was given over
    // spans as long as the figure's own, as /proc counts it.
    alpha
        .create(&PostParams::default(), &burner_pod(&registry))
        .await
        .unwrap();
    running(&alpha, "burner").await;
    let burner = ("alpha", "burner", "app");
    // Polled by hand to say, on a time-out, what kubectl top last showed.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let seen = top(s, "alpha", "burner").await;
        if seen.is_some_and(|(_, memory)| memory >= 120) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 128 MiB for burner in kubectl top after 300 s; last (m, Mi): {seen:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (cpu, memory, given) = top_against_proc(s, burner).await;
    eprintln!("kubectl top: burner {cpu}m {memory}Mi (its loop was given {given:?}m)");
    let (least, most) = (*given.start(), *given.end());
    assert!(
        memory >= 120 && cpu + least / 3 + 50 >= least && cpu <= most + most / 3 + 50,
        "burner: kubectl top shows {cpu}m {memory}Mi; its loop was given {given:?}m over spans of a scrape interval"
    );
    let (idle_cpu, idle_memory) = eventually(
        "other in kubectl top",
        Duration::from_secs(120),
        move || top(s, "beta", "other"),
    )
    .await;
    eprintln!("kubectl top: idle {idle_cpu}m {idle_memory}Mi");
    assert!(
        idle_cpu <= 50 && (14..=40).contains(&idle_memory),
        "idle: {idle_cpu}m {idle_memory}Mi"
    );
    alpha.delete("burner", &Default::default()).await.unwrap();

    // preStop: on deletion the hook writes into the emptyDir, the watcher prints it.
    alpha.delete("tenant", &Default::default()).await.unwrap();
    let seen = eventually(
        "the watcher prints what preStop wrote",
        Duration::from_secs(60),
        move || async move {
            let logs = s
                .try_kubectl(&["-n", "alpha", "logs", "tenant", "-c", "watcher"])
                .await
                .ok()?;
            logs.contains("watcher saw").then_some(logs)
        },
    )
    .await;
    assert_eq!(seen.trim(), "watcher saw: prestop-ran-in-tenant");
    session.playground.stop().await;
}
