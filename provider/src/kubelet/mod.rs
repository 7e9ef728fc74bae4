//! The kubelet API of the virtual node: HTTPS on the address the Node advertises (InternalIP,
//! `KUBELET_PORT`), its serving certificate, authentication and authorization as the kubelet
//! does them, container logs from ECI, `/pods`, `/runningpods/`, `/healthz`, and the metrics and streaming routes
//! (`metrics`, `streams`) merged behind the same guard. May call `k8s`, `eci`, `ops`, `config`, and `pods` for which group runs a pod.

pub mod auth;
pub mod certs;
pub mod logs;
pub mod pod_lookup;
pub mod resource_metrics;
pub use spdy_serve as spdy;
pub mod streams;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use tls_serve::{ClientAuth, Limits, TlsServer};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, info_span};

use crate::config::{KubeletArgs, WithSite};
use crate::eci::Backend;
use crate::k8s::shared_watch::SharedWatch;
use crate::ops::metrics::Telemetry;
use crate::pods::GroupDirectory;

/// The kubelet API cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The listen address is taken or not ours.
    #[error(
        "--kubelet-port/--kubelet-address (KUBELET_PORT/KUBELET_ADDRESS): cannot listen on {address}; choose a free port or an address of this host"
    )]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No serving certificate.
    #[error("kubelet API serving certificate")]
    Certificate(#[from] certs::CertError),
    /// The TLS configuration was refused.
    #[error("kubelet API TLS")]
    Tls(#[from] tls_serve::ServerError),
}

/// What every handler of the kubelet API shares (cheap to clone).
#[derive(Clone)]
pub struct KubeletState {
    /// This node's part of the configuration.
    pub config: Arc<WithSite<KubeletArgs>>,
    /// The Kubernetes API, as the daemon.
    pub client: kube::Client,
    /// ECI.
    pub eci: Backend,
    /// Which group runs which pod, as the pod controller created or adopted them.
    pub groups: GroupDirectory,
    /// This node's pods, one watch shared with the pod controller.
    pub node_pods: Arc<SharedWatch<Pod>>,
    /// The daemon's metrics.
    pub telemetry: Arc<Telemetry>,
    /// Authentication and authorization (applied to every route by [`router`]).
    pub guard: Arc<auth::Guard>,
    /// Cancelled when the daemon stops: long responses (log follows, streams) end with it.
    pub stop: CancellationToken,
}

impl std::fmt::Debug for KubeletState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletState")
            .field("node", &self.config.site.node_name)
            .finish_non_exhaustive()
    }
}

/// What any caller may hold before the guard has judged it: no route takes a body (streams
/// upgrade the connection), and log follows, exec and port-forward keep connections open for
/// long, so room for many connections and little for bodies.
const LIMITS: Limits = Limits {
    connections: 1024,
    header_read: std::time::Duration::from_secs(10),
    body_bytes: 64 * 1024,
    body_read: std::time::Duration::from_secs(10),
    buffered_bytes: 1024 * 1024,
};

/// Every route of the kubelet API, each request in its own span.
pub fn router(state: KubeletState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pod_lookup::list))
        // The kubelet's go-restful route answers both; client-go's `Suffix("runningpods/")`
        // (virtual-kubelet's e2e suite) sends the path without its slash.
        .route("/runningpods/", get(pod_lookup::running))
        .route("/runningpods", get(pod_lookup::running))
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs::container_logs),
        )
        .merge(resource_metrics::routes())
        .merge(streams::routes())
        .fallback(not_found)
        // Every path, the unknown ones too, is behind the guard, as on a kubelet.
        .layer(middleware::from_fn_with_state(state.clone(), auth::guard))
        .layer(middleware::from_fn(request_span))
        .with_state(state)
}

/// What the kubelet answers for a path it does not serve.
async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
}

/// One span per request: method and path (never the query: exec commands travel in it).
async fn request_span(request: Request, next: Next) -> Response {
    let span = info_span!(
        "kubelet_api",
        method = %request.method(),
        path = %request.uri().path(),
        user = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    async move {
        let response = next.run(request).await;
        tracing::Span::current().record("status", response.status().as_u16());
        response
    }
    .instrument(span)
    .await
}

/// Serves the kubelet API until `stop`.
pub async fn run(
    config: WithSite<KubeletArgs>,
    client: kube::Client,
    eci: Backend,
    groups: GroupDirectory,
    node_pods: Arc<SharedWatch<Pod>>,
    telemetry: Arc<Telemetry>,
    stop: CancellationToken,
) -> Result<(), KubeletError> {
    let address = config.args.listen(&config.site);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| KubeletError::Listen { address, source })?;
    let (certificate, keep_certificate) = certs::serving(&config, client.clone(), stop.clone())?;
    let server = TlsServer::new(
        certificate,
        ClientAuth::Verify(Arc::new(auth::RequestClientCertificate::default())),
    )?
    .with_limits(LIMITS);
    let client_ca = Arc::new(auth::ClientCa::default());
    let ca_source = match &config.args.kubelet_client_ca_file {
        Some(path) => auth::ClientCaSource::File(path.clone()),
        None => auth::ClientCaSource::Cluster(client.clone()),
    };
    // Loaded before the first request, so the apiserver's first call is not refused.
    ca_source.load_into(&client_ca).await;
    let guard = Arc::new(auth::Guard::new(
        config.site.node_name.clone(),
        Arc::new(auth::ApiReviewer::new(client.clone())),
        Arc::clone(&client_ca),
    ));
    let state = KubeletState {
        config: Arc::new(config),
        client,
        eci,
        groups,
        node_pods,
        telemetry,
        guard,
        stop: stop.clone(),
    };
    info!(%address, "serving the kubelet API");
    tokio::join!(
        server.serve(listener, router(state), stop.clone()),
        keep_certificate,
        ca_source.keep_current(client_ca, stop),
    );
    Ok(())
}
