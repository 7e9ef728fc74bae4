//! This replica among the StatefulSet's: is a stop a restart or a scale-in (membership), how
//! many replicas are alive to share ECI's quotas (replicas), the decommission that drains a removed node, and the cluster-wide orphan collector. May call
//! `node` (its shape and Lease), `k8s`, `eci`, `ops`, `config`; group naming is `vne_core::to_eci::naming`.

pub mod drain;
pub mod membership;
pub mod orphans;
pub mod replicas;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::ops::metrics::{MetricSet, ResultLabels};

/// The fleet's metrics: quota sharing, the orphan collector and decommission drains.
#[derive(Debug, Clone, Default)]
pub struct FleetMetrics {
    /// Live replicas this one shares ECI's per-account quotas with (itself included).
    pub eci_quota_replicas: Gauge,
    /// Orphaned container groups (node and pod gone) deleted by the cluster-wide collector.
    pub orphan_groups_deleted: Counter,
    /// Pods the last decommission drain was waiting for (0 when none ran or it emptied the node).
    pub drain_pods_left: Gauge,
    /// Finished decommission drains by result (`drained`, `timed_out`).
    pub drains: Family<ResultLabels, Counter>,
}

impl MetricSet for FleetMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        // Alone until the replica count says otherwise.
        metrics.eci_quota_replicas.set(1);
        registry.register(
            "eci_quota_replicas",
            "Live replicas sharing the account's ECI quotas (this one included): each paces every action to 1/N of its documented quota",
            metrics.eci_quota_replicas.clone(),
        );
        registry.register(
            "orphan_groups_deleted",
            "Container groups of this cluster deleted because their node and pod were both gone",
            metrics.orphan_groups_deleted.clone(),
        );
        registry.register(
            "drain_pods_left",
            "Pods the last decommission drain of this node was waiting for: 0 when none ran or it emptied the node",
            metrics.drain_pods_left.clone(),
        );
        registry.register(
            "drains",
            "Finished decommission drains by result: drained, timed_out (the node stays cordoned with pods left)",
            metrics.drains.clone(),
        );
        metrics
    }
}
