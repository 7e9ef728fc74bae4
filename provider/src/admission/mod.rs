//! Placement at admission: the HTTPS webhook the API server calls, which runs the
//! eci-profile `Selector` engine (pure, `vne_core::selector`) on watch-fed caches, with its
//! registration, the seal on deferred Selector effects (`seal`) and the normalNodePrefer spill
//! watcher. May call `k8s`, `ops`, `config`.

pub mod cache;
pub mod register;
pub mod review;
pub mod seal;
pub mod spill;
pub mod webhook;
pub mod webhook_callers;

pub use webhook::{KUBE_API, run};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::ops::metrics::{MetricSet, ResultLabels};

/// The Selector webhook's metrics.
#[derive(Debug, Clone)]
pub struct AdmissionMetrics {
    /// Admission reviews by result (`patched`, `allowed`, `invalid`).
    pub admission_reviews: Family<ResultLabels, Counter>,
    /// Time to answer an admission review inside the daemon.
    pub admission_seconds: Histogram,
}

impl MetricSet for AdmissionMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            admission_reviews: Family::default(),
            admission_seconds: Histogram::new(exponential_buckets(0.000_05, 1.5, 28)),
        };
        registry.register(
            "admission_reviews",
            "Admission reviews answered by the Selector webhook, by result",
            metrics.admission_reviews.clone(),
        );
        registry.register(
            "admission_seconds",
            "Time to answer an admission review inside the daemon",
            metrics.admission_seconds.clone(),
        );
        metrics
    }
}
