//! A pod's `activeDeadlineSeconds`, enforced as the kubelet enforces it
//! (`pkg/kubelet/active_deadline.go`): measured from the pod's `status.startTime`, passed once
//! the time since is at least the deadline; the pod then fails with reason
//! [`vne_core::from_eci::DEADLINE_EXCEEDED`] and its message, and a Normal Event says so.
//!
//! ECI takes `ActiveDeadlineSeconds` only at CreateContainerGroup (UpdateContainerGroup has
//! no such parameter: proto/sdk/names.tsv), and ends the group itself when it passes. A
//! deadline set or lowered later is this module's: [`due_at`] is the deadline plus
//! [`ECI_FIRST`], so that where ECI enforces, its own ending (which keeps the group, and so the
//! logs) reaches the pod first, and the controller acts only on a pod that still runs.
//!
//! A pod is synced again when its deadline falls due: each of its syncs gives the time to the
//! controller's queue of syncs, as a value for later.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::delete::{Deletion, DeletionKey};
use super::notice::Notice;
use super::slim::Glance;
use super::{PodController, PodEntry};
use vne_core::lifecycle::{Effect, Trigger};

/// How long after a deadline ECI is given to end the group itself (it was created with that
/// deadline), and the status writers to show it, before the controller stops the group: ten
/// status polls at the default interval, room for a loaded apiserver's slower writes.
pub(super) const ECI_FIRST: Duration = Duration::from_secs(10);

/// When the controller is to stop `pod` for its deadline: `None` without a deadline, before
/// the pod started (no `startTime`: its group does not exist yet) and once it finished.
pub(super) fn due_at(pod: &Pod) -> Option<SystemTime> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let started: SystemTime = status.start_time.as_ref()?.0.into();
    // The apiserver takes 1 to 2^31-1 seconds (68 years); a negative one is never due, and
    // neither is one past what a time can hold.
    let allowed = Duration::from_secs(u64::try_from(seconds).ok()?);
    started.checked_add(allowed)?.checked_add(ECI_FIRST)
}

/// How soon a pod whose deadline passed is looked at again when its step had other work to do
/// first.
const AGAIN: Duration = Duration::from_secs(2);

impl PodController {
    /// After a pod's step: a running pod past its deadline is stopped; one before it is given
    /// the time to be synced again (while the step has other work, the deadline waits for the
    /// next sync).
    pub(super) fn mind_deadline(
        &self,
        entry: &mut PodEntry,
        uid: &str,
        glance: &Glance,
        effect: Option<Effect>,
    ) -> (Option<Effect>, Option<SystemTime>) {
        if glance.terminating {
            return (effect, None);
        }
        let Some(due) = glance.deadline_due else {
            return (effect, None);
        };
        let now = SystemTime::now();
        match effect {
            None | Some(Effect::Nothing) if due <= now => {
                (entry.on(uid, Trigger::DeadlinePassed), None)
            }
            effect => (effect, Some(if due > now { due } else { now + AGAIN })),
        }
    }

    /// Fails `pod` for its deadline, as the kubelet does (phase Failed, reason
    /// [`vne_core::from_eci::DEADLINE_EXCEEDED`], a Normal Event; the status writers write it),
    /// and queues the graceful deletion of `group` (its containers get their grace period and
    /// preStop hooks), tried until ECI accepts. From the pod's sync.
    pub(super) fn stop_at_deadline(&self, pod: &Pod, uid: &str, group: Option<String>) {
        self.show(pod, Notice::stopped());
        if let Some(id) = group {
            info!(eci_id = %id, "the pod passed its active deadline; stopping its container group");
            let deletion = Deletion::past_deadline(id);
            self.queue_deletion(DeletionKey::Pod(uid.to_owned()), deletion);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(deadline: Option<i64>, started: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "job-1", "uid": "u-1"},
            "spec": {"containers": [{"name": "c"}], "activeDeadlineSeconds": deadline},
            "status": {"phase": phase, "startTime": started},
        }))
        .expect("a pod")
    }

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).expect("a time")
    }

    #[test]
    fn a_deadline_falls_due_from_the_start_time_once_eci_had_its_turn() {
        let started = "2026-11-29T10:00:00Z";
        let cases = [
            // (deadline, startTime, phase, due)
            (
                Some(30),
                Some(started),
                "Running",
                Some("2026-11-29T10:00:40Z"),
            ),
            (
                Some(30),
                Some(started),
                "Pending",
                Some("2026-11-29T10:00:40Z"),
            ),
            (
                Some(1),
                Some(started),
                "Running",
                Some("2026-11-29T10:00:11Z"),
            ),
            // No deadline, or not started yet: nothing to enforce.
            (None, Some(started), "Running", None),
            (Some(30), None, "Pending", None),
            // Finished: never again.
            (Some(30), Some(started), "Succeeded", None),
            (Some(30), Some(started), "Failed", None),
            // The longest the apiserver takes: due in 68 years, no overflow.
            (
                Some(i64::from(i32::MAX)),
                Some(started),
                "Running",
                Some("2094-12-17T13:14:17Z"),
            ),
            // Not a deadline the apiserver takes.
            (Some(-5), Some(started), "Running", None),
            (Some(i64::MAX), Some(started), "Running", None),
        ];
        for (deadline, start, phase, expected) in cases {
            assert_eq!(
                due_at(&pod(deadline, start, phase)),
                expected.map(at),
                "deadline {deadline:?}, started {start:?}, {phase}"
            );
        }
    }
}
