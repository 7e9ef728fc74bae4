//! Is this stop a restart or a scale-in? A StatefulSet replica whose ordinal is at or above the
//! set's `spec.replicas` is being removed; anything else (rolling update, eviction of the
//! daemon pod, node maintenance) is a restart and a successor will serve the same node.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tracing::{info, warn};

use crate::config::{FleetArgs, StopMode, WithSite};

/// How long the stop decision may wait on the API before it settles for a restart.
const DECISION_TIMEOUT: Duration = Duration::from_secs(10);

/// What a stop means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopKind {
    /// Keep the node, its pods and their groups for a successor.
    Restart {
        /// Why, for the log.
        why: String,
    },
    /// Drain the node and remove it.
    Decommission {
        /// Why, for the log and the node's Event.
        why: String,
    },
}

/// What the API says about this replica's StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetState {
    /// The daemon does not run as a StatefulSet replica (no such pod, no such owner).
    NotAMember,
    /// The StatefulSet no longer exists.
    Gone,
    /// The StatefulSet is being deleted (uninstall).
    Deleting,
    /// The StatefulSet wants this many replicas.
    Replicas(i32),
}

/// The ordinal of a StatefulSet pod name (`virtual-node-eci-2` → 2).
pub fn ordinal(pod_name: &str) -> Option<u32> {
    let (_, digits) = pod_name.rsplit_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

/// Decides (pure).
pub fn decide(mode: StopMode, ordinal: Option<u32>, set: &SetState) -> StopKind {
    match mode {
        StopMode::Restart => {
            return StopKind::Restart {
                why: "ON_STOP=restart".into(),
            };
        }
        StopMode::Decommission => {
            return StopKind::Decommission {
                why: "ON_STOP=decommission".into(),
            };
        }
        StopMode::Auto => {}
    }
    match (set, ordinal) {
        (SetState::NotAMember, _) | (_, None) => StopKind::Restart {
            why: "not a StatefulSet replica".into(),
        },
        (SetState::Gone, _) => StopKind::Decommission {
            why: "the StatefulSet was deleted".into(),
        },
        (SetState::Deleting, _) => StopKind::Decommission {
            why: "the StatefulSet is being deleted".into(),
        },
        (SetState::Replicas(replicas), Some(ordinal)) => {
            if i64::from(ordinal) >= i64::from(*replicas) {
                StopKind::Decommission {
                    why: format!(
                        "scale-in: replica {ordinal} is at or above the StatefulSet's {replicas} replicas"
                    ),
                }
            } else {
                StopKind::Restart {
                    why: format!(
                        "replica {ordinal} stays within the StatefulSet's {replicas} replicas"
                    ),
                }
            }
        }
    }
}

/// This replica's place in its StatefulSet, found from its own pod.
#[derive(Clone)]
pub struct Membership {
    client: kube::Client,
    namespace: String,
    pod_name: Option<String>,
    mode: StopMode,
    /// The owning StatefulSet, once known (kept: the pod may be gone when the signal comes).
    stateful_set: Option<String>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("pod", &self.pod_name)
            .field("stateful_set", &self.stateful_set)
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// Looks up the owning StatefulSet (best effort: an error is retried at stop time).
    pub async fn discover(client: kube::Client, config: &WithSite<FleetArgs>) -> Self {
        let mut membership = Self {
            client,
            namespace: config.site.pod_namespace.clone(),
            pod_name: config.site.pod_name.clone(),
            mode: config.args.on_stop,
            stateful_set: None,
        };
        match membership.owner().await {
            Ok(Some(set)) => {
                info!(statefulset = %set, ordinal = ?membership.pod_name.as_deref().and_then(ordinal), "this daemon is a StatefulSet replica: scaling the set in drains its node");
                membership.stateful_set = Some(set);
            }
            Ok(None) => {
                info!(
                    "this daemon is not a StatefulSet replica: a stop is always a restart unless ON_STOP says otherwise"
                );
            }
            Err(error) => {
                warn!(%error, "cannot read this daemon's own pod yet; the stop decision will look again");
            }
        }
        membership
    }

    async fn owner(&self) -> Result<Option<String>, kube::Error> {
        let Some(pod_name) = &self.pod_name else {
            return Ok(None);
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(pods.get_opt(pod_name).await?.and_then(|pod| {
            pod.metadata
                .owner_references
                .into_iter()
                .flatten()
                .find(|o| o.kind == "StatefulSet" && o.controller == Some(true))
                .map(|o| o.name)
        }))
    }

    async fn set_state(&self) -> Result<SetState, kube::Error> {
        let set = match &self.stateful_set {
            Some(set) => set.clone(),
            None => match self.owner().await? {
                Some(set) => set,
                None => return Ok(SetState::NotAMember),
            },
        };
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(match sets.get_opt(&set).await? {
            None => SetState::Gone,
            Some(s) if s.metadata.deletion_timestamp.is_some() => SetState::Deleting,
            Some(s) => SetState::Replicas(s.spec.and_then(|spec| spec.replicas).unwrap_or(1)),
        })
    }

    /// Decides what the stop signal means. When the API cannot tell in time, it is a restart:
    /// that deletes nothing, and the successor (or a later scale-in) can still decide.
    pub async fn classify(&self) -> StopKind {
        if self.mode != StopMode::Auto {
            return decide(self.mode, None, &SetState::NotAMember);
        }
        let ordinal = self.pod_name.as_deref().and_then(ordinal);
        match tokio::time::timeout(DECISION_TIMEOUT, self.set_state()).await {
            Ok(Ok(state)) => decide(self.mode, ordinal, &state),
            Ok(Err(error)) => StopKind::Restart {
                why: format!("the StatefulSet could not be read ({error}); deleting nothing"),
            },
            Err(_) => StopKind::Restart {
                why: format!(
                    "the StatefulSet could not be read within {DECISION_TIMEOUT:?}; deleting nothing"
                ),
            },
        }
    }
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::OwnNamespace,
        group: "",
        resource: "pods",
        verbs: &["get"],
        why: "find the daemon's own StatefulSet",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::OwnNamespace,
        group: "apps",
        resource: "statefulsets",
        verbs: &["get"],
        why: "tell a scale-in from a restart",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_come_from_the_last_dash() {
        assert_eq!(ordinal("virtual-node-eci-0"), Some(0));
        assert_eq!(ordinal("virtual-node-eci-12"), Some(12));
        assert_eq!(ordinal("virtual-node-eci"), None);
        assert_eq!(ordinal("virtual-node-eci-"), None);
        assert_eq!(ordinal("virtual-node-eci-7f9c"), None);
        assert_eq!(
            ordinal("virtual-node-eci-01"),
            None,
            "not a StatefulSet name"
        );
        assert_eq!(ordinal("eci"), None);
    }

    #[test]
    fn scale_in_is_an_ordinal_at_or_above_the_replicas() {
        let auto = StopMode::Auto;
        assert!(matches!(
            decide(auto, Some(2), &SetState::Replicas(2)),
            StopKind::Decommission { .. }
        ));
        assert!(matches!(
            decide(auto, Some(3), &SetState::Replicas(2)),
            StopKind::Decommission { .. }
        ));
        assert!(matches!(
            decide(auto, Some(1), &SetState::Replicas(2)),
            StopKind::Restart { .. }
        ));
        assert!(matches!(
            decide(auto, Some(0), &SetState::Replicas(0)),
            StopKind::Decommission { .. }
        ));
    }

    #[test]
    fn uninstalling_drains_and_unknowns_restart() {
        let auto = StopMode::Auto;
        assert!(matches!(
            decide(auto, Some(0), &SetState::Gone),
            StopKind::Decommission { .. }
        ));
        assert!(matches!(
            decide(auto, Some(0), &SetState::Deleting),
            StopKind::Decommission { .. }
        ));
        assert!(matches!(
            decide(auto, Some(0), &SetState::NotAMember),
            StopKind::Restart { .. }
        ));
        assert!(matches!(
            decide(auto, None, &SetState::Replicas(0)),
            StopKind::Restart { .. }
        ));
    }

    #[test]
    fn the_mode_overrides_the_statefulset() {
        assert!(matches!(
            decide(StopMode::Restart, Some(5), &SetState::Replicas(1)),
            StopKind::Restart { .. }
        ));
        assert!(matches!(
            decide(StopMode::Decommission, Some(0), &SetState::Replicas(3)),
            StopKind::Decommission { .. }
        ));
    }
}
