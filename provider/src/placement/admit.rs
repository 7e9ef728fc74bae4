//! The admission side of placement, called by the webhook for each pod CREATE (after the
//! Selector engine): a pod a policy selects gets the virtual-node toleration when the policy
//! has an `eci` unit, and a required node affinity — the OR of every unit when the scheduler
//! extender orders them, or just the chosen unit when no extender serves (admission-time
//! placement, as OpenKruise's WorkloadSpread does). What the pod already requires is kept:
//! the affinity only narrows.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorTerm, Pod, Toleration,
};
use vne_core::placement::decide::{self, Destination};
use vne_core::placement::policy::{Resource, Unit};

use super::state::{
    PLACED_BY_ANNOTATION, PlacementIndex, PodEntry, REASON_ANNOTATION, RESERVATION_ANNOTATION,
    grant,
};

/// Who enforces the unit order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// kube-scheduler, through the extender: admission only narrows to the units.
    Extender,
    /// Nobody at scheduling time: admission picks the unit (why no extender).
    Admission {
        /// Why, for logs and Events.
        why: String,
    },
}

/// What admission did to a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// The pod as it should be created.
    pub pod: Pod,
    /// The policy (`namespace/name`).
    pub policy: String,
    /// The unit chosen at admission (0-based), when admission chose.
    pub unit: Option<usize>,
    /// The decision in one sentence (an Event on the pod when admission chose).
    pub note: String,
}

/// Applies the policy that selects `pod`, if any. `dry_run` decides without reserving.
pub fn admit(
    index: &PlacementIndex,
    mut pod: Pod,
    enforcement: &Enforcement,
    dry_run: bool,
    now: SystemTime,
) -> Option<Admitted> {
    let entry = PodEntry::of(&pod);
    let policy = index.policy_for(&entry.namespace, &entry.labels)?;
    let spec = &policy.policy.spec;
    let vnodes = index.vnodes();
    if spec.units.iter().any(|u| u.resource() == Resource::Eci) {
        tolerate(&mut pod, vnodes);
    }
    let every_unit: Vec<&Unit> = spec.units.iter().collect();
    let (units, chosen, note) = match enforcement {
        Enforcement::Extender => (
            every_unit,
            None,
            "limited to the policy's units; kube-scheduler's extender picks the unit".to_owned(),
        ),
        Enforcement::Admission { why } => match index.choose(&policy, &entry, None, now) {
            Err(refusal) => (every_unit, None, refusal.to_string()),
            Ok((choice, _)) => {
                let explanation = decide::explain(spec, &choice);
                match choice.destination {
                    Destination::Place(unit) | Destination::Wait { unit, .. } => {
                        let id = uuid::Uuid::new_v4().to_string();
                        let granted = if dry_run {
                            Ok(grant(&policy, unit))
                        } else {
                            index.reserve_unit(&policy, &entry, unit, &id)
                        };
                        match granted {
                            Ok(granted) => {
                                let meta = &mut pod.metadata;
                                let labels = meta.labels.get_or_insert_with(Default::default);
                                labels.extend(granted.labels);
                                let annotations =
                                    meta.annotations.get_or_insert_with(Default::default);
                                annotations.extend(granted.annotations);
                                annotations.insert(PLACED_BY_ANNOTATION.into(), "admission".into());
                                annotations.insert(RESERVATION_ANNOTATION.into(), id);
                                let note = format!("{explanation} (at admission: {why})");
                                annotations.insert(REASON_ANNOTATION.into(), note.clone());
                                (vec![&spec.units[unit]], Some(unit), note)
                            }
                            Err(refusal) => (every_unit, None, refusal.to_string()),
                        }
                    }
                    Destination::Nowhere => (every_unit, None, explanation),
                }
            }
        },
    };
    pin(&mut pod, &units, vnodes);
    Some(Admitted {
        pod,
        policy: policy.key.clone(),
        unit: chosen,
        note,
    })
}

fn tolerate(pod: &mut Pod, vnodes: &decide::VirtualNodes) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    let covered = tolerations.iter().any(|t| {
        let key_matches = t.key.as_deref().is_none_or(str::is_empty)
            && t.operator.as_deref() == Some("Exists")
            || t.key.as_deref() == Some(vnodes.taint_key.as_str());
        let effect_matches = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == vnodes.taint_effect);
        let value_matches = t.operator.as_deref() == Some("Exists")
            || t.value.as_deref().unwrap_or_default() == vnodes.taint_value;
        key_matches && effect_matches && value_matches
    });
    if !covered {
        tolerations.push(Toleration {
            key: Some(vnodes.taint_key.clone()),
            operator: Some("Equal".into()),
            value: Some(vnodes.taint_value.clone()),
            effect: Some(vnodes.taint_effect.clone()),
            toleration_seconds: None,
        });
    }
}

fn pin(pod: &mut Pod, units: &[&Unit], vnodes: &decide::VirtualNodes) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let existing: Vec<NodeSelectorTerm> = node_affinity
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: decide::pin_terms(units, vnodes, &existing),
    });
}

#[cfg(test)]
mod tests;
