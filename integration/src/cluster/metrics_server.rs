//! metrics-server in the fixture (the Metrics API behind `kubectl top` and the HPA): a child
//! process like the other components, registered as the aggregated API
//! `v1beta1.metrics.k8s.io`, scraping every node's kubelet API as the upstream manifests set
//! it up — its own identity, with the upstream RBAC.
//!
//! Routing without a cluster network: the API refuses loopback addresses in Endpoints and
//! EndpointSlices (`ValidateEndpointIP`), so `--enable-aggregator-routing` (which routes to an
//! endpoint) cannot reach a process on this host. The fixture's Service range is loopback,
//! though, so metrics-server listens on its Service's ClusterIP itself and the apiserver keeps
//! its default, routing to the ClusterIP. The Service is a `NodePort` one because the
//! aggregator's availability check demands ready endpoints of `ClusterIP`-type Services only;
//! the node port is allocated and never used (no kube-proxy here).

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{
    ClusterError, ControlPlane, ControlPlaneOptions, Pki, display, kubeconfig, pki, write,
};
use crate::process::free_port;

/// The aggregated API metrics-server serves.
pub const API_SERVICE: &str = "v1beta1.metrics.k8s.io";
/// Its Service, `kube-system/metrics-server`.
pub const SERVICE: (&str, &str) = ("kube-system", "metrics-server");
/// How often it scrapes every node: `--metric-resolution`, at metrics-server's minimum (it
/// refuses less than 10 s), so `kubectl top` and the HPA follow a change within seconds.
pub const RESOLUTION: Duration = Duration::from_secs(10);

/// Creates `value` as a `K`, accepting one that exists already.
async fn create<K>(api: &Api<K>, value: serde_json::Value) -> Result<(), ClusterError>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The upstream manifests' RBAC for metrics-server's user: read pods and nodes, scrape
/// `nodes/metrics`, delegate authentication and authorization of its own API to the apiserver.
async fn grant(client: &kube::Client) -> Result<(), ClusterError> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
    let user = json!([{
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "User",
        "name": pki::METRICS_SERVER_USER,
    }]);
    create(
        &Api::<ClusterRole>::all(client.clone()),
        json!({
            "metadata": {"name": "system:metrics-server"},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            ],
        }),
    )
    .await?;
    for (name, role) in [
        ("system:metrics-server", "system:metrics-server"),
        (
            "metrics-server:system:auth-delegator",
            "system:auth-delegator",
        ),
    ] {
        create(
            &Api::<ClusterRoleBinding>::all(client.clone()),
            json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": user,
            }),
        )
        .await?;
    }
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), "kube-system"),
        json!({
            "metadata": {"name": "metrics-server-auth-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": user,
        }),
    )
    .await
}

/// Creates metrics-server's Service on `port`; answers its ClusterIP, which metrics-server
/// listens on itself (see the module's doc).
async fn create_service(client: &kube::Client, port: u16) -> Result<String, ClusterError> {
    let services: Api<Service> = Api::namespaced(client.clone(), SERVICE.0);
    create(
        &services,
        json!({
            "metadata": {"name": SERVICE.1, "labels": {"k8s-app": "metrics-server"}},
            "spec": {
                "type": "NodePort",
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        }),
    )
    .await?;
    Ok(services
        .get(SERVICE.1)
        .await?
        .spec
        .and_then(|spec| spec.cluster_ip)
        .unwrap_or_default())
}

/// metrics-server's flags: serving on `cluster_ip:port`, as its own user through `kubeconfig`.
fn flags(pki: &Pki, cluster_ip: &str, port: u16, kubeconfig: &str) -> Vec<String> {
    vec![
        format!("--bind-address={cluster_ip}"),
        format!("--secure-port={port}"),
        // Signed by the cluster CA for metrics-server.kube-system.svc, the name the
        // aggregator checks (the APIService's caBundle is that CA).
        format!(
            "--tls-cert-file={}",
            display(&pki.metrics_server_serving.cert)
        ),
        format!(
            "--tls-private-key-file={}",
            display(&pki.metrics_server_serving.key)
        ),
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        // The virtual nodes serve their kubelet API with a self-signed certificate
        // until their kubelet-serving CSR is approved (nothing in the fixture approves
        // it) or KUBELET_CERT_DIR gives them one, so there is no CA to verify it with;
        // the upstream manifests' test setting. Client authentication (metrics-server's
        // certificate, authorized for nodes/metrics) still applies.
        "--kubelet-insecure-tls".into(),
        "--kubelet-preferred-address-types=InternalIP".into(),
        // Every daemon of a test serves its kubelet API on 127.0.0.1 at a port of its
        // own, which its Node advertises.
        "--kubelet-use-node-status-port".into(),
        format!("--metric-resolution={}s", RESOLUTION.as_secs()),
        // Below 90 % of the resolution, as metrics-server requires.
        "--kubelet-request-timeout=5s".into(),
    ]
}

/// Registers the aggregated API [`API_SERVICE`] at the Service's `port`, trusting the
/// cluster CA at `ca_cert`.
async fn register_api_service(
    client: &kube::Client,
    ca_cert: &Path,
    port: u16,
) -> Result<(), ClusterError> {
    let ca = std::fs::read(ca_cert).map_err(|source| ClusterError::Read {
        path: ca_cert.to_path_buf(),
        source,
    })?;
    create(
        &Api::<APIService>::all(client.clone()),
        json!({
            "metadata": {"name": API_SERVICE, "labels": {"k8s-app": "metrics-server"}},
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": {"namespace": SERVICE.0, "name": SERVICE.1, "port": port},
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }),
    )
    .await
}

impl ControlPlane {
    /// Starts metrics-server and waits until the apiserver reports its API available.
    pub(super) async fn start_metrics_server(
        &mut self,
        options: &ControlPlaneOptions,
    ) -> Result<(), ClusterError> {
        let client = self.client().await?;
        grant(&client).await?;
        let port = free_port()?;
        let cluster_ip = create_service(&client, port).await?;
        let kubeconfig_path = self.write_metrics_server_kubeconfig()?;
        let program = self.upstream.path("metrics-server")?.to_owned();
        let flags = flags(&self.pki, &cluster_ip, port, &kubeconfig_path);
        self.spawn("metrics-server", &program, &flags)?;
        register_api_service(&client, &self.pki.ca.cert, port).await?;
        let api_services: Api<APIService> = Api::all(client);
        self.wait_ready(
            "metrics-server (APIService v1beta1.metrics.k8s.io Available)",
            options.ready_timeout,
            || {
                let api_services = api_services.clone();
                async move { available(&api_services).await }
            },
        )
        .await
    }

    /// Writes metrics-server's kubeconfig (its own client certificate); answers its path.
    fn write_metrics_server_kubeconfig(&self) -> Result<String, ClusterError> {
        let path = self.dir.join("metrics-server.kubeconfig");
        write(
            &path,
            &kubeconfig(
                &self.server(),
                &self.pki.ca.cert,
                &self.pki.metrics_server,
                "metrics-server",
            ),
        )?;
        Ok(display(&path))
    }
}

/// Whether the apiserver reports the Metrics API available.
pub async fn available(api_services: &Api<APIService>) -> bool {
    api_services
        .get_opt(API_SERVICE)
        .await
        .ok()
        .flatten()
        .and_then(|service| service.status)
        .and_then(|status| status.conditions)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
        })
}
