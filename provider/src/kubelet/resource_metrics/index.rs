//! This node's pods as the metrics need them: which pods run, and when their containers
//! started (which ECI group backs each comes from the pod controller at refresh time). Filled
//! by reading this node's shared pod watch (`spec.nodeName=<node>`, the pod controller's too)
//! and kept slim (a few strings per pod, never the `Pod`), so it grows with the pod count, not
//! with the size of the pods' specs.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tracing::info;

use crate::k8s::shared_watch::Reader;

/// One pod of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The ECI group backing it, as the pod controller records it: filled by a refresh,
    /// never from the pod's annotations (whoever may edit the pod writes those).
    pub group_id: Option<String>,
    /// `status.phase` is `Running`: only then does ECI have figures for it.
    pub running: bool,
    /// `status.startTime`.
    pub start_time: Option<Timestamp>,
    /// Start times of its running containers (`state.running.startedAt`), by name.
    pub containers: Vec<(String, Timestamp)>,
}

impl PodEntry {
    /// The slim entry of `pod` (`None` without a UID, which a stored pod always has).
    pub fn of(pod: &Pod) -> Option<Self> {
        let metadata = &pod.metadata;
        let status = pod.status.as_ref();
        let containers = status
            .and_then(|s| s.container_statuses.as_ref())
            .map(|statuses| {
                statuses
                    .iter()
                    .filter_map(|c| {
                        let started = c.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
                        Some((c.name.clone(), started.0))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
            uid: metadata.uid.clone()?,
            group_id: None,
            running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
            start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            containers,
        })
    }

    /// When container `name` started, if it runs.
    pub fn container_start(&self, name: &str) -> Option<Timestamp> {
        self.containers
            .iter()
            .find(|(container, _)| container == name)
            .map(|(_, at)| *at)
    }

    /// Whether ECI can be asked for its figures: its group is known and it runs.
    pub fn measurable(&self) -> bool {
        self.running && self.group_id.is_some()
    }
}

/// The pods of this node by UID, with relists applied as a whole (what the watch's
/// `Init`…`InitDone` brackets carry replaces everything, so pods deleted while the watch was
/// broken disappear).
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<String, PodEntry>,
    /// Filled during a relist; swapped in at its end.
    relisting: Option<HashMap<String, PodEntry>>,
    listed: bool,
}

impl PodIndex {
    /// Adds or updates a pod.
    pub fn upsert(&mut self, entry: PodEntry) {
        self.pods.insert(entry.uid.clone(), entry);
    }

    /// Removes a pod.
    pub fn remove(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// Applies one watch event.
    pub fn apply(&mut self, event: &Event<Pod>) {
        match event {
            Event::Init => self.relisting = Some(HashMap::new()),
            Event::InitApply(pod) => {
                if let Some(entry) = PodEntry::of(pod) {
                    self.relisting
                        .get_or_insert_with(HashMap::new)
                        .insert(entry.uid.clone(), entry);
                }
            }
            Event::InitDone => {
                if let Some(listed) = self.relisting.take() {
                    self.pods = listed;
                }
                self.listed = true;
            }
            Event::Apply(pod) => {
                if let Some(entry) = PodEntry::of(pod) {
                    self.upsert(entry);
                }
            }
            Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    self.remove(uid);
                }
            }
        }
    }

    /// Whether a complete list has been applied (before it, the index may miss pods).
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// Marks the index complete without a watch (benchmarks and tests fill it directly).
    pub fn mark_listed(&mut self) {
        self.listed = true;
    }

    /// Every pod.
    pub fn pods(&self) -> impl Iterator<Item = &PodEntry> {
        self.pods.values()
    }

    /// Whether the pod with `uid` is on this node.
    pub fn contains(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// A [`PodIndex`] shared between its watch and the scrapes, with a signal for "listed".
#[derive(Debug)]
pub struct SharedIndex {
    index: RwLock<PodIndex>,
    listed: watch::Sender<bool>,
}

impl Default for SharedIndex {
    fn default() -> Self {
        Self {
            index: RwLock::new(PodIndex::default()),
            listed: watch::Sender::new(false),
        }
    }
}

impl SharedIndex {
    /// Reads the index.
    pub fn read<T>(&self, read: impl FnOnce(&PodIndex) -> T) -> T {
        read(&self.index.read())
    }

    /// Changes the index.
    pub fn write<T>(&self, write: impl FnOnce(&mut PodIndex) -> T) -> T {
        let (out, listed) = {
            let mut index = self.index.write();
            let out = write(&mut index);
            (out, index.listed())
        };
        self.listed.send_if_modified(|was| {
            let changed = *was != listed;
            *was = listed;
            changed
        });
        out
    }

    /// Waits until the first list is in, at most `within`; whether it is.
    pub async fn wait_listed(&self, within: Duration) -> bool {
        let mut listed = self.listed.subscribe();
        tokio::time::timeout(within, listed.wait_for(|listed| *listed))
            .await
            .is_ok_and(|result| result.is_ok())
    }

    /// The index's reader of this node's pod watch (see [`crate::k8s::shared_watch::SharedWatch`]): every event applied
    /// as it arrives, the first complete list announced once.
    pub fn reader(self: Arc<Self>) -> Reader<Pod> {
        let mut announced = false;
        Box::new(move |event: &Event<Pod>| {
            let pods = self.write(|index| {
                index.apply(event);
                index.len()
            });
            if matches!(event, Event::InitDone) && !announced {
                announced = true;
                info!(pods, "metrics: this node's pods listed");
            }
        })
    }
}
