//! The kubelet's streaming endpoints (`/exec`, `/attach`, `/portForward`): routes are added
//! here and merged by `kubelet::router`, behind its authentication and authorization.

use axum::Router;

use super::KubeletState;

/// The streaming routes (none yet).
pub fn routes() -> Router<KubeletState> {
    Router::new()
}
