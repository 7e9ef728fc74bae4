//! What admission answers from: Selectors (validated into rules), namespace labels, the legacy
//! ConfigMap and — only once a rule needs it — a capacity view of nodes and pods. Each is fed
//! by a kube-runtime watch (the capacity view by the replica's shared pod and node watches),
//! relists applied whole; no admission request ever waits on the API.

use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use vne_core::selector::crd::Selector;
use vne_core::selector::engine::{
    Capacity, Resources, Route, Rule, default_rules, pod_requests, rules_from_profile,
};

use crate::admission::seal::{self, SealKey};
use crate::k8s::quantity::Quantity;
use crate::k8s::shared_watch::{ClusterWatches, PAGE_SIZE};
use crate::ops::events::EventPublisher;

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read().clone()
}

fn write<T>(lock: &RwLock<T>, value: T) {
    *lock.write() = value;
}

/// The caches admission reads.
#[derive(Debug)]
pub struct Caches {
    selectors: RwLock<Arc<Vec<Rule>>>,
    profile: RwLock<Arc<Vec<Rule>>>,
    namespaces: RwLock<HashMap<String, Arc<BTreeMap<String, String>>>>,
    capacity: RwLock<Arc<Capacity>>,
    needs_capacity: watch::Sender<bool>,
    defaults: bool,
    seal: RwLock<Option<Arc<SealKey>>>,
}

/// A consistent view for one admission request.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Valid Selectors.
    pub selectors: Arc<Vec<Rule>>,
    /// ConfigMap selectors, then the defaults.
    pub profile: Arc<Vec<Rule>>,
    /// The capacity view.
    pub capacity: Arc<Capacity>,
}

fn needs_capacity(rules: &[Rule]) -> bool {
    rules.iter().any(|r| match &r.placement {
        Route::NormalNodePrefer {
            cpu_ratio,
            memory_ratio,
        } => cpu_ratio.is_some() || memory_ratio.is_some(),
        Route::NamespaceResourceLimit { .. } => true,
        _ => false,
    })
}

impl Caches {
    /// Empty caches; `defaults` turns the built-in selectors on.
    pub fn new(defaults: bool) -> Self {
        Self {
            selectors: RwLock::new(Arc::new(Vec::new())),
            profile: RwLock::new(Arc::new(if defaults {
                default_rules()
            } else {
                Vec::new()
            })),
            namespaces: RwLock::new(HashMap::new()),
            capacity: RwLock::new(Arc::new(Capacity::default())),
            needs_capacity: watch::Sender::new(false),
            defaults,
            seal: RwLock::new(None),
        }
    }

    /// The rules and capacity, as of now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            selectors: read(&self.selectors),
            profile: read(&self.profile),
            capacity: read(&self.capacity),
        }
    }

    /// A namespace's labels (empty when unknown).
    pub fn namespace_labels(&self, namespace: &str) -> Arc<BTreeMap<String, String>> {
        self.namespaces
            .read()
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    /// Replaces the Selector rules.
    pub fn set_selectors(&self, rules: Vec<Rule>) {
        self.needs_capacity.send_if_modified(|needed| {
            let now = needs_capacity(&rules) || *needed;
            std::mem::replace(needed, now) != now
        });
        write(&self.selectors, Arc::new(rules));
    }

    /// Replaces the ConfigMap rules (the defaults are appended).
    pub fn set_profile(&self, mut rules: Vec<Rule>) {
        if self.defaults {
            rules.extend(default_rules());
        }
        write(&self.profile, Arc::new(rules));
    }

    /// Sets one namespace's labels (None: deleted).
    pub fn set_namespace(&self, name: &str, labels: Option<BTreeMap<String, String>>) {
        let mut namespaces = self.namespaces.write();
        match labels {
            Some(labels) => namespaces.insert(name.to_owned(), Arc::new(labels)),
            None => namespaces.remove(name),
        };
    }

    /// The key that seals deferred effects, once loaded.
    pub fn seal(&self) -> Option<Arc<SealKey>> {
        read(&self.seal)
    }

    /// Sets the key that seals deferred effects.
    pub fn set_seal(&self, key: Arc<SealKey>) {
        write(&self.seal, Some(key));
    }

    /// Replaces the capacity view.
    pub fn set_capacity(&self, capacity: Capacity) {
        write(&self.capacity, Arc::new(capacity));
    }
}

/// Watches Selectors; invalid ones are ignored with a Warning Event on them (once per change).
pub async fn watch_selectors(
    client: kube::Client,
    caches: Arc<Caches>,
    recorder: EventPublisher,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let api: Api<Selector> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default().page_size(PAGE_SIZE))
        .default_backoff()
        .boxed();
    let mut selectors = SelectorSet::default();
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        let Some(event) = event else {
            anyhow::bail!("the Selector watch ended");
        };
        if !selectors.apply(event) {
            continue;
        }
        let mut rules = Vec::with_capacity(selectors.known.len());
        for selector in selectors.known.values() {
            match vne_core::selector::engine::rule_from_selector(selector) {
                Ok(rule) => rules.push(rule),
                Err(problem) => report_invalid(selector, &problem, &mut reported, &recorder).await,
            }
        }
        info!(
            selectors = selectors.known.len(),
            valid = rules.len(),
            "Selectors updated"
        );
        caches.set_selectors(rules);
    }
}

/// `namespace/name` of a Selector.
fn selector_key(selector: &Selector) -> String {
    format!(
        "{}/{}",
        selector.namespace().unwrap_or_default(),
        selector.name_any()
    )
}

/// The Selectors the watch has shown; a relist replaces them only once it is complete.
#[derive(Debug, Default)]
struct SelectorSet {
    known: BTreeMap<String, Selector>,
    listing: Option<BTreeMap<String, Selector>>,
    warned_unavailable: bool,
}

impl SelectorSet {
    /// Takes one watch event; true when the known Selectors changed.
    fn apply(&mut self, event: Result<watcher::Event<Selector>, watcher::Error>) -> bool {
        match event {
            Err(error) => {
                if !self.warned_unavailable {
                    self.warned_unavailable = true;
                    warn!(%error, "cannot watch Selectors (is the selectors.eci.aliyun.com CRD installed?); ConfigMap selectors and defaults still apply");
                }
                false
            }
            Ok(watcher::Event::Init) => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(s)) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(selector_key(&s), s);
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                self.known = self.listing.take().unwrap_or_default();
                self.warned_unavailable = false;
                true
            }
            Ok(watcher::Event::Apply(s)) => {
                self.known.insert(selector_key(&s), s);
                true
            }
            Ok(watcher::Event::Delete(s)) => {
                self.known.remove(&selector_key(&s));
                true
            }
        }
    }
}

/// An invalid Selector is logged and gets a Warning Event, once per version of it.
async fn report_invalid(
    selector: &Selector,
    problem: &str,
    reported: &mut HashSet<String>,
    recorder: &EventPublisher,
) {
    let version = format!(
        "{}@{}",
        selector.uid().unwrap_or_default(),
        selector.resource_version().unwrap_or_default()
    );
    if !reported.insert(version) {
        return;
    }
    warn!(selector = %selector_key(selector), %problem, "ignoring an invalid Selector");
    let event = Event {
        type_: EventType::Warning,
        reason: "InvalidSelector".into(),
        note: Some(format!("ignored by virtual-node-eci: {problem}")),
        action: "Validate".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &selector.object_ref(&())).await {
        debug!(%error, "could not publish an event");
    }
}

/// Loads the key that seals deferred Selector effects (retrying until it is had; until then
/// the webhook defers no effect), then waits for the stop.
pub async fn load_seal(
    client: kube::Client,
    caches: Arc<Caches>,
    namespace: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let load = || seal::shared_key(&client, &namespace);
    let loaded = load
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(30))
                .without_max_times(),
        )
        .notify(|error, wait| {
            let error = crate::ops::chain::Chain(error).to_string();
            warn!(%error, retry_in = ?wait, "cannot load the Selector seal key; deferred Selector effects are dropped until it is");
        });
    tokio::select! {
        () = stop.cancelled() => return Ok(()),
        loaded = loaded => caches.set_seal(loaded?),
    }
    stop.cancelled().await;
    Ok(())
}

/// Watches namespace labels; a relist drops the namespaces it does not name.
pub async fn watch_namespaces(
    client: kube::Client,
    caches: Arc<Caches>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    // Only labels are read: metadata is all that is fetched.
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let config = watcher::Config::default().page_size(PAGE_SIZE);
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listing: Option<HashSet<String>> = None;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        match event {
            None => anyhow::bail!("the namespace watch ended"),
            Some(Err(error)) => debug!(%error, "namespace watch error; it recovers by itself"),
            Some(Ok(watcher::Event::Init)) => listing = Some(HashSet::new()),
            Some(Ok(watcher::Event::InitApply(ns) | watcher::Event::Apply(ns))) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(ns.name_any());
                }
                caches.set_namespace(&ns.name_any(), Some(ns.labels().clone()));
            }
            Some(Ok(watcher::Event::InitDone)) => {
                if let Some(present) = listing.take() {
                    let gone: Vec<String> = caches
                        .namespaces
                        .read()
                        .keys()
                        .filter(|name| !present.contains(*name))
                        .cloned()
                        .collect();
                    for name in gone {
                        caches.set_namespace(&name, None);
                    }
                }
            }
            Some(Ok(watcher::Event::Delete(ns))) => caches.set_namespace(&ns.name_any(), None),
        }
    }
}

/// Watches the legacy ConfigMap; invalid content keeps the last good selectors and says why.
pub async fn watch_profile(
    client: kube::Client,
    caches: Arc<Caches>,
    namespace: String,
    name: String,
    recorder: EventPublisher,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut present = false;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        match event {
            None => anyhow::bail!("the eci-profile ConfigMap watch ended"),
            Some(Err(error)) => debug!(%error, "ConfigMap watch error; it recovers by itself"),
            Some(Ok(watcher::Event::Init)) => present = false,
            Some(Ok(watcher::Event::InitDone)) if !present => caches.set_profile(Vec::new()),
            Some(Ok(watcher::Event::InitDone)) => {}
            Some(Ok(watcher::Event::Delete(_))) => {
                info!(configmap = %format!("{namespace}/{name}"), "eci-profile ConfigMap deleted; only Selectors and the defaults apply");
                caches.set_profile(Vec::new());
            }
            Some(Ok(watcher::Event::InitApply(map) | watcher::Event::Apply(map))) => {
                present = true;
                let text = map
                    .data
                    .as_ref()
                    .and_then(|d| d.get("selectors"))
                    .cloned()
                    .unwrap_or_else(|| "[]".into());
                match rules_from_profile(&text) {
                    Ok(rules) => {
                        info!(configmap = %format!("{namespace}/{name}"), selectors = rules.len(), "eci-profile selectors loaded");
                        caches.set_profile(rules);
                    }
                    Err(problem) => {
                        warn!(configmap = %format!("{namespace}/{name}"), %problem, "invalid eci-profile selectors; keeping the last good ones");
                        let event = Event {
                            type_: EventType::Warning,
                            reason: "InvalidSelectors".into(),
                            note: Some(format!(
                                "virtual-node-eci keeps the last good selectors: {problem}"
                            )),
                            action: "Validate".into(),
                            secondary: None,
                        };
                        if let Err(error) = recorder.publish(&event, &map.object_ref(&())).await {
                            debug!(%error, "could not publish an event");
                        }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct NodeFacts {
    virtual_node: bool,
    schedulable: bool,
    allocatable: Resources,
}

#[derive(Debug, Clone)]
struct PodFacts {
    node: String,
    namespace: String,
    requests: Resources,
}

fn node_facts(node: &Node, vnode_label: (&str, &str)) -> NodeFacts {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |name: &str| {
        allocatable
            .and_then(|a| a.get(name))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .filter(|q| !q.is_negative())
            .unwrap_or_default()
    };
    NodeFacts {
        virtual_node: node.labels().get(vnode_label.0).map(String::as_str) == Some(vnode_label.1),
        schedulable: !node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        allocatable: Resources {
            cpu: get("cpu"),
            memory: get("memory"),
        },
    }
}

fn pod_facts(pod: &Pod) -> Option<PodFacts> {
    let node = pod.spec.as_ref()?.node_name.clone()?;
    if matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return None;
    }
    Some(PodFacts {
        node,
        namespace: pod.namespace().unwrap_or_default(),
        requests: pod_requests(pod),
    })
}

/// The capacity view from node and pod facts (pure).
fn capacity_of<'a>(
    nodes: &HashMap<String, NodeFacts>,
    pods: impl Iterator<Item = &'a PodFacts>,
) -> Capacity {
    let mut capacity = Capacity::default();
    for facts in nodes.values().filter(|n| !n.virtual_node && n.schedulable) {
        capacity.normal_allocatable.cpu += facts.allocatable.cpu;
        capacity.normal_allocatable.memory += facts.allocatable.memory;
    }
    for pod in pods {
        match nodes.get(&pod.node) {
            Some(node) if node.virtual_node => {
                let used = capacity
                    .vnode_requested
                    .entry(pod.namespace.clone())
                    .or_default();
                used.cpu += pod.requests.cpu;
                used.memory += pod.requests.memory;
            }
            Some(node) if node.schedulable => {
                capacity.normal_requested.cpu += pod.requests.cpu;
                capacity.normal_requested.memory += pod.requests.memory;
            }
            _ => {}
        }
    }
    capacity
}

/// One kind's facts by key, with relists applied whole: what a relist does not name was
/// deleted while the watch was broken (its deletion event may be compacted away for good).
#[derive(Debug)]
struct Relisted<T> {
    current: HashMap<String, T>,
    /// Filled during a relist; swapped in at its end.
    relisting: Option<HashMap<String, T>>,
}

impl<T> Default for Relisted<T> {
    fn default() -> Self {
        Self {
            current: HashMap::new(),
            relisting: None,
        }
    }
}

impl<T> Relisted<T> {
    /// Applies one watch event, `facts` telling what of an object is kept (None: nothing, as
    /// if deleted); true when `current` changed.
    fn apply<K>(
        &mut self,
        event: &watcher::Event<K>,
        key: impl Fn(&K) -> String,
        facts: impl Fn(&K) -> Option<T>,
    ) -> bool {
        match event {
            watcher::Event::Init => {
                self.relisting = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(object) => {
                if let (Some(listed), Some(facts)) = (self.relisting.as_mut(), facts(object)) {
                    listed.insert(key(object), facts);
                }
                false
            }
            watcher::Event::InitDone => match self.relisting.take() {
                Some(listed) => {
                    self.current = listed;
                    true
                }
                None => false,
            },
            watcher::Event::Apply(object) => {
                match facts(object) {
                    Some(facts) => self.current.insert(key(object), facts),
                    None => self.current.remove(&key(object)),
                };
                true
            }
            watcher::Event::Delete(object) => self.current.remove(&key(object)).is_some(),
        }
    }
}

/// The node and pod facts the capacity view is computed from, fed by watch events.
#[derive(Debug, Default)]
struct CapacityIndex {
    vnode_label: (String, String),
    nodes: Relisted<NodeFacts>,
    pods: Relisted<PodFacts>,
    /// Changed since the view was last computed.
    dirty: bool,
}

impl CapacityIndex {
    fn new(vnode_label: (String, String)) -> Self {
        Self {
            vnode_label,
            ..Self::default()
        }
    }

    fn apply_node(&mut self, event: &watcher::Event<Node>) {
        let label = (self.vnode_label.0.as_str(), self.vnode_label.1.as_str());
        self.dirty |= self
            .nodes
            .apply(event, ResourceExt::name_any, |n| Some(node_facts(n, label)));
    }

    fn apply_pod(&mut self, event: &watcher::Event<Pod>) {
        let uid = |p: &Pod| p.uid().unwrap_or_default();
        self.dirty |= self.pods.apply(event, uid, pod_facts);
    }

    /// The view, if anything changed since the last one.
    fn take_changed(&mut self) -> Option<Capacity> {
        std::mem::take(&mut self.dirty)
            .then(|| capacity_of(&self.nodes.current, self.pods.current.values()))
    }
}

fn lock(index: &Mutex<CapacityIndex>) -> MutexGuard<'_, CapacityIndex> {
    // Facts half-applied by a panicking reader are still facts; the next relist mends them.
    index.lock()
}

/// Keeps the capacity view — but only once some rule needs it (a cluster-wide pod watch is
/// not free), and from then on. It reads the replica's shared pod and node watches.
pub async fn watch_capacity(
    watches: ClusterWatches,
    caches: Arc<Caches>,
    vnode_label: (String, String),
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut needed = caches.needs_capacity.subscribe();
    tokio::select! {
        () = stop.cancelled() => return Ok(()),
        result = needed.wait_for(|n| *n) => { result?; }
    }
    info!("a Selector needs the capacity view: reading the shared node and pod watches");
    let index = Arc::new(Mutex::new(CapacityIndex::new(vnode_label)));
    {
        let index = Arc::clone(&index);
        watches
            .nodes
            .subscribe(Box::new(move |event| lock(&index).apply_node(event)));
    }
    {
        let index = Arc::clone(&index);
        watches
            .pods
            .subscribe(Box::new(move |event| lock(&index).apply_pod(event)));
    }
    // Recomputing is O(pods): at most once a second, however busy the watch.
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = ticks.tick() => {
                let changed = lock(&index).take_changed();
                if let Some(capacity) = changed {
                    caches.set_capacity(capacity);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_node(name: &str, virtual_node: bool, cpu: &str) -> Node {
        let labels = if virtual_node {
            serde_json::json!({"type": "virtual-kubelet"})
        } else {
            serde_json::json!({})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi"}},
        }))
        .unwrap()
    }

    fn mk_pod(uid: &str, namespace: &str, node: &str, cpu: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": namespace, "uid": uid},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}],
            },
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    /// What kube-runtime's watcher yields for a (re)list of `objects`.
    fn relist<K: Clone>(objects: &[K]) -> Vec<watcher::Event<K>> {
        let mut events = vec![watcher::Event::Init];
        events.extend(objects.iter().cloned().map(watcher::Event::InitApply));
        events.push(watcher::Event::InitDone);
        events
    }

    #[test]
    fn a_relist_drops_the_pods_and_nodes_deleted_while_the_watch_was_broken() {
        let cpu = |text: &str| Quantity::parse(text).unwrap();
        let mut index = CapacityIndex::new(("type".into(), "virtual-kubelet".into()));
        let (n1, n2, vn) = (
            mk_node("n1", false, "4"),
            mk_node("n2", false, "4"),
            mk_node("vn", true, "6000"),
        );
        for event in relist(&[n1.clone(), n2, vn.clone()]) {
            index.apply_node(&event);
        }
        let (kept, gone, on_gone_node) = (
            mk_pod("kept", "a", "vn", "1"),
            mk_pod("gone", "a", "vn", "2"),
            mk_pod("on-n2", "a", "n2", "3"),
        );
        for event in relist(&[kept.clone(), gone, on_gone_node]) {
            index.apply_pod(&event);
        }
        let before = index.take_changed().expect("listed");
        assert_eq!(before.vnode_requested["a"].cpu, cpu("3"));
        assert_eq!(before.normal_allocatable.cpu, cpu("8"));
        assert_eq!(before.normal_requested.cpu, cpu("3"));

        // The watch broke; meanwhile `gone`, `on-n2` and node n2 were deleted and the
        // deletions compacted away: the relist is the only news of them.
        for event in relist(&[n1, vn]) {
            index.apply_node(&event);
        }
        for event in relist(&[kept]) {
            index.apply_pod(&event);
        }
        let after = index.take_changed().expect("relisted");
        assert_eq!(
            after.vnode_requested["a"].cpu,
            cpu("1"),
            "only `kept` is left"
        );
        assert_eq!(after.normal_allocatable.cpu, cpu("4"), "n2 is gone");
        assert_eq!(
            after.normal_requested.cpu,
            Quantity::default(),
            "its pod too"
        );
    }

    #[test]
    fn capacity_counts_schedulable_normal_nodes_and_vnode_use_by_namespace() {
        let q = |text: &str| Quantity::parse(text).unwrap();
        let r = |cpu, memory| Resources {
            cpu: q(cpu),
            memory: q(memory),
        };
        let nodes = HashMap::from([
            (
                "n1".to_owned(),
                NodeFacts {
                    virtual_node: false,
                    schedulable: true,
                    allocatable: r("4", "8"),
                },
            ),
            (
                "n2".to_owned(),
                NodeFacts {
                    virtual_node: false,
                    schedulable: false,
                    allocatable: r("4", "8"),
                },
            ),
            (
                "vn".to_owned(),
                NodeFacts {
                    virtual_node: true,
                    schedulable: true,
                    allocatable: r("6000", "1e12"),
                },
            ),
        ]);
        let pods = [
            PodFacts {
                node: "n1".into(),
                namespace: "a".into(),
                requests: r("1", "2"),
            },
            PodFacts {
                node: "n2".into(),
                namespace: "a".into(),
                requests: r("1", "2"),
            },
            PodFacts {
                node: "vn".into(),
                namespace: "a".into(),
                requests: r("2", "3"),
            },
            PodFacts {
                node: "vn".into(),
                namespace: "b".into(),
                requests: r("0.5", "1"),
            },
            PodFacts {
                node: "gone".into(),
                namespace: "a".into(),
                requests: r("9", "9"),
            },
        ];
        let capacity = capacity_of(&nodes, pods.iter());
        assert_eq!(capacity.normal_allocatable, r("4", "8"));
        assert_eq!(capacity.normal_requested, r("1", "2"));
        assert_eq!(capacity.vnode_requested["a"], r("2", "3"));
        assert_eq!(capacity.vnode_requested["b"], r("0.5", "1"));
    }

    #[test]
    fn the_capacity_view_is_wanted_only_by_rules_that_read_it() {
        let caches = Caches::new(true);
        let mut rules = default_rules();
        caches.set_selectors(rules.clone());
        assert!(!*caches.needs_capacity.borrow());
        rules[0].placement = Route::NormalNodePrefer {
            cpu_ratio: Some(80),
            memory_ratio: None,
        };
        caches.set_selectors(rules);
        assert!(*caches.needs_capacity.borrow());
        assert_eq!(caches.snapshot().profile.len(), 3, "the defaults");
        caches.set_profile(Vec::new());
        assert_eq!(caches.snapshot().profile.len(), 3);
        assert!(caches.namespace_labels("nope").is_empty());
    }

    fn mk_selector(namespace: &str, name: &str) -> Selector {
        let mut selector = Selector::new(name, vne_core::selector::crd::SelectorSpec::default());
        selector.metadata.namespace = Some(namespace.into());
        selector
    }

    #[test]
    fn a_selector_relist_replaces_the_known_set_only_once_complete() {
        let mut set = SelectorSet::default();
        assert!(set.apply(Ok(watcher::Event::Apply(mk_selector("a", "old")))));
        assert!(!set.apply(Ok(watcher::Event::Init)));
        assert!(!set.apply(Ok(watcher::Event::InitApply(mk_selector("b", "new")))));
        assert_eq!(
            set.known.keys().collect::<Vec<_>>(),
            ["a/old"],
            "a relist under way changes nothing yet"
        );
        assert!(set.apply(Ok(watcher::Event::InitDone)));
        assert_eq!(set.known.keys().collect::<Vec<_>>(), ["b/new"]);
        assert!(set.apply(Ok(watcher::Event::Delete(mk_selector("b", "new")))));
        assert!(set.known.is_empty());
    }
}
