//! The virtual Node itself: registration (and re-registration when deleted), its Lease, its
//! status, conditions and capacity, and the ECI reachability that decides Ready. May call
//! `k8s`, `eci`, `ops`, `config`; knows nothing of pods beyond counting them.

pub mod eci_health;
pub mod guard;
pub mod lease;
pub mod registration;
pub mod shape;
pub mod status;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::ops::metrics::{MetricSet, ResultLabels};

/// The node's health as operators see it: ECI reachability, Ready, and the Lease.
#[derive(Debug, Clone, Default)]
pub struct NodeMetrics {
    /// 1 while ECI answers.
    pub eci_reachable: Gauge,
    /// 1 while the node reports Ready=True.
    pub node_ready: Gauge,
    /// ECI probes by result.
    pub eci_probes: Family<ResultLabels, Counter>,
    /// Lease renewals by result.
    pub lease_renewals: Family<ResultLabels, Counter>,
}

impl MetricSet for NodeMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "eci_reachable",
            "1 while the ECI API answers the periodic probe",
            metrics.eci_reachable.clone(),
        );
        registry.register(
            "node_ready",
            "1 while the virtual node reports Ready=True",
            metrics.node_ready.clone(),
        );
        registry.register(
            "eci_probes",
            "ECI reachability probes by result",
            metrics.eci_probes.clone(),
        );
        registry.register(
            "lease_renewals",
            "Node Lease renewals by result",
            metrics.lease_renewals.clone(),
        );
        metrics
    }
}
