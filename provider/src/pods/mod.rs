//! The pods bound to this node, run as ECI container groups: the controller (watch, create,
//! status sync, delete), the pure translation from ECI (`from_eci`; the one to ECI is
//! `vne_core::to_eci`) and what they share. May call `k8s`, `eci`, `ops`, `config` and
//! `vne_core`; nothing here knows about nodes or the fleet.

mod controller;
pub mod from_eci;
pub mod services;
mod slim;
pub mod sources;
pub mod tenancy;
pub mod tokens;
pub mod workqueue;

pub use controller::{
    GroupDirectory, INSTANCE_ANNOTATION, KUBE_API, PROVIDER_FAILED, PodController,
};
