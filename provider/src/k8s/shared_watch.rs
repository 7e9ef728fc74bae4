//! One watch of a kind per replica, read by every area that needs it. kube-runtime's watcher
//! does the listing, paging, bookmarks, 410 Gone and back-off; this only hands each event, in
//! order and `Init`…`InitDone` included, to the readers that subscribed. A reader keeps its own
//! index (slim facts, not whole objects) and must apply a relist whole: what `InitDone` closes
//! without naming was deleted while the watch was broken.
//!
//! The watch starts with its first reader. A reader that joins later has missed the list, so
//! the watch is restarted for everyone (one relist, which every reader handles anyway).

use parking_lot::{Mutex, MutexGuard};
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Objects per list page: a relist of a large cluster comes as many bounded answers, never one
/// huge one held whole.
pub const PAGE_SIZE: u32 = 500;

/// What a reader is handed.
pub type Reader<K> = Box<dyn FnMut(&watcher::Event<K>) + Send>;

/// The shared watch failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The watcher's stream ended, which kube-runtime's never does on its own.
    #[error("the shared {what} watch ended")]
    Ended {
        /// The kind watched.
        what: &'static str,
    },
}

struct Readers<K> {
    joined: Vec<Reader<K>>,
    /// Subscribed since the current stream began; they join at the next list.
    waiting: Vec<Reader<K>>,
}

/// One watch of `K`, many readers.
pub struct SharedWatch<K> {
    what: &'static str,
    readers: Mutex<Readers<K>>,
    arrived: Notify,
}

impl<K> SharedWatch<K> {
    fn lock(&self) -> MutexGuard<'_, Readers<K>> {
        // A reader that panicked left its own index behind, not ours.
        self.readers.lock()
    }
}

impl<K> Debug for SharedWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let readers = self.lock();
        f.debug_struct("SharedWatch")
            .field("what", &self.what)
            .field("joined", &readers.joined.len())
            .field("waiting", &readers.waiting.len())
            .finish()
    }
}

impl<K> SharedWatch<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// A watch of `what` (the kind's name, for logs) with no reader yet.
    pub fn new(what: &'static str) -> Arc<Self> {
        Arc::new(Self {
            what,
            readers: Mutex::new(Readers {
                joined: Vec::new(),
                waiting: Vec::new(),
            }),
            arrived: Notify::new(),
        })
    }

    /// Adds a reader; it sees a whole list first, then every change. It runs on the watch's
    /// task, so it must be quick and must not subscribe to the same watch.
    pub fn subscribe(&self, reader: Reader<K>) {
        self.lock().waiting.push(reader);
        self.arrived.notify_one();
    }

    /// How many readers it has, joined or waiting to.
    pub fn readers(&self) -> usize {
        let readers = self.lock();
        readers.joined.len() + readers.waiting.len()
    }

    /// Hands `event` to every joined reader.
    fn deliver(&self, event: &watcher::Event<K>) {
        for reader in &mut self.lock().joined {
            reader(event);
        }
    }

    /// Moves the waiting readers in; true if there were any.
    fn admit_waiting(&self) -> bool {
        let mut readers = self.lock();
        let waiting = std::mem::take(&mut readers.waiting);
        let any = !waiting.is_empty();
        readers.joined.extend(waiting);
        any
    }

    /// Watches `api` with `config` (its page size set to [`PAGE_SIZE`] unless given) for the
    /// readers, from the first one's arrival until `stop`.
    pub async fn run(
        self: Arc<Self>,
        api: Api<K>,
        config: watcher::Config,
        stop: CancellationToken,
    ) -> Result<(), Error> {
        let config = watcher::Config {
            page_size: config.page_size.or(Some(PAGE_SIZE)),
            ..config
        };
        let start = || watcher::watcher(api.clone(), config.clone()).default_backoff();
        loop {
            if self.admit_waiting() {
                break;
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = self.arrived.notified() => {}
            }
        }
        info!(what = self.what, "starting the shared watch");
        let mut events = start().boxed();
        let mut failing = false;
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = self.arrived.notified() => {
                    if self.admit_waiting() {
                        debug!(what = self.what, "a reader joined: listing again for it");
                        events = start().boxed();
                    }
                    continue;
                }
                next = events.next() => next,
            };
            match next {
                None => return Err(Error::Ended { what: self.what }),
                Some(Ok(event)) => {
                    if std::mem::take(&mut failing) {
                        info!(what = self.what, "the shared watch recovered");
                    }
                    self.deliver(&event);
                }
                Some(Err(error)) if failing => {
                    debug!(what = self.what, %error, "the shared watch still fails; retrying");
                }
                Some(Err(error)) => {
                    failing = true;
                    warn!(what = self.what, %error, "the shared watch failed; retrying with back-off");
                }
            }
        }
    }
}

/// The selection of the pods bound to `node`: the scope of a replica's own pods, watched once
/// (the pod controller and the kubelet API's metrics index read the same watch).
pub fn bound_to(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node}"))
}

/// The cluster-wide watches of this replica the areas share (admission's capacity view and
/// placement read the same pods and nodes).
#[derive(Debug, Clone)]
pub struct ClusterWatches {
    /// Every pod.
    pub pods: Arc<SharedWatch<Pod>>,
    /// Every node.
    pub nodes: Arc<SharedWatch<Node>>,
}

impl Default for ClusterWatches {
    fn default() -> Self {
        Self {
            pods: SharedWatch::new("pod"),
            nodes: SharedWatch::new("node"),
        }
    }
}

impl ClusterWatches {
    /// Runs both (each from its first reader on) until `stop`.
    pub async fn run(self, client: kube::Client, stop: CancellationToken) -> Result<(), Error> {
        let pods = Arc::clone(&self.pods).run(
            Api::all(client.clone()),
            watcher::Config::default(),
            stop.clone(),
        );
        let nodes = self
            .nodes
            .run(Api::all(client), watcher::Config::default(), stop);
        tokio::try_join!(pods, nodes).map(|((), ())| ())
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt as _;

    use super::*;

    fn pod(name: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod
    }

    fn recorder(seen: &Arc<Mutex<Vec<String>>>) -> Reader<Pod> {
        let seen = Arc::clone(seen);
        Box::new(move |event: &watcher::Event<Pod>| {
            let line = match event {
                watcher::Event::Init => "init".to_owned(),
                watcher::Event::InitApply(p) => format!("list {}", p.name_any()),
                watcher::Event::InitDone => "done".to_owned(),
                watcher::Event::Apply(p) => format!("apply {}", p.name_any()),
                watcher::Event::Delete(p) => format!("delete {}", p.name_any()),
            };
            seen.lock().push(line);
        })
    }

    #[test]
    fn every_reader_sees_every_event_in_order() {
        let watch = SharedWatch::<Pod>::new("pod");
        let (a, b) = (Arc::default(), Arc::default());
        watch.subscribe(recorder(&a));
        watch.subscribe(recorder(&b));
        let events = [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("x")),
            watcher::Event::InitDone,
            watcher::Event::Apply(pod("y")),
            watcher::Event::Delete(pod("x")),
        ];
        watch.admit_waiting();
        for event in &events {
            watch.deliver(event);
        }
        let expected = ["init", "list x", "done", "apply y", "delete x"];
        assert_eq!(*a.lock(), expected);
        assert_eq!(*b.lock(), expected);
    }

    #[test]
    fn a_late_reader_waits_for_the_next_list() {
        let watch = SharedWatch::<Pod>::new("pod");
        let (early, late) = (Arc::default(), Arc::default());
        watch.subscribe(recorder(&early));
        assert!(watch.admit_waiting(), "the first reader starts the watch");
        watch.deliver(&watcher::Event::Apply(pod("x")));
        watch.subscribe(recorder(&late));
        watch.deliver(&watcher::Event::Apply(pod("y")));
        assert!(late.lock().is_empty(), "not joined before a list");
        assert!(watch.admit_waiting(), "its arrival restarts the watch");
        assert!(!watch.admit_waiting());
        watch.deliver(&watcher::Event::Init);
        assert_eq!(*late.lock(), ["init"]);
        assert_eq!(*early.lock(), ["apply x", "apply y", "init"]);
    }
}
