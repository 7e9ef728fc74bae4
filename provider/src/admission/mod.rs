//! Placement at admission: the HTTPS webhook the API server calls, which runs the
//! eci-profile `Selector` engine (pure, `vne_core::selector`) on watch-fed caches, with its
//! registration, the seal on deferred Selector effects (`seal`) and the normalNodePrefer spill
//! watcher. May call `k8s`, `ops`, `config`.

pub mod cache;
pub mod register;
pub mod review;
pub mod seal;
pub mod spill;
pub mod webhook;
pub mod webhook_callers;

pub use webhook::{KUBE_API, run};
