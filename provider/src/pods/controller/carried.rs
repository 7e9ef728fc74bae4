//! The annotations the daemon writes on a pod — its group's id and what ECI said of the group
//! (see `to_eci::annotations::written_back` and `described`) — ride on the pod's status
//! applies instead of costing a pod write of their own.
//!
//! Rules:
//! - The `pods/status` subresource keeps a change of `metadata.annotations` (Kubernetes
//!   v1.37's `podStatusStrategy` resets only `spec`, `metadata.deletionTimestamp` and
//!   `metadata.ownerReferences`), so one server-side apply writes the status and these.
//! - Once an apply of ours wrote them, our field manager owns them on that subresource: every
//!   later apply carries them again, since an apply that left them out would remove them.
//! - New values wait ([`OwnAnnotations::Pending`]) for the pod's next status write; a pod that has
//!   none within [`FLUSH_AFTER_POLLS`] status poll intervals gets a write of its own (its status
//!   as it shows, plus the annotations), so they never wait much longer than that. The wait is
//!   a time, not a count: the pod's sync is queued for when it ends ([`OwnAnnotations::due_in`]),
//!   so no poll has to look for pods whose values wait.
//! - After a restart the values are not known: a pod already showing its group's id is taken
//!   to carry ours ([`OwnAnnotations::adopt`]), so the first apply does not remove them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::time::Instant;

#[cfg(test)]
use vne_core::to_eci::annotations::{EIP_ADDRESS, REQUEST_ID, VPC, ZONE};
use vne_core::to_eci::annotations::{INSTANCE_ID, WRITTEN_BACK as OURS};

/// Status poll intervals a pod's new annotations wait for a status write before they get their
/// own (2 s at the default 1 s poll). A longer wait saved no writes, only delayed the
/// annotations (measured: docs/performance.md).
pub(super) const FLUSH_AFTER_POLLS: u32 = 2;

/// Whether annotations of ours wait for a status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backlog {
    /// None wait.
    Empty,
    /// Some wait for the pod's next status write.
    Pending,
    /// Some waited their whole wait: they are due a write of their own.
    Due,
}

/// Annotation keys and values, shared between the entry and the write carrying them.
pub(super) type Values = Arc<[(&'static str, Box<str>)]>;

/// What of ours the pod's status applies carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum OwnAnnotations {
    /// Nothing: no group yet, or annotations another writer made (they are left alone).
    #[default]
    Nothing,
    /// To be written by the next apply; queued `since` then.
    Pending { values: Values, since: Instant },
    /// On the pod, owned by our applies: each one carries them again.
    Written(Values),
}

impl OwnAnnotations {
    /// What the next apply carries.
    pub(super) fn values(&self) -> Option<&Values> {
        match self {
            Self::Nothing => None,
            Self::Pending { values, .. } | Self::Written(values) => Some(values),
        }
    }

    /// New values for the pod, over those it carries already (a key left out of `values`
    /// stays as it was): written by the next apply. `now`: when they are queued.
    pub(super) fn queue(&mut self, values: Values, now: Instant) {
        let values = match self.values() {
            Some(known) if known.iter().any(|(key, _)| !has(&values, key)) => known
                .iter()
                .filter(|(key, _)| !has(&values, key))
                .chain(values.iter())
                .cloned()
                .collect::<Vec<_>>()
                .into(),
            _ => values,
        };
        *self = Self::Pending { values, since: now };
    }

    /// An apply carrying `sent` was stored: pending values it carried are written now.
    pub(super) fn stored(&mut self, sent: &Values) {
        if let Self::Pending { values, .. } = self
            && Arc::ptr_eq(values, sent)
        {
            *self = Self::Written(Arc::clone(sent));
        }
    }

    /// How long values wait for a write at `now`, `wait` being how long they may (see
    /// [`Backlog`]).
    pub(super) fn backlog(&self, now: Instant, wait: Duration) -> Backlog {
        match self {
            Self::Pending { since, .. } if now.duration_since(*since) >= wait => Backlog::Due,
            Self::Pending { .. } => Backlog::Pending,
            Self::Nothing | Self::Written(_) => Backlog::Empty,
        }
    }

    /// How long from `now` until the pending values are next due a write of their own: at the
    /// end of their `wait`, and again at every `wait` while they still wait (a write of theirs
    /// failed). `None`: nothing waits.
    pub(super) fn due_in(&self, now: Instant, wait: Duration) -> Option<Duration> {
        let Self::Pending { since, .. } = self else {
            return None;
        };
        let waited = now.duration_since(*since).as_nanos();
        let wait_nanos = wait.as_nanos().max(1);
        let left = wait_nanos - waited % wait_nanos;
        Some(Duration::from_nanos(
            u64::try_from(left).unwrap_or(u64::MAX),
        ))
    }

    /// After a restart: a pod that shows `group` as its instance id carries our annotations
    /// (as it shows them) from now on. Anything else is left as it is.
    pub(super) fn adopt<'a>(&mut self, group: &str, shown: impl Fn(&str) -> Option<&'a str>) {
        if *self != Self::Nothing || shown(INSTANCE_ID) != Some(group) {
            return;
        }
        let values: Vec<(&'static str, Box<str>)> = OURS
            .iter()
            .filter_map(|key| shown(key).map(|value| (*key, value.into())))
            .collect();
        *self = Self::Written(values.into());
    }
}

fn has(values: &Values, key: &str) -> bool {
    values.iter().any(|(known, _)| *known == key)
}

/// The values as an `annotations` object of an apply.
pub(super) fn as_json(values: &Values) -> Value {
    let map: Map<String, Value> = values
        .iter()
        .map(|(key, value)| ((*key).to_owned(), Value::String(value.to_string())))
        .collect();
    Value::Object(map)
}

/// Our annotations the pod shows (non-empty) that ECI gave no value for: a pod author's (or
/// a stale) claim in a field other controllers read as ours. The apply carrying `carried`
/// writes each of them empty; owned by our manager from then on (the apply is forced), the next
/// apply, which leaves them out, removes them.
pub(super) fn contradicted<'a>(
    carried: &Values,
    shown: impl Fn(&str) -> Option<&'a str>,
) -> Vec<&'static str> {
    OURS.iter()
        .copied()
        .filter(|key| !has(carried, key) && shown(key).is_some_and(|v| !v.is_empty()))
        .collect()
}

/// Whether `manager`'s writes own the pod's annotation `key` (its managed fields say so): after
/// a restart only those are taken to be ours, never a value a pod author set.
pub(super) fn written_by(pod: &k8s_openapi::api::core::v1::Pod, manager: &str, key: &str) -> bool {
    let pointer = format!(
        "/f:metadata/f:annotations/f:{}",
        key.replace('~', "~0").replace('/', "~1")
    );
    pod.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.manager.as_deref() == Some(manager))
        .any(|entry| {
            entry
                .fields_v1
                .as_ref()
                .is_some_and(|fields| fields.0.pointer(&pointer).is_some())
        })
}

/// Values from a map of annotations.
pub(super) fn values<'a>(from: impl IntoIterator<Item = (&'static str, &'a str)>) -> Values {
    from.into_iter()
        .map(|(key, value)| (key, Box::from(value)))
        .collect::<Vec<_>>()
        .into()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn id(group: &str) -> Values {
        values([(INSTANCE_ID, group)])
    }

    const WAIT: Duration = Duration::from_secs(2);

    #[test]
    fn pending_values_are_written_by_the_apply_that_carried_them() {
        let mut carried = OwnAnnotations::default();
        assert_eq!(carried.values(), None, "nothing before a group");
        let sent = id("eci-1");
        let now = Instant::now();
        carried.queue(Arc::clone(&sent), now);
        assert_eq!(carried.backlog(now, WAIT), Backlog::Pending);
        assert_eq!(carried.values(), Some(&sent), "the next apply carries them");
        carried.stored(&sent);
        assert_eq!(carried, OwnAnnotations::Written(Arc::clone(&sent)));
        assert_eq!(carried.values(), Some(&sent), "and every apply after it");
    }

    #[test]
    fn values_queued_while_an_apply_was_in_flight_stay_pending() {
        let mut carried = OwnAnnotations::default();
        let in_flight = id("eci-1");
        let now = Instant::now();
        carried.queue(Arc::clone(&in_flight), now);
        // The pod's annotation was changed meanwhile: the id is queued again.
        let newer = id("eci-1");
        carried.queue(Arc::clone(&newer), now);
        carried.stored(&in_flight);
        assert_eq!(carried.backlog(now, WAIT), Backlog::Pending, "{carried:?}");
        assert_eq!(carried.values(), Some(&newer));
    }

    #[test]
    fn pending_values_are_due_a_write_of_their_own_at_the_end_of_each_wait() {
        let mut carried = OwnAnnotations::default();
        let queued = Instant::now();
        assert_eq!(carried.due_in(queued, WAIT), None, "nothing pending");
        carried.queue(id("eci-1"), queued);
        let second = Duration::from_secs(1);
        // (time since queued, backlog, time left until due)
        let table = [
            (Duration::ZERO, Backlog::Pending, WAIT),
            (second / 2, Backlog::Pending, WAIT - second / 2),
            (WAIT, Backlog::Due, WAIT),
            (WAIT + second / 2, Backlog::Due, WAIT - second / 2),
            (3 * WAIT, Backlog::Due, WAIT),
        ];
        for (waited, backlog, left) in table {
            let now = queued + waited;
            assert_eq!(carried.backlog(now, WAIT), backlog, "{waited:?}");
            assert_eq!(carried.due_in(now, WAIT), Some(left), "{waited:?}");
        }
        carried.stored(&carried.values().cloned().unwrap());
        let later = queued + 3 * WAIT;
        assert_eq!(carried.backlog(later, WAIT), Backlog::Empty, "written");
        assert_eq!(carried.due_in(later, WAIT), None, "written: nothing due");
    }

    #[test]
    fn a_restart_adopts_what_a_pod_showing_its_group_carries() {
        let shown = BTreeMap::from([
            (INSTANCE_ID, "eci-1"),
            (VPC, "vpc-1"),
            ("app.example.com/owner", "team-a"),
        ]);
        let lookup = |key: &str| shown.get(key).copied();
        let mut carried = OwnAnnotations::default();
        carried.adopt("eci-2", lookup);
        assert_eq!(
            carried,
            OwnAnnotations::Nothing,
            "another group's id is not ours"
        );
        carried.adopt("eci-1", lookup);
        let values = carried.values().unwrap();
        assert_eq!(
            as_json(values),
            json!({INSTANCE_ID: "eci-1", VPC: "vpc-1"}),
            "only our keys"
        );
        let queued = id("eci-1");
        carried.queue(Arc::clone(&queued), Instant::now());
        carried.adopt("eci-1", lookup);
        assert_eq!(
            as_json(carried.values().unwrap()),
            json!({INSTANCE_ID: "eci-1", VPC: "vpc-1"}),
            "known values are kept; a key queued again keeps the rest"
        );
    }

    #[test]
    fn our_annotations_ecis_answer_left_out_are_cleared_when_the_pod_shows_them() {
        let carried = values([(INSTANCE_ID, "eci-1"), (VPC, "vpc-real")]);
        // (what the pod shows, the keys the apply writes empty)
        type Explained = Vec<(&'static str, &'static str)>;
        let table: Vec<(Explained, Vec<&str>)> = vec![
            (vec![(INSTANCE_ID, "eci-1"), (VPC, "vpc-real")], vec![]),
            (vec![(EIP_ADDRESS, "6.6.6.6")], vec![EIP_ADDRESS]),
            (
                vec![
                    (ZONE, "cn-hangzhou-k"),
                    (REQUEST_ID, "forged"),
                    (EIP_ADDRESS, ""),
                ],
                vec![REQUEST_ID, ZONE],
            ),
            // OwnAnnotations keys are written with ECI's value anyway (the apply is forced).
            (vec![(VPC, "vpc-theirs")], vec![]),
            (vec![("k8s.aliyun.com/other", "x")], vec![]),
        ];
        for (shown, cleared) in table {
            let map: BTreeMap<&str, &str> = shown.iter().copied().collect();
            let mut got = contradicted(&carried, |key| map.get(key).copied());
            got.sort_unstable();
            let mut want = cleared.clone();
            want.sort_unstable();
            assert_eq!(got, want, "{shown:?}");
        }
    }

    #[test]
    fn only_annotations_our_writes_own_are_ours_after_a_restart() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({"metadata": {
            "name": "p",
            "annotations": {VPC: "vpc-real", EIP_ADDRESS: "6.6.6.6"},
            "managedFields": [
                {"manager": "virtual-node-eci", "operation": "Apply", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {
                     format!("f:{VPC}"): {}, format!("f:{INSTANCE_ID}"): {}}}}},
                {"manager": "kubectl-create", "operation": "Update",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {
                     format!("f:{EIP_ADDRESS}"): {}}}}},
            ],
        }}))
        .unwrap();
        assert!(written_by(&pod, "virtual-node-eci", VPC));
        assert!(!written_by(&pod, "virtual-node-eci", EIP_ADDRESS));
        assert!(written_by(&pod, "kubectl-create", EIP_ADDRESS));
        assert!(!written_by(&pod, "virtual-node-eci", ZONE));
    }
}
