//! The pods bound to this node, run as ECI container groups: the controller (watch, create,
//! status sync, delete) and what it shares; the pure translation both ways is vne-core's
//! (`vne_core::to_eci`, `vne_core::from_eci`). May call `k8s`, `eci`, `ops`, `config` and
//! `vne_core`; nothing here knows about nodes or the fleet.

mod controller;
pub mod services;
mod slim;
pub mod sources;
pub mod tenancy;
pub mod tokens;
pub mod workqueue;

pub use controller::{
    GroupDirectory, INSTANCE_ANNOTATION, KUBE_API, PROVIDER_FAILED, PodController,
};
