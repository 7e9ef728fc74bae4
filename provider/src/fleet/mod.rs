//! This replica among the StatefulSet's: is a stop a restart or a scale-in (membership), how
//! many replicas are alive to share ECI's quotas (replicas), the decommission that drains a removed node, and the cluster-wide orphan collector. May call
//! `node` (its shape and Lease), `k8s`, `eci`, `ops`, `config`; group naming is `vne_core::to_eci::naming`.

pub mod drain;
pub mod membership;
pub mod orphans;
pub mod replicas;
