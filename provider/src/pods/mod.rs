//! The pods bound to this node, run as ECI container groups: the controller (one sync per
//! pod: create, status, delete) and what it shares; the pure translation both ways is vne-core's
//! (`vne_core::to_eci`, `vne_core::from_eci`), as are the namespace scope and annotation policy
//! `tenancy` keeps current (`vne_core::tenancy`). May call `k8s`, `eci`, `ops`, `config` and
//! `vne_core`; nothing here knows about nodes or the fleet.

mod controller;
pub mod services;
pub mod sources;
pub mod tenancy;
pub mod tokens;
pub mod workqueue;

pub use controller::{
    GroupDirectory, INSTANCE_ANNOTATION, KUBE_API, PROVIDER_FAILED, PodController,
};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Secret};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use vne_core::refs::{Token, TokenSource};
use vne_core::to_eci::Context;

use crate::config::{PodsArgs, WithSite};
use crate::ops::metrics::{MetricSet, ResultLabels};

/// What every translation of a pod for this node starts from: the site and the pods' flags,
/// the size resource references fall back to, and nothing the pod references yet (each
/// translation fills in what it fetched).
fn site_context(config: &WithSite<PodsArgs>) -> Context<'_> {
    static NO_CONFIG_MAPS: BTreeMap<String, ConfigMap> = BTreeMap::new();
    static NO_SECRETS: BTreeMap<String, Secret> = BTreeMap::new();
    static NO_CLAIMS: BTreeMap<String, PersistentVolume> = BTreeMap::new();
    static NO_TOKENS: BTreeMap<TokenSource, Token> = BTreeMap::new();
    Context {
        region: &config.site.region,
        vswitch: &config.site.vswitch,
        security_group: &config.site.security_group,
        cluster_name: &config.site.cluster_name,
        node_name: &config.site.node_name,
        cluster_dns: &config.args.cluster_dns,
        cluster_domain: &config.args.cluster_domain,
        config_maps: &NO_CONFIG_MAPS,
        secrets: &NO_SECRETS,
        claims: &NO_CLAIMS,
        service_account_tokens: &NO_TOKENS,
        default_spec: (2.0, 4.0),
        apiserver: None,
        services: &[],
        kube_proxy: config.args.kube_proxy,
    }
}

/// Labels of the pods gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// Pod phase.
    pub phase: String,
}

/// The pods' metrics: phases, latencies, retries, clean-ups after a watch gap, and token
/// refreshes.
#[derive(Debug, Clone)]
pub struct PodMetrics {
    /// Pods of this node by phase.
    pub pods: Family<PhaseLabels, Gauge>,
    /// Pod seen → ECI accepted its group.
    pub pod_create_seconds: Histogram,
    /// ECI status change → pod status written.
    pub pod_status_propagation_seconds: Histogram,
    /// Creation attempts that had to be retried.
    pub pod_create_retries: Counter,
    /// Pods found deleted when a (re)list of this node's pods completed: deleted while the
    /// watch was broken (410 Gone, an API server restart) or the daemon stopped.
    pub pods_deleted_during_watch_gap: Counter,
    /// Service account token refreshes by result (`ok`, `retry`, `failed`).
    pub token_refreshes: Family<ResultLabels, Counter>,
}

/// Pod latencies: finer where the service levels are (200 ms to accept a pod, 2 s to show an
/// ECI change on it), so "how many pods within target" is a bucket, not an estimate.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0,
        5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

impl MetricSet for PodMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            pods: Family::default(),
            pod_create_seconds: latency_histogram(),
            pod_status_propagation_seconds: latency_histogram(),
            pod_create_retries: Counter::default(),
            pods_deleted_during_watch_gap: Counter::default(),
            token_refreshes: Family::default(),
        };
        registry.register(
            "pods",
            "Pods bound to this node by phase",
            metrics.pods.clone(),
        );
        registry.register(
            "pod_create_seconds",
            "Time from seeing a pod to ECI accepting its container group",
            metrics.pod_create_seconds.clone(),
        );
        registry.register(
            "pod_status_propagation_seconds",
            "Time from an ECI status change to the pod status written",
            metrics.pod_status_propagation_seconds.clone(),
        );
        registry.register(
            "pod_create_retries",
            "Container group creations retried after a transient failure",
            metrics.pod_create_retries.clone(),
        );
        registry.register(
            "pods_deleted_during_watch_gap",
            "Pods found deleted when a list of this node's pods completed (deleted while the watch was broken or the daemon stopped); their container groups were deleted",
            metrics.pods_deleted_during_watch_gap.clone(),
        );
        registry.register(
            "token_refreshes",
            "Service account token refreshes by result: ok, retry (failed, retried with back-off), failed (given up: the tokens expire in the group)",
            metrics.token_refreshes.clone(),
        );
        metrics
    }
}
