//! The kubelet's resource metrics, computed from ECI's: which groups to ask
//! `DescribeMultiContainerGroupMetric` about (`pods`, `sample::batches`), ECI's records as the
//! kubelet's figures — per pod and container, and the node's as sums over its pods with
//! counters that never go back (`sample`) — and the two shapes they are served in,
//! `/metrics/resource` (what metrics-server scrapes for `kubectl top` and the HPA) and
//! `/stats/summary` (`render`). The daemon's kubelet API calls ECI, caches and keeps the
//! clock; everything it decides about the figures is here.

pub mod pods;
pub mod render;
pub mod sample;

pub use self::pods::{PodEntry, by_group};
pub use self::render::{Summary, TEXT_CONTENT_TYPE, resource_metrics, summary};
pub use self::sample::{
    BATCH, ContainerSample, CounterSum, Cpu, Fs, Interface, Memory, NodeCounters, NodeSample,
    PodSample, batches, merge, pod_sample,
};

#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
#[cfg(test)]
mod tests;
