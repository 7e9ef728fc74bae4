//! A hostile tenant: a user who may do everything in their own namespace and nothing else —
//! the ServiceAccount `tenant` of that namespace, bound by a RoleBinding to the built-in
//! `admin` ClusterRole, exactly as platform teams hand out namespaces. Tests run kubectl and
//! kube clients with this user's own token, so the real authorizer judges every attack, and
//! ask the same questions of the daemon's listeners with the same token.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::AsyncWriteExt as _;

use super::{Harness, HarnessError};

/// The ServiceAccount a tenant acts as, in their own namespace.
pub const TENANT_ACCOUNT: &str = "tenant";

/// How long one tenant kubectl call may take before the test fails.
const KUBECTL_BOUND: Duration = Duration::from_secs(60);

/// A namespace-admin user of one namespace.
#[derive(Clone)]
pub struct Tenant {
    namespace: String,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    client: kube::Client,
    token: String,
}

/// Shows where the tenant acts, never its token.
impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("namespace", &self.namespace)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

/// What one kubectl call did.
#[derive(Debug, Clone)]
pub struct KubectlRun {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl KubectlRun {
    /// Whether kubectl exited 0.
    pub fn succeeded(&self) -> bool {
        self.code == Some(0)
    }
}

impl Harness {
    /// Creates a namespace of the test's own (see [`Harness::create_namespace`]) and a tenant
    /// who administers it and nothing else.
    pub async fn create_tenant(&mut self, suffix: &str) -> Result<Tenant, HarnessError> {
        let namespace = self.create_namespace(suffix).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), &namespace);
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": TENANT_ACCOUNT}}))
                .map_err(|e| HarnessError::Setup(e.to_string()))?;
        accounts.create(&PostParams::default(), &account).await?;
        let bindings: Api<RoleBinding> = Api::namespaced(self.client(), &namespace);
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "tenant-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "ServiceAccount", "name": TENANT_ACCOUNT, "namespace": namespace}],
        }))
        .map_err(|e| HarnessError::Setup(e.to_string()))?;
        bindings.create(&PostParams::default(), &binding).await?;
        let kubeconfig = self.dir().join(format!("tenant-{namespace}.kubeconfig"));
        let token = super::fixture::write_service_account_kubeconfig(
            self.kubeconfig(),
            (&namespace, TENANT_ACCOUNT),
            &kubeconfig,
        )
        .await?;
        let (client, _) = super::client_for(&kubeconfig).await?;
        Ok(Tenant {
            namespace,
            kubeconfig,
            kubectl: self.kubectl().to_path_buf(),
            client,
            token,
        })
    }
}

impl Tenant {
    /// The tenant's own namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A kubeconfig holding the tenant's token and nothing more.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client acting as the tenant.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The tenant's bearer token, as the tenant would present it to any listener it reaches.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Runs kubectl as the tenant with `stdin` as its input; fails the call (not the test)
    /// when kubectl does not end within a minute.
    pub async fn kubectl(&self, args: &[&str], stdin: &[u8]) -> Result<KubectlRun, HarnessError> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HarnessError::Io { what, source }
        };
        let mut child = tokio::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("start kubectl as the tenant"))?;
        if let Some(mut input) = child.stdin.take() {
            input
                .write_all(stdin)
                .await
                .map_err(io("write kubectl's stdin"))?;
        }
        let output = tokio::time::timeout(KUBECTL_BOUND, child.wait_with_output())
            .await
            .map_err(|_| {
                HarnessError::Setup(format!(
                    "kubectl {args:?} as the tenant ran past {KUBECTL_BOUND:?}"
                ))
            })?
            .map_err(io("wait for kubectl"))?;
        Ok(KubectlRun {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}
