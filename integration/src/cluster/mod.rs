//! A real Kubernetes control plane on loopback for the end-to-end suite, the benchmarks and the
//! playground: etcd → kube-apiserver → kube-controller-manager and kube-scheduler (→ kwok for
//! simulated ECS nodes), upstream binaries from [`upstream`], PKI from [`pki`], each component a
//! child process logging into the fixture's directory. It calls only the processes it starts and
//! the API through kube-rs; the host-node agent and the daemons are started by its users
//! (kube-scheduler may be told to call the daemons' extender: [`placement_extender`]).

pub mod etcd;
pub mod metrics_server;
mod pki;
pub mod placement_extender;
pub mod upstream;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::http_check::HttpCheck;
use crate::process::{Process, ProcessError, free_port};
pub use pki::{CertFiles, Pki, PkiError};
pub use placement_extender::PlacementExtender;
pub use upstream::{Upstream, UpstreamError};

/// A random number in `range` (different in every process and call): the loopback ranges a
/// fixture takes, so that two fixtures on one machine rarely meet.
pub fn random_in(range: std::ops::RangeInclusive<u8>) -> u8 {
    use std::hash::BuildHasher as _;
    let span = u64::from(range.end() - range.start()) + 1;
    let random =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    range.start() + u8::try_from(random % span).unwrap_or(0)
}
/// The service-account token issuer (and default audience).
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The label kwok manages simulated nodes by.
pub const KWOK_NODE_LABEL: (&str, &str) = ("type", "kwok");
/// The user the daemon's ServiceAccount token authenticates as (`deploy/base`).
pub const DAEMON_USER: &str = "system:serviceaccount:kube-system:virtual-node-eci";
/// kube-apiserver's audit log, in the control plane's directory (see [`audit_policy`]); when it
/// grows past 200 MB it is rotated beside itself (`audit-<time>.log`, every one kept), and a
/// second apiserver started from [`etcd::APISERVER_ARGS_FILE`] appends to the same file (one
/// `write` per event, `O_APPEND`), so read every `*.log` of its directory.
pub const AUDIT_LOG: &str = "audit/audit.log";
/// The audit policy kube-apiserver runs with, in the control plane's directory.
pub const AUDIT_POLICY: &str = "audit-policy.yaml";

/// The apiserver's audit policy: every request of the daemon's ServiceAccount ([`DAEMON_USER`])
/// at `Metadata` level — who, verb, resource, namespace and name, the response code — and
/// nothing else. The security checks need exactly that ("no request of ours was denied");
/// other users' requests (the controllers', kwok's heartbeats, the tests') would multiply the
/// log's size and the apiserver's encoding work for no check, and a benchmark's figures should
/// not pay for them. `RequestReceived` is omitted (the `ResponseComplete` stage carries the
/// same request and its code; watches also log `ResponseStarted`). Requests made by an
/// administrator impersonating the ServiceAccount (`kubectl auth can-i --as`) are matched
/// against the administrator, before impersonation, so they are not logged.
pub fn audit_policy() -> String {
    json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "users": [DAEMON_USER]},
            {"level": "None"},
        ],
    })
    .to_string()
}

/// kube-apiserver's admission configuration, in the control plane's directory (see
/// [`admission_configuration`]).
pub const ADMISSION_CONFIGURATION: &str = "admission-configuration.yaml";
/// The credentials kube-apiserver presents to webhooks, in the control plane's directory.
pub const WEBHOOK_CREDENTIALS: &str = "webhook-credentials.kubeconfig";

/// The admission configuration: the mutating and validating webhook plugins present the
/// apiserver's kubelet client certificate (user [`pki::APISERVER_KUBELET_CLIENT`]) to every
/// webhook behind a Service of `kube-system`, as an operator configures it for a webhook that
/// authenticates its caller (`WEBHOOK_CALLERS`). Webhooks that ask for no certificate get
/// none.
fn admission_configuration(credentials: &Path) -> String {
    let webhook = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": credentials,
    });
    json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": "MutatingAdmissionWebhook", "configuration": webhook},
            {"name": "ValidatingAdmissionWebhook", "configuration": webhook},
        ],
    })
    .to_string()
}

/// The kubeconfig [`admission_configuration`] names: `*.kube-system.svc` (any Service of the
/// namespace, the way the apiserver matches webhook Services) authenticates with `client`.
fn webhook_credentials(client: &pki::CertFiles) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{
            "name": "*.kube-system.svc",
            "user": {"client-certificate": client.cert, "client-key": client.key},
        }],
    })
    .to_string()
}

/// Starting or running the control plane failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The upstream binaries are not available.
    #[error("upstream binaries")]
    Upstream(#[from] UpstreamError),
    /// The PKI could not be generated.
    #[error("control-plane PKI")]
    Pki(#[from] PkiError),
    /// A component could not be started.
    #[error("start a component")]
    Process(#[from] ProcessError),
    /// A file could not be written.
    #[error("write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read.
    #[error("read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The client that polls `/readyz` could not be built (the CA file is not PEM).
    #[error("build an HTTPS client trusting {ca}")]
    ReadinessClient {
        /// The CA file.
        ca: PathBuf,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// A component exited while starting.
    #[error("{component} exited ({status}) while starting; last lines of its log:\n{tail}")]
    Exited {
        /// The component.
        component: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its log.
        tail: String,
    },
    /// A component did not become ready in time.
    #[error("{component} not ready after {timeout:?}; last lines of its log:\n{tail}")]
    NotReady {
        /// The component.
        component: String,
        /// How long we waited.
        timeout: Duration,
        /// The end of its log.
        tail: String,
    },
    /// The API answered with an error.
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be loaded.
    #[error("load {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// How to start the control plane.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Directory for PKI, data and logs (must exist).
    pub dir: PathBuf,
    /// Simulated ordinary (ECS) nodes, `ecs-0` …, run by kwok: 2 CPU, 4 GiB, 110 pods.
    pub ecs_nodes: u32,
    /// kube-controller-manager's `--node-monitor-grace-period` (how long a silent node stays
    /// Ready).
    pub node_monitor_grace: Duration,
    /// How long to wait for each component to become ready.
    pub ready_timeout: Duration,
    /// The Service range is `127.<service_network>.0.0/16`: loopback, so the host agent's
    /// service proxy binds ClusterIPs without any routing (a real range leads nowhere here).
    pub service_network: u8,
    /// Run metrics-server (the Metrics API: `kubectl top`, the HPA); see [`metrics_server`].
    /// Off by default: it scrapes every node every 10 s, which the daemons under a load
    /// benchmark should not pay for.
    pub metrics_server: bool,
    /// Configure kube-scheduler with the daemon's ResourcePolicy extender on a free port of
    /// 127.0.0.1, with a serving certificate for it; see [`placement_extender`]. Off by
    /// default: nothing serves it until a daemon is started with [`PlacementExtender::env`].
    pub placement_extender: bool,
    /// Write kube-apiserver's audit log of the daemon's requests ([`audit_policy`]). On by
    /// default: the security checks read it. Benchmarks turn it off, since it audits the
    /// daemon's requests and not kwok's, so the two would not be measured alike.
    pub audit_log: bool,
}

impl ControlPlaneOptions {
    /// Defaults for `dir`: no ECS nodes, the upstream node grace (40 s), a 300 s readiness bound
    /// (generous: on a loaded two-core machine several control planes start at once), a random
    /// Service range in 127.100.0.0–127.199.255.255.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            ecs_nodes: 0,
            node_monitor_grace: Duration::from_secs(40),
            ready_timeout: Duration::from_secs(300),
            service_network: random_in(100..=199),
            metrics_server: false,
            placement_extender: false,
            audit_log: true,
        }
    }

    /// `127.<service_network>.0.0/16`.
    pub fn service_cidr(&self) -> String {
        format!("127.{}.0.0/16", self.service_network)
    }
}

/// A running control plane. [`ControlPlane::stop`] stops it in order; dropping it kills every
/// component.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    upstream: Upstream,
    pki: Pki,
    api_port: u16,
    kubeconfig: PathBuf,
    placement_extender: Option<PlacementExtender>,
    /// Started first to last; stopped last to first.
    processes: Vec<Process>,
}

fn write(path: &Path, contents: &str) -> Result<(), ClusterError> {
    std::fs::write(path, contents).map_err(|source| ClusterError::Write {
        path: path.to_owned(),
        source,
    })
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// The files kube-apiserver's flags name.
struct ApiserverFiles {
    policy: PathBuf,
    audit_log: PathBuf,
    admission: PathBuf,
}

/// kube-apiserver's flags, but for the audit log's.
fn apiserver_flags(
    pki: &Pki,
    options: &ControlPlaneOptions,
    etcd_url: &str,
    admission: &Path,
    api_port: u16,
) -> Vec<String> {
    vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--admission-control-config-file={}", display(admission)),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--tls-cert-file={}", display(&pki.apiserver.cert)),
        format!("--tls-private-key-file={}", display(&pki.apiserver.key)),
        format!("--client-ca-file={}", display(&pki.ca.cert)),
        format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
        format!(
            "--service-account-key-file={}",
            display(&pki.service_account.cert)
        ),
        format!(
            "--service-account-signing-key-file={}",
            display(&pki.service_account.key)
        ),
        format!("--service-cluster-ip-range={}", options.service_cidr()),
        "--authorization-mode=Node,RBAC".into(),
        format!(
            "--kubelet-client-certificate={}",
            display(&pki.apiserver_kubelet_client.cert)
        ),
        format!(
            "--kubelet-client-key={}",
            display(&pki.apiserver_kubelet_client.key)
        ),
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        format!(
            "--requestheader-client-ca-file={}",
            display(&pki.front_proxy_ca.cert)
        ),
        format!("--requestheader-allowed-names={}", pki::FRONT_PROXY_CLIENT),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!(
            "--proxy-client-cert-file={}",
            display(&pki.front_proxy_client.cert)
        ),
        format!(
            "--proxy-client-key-file={}",
            display(&pki.front_proxy_client.key)
        ),
        // The `kubernetes` Endpoints would point at 127.0.0.1, which they may not.
        "--endpoint-reconciler-type=none".into(),
        "--allow-privileged=true".into(),
        "--profiling=false".into(),
    ]
}

/// A kubeconfig for `server` that authenticates with a client certificate.
fn kubeconfig(server: &str, ca: &Path, user: &CertFiles, name: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": name, "user": {"client-certificate": user.cert, "client-key": user.key}}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    })
    .to_string()
}

/// The client configuration of a kubeconfig file, without kube-rs's own retries (tests see
/// errors as they are).
pub async fn config_for(path: &Path) -> Result<kube::Config, ClusterError> {
    let failed = |message: String| ClusterError::Kubeconfig {
        path: path.to_owned(),
        message,
    };
    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| failed(e.to_string()))?;
    config.default_retry = false;
    Ok(config)
}

/// A client for a kubeconfig file (see [`config_for`]).
pub async fn client_for(path: &Path) -> Result<kube::Client, ClusterError> {
    Ok(kube::Client::try_from(config_for(path).await?)?)
}

impl ControlPlane {
    /// Builds or finds the binaries, generates the PKI and starts every component, waiting for
    /// each to be ready before the next.
    ///
    /// Ports are picked free just before use, so another process may take one in between; a
    /// component that exits with "address already in use" makes the whole start begin again
    /// (fresh etcd data, new ports), up to three times.
    pub async fn start(options: ControlPlaneOptions) -> Result<Self, ClusterError> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once(options.clone()).await {
                Err(ClusterError::Exited {
                    component, tail, ..
                }) if attempt < ATTEMPTS && tail.contains("address already in use") => {
                    tracing::warn!(%component, attempt, "a port was taken while starting; starting the control plane again");
                    let _ = std::fs::remove_dir_all(options.dir.join("etcd"));
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    async fn start_once(options: ControlPlaneOptions) -> Result<Self, ClusterError> {
        let upstream = Upstream::locate().await?;
        let dir = options.dir.clone();
        let pki_dir = dir.join("pki");
        std::fs::create_dir_all(&pki_dir).map_err(|source| ClusterError::Write {
            path: pki_dir.clone(),
            source,
        })?;
        let kubernetes_service_ip = format!("127.{}.0.1", options.service_network);
        let pki = Pki::generate(&pki_dir, &kubernetes_service_ip)?;
        let placement_extender = if options.placement_extender {
            Some(PlacementExtender::prepare(&dir, &pki)?)
        } else {
            PlacementExtender::forget(&dir)?;
            None
        };
        let api_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig_path = dir.join("kubeconfig");
        write(
            &kubeconfig_path,
            &kubeconfig(&server, &pki.ca.cert, &pki.admin, "admin"),
        )?;
        let mut plane = Self {
            dir,
            upstream,
            pki,
            api_port,
            kubeconfig: kubeconfig_path,
            placement_extender,
            processes: Vec::new(),
        };
        plane.start_etcd_and_apiserver(&options).await?;
        plane.start_controllers(&options)?;
        let client = plane.client().await?;
        grant_kubelet_api_to_apiserver(&client).await?;
        if options.metrics_server {
            plane.start_metrics_server(&options).await?;
        }
        if options.ecs_nodes > 0 {
            plane.start_kwok(&client, &options).await?;
        }
        plane
            .wait_ready(
                "kube-controller-manager (the default ServiceAccount)",
                options.ready_timeout,
                || {
                    let client = client.clone();
                    async move {
                        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                            Api::namespaced(client, "default");
                        accounts.get_opt("default").await.ok().flatten().is_some()
                    }
                },
            )
            .await?;
        Ok(plane)
    }

    async fn start_etcd_and_apiserver(
        &mut self,
        options: &ControlPlaneOptions,
    ) -> Result<(), ClusterError> {
        let etcd_url = self.start_etcd(options).await?;
        self.start_apiserver(options, &etcd_url).await
    }

    /// Starts etcd and waits for it to be healthy; returns its client URL.
    async fn start_etcd(&mut self, options: &ControlPlaneOptions) -> Result<String, ClusterError> {
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = self.upstream.path("etcd")?.to_owned();
        self.spawn(
            "etcd",
            &etcd,
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", display(&self.dir.join("etcd"))),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )?;
        // For tests in other processes (compaction, a second apiserver on the same etcd).
        write(&self.dir.join(etcd::URL_FILE), &etcd_url)?;
        let health = HttpCheck::new(format!("{etcd_url}/health"));
        self.wait_ready("etcd", options.ready_timeout, || health.clone().passes())
            .await?;
        Ok(etcd_url)
    }

    /// Starts kube-apiserver on the etcd at `etcd_url` and waits for it to be ready.
    async fn start_apiserver(
        &mut self,
        options: &ControlPlaneOptions,
        etcd_url: &str,
    ) -> Result<(), ClusterError> {
        let apiserver = self.upstream.path("kube-apiserver")?.to_owned();
        let files = self.write_apiserver_files()?;
        let mut flags = apiserver_flags(
            &self.pki,
            options,
            etcd_url,
            &files.admission,
            self.api_port,
        );
        if options.audit_log {
            // The daemon's requests (see `audit_policy`), written as they complete ("blocking"
            // mode: one small append per request, so the log is complete when a test reads it).
            flags.extend([
                format!("--audit-policy-file={}", display(&files.policy)),
                format!("--audit-log-path={}", display(&files.audit_log)),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
                "--audit-log-maxsize=200".into(),
                "--audit-log-maxbackup=0".into(),
                "--audit-log-maxage=0".into(),
            ]);
        }
        write(&self.dir.join(etcd::APISERVER_ARGS_FILE), &flags.join("\n"))?;
        self.spawn("kube-apiserver", &apiserver, &flags)?;
        self.wait_apiserver_ready(options).await
    }

    /// Writes the apiserver's audit policy, webhook credentials and admission configuration
    /// (and makes the audit log's directory).
    fn write_apiserver_files(&self) -> Result<ApiserverFiles, ClusterError> {
        let policy = self.dir.join(AUDIT_POLICY);
        write(&policy, &audit_policy())?;
        let audit_log = self.dir.join(AUDIT_LOG);
        if let Some(audit_dir) = audit_log.parent() {
            std::fs::create_dir_all(audit_dir).map_err(|source| ClusterError::Write {
                path: audit_dir.to_owned(),
                source,
            })?;
        }
        let credentials = self.dir.join(WEBHOOK_CREDENTIALS);
        write(
            &credentials,
            &webhook_credentials(&self.pki.apiserver_kubelet_client),
        )?;
        let admission = self.dir.join(ADMISSION_CONFIGURATION);
        write(&admission, &admission_configuration(&credentials))?;
        Ok(ApiserverFiles {
            policy,
            audit_log,
            admission,
        })
    }

    /// Waits for the apiserver's `/readyz`.
    async fn wait_apiserver_ready(
        &mut self,
        options: &ControlPlaneOptions,
    ) -> Result<(), ClusterError> {
        let pki = self.pki.clone();
        // /readyz is public (system:public-info-viewer).
        let ca = std::fs::read(&pki.ca.cert).map_err(|source| ClusterError::Read {
            path: pki.ca.cert.clone(),
            source,
        })?;
        let client_error = |source| ClusterError::ReadinessClient {
            ca: pki.ca.cert.clone(),
            source,
        };
        let readyz =
            HttpCheck::trusting(&ca, format!("{}/readyz", self.server())).map_err(client_error)?;
        self.wait_ready("kube-apiserver", options.ready_timeout, || {
            readyz.clone().passes()
        })
        .await
    }

    fn start_controllers(&mut self, options: &ControlPlaneOptions) -> Result<(), ClusterError> {
        let pki = self.pki.clone();
        let server = self.server();
        let controller_kubeconfig = self.dir.join("controller-manager.kubeconfig");
        write(
            &controller_kubeconfig,
            &kubeconfig(
                &server,
                &pki.ca.cert,
                &pki.controller_manager,
                "controller-manager",
            ),
        )?;
        let kcm = self.upstream.path("kube-controller-manager")?.to_owned();
        let kcm_kubeconfig = display(&controller_kubeconfig);
        self.spawn(
            "kube-controller-manager",
            &kcm,
            &[
                format!("--kubeconfig={kcm_kubeconfig}"),
                format!("--authentication-kubeconfig={kcm_kubeconfig}"),
                format!("--authorization-kubeconfig={kcm_kubeconfig}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
                "--leader-elect=false".into(),
                format!(
                    "--service-account-private-key-file={}",
                    display(&pki.service_account.key)
                ),
                format!("--root-ca-file={}", display(&pki.ca.cert)),
                "--use-service-account-credentials=true".into(),
                format!("--cluster-signing-cert-file={}", display(&pki.ca.cert)),
                format!("--cluster-signing-key-file={}", display(&pki.ca.key)),
                format!("--service-cluster-ip-range={}", options.service_cidr()),
                format!(
                    "--node-monitor-grace-period={}s",
                    options.node_monitor_grace.as_secs().max(1)
                ),
                // The HPA re-evaluates every 5 s (upstream: 15 s), so a scaling test waits for
                // metrics, not for the controller; without an HPA it costs nothing.
                "--horizontal-pod-autoscaler-sync-period=5s".into(),
                "--profiling=false".into(),
            ],
        )?;

        let scheduler_kubeconfig = self.dir.join("scheduler.kubeconfig");
        write(
            &scheduler_kubeconfig,
            &kubeconfig(&server, &pki.ca.cert, &pki.scheduler, "scheduler"),
        )?;
        let scheduler_config = self.dir.join("scheduler.yaml");
        write(
            &scheduler_config,
            &placement_extender::scheduler_config(
                &scheduler_kubeconfig,
                self.placement_extender.as_ref(),
            )
            .to_string(),
        )?;
        let scheduler = self.upstream.path("kube-scheduler")?.to_owned();
        let scheduler_kubeconfig = display(&scheduler_kubeconfig);
        self.spawn(
            "kube-scheduler",
            &scheduler,
            &[
                format!("--config={}", display(&scheduler_config)),
                format!("--authentication-kubeconfig={scheduler_kubeconfig}"),
                format!("--authorization-kubeconfig={scheduler_kubeconfig}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
            ],
        )
    }

    /// Starts kwok and registers its ECS nodes, one step at a time because of a data race in
    /// kwok v0.8.0: every CEL environment it builds (one for its metrics server at start, one
    /// per Stage on that Stage's first object) registers Go types in a process-wide map of
    /// `github.com/wzshiming/easycel` (v0.6.0, the latest) without a lock. Two built at once
    /// can end kwok with a Go `fatal error` on concurrent map access (CI saw it; a `-race`
    /// build named the metrics environment against the node Stages', the nodes having been
    /// registered while kwok started). Each
    /// type is written once, so after the first environment of each kind only reads remain:
    /// the fixture waits for kwok's server (up once the metrics environment is built), lets one
    /// node take the node Stages, and one throwaway pod the pod Stages, before anything else.
    async fn start_kwok(
        &mut self,
        client: &kube::Client,
        options: &ControlPlaneOptions,
    ) -> Result<(), ClusterError> {
        let port = free_port()?;
        self.spawn_kwok(port, options.node_monitor_grace)?;
        let healthz = HttpCheck::new(format!("http://127.0.0.1:{port}/healthz"))
            .with_timeout(Duration::from_secs(2));
        self.wait_ready("kwok (its server)", options.ready_timeout, || {
            healthz.clone().passes()
        })
        .await?;
        for ordinal in 0..options.ecs_nodes {
            let name = format!("ecs-{ordinal}");
            register_ecs_node(client, &name).await?;
            if ordinal == 0 {
                self.wait_ready(
                    "kwok (the first ECS node Ready)",
                    options.ready_timeout,
                    || node_ready(client, &name),
                )
                .await?;
            }
        }
        self.warm_kwok_pod_stages(client, options.ready_timeout)
            .await
    }

    /// Runs one pod on `ecs-0` to Running and deletes it: kwok matches a pod's first event
    /// against every pod Stage in one goroutine, which builds all their CEL environments (see
    /// [`Self::start_kwok`]). The pod is in `kube-system`, where nothing counts pods.
    async fn warm_kwok_pod_stages(
        &mut self,
        client: &kube::Client,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
        self.wait_ready("kube-system's default ServiceAccount", timeout, || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.ok().flatten().is_some() }
        })
        .await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "kwok-stage-warm-up"},
            "spec": {
                "nodeName": "ecs-0",
                "automountServiceAccountToken": false,
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
            },
        }))
        .map_err(kube::Error::SerdeError)?;
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
        self.wait_ready("kwok (a pod on ecs-0 Running)", timeout, || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt("kwok-stage-warm-up").await.ok().flatten();
                pod.and_then(|p| p.status?.phase).as_deref() == Some("Running")
            }
        })
        .await?;
        let now = kube::api::DeleteParams::default().grace_period(0);
        match pods.delete("kwok-stage-warm-up", &now).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Starts kwok with the node Stages kwokctl itself pairs with a node Lease: `node-initialize`
    /// and `heartbeat-with-lease`, whose status heartbeat comes only every ~10 minutes, so
    /// liveness rests on the Lease in `kube-node-lease` that kwok keeps when given
    /// `--node-lease-duration-seconds` (its default, 0, keeps none, and the node lifecycle
    /// controller then marks every node unreachable one grace period after it starts). The
    /// Lease lasts one node-monitor grace period and is renewed every quarter of it, as kwokctl
    /// and the kubelet set it up.
    fn spawn_kwok(&mut self, port: u16, node_monitor_grace: Duration) -> Result<(), ClusterError> {
        let stages = self.upstream.path("kwok-stages")?.to_owned();
        let kwok = self.upstream.path("kwok")?.to_owned();
        let kubeconfig = display(&self.kubeconfig);
        let mut args = vec![
            format!("--kubeconfig={kubeconfig}"),
            "--manage-all-nodes=false".into(),
            format!(
                "--manage-nodes-with-label-selector={}={}",
                KWOK_NODE_LABEL.0, KWOK_NODE_LABEL.1
            ),
            format!("--server-address=127.0.0.1:{port}"),
            format!(
                "--node-lease-duration-seconds={}",
                node_monitor_grace.as_secs().max(1)
            ),
        ];
        for stage in [
            "node/fast/node-initialize.yaml",
            "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
            "pod/fast/pod-ready.yaml",
            "pod/fast/pod-complete.yaml",
            "pod/fast/pod-delete.yaml",
        ] {
            args.push(format!("--config={}", display(&stages.join(stage))));
        }
        self.spawn("kwok", &kwok, &args)
    }

    fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> Result<(), ClusterError> {
        let process = Process::spawn(name, program, args, &[], &self.dir)?;
        self.processes.push(process);
        Ok(())
    }

    /// Polls `ready` (with back-off up to 500 ms) until it holds; fails early when the
    /// component started last exits.
    async fn wait_ready<F, Fut>(
        &mut self,
        component: &str,
        timeout: Duration,
        ready: F,
    ) -> Result<(), ClusterError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            if ready().await {
                return Ok(());
            }
            for process in &mut self.processes {
                if let Some(status) = process.exit_status() {
                    return Err(ClusterError::Exited {
                        component: process.name().to_owned(),
                        status,
                        tail: process.tail(30),
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline {
                let tail = self
                    .processes
                    .last()
                    .map(|p| p.tail(30))
                    .unwrap_or_default();
                return Err(ClusterError::NotReady {
                    component: component.to_owned(),
                    timeout,
                    tail,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The apiserver's port on 127.0.0.1.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The administrator's kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The fixture's directory: PKI, etcd data and every component's log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// kube-apiserver's audit log ([`AUDIT_LOG`]; the daemon's requests, see [`audit_policy`]).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    /// Where kube-scheduler calls the daemon's extender, when started with it.
    pub fn placement_extender(&self) -> Option<&PlacementExtender> {
        self.placement_extender.as_ref()
    }

    /// The generated PKI.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The upstream binaries (kubectl among them).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// An administrator's client.
    pub async fn client(&self) -> Result<kube::Client, ClusterError> {
        client_for(&self.kubeconfig).await
    }

    /// The first component that exited, if any (a healthy control plane has none).
    pub fn exited(&mut self) -> Option<(String, std::process::ExitStatus)> {
        self.processes
            .iter_mut()
            .find_map(|p| p.exit_status().map(|status| (p.name().to_owned(), status)))
    }

    /// Stops the components in reverse order of start (SIGTERM, SIGKILL after `grace`) and
    /// removes etcd's data (its preallocated WAL alone is 64 MiB); logs and PKI stay.
    pub async fn stop(mut self, grace: Duration) {
        while let Some(mut process) = self.processes.pop() {
            process.terminate(grace).await;
        }
        let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
    }
}

/// The apiserver calls kubelets (logs, exec, port-forward) as its `--kubelet-client-certificate`
/// user, which kubelets authorize with a SubjectAccessReview: bind it to the built-in
/// `system:kubelet-api-admin` role, as kubeadm-style installs do.
async fn grant_kubelet_api_to_apiserver(client: &kube::Client) -> Result<(), ClusterError> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kube-apiserver-kubelet-api-admin"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:kubelet-api-admin",
        },
        "subjects": [{
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "User",
            "name": pki::APISERVER_KUBELET_CLIENT,
        }],
    }))
    .map_err(kube::Error::SerdeError)?;
    match bindings.create(&PostParams::default(), &binding).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Whether the node's Ready condition is True (false while it is missing or unreadable).
async fn node_ready(client: &kube::Client, name: &str) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    let Ok(Some(node)) = nodes.get_opt(name).await else {
        return false;
    };
    node.status
        .and_then(|status| status.conditions)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Registers a simulated ECS node for kwok: labelled like an ordinary worker, 2 CPU, 4 GiB,
/// 110 pods; kwok marks it Ready and keeps its Lease.
async fn register_ecs_node(client: &kube::Client, name: &str) -> Result<(), ClusterError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {
                KWOK_NODE_LABEL.0: KWOK_NODE_LABEL.1,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "ecs.g7.large",
                "node-role.kubernetes.io/worker": "",
                "alibabacloud.com/nodepool-id": "np-e2e",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "status": {
            "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
        },
    }))
    .map_err(kube::Error::SerdeError)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}
