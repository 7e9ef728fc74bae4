//! The daemon's RBAC, gathered from the accesses each area declares next to its calls (its
//! `KUBE_API`). Gathered here, at the top, so no area imports another to build the list; the
//! deploy test holds the manifests' RBAC to exactly this list: nothing missing, nothing more.

use crate::k8s::access::{Access, Scope};

/// Every module's declared accesses.
const ALL: &[&[Access]] = &[
    crate::node::registration::KUBE_API,
    crate::node::status::KUBE_API,
    crate::node::guard::KUBE_API,
    crate::node::lease::KUBE_API,
    crate::fleet::membership::KUBE_API,
    crate::fleet::drain::KUBE_API,
    crate::fleet::orphans::KUBE_API,
    crate::pods::KUBE_API,
    crate::pods::services::KUBE_API,
    crate::admission::KUBE_API,
    crate::placement::KUBE_API,
    crate::imagecache::reconciler::KUBE_API,
    crate::k8s::callers::KUBE_API,
    crate::kubelet::certs::KUBE_API,
    crate::kubelet::pod_lookup::KUBE_API,
    crate::kubelet::resource_metrics::KUBE_API,
    crate::ops::events::KUBE_API,
];

/// Every access, one `(scope, group, resource, verb)` per entry, with accesses a cluster-wide
/// grant already covers dropped from the namespaced scopes.
pub fn required() -> Vec<(Scope, &'static str, &'static str, &'static str)> {
    let mut out: Vec<(Scope, &str, &str, &str)> = table()
        .into_iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(move |v| (a.scope, a.group, a.resource, *v))
        })
        .collect();
    let cluster: Vec<(&str, &str, &str)> = out
        .iter()
        .filter(|(s, ..)| *s == Scope::Cluster)
        .map(|(_, g, r, v)| (*g, *r, *v))
        .collect();
    out.retain(|(s, g, r, v)| *s == Scope::Cluster || !cluster.contains(&(*g, *r, *v)));
    out.sort_unstable();
    out.dedup();
    out
}

/// Every access with its reason, for the RBAC table in the docs.
pub fn table() -> Vec<Access> {
    ALL.iter().flat_map(|a| a.iter().copied()).collect()
}
