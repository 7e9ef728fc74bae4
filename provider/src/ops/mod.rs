//! What operators see: Prometheus metrics, Kubernetes Events, and the `/healthz`, `/readyz`,
//! `/metrics` server; the supervisor every long-running task runs under, and retry delays. A leaf every area may call; it calls nothing of theirs.

pub mod chain;
pub mod events;
pub mod metrics;
pub mod retry;
pub mod server;
pub mod supervisor;
