//! The pods bound to this node, run as ECI container groups: the controller (watch, create,
//! status sync, delete) and what it shares; the pure translation both ways is vne-core's
//! (`vne_core::to_eci`, `vne_core::from_eci`), as are the namespace scope and annotation policy
//! `tenancy` keeps current (`vne_core::tenancy`). May call `k8s`, `eci`, `ops`, `config` and
//! `vne_core`; nothing here knows about nodes or the fleet.

mod controller;
pub mod services;
mod slim;
pub mod sources;
pub mod tenancy;
pub mod tokens;
pub mod workqueue;

pub use controller::{
    GroupDirectory, INSTANCE_ANNOTATION, KUBE_API, PROVIDER_FAILED, PodController,
};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Secret};
use vne_core::refs::{Token, TokenSource};
use vne_core::to_eci::Context;

use crate::config::{PodsArgs, WithSite};

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
