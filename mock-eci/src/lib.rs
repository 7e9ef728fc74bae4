//! mock-eci: a local fake of the Alibaba Cloud ECI API, served over gRPC.
//!
//! It behaves like the real service where providers break: provisioning takes time, calls are
//! throttled, capacity runs out, retries must be idempotent, containers exit and restart, groups
//! vanish. Everything is deterministic: timing follows tokio's (pausable) clock, ids and delays
//! follow `--seed`, container behaviour follows reserved variables ([`behaviour`]).

pub mod actions;
pub mod admin;
pub mod behaviour;
pub mod clock;
pub mod config;
pub mod controls;
pub mod echo;
pub mod engine;
pub mod exec;
pub mod exec_session;
pub mod group;
pub mod logs;
pub mod openapi;
pub mod persist;
pub mod render;
pub mod rng;
pub mod server;
pub mod service;
pub mod settings;
pub mod telemetry;
pub mod timers;
pub mod usage;
pub mod validate;

pub use config::MockConfig;
pub use server::{MockServer, ServeError};
pub use service::MockEci;
