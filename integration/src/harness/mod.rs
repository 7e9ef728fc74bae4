//! The end-to-end harness: a real cluster (the fixture's control plane shared by the test
//! binary, or `E2E_KUBECONFIG`'s), mock-eci and daemon replicas as real child processes, waits
//! on conditions with timeouts, and a dump of everything when a test fails.

pub mod deploy;
mod disruption;
mod fixture;
pub mod invariants;
pub mod mock_admin;
mod restart;
mod tenant;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::http_check::HttpCheck;

pub use crate::cluster::PlacementExtender;
pub use crate::process::{Process, ProcessError, binary, build_binaries, free_port};
pub use disruption::SecondApiserver;
pub use fixture::{DAEMON_SERVICE_ACCOUNT, FixtureOptions};
pub use restart::{Component, Restarted, Stop};
pub use tenant::{KubectlRun, TENANT_ACCOUNT, Tenant};

/// Setting up or running a scenario failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A child process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The fixture's etcd could not be reached or refused.
    #[error(transparent)]
    Etcd(#[from] crate::cluster::etcd::EtcdError),
    /// The environment is not usable.
    #[error("{0}")]
    Setup(String),
    /// The Kubernetes API answered with an error.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// mock-eci's admin API did not answer as expected.
    #[error("reading mock-eci's admin API at {url}")]
    MockAdmin {
        /// What was read.
        url: String,
        /// The error.
        #[source]
        source: reqwest::Error,
    },
    /// A condition did not hold in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
    },
}

/// Where the cluster comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterKind {
    /// The fixture's control plane (with the host node and kwok ECS nodes), one per test binary.
    Fixture,
    /// An existing cluster from `E2E_KUBECONFIG`.
    External,
}

/// Which API the daemons use to reach mock-eci.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EciApi {
    /// The gRPC contract (`ECI_BACKEND=grpc://…`).
    #[default]
    Grpc,
    /// The Alibaba Cloud OpenAPI (`ECI_BACKEND=openapi`), served by mock-eci's HTTPS front.
    OpenApi,
}

/// The AccessKey mock-eci's OpenAPI front accepts in end-to-end runs.
pub const E2E_ACCESS_KEY_ID: &str = "e2e-access-key-id";
/// Its secret.
pub const E2E_ACCESS_KEY_SECRET: &str = "e2e-access-key-secret";

/// A mock-eci process.
#[derive(Debug, Clone)]
pub struct MockEciEndpoints {
    /// `http://127.0.0.1:PORT` of the gRPC API.
    pub grpc: String,
    /// `http://127.0.0.1:PORT` of the admin endpoint.
    pub admin: String,
    /// `https://127.0.0.1:PORT` of the OpenAPI front, when the harness uses it.
    pub openapi: Option<String>,
    /// The CA certificate the OpenAPI front's certificate chains to.
    pub openapi_ca: Option<PathBuf>,
}

impl MockEciEndpoints {
    /// The daemon's `ECI_*` backend variables: the OpenAPI front with the e2e AccessKey when
    /// there is one, the gRPC API otherwise.
    fn daemon_backend_env(&self) -> Vec<(String, String)> {
        match (&self.openapi, &self.openapi_ca) {
            (Some(endpoint), Some(ca)) => vec![
                ("ECI_BACKEND".to_owned(), "openapi".to_owned()),
                ("ECI_ENDPOINT".to_owned(), endpoint.clone()),
                ("ECI_CA_FILE".to_owned(), ca.display().to_string()),
                ("ECI_ACCESS_KEY".to_owned(), E2E_ACCESS_KEY_ID.to_owned()),
                (
                    "ECI_SECRET_KEY".to_owned(),
                    E2E_ACCESS_KEY_SECRET.to_owned(),
                ),
            ],
            _ => vec![(
                "ECI_BACKEND".to_owned(),
                format!("grpc://{}", self.grpc.trim_start_matches("http://")),
            )],
        }
    }
}

/// A running end-to-end environment. Dropping it kills every process and removes its files.
pub struct Harness {
    dir: tempfile::TempDir,
    kind: ClusterKind,
    kubeconfig: PathBuf,
    daemon_kubeconfig: PathBuf,
    fixture_dir: PathBuf,
    kubectl: PathBuf,
    client: kube::Client,
    api_url: String,
    processes: Vec<Process>,
    mock: Option<MockEciEndpoints>,
    mock_args: Vec<String>,
    eci_api: EciApi,
    run_id: String,
    node_names: Vec<String>,
    namespaces: Vec<String>,
    /// Daemon process name → its kubelet API port.
    kubelet_ports: Vec<(String, u16)>,
    placement_extender: Option<PlacementExtender>,
    audit_log: Option<PathBuf>,
    /// The cluster name the daemons tag their groups with.
    cluster_name: String,
    /// The control plane this harness owns (a second cluster), stopped when dropped; `None`
    /// for the binary's shared one.
    own_cluster: Option<Box<fixture::Shared>>,
}

async fn client_for(kubeconfig: &Path) -> Result<(kube::Client, String), HarnessError> {
    let config = crate::cluster::config_for(kubeconfig)
        .await
        .map_err(|e| HarnessError::Setup(e.to_string()))?;
    let url = config.cluster_url.to_string();
    Ok((kube::Client::try_from(config)?, url))
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("kind", &self.kind)
            .field("api", &self.api_url)
            .field("processes", &self.processes)
            .finish_non_exhaustive()
    }
}

/// One end-to-end scenario: starts a harness, runs `scenario` with it and ends it with
/// [`Harness::finish`].
///
/// # Panics
/// When the harness cannot start or the scenario fails: this is a test's body.
pub async fn run_scenario<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let mut h = Harness::start().await.expect("the harness starts");
    let result = scenario(&mut h).await;
    h.finish(result).await;
}

/// The error and every cause under it, on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text += &format!(": {inner}");
        cause = inner.source();
    }
    text
}

/// `items` without their `metadata.managedFields`: a dump is read by a person, and those
/// entries triple its length.
fn without_managed_fields(mut items: Value) -> Value {
    if let Some(items) = items.as_array_mut() {
        for item in items {
            if let Some(metadata) = item.get_mut("metadata").and_then(Value::as_object_mut) {
                metadata.remove("managedFields");
            }
        }
    }
    items
}

impl Harness {
    /// Joins the test binary's cluster (starting it on first use) with a fresh scratch
    /// directory and run id.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(FixtureOptions::default()).await
    }

    /// [`Self::start`], asking for `options` in the fixture if this is the binary's first
    /// harness (the cluster is shared: the first one decides; with `E2E_KUBECONFIG` the
    /// cluster has what it has).
    pub async fn start_with(options: FixtureOptions) -> Result<Self, HarnessError> {
        let dir = tempfile::tempdir().map_err(|source| HarnessError::Io {
            what: "create a temporary directory".into(),
            source,
        })?;
        let shared = fixture::shared_with(options).await?;
        let (client, api_url) = client_for(&shared.kubeconfig).await?;
        let kind = if shared.fixture {
            ClusterKind::Fixture
        } else {
            ClusterKind::External
        };
        let mut harness = Self::assemble(dir, kind, shared.kubeconfig.clone(), client, api_url);
        harness.daemon_kubeconfig = shared.daemon_kubeconfig.clone();
        harness.fixture_dir = shared.dir.clone();
        harness.placement_extender = shared.placement_extender.clone();
        harness.audit_log = shared.audit_log.clone();
        harness.kubectl = shared
            .upstream
            .path("kubectl")
            .map_err(|e| HarnessError::Setup(e.to_string()))?
            .to_owned();
        harness
            .wait_for(
                "the API to answer",
                Duration::from_secs(30),
                |h| async move { h.client.apiserver_version().await.is_ok() },
            )
            .await?;
        Ok(harness)
    }

    fn assemble(
        dir: tempfile::TempDir,
        kind: ClusterKind,
        kubeconfig: PathBuf,
        client: kube::Client,
        api_url: String,
    ) -> Self {
        let run_id = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
        let cluster_name = format!("e2e-{run_id}");
        Self {
            dir,
            kind,
            kubeconfig,
            daemon_kubeconfig: PathBuf::new(),
            fixture_dir: PathBuf::new(),
            kubectl: PathBuf::new(),
            client,
            api_url,
            processes: Vec::new(),
            mock: None,
            mock_args: Vec::new(),
            eci_api: EciApi::default(),
            run_id,
            node_names: Vec::new(),
            namespaces: Vec::new(),
            kubelet_ports: Vec::new(),
            placement_extender: None,
            audit_log: None,
            cluster_name,
            own_cluster: None,
        }
    }

    /// A second harness on a control plane of its own (its own playground: apiserver, etcd,
    /// controllers, kubeconfig, daemon RBAC), sharing this harness's mock-eci (start it first)
    /// and run id — so its daemons serve the *same node names* and its namespaces have the same
    /// names — but tagging its groups with a different cluster name: two clusters on one ECI
    /// account. Its control plane and processes stop when it is shut down or dropped; the
    /// mock-eci process stays this harness's.
    pub async fn start_independent_cluster(&self) -> Result<Self, HarnessError> {
        let dir = tempfile::tempdir().map_err(|source| HarnessError::Io {
            what: "create a temporary directory".into(),
            source,
        })?;
        let own = fixture::independent(FixtureOptions::default()).await?;
        let (client, api_url) = client_for(&own.kubeconfig).await?;
        let mut second = Self::assemble(
            dir,
            ClusterKind::Fixture,
            own.kubeconfig.clone(),
            client,
            api_url,
        );
        second.run_id.clone_from(&self.run_id);
        second.cluster_name = format!("e2e-{}-second", self.run_id);
        second.daemon_kubeconfig = own.daemon_kubeconfig.clone();
        second.fixture_dir = own.dir.clone();
        second.audit_log = own.audit_log.clone();
        second.kubectl = own
            .upstream
            .path("kubectl")
            .map_err(|e| HarnessError::Setup(e.to_string()))?
            .to_owned();
        second.mock = self.mock.clone();
        second.eci_api = self.eci_api;
        second.own_cluster = Some(Box::new(own));
        second
            .wait_for(
                "the second cluster's API to answer",
                Duration::from_secs(30),
                |h| async move { h.client.apiserver_version().await.is_ok() },
            )
            .await?;
        Ok(second)
    }

    /// The node (and daemon pod) name of replica `ordinal`: a prefix unique to the test keeps
    /// its nodes apart from every other test's (and a real cluster's own nodes).
    pub fn node_name(&self, ordinal: u32) -> String {
        format!("{}-{ordinal}", self.daemon_set_name())
    }

    /// The daemon StatefulSet's name (the prefix of [`Self::node_name`]).
    pub fn daemon_set_name(&self) -> String {
        format!("vne-e2e-{}", self.run_id)
    }

    /// Creates the daemon StatefulSet in `kube-system` with `replicas`, so replicas can tell a
    /// scale-in from a restart. Its pods only carry identity (the daemons run as the harness's
    /// processes): the real StatefulSet controller creates them and they stay Pending (a node
    /// selector nothing has); scaling the set deletes them as it would any replica.
    pub async fn create_daemon_statefulset(&self, replicas: i32) -> Result<(), HarnessError> {
        use k8s_openapi::api::apps::v1::StatefulSet;
        let name = self.daemon_set_name();
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), "kube-system");
        let labels = serde_json::json!({"app": name});
        let set: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"virtual-node-eci.aliyun.com/e2e-never": "true"},
                        "containers": [{"name": "placeholder", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }))
        .map_err(|e| HarnessError::Setup(e.to_string()))?;
        sets.create(&kube::api::PostParams::default(), &set).await?;
        Ok(())
    }

    /// Sets the daemon StatefulSet's `spec.replicas` (what `kubectl scale` does).
    pub async fn scale_daemon_statefulset(&self, replicas: i32) -> Result<(), HarnessError> {
        use k8s_openapi::api::apps::v1::StatefulSet;
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), "kube-system");
        sets.patch(
            &self.daemon_set_name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await?;
        Ok(())
    }

    /// Starts daemon replica `ordinal` against mock-eci (`start_mock_eci` first), with short
    /// test timings and `extra` environment variables (which override the defaults; an empty
    /// value removes one). Its process is named after its node.
    pub fn start_daemon(
        &mut self,
        ordinal: u32,
        extra: &[(&str, &str)],
    ) -> Result<String, HarnessError> {
        let mock = self
            .mock
            .clone()
            .ok_or_else(|| HarnessError::Setup("start mock-eci before the daemons".into()))?;
        let name = self.node_name(ordinal);
        let env = self.daemon_env(&name, &mock, extra)?;
        let program = binary("virtual-node-eci", "virtual-node-eci")?;
        let process_name = self.daemon_process_name(&name);
        self.spawn(&process_name, &program, &[], &env)?;
        if let Some((_, port)) = env.iter().find(|(key, _)| key == "KUBELET_PORT") {
            self.kubelet_ports
                .push((process_name.clone(), port.parse().unwrap_or_default()));
        }
        if !self.node_names.contains(&name) {
            self.node_names.push(name);
        }
        Ok(process_name)
    }

    /// The environment of the daemon serving node `name`: short test timings, a kubelet port
    /// of its own, `mock`'s backend and the daemon's kubeconfig, then `extra` over them.
    fn daemon_env(
        &self,
        name: &str,
        mock: &MockEciEndpoints,
        extra: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, HarnessError> {
        let backend = mock.daemon_backend_env();
        let kubelet_port = free_port()?;
        let mut env: Vec<(String, String)> = [
            ("POD_NAME", name),
            ("POD_NAMESPACE", "kube-system"),
            ("POD_IP", "127.0.0.1"),
            ("ECI_VSWITCH", "vsw-e2e"),
            ("ECI_SECURITY_GROUP", "sg-e2e"),
            ("ECI_CLUSTER_NAME", &self.cluster_name),
            // mock-eci's gRPC API and its exec streams (ws://, on its admin port, whichever
            // API the daemon uses) are plaintext on loopback; a test of the refusal overrides it.
            ("ECI_ALLOW_INSECURE_ENDPOINT", "true"),
            ("METRICS_ADDR", "127.0.0.1:0"),
            // Every daemon on this host serves its kubelet API on 127.0.0.1: a port each.
            ("KUBELET_PORT", &kubelet_port.to_string()),
            ("LEASE_DURATION_SECONDS", "8"),
            ("LEASE_RENEW_INTERVAL", "1s"),
            ("ECI_PROBE_INTERVAL", "250ms"),
            ("ECI_UNREACHABLE_THRESHOLD", "1s"),
            ("NODE_STATUS_MAX_INTERVAL", "60s"),
            ("RUST_LOG", "info"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        env.extend(backend);
        // As the daemon's ServiceAccount: the real RBAC authorizer judges every call.
        env.push((
            "KUBECONFIG".into(),
            self.daemon_kubeconfig.display().to_string(),
        ));
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            // An empty value unsets a default (the AccessKey pair, to sign from a file instead).
            if !value.is_empty() {
                env.push(((*key).to_owned(), (*value).to_owned()));
            }
        }
        Ok(env)
    }

    /// The process name for a new daemon serving node `name`: several processes may serve one
    /// node name over a test (restarts, duplicates).
    fn daemon_process_name(&self, name: &str) -> String {
        match self
            .processes
            .iter()
            .filter(|p| p.name().starts_with(name))
            .count()
        {
            0 => name.to_owned(),
            n => format!("{name}.{n}"),
        }
    }

    /// Where the fixture's kube-scheduler calls the daemon's ResourcePolicy extender (filter,
    /// prioritize, bind under `https://ADDR/resourcepolicy`, trusting `cert_dir/ca.crt`): `Some`
    /// when the binary's fixture was started with [`FixtureOptions::placement_extender`], `None`
    /// otherwise and with `E2E_KUBECONFIG`.
    pub fn placement_extender(&self) -> Option<PlacementExtender> {
        self.placement_extender.clone()
    }

    /// `PLACEMENT_EXTENDER_ADDR` and `PLACEMENT_EXTENDER_CERT_DIR` for [`Self::start_daemon`],
    /// so the elected replica serves the extender where kube-scheduler calls it; empty without
    /// one.
    pub fn placement_env(&self) -> Vec<(String, String)> {
        self.placement_extender
            .as_ref()
            .map(PlacementExtender::env)
            .unwrap_or_default()
    }

    /// The kubelet API port of the daemon process `process` (as [`Self::start_daemon`] named
    /// it), on 127.0.0.1.
    pub fn kubelet_port(&self, process: &str) -> Option<u16> {
        self.kubelet_ports
            .iter()
            .find(|(name, _)| name == process)
            .map(|(_, port)| *port)
    }

    /// Stops mock-eci (SIGTERM) — an ECI outage as the daemons see it.
    pub async fn stop_mock_eci(&mut self) -> Result<(), HarnessError> {
        let process = self
            .process("mock-eci")
            .ok_or_else(|| HarnessError::Setup("mock-eci is not running".into()))?;
        process.terminate(Duration::from_secs(5)).await;
        self.processes.retain(|p| p.name() != "mock-eci");
        Ok(())
    }

    /// Starts mock-eci again on the same ports with the same flags.
    pub async fn restart_mock_eci(&mut self) -> Result<(), HarnessError> {
        let args = self.mock_args.clone();
        let process = Process::spawn(
            "mock-eci",
            &binary("mock-eci", "mock-eci")?,
            &args,
            &[("RUST_LOG".into(), "info".into())],
            self.dir.path(),
        )?;
        self.processes.push(process);
        let admin = self
            .mock
            .as_ref()
            .map(|m| m.admin.as_str())
            .unwrap_or_default();
        let health = HttpCheck::new(format!("{admin}/healthz"));
        self.wait_for("mock-eci to answer again", Duration::from_secs(30), |_| {
            health.clone().passes()
        })
        .await
    }

    /// Makes the daemons started from now on reach mock-eci through `api` (call before
    /// `start_mock_eci`).
    pub fn use_eci_api(&mut self, api: EciApi) {
        self.eci_api = api;
    }

    /// The mock-eci endpoints, once started.
    pub fn mock_eci(&self) -> Option<MockEciEndpoints> {
        self.mock.clone()
    }

    /// The output so far of the process called `name`.
    pub fn process_output(&self, name: &str) -> Option<String> {
        self.processes
            .iter()
            .find(|p| p.name() == name)
            .map(Process::output)
    }

    /// Creates a namespace of the test's own (`vne-e2e-<run id>-<suffix>`), deleted at
    /// [`Self::shutdown`]; tests sharing the cluster stay apart by namespace.
    pub async fn create_namespace(&mut self, suffix: &str) -> Result<String, HarnessError> {
        use k8s_openapi::api::core::v1::Namespace;
        let name = format!("{}-{suffix}", self.daemon_set_name());
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
                .map_err(|e| HarnessError::Setup(e.to_string()))?;
        namespaces
            .create(&kube::api::PostParams::default(), &namespace)
            .await?;
        self.namespaces.push(name.clone());
        // Pods need the namespace's default ServiceAccount, which the controller adds.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), &name);
        self.wait_for(
            &format!("the default ServiceAccount of {name}"),
            Duration::from_secs(60),
            |_| {
                let accounts = accounts.clone();
                async move { accounts.get_opt("default").await.ok().flatten().is_some() }
            },
        )
        .await?;
        Ok(name)
    }

    /// A kubeconfig that authenticates as the daemon's ServiceAccount (deploy/'s RBAC).
    pub fn daemon_kubeconfig(&self) -> &Path {
        &self.daemon_kubeconfig
    }

    /// The fixture's directory: every control-plane component's log, and under `host/pods/`
    /// the host agent's pods (`<namespace>_<pod>/<container>.log` and `.pid`).
    pub fn fixture_dir(&self) -> &Path {
        &self.fixture_dir
    }

    /// kube-apiserver's audit log: every request of the daemon's ServiceAccount at `Metadata`
    /// level (`integration::cluster::audit_policy`), rotated files beside it. `None` with
    /// `E2E_KUBECONFIG`: an existing cluster's audit log is not ours to read.
    pub fn audit_log(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// The output so far of a container the host agent runs (fixture only).
    pub fn pod_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        std::fs::read_to_string(
            self.fixture_dir
                .join("host/pods")
                .join(format!("{namespace}_{pod}"))
                .join(format!("{container}.log")),
        )
        .unwrap_or_default()
    }

    /// kubectl, built from the same Kubernetes release as the fixture.
    pub fn kubectl(&self) -> &Path {
        &self.kubectl
    }

    /// The fixture's cluster or an external one.
    pub fn kind(&self) -> ClusterKind {
        self.kind
    }

    /// A client for the cluster.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The kubeconfig processes should use.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The scratch directory (logs, state files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts mock-eci as a process on free ports, with `extra` flags.
    pub async fn start_mock_eci(
        &mut self,
        extra: &[&str],
    ) -> Result<MockEciEndpoints, HarnessError> {
        let (grpc_port, admin_port) = (free_port()?, free_port()?);
        let grpc = format!("127.0.0.1:{grpc_port}");
        let admin = format!("127.0.0.1:{admin_port}");
        let mut args: Vec<String> = vec![
            "--listen".into(),
            grpc.clone(),
            "--admin-listen".into(),
            admin.clone(),
        ];
        let (openapi, openapi_ca) = if self.eci_api == EciApi::OpenApi {
            let listen = format!("127.0.0.1:{}", free_port()?);
            let tls_dir = self.dir.path().join("mock-eci-openapi-tls");
            args.extend([
                "--openapi-listen".into(),
                listen.clone(),
                "--openapi-tls-dir".into(),
                tls_dir.display().to_string(),
                "--openapi-access-key-id".into(),
                E2E_ACCESS_KEY_ID.into(),
                "--openapi-access-key-secret".into(),
                E2E_ACCESS_KEY_SECRET.into(),
            ]);
            (
                Some(format!("https://{listen}")),
                Some(tls_dir.join("ca.pem")),
            )
        } else {
            (None, None)
        };
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let process = Process::spawn(
            "mock-eci",
            &binary("mock-eci", "mock-eci")?,
            &args,
            &[("RUST_LOG".into(), "info".into())],
            self.dir.path(),
        )?;
        self.processes.push(process);
        self.mock_args = args;
        let endpoints = MockEciEndpoints {
            grpc: format!("http://{grpc}"),
            admin: format!("http://{admin}"),
            openapi,
            openapi_ca,
        };
        let health = HttpCheck::new(format!("{}/healthz", endpoints.admin));
        self.wait_for("mock-eci to answer", Duration::from_secs(30), |_| {
            health.clone().passes()
        })
        .await?;
        self.mock = Some(endpoints.clone());
        Ok(endpoints)
    }

    /// Starts a process the scenario owns (a daemon replica, …).
    pub fn spawn(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
    ) -> Result<(), HarnessError> {
        let process = Process::spawn(name, program, args, envs, self.dir.path())?;
        self.processes.push(process);
        Ok(())
    }

    /// A process by name.
    pub fn process(&mut self, name: &str) -> Option<&mut Process> {
        self.processes.iter_mut().find(|p| p.name() == name)
    }

    /// The pod as JSON, or `None` when it does not exist (or cannot be read right now).
    pub async fn pod_json(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        pods.get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|pod| serde_json::to_value(pod).ok())
    }

    /// Waits up to `timeout` until the pod exists and `check` holds for it (`what` names the
    /// condition in the error), and returns it.
    pub async fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value, HarnessError> {
        let last = parking_lot::Mutex::new(None);
        self.wait_for(&format!("pod {namespace}/{name}: {what}"), timeout, |h| {
            let (check, last) = (&check, &last);
            async move {
                let pod = h.pod_json(namespace, name).await;
                let holds = pod.as_ref().is_some_and(check);
                if holds {
                    *last.lock() = pod;
                }
                holds
            }
        })
        .await?;
        last.into_inner()
            .ok_or_else(|| HarnessError::Setup(format!("pod {namespace}/{name} vanished")))
    }

    /// Waits up to `timeout` until a Warning Event of `reason` on `namespace/name` says each of
    /// `naming`.
    pub async fn wait_warning_event(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
        naming: &[&str],
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        self.wait_event((namespace, name), "Warning", reason, naming, timeout)
            .await
    }

    /// Waits up to `timeout` until an Event of type `kind` and `reason` on `namespace/name`
    /// says each of `naming`.
    pub async fn wait_event(
        &self,
        (namespace, name): (&str, &str),
        kind: &str,
        reason: &str,
        naming: &[&str],
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        let events: Api<Event> = Api::namespaced(self.client(), namespace);
        let what = format!("a {kind} Event {reason} on {namespace}/{name} naming {naming:?}");
        self.wait_for(&what, timeout, |_| {
            let events = events.clone();
            async move {
                events.list(&ListParams::default()).await.is_ok_and(|list| {
                    list.items.iter().any(|e| {
                        e.involved_object.name.as_deref() == Some(name)
                            && e.type_.as_deref() == Some(kind)
                            && e.reason.as_deref() == Some(reason)
                            && e.message
                                .as_deref()
                                .is_some_and(|m| naming.iter().all(|n| m.contains(n)))
                    })
                })
            }
        })
        .await
    }

    /// Waits up to `timeout` until the daemon refused to create `namespace/name`'s group: the
    /// pod is in `phase` with `ContainerInstanceCreated=False` of `reason` saying each of
    /// `naming`, and a Warning Event of that reason says them too. Answers the pod.
    pub async fn wait_refused(
        &self,
        (namespace, name): (&str, &str),
        phase: &str,
        reason: &str,
        naming: &[&str],
        timeout: Duration,
    ) -> Result<Value, HarnessError> {
        let what = format!("{phase} with ContainerInstanceCreated=False, {reason}");
        let pod = self
            .wait_pod(namespace, name, &what, timeout, |p| {
                creation_refused(p, phase, reason, naming)
            })
            .await?;
        self.wait_warning_event(namespace, name, reason, naming, timeout)
            .await?;
        Ok(pod)
    }

    /// Waits up to `timeout` until Node `name` exists and its Ready condition is True.
    pub async fn wait_node_ready(&self, name: &str, timeout: Duration) -> Result<(), HarnessError> {
        let nodes: Api<Node> = Api::all(self.client());
        self.wait_for(&format!("node {name} Ready"), timeout, |_| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|n| deploy::is_ready(&n))
            }
        })
        .await
    }

    /// `kubectl apply --server-side` of a CustomResourceDefinition file (deploy/ ships them),
    /// then waits until the apiserver serves the resource (`Established`).
    pub async fn apply_crd(
        &self,
        file: &Path,
        name: &str,
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        let output = tokio::process::Command::new(self.kubectl())
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(file)
            .output()
            .await
            .map_err(|e| HarnessError::Setup(format!("kubectl apply of {name}: {e}")))?;
        if !output.status.success() {
            return Err(HarnessError::Setup(format!(
                "kubectl apply of {name}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        self.wait_for(
            &format!("the CRD {name} to be established"),
            timeout,
            |_| {
                let crds = crds.clone();
                async move {
                    let conditions = crds
                        .get_opt(name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|crd| crd.status)
                        .and_then(|status| status.conditions)
                        .unwrap_or_default();
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                }
            },
        )
        .await
    }

    /// Polls `condition` until it holds or `timeout` passes.
    pub async fn wait_for<'a, F, Fut>(
        &'a self,
        what: &str,
        timeout: Duration,
        condition: F,
    ) -> Result<(), HarnessError>
    where
        F: Fn(&'a Self) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            if condition(self).await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: what.to_owned(),
                    timeout,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Everything a failing test needs to see: nodes, pods, leases, events, mock-eci's groups
    /// and the last lines of every process.
    pub async fn dump(&self) -> String {
        let mut out = format!(
            "==== e2e dump (API {}; control-plane logs in {}) ====\n",
            self.api_url,
            self.fixture_dir.display()
        );
        let list = |label: &str, value: Result<Value, kube::Error>| {
            format!(
                "---- {label} ----\n{}\n",
                match value {
                    Ok(value) => {
                        serde_json::to_string_pretty(&without_managed_fields(value))
                            .unwrap_or_default()
                    }
                    Err(error) => format!("<{error}>"),
                }
            )
        };
        let params = ListParams::default();
        let nodes: Api<Node> = Api::all(self.client.clone());
        out += &list(
            "nodes",
            nodes
                .list(&params)
                .await
                .map(|l| serde_json::to_value(l.items).unwrap_or_default()),
        );
        let pods: Api<Pod> = Api::all(self.client.clone());
        out += &list(
            "pods",
            pods.list(&params)
                .await
                .map(|l| serde_json::to_value(l.items).unwrap_or_default()),
        );
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        out += &list(
            "leases",
            leases
                .list(&params)
                .await
                .map(|l| serde_json::to_value(l.items).unwrap_or_default()),
        );
        let events: Api<Event> = Api::all(self.client.clone());
        out += &list(
            "events",
            events
                .list(&params)
                .await
                .map(|l| serde_json::to_value(l.items).unwrap_or_default()),
        );
        if let Some(mock) = &self.mock {
            let groups = match reqwest::get(format!("{}/admin/groups", mock.admin)).await {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(error) => format!("<{error}>"),
            };
            out += &format!("---- mock-eci groups ----\n{groups}\n");
        }
        for process in &self.processes {
            out += &format!(
                "---- last lines of {} ----\n{}\n",
                process.name(),
                process.tail(40)
            );
        }
        out
    }

    /// Ends a scenario with its `result`: on failure prints the error, the fixture's state
    /// ([`Self::dump`]) and the error once more; shuts the harness down either way; then fails
    /// the test.
    ///
    /// CI shows only the beginning and the end of a failing test's output, so the error opens
    /// and closes it. The test fails through `resume_unwind`, which skips the panic hook: its
    /// backtrace of the runtime's frames would fill the end of the output and says nothing
    /// the error does not.
    ///
    /// # Panics
    /// When `result` is an error: this ends a test's body.
    #[allow(clippy::print_stderr)]
    pub async fn finish(self, result: Result<(), HarnessError>) {
        let failure = result.err().map(|error| error_chain(&error));
        if let Some(failure) = &failure {
            eprintln!("==== scenario failed: {failure}");
            eprintln!("{}", self.dump().await);
            eprintln!("==== scenario failed: {failure}");
        }
        self.shutdown(Duration::from_secs(10)).await;
        if let Some(failure) = failure {
            std::panic::resume_unwind(Box::new(failure));
        }
    }

    /// Stops every process (SIGTERM, then SIGKILL after `grace`), then deletes the Nodes,
    /// Leases and StatefulSet the test created (the cluster outlives the test).
    pub async fn shutdown(mut self, grace: Duration) {
        for process in self.processes.iter_mut().rev() {
            process.terminate(grace).await;
        }
        {
            let nodes: Api<Node> = Api::all(self.client.clone());
            let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
            let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
                Api::namespaced(self.client.clone(), "kube-system");
            let _ = sets
                .delete(
                    &self.daemon_set_name(),
                    &kube::api::DeleteParams::background(),
                )
                .await;
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
                Api::all(self.client.clone());
            for name in &self.namespaces {
                let _ = namespaces
                    .delete(name, &kube::api::DeleteParams::background())
                    .await;
            }
            for name in &self.node_names {
                let _ = nodes
                    .delete(name, &kube::api::DeleteParams::default())
                    .await;
                let _ = leases
                    .delete(name, &kube::api::DeleteParams::default())
                    .await;
            }
        }
    }
}

/// Whether `pod` (as JSON) is in `phase` with `ContainerInstanceCreated=False` of `reason`, its
/// message saying each of `naming`: how the daemon shows a group it would not create.
pub fn creation_refused(pod: &Value, phase: &str, reason: &str, naming: &[&str]) -> bool {
    pod["status"]["phase"] == phase
        && pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "ContainerInstanceCreated"
                    && c["status"] == "False"
                    && c["reason"] == reason
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| naming.iter().all(|n| m.contains(n)))
            })
}
