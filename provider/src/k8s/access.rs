//! How an area declares a Kubernetes API access it makes: each area exports a `KUBE_API`
//! table next to its calls; `app::rbac` gathers them.

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
