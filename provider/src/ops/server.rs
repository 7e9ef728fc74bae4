//! `/healthz`, `/readyz` and Prometheus `/metrics`, on their own port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::ops::metrics::Telemetry;

/// What `/readyz` checks.
#[derive(Debug, Default)]
pub struct Readiness {
    /// The Node is registered and the Lease held.
    pub serving: AtomicBool,
}

#[derive(Debug, Clone)]
struct Ops {
    telemetry: Arc<Telemetry>,
    readiness: Arc<Readiness>,
}

/// The ops routes.
pub fn router(telemetry: Arc<Telemetry>, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Ops {
            telemetry,
            readiness,
        })
}

async fn readyz(State(ops): State<Ops>) -> Response {
    if ops.readiness.serving.load(Ordering::SeqCst) {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not serving yet: the node is not registered or the Lease is not held",
        )
            .into_response()
    }
}

async fn metrics(State(ops): State<Ops>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ops.telemetry.render(),
    )
        .into_response()
}

/// Serves until cancelled.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}
