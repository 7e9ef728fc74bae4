//! The placement decisions, pure: which unit a node and a pod belong to, which pods count
//! against a unit, which unit a pod goes to under `whenTryNextUnits`, the scale-in cost of a
//! unit, the node affinity a policy pins pods to, and the sentence that explains a choice.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

use super::policy::{NextUnits, Resource, ResourcePolicySpec, Unit};
use crate::quantity::Quantity;
use crate::requests::Requests;

/// How virtual nodes are told apart (their label) and what pods need to run there (the
/// toleration of their taint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualNodes {
    /// The label every virtual node carries (`k8s.aliyun.com/vnode`).
    pub label_key: String,
    /// Its value (`true`).
    pub label_value: String,
    /// The taint's key.
    pub taint_key: String,
    /// The taint's value.
    pub taint_value: String,
    /// The taint's effect.
    pub taint_effect: String,
}

impl Default for VirtualNodes {
    fn default() -> Self {
        Self {
            label_key: "k8s.aliyun.com/vnode".into(),
            label_value: "true".into(),
            taint_key: "k8s.aliyun.com/vnode".into(),
            taint_value: "true".into(),
            taint_effect: "NoSchedule".into(),
        }
    }
}

impl VirtualNodes {
    /// Whether a node with `labels` is a virtual node.
    pub fn is_virtual(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.get(&self.label_key) == Some(&self.label_value)
    }
}

/// Whether `subset` is contained in `labels`.
fn contains_all(labels: &BTreeMap<String, String>, subset: &BTreeMap<String, String>) -> bool {
    subset.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether the policy's `selector` takes a pod with `labels`.
pub fn selects(spec: &ResourcePolicySpec, labels: &BTreeMap<String, String>) -> bool {
    contains_all(labels, &spec.selector)
}

/// Whether a node with `labels` belongs to `unit`.
pub fn node_in_unit(unit: &Unit, labels: &BTreeMap<String, String>, vnodes: &VirtualNodes) -> bool {
    let virtual_node = vnodes.is_virtual(labels);
    let kind = match unit.resource() {
        Resource::Ecs => !virtual_node,
        Resource::Eci => virtual_node,
    };
    kind && contains_all(labels, &unit.node_selector)
}

/// The first unit a node with `labels` belongs to (units may overlap; the earlier wins).
pub fn unit_of_node(
    spec: &ResourcePolicySpec,
    labels: &BTreeMap<String, String>,
    vnodes: &VirtualNodes,
) -> Option<usize> {
    spec.units
        .iter()
        .position(|unit| node_in_unit(unit, labels, vnodes))
}

/// Whether a pod carries what `unit` sets on its pods (required of the pods it counts).
pub fn carries_unit_marks(
    unit: &Unit,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> bool {
    unit.labels_to_set().all(|(k, v)| labels.get(k) == Some(v))
        && contains_all(annotations, &unit.pod_annotations)
}

/// The pod's `matchLabelKeys` group (`key=value,…`; empty when the policy does not group), or
/// the first key it lacks.
pub fn group_of(
    spec: &ResourcePolicySpec,
    labels: &BTreeMap<String, String>,
) -> Result<String, String> {
    let mut parts = Vec::with_capacity(spec.match_label_keys.len());
    for key in &spec.match_label_keys {
        let value = labels.get(key).ok_or_else(|| key.clone())?;
        parts.push(format!("{key}={value}"));
    }
    Ok(parts.join(","))
}

/// What the counting needs to know about a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFacts {
    /// Being deleted.
    pub terminating: bool,
    /// Succeeded or Failed: holds nothing any more.
    pub finished: bool,
    /// Created before the policy.
    pub predates_policy: bool,
}

/// Whether a policy's pod counts against its unit's limits.
pub fn counts(spec: &ResourcePolicySpec, pod: &PodFacts) -> bool {
    let left_out = pod.finished
        || (pod.terminating && spec.ignores_terminating())
        || (pod.predates_policy && spec.ignores_previous());
    !left_out
}

/// One unit as a pod about to be placed sees it (its own group's counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnitView {
    /// Pods counted in the unit, reservations for binds in flight included.
    pub pods: u32,
    /// Their requests, summed.
    pub used: Requests,
    /// The policy's pods being deleted in the unit (counted or not).
    pub terminating: u32,
    /// Whether some node of the unit can take the pod now.
    pub has_room: bool,
}

/// What a unit means for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitFit {
    /// Place it here.
    Place,
    /// Keep it pending for this unit (why).
    Wait(String),
    /// Try the next unit (why not this one).
    Next(String),
}

/// How full a unit is for one more pod, if at a limit: `full (max 2)`.
pub fn at_limit(unit: &Unit, view: &UnitView, requests: &Requests) -> Option<String> {
    if let Some(max) = unit.max
        && i64::from(view.pods) >= i64::from(max)
    {
        return Some(format!("full (max {max})"));
    }
    for (name, limit) in unit.max_resources().iter().flatten() {
        let used = view.used.get(name).copied().unwrap_or_default();
        let wanted = requests.get(name).copied().unwrap_or_default();
        if used + wanted > *limit {
            return Some(format!(
                "full (maxResources {name} {}: {} used, {} asked)",
                limit.canonical(),
                used.canonical(),
                wanted.canonical()
            ));
        }
    }
    None
}

fn has_limits(unit: &Unit) -> bool {
    unit.max.is_some() || unit.max_resources.as_ref().is_some_and(|m| !m.is_empty())
}

/// `whenTryNextUnits` for one unit. `waited` is how long the pod has been waiting (since it
/// was created); `timeout` is `TimeoutOrExceedMax`'s bound.
pub fn judge(
    next: NextUnits,
    timeout: Duration,
    unit: &Unit,
    view: &UnitView,
    requests: &Requests,
    waited: Duration,
) -> UnitFit {
    let full = at_limit(unit, view, requests);
    if full.is_none() && view.has_room {
        return UnitFit::Place;
    }
    let no_room = || "no node fits the pod".to_owned();
    match next {
        NextUnits::LackResourceOrExceedMax => UnitFit::Next(full.unwrap_or_else(no_room)),
        NextUnits::LackResourceAndNoTerminating => {
            if view.terminating > 0 {
                UnitFit::Wait(format!(
                    "{} of its pods still terminating (LackResourceAndNoTerminating)",
                    view.terminating
                ))
            } else {
                UnitFit::Next(full.unwrap_or_else(no_room))
            }
        }
        NextUnits::ExceedMax => match full {
            Some(full) => UnitFit::Next(full),
            None if !has_limits(unit) => UnitFit::Next(format!("{} and no max", no_room())),
            None => UnitFit::Wait("below its max but no node fits the pod (ExceedMax)".into()),
        },
        NextUnits::TimeoutOrExceedMax => match full {
            Some(full) => UnitFit::Next(full),
            None if has_limits(unit) || unit.waits_for_scaling() => {
                if waited >= timeout {
                    UnitFit::Next(format!(
                        "no node fitted within the {}s timeout",
                        timeout.as_secs()
                    ))
                } else {
                    UnitFit::Wait(format!(
                        "no node fits the pod yet; waiting up to {}s (TimeoutOrExceedMax), {}s left",
                        timeout.as_secs(),
                        timeout.saturating_sub(waited).as_secs()
                    ))
                }
            }
            None => UnitFit::Next(no_room()),
        },
    }
}

/// Where a pod goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Into unit `.0` (0-based).
    Place(usize),
    /// Pending, for unit `unit`.
    Wait {
        /// The unit waited for (0-based).
        unit: usize,
        /// Why.
        why: String,
    },
    /// No unit can take it.
    Nowhere,
}

/// The choice and the units passed over on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Where.
    pub destination: Destination,
    /// Units tried before, with why they were passed over (0-based).
    pub passed: Vec<(usize, String)>,
}

/// Walks the units in order. `views` has one entry per unit.
pub fn choose(
    spec: &ResourcePolicySpec,
    views: &[UnitView],
    requests: &Requests,
    waited: Duration,
) -> Choice {
    let (next, timeout) = (spec.next_units(), spec.timeout());
    let mut passed = Vec::new();
    for (index, (unit, view)) in spec.units.iter().zip(views).enumerate() {
        match judge(next, timeout, unit, view, requests, waited) {
            UnitFit::Place => {
                return Choice {
                    destination: Destination::Place(index),
                    passed,
                };
            }
            UnitFit::Wait(why) => {
                return Choice {
                    destination: Destination::Wait { unit: index, why },
                    passed,
                };
            }
            UnitFit::Next(why) => passed.push((index, why)),
        }
    }
    Choice {
        destination: Destination::Nowhere,
        passed,
    }
}

fn unit_name(spec: &ResourcePolicySpec, index: usize) -> String {
    let description = spec
        .units
        .get(index)
        .map(Unit::describe)
        .unwrap_or_default();
    format!("unit {} ({description})", index + 1)
}

fn passed_over(spec: &ResourcePolicySpec, passed: &[(usize, String)]) -> String {
    passed
        .iter()
        .map(|(i, why)| format!("{} {why}", unit_name(spec, *i)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The choice in one sentence, for Events and logs:
/// `placed in unit 2 (ecs paidtype=pay-as-you-go): unit 1 (ecs paidtype=subscription) full (max 2)`.
pub fn explain(spec: &ResourcePolicySpec, choice: &Choice) -> String {
    let before = passed_over(spec, &choice.passed);
    let tail = if before.is_empty() {
        String::new()
    } else {
        format!(": {before}")
    };
    match &choice.destination {
        Destination::Place(unit) => format!("placed in {}{tail}", unit_name(spec, *unit)),
        Destination::Wait { unit, why } => {
            format!("waiting for {}: {why}{}", unit_name(spec, *unit), {
                if before.is_empty() {
                    String::new()
                } else {
                    format!(" (passed over: {before})")
                }
            })
        }
        Destination::Nowhere => format!("no unit can take the pod{tail}"),
    }
}

/// The scale-in cost of pods in unit `index` of `count`: earlier units cost more, so the
/// ReplicaSet controller removes pods of later units first.
pub fn deletion_cost(index: usize, count: usize) -> i32 {
    let rank = count.saturating_sub(index).min(10_000);
    i32::try_from(rank * 100).unwrap_or(i32::MAX)
}

/// The node selector term that picks `unit`'s nodes.
pub fn unit_term(unit: &Unit, vnodes: &VirtualNodes) -> NodeSelectorTerm {
    let mut expressions: Vec<NodeSelectorRequirement> = unit
        .node_selector
        .iter()
        .map(|(k, v)| NodeSelectorRequirement {
            key: k.clone(),
            operator: "In".into(),
            values: Some(vec![v.clone()]),
        })
        .collect();
    let vnode = NodeSelectorRequirement {
        key: vnodes.label_key.clone(),
        operator: match unit.resource() {
            Resource::Eci => "In".into(),
            Resource::Ecs => "NotIn".into(),
        },
        values: Some(vec![vnodes.label_value.clone()]),
    };
    if !expressions.iter().any(|e| e.key == vnode.key) {
        expressions.push(vnode);
    }
    NodeSelectorTerm {
        match_expressions: Some(expressions),
        match_fields: None,
    }
}

/// The required terms pinning a pod to `units` (an OR), ANDed with what the pod already
/// requires (`existing`, itself an OR): every pair merged, so nothing the pod asked for is
/// loosened. An empty result cannot happen when `units` is not empty.
pub fn pin_terms(
    units: &[&Unit],
    vnodes: &VirtualNodes,
    existing: &[NodeSelectorTerm],
) -> Vec<NodeSelectorTerm> {
    let ours: Vec<NodeSelectorTerm> = units.iter().map(|u| unit_term(u, vnodes)).collect();
    if existing.is_empty() {
        return ours;
    }
    let mut merged = Vec::with_capacity(existing.len() * ours.len());
    for theirs in existing {
        for our in &ours {
            let mut expressions = theirs.match_expressions.clone().unwrap_or_default();
            for e in our.match_expressions.iter().flatten() {
                if !expressions.contains(e) {
                    expressions.push(e.clone());
                }
            }
            let term = NodeSelectorTerm {
                match_expressions: Some(expressions),
                match_fields: theirs.match_fields.clone(),
            };
            if !merged.contains(&term) {
                merged.push(term);
            }
        }
    }
    merged
}

/// Whether `requests` fit in what is left of a node (`allocatable` minus `requested`); a
/// resource the node does not list fits only if nothing is asked of it.
pub fn fits(allocatable: &Requests, requested: &Requests, requests: &Requests) -> bool {
    requests.iter().all(|(name, asked)| {
        if *asked == Quantity::default() {
            return true;
        }
        let Some(total) = allocatable.get(name) else {
            return false;
        };
        let used = requested.get(name).copied().unwrap_or_default();
        used + *asked <= *total
    })
}

#[cfg(test)]
mod tests;
