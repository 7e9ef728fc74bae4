//! mock-eci: a local fake of the Alibaba Cloud ECI API, served over gRPC.
//!
//! It behaves like the real service where providers break: provisioning takes time, calls are
//! throttled, capacity runs out, retries must be idempotent, containers exit and restart, groups
//! vanish. Everything is deterministic: timing follows tokio's (pausable) clock, ids and delays
//! follow `--seed`, container behaviour follows reserved variables ([`engine::behaviour`]).
//!
//! The folders show the flow, one way (`tests/layout.rs` checks it):
//! - [`fronts`]: what listens — gRPC wiring, the OpenAPI front, the admin API, exec-session
//!   WebSockets, echo listeners;
//! - [`service`]: the shared [`MockEci`] handle — locking, controls, telemetry, the state file;
//! - [`engine`]: the pure state machine — groups, timers, checks, answers, usage, logs;
//! - [`sandbox`]: the real runtime's edge — namespaces, a bridge, OCI bundles run by an OCI
//!   runtime; it uses the leaves only, the service will drive it;
//! - shared leaves any of them may use: [`actions`], [`clock`], [`rng`], [`settings`].

pub mod actions;
pub mod clock;
pub mod engine;
pub mod fronts;
pub mod images;
pub mod rng;
pub mod sandbox;
pub mod service;
pub mod settings;

pub use engine::validate;
pub use fronts::{MockServer, ServeError};
pub use service::config::MockConfig;
pub use service::{MockEci, persist};
