//! The pure core of virtual-node-eci: what Kubernetes means by a pod's fields, written once
//! for every part of the workspace that has to honour it — the daemon translating pods for
//! ECI, and the integration harness's host agent running pods as a kubelet would.
//!
//! Nothing here does I/O, keeps state or knows about ECI, the API server or a runtime: each
//! function takes Kubernetes objects (k8s-openapi's types) and gives values. It depends on no
//! crate of the workspace; they depend on it.
//!
//! - [`quantity`]: resource quantities, read and written back as the apiserver does;
//! - [`requests`]: a pod's resource requests as the scheduler counts them;
//! - [`expansion`]: `$(VAR)` references in env values, command and args;
//! - [`service_env`]: the Service variables a kubelet gives every container;
//! - [`downward`]: downward API values (pod fields, container resources);
//! - [`time`]: timestamps as the API writes them.

pub mod downward;
pub mod expansion;
pub mod quantity;
pub mod requests;
pub mod service_env;
pub mod time;
