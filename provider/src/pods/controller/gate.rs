//! The administrators' say before a pod becomes a container group: the namespace scope and
//! the annotation policy ([`vne_core::tenancy`], kept current by [`crate::pods::tenancy`]). A
//! refused pod stays Pending with a condition and a Warning Event, and nothing of it is read
//! or created; it is judged again when the policy, its namespace's labels or the pod itself
//! change.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::notice::Notice;
use super::{PodController, hash_of};
use vne_core::lifecycle::{Lifecycle, Trigger};
use vne_core::tenancy::specs::Size;
use vne_core::tenancy::{Asked, Clearance};

/// What to do with a pod after judging it.
pub(super) enum Admission {
    /// Create its group.
    Go,
    /// Refused: it waits for a change (policy, namespace labels, the pod).
    Held,
    /// Not decidable yet: try again after a back-off.
    Later,
}

/// The annotations the pod will have when its group is created: its own as a Selector's
/// effect deferred to binding changes them (the policy judges the pod as bound, whoever wrote
/// them).
fn annotations_as_bound(pod: &Pod) -> BTreeMap<String, String> {
    let mut annotations = pod.annotations().clone();
    if let Some(patch) = vne_core::selector::engine::pending_effect_patch(pod)
        && let Some(changed) = patch
            .pointer("/metadata/annotations")
            .and_then(|a| a.as_object())
    {
        for (name, value) in changed {
            match value {
                serde_json::Value::Null => annotations.remove(name),
                serde_json::Value::String(text) => annotations.insert(name.clone(), text.clone()),
                other => annotations.insert(name.clone(), other.to_string()),
            };
        }
    }
    annotations
}

impl PodController {
    /// Judges `pod` (with `uid`) and, when refused, tells its author once per reason.
    pub(super) async fn admit(&self, pod: &Pod, uid: &str) -> Admission {
        let annotations = annotations_as_bound(pod);
        let asked = Asked {
            annotations: &annotations,
            size: Size::of_pod(pod),
        };
        let namespace = pod.namespace().unwrap_or_default();
        match self.inner.tenancy.judge(&asked, &namespace) {
            Clearance::Allowed => {
                if let Some(entry) = self.tracked().get_mut(uid)
                    && entry.held.take().is_some()
                {
                    info!("the pod is allowed now; creating its container group");
                }
                Admission::Go
            }
            Clearance::Undecided(why) => {
                debug!(why, "cannot judge the pod yet");
                Admission::Later
            }
            Clearance::Refused { reason, message } => {
                let fingerprint = hash_of(&message);
                let new = {
                    let mut tracked = self.tracked();
                    let Some(entry) = tracked.get_mut(uid) else {
                        return Admission::Held;
                    };
                    // Judged again on the pod's next change, or a policy or label change.
                    entry.on(uid, Trigger::Refused);
                    entry.held.replace(fingerprint) != Some(fingerprint)
                };
                if new {
                    warn!(reason, %message, "refusing the pod");
                    self.show(
                        pod,
                        Notice::not_created("Pending", reason, reason, &message),
                    );
                }
                Admission::Held
            }
        }
    }

    /// Queues the held pods' syncs whenever the policy or a namespace's labels change: a held
    /// pod's sync judges it again (its lifecycle's step from `Held` is a create, which asks the
    /// policy first).
    pub(super) async fn requeue_held(self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut changes = self.inner.tenancy.changes();
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                changed = changes.changed() => if changed.is_err() { return Ok(()) },
            }
            let held: Vec<String> = self
                .tracked()
                .iter()
                .filter(|(_, t)| t.lifecycle == Lifecycle::Held)
                .map(|(uid, _)| uid.clone())
                .collect();
            if !held.is_empty() {
                debug!(
                    pods = held.len(),
                    "the policy or namespace labels changed; judging held pods again"
                );
            }
            for uid in held {
                self.inner.syncs.push(uid, ());
            }
        }
    }
}
