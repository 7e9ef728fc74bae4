//! The Selector engine (pure): given a pod, its namespace's labels, the Selectors, the
//! ConfigMap selectors and a capacity view, the mutated pod and why.
//!
//! - **CRD Selectors** first: of those matching, the highest `priority` wins and only it
//!   applies. Ties go to the oldest Selector (`creationTimestamp`), then to the smaller
//!   `<namespace>/<name>` — the same answer on every replica, every time. Its effect
//!   overwrites existing keys.
//! - Otherwise the **ConfigMap selectors** (the legacy `eci-profile` ConfigMap, then the
//!   built-in defaults): every matching one sends the pod to virtual nodes and adds its effect
//!   without overwriting keys the pod has; earlier selectors win.
//! - A Selector without a policy behaves as `virtualNodeOnly`, as in eci-profile.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PreferredSchedulingTerm, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::ResourceExt;
use serde::{Deserialize, Serialize};

use super::crd::{Effect, NamespaceResourceLimit, Policy, Selector};
use super::labels;
use crate::quantity::{Quantity, QuantityError};
use crate::requests;

/// Annotation: which Selector placed the pod.
pub const SELECTOR_ANNOTATION: &str = "virtual-node-eci.aliyun.com/selector";
/// Annotation: the policy that placed the pod (the Unschedulable watcher reads it).
pub const POLICY_ANNOTATION: &str = "virtual-node-eci.aliyun.com/policy";
/// Annotation: an effect to apply only once the pod is bound to a virtual node (fair and
/// normalNodePrefer); the daemon applies it before it creates the container group.
pub const PENDING_EFFECT_ANNOTATION: &str = "virtual-node-eci.aliyun.com/pending-effect";

/// How virtual nodes are marked (from the daemon's configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vnode {
    /// Taint key (`k8s.aliyun.com/vnode`).
    pub taint_key: String,
    /// Taint value (`true`).
    pub taint_value: String,
    /// Taint effect (`NoSchedule`).
    pub taint_effect: String,
    /// Node label key (`k8s.aliyun.com/vnode`).
    pub label_key: String,
    /// Node label value (`true`).
    pub label_value: String,
}

impl Default for Vnode {
    fn default() -> Self {
        Self {
            taint_key: "k8s.aliyun.com/vnode".into(),
            taint_value: "true".into(),
            taint_effect: "NoSchedule".into(),
            label_key: "k8s.aliyun.com/vnode".into(),
            label_value: "true".into(),
        }
    }
}

/// CPU (cores) and memory (bytes), exact: budgets are compared with sums of requests, and
/// floats drift (ten requests of `100m` would exceed a budget of `1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// Cores.
    pub cpu: Quantity,
    /// Bytes.
    pub memory: Quantity,
}

impl Resources {
    fn plus(self, other: Self) -> Self {
        Self {
            cpu: self.cpu + other.cpu,
            memory: self.memory + other.memory,
        }
    }
}

/// What the cluster's capacity looks like (from the daemon's caches).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Capacity {
    /// Allocatable of schedulable normal nodes.
    pub normal_allocatable: Resources,
    /// Requests of pods bound to normal nodes.
    pub normal_requested: Resources,
    /// Requests of pods bound to virtual nodes, by namespace.
    pub vnode_requested: HashMap<String, Resources>,
}

/// Where a rule sends pods.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Virtual nodes only.
    VirtualNodeOnly,
    /// Toleration only.
    Fair,
    /// Normal nodes first.
    NormalNodePrefer {
        /// Percent of normal CPU requested at which pods may spill at once.
        cpu_ratio: Option<u32>,
        /// Percent of normal memory requested at which pods may spill at once.
        memory_ratio: Option<u32>,
    },
    /// Never virtual nodes.
    NormalNodeOnly,
    /// Virtual nodes for one namespace up to a budget.
    NamespaceResourceLimit {
        /// The namespace.
        namespace: String,
        /// The budget (a missing resource is unlimited).
        cpu: Option<Quantity>,
        /// The budget in bytes.
        memory: Option<Quantity>,
    },
}

impl Route {
    fn name(&self) -> &'static str {
        match self {
            Route::VirtualNodeOnly => "virtualNodeOnly",
            Route::Fair => "fair",
            Route::NormalNodePrefer { .. } => "normalNodePrefer",
            Route::NormalNodeOnly => "normalNodeOnly",
            Route::NamespaceResourceLimit { .. } => "namespaceResourceLimit",
        }
    }
}

/// Where a rule comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A Selector object.
    Crd {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its creationTimestamp (RFC 3339; sorts chronologically).
        created: String,
    },
    /// A selector of the legacy ConfigMap.
    Profile(String),
    /// A built-in default.
    Default(&'static str),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Crd {
                namespace, name, ..
            } => write!(f, "Selector {namespace}/{name}"),
            Origin::Profile(name) => write!(f, "eci-profile selector {name}"),
            Origin::Default(name) => write!(f, "built-in selector {name}"),
        }
    }
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Where it comes from.
    pub origin: Origin,
    /// Pod labels to match (None: any).
    pub object: Option<LabelSelector>,
    /// Namespace labels to match (None: any).
    pub namespace: Option<LabelSelector>,
    /// Labels to add.
    pub labels: BTreeMap<String, String>,
    /// Annotations to add.
    pub annotations: BTreeMap<String, String>,
    /// Where pods go.
    pub placement: Route,
    /// Priority (CRD rules).
    pub priority: i32,
}

fn ratio(value: Option<i64>, what: &str) -> Result<Option<u32>, String> {
    value
        .map(|v| {
            u32::try_from(v)
                .ok()
                .filter(|v| *v <= 100)
                .ok_or_else(|| format!("policy.normalNodePrefer.{what} must be 0–100, not {v}"))
        })
        .transpose()
}

fn selectors_of(
    object: Option<&LabelSelector>,
    namespace: Option<&LabelSelector>,
) -> Result<(), String> {
    if object.is_none() && namespace.is_none() {
        return Err("set objectLabels, namespaceLabels or both".into());
    }
    for (field, selector) in [("objectLabels", object), ("namespaceLabels", namespace)] {
        if let Some(selector) = selector {
            labels::validate(selector).map_err(|e| format!("{field}.{e}"))?;
        }
    }
    Ok(())
}

fn effect_maps(effect: Option<&Effect>) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let effect = effect.cloned().unwrap_or_default();
    (
        effect.labels.unwrap_or_default(),
        effect.annotations.unwrap_or_default(),
    )
}

/// Validates a Selector into a rule; the error says what to fix.
pub fn rule_from_selector(selector: &Selector) -> Result<Rule, String> {
    let spec = &selector.spec;
    selectors_of(spec.object_labels.as_ref(), spec.namespace_labels.as_ref())?;
    let mut set = placements_of(&spec.policy.clone().unwrap_or_default())?;
    if set.len() > 1 {
        return Err(format!(
            "policy sets {} policies ({}); set exactly one",
            set.len(),
            set.iter().map(Route::name).collect::<Vec<_>>().join(", ")
        ));
    }
    let (labels, annotations) = effect_maps(spec.effect.as_ref());
    Ok(Rule {
        origin: Origin::Crd {
            namespace: selector.namespace().unwrap_or_default(),
            name: selector.name_any(),
            created: selector
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
        },
        object: spec.object_labels.clone(),
        namespace: spec.namespace_labels.clone(),
        labels,
        annotations,
        // No policy: virtualNodeOnly, as eci-profile does.
        placement: set.pop().unwrap_or(Route::VirtualNodeOnly),
        priority: spec.priority.unwrap_or(0),
    })
}

/// Every placement the policy sets, each validated (a valid Selector sets at most one).
fn placements_of(policy: &Policy) -> Result<Vec<Route>, String> {
    let mut set: Vec<Route> = Vec::new();
    if policy.fair.is_some() {
        set.push(Route::Fair);
    }
    if let Some(prefer) = &policy.normal_node_prefer {
        set.push(Route::NormalNodePrefer {
            cpu_ratio: ratio(prefer.cpu_ratio, "cpuRatio")?,
            memory_ratio: ratio(prefer.memory_ratio, "memoryRatio")?,
        });
    }
    if policy.virtual_node_only.is_some() {
        set.push(Route::VirtualNodeOnly);
    }
    if policy.normal_node_only.is_some() {
        set.push(Route::NormalNodeOnly);
    }
    if let Some(limit) = &policy.namespace_resource_limit {
        set.push(namespace_limit(limit)?);
    }
    Ok(set)
}

/// A namespaceResourceLimit policy: a namespace and non-negative cpu and memory budgets.
fn namespace_limit(limit: &NamespaceResourceLimit) -> Result<Route, String> {
    if limit.namespace.is_empty() {
        return Err("policy.namespaceResourceLimit.namespace is empty".into());
    }
    let mut cpu = None;
    let mut memory = None;
    for (resource, value) in &limit.limits {
        let parsed = Quantity::parse(&value.0)
            .and_then(|q| {
                if q.is_negative() {
                    Err(QuantityError::Negative {
                        text: value.0.clone(),
                    })
                } else {
                    Ok(q)
                }
            })
            .map_err(|e| format!("policy.namespaceResourceLimit.limits.{resource}: {e}"))?;
        match resource.as_str() {
            "cpu" | "requests.cpu" => cpu = Some(parsed),
            "memory" | "requests.memory" => memory = Some(parsed),
            other => {
                return Err(format!(
                    "policy.namespaceResourceLimit.limits: {other:?} is not supported (use cpu and memory)"
                ));
            }
        }
    }
    Ok(Route::NamespaceResourceLimit {
        namespace: limit.namespace.clone(),
        cpu,
        memory,
    })
}

/// One selector of the legacy ConfigMap.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProfileSelector {
    name: Option<String>,
    #[serde(default)]
    namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    object_selector: Option<LabelSelector>,
    #[serde(default)]
    effect: Option<Effect>,
}

/// Parses the ConfigMap's `selectors` (a JSON array); the error names the bad entry.
pub fn rules_from_profile(text: &str) -> Result<Vec<Rule>, String> {
    let entries: Vec<ProfileSelector> = serde_json::from_str(text)
        .map_err(|e| format!("selectors is not a JSON array of selectors: {e}"))?;
    entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let name = entry
                .name
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("selector #{} has no name", index + 1))?;
            selectors_of(
                entry.object_selector.as_ref(),
                entry.namespace_selector.as_ref(),
            )
            .map_err(|e| format!("selector {name}: {e}"))?;
            let (labels, annotations) = effect_maps(entry.effect.as_ref());
            Ok(Rule {
                origin: Origin::Profile(name),
                object: entry.object_selector,
                namespace: entry.namespace_selector,
                labels,
                annotations,
                placement: Route::VirtualNodeOnly,
                priority: 0,
            })
        })
        .collect()
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        match_expressions: None,
    }
}

/// The built-in defaults: `alibabacloud.com/eci: "true"` on the pod or its namespace, and
/// namespaces labelled `virtual-node-affinity-injection=enabled`, go to virtual nodes.
pub fn default_rules() -> Vec<Rule> {
    let rule = |name, object, namespace| Rule {
        origin: Origin::Default(name),
        object,
        namespace,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        placement: Route::VirtualNodeOnly,
        priority: 0,
    };
    vec![
        rule(
            "eci-pod",
            Some(match_labels(&[("alibabacloud.com/eci", "true")])),
            None,
        ),
        rule(
            "eci-namespace",
            None,
            Some(match_labels(&[("alibabacloud.com/eci", "true")])),
        ),
        rule(
            "virtual-node-affinity-injection",
            None,
            Some(match_labels(&[(
                "virtual-node-affinity-injection",
                "enabled",
            )])),
        ),
    ]
}

/// Everything the engine looks at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The pod as submitted.
    pub pod: &'a Pod,
    /// Its namespace's labels.
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// Valid Selectors.
    pub selectors: &'a [Rule],
    /// The ConfigMap's selectors followed by the defaults.
    pub profile: &'a [Rule],
    /// The capacity view.
    pub capacity: &'a Capacity,
    /// How virtual nodes are marked.
    pub vnode: &'a Vnode,
    /// Which namespaces' pods a Selector reaches.
    pub scope: &'a Scope,
}

/// Which namespaces' pods a `Selector` (a namespaced object) reaches. ConfigMap selectors and
/// the defaults are the administrator's (they live in the daemon's configuration) and reach
/// every namespace whatever the scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A Selector reaches the pods of its own namespace; one in `home` (the daemon's
    /// namespace, which only administrators write) reaches every namespace. Whoever may
    /// create Selectors in a namespace steers that namespace's pods and no other's.
    Namespaced {
        /// The daemon's namespace.
        home: String,
    },
    /// Every Selector reaches every namespace (eci-profile's behaviour: creating a Selector
    /// anywhere is then an administrator's right).
    Cluster,
}

impl Scope {
    /// Whether a rule from `origin` may change a pod of `pod_namespace`.
    pub fn reaches(&self, origin: &Origin, pod_namespace: &str) -> bool {
        match (self, origin) {
            (Scope::Cluster, _) | (_, Origin::Profile(_) | Origin::Default(_)) => true,
            (Scope::Namespaced { home }, Origin::Crd { namespace, .. }) => {
                namespace == pod_namespace || namespace == home
            }
        }
    }
}

/// The engine's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The pod with every mutation applied (equal to the input when nothing applies).
    pub pod: Pod,
    /// Why, in one line (for logs and the admission response's audit annotation).
    pub reason: String,
    /// A warning for an Event on the pod (e.g. a namespace over its virtual-node budget).
    pub warning: Option<String>,
}

fn pod_labels(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

fn rule_matches(rule: &Rule, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
    rule.object
        .as_ref()
        .is_none_or(|s| labels::matches(s, &pod_labels(pod)))
        && rule
            .namespace
            .as_ref()
            .is_none_or(|s| labels::matches(s, namespace_labels))
}

fn tie_break_key(rule: &Rule) -> (i32, String, String) {
    match &rule.origin {
        Origin::Crd {
            namespace,
            name,
            created,
        } => (
            -rule.priority,
            if created.is_empty() {
                "~".to_owned()
            } else {
                created.clone()
            },
            format!("{namespace}/{name}"),
        ),
        other => (-rule.priority, "~".to_owned(), other.to_string()),
    }
}

/// The pod's CPU and memory requests as the scheduler counts them ([`requests::pod_requests`]).
pub fn pod_requests(pod: &Pod) -> Resources {
    let all = requests::pod_requests(pod);
    let get = |name: &str| all.get(name).copied().unwrap_or_default();
    Resources {
        cpu: get("cpu"),
        memory: get("memory"),
    }
}

/// Decides.
pub fn decide(input: Input<'_>) -> Decision {
    match crd_winner(input) {
        Some(rule) => apply_crd_rule(input, rule),
        None => apply_profile_rules(input),
    }
}

/// The Selector that applies to the pod: of those matching and reaching its namespace, the
/// first in [`tie_break_key`] order.
fn crd_winner<'a>(input: Input<'a>) -> Option<&'a Rule> {
    let pod_namespace = input.pod.namespace().unwrap_or_default();
    input
        .selectors
        .iter()
        .filter(|rule| rule_matches(rule, input.pod, input.namespace_labels))
        .filter(|rule| input.scope.reaches(&rule.origin, &pod_namespace))
        .filter(|rule| match &rule.placement {
            Route::NamespaceResourceLimit { namespace, .. } => *namespace == pod_namespace,
            _ => true,
        })
        .min_by_key(|rule| tie_break_key(rule))
}

/// Applies the winning Selector's placement and effect.
fn apply_crd_rule(input: Input<'_>, rule: &Rule) -> Decision {
    let mut pod = input.pod.clone();
    let mut warning = None;
    let mut reason = format!("{} ({})", rule.origin, rule.placement.name());
    annotate(
        &mut pod,
        SELECTOR_ANNOTATION,
        &match &rule.origin {
            Origin::Crd {
                namespace, name, ..
            } => format!("{namespace}/{name}"),
            other => other.to_string(),
        },
    );
    match &rule.placement {
        Route::VirtualNodeOnly => {
            to_virtual_nodes(&mut pod, input.vnode);
            apply_effect(&mut pod, rule, true);
        }
        Route::Fair => {
            tolerate(&mut pod, input.vnode);
            defer_effect(&mut pod, rule);
        }
        Route::NormalNodeOnly => {
            keep_off_virtual_nodes(&mut pod, input.vnode);
            apply_effect(&mut pod, rule, true);
        }
        Route::NormalNodePrefer {
            cpu_ratio,
            memory_ratio,
        } => {
            prefer_normal_nodes(&mut pod, input.vnode);
            annotate(&mut pod, POLICY_ANNOTATION, "normalNodePrefer");
            if let Some(spill) = spill_now(input.capacity, *cpu_ratio, *memory_ratio) {
                tolerate(&mut pod, input.vnode);
                reason += &spill;
            }
            defer_effect(&mut pod, rule);
        }
        Route::NamespaceResourceLimit {
            namespace,
            cpu,
            memory,
        } => {
            let used = input
                .capacity
                .vnode_requested
                .get(namespace)
                .copied()
                .unwrap_or_default();
            let wanted = used.plus(pod_requests(input.pod));
            if let Some(text) = over_budget(namespace, wanted, *cpu, *memory, &rule.origin) {
                keep_off_virtual_nodes(&mut pod, input.vnode);
                reason += &format!(": {text}");
                warning = Some(text);
            } else {
                to_virtual_nodes(&mut pod, input.vnode);
            }
            apply_effect(&mut pod, rule, true);
        }
    }
    Decision {
        pod,
        reason,
        warning,
    }
}

/// normalNodePrefer: when the normal nodes' requested share reaches a ratio, the pod may use
/// virtual nodes at once; the text (appended to the reason) says why.
fn spill_now(
    capacity: &Capacity,
    cpu_ratio: Option<u32>,
    memory_ratio: Option<u32>,
) -> Option<String> {
    let share = |requested: Quantity, allocatable: Quantity| {
        (allocatable.nanos() > 0).then(|| requested.as_f64() * 100.0 / allocatable.as_f64())
    };
    let cpu_share = share(
        capacity.normal_requested.cpu,
        capacity.normal_allocatable.cpu,
    );
    let memory_share = share(
        capacity.normal_requested.memory,
        capacity.normal_allocatable.memory,
    );
    let over = |limit: Option<u32>, share: Option<f64>| {
        limit.is_some_and(|l| share.is_some_and(|s| s >= f64::from(l)))
    };
    (over(cpu_ratio, cpu_share) || over(memory_ratio, memory_share)).then(|| {
        format!(
            ": normal nodes are {:.0}% (cpu) / {:.0}% (memory) requested, at or above the ratio: may use virtual nodes now",
            cpu_share.unwrap_or(0.0),
            memory_share.unwrap_or(0.0)
        )
    })
}

/// namespaceResourceLimit: the warning when `wanted` (the namespace's virtual-node requests
/// with this pod) exceeds the budget; `None` while it fits.
fn over_budget(
    namespace: &str,
    wanted: Resources,
    cpu: Option<Quantity>,
    memory: Option<Quantity>,
    origin: &Origin,
) -> Option<String> {
    let over_cpu = cpu.is_some_and(|limit| wanted.cpu > limit);
    let over_memory = memory.is_some_and(|limit| wanted.memory > limit);
    (over_cpu || over_memory).then(|| {
        format!(
            "namespace {namespace} would hold {:.3} cores and {:.0} MiB on virtual nodes, beyond the {} budget ({} cores, {} MiB): this pod stays on normal nodes",
            wanted.cpu.as_f64(),
            wanted.memory.as_f64() / 1_048_576.0,
            origin,
            cpu.map_or("unlimited".to_owned(), |c| format!("{:.3}", c.as_f64())),
            memory.map_or("unlimited".to_owned(), |m| format!(
                "{:.0}",
                m.as_f64() / 1_048_576.0
            )),
        )
    })
}

/// No Selector applies: every matching ConfigMap selector (then default) sends the pod to
/// virtual nodes, without overwriting what the pod has.
fn apply_profile_rules(input: Input<'_>) -> Decision {
    let mut pod = input.pod.clone();
    let matching: Vec<&Rule> = input
        .profile
        .iter()
        .filter(|rule| rule_matches(rule, input.pod, input.namespace_labels))
        .collect();
    if matching.is_empty() {
        return Decision {
            pod,
            reason: "no selector matches".into(),
            warning: None,
        };
    }
    to_virtual_nodes(&mut pod, input.vnode);
    for rule in &matching {
        apply_effect(&mut pod, rule, false);
    }
    annotate(
        &mut pod,
        SELECTOR_ANNOTATION,
        &matching[0].origin.to_string(),
    );
    Decision {
        pod,
        reason: format!(
            "{} (virtualNodeOnly)",
            matching
                .iter()
                .map(|r| r.origin.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        warning: None,
    }
}

fn annotate(pod: &mut Pod, key: &str, value: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
}

fn merge(
    target: &mut Option<BTreeMap<String, String>>,
    add: &BTreeMap<String, String>,
    overwrite: bool,
) {
    if add.is_empty() {
        return;
    }
    let map = target.get_or_insert_with(BTreeMap::new);
    for (key, value) in add {
        if overwrite || !map.contains_key(key) {
            map.insert(key.clone(), value.clone());
        }
    }
}

fn apply_effect(pod: &mut Pod, rule: &Rule, overwrite: bool) {
    merge(&mut pod.metadata.labels, &rule.labels, overwrite);
    merge(&mut pod.metadata.annotations, &rule.annotations, overwrite);
}

/// What the daemon applies once the pod is bound to a virtual node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEffect {
    /// Labels to add.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to add.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The webhook's seal (the daemon's `admission::seal` signs and checks it); empty until
    /// sealed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub seal: String,
}

fn defer_effect(pod: &mut Pod, rule: &Rule) {
    if rule.labels.is_empty() && rule.annotations.is_empty() {
        return;
    }
    let pending = PendingEffect {
        labels: rule.labels.clone(),
        annotations: rule.annotations.clone(),
        seal: String::new(),
    };
    annotate(
        pod,
        PENDING_EFFECT_ANNOTATION,
        &serde_json::to_string(&pending).unwrap_or_default(),
    );
}

/// What a pod's pending effect *claims* to add, unverified (or None when it has none or it
/// cannot be read): for judging the pod as it would be bound, never for applying — a pod
/// author can write the annotation; the daemon's seal check (`admission::seal`) says what to
/// apply.
pub fn pending_effect_patch(pod: &Pod) -> Option<serde_json::Value> {
    let text = pod.annotations().get(PENDING_EFFECT_ANNOTATION)?;
    let pending: PendingEffect = serde_json::from_str(text).ok()?;
    Some(effect_patch(&pending))
}

/// The metadata merge patch that applies `pending` (Selector values overwrite) and removes the
/// annotation that carried it.
pub fn effect_patch(pending: &PendingEffect) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    for (key, value) in &pending.annotations {
        annotations.insert(key.clone(), value.clone().into());
    }
    annotations.insert(
        PENDING_EFFECT_ANNOTATION.to_owned(),
        serde_json::Value::Null,
    );
    serde_json::json!({"metadata": {"labels": pending.labels, "annotations": annotations}})
}

/// Whether the pod tolerates the vnode taint already.
pub fn tolerates(pod: &Pod, vnode: &Vnode) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|t| {
            let effect_ok = t
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == vnode.taint_effect);
            let operator = t.operator.as_deref().unwrap_or("Equal");
            let key = t.key.as_deref().unwrap_or_default();
            effect_ok
                && match operator {
                    "Exists" => key.is_empty() || key == vnode.taint_key,
                    _ => {
                        key == vnode.taint_key
                            && t.value.as_deref().unwrap_or_default() == vnode.taint_value
                    }
                }
        })
}

/// The toleration of the vnode taint.
pub fn vnode_toleration(vnode: &Vnode) -> Toleration {
    Toleration {
        key: Some(vnode.taint_key.clone()),
        operator: Some("Equal".into()),
        value: Some(vnode.taint_value.clone()),
        effect: Some(vnode.taint_effect.clone()),
        toleration_seconds: None,
    }
}

fn tolerate(pod: &mut Pod, vnode: &Vnode) {
    if tolerates(pod, vnode) {
        return;
    }
    pod.spec
        .get_or_insert_with(Default::default)
        .tolerations
        .get_or_insert_with(Vec::new)
        .push(vnode_toleration(vnode));
}

fn to_virtual_nodes(pod: &mut Pod, vnode: &Vnode) {
    tolerate(pod, vnode);
    // One key added; the pod's other node selector keys stay.
    pod.spec
        .get_or_insert_with(Default::default)
        .node_selector
        .get_or_insert_with(BTreeMap::new)
        .insert(vnode.label_key.clone(), vnode.label_value.clone());
}

fn not_vnode(vnode: &Vnode) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: vnode.label_key.clone(),
        operator: "NotIn".into(),
        values: Some(vec![vnode.label_value.clone()]),
    }
}

fn node_affinity(pod: &mut Pod) -> &mut NodeAffinity {
    pod.spec
        .get_or_insert_with(Default::default)
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
}

fn keep_off_virtual_nodes(pod: &mut Pod, vnode: &Vnode) {
    let requirement = not_vnode(vnode);
    let required = node_affinity(pod)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    // Terms are ORed: the requirement goes into each of them.
    for term in &mut required.node_selector_terms {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        if !expressions.contains(&requirement) {
            expressions.push(requirement.clone());
        }
    }
}

fn prefer_normal_nodes(pod: &mut Pod, vnode: &Vnode) {
    let term = PreferredSchedulingTerm {
        weight: 100,
        preference: NodeSelectorTerm {
            match_expressions: Some(vec![not_vnode(vnode)]),
            match_fields: None,
        },
    };
    let preferred = node_affinity(pod)
        .preferred_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new);
    if !preferred.contains(&term) {
        preferred.push(term);
    }
}

#[cfg(test)]
mod helper_tests {
    use super::*;

    fn resources(cpu: &str, memory: &str) -> Resources {
        Resources {
            cpu: Quantity::parse(cpu).unwrap(),
            memory: Quantity::parse(memory).unwrap(),
        }
    }

    #[test]
    fn pods_spill_once_a_normal_share_reaches_its_ratio() {
        let capacity = Capacity {
            normal_allocatable: resources("10", "10Gi"),
            normal_requested: resources("8", "1Gi"),
            ..Capacity::default()
        };
        assert_eq!(spill_now(&capacity, None, None), None);
        assert_eq!(spill_now(&capacity, Some(90), Some(50)), None);
        let spill = spill_now(&capacity, Some(80), None).unwrap();
        assert!(spill.contains("80% (cpu) / 10% (memory)"), "{spill}");
        assert!(spill_now(&capacity, None, Some(10)).is_some());
        let empty = Capacity::default();
        assert_eq!(
            spill_now(&empty, Some(0), Some(0)),
            None,
            "no normal capacity: no share to compare"
        );
    }

    #[test]
    fn a_namespace_over_either_budget_is_warned_about() {
        let origin = Origin::Default("test");
        let wanted = resources("2", "1Gi");
        let cpu = |text: &str| Some(Quantity::parse(text).unwrap());
        assert_eq!(
            over_budget("ns", wanted, cpu("2"), cpu("1Gi"), &origin),
            None
        );
        assert_eq!(over_budget("ns", wanted, None, None, &origin), None);
        let text = over_budget("ns", wanted, cpu("1.5"), None, &origin).unwrap();
        assert!(
            text.contains("namespace ns would hold 2.000 cores and 1024 MiB"),
            "{text}"
        );
        assert!(text.contains("(1.500 cores, unlimited MiB)"), "{text}");
        assert!(over_budget("ns", wanted, None, cpu("512Mi"), &origin).is_some());
    }
}
