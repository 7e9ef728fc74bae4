//! The kubelet's metrics endpoints (`/metrics/resource`, `/stats/summary`): routes are added
//! here and merged by `kubelet::router`, behind its authentication and authorization.

use axum::Router;

use super::KubeletState;

/// The metrics routes (none yet).
pub fn routes() -> Router<KubeletState> {
    Router::new()
}
