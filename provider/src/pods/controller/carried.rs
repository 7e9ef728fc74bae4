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
//! - New values wait ([`Carried::Pending`]) for the pod's next status write; a pod that has
//!   none queued after [`FLUSH_AFTER_POLLS`] status polls gets a write of its own (its status
//!   as it shows, plus the annotations), so they never wait much longer than that.
//! - After a restart the values are not known: a pod already showing its group's id is taken
//!   to carry ours ([`Carried::adopt`]), so the first apply does not remove them.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::pods::to_eci::annotations::{
    EIP_ADDRESS, ENI_INSTANCE_ID, INSTANCE_ID, INSTANCE_SPEC, REQUEST_ID, VPC, ZONE,
};

/// Every annotation the daemon writes on a pod.
pub(super) const OURS: [&str; 7] = [
    INSTANCE_ID,
    REQUEST_ID,
    INSTANCE_SPEC,
    ENI_INSTANCE_ID,
    VPC,
    EIP_ADDRESS,
    ZONE,
];

/// Status polls a pod's new annotations wait for a status write before they get their own
/// (2 s at the default 1 s poll). A longer wait saved no writes, only delayed the annotations
/// (measured: docs/performance.md).
pub(super) const FLUSH_AFTER_POLLS: u8 = 2;

/// Annotation keys and values, shared between the entry and the write carrying them.
pub(super) type Values = Arc<[(&'static str, Box<str>)]>;

/// What of ours the pod's status applies carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Carried {
    /// Nothing: no group yet, or annotations another writer made (they are left alone).
    #[default]
    Nothing,
    /// To be written by the next apply; `polls` status polls went by without one.
    Pending { values: Values, polls: u8 },
    /// On the pod, owned by our applies: each one carries them again.
    Written(Values),
}

impl Carried {
    /// What the next apply carries.
    pub(super) fn values(&self) -> Option<&Values> {
        match self {
            Self::Nothing => None,
            Self::Pending { values, .. } | Self::Written(values) => Some(values),
        }
    }

    /// New values for the pod, over those it carries already (a key left out of `values`
    /// stays as it was): written by the next apply.
    pub(super) fn queue(&mut self, values: Values) {
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
        *self = Self::Pending { values, polls: 0 };
    }

    /// An apply carrying `sent` was stored: pending values it carried are written now.
    pub(super) fn stored(&mut self, sent: &Values) {
        if let Self::Pending { values, .. } = self
            && Arc::ptr_eq(values, sent)
        {
            *self = Self::Written(Arc::clone(sent));
        }
    }

    /// A status poll went by: whether the pending values are due a write of their own (once
    /// per [`FLUSH_AFTER_POLLS`] polls while they wait).
    pub(super) fn poll_passed(&mut self) -> bool {
        let Self::Pending { polls, .. } = self else {
            return false;
        };
        *polls += 1;
        if *polls < FLUSH_AFTER_POLLS {
            return false;
        }
        *polls = 0;
        true
    }

    /// Whether values wait for a write.
    pub(super) fn is_pending(&self) -> bool {
        matches!(self, Self::Pending { .. })
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

    #[test]
    fn pending_values_are_written_by_the_apply_that_carried_them() {
        let mut carried = Carried::default();
        assert_eq!(carried.values(), None, "nothing before a group");
        let sent = id("eci-1");
        carried.queue(Arc::clone(&sent));
        assert!(carried.is_pending());
        assert_eq!(carried.values(), Some(&sent), "the next apply carries them");
        carried.stored(&sent);
        assert_eq!(carried, Carried::Written(Arc::clone(&sent)));
        assert_eq!(carried.values(), Some(&sent), "and every apply after it");
    }

    #[test]
    fn values_queued_while_an_apply_was_in_flight_stay_pending() {
        let mut carried = Carried::default();
        let in_flight = id("eci-1");
        carried.queue(Arc::clone(&in_flight));
        // The pod's annotation was changed meanwhile: the id is queued again.
        let newer = id("eci-1");
        carried.queue(Arc::clone(&newer));
        carried.stored(&in_flight);
        assert!(carried.is_pending(), "{carried:?}");
        assert_eq!(carried.values(), Some(&newer));
    }

    #[test]
    fn pending_values_get_a_write_of_their_own_every_few_polls() {
        let mut carried = Carried::default();
        assert!(!carried.poll_passed(), "nothing pending");
        carried.queue(id("eci-1"));
        let every = usize::from(FLUSH_AFTER_POLLS);
        let due: Vec<usize> = (1..=3 * every).filter(|_| carried.poll_passed()).collect();
        assert_eq!(due, [every, 2 * every, 3 * every]);
        carried.stored(&carried.values().cloned().unwrap());
        assert!(!carried.poll_passed(), "written: nothing due");
    }

    #[test]
    fn a_restart_adopts_what_a_pod_showing_its_group_carries() {
        let shown = BTreeMap::from([
            (INSTANCE_ID, "eci-1"),
            (VPC, "vpc-1"),
            ("app.example.com/owner", "team-a"),
        ]);
        let lookup = |key: &str| shown.get(key).copied();
        let mut carried = Carried::default();
        carried.adopt("eci-2", lookup);
        assert_eq!(carried, Carried::Nothing, "another group's id is not ours");
        carried.adopt("eci-1", lookup);
        let values = carried.values().unwrap();
        assert_eq!(
            as_json(values),
            json!({INSTANCE_ID: "eci-1", VPC: "vpc-1"}),
            "only our keys"
        );
        let queued = id("eci-1");
        carried.queue(Arc::clone(&queued));
        carried.adopt("eci-1", lookup);
        assert_eq!(
            as_json(carried.values().unwrap()),
            json!({INSTANCE_ID: "eci-1", VPC: "vpc-1"}),
            "known values are kept; a key queued again keeps the rest"
        );
    }
}
