//! virtual-node-eci: Alibaba Cloud ECI as Kubernetes capacity.
//!
//! One process serves one virtual Node (one StatefulSet replica). The folders are the jobs, and
//! calls flow one way: `app` wires the areas (`node`, `pods`, `fleet`, `admission`,
//! `placement`, `imagecache`, `kubelet`), which call the edges (`k8s`, `eci`) and the leaves (`ops`,
//! `config`). The architecture test (`tests/architecture.rs`) keeps it so. (`k8s`, not `kube`: a crate-root `kube` module would
//! shadow the kube crate in every `use`.)

// Recorded API responses in tests are deep `json!` literals.
#![recursion_limit = "256"]

pub mod admission;
pub mod app;
pub mod config;
pub mod eci;
pub mod fleet;
pub mod imagecache;
pub mod k8s;
pub mod kubelet;
pub mod node;
pub mod ops;
pub mod placement;
pub mod pods;
