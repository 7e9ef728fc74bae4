//! The daemon's Prometheus registry (`virtual_node_eci_` prefix) and its text exposition, the
//! metrics of the shared edges (Kubernetes API requests, ECI calls), and the way every other
//! part registers the metrics it owns: a [`MetricSet`] it defines, registered once per
//! [`Telemetry`] however many of its pieces ask for it.

use std::any::{Any, TypeId};
use std::collections::HashMap;

use parking_lot::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The media type of what [`Telemetry::render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of a result counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or a short error class.
    pub result: String,
}

/// Labels of ECI calls.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EciLabels {
    /// The action.
    pub action: &'static str,
    /// `ok` or the ECI error code.
    pub result: String,
}

/// Labels of Kubernetes API requests.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeLabels {
    /// e.g. `lease_renew`, `node_status_patch`.
    pub operation: &'static str,
}

/// The metrics one part of the daemon owns (an area, the Event queue): it defines them and
/// their registration, so the registry here never names what the parts are.
pub trait MetricSet: Clone + Send + Sync + 'static {
    /// Creates the metrics and registers them; runs once per [`Telemetry`].
    fn register(registry: &mut Registry) -> Self;

    /// This set in `telemetry`: registered by the first piece that asks, shared by the rest
    /// (a second registration would serve every family twice).
    fn of(telemetry: &Telemetry) -> Self {
        telemetry.registered::<Self>()
    }
}

type Sets = HashMap<TypeId, Box<dyn Any + Send + Sync>>;

/// The registry and the edges' metrics.
#[derive(Debug)]
pub struct Telemetry {
    registry: Mutex<Registry>,
    /// The [`MetricSet`]s registered so far, by type.
    sets: Mutex<Sets>,
    /// Requests to the Kubernetes API by operation.
    pub kube_requests: Family<KubeLabels, Counter>,
    /// ECI calls by action and result.
    pub eci_calls: Family<EciLabels, Counter>,
}

impl Telemetry {
    /// The registry with the edges' metrics; the parts add theirs ([`MetricSet::of`]).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("virtual_node_eci");
        let kube_requests = Family::default();
        registry.register(
            "kube_requests",
            "Requests to the Kubernetes API by operation",
            kube_requests.clone(),
        );
        let eci_calls = Family::default();
        registry.register(
            "eci_calls",
            "ECI calls by action and result (ok or the ECI error code)",
            eci_calls.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            sets: Mutex::new(HashMap::new()),
            kube_requests,
            eci_calls,
        }
    }

    /// The set `M`, registered on the first ask.
    fn registered<M: MetricSet>(&self) -> M {
        let mut sets = self.sets.lock();
        if let Some(set) = sets
            .get(&TypeId::of::<M>())
            .and_then(|set| set.downcast_ref::<M>())
        {
            return set.clone();
        }
        let set = M::register(&mut self.registry.lock());
        sets.insert(TypeId::of::<M>(), Box::new(set.clone()));
        set
    }

    /// Counts one Kubernetes API request.
    pub fn kube_request(&self, operation: &'static str) {
        self.kube_requests
            .get_or_create(&KubeLabels { operation })
            .inc();
    }

    /// Counts one result of a result-labelled counter.
    pub fn count(family: &Family<ResultLabels, Counter>, result: &str) {
        family
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// The text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
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
