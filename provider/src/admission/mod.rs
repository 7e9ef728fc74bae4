//! Placement at admission: the eci-profile `Selector` engine (pure) and the HTTPS webhook the
//! API server calls, with its registration, watch-fed caches and the
//! normalNodePrefer spill watcher. May call `k8s`, `ops`, `config`.

pub mod cache;
pub mod register;
pub mod review;
pub mod selector;
pub mod spill;
pub mod webhook;
pub mod webhook_callers;

pub use webhook::{KUBE_API, run};
