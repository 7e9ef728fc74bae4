//! Every Kubernetes API access the daemon makes, declared next to the calls (each module's
//! `KUBE_API`) and gathered here. The deploy test holds the manifests' RBAC to exactly this
//! list: nothing missing, nothing more.

/// Where an access applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Any namespace, or cluster-scoped resources (a ClusterRole).
    Cluster,
    /// The daemon's own namespace (a Role there).
    OwnNamespace,
    /// `kube-node-lease` (a Role there).
    NodeLeases,
}

/// One kind of access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Where.
    pub scope: Scope,
    /// API group (`""` for core).
    pub group: &'static str,
    /// Resource, with `/subresource` when there is one.
    pub resource: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Why the daemon needs it.
    pub why: &'static str,
}

/// Events published through kube's recorder (it patches a repeated event's series).
pub const EVENTS: &[Access] = &[Access {
    scope: Scope::Cluster,
    group: "events.k8s.io",
    resource: "events",
    verbs: &["create", "patch"],
    why: "Events on pods, nodes, Selectors and the eci-profile ConfigMap",
}];

/// Every module's declared accesses.
const ALL: &[&[Access]] = &[
    crate::registration::KUBE_API,
    crate::node_status::KUBE_API,
    crate::node_watch::KUBE_API,
    crate::lease::KUBE_API,
    crate::membership::KUBE_API,
    crate::drain::KUBE_API,
    crate::orphans::KUBE_API,
    crate::pods::KUBE_API,
    crate::webhook::KUBE_API,
    EVENTS,
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
