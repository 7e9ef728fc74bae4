//! This node's pods as the metrics need them ([`PodEntry`]: which run, and when their
//! containers started; which ECI group backs each comes from the pod controller at refresh
//! time), filled by reading this node's shared pod watch (`spec.nodeName=<node>`, the pod
//! controller's too).

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tracing::info;
use vne_core::kubelet_metrics::PodEntry;

use crate::k8s::shared_watch::Reader;

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
