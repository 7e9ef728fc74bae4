//! `/healthz` and `/readyz` for the probes, and the read-only port (opt-in): the same plus
//! Prometheus `/metrics`. Plain HTTP, each through `tls_serve::PlainServer` and its limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tls_serve::{Limits, PlainServer};
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

/// The probes' routes.
pub fn probes(readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_only))
        .with_state(readiness)
}

async fn readyz_only(State(readiness): State<Arc<Readiness>>) -> Response {
    ready(&readiness)
}

/// The read-only port's routes.
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
    ready(&ops.readiness)
}

fn ready(readiness: &Readiness) -> Response {
    if readiness.serving.load(Ordering::SeqCst) {
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
        [(header::CONTENT_TYPE, crate::ops::metrics::CONTENT_TYPE)],
        ops.telemetry.render(),
    )
        .into_response()
}

/// What any caller may hold: the routes take no body and answer at once.
const LIMITS: Limits = Limits {
    connections: 128,
    header_read: std::time::Duration::from_secs(10),
    body_bytes: 16 * 1024,
    body_read: std::time::Duration::from_secs(10),
    buffered_bytes: 256 * 1024,
};

/// Serves until cancelled.
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) {
    PlainServer::new(LIMITS).serve(listener, router, stop).await;
}
