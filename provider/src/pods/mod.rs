//! The pods bound to this node, run as ECI container groups: the controller (watch, create,
//! status sync, delete), the pure translation both ways (`to_eci`, `from_eci`) and what they
//! share. May call `k8s`, `eci`, `ops`, `config`; nothing here knows about nodes or the fleet.

mod controller;
pub mod from_eci;
pub mod refs;
pub mod services;
mod slim;
pub mod sources;
pub mod tenancy;
pub mod to_eci;
pub mod tokens;
pub mod workqueue;

pub use controller::{
    GroupDirectory, INSTANCE_ANNOTATION, KUBE_API, PROVIDER_FAILED, PodController,
};
