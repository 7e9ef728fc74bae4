//! The host-node agent: a small kubelet that registers an ordinary Node and runs the containers
//! of the pods bound to it as local processes (own loopback IP, own mount namespace), plus a
//! userspace service proxy and per-pod `/etc/hosts`, so real controllers run real replicas.
//! It calls only the Kubernetes API (the client it is given) and local commands (`setpriv`,
//! `unshare`, `mount`, `kill`, `nsenter`); it needs root.
//!
//! What is ignored, never failed on: `runAsUser`/`runAsGroup`/`fsGroup`/`runAsNonRoot`,
//! `readOnlyRootFilesystem`, capabilities, seccomp, resource limits (nothing is enforced); the
//! network is the host's (a process binding `0.0.0.0:<port>` takes that port on every pod IP,
//! so manifests meant to run twice on one host bind `$(POD_IP)`).

mod container;
mod env;
mod ipam;
mod node;
mod pods;
mod probe;
mod process;
mod proxy;
mod status;
mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument as _, info, info_span, warn};

pub use env::EnvError;
pub use ipam::IpamError;
pub use node::NodeError;
pub use pods::PodError;
pub use probe::ProbeError;
pub use process::ProcessError;
pub use proxy::ProxyError;
pub use volumes::VolumeError;

/// Node label the agent puts on its Node.
pub const HOST_LABEL: (&str, &str) = ("virtual-node-eci.aliyun.com/host-agent", "true");
/// Key of the taint (value `true`, effect `NoSchedule`) the agent puts on its Node.
pub const HOST_TAINT_KEY: &str = "virtual-node-eci.aliyun.com/host-agent";

/// The node's address: pods' `hostIP`, the Node's InternalIP.
const HOST_IP: &str = "127.0.0.1";
/// Field manager of the agent's writes.
const FIELD_MANAGER: &str = "host-agent";

/// The pod network 127.`n`.0.0/16, which Linux answers on without configuration.
pub fn loopback_pod_network(n: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(127, n, 0, 0)
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The Node's name (`host-0`).
    pub node_name: String,
    /// image repository (tag/digest stripped, e.g. "virtual-node-eci") -> directory holding the binaries;
    /// a container's command[0] (an absolute path like /usr/local/bin/mock-eci) is resolved by its
    /// file name inside that directory; with no command, the image's default binary is the repository name.
    pub images: BTreeMap<String, PathBuf>,
    /// Per-pod directories (volumes, logs, pid files): `<dir>/pods/<namespace>_<pod>/`.
    pub dir: PathBuf,
    /// `KUBERNETES_SERVICE_HOST` of the containers.
    pub api_host: String,
    /// `KUBERNETES_SERVICE_PORT` of the containers.
    pub api_port: u16,
    /// Restart back-off: initial, max (kubelet: 10s, 300s).
    pub restart_backoff: (Duration, Duration),
    /// Pod IPs are A.B.x.y, A.B the first two octets of this address (one agent per network on
    /// a machine): a block of loopback ([`loopback_pod_network`]), or a private block the caller
    /// made local to this machine (the playground's real-runtime mode, `crate::local_net`).
    pub pod_network: std::net::Ipv4Addr,
}

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A command the agent needs is missing, or mount namespaces cannot be made.
    #[error("host agent prerequisites: {source}")]
    Prerequisite {
        /// The error.
        #[source]
        source: ProcessError,
    },
    /// The agent's directory could not be made.
    #[error("create {}: {source}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The Node could not be registered.
    #[error("register the host node: {source}")]
    Node {
        /// The error.
        #[source]
        source: NodeError,
    },
    /// The HTTP client for probes could not be built.
    #[error("build the probe HTTP client: {source}")]
    Http {
        /// The error.
        #[source]
        source: reqwest::Error,
    },
}

/// What the agent's tasks share.
struct Ctx {
    client: kube::Client,
    config: HostConfig,
    tools: process::Tools,
    ips: parking_lot::Mutex<ipam::IpPool>,
    hosts: proxy::HostsFiles,
    services: Store<Service>,
    ready: proxy::ReadyPods,
    http: reqwest::Client,
    recorder: kube::runtime::events::Recorder,
    name_locks: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("config", &self.config)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// One lock per `namespace/name`, held by the pod worker for its whole life.
    fn name_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.name_locks.lock();
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        Arc::clone(locks.entry(key.to_owned()).or_default())
    }

    fn release_ip(&self, ip: std::net::Ipv4Addr) {
        self.ips.lock().release(ip);
    }
}

/// The running agent. Dropping it kills every container at once; [`HostAgent::stop`] stops
/// them like a node shutdown.
#[derive(Debug)]
pub struct HostAgent {
    cancel: CancellationToken,
    shutdown: watch::Sender<Option<Duration>>,
    pods: Option<AbortOnDropHandle<()>>,
    tasks: JoinSet<()>,
    node_name: String,
}

impl HostAgent {
    /// Registers the Node, starts the service proxy and then the pod watch.
    pub async fn start(client: kube::Client, config: HostConfig) -> Result<HostAgent, HostError> {
        let tools = process::Tools::find()
            .await
            .map_err(|source| HostError::Prerequisite { source })?;
        let pods_dir = config.dir.join("pods");
        std::fs::create_dir_all(&pods_dir).map_err(|source| HostError::Dir {
            path: pods_dir.clone(),
            source,
        })?;
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .no_proxy()
            // No keep-alive, like the kubelet's probes: every probe dials the container anew.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|source| HostError::Http { source })?;
        let node_uid = node::register(&client, &config)
            .await
            .map_err(|source| HostError::Node { source })?;

        let (services, services_writer) = reflector::store::<Service>();
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            config: config.clone(),
            tools,
            ips: parking_lot::Mutex::new(ipam::IpPool::new(config.pod_network)),
            hosts: proxy::HostsFiles::default(),
            services,
            ready: proxy::ReadyPods::default(),
            http,
            recorder: kube::runtime::events::Recorder::new(
                client.clone(),
                kube::runtime::events::Reporter {
                    controller: "kubelet".into(),
                    instance: Some(config.node_name.clone()),
                },
            ),
            name_locks: parking_lot::Mutex::new(HashMap::new()),
        });
        let cancel = CancellationToken::new();
        let (shutdown, shutdown_rx) = watch::channel(None);
        let span = info_span!("host_agent", node = %config.node_name);
        let mut tasks = JoinSet::new();
        tasks.spawn(
            node::heartbeat(client, config.clone(), node_uid, cancel.clone())
                .instrument(span.clone()),
        );
        tasks.spawn(
            proxy::run(Arc::clone(&ctx), services_writer, cancel.clone()).instrument(span.clone()),
        );
        // Service links and hosts files want the Services first.
        if tokio::time::timeout(Duration::from_secs(30), ctx.services.wait_until_ready())
            .await
            .is_err()
        {
            warn!(node = %config.node_name, "Services not listed within 30 s: starting pods anyway");
        }
        let pods = tokio::spawn(pods::dispatch(Arc::clone(&ctx), shutdown_rx).instrument(span));
        info!(node = %config.node_name, "host agent started");
        Ok(HostAgent {
            cancel,
            shutdown,
            pods: Some(AbortOnDropHandle::new(pods)),
            tasks,
            node_name: config.node_name,
        })
    }

    /// Terminates every container like a node shutdown (SIGTERM, then SIGKILL after the pod's grace, capped at `limit`), then stops the agent's tasks.
    pub async fn stop(mut self, limit: Duration) {
        info!(node = %self.node_name, ?limit, "host agent stopping");
        self.shutdown.send_replace(Some(limit));
        if let Some(pods) = self.pods.take() {
            // Workers need the limit, plus a moment to post the final statuses.
            if tokio::time::timeout(limit + Duration::from_secs(10), pods)
                .await
                .is_err()
            {
                warn!(node = %self.node_name, "pod workers did not finish in time: killing their containers");
            }
        }
        self.cancel.cancel();
        self.tasks.shutdown().await;
        info!(node = %self.node_name, "host agent stopped");
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
