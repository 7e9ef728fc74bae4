//! What placement knows of the cluster, fed by watches: ResourcePolicies, nodes (labels,
//! allocatable) and pods (slim: what counting needs), plus the reservations of binds and
//! admissions in flight. Counting and reserving happen under one lock, so two binds can never
//! both take a unit's last place.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use tracing::warn;
use vne_core::placement::decide::{self, Choice, Destination, PodFacts, UnitView, VirtualNodes};
use vne_core::placement::policy::ResourcePolicy;

use crate::k8s::quantity::Quantity;
use crate::k8s::requests::{self, Requests};

/// Annotation: the unit (1-based) a pod was placed in, and by whom.
pub const UNIT_ANNOTATION: &str = "placement.virtual-node-eci.aliyun.com/unit";
/// Annotation: the policy that placed the pod (`namespace/name`).
pub const POLICY_ANNOTATION: &str = "placement.virtual-node-eci.aliyun.com/policy";
/// Annotation: how the pod was placed (`extender` or `admission`).
pub const PLACED_BY_ANNOTATION: &str = "placement.virtual-node-eci.aliyun.com/placed-by";
/// Annotation: why admission placed the pod where it did (published as an Event once bound).
pub const REASON_ANNOTATION: &str = "placement.virtual-node-eci.aliyun.com/reason";
/// Annotation: an admission-time reservation's id (until the pod shows up in the index).
pub const RESERVATION_ANNOTATION: &str = "placement.virtual-node-eci.aliyun.com/reservation";
/// The ReplicaSet controller's scale-in order.
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// How long a reservation waits to be seen before it lapses (a bind or admission that never
/// completed).
const RESERVATION_TTL: Duration = Duration::from_secs(60);

/// A policy as indexed.
#[derive(Debug, Clone)]
pub struct PolicyEntry {
    /// `namespace/name`.
    pub key: String,
    /// Its namespace.
    pub namespace: String,
    /// The object.
    pub policy: Arc<ResourcePolicy>,
    /// Its creation time.
    pub created: Option<Timestamp>,
}

/// A pod as indexed.
#[derive(Debug, Clone, PartialEq)]
pub struct PodEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// Requests.
    pub requests: Requests,
    /// Being deleted.
    pub terminating: bool,
    /// Succeeded or Failed.
    pub finished: bool,
    /// Creation time.
    pub created: Option<Timestamp>,
}

impl PodEntry {
    /// The slim view of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            requests: requests::pod_requests(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// How long it has existed at `now`.
    pub fn age(&self, now: SystemTime) -> Duration {
        let Some(created) = self.created else {
            return Duration::ZERO;
        };
        let now = Timestamp::try_from(now).unwrap_or(created);
        now.duration_since(created).unsigned_abs()
    }
}

#[derive(Debug, Clone)]
struct NodeEntry {
    labels: BTreeMap<String, String>,
    allocatable: Requests,
    schedulable: bool,
}

/// Where a reservation holds a place.
#[derive(Debug, Clone)]
struct Reservation {
    policy: String,
    unit: usize,
    group: String,
    requests: Requests,
    at: Instant,
}

#[derive(Debug, Default)]
struct State {
    policies: BTreeMap<String, PolicyEntry>,
    nodes: HashMap<String, NodeEntry>,
    /// By namespace, then UID.
    pods: HashMap<String, HashMap<String, PodEntry>>,
    /// By pod UID (binds) or reservation id (admissions).
    reservations: HashMap<String, Reservation>,
    /// The last filter's explanation, by pod UID (for the bind's Event).
    explanations: HashMap<String, String>,
    listed: Listed,
}

/// Which of the index's three sources have been listed whole at least once. Until all three
/// have, a unit's count could miss pods not listed yet, so no place is granted.
#[derive(Debug, Default, Clone, Copy)]
struct Listed {
    policies: bool,
    nodes: bool,
    pods: bool,
}

impl Listed {
    fn all(self) -> bool {
        self.policies && self.nodes && self.pods
    }
}

/// A place granted in a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The policy (`namespace/name`).
    pub policy: String,
    /// The unit, 0-based.
    pub unit: usize,
    /// The unit's description.
    pub description: String,
    /// Labels to set on the pod.
    pub labels: BTreeMap<String, String>,
    /// Annotations to set on the pod (the unit's, ours, the deletion cost).
    pub annotations: BTreeMap<String, String>,
}

/// Why a bind may not take a place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The node is in none of the policy's units.
    #[error("node {node} is in no unit of ResourcePolicy {policy}")]
    NotInUnit {
        /// The node.
        node: String,
        /// The policy.
        policy: String,
    },
    /// The unit reached its limit meanwhile.
    #[error("ResourcePolicy {policy}: unit {unit} ({description}) is {why}")]
    Full {
        /// The policy.
        policy: String,
        /// 1-based.
        unit: usize,
        /// The unit.
        description: String,
        /// `full (max 5)`.
        why: String,
    },
    /// The pod lacks a `matchLabelKeys` label.
    #[error("ResourcePolicy {policy}: the pod lacks the label {key} named in matchLabelKeys")]
    MissingGroupLabel {
        /// The policy.
        policy: String,
        /// The key.
        key: String,
    },
    /// The index has not yet listed the cluster's nodes and pods: its counts would be short.
    #[error(
        "ResourcePolicy {policy}: placement is still listing the cluster's nodes and pods; try again shortly"
    )]
    NotListed {
        /// The policy.
        policy: String,
    },
}

/// The index.
#[derive(Debug)]
pub struct PlacementIndex {
    state: Mutex<State>,
    vnodes: VirtualNodes,
    /// True from the end of the first full listing of all three sources on.
    listed: tokio::sync::watch::Sender<bool>,
    /// A wait for that listing has run out (see [`Self::wait_listed`]).
    waited_out: AtomicBool,
}

impl PlacementIndex {
    /// An empty index telling virtual nodes by `vnodes`.
    pub fn new(vnodes: VirtualNodes) -> Self {
        Self {
            state: Mutex::new(State::default()),
            vnodes,
            listed: tokio::sync::watch::Sender::new(false),
            waited_out: AtomicBool::new(false),
        }
    }

    /// Whether policies, nodes and pods have each been listed whole.
    pub fn is_listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// Waits up to `within` for [`Self::is_listed`]; its answer then. Once one wait has run
    /// out, later ones return at once: a listing that slow is failing (its watch says why), and
    /// callers go on without placement rather than each paying the wait.
    pub async fn wait_listed(&self, within: Duration) -> bool {
        if self.is_listed() || self.waited_out.load(Ordering::Relaxed) {
            return self.is_listed();
        }
        let mut listed = self.listed.subscribe();
        // The sender lives as long as `self`, so the wait ends only by the flag or the timer.
        let waited = tokio::time::timeout(within, listed.wait_for(|l| *l)).await;
        if waited.is_err() && !self.waited_out.swap(true, Ordering::Relaxed) {
            warn!(
                waited = ?within,
                "ResourcePolicy placement has not listed the cluster's nodes and pods yet; pods go on unplaced until it has"
            );
        }
        self.is_listed()
    }

    /// Records that one source was listed whole; true if that completed the first listing.
    fn mark_listed(&self, state: &mut State, source: impl FnOnce(&mut Listed)) -> bool {
        source(&mut state.listed);
        state.listed.all() && !self.listed.send_replace(true)
    }

    /// Whether any policy is indexed.
    pub fn has_policies(&self) -> bool {
        !self.lock().policies.is_empty()
    }

    /// How virtual nodes are marked.
    pub fn vnodes(&self) -> &VirtualNodes {
        &self.vnodes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still counts.
        self.state.lock()
    }

    /// Replaces every policy (a relist); true if that completed the index's first listing.
    pub fn set_policies(&self, policies: impl IntoIterator<Item = ResourcePolicy>) -> bool {
        let mut state = self.lock();
        state.policies.clear();
        for policy in policies {
            let entry = policy_entry(policy);
            state.policies.insert(entry.key.clone(), entry);
        }
        self.mark_listed(&mut state, |l| l.policies = true)
    }

    /// Adds or replaces one policy.
    pub fn apply_policy(&self, policy: ResourcePolicy) {
        let entry = policy_entry(policy);
        self.lock().policies.insert(entry.key.clone(), entry);
    }

    /// Forgets one policy.
    pub fn delete_policy(&self, policy: &ResourcePolicy) {
        let key = policy_entry(policy.clone()).key;
        self.lock().policies.remove(&key);
    }

    /// Every policy.
    pub fn policies(&self) -> Vec<PolicyEntry> {
        self.lock().policies.values().cloned().collect()
    }

    /// Replaces every node (a relist); true if that completed the index's first listing.
    pub fn set_nodes(&self, nodes: impl IntoIterator<Item = Node>) -> bool {
        let mut state = self.lock();
        state.nodes.clear();
        for node in nodes {
            let (name, entry) = node_entry(&node);
            state.nodes.insert(name, entry);
        }
        self.mark_listed(&mut state, |l| l.nodes = true)
    }

    /// Adds or replaces one node.
    pub fn apply_node(&self, node: &Node) {
        let (name, entry) = node_entry(node);
        self.lock().nodes.insert(name, entry);
    }

    /// Forgets one node.
    pub fn delete_node(&self, node: &Node) {
        if let Some(name) = &node.metadata.name {
            self.lock().nodes.remove(name);
        }
    }

    /// A node's labels, if known.
    pub fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.lock().nodes.get(node).map(|n| n.labels.clone())
    }

    /// Replaces every pod (a relist); true if that completed the index's first listing.
    pub fn set_pods(&self, pods: impl IntoIterator<Item = Pod>) -> bool {
        self.replace_pods(pods.into_iter().map(|pod| PodEntry::of(&pod)))
    }

    /// Replaces every pod by their slim views (a relist kept as views, not whole pods); true
    /// if that completed the index's first listing.
    pub fn replace_pods(&self, entries: impl IntoIterator<Item = PodEntry>) -> bool {
        let mut state = self.lock();
        state.pods.clear();
        for entry in entries {
            insert_pod(&mut state, entry);
        }
        self.mark_listed(&mut state, |l| l.pods = true)
    }

    /// Adds or replaces one pod; a reservation it fulfils ends.
    pub fn apply_pod(&self, pod: &Pod) {
        let entry = PodEntry::of(pod);
        insert_pod(&mut self.lock(), entry);
    }

    /// Forgets one pod.
    pub fn delete_pod(&self, pod: &Pod) {
        let entry = PodEntry::of(pod);
        let mut state = self.lock();
        if let Some(pods) = state.pods.get_mut(&entry.namespace) {
            pods.remove(&entry.uid);
        }
        state.reservations.remove(&entry.uid);
        state.explanations.remove(&entry.uid);
    }

    /// The pods of a namespace.
    pub fn pods_in(&self, namespace: &str) -> Vec<PodEntry> {
        self.lock()
            .pods
            .get(namespace)
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default()
    }

    /// A pod by namespace and UID.
    pub fn pod(&self, namespace: &str, uid: &str) -> Option<PodEntry> {
        self.lock()
            .pods
            .get(namespace)
            .and_then(|p| p.get(uid))
            .cloned()
    }

    /// The policy that places pods with `labels` in `namespace`: the oldest one whose selector
    /// takes them (ties by name), so two overlapping policies never both claim a pod.
    pub fn policy_for(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<PolicyEntry> {
        policy_for(&self.lock(), namespace, labels)
    }

    /// Remembers why the filter chose what it chose (for the bind's Event).
    pub fn remember_explanation(&self, uid: &str, explanation: String) {
        let mut state = self.lock();
        if state.explanations.len() > 10_000 {
            state.explanations.clear();
        }
        state.explanations.insert(uid.to_owned(), explanation);
    }

    /// The filter's explanation for a pod, taken.
    pub fn take_explanation(&self, uid: &str) -> Option<String> {
        self.lock().explanations.remove(uid)
    }

    /// Chooses a unit for `pod` among `candidates` (the nodes the scheduler found feasible),
    /// or, with `None`, by what is left on the unit's nodes (admission-time placement).
    pub fn choose(
        &self,
        policy: &PolicyEntry,
        pod: &PodEntry,
        candidates: Option<&[String]>,
        now: SystemTime,
    ) -> Result<(Choice, Vec<Vec<String>>), Refusal> {
        self.choose_and_reserve(policy, pod, candidates, now, None)
    }

    /// [`Self::choose`], and when the pod is placed, a place taken for it under `reserve_as`
    /// in the same critical section. kube-scheduler runs one scheduling cycle at a time, so a
    /// place taken at filter time is counted when the next pod is filtered: a burst cannot
    /// overshoot a unit's `max` even before any bind. The pod's own earlier reservation (a
    /// retry) is not counted against it.
    pub fn choose_and_reserve(
        &self,
        policy: &PolicyEntry,
        pod: &PodEntry,
        candidates: Option<&[String]>,
        now: SystemTime,
        reserve_as: Option<&str>,
    ) -> Result<(Choice, Vec<Vec<String>>), Refusal> {
        let mut state = self.lock();
        not_before_listed(&state, policy)?;
        let spec = &policy.policy.spec;
        let group =
            decide::group_of(spec, &pod.labels).map_err(|key| Refusal::MissingGroupLabel {
                policy: policy.key.clone(),
                key,
            })?;
        if let Some(id) = reserve_as {
            state.reservations.remove(id);
        }
        let members = unit_members(&state, policy, candidates, &self.vnodes, pod);
        let views: Vec<UnitView> = (0..spec.units.len())
            .map(|unit| {
                let mut view = unit_view(&state, policy, unit, &group, &self.vnodes);
                view.has_room = !members[unit].is_empty();
                view
            })
            .collect();
        let choice = decide::choose(spec, &views, &pod.requests, pod.age(now));
        if let (Some(id), Destination::Place(unit)) = (reserve_as, &choice.destination) {
            state.reservations.insert(
                id.to_owned(),
                Reservation {
                    policy: policy.key.clone(),
                    unit: *unit,
                    group,
                    requests: pod.requests.clone(),
                    at: Instant::now(),
                },
            );
        }
        Ok((choice, members))
    }

    /// Takes a place for `pod` in the unit of `node`, re-checking the unit's limits with every
    /// place taken or reserved — atomically. `id` keys the reservation (the pod UID).
    pub fn reserve_on_node(
        &self,
        policy: &PolicyEntry,
        pod: &PodEntry,
        node: &str,
        id: &str,
    ) -> Result<Grant, Refusal> {
        let mut state = self.lock();
        let spec = &policy.policy.spec;
        let labels = state
            .nodes
            .get(node)
            .map(|n| n.labels.clone())
            .unwrap_or_default();
        let unit = decide::unit_of_node(spec, &labels, &self.vnodes).ok_or_else(|| {
            Refusal::NotInUnit {
                node: node.to_owned(),
                policy: policy.key.clone(),
            }
        })?;
        self.reserve_locked(&mut state, policy, pod, unit, id)
    }

    /// Takes a place for `pod` in `unit` (admission-time placement), atomically.
    pub fn reserve_unit(
        &self,
        policy: &PolicyEntry,
        pod: &PodEntry,
        unit: usize,
        id: &str,
    ) -> Result<Grant, Refusal> {
        let mut state = self.lock();
        self.reserve_locked(&mut state, policy, pod, unit, id)
    }

    fn reserve_locked(
        &self,
        state: &mut State,
        policy: &PolicyEntry,
        pod: &PodEntry,
        unit: usize,
        id: &str,
    ) -> Result<Grant, Refusal> {
        not_before_listed(state, policy)?;
        let spec = &policy.policy.spec;
        let group =
            decide::group_of(spec, &pod.labels).map_err(|key| Refusal::MissingGroupLabel {
                policy: policy.key.clone(),
                key,
            })?;
        // A retried bind of the same pod replaces its own reservation, not adds a second.
        state.reservations.remove(id);
        let view = unit_view(state, policy, unit, &group, &self.vnodes);
        let unit_spec = &spec.units[unit];
        if let Some(why) = decide::at_limit(unit_spec, &view, &pod.requests) {
            return Err(Refusal::Full {
                policy: policy.key.clone(),
                unit: unit + 1,
                description: unit_spec.describe(),
                why,
            });
        }
        state.reservations.insert(
            id.to_owned(),
            Reservation {
                policy: policy.key.clone(),
                unit,
                group,
                requests: pod.requests.clone(),
                at: Instant::now(),
            },
        );
        Ok(grant(policy, unit))
    }

    /// Gives a reservation back (the bind failed).
    pub fn release(&self, id: &str) {
        self.lock().reservations.remove(id);
    }

    /// Per unit: pods counted, and per group.
    pub fn unit_counts(&self, policy: &PolicyEntry) -> Vec<BTreeMap<String, u32>> {
        let state = self.lock();
        let spec = &policy.policy.spec;
        let mut out = vec![BTreeMap::new(); spec.units.len()];
        for pod in counted_pods(&state, policy, &self.vnodes) {
            let group = decide::group_of(spec, &pod.0.labels).unwrap_or_default();
            *out[pod.1].entry(group).or_insert(0) += 1;
        }
        out
    }
}

/// No place before the index has listed everything (see [`Listed`]).
fn not_before_listed(state: &State, policy: &PolicyEntry) -> Result<(), Refusal> {
    if state.listed.all() {
        Ok(())
    } else {
        Err(Refusal::NotListed {
            policy: policy.key.clone(),
        })
    }
}

/// The labels and annotations a pod placed in `unit` gets.
pub fn grant(policy: &PolicyEntry, unit: usize) -> Grant {
    let spec = &policy.policy.spec;
    let unit_spec = &spec.units[unit];
    let labels = unit_spec
        .labels_to_set()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut annotations = unit_spec.pod_annotations.clone();
    annotations.insert(UNIT_ANNOTATION.into(), (unit + 1).to_string());
    annotations.insert(POLICY_ANNOTATION.into(), policy.key.clone());
    annotations.insert(
        DELETION_COST_ANNOTATION.into(),
        decide::deletion_cost(unit, spec.units.len()).to_string(),
    );
    Grant {
        policy: policy.key.clone(),
        unit,
        description: unit_spec.describe(),
        labels,
        annotations,
    }
}

fn policy_entry(policy: ResourcePolicy) -> PolicyEntry {
    let namespace = policy.metadata.namespace.clone().unwrap_or_default();
    let name = policy.metadata.name.clone().unwrap_or_default();
    PolicyEntry {
        key: format!("{namespace}/{name}"),
        namespace,
        created: policy.metadata.creation_timestamp.as_ref().map(|t| t.0),
        policy: Arc::new(policy),
    }
}

fn node_entry(node: &Node) -> (String, NodeEntry) {
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| {
            a.iter()
                .filter_map(|(k, v)| Some((k.clone(), Quantity::parse(&v.0).ok()?)))
                .collect()
        })
        .unwrap_or_default();
    (
        node.metadata.name.clone().unwrap_or_default(),
        NodeEntry {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            allocatable,
            schedulable: !node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
        },
    )
}

fn insert_pod(state: &mut State, entry: PodEntry) {
    // Seen bound (or seen carrying its admission reservation): the reservation is fulfilled;
    // from now on the pod itself is counted.
    // Bound, or marked by our bind (counted by its marks from now on): its own reservation
    // would count it twice.
    if entry.node.is_some() || entry.annotations.contains_key(POLICY_ANNOTATION) {
        state.reservations.remove(&entry.uid);
    }
    if let Some(id) = entry.annotations.get(RESERVATION_ANNOTATION) {
        state.reservations.remove(id);
    }
    let now = Instant::now();
    state
        .reservations
        .retain(|_, r| now.duration_since(r.at) < RESERVATION_TTL);
    state
        .pods
        .entry(entry.namespace.clone())
        .or_default()
        .insert(entry.uid.clone(), entry);
}

fn policy_for(
    state: &State,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<PolicyEntry> {
    state
        .policies
        .values()
        .filter(|p| p.namespace == namespace && decide::selects(&p.policy.spec, labels))
        .min_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)))
        .cloned()
}

/// The policy's pods that count, each with its unit: bound to a node of the unit and carrying
/// the unit's marks, or (admission-time placement) carrying our unit annotation unbound.
fn counted_pods<'a>(
    state: &'a State,
    policy: &'a PolicyEntry,
    vnodes: &'a VirtualNodes,
) -> impl Iterator<Item = (&'a PodEntry, usize)> + 'a {
    let spec = &policy.policy.spec;
    state
        .pods
        .get(&policy.namespace)
        .into_iter()
        .flat_map(HashMap::values)
        .filter(move |pod| {
            decide::selects(spec, &pod.labels)
                && policy_for(state, &policy.namespace, &pod.labels)
                    .is_some_and(|p| p.key == policy.key)
        })
        .filter_map(move |pod| {
            let unit = unit_of_pod(state, policy, pod, vnodes)?;
            decide::carries_unit_marks(&spec.units[unit], &pod.labels, &pod.annotations)
                .then_some((pod, unit))
        })
        .filter(move |(pod, _)| {
            let facts = PodFacts {
                terminating: pod.terminating,
                finished: pod.finished,
                predates_policy: match (pod.created, policy.created) {
                    (Some(pod), Some(policy)) => pod < policy,
                    _ => false,
                },
            };
            decide::counts(spec, &facts)
        })
}

/// The unit a pod is in: its node's, or (not bound yet) the one admission chose for it.
fn unit_of_pod(
    state: &State,
    policy: &PolicyEntry,
    pod: &PodEntry,
    vnodes: &VirtualNodes,
) -> Option<usize> {
    let spec = &policy.policy.spec;
    match &pod.node {
        Some(node) => {
            let labels = &state.nodes.get(node)?.labels;
            decide::unit_of_node(spec, labels, vnodes)
        }
        None => {
            let placed_by_us = pod.annotations.get(POLICY_ANNOTATION) == Some(&policy.key);
            let unit: usize = pod.annotations.get(UNIT_ANNOTATION)?.parse().ok()?;
            (placed_by_us && (1..=spec.units.len()).contains(&unit)).then(|| unit - 1)
        }
    }
}

fn unit_view(
    state: &State,
    policy: &PolicyEntry,
    unit: usize,
    group: &str,
    vnodes: &VirtualNodes,
) -> UnitView {
    let spec = &policy.policy.spec;
    let mut view = UnitView::default();
    for (pod, pod_unit) in counted_pods(state, policy, vnodes) {
        if pod_unit != unit || decide::group_of(spec, &pod.labels).unwrap_or_default() != group {
            continue;
        }
        view.pods += 1;
        requests::add(&mut view.used, &pod.requests);
    }
    for reservation in state.reservations.values() {
        if reservation.policy == policy.key
            && reservation.unit == unit
            && reservation.group == group
        {
            view.pods += 1;
            requests::add(&mut view.used, &reservation.requests);
        }
    }
    // Terminating pods of the unit, counted or not (LackResourceAndNoTerminating).
    view.terminating = state
        .pods
        .get(&policy.namespace)
        .into_iter()
        .flat_map(HashMap::values)
        .filter(|pod| pod.terminating && decide::selects(spec, &pod.labels))
        .filter(|pod| unit_of_pod(state, policy, pod, vnodes) == Some(unit))
        .count()
        .try_into()
        .unwrap_or(u32::MAX);
    view
}

/// Per unit, the nodes that could take the pod: the scheduler's candidates in the unit, or
/// (no candidates: admission) the unit's schedulable nodes with room left for its requests.
fn unit_members(
    state: &State,
    policy: &PolicyEntry,
    candidates: Option<&[String]>,
    vnodes: &VirtualNodes,
    pod: &PodEntry,
) -> Vec<Vec<String>> {
    let spec = &policy.policy.spec;
    let mut members = vec![Vec::new(); spec.units.len()];
    match candidates {
        Some(candidates) => {
            for name in candidates {
                let Some(node) = state.nodes.get(name) else {
                    continue;
                };
                if let Some(unit) = decide::unit_of_node(spec, &node.labels, vnodes) {
                    members[unit].push(name.clone());
                }
            }
        }
        None => {
            let requested = requested_by_node(state);
            let mut asked = pod.requests.clone();
            asked.insert("pods".into(), Quantity::parse("1").unwrap_or_default());
            for (name, node) in &state.nodes {
                if !node.schedulable {
                    continue;
                }
                let Some(unit) = decide::unit_of_node(spec, &node.labels, vnodes) else {
                    continue;
                };
                let used = requested.get(name.as_str()).cloned().unwrap_or_default();
                if decide::fits(&node.allocatable, &used, &asked) {
                    members[unit].push(name.clone());
                }
            }
            for unit in &mut members {
                unit.sort();
            }
        }
    }
    members
}

/// What the pods bound to each node request (finished pods hold nothing), `pods` included.
fn requested_by_node(state: &State) -> HashMap<&str, Requests> {
    let one = Quantity::parse("1").unwrap_or_default();
    let mut out: HashMap<&str, Requests> = HashMap::new();
    for pod in state.pods.values().flat_map(HashMap::values) {
        let (Some(node), false) = (&pod.node, pod.finished) else {
            continue;
        };
        let sum = out.entry(node.as_str()).or_default();
        requests::add(sum, &pod.requests);
        *sum.entry("pods".into()).or_default() += one;
    }
    out
}

/// Whether a choice placed the pod.
pub fn placed_unit(choice: &Choice) -> Option<usize> {
    match choice.destination {
        Destination::Place(unit) => Some(unit),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
