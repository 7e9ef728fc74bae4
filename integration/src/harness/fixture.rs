//! The cluster under a test binary: one real control plane per test binary (tests isolate
//! themselves by namespace and by unique node names), run by the `playground` binary in its
//! `--bare --stop-on-stdin-eof` mode. The test process holds the playground's stdin: when the
//! test process ends — passing, panicking or killed — the pipe closes and the playground stops
//! every component, so nothing is left behind. With `E2E_KUBECONFIG` the suite uses that
//! cluster instead. Either way the daemon's RBAC from `deploy/base` is applied once and the
//! daemons run with a token of its ServiceAccount, so the real authorizer judges every call.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;

use super::HarnessError;
use crate::cluster::{PlacementExtender, Upstream, client_for};
use crate::process::binary;

/// The daemon's ServiceAccount (`deploy/base/serviceaccount.yaml`).
pub const DAEMON_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "virtual-node-eci");

/// What a test binary's fixture runs besides the control plane, the host node and the ECS
/// nodes. The first test of a binary to start a harness decides (the cluster is shared).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixtureOptions {
    /// metrics-server (the Metrics API behind `kubectl top` and the HPA).
    pub metrics_server: bool,
    /// kube-scheduler calls the daemon's ResourcePolicy extender over HTTPS
    /// ([`super::Harness::placement_extender`]; daemons serve it when started with
    /// [`super::Harness::placement_env`]).
    pub placement_extender: bool,
    /// No audit log of the daemon's requests (a benchmark's fixture: kwok's requests are not
    /// audited either); [`super::Harness::audit_log`] is then `None`.
    pub without_audit_log: bool,
}

/// What every test of this binary shares.
#[derive(Debug)]
pub(super) struct Shared {
    /// The administrator's kubeconfig.
    pub(super) kubeconfig: PathBuf,
    /// A kubeconfig authenticating as the daemon's ServiceAccount.
    pub(super) daemon_kubeconfig: PathBuf,
    /// kubectl and the other upstream binaries.
    pub(super) upstream: Upstream,
    /// True for the fixture (host node, kwok); false for `E2E_KUBECONFIG`.
    pub(super) fixture: bool,
    /// The playground's directory (component logs), for the fixture.
    pub(super) dir: PathBuf,
    /// Where kube-scheduler calls the daemon's extender, when the fixture has it.
    pub(super) placement_extender: Option<PlacementExtender>,
    /// kube-apiserver's audit log of the daemon's requests, for the fixture.
    pub(super) audit_log: Option<PathBuf>,
    /// Kept for the life of the process: dropping neither closes nor waits.
    _supervisor: Option<std::process::Child>,
    _tempdir: tempfile::TempDir,
}

static SHARED: OnceCell<Shared> = OnceCell::const_new();

/// The shared cluster, started by the first test that asks.
pub(super) async fn shared() -> Result<&'static Shared, HarnessError> {
    shared_with(FixtureOptions::default()).await
}

/// The shared cluster, started with `options` if this is the first ask.
pub(super) async fn shared_with(options: FixtureOptions) -> Result<&'static Shared, HarnessError> {
    SHARED.get_or_try_init(|| start(options)).await
}

fn setup(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// A control plane of its own, independent of the binary's shared one (its own playground,
/// directory, ports, etcd and CA; the daemon's RBAC applied), even with `E2E_KUBECONFIG`: a
/// second cluster for tests of two clusters on one ECI account. It stops when dropped.
pub(super) async fn independent(options: FixtureOptions) -> Result<Shared, HarnessError> {
    start_cluster(options, false).await
}

async fn start(options: FixtureOptions) -> Result<Shared, HarnessError> {
    start_cluster(options, true).await
}

async fn start_cluster(
    options: FixtureOptions,
    external_allowed: bool,
) -> Result<Shared, HarnessError> {
    let upstream = Upstream::locate()
        .await
        .map_err(|e| setup(format!("upstream binaries: {e}")))?;
    let tempdir = tempfile::tempdir().map_err(|source| HarnessError::Io {
        what: "create the fixture's directory".into(),
        source,
    })?;
    let dir = tempdir.path().to_owned();
    let flag = |on: bool| if on { "true" } else { "false" };
    let external = std::env::var_os("E2E_KUBECONFIG").filter(|_| external_allowed);
    let (kubeconfig, supervisor, fixture) = if let Some(path) = external {
        (PathBuf::from(path), None, false)
    } else {
        let mut child = std::process::Command::new(binary("integration", "playground")?)
            .args(["--bare", "--stop-on-stdin-eof", "--ecs-nodes", "2"])
            .args(["--metrics-server", flag(options.metrics_server)])
            .args(["--placement-extender", flag(options.placement_extender)])
            .args(["--audit-log", flag(!options.without_audit_log)])
            .arg("--dir")
            .arg(&dir)
            // The directory (logs, PKI, the host's pods) goes with the playground unless asked
            // to stay for a post-mortem; a failing test prints the tails it needs first.
            .args(if std::env::var_os("E2E_KEEP_DIR").is_some() {
                None
            } else {
                Some("--remove-dir-on-exit")
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.join("playground.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::inherit()),
            )
            .spawn()
            .map_err(|source| HarnessError::Io {
                what: "start the playground".into(),
                source,
            })?;
        wait_env(&dir, &mut child).await?;
        (dir.join("kubeconfig"), Some(child), true)
    };
    let kubectl = upstream
        .path("kubectl")
        .map_err(|e| setup(e.to_string()))?
        .to_owned();
    // Written by the playground's control plane next to its kubeconfig; none in `E2E_KUBECONFIG`'s
    // fresh directory.
    let placement_extender = PlacementExtender::read(&dir)
        .map_err(|e| setup(format!("{e}: {:?}", std::error::Error::source(&e))))?;
    apply_daemon_rbac(&kubectl, &kubeconfig).await?;
    let daemon_kubeconfig = dir.join("daemon.kubeconfig");
    write_daemon_kubeconfig(&kubeconfig, &daemon_kubeconfig).await?;
    Ok(Shared {
        kubeconfig,
        daemon_kubeconfig,
        upstream,
        fixture,
        audit_log: (fixture && !options.without_audit_log)
            .then(|| dir.join(crate::cluster::AUDIT_LOG)),
        dir,
        placement_extender,
        _supervisor: supervisor,
        _tempdir: tempdir,
    })
}

/// Waits for the playground's `env` file (written once everything is Ready).
async fn wait_env(dir: &Path, child: &mut std::process::Child) -> Result<(), HarnessError> {
    // A cold first run builds the upstream binaries (minutes); a warm start takes seconds.
    let timeout = Duration::from_secs(60 * 30);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if dir.join("env").exists() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("playground.log")).unwrap_or_default();
            return Err(setup(format!(
                "the playground exited ({status}) before the cluster was ready:\n{log}"
            )));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(HarnessError::Timeout {
                what: "the control plane".into(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `kubectl apply` of the daemon's ServiceAccount and RBAC as deploy/ ships them.
async fn apply_daemon_rbac(kubectl: &Path, kubeconfig: &Path) -> Result<(), HarnessError> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base");
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "--server-side", "--force-conflicts"])
        .arg("-f")
        .arg(base.join("serviceaccount.yaml"))
        .arg("-f")
        .arg(base.join("rbac.yaml"))
        .arg("-f")
        .arg(base.join("selector-crd.yaml"))
        .output()
        .await
        .map_err(|source| HarnessError::Io {
            what: "run kubectl apply".into(),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(setup(format!(
            "kubectl apply of deploy/base RBAC failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// A kubeconfig for the admin's cluster whose user is a (12 h) token of the daemon's
/// ServiceAccount, issued through TokenRequest.
async fn write_daemon_kubeconfig(admin: &Path, out: &Path) -> Result<(), HarnessError> {
    write_service_account_kubeconfig(admin, DAEMON_SERVICE_ACCOUNT, out)
        .await
        .map(drop)
}

/// A kubeconfig for the admin's cluster whose user is a (12 h) TokenRequest token of the
/// ServiceAccount `account` (namespace, name): what a user holding only that account's
/// rights would have. Returns the token.
pub(super) async fn write_service_account_kubeconfig(
    admin: &Path,
    account: (&str, &str),
    out: &Path,
) -> Result<String, HarnessError> {
    let client = client_for(admin)
        .await
        .map_err(|e| setup(format!("{e}: {:?}", std::error::Error::source(&e))))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, account.0);
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 12 * 3600},
    }))
    .map_err(|e| setup(e.to_string()))?;
    let token = accounts
        .create_token_request(account.1, &PostParams::default(), &request)
        .await?
        .status
        .map(|s| s.token)
        .ok_or_else(|| setup("TokenRequest answered without a token"))?;
    let mut config = kube::config::Kubeconfig::read_from(admin)
        .map_err(|e| setup(format!("read {}: {e}", admin.display())))?;
    let context_name = config.current_context.clone().unwrap_or_default();
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| setup(format!("{} has no current context", admin.display())))?;
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .cloned()
        .ok_or_else(|| setup(format!("{} names no cluster", admin.display())))?;
    config.clusters = vec![cluster];
    let user = account.1;
    let value = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": serde_json::to_value(&config.clusters).map_err(|e| setup(e.to_string()))?,
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": context.cluster, "user": user}}],
        "current-context": user,
    });
    std::fs::write(out, value.to_string()).map_err(|source| HarnessError::Io {
        what: format!("write {}", out.display()),
        source,
    })?;
    Ok(token)
}
