//! What a pod is to show in place of its group's state — why it does not run (skipped,
//! refused, waiting, failed before its group exists), that its group vanished, that it was
//! stopped at its deadline — and the Event that says so.
//!
//! Whoever finds such a thing (the pod's sync, a creation, the namespace gate) keeps the
//! notice in the pod's entry and queues the pod's status write
//! ([`PodController::show`](super::PodController::show)); the status writers write it. They
//! are the one writer of pod status, so a notice never goes beside a group state's write, and
//! one whose write failed stays to be tried again.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use serde_json::{Value, json};
use vne_core::from_eci::{self, DEADLINE_EXCEEDED, DEADLINE_MESSAGE, INSTANCE_CREATED};

use super::deadline::due_at;

/// A notice: what the pod's status and its Event say.
#[derive(Debug)]
pub(super) struct Notice {
    kind: Kind,
    message: String,
    /// When it was found: the time the conditions and containers it writes show.
    at: SystemTime,
    /// Writes of it that failed.
    failures: u32,
}

/// What the notice says of the pod.
#[derive(Debug)]
enum Kind {
    /// A phase, reason and message (a pod skipped, or waiting on the daemon's configuration).
    Phase { phase: &'static str, reason: String },
    /// As `Phase`, with the `ContainerInstanceCreated=False` condition of reason `condition`,
    /// as ACK shows a pod whose group could not be created.
    NotCreated {
        phase: &'static str,
        reason: String,
        condition: String,
    },
    /// The kubelet's `CreateContainerConfigError` for `container`, with that condition.
    ContainerConfig { container: String },
    /// Failed with reason `NotFound`: the group vanished.
    Lost,
    /// Failed at its active deadline, written only while the pod has one.
    Stopped,
}

impl Notice {
    fn new(kind: Kind, message: &str) -> Self {
        Self {
            kind,
            message: message.to_owned(),
            at: SystemTime::now(),
            failures: 0,
        }
    }

    /// Counts a write of it that failed: how long to wait before the next.
    pub(super) fn failed(&mut self) -> Duration {
        self.failures += 1;
        super::backoff(self.failures - 1)
    }

    /// The pod is `phase`, with `reason` and `message`.
    pub(super) fn phase(phase: &'static str, reason: &str, message: &str) -> Self {
        let reason = reason.to_owned();
        Self::new(Kind::Phase { phase, reason }, message)
    }

    /// No group was created for the pod: `phase`, `reason` and `message`, the
    /// `ContainerInstanceCreated=False` condition of reason `condition`.
    pub(super) fn not_created(
        phase: &'static str,
        reason: &str,
        condition: &str,
        message: &str,
    ) -> Self {
        let (reason, condition) = (reason.to_owned(), condition.to_owned());
        let kind = Kind::NotCreated {
            phase,
            reason,
            condition,
        };
        Self::new(kind, message)
    }

    /// A setting of `container` cannot be resolved as the pod stands.
    pub(super) fn container_config(container: &str, message: &str) -> Self {
        let container = container.to_owned();
        Self::new(Kind::ContainerConfig { container }, message)
    }

    /// The pod's group `id` no longer exists.
    pub(super) fn lost(id: &str) -> Self {
        let message = format!("the ECI container group {id} no longer exists");
        Self::new(Kind::Lost, &message)
    }

    /// The pod passed its active deadline.
    pub(super) fn stopped() -> Self {
        Self::new(Kind::Stopped, DEADLINE_MESSAGE)
    }

    /// Whether it says why no group exists: such a notice is never written once a group is
    /// known, whose state is what the pod shows then.
    pub(super) fn before_group(&self) -> bool {
        !matches!(self.kind, Kind::Lost | Kind::Stopped)
    }

    /// The status to apply to the pod as `current` shows it; `None`: nothing to write.
    pub(super) fn status(&self, current: &Pod) -> Option<Value> {
        let message = self.message.as_str();
        let (mut status, condition) = match &self.kind {
            Kind::Phase { phase, reason } => {
                return Some(from_eci::with_phase(current, phase, reason, message));
            }
            Kind::Lost => return Some(from_eci::lost(current, "NotFound", message, self.at)),
            Kind::Stopped => {
                return due_at(current)
                    .map(|_| from_eci::stopped(current, DEADLINE_EXCEEDED, message, self.at));
            }
            Kind::NotCreated {
                phase,
                reason,
                condition,
            } => (
                from_eci::with_phase(current, phase, reason, message),
                condition.as_str(),
            ),
            Kind::ContainerConfig { container } => (
                from_eci::container_config_error(current, container, message),
                from_eci::CREATE_CONTAINER_CONFIG_ERROR,
            ),
        };
        let condition = json!({
            "type": INSTANCE_CREATED, "status": "False", "reason": condition,
            "message": message, "lastTransitionTime": crate::k8s::rfc3339(self.at),
        });
        match status["conditions"].as_array_mut() {
            Some(conditions) => {
                conditions.retain(|c| c["type"] != INSTANCE_CREATED);
                conditions.push(condition);
            }
            None => status["conditions"] = json!([condition]),
        }
        Some(status)
    }

    /// The Event told once the status is written: its type, reason and note.
    pub(super) fn event(&self) -> (EventType, &str, &str) {
        let (kind, reason) = match &self.kind {
            Kind::Stopped => (EventType::Normal, DEADLINE_EXCEEDED),
            Kind::Lost => (EventType::Warning, "NotFound"),
            Kind::Phase { reason, .. } => (EventType::Warning, reason.as_str()),
            Kind::NotCreated { condition, .. } => (EventType::Warning, condition.as_str()),
            Kind::ContainerConfig { .. } => {
                (EventType::Warning, from_eci::CREATE_CONTAINER_CONFIG_ERROR)
            }
        };
        (kind, reason, &self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: &Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u-1"},
            "spec": {"containers": [{"name": "app"}, {"name": "side"}], "activeDeadlineSeconds": 5},
            "status": status,
        }))
        .expect("a pod")
    }

    #[test]
    fn each_notice_writes_its_status_and_tells_its_event() {
        let pending = pod(&json!({"phase": "Pending"}));
        let running = pod(&json!({"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}));
        let warning = |reason: &str| format!("{:?} {reason}", EventType::Warning);
        // (notice, pod, phase, pod reason, condition reason, event)
        let cases = [
            (
                Notice::phase("Pending", "NotSupportedOnVirtualNode", "why"),
                &pending,
                Some("Pending"),
                Some("NotSupportedOnVirtualNode"),
                None,
                warning("NotSupportedOnVirtualNode"),
            ),
            (
                Notice::not_created("Failed", "ProviderFailed", "NoStock", "why"),
                &pending,
                Some("Failed"),
                Some("ProviderFailed"),
                Some("NoStock"),
                warning("NoStock"),
            ),
            (
                Notice::container_config("side", "why"),
                &pending,
                Some("Pending"),
                Some(from_eci::CREATE_CONTAINER_CONFIG_ERROR),
                Some(from_eci::CREATE_CONTAINER_CONFIG_ERROR),
                warning(from_eci::CREATE_CONTAINER_CONFIG_ERROR),
            ),
            (
                Notice::lost("eci-1"),
                &running,
                Some("Failed"),
                Some("NotFound"),
                None,
                warning("NotFound"),
            ),
            (
                Notice::stopped(),
                &running,
                Some("Failed"),
                Some(DEADLINE_EXCEEDED),
                None,
                format!("{:?} {DEADLINE_EXCEEDED}", EventType::Normal),
            ),
            // A pod that no longer has a deadline (or not yet started) is not stopped.
            (Notice::stopped(), &pending, None, None, None, String::new()),
        ];
        for (notice, current, phase, reason, condition, event) in cases {
            let status = notice.status(current);
            let field = |key: &str| status.as_ref().and_then(|s| s[key].as_str());
            assert_eq!(field("phase"), phase, "{notice:?}");
            assert_eq!(field("reason"), reason, "{notice:?}");
            let shown = status.as_ref().and_then(|s| {
                let conditions = s["conditions"].as_array()?;
                let ours = conditions.iter().find(|c| c["type"] == INSTANCE_CREATED)?;
                ours["reason"].as_str().map(str::to_owned)
            });
            assert_eq!(shown.as_deref(), condition, "{notice:?}");
            if status.is_some() {
                let (kind, reason, note) = notice.event();
                assert_eq!(format!("{kind:?} {reason}"), event, "{notice:?}");
                assert_eq!(note, notice.message);
            }
        }
    }

    #[test]
    fn only_what_a_group_replaces_waits_for_no_group() {
        assert!(Notice::phase("Pending", "r", "m").before_group());
        assert!(Notice::not_created("Pending", "r", "c", "m").before_group());
        assert!(Notice::container_config("app", "m").before_group());
        assert!(!Notice::lost("eci-1").before_group());
        assert!(!Notice::stopped().before_group());
    }

    #[test]
    fn a_container_it_cannot_configure_waits_and_the_condition_replaces_an_older_one() {
        let current = pod(&json!({"phase": "Pending", "conditions": [
            {"type": INSTANCE_CREATED, "status": "False", "reason": "Old"},
        ]}));
        let status = Notice::container_config("side", "bad subPathExpr")
            .status(&current)
            .expect("a status");
        let waiting = |name: &str| {
            let containers = status["containerStatuses"].as_array().expect("containers");
            let found = containers.iter().find(|c| c["name"] == name).expect(name);
            found["state"]["waiting"]["reason"].clone()
        };
        assert_eq!(waiting("side"), from_eci::CREATE_CONTAINER_CONFIG_ERROR);
        assert_ne!(waiting("app"), from_eci::CREATE_CONTAINER_CONFIG_ERROR);
        let conditions = status["conditions"].as_array().expect("conditions");
        assert_eq!(conditions.len(), 1, "{conditions:?}");
        assert_eq!(
            conditions[0]["reason"],
            from_eci::CREATE_CONTAINER_CONFIG_ERROR
        );
    }
}
