//! virtual-node-eci: Alibaba Cloud ECI as Kubernetes capacity.
//!
//! One process serves one virtual Node (one StatefulSet replica): it registers the Node, holds
//! its Lease, reports its status (Ready while the ECI API answers) and advertises capacity.

// Recorded API responses in tests are deep `json!` literals.
#![recursion_limit = "256"]

pub mod app;
pub mod backend;
pub mod config;
pub mod drain;
pub mod events;
pub mod health;
pub mod lease;
pub mod membership;
pub mod node;
pub mod node_status;
pub mod node_watch;
pub mod ops;
pub mod orphans;
pub mod pod_status;
pub mod pods;
pub mod rbac;
pub mod registration;
pub mod selector;
pub mod telemetry;
pub mod translate;
pub mod webhook;
pub mod workqueue;
