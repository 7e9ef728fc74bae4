//! Prometheus metrics: calls by action and result, call latency, groups by status.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::actions::Action;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    action: &'static str,
    /// `ok` or the ECI error code.
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

/// The registry and its metrics.
#[derive(Debug)]
pub struct Telemetry {
    registry: Mutex<Registry>,
    calls: Family<CallLabels, Counter>,
    latency: Family<ActionLabels, Histogram>,
    groups: Family<StatusLabels, Gauge>,
}

impl Telemetry {
    /// Registers the metrics.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mock_eci");
        let calls = Family::<CallLabels, Counter>::default();
        let latency = Family::<ActionLabels, Histogram>::new_with_constructor(
            new_latency_histogram as fn() -> Histogram,
        );
        let groups = Family::<StatusLabels, Gauge>::default();
        registry.register(
            "calls",
            "API calls by action and result (ok or the ECI error code)",
            calls.clone(),
        );
        registry.register(
            "call_duration_seconds",
            "Time to answer an API call, injected latency included",
            latency.clone(),
        );
        registry.register(
            "container_groups",
            "Container groups by status",
            groups.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            calls,
            latency,
            groups,
        }
    }

    /// Counts one call.
    pub fn record(&self, action: Action, result: &str, seconds: f64) {
        self.calls
            .get_or_create(&CallLabels {
                action: action.name(),
                result: result.to_owned(),
            })
            .inc();
        self.latency
            .get_or_create(&ActionLabels {
                action: action.name(),
            })
            .observe(seconds);
    }

    /// Renders the text exposition, with group counts as given.
    pub fn render(
        &self,
        groups_by_status: impl IntoIterator<Item = (&'static str, usize)>,
    ) -> String {
        self.groups.clear();
        for (status, count) in groups_by_status {
            self.groups
                .get_or_create(&StatusLabels { status })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

fn new_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}
