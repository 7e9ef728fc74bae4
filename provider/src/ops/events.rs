//! Kubernetes Events (`events.k8s.io/v1`) published by the daemon.
//!
//! The semantics of kube-runtime's `Recorder` — the same names, reporter and series: a repeat of
//! an event within 6 minutes patches the first one's `series` instead of creating another — sized
//! for thousands of pods. `Recorder` keeps every event it published for 6 minutes and scans that
//! whole cache under a write lock on each publish; at 10,000 pods (several ECI events each) that
//! was tens of megabytes and a quadratic amount of work. Here the series index keeps a hash, the
//! event's name and a count per entry, is pruned at most every 30 s, and is bounded.
//!
//! Events that must not delay anything (ECI's own events, published while pod statuses are
//! written) go through [`EventPublisher::publish_later`]: a bounded queue drained by a few
//! workers. When it is full the event is dropped and counted, as client-go's broadcaster does —
//! Events are best-effort by design; statuses are not.
//!
//! Unlike `Recorder`, the note is part of what makes two events "the same": a kubelet reports
//! `Pulling image a` and `Pulling image b` as two events, and so do we.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as KubeEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::debug;

use crate::k8s::access::{Access, Scope};
use crate::ops::metrics::Telemetry;

/// How long a repeat still counts as the same series (as kube-runtime and client-go).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// How often expired series are pruned (at most).
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Series remembered at most; beyond it a repeat creates a new event instead of counting.
const SERIES_CAPACITY: usize = 20_000;
/// Events waiting for the background workers at most.
const QUEUE_CAPACITY: usize = 4_096;
/// Background publications in flight at most.
const WORKERS: usize = 8;

/// The event a repeat counts against.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Series {
    namespace: Box<str>,
    name: Box<str>,
    count: i32,
    last_seen: Instant,
}

/// Which published events a new one repeats: hashed keys, pruned lazily, bounded.
#[derive(Debug)]
struct SeriesIndex {
    entries: HashMap<u64, Series>,
    hasher: RandomState,
    last_prune: Instant,
    capacity: usize,
}

impl SeriesIndex {
    fn new(capacity: usize, now: Instant) -> Self {
        Self {
            entries: HashMap::new(),
            hasher: RandomState::new(),
            last_prune: now,
            capacity,
        }
    }

    fn key(&self, event: &Event, regarding: &ObjectReference) -> u64 {
        let kind = match event.type_ {
            EventType::Normal => 0u8,
            EventType::Warning => 1,
        };
        self.hasher.hash_one((
            kind,
            &event.reason,
            &event.action,
            &event.note,
            &regarding.uid,
            &regarding.namespace,
            &regarding.name,
            &regarding.kind,
        ))
    }

    /// The series this event continues (its count already incremented), if any.
    fn repeat(&mut self, key: u64, now: Instant) -> Option<Series> {
        self.prune(now);
        let series = self.entries.get_mut(&key)?;
        if now.saturating_duration_since(series.last_seen) >= SERIES_TTL {
            self.entries.remove(&key);
            return None;
        }
        series.count += 1;
        series.last_seen = now;
        Some(series.clone())
    }

    /// Remembers a newly created event.
    fn record(&mut self, key: u64, namespace: &str, name: &str, now: Instant) {
        if self.entries.len() >= self.capacity {
            self.prune_now(now);
            if self.entries.len() >= self.capacity {
                return;
            }
        }
        self.entries.insert(
            key,
            Series {
                namespace: namespace.into(),
                name: name.into(),
                count: 1,
                last_seen: now,
            },
        );
    }

    /// Forgets a series whose event can no longer be patched.
    fn forget(&mut self, key: u64) {
        self.entries.remove(&key);
    }

    fn prune(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_prune) >= PRUNE_EVERY {
            self.prune_now(now);
        }
    }

    fn prune_now(&mut self, now: Instant) {
        self.last_prune = now;
        self.entries
            .retain(|_, series| now.saturating_duration_since(series.last_seen) < SERIES_TTL);
    }
}

/// What the publisher shares with its background workers.
struct Shared {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<SeriesIndex>,
    telemetry: Arc<Telemetry>,
}

/// Publishes Events about pods, nodes and Selectors.
#[derive(Clone)]
pub struct EventPublisher {
    shared: Arc<Shared>,
    queue: mpsc::Sender<(Event, ObjectReference)>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("reporter", &self.shared.reporter)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// A publisher reporting as `reporter`; starts its background workers (they stop when the
    /// last clone of the publisher is dropped).
    pub fn new(client: kube::Client, reporter: Reporter, telemetry: Arc<Telemetry>) -> Self {
        let shared = Arc::new(Shared {
            client,
            reporter,
            series: Mutex::new(SeriesIndex::new(SERIES_CAPACITY, Instant::now())),
            telemetry,
        });
        let (queue, mut queued) = mpsc::channel::<(Event, ObjectReference)>(QUEUE_CAPACITY);
        let workers = Arc::clone(&shared);
        tokio::spawn(async move {
            futures::stream::poll_fn(|cx| queued.poll_recv(cx))
                .for_each_concurrent(WORKERS, |(event, regarding)| {
                    let shared = Arc::clone(&workers);
                    async move {
                        if let Err(error) = shared.publish(&event, &regarding).await {
                            debug!(%error, reason = %event.reason, "could not publish an event");
                        }
                    }
                })
                .await;
        });
        Self { shared, queue }
    }

    /// Publishes an event and waits for the API's answer.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.shared.publish(event, regarding).await
    }

    /// Queues an event for the background workers without waiting. When the queue is full the
    /// event is dropped and counted (`virtual_node_eci_events_dropped_total`).
    pub fn publish_later(&self, event: Event, regarding: ObjectReference) {
        if let Err(error) = self.queue.try_send((event, regarding)) {
            self.shared.telemetry.events_dropped.inc();
            let (event, _) = error.into_inner();
            debug!(reason = %event.reason, "event queue full; event dropped");
        }
    }
}

impl Shared {
    fn series(&self) -> std::sync::MutexGuard<'_, SeriesIndex> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Instant::now();
        let (key, repeat) = {
            let mut series = self.series();
            let key = series.key(event, regarding);
            (key, series.repeat(key, now))
        };
        if let Some(series) = repeat {
            let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &series.namespace);
            let patch = json!({"series": EventSeries {
                count: series.count,
                last_observed_time: MicroTime(Timestamp::now()),
            }});
            self.telemetry.kube_request("event_patch");
            match api
                .patch(&series.name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return Ok(()),
                // The first event is gone (expired, deleted): start a new series.
                Err(kube::Error::Api(status)) if status.code == 404 => self.series().forget(key),
                Err(error) => return Err(error),
            }
        }
        let created = self.event_object(event, regarding);
        let namespace = created.metadata.namespace.clone().unwrap_or_default();
        let name = created.metadata.name.clone().unwrap_or_default();
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        self.telemetry.kube_request("event_create");
        api.create(&PostParams::default(), &created).await?;
        self.series().record(key, &namespace, &name, now);
        Ok(())
    }

    fn event_object(&self, event: &Event, regarding: &ObjectReference) -> KubeEvent {
        let now = Timestamp::now();
        let controller = &self.reporter.controller;
        KubeEvent {
            metadata: ObjectMeta {
                // Events of cluster-scoped objects (Nodes) live in `default`, as with kubectl.
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..KubeEvent::default()
        }
    }
}

/// Events published through kube's recorder (it patches a repeated event's series).
pub const KUBE_API: &[Access] = &[Access {
    scope: Scope::Cluster,
    group: "events.k8s.io",
    resource: "events",
    verbs: &["create", "patch"],
    why: "Events on pods, nodes, Selectors and the eci-profile ConfigMap",
}];

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    fn mk_ref(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_within_the_ttl_continues_the_series() {
        let now = Instant::now();
        let mut index = SeriesIndex::new(10, now);
        let key = index.key(&mk_event("Pulling", "image a"), &mk_ref("p"));
        assert_eq!(index.repeat(key, now), None);
        index.record(key, "default", "p.1", now);
        let second = index.repeat(key, now + Duration::from_secs(60)).unwrap();
        assert_eq!((&*second.name, second.count), ("p.1", 2));
        let third = index.repeat(key, now + Duration::from_secs(120)).unwrap();
        assert_eq!(third.count, 3);
        // The TTL runs from the last repeat.
        assert!(
            index
                .repeat(key, now + Duration::from_secs(120 + 359))
                .is_some()
        );
        assert_eq!(
            index.repeat(key, now + Duration::from_secs(120 + 359 + 360)),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn different_notes_objects_or_types_are_different_events() {
        let index = SeriesIndex::new(10, Instant::now());
        let base = index.key(&mk_event("Pulling", "image a"), &mk_ref("p"));
        assert_ne!(
            base,
            index.key(&mk_event("Pulling", "image b"), &mk_ref("p"))
        );
        assert_ne!(
            base,
            index.key(&mk_event("Pulling", "image a"), &mk_ref("q"))
        );
        let mut warning = mk_event("Pulling", "image a");
        warning.type_ = EventType::Warning;
        assert_ne!(base, index.key(&warning, &mk_ref("p")));
        assert_eq!(
            base,
            index.key(&mk_event("Pulling", "image a"), &mk_ref("p"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_index_is_bounded_and_prunes_expired_series() {
        let start = Instant::now();
        let mut index = SeriesIndex::new(2, start);
        index.record(1, "ns", "a", start);
        index.record(2, "ns", "b", start);
        // Full of live series: a third is not remembered (it is published, just not counted).
        index.record(3, "ns", "c", start + Duration::from_secs(10));
        assert_eq!(index.entries.len(), 2);
        assert_eq!(index.repeat(3, start + Duration::from_secs(10)), None);
        // Once the first two expired, room is made by pruning.
        let later = start + SERIES_TTL + Duration::from_secs(1);
        index.record(3, "ns", "c", later);
        assert_eq!(index.entries.len(), 1);
        assert!(index.repeat(3, later).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_series_are_pruned_without_being_asked_about() {
        let start = Instant::now();
        let mut index = SeriesIndex::new(100, start);
        for key in 0..50 {
            index.record(key, "ns", "e", start);
        }
        index.record(99, "ns", "fresh", start + SERIES_TTL);
        // Any lookup after the prune interval drops the expired ones.
        assert_eq!(index.repeat(1000, start + SERIES_TTL), None);
        assert_eq!(index.entries.len(), 1);
    }
}
