//! Kubernetes Events (`events.k8s.io/v1`) published by the daemon.
//!
//! The semantics of kube-runtime's `Recorder` — the same names, reporter and series: a repeat of
//! an event within 6 minutes patches the first one's `series` instead of creating another — sized
//! for thousands of pods. `Recorder` keeps every event it published for 6 minutes and scans that
//! whole cache under a write lock on each publish: with several ECI events per pod, a burst of
//! pod starts makes that cache large and the work quadratic. Here the series index keeps a
//! hash, the event's name and a count per entry, is pruned at most every 30 s, and is bounded.
//!
//! Events that must not delay anything (ECI's own events, published while pod statuses are
//! written) go through [`EventPublisher::publish_later`]: a bounded queue drained by background
//! publications. When it is full the event is dropped and counted, as client-go's broadcaster
//! does — Events are best-effort by design; statuses are not. How many publications are in flight
//! follows the apiserver's answers ([`Window`]): it grows while a backlog waits and the apiserver
//! takes what it is sent, and halves when it answers 429, a 5xx, later than its latency
//! objective, or not at all: pods' own writes come first. A fixed count would be the limit
//! before the apiserver is: a few publications, each waiting out a loaded apiserver's answer,
//! write fewer Events a second than a burst of pod starts reports, and the queue overflows
//! although the apiserver never refused one.
//!
//! Routine events (`Normal`) also yield to the pods' own writes: a publisher built with
//! [`EventPublisher::yielding_to`] keeps at most [`YIELDING_WINDOW`] of them in flight, and the
//! fleet together about as many ([`FleetTurn`]), while its [`Precedence`] says pod writes wait
//! (statuses to write, pod removals queued) and for [`YIELD_HOLD`] after; it publishes them at
//! the window's pace once none have waited for that long. They wait in a queue large enough for
//! a large start ([`ROUTINE_QUEUE_CAPACITY`]), and carry the time they were observed, not the
//! time they were written. Warnings have a queue of their own and never yield. Why: ECI reports
//! two or more routine events per pod, each an apiserver write beside the pod's one status
//! write, and published alongside they delayed the writes that make pods Running; yielding
//! makes them late instead (measured: docs/performance.md).
//!
//! Unlike `Recorder`, the note is part of what makes two events "the same": a kubelet reports
//! `Pulling image a` and `Pulling image b` as two events, and so do we.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as KubeEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::debug;

use crate::k8s::access::{Access, Scope};
use crate::k8s::write_share::WriteShare;
use crate::ops::metrics::{MetricSet, Telemetry};

/// How long a repeat still counts as the same series (as kube-runtime and client-go).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// How often expired series are pruned (at most).
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Series remembered at most; beyond it a repeat creates a new event instead of counting.
const SERIES_CAPACITY: usize = 20_000;
/// Warnings waiting for the background workers at most.
const WARNING_QUEUE_CAPACITY: usize = 4_096;
/// Routine events waiting at most: they may wait out a whole burst of pod starts (ECI reports
/// two to five per pod, so this holds two each for 16,384 pods started at once).
const ROUTINE_QUEUE_CAPACITY: usize = 32_768;
/// Routine publications in flight at most while the pods' own writes wait.
const YIELDING_WINDOW: usize = 1;
/// How long routine events keep yielding after pod writes were last seen waiting. Status
/// writes come in bursts, one per ECI poll (every second by default), and the queue is empty
/// between them: without a hold, the window opens to its ceiling in each gap of a rollout
/// slower than its writes. (Where the writes never pause, as in a large rollout, the hold
/// makes no difference.)
const YIELD_HOLD: Duration = Duration::from_secs(2);
/// Background publications in flight at first, before any answer has moved the window.
const FIRST_WINDOW: usize = 8;
/// Background publications in flight at most, for the whole fleet: a replica built with
/// [`EventPublisher::yielding_to`] keeps to its share of it ([`WriteShare`]). A kubelet's
/// client sends at most 50 Events/s (`--event-qps`), but one daemon speaks for many kubelets'
/// pods: 64 in flight keep up with a large start even while a loaded apiserver takes most of a
/// second per write, and it is the apiserver's latency or its 429 that stops it sooner. Not
/// its 429 alone: an apiserver that still takes every Event makes the pods' own writes wait
/// behind them long before it refuses one, hence [`SLOW_ANSWER`].
pub const MAX_WINDOW: usize = 64;

/// An answer slower than this means the apiserver is past its limit, for Events: it is the
/// Kubernetes scalability objective for a single-object mutating call (p99 ≤ 1 s). Pods' own
/// writes (creates, statuses) queue behind the same apiserver, and Events are best-effort, so
/// Events back off before the apiserver has to refuse anything.
const SLOW_ANSWER: Duration = Duration::from_secs(1);

/// How an answer to a background publication bears on the [`Window`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Written in time, or refused for the event's own sake (a 4xx other than 429: its
    /// namespace is terminating, it is invalid): the apiserver has room.
    Taken,
    /// The apiserver is at its limit: it answered 429 or a 5xx, did not answer, or answered
    /// after [`SLOW_ANSWER`].
    Overloaded,
}

impl Answer {
    fn of(result: &Result<(), kube::Error>, took: Duration) -> Self {
        match result {
            _ if took > SLOW_ANSWER => Self::Overloaded,
            Ok(()) => Self::Taken,
            Err(kube::Error::Api(status)) if status.code != 429 && status.code < 500 => Self::Taken,
            Err(_) => Self::Overloaded,
        }
    }
}

/// How many background publications may be in flight: additive increase, multiplicative
/// decrease, as TCP's congestion window. Each answer taken while events wait in the queue
/// admits one more (so the window doubles per round trip while the apiserver keeps up, up to
/// [`MAX_WINDOW`]); each sign of overload halves it (down to one). With no backlog it stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    limit: usize,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            limit: FIRST_WINDOW,
        }
    }
}

impl Window {
    fn answered(&mut self, answer: Answer, backlog: bool, ceiling: usize) {
        self.limit = match answer {
            Answer::Taken if backlog => (self.limit + 1).min(ceiling.max(1)),
            Answer::Taken => self.limit,
            Answer::Overloaded => (self.limit / 2).max(1),
        };
    }
}

/// An event waiting in a queue, what it is about, and when it was observed. Thousands wait
/// after a burst (two per pod), so it is held in fewer bytes than kube's `Event` and
/// `ObjectReference`, which keep an owned string with spare capacity per field: strings boxed
/// to their length, and the related object, which few events have, boxed apart.
#[derive(Debug)]
struct Queued {
    type_: EventType,
    reason: Box<str>,
    note: Option<Box<str>>,
    action: Box<str>,
    secondary: Option<Box<ObjectReference>>,
    regarding: PackedReference,
    observed: Timestamp,
}

/// An `ObjectReference` in fewer bytes (see [`Queued`]).
#[derive(Debug)]
struct PackedReference {
    api_version: Option<Box<str>>,
    field_path: Option<Box<str>>,
    kind: Option<Box<str>>,
    name: Option<Box<str>>,
    namespace: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    uid: Option<Box<str>>,
}

impl Queued {
    fn pack(event: Event, regarding: ObjectReference, observed: Timestamp) -> Self {
        let boxed = |text: Option<String>| text.map(String::into_boxed_str);
        Self {
            type_: event.type_,
            reason: event.reason.into_boxed_str(),
            note: boxed(event.note),
            action: event.action.into_boxed_str(),
            secondary: event.secondary.map(Box::new),
            regarding: PackedReference {
                api_version: boxed(regarding.api_version),
                field_path: boxed(regarding.field_path),
                kind: boxed(regarding.kind),
                name: boxed(regarding.name),
                namespace: boxed(regarding.namespace),
                resource_version: boxed(regarding.resource_version),
                uid: boxed(regarding.uid),
            },
            observed,
        }
    }

    fn unpack(self) -> (Event, ObjectReference, Timestamp) {
        let unboxed = |text: Option<Box<str>>| text.map(String::from);
        let Self {
            type_,
            reason,
            note,
            action,
            secondary,
            regarding,
            observed,
        } = self;
        let event = Event {
            type_,
            reason: reason.into(),
            note: unboxed(note),
            action: action.into(),
            secondary: secondary.map(|related| *related),
        };
        let regarding = ObjectReference {
            api_version: unboxed(regarding.api_version),
            field_path: unboxed(regarding.field_path),
            kind: unboxed(regarding.kind),
            name: unboxed(regarding.name),
            namespace: unboxed(regarding.namespace),
            resource_version: unboxed(regarding.resource_version),
            uid: unboxed(regarding.uid),
        };
        (event, regarding, observed)
    }
}

/// Says whether pod writes wait (routine events then yield). Called on the publisher's task
/// once per publication: it must be quick.
pub type Precedence = Arc<dyn Fn() -> bool + Send + Sync>;

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

/// The background queue's metrics, shared by every publisher of the daemon.
#[derive(Debug, Clone, Default)]
pub struct EventMetrics {
    /// Background events dropped because their queue was full.
    pub events_dropped: Counter,
    /// Background events queued and not yet being published.
    pub events_waiting: Gauge,
}

impl MetricSet for EventMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "events_dropped",
            "Events not published because the background queue was full (they are best-effort)",
            metrics.events_dropped.clone(),
        );
        registry.register(
            "events_waiting",
            "Events queued for background publication and not yet sent (routine ones wait while pod writes do)",
            metrics.events_waiting.clone(),
        );
        metrics
    }
}

/// What the publisher shares with its background workers.
struct Shared {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<SeriesIndex>,
    telemetry: Arc<Telemetry>,
    metrics: EventMetrics,
    precedence: Option<Precedence>,
    /// This replica's share of [`MAX_WINDOW`], when the fleet divides it.
    share: Option<Arc<WriteShare>>,
}

/// Publishes Events about pods, nodes and Selectors.
#[derive(Clone)]
pub struct EventPublisher {
    shared: Arc<Shared>,
    warnings: mpsc::Sender<Queued>,
    routine: mpsc::Sender<Queued>,
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
        Self::start(client, reporter, telemetry, None, None)
    }

    /// As [`Self::new`], with routine events yielding to the pod writes `precedence` reports,
    /// and at most `share` publications in flight: this replica's part of [`MAX_WINDOW`].
    pub fn yielding_to(
        client: kube::Client,
        reporter: Reporter,
        telemetry: Arc<Telemetry>,
        precedence: Precedence,
        share: Arc<WriteShare>,
    ) -> Self {
        Self::start(client, reporter, telemetry, Some(precedence), Some(share))
    }

    fn start(
        client: kube::Client,
        reporter: Reporter,
        telemetry: Arc<Telemetry>,
        precedence: Option<Precedence>,
        share: Option<Arc<WriteShare>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            client,
            reporter,
            series: Mutex::new(SeriesIndex::new(SERIES_CAPACITY, Instant::now())),
            metrics: EventMetrics::of(&telemetry),
            telemetry,
            precedence,
            share,
        });
        let (warnings, queued_warnings) = mpsc::channel::<Queued>(WARNING_QUEUE_CAPACITY);
        let (routine, queued_routine) = mpsc::channel::<Queued>(ROUTINE_QUEUE_CAPACITY);
        tokio::spawn(drain(
            Arc::clone(&shared),
            Queues {
                warnings: queued_warnings,
                routine: queued_routine,
            },
        ));
        Self {
            shared,
            warnings,
            routine,
        }
    }

    /// Publishes an event and waits for the API's answer.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.shared
            .publish(event, regarding, Timestamp::now())
            .await
    }

    /// Queues an event for the background workers without waiting. When its queue is full the
    /// event is dropped and counted (`virtual_node_eci_events_dropped_total`).
    pub fn publish_later(&self, event: Event, regarding: ObjectReference) {
        let queue = match event.type_ {
            EventType::Warning => &self.warnings,
            EventType::Normal => &self.routine,
        };
        match queue.try_send(Queued::pack(event, regarding, Timestamp::now())) {
            Ok(()) => {
                self.shared.metrics.events_waiting.inc();
            }
            Err(error) => {
                self.shared.metrics.events_dropped.inc();
                let reason = error.into_inner().reason;
                debug!(%reason, "event queue full; event dropped");
            }
        }
    }
}

/// The background queues' receiving ends.
struct Queues {
    warnings: mpsc::Receiver<Queued>,
    routine: mpsc::Receiver<Queued>,
}

impl Queues {
    fn is_empty(&self) -> bool {
        self.warnings.is_empty() && self.routine.is_empty()
    }
}

/// Whether routine events yield: from the moment pod writes are seen waiting until
/// [`YIELD_HOLD`] after they were last seen so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Yield {
    /// No pod write has waited within the hold.
    Open,
    /// Pod writes waited; yield until this instant unless they are seen waiting again.
    HeldUntil(Instant),
}

impl Yield {
    /// The state after looking at whether pod writes wait `now`; true while yielding.
    fn observe(&mut self, pods_wait: bool, now: Instant) -> bool {
        if pods_wait {
            *self = Self::HeldUntil(now + YIELD_HOLD);
        } else if matches!(self, Self::HeldUntil(until) if now >= *until) {
            *self = Self::Open;
        }
        matches!(self, Self::HeldUntil(_))
    }
}

/// While yielding, the whole fleet keeps about [`YIELDING_WINDOW`] routine publications in
/// flight, not each replica: after one, a replica waits out its answer time once for every
/// other replica before the next. One each per replica would multiply the routine Events in
/// flight by the replica count, and a large fleet would crowd the pods' writes as if its
/// Events did not yield at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FleetTurn {
    not_before: Option<Instant>,
}

impl FleetTurn {
    /// A routine publication made while yielding was answered after `took`; `others` replicas
    /// take their turns before this one's next. An answer slower than [`SLOW_ANSWER`] counts
    /// as that: one hung write must not hold a replica's Events back for minutes.
    fn published(&mut self, took: Duration, others: u32, now: Instant) {
        self.not_before = Some(now + took.min(SLOW_ANSWER).saturating_mul(others));
    }

    /// When this replica's next turn comes, if it has not come by `now`.
    fn waits_until(self, now: Instant) -> Option<Instant> {
        self.not_before.filter(|at| *at > now)
    }
}

/// What a background publication reports: the apiserver's answer, and how long a routine
/// one took (`None` for a warning).
type Published = (Answer, Option<Duration>);

/// Publishes what is queued, as many at once as the [`Window`] allows (routine events fewer
/// while pod writes wait, and for [`YIELD_HOLD`] after: see [`FleetTurn`]), until every
/// publisher is dropped; then waits for the publications in flight.
async fn drain(shared: Arc<Shared>, mut queues: Queues) {
    let mut window = Window::default();
    let (mut yielding, mut turn) = (Yield::Open, FleetTurn::default());
    let mut in_flight: JoinSet<Published> = JoinSet::new();
    let (mut warnings_open, mut routine_open) = (true, true);
    while warnings_open || routine_open {
        let (ceiling, now) = (shared.ceiling(), Instant::now());
        let limit = window.limit.min(ceiling);
        let room = limit.saturating_sub(in_flight.len());
        let pods_wait = shared.precedence.as_ref().is_some_and(|waits| waits());
        let is_yielding = yielding.observe(pods_wait, now);
        let turn_at = is_yielding.then(|| turn.waits_until(now)).flatten();
        let routine_limit = match (is_yielding, turn_at) {
            (false, _) => limit,
            (true, None) => YIELDING_WINDOW.min(limit),
            (true, Some(_)) => 0,
        };
        let routine_room = routine_limit.saturating_sub(in_flight.len());
        let (next, routine) = tokio::select! {
            biased;
            Some(done) = in_flight.join_next() => {
                // A publication that panicked says nothing about the apiserver.
                let (answer, took) = done.unwrap_or((Answer::Taken, None));
                window.answered(answer, !queues.is_empty(), ceiling);
                if let Some(took) = took.filter(|_| is_yielding) {
                    turn.published(took, shared.replicas().saturating_sub(1), Instant::now());
                }
                continue;
            }
            next = queues.warnings.recv(), if warnings_open && room > 0 => {
                warnings_open = next.is_some();
                (next, false)
            }
            next = queues.routine.recv(), if routine_open && routine_room > 0 => {
                routine_open = next.is_some();
                (next, true)
            }
            () = tokio::time::sleep_until(turn_at.unwrap_or(now)), if turn_at.is_some() => continue,
        };
        if let Some(queued) = next {
            shared.metrics.events_waiting.dec();
            in_flight.spawn(Arc::clone(&shared).publish_queued(queued, routine));
        }
    }
    while in_flight.join_next().await.is_some() {}
}

impl Shared {
    /// Publishes one queued event in the background (see [`Published`]).
    async fn publish_queued(self: Arc<Self>, queued: Queued, routine: bool) -> Published {
        let (event, regarding, observed) = queued.unpack();
        let sent = Instant::now();
        let result = self.publish(&event, &regarding, observed).await;
        if let Err(error) = &result {
            debug!(%error, reason = %event.reason, "could not publish an event");
        }
        let took = sent.elapsed();
        (Answer::of(&result, took), routine.then_some(took))
    }

    /// Replicas publishing to the same apiserver (one unless the fleet divides a share).
    fn replicas(&self) -> u32 {
        self.share.as_ref().map_or(1, |share| share.replicas())
    }

    /// Publications in flight at most: this replica's share of the fleet's.
    fn ceiling(&self) -> usize {
        self.share
            .as_ref()
            .map_or(MAX_WINDOW, |share| share.size().min(MAX_WINDOW))
    }

    fn series(&self) -> parking_lot::MutexGuard<'_, SeriesIndex> {
        self.series.lock()
    }

    async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        observed: Timestamp,
    ) -> Result<(), kube::Error> {
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
                last_observed_time: MicroTime(observed),
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
        let created = self.event_object(event, regarding, observed);
        let namespace = created.metadata.namespace.clone().unwrap_or_default();
        let name = created.metadata.name.clone().unwrap_or_default();
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        self.telemetry.kube_request("event_create");
        api.create(&PostParams::default(), &created).await?;
        self.series().record(key, &namespace, &name, now);
        Ok(())
    }

    fn event_object(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        observed: Timestamp,
    ) -> KubeEvent {
        // Named by when it is written (unique), dated by when it happened.
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
            event_time: Some(MicroTime(observed)),
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

    #[test]
    fn a_queued_event_unpacks_as_it_was_given_and_waits_in_under_half_the_bytes() {
        let reference = |kind: &str, name: &str| ObjectReference {
            api_version: Some("v1".into()),
            field_path: Some("spec.containers{app}".into()),
            kind: Some(kind.into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            resource_version: Some("42".into()),
            uid: Some("u-1".into()),
        };
        let event = || Event {
            type_: EventType::Warning,
            reason: "Failed".into(),
            note: Some("the image cannot be pulled".into()),
            action: "Pull".into(),
            secondary: Some(reference("Node", "vn-0")),
        };
        let observed = Timestamp::now();
        let (unpacked, regarding, at) =
            Queued::pack(event(), reference("Pod", "web-0"), observed).unpack();
        let given = event();
        assert!(matches!(unpacked.type_, EventType::Warning));
        assert_eq!(
            (unpacked.reason, unpacked.note, unpacked.action),
            (given.reason, given.note, given.action)
        );
        assert_eq!(unpacked.secondary, given.secondary);
        assert_eq!(regarding, reference("Pod", "web-0"));
        assert_eq!(at, observed);
        let (packed, whole) = (
            std::mem::size_of::<Queued>(),
            std::mem::size_of::<(Event, ObjectReference, Timestamp)>(),
        );
        assert!(packed * 2 < whole, "{packed} bytes queued against {whole}");
    }

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

    #[test]
    fn the_window_grows_while_a_backlog_is_taken_and_halves_on_overload() {
        use Answer::{Overloaded, Taken};
        let cases = [
            // (limit before, answer, backlog, limit after)
            (FIRST_WINDOW, Taken, true, FIRST_WINDOW + 1),
            (FIRST_WINDOW, Taken, false, FIRST_WINDOW),
            (MAX_WINDOW, Taken, true, MAX_WINDOW),
            (MAX_WINDOW, Overloaded, true, MAX_WINDOW / 2),
            (FIRST_WINDOW, Overloaded, false, FIRST_WINDOW / 2),
            (1, Overloaded, true, 1),
            (1, Taken, true, 2),
        ];
        for (before, answer, backlog, after) in cases {
            let mut window = Window { limit: before };
            window.answered(answer, backlog, MAX_WINDOW);
            assert_eq!(window.limit, after, "{before} {answer:?} backlog={backlog}");
        }
    }

    #[test]
    fn only_429s_5xx_late_and_no_answers_are_overload() {
        let api = |code: u16| {
            Err(kube::Error::Api(
                kube::core::Status::failure("refused", "Refused")
                    .with_code(code)
                    .boxed(),
            ))
        };
        let soon = Duration::from_millis(400);
        assert_eq!(Answer::of(&Ok(()), soon), Answer::Taken);
        for code in [400, 403, 404, 409, 422] {
            assert_eq!(Answer::of(&api(code), soon), Answer::Taken, "{code}");
        }
        for code in [429, 500, 503, 504] {
            assert_eq!(Answer::of(&api(code), soon), Answer::Overloaded, "{code}");
        }
        let no_answer = Err(kube::Error::Service("connection reset".into()));
        assert_eq!(Answer::of(&no_answer, soon), Answer::Overloaded);
        // Written, but past the apiserver's latency objective: the pods' writes wait too.
        assert_eq!(Answer::of(&Ok(()), SLOW_ANSWER), Answer::Taken);
        let late = SLOW_ANSWER + Duration::from_millis(1);
        assert_eq!(Answer::of(&Ok(()), late), Answer::Overloaded);
        assert_eq!(Answer::of(&api(404), late), Answer::Overloaded);
    }

    /// What a fake apiserver saw: Event writes answered, how many were in flight at most, and
    /// how many were in flight as each arrived.
    #[derive(Debug, Default)]
    struct Seen {
        in_flight: usize,
        answered: usize,
        most_in_flight: usize,
        in_flight_at_arrival: Vec<usize>,
    }

    /// A publisher over a fake apiserver that answers every Event write after `delay` with
    /// `code`.
    fn publisher_over(
        code: u16,
        delay: Duration,
    ) -> (EventPublisher, Arc<Mutex<Seen>>, Arc<Telemetry>) {
        publisher_yielding(code, delay, None, None)
    }

    /// As [`publisher_over`], routine events yielding to `precedence` when given, within
    /// `share` when given.
    fn publisher_yielding(
        code: u16,
        delay: Duration,
        precedence: Option<Precedence>,
        share: Option<Arc<WriteShare>>,
    ) -> (EventPublisher, Arc<Mutex<Seen>>, Arc<Telemetry>) {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let shared = Arc::clone(&seen);
        let service = tower::service_fn(move |_: hyper::Request<kube::client::Body>| {
            let seen = Arc::clone(&shared);
            {
                let mut seen = seen.lock();
                seen.in_flight += 1;
                seen.most_in_flight = seen.most_in_flight.max(seen.in_flight);
                let now = seen.in_flight;
                seen.in_flight_at_arrival.push(now);
            }
            async move {
                tokio::time::sleep(delay).await;
                {
                    let mut seen = seen.lock();
                    seen.in_flight -= 1;
                    seen.answered += 1;
                }
                let body = if code == 201 {
                    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                        "metadata": {"name": "e", "namespace": "default"}})
                } else {
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "reason": "TooManyRequests", "code": code})
                };
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .status(code)
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        let telemetry = Arc::new(Telemetry::new());
        let publisher = EventPublisher::start(
            kube::Client::new(service, "default"),
            Reporter {
                controller: "virtual-node-eci".into(),
                instance: None,
            },
            Arc::clone(&telemetry),
            precedence,
            share,
        );
        (publisher, seen, telemetry)
    }

    async fn until_answered(seen: &Mutex<Seen>, count: usize) {
        while seen.lock().answered < count {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// While the pods' own writes wait, routine events go one at a time and warnings at the
    /// window's pace; once none wait, routine events open up too. Nothing is lost meanwhile.
    #[tokio::test(start_paused = true)]
    async fn routine_events_yield_to_waiting_pod_writes_and_warnings_never_do() {
        let pods_wait = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let waits = Arc::clone(&pods_wait);
        let precedence: Precedence =
            Arc::new(move || waits.load(std::sync::atomic::Ordering::SeqCst));
        let (publisher, seen, telemetry) =
            publisher_yielding(201, Duration::from_millis(100), Some(precedence), None);
        for i in 0..200 {
            publisher.publish_later(mk_event("Started", &format!("container {i}")), mk_ref("p"));
        }
        assert_eq!(EventMetrics::of(&telemetry).events_waiting.get(), 200);
        until_answered(&seen, 10).await;
        assert_eq!(seen.lock().most_in_flight, 1, "routine: one at a time");

        for i in 0..20 {
            let mut warning = mk_event("Failed", &format!("image pull {i}"));
            warning.type_ = EventType::Warning;
            publisher.publish_later(warning, mk_ref("q"));
        }
        until_answered(&seen, 30).await;
        let most = seen.lock().most_in_flight;
        assert!(
            most > FIRST_WINDOW / 2,
            "warnings do not yield: {most} in flight at most"
        );

        pods_wait.store(false, std::sync::atomic::Ordering::SeqCst);
        until_answered(&seen, 220).await;
        let seen = seen.lock();
        assert!(
            seen.in_flight_at_arrival[200..]
                .iter()
                .any(|n| *n > FIRST_WINDOW),
            "routine events open up once pod writes do not wait: {:?}",
            &seen.in_flight_at_arrival[200..]
        );
        assert_eq!(EventMetrics::of(&telemetry).events_dropped.get(), 0);
        assert_eq!(EventMetrics::of(&telemetry).events_waiting.get(), 0);
    }

    /// Routine events yield from the first sight of waiting pod writes until [`YIELD_HOLD`]
    /// after the last one.
    #[test]
    fn yielding_holds_for_a_while_after_pod_writes_last_waited() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let hold = u64::try_from(YIELD_HOLD.as_millis()).unwrap();
        // (ms, pod writes wait, yielding afterwards)
        let steps = [
            (0, false, false),
            (100, true, true),
            (200, false, true),
            (100 + hold - 1, false, true),
            (100 + hold, false, false),
            (100 + hold + 1, false, false),
            (5_000, true, true),
            (5_000 + hold / 2, true, true),
            (5_000 + hold, false, true),
            (5_000 + hold / 2 + hold, false, false),
        ];
        let mut yielding = Yield::Open;
        for (ms, pods_wait, want) in steps {
            assert_eq!(yielding.observe(pods_wait, at(ms)), want, "at {ms} ms");
        }
    }

    /// Pod writes that wait in bursts, a tenth of each half second as a poll's status writes
    /// do, keep routine events to one at a time through the gaps; warnings are not held.
    #[tokio::test(start_paused = true)]
    async fn routine_events_keep_yielding_between_bursts_of_pod_writes() {
        let start = Instant::now();
        let bursts_end = start + Duration::from_secs(20);
        let precedence: Precedence = Arc::new(move || {
            let now = Instant::now();
            now < bursts_end && now.duration_since(start).as_millis() % 500 < 50
        });
        let (publisher, seen, telemetry) =
            publisher_yielding(201, Duration::from_millis(100), Some(precedence), None);
        // One routine event at once, 100 ms each: 200 last the 20 s of bursts and then some.
        for i in 0..300 {
            publisher.publish_later(mk_event("Started", &format!("container {i}")), mk_ref("p"));
        }
        until_answered(&seen, 150).await;
        assert!(Instant::now() < bursts_end, "still within the bursts");
        assert_eq!(
            seen.lock().most_in_flight,
            1,
            "the gaps between bursts must not open the window"
        );
        until_answered(&seen, 300).await;
        assert!(
            seen.lock().most_in_flight > 1,
            "the window opens once the bursts are over"
        );
        assert_eq!(EventMetrics::of(&telemetry).events_dropped.get(), 0);
    }

    /// A queued event is dated when it was observed, not when it is finally written.
    #[tokio::test]
    async fn an_event_is_dated_when_observed() {
        let (publisher, ..) = publisher_over(201, Duration::ZERO);
        let observed = Timestamp::from_second(1_790_000_000).unwrap();
        let object =
            publisher
                .shared
                .event_object(&mk_event("Started", "c"), &mk_ref("p"), observed);
        assert_eq!(object.event_time, Some(MicroTime(observed)));
        assert_ne!(
            object.metadata.name.as_deref(),
            Some(format!("p.{:x}", observed.as_nanosecond()).as_str()),
            "named by when it is written"
        );
    }

    /// A burst as a large start queues it, against an apiserver that takes every write in
    /// 400 ms: the window opens to its ceiling and drains the burst in about
    /// `burst / MAX_WINDOW` round trips, where a fixed eight would take `burst / 8` (100 s here).
    #[tokio::test(start_paused = true)]
    async fn a_backlog_the_apiserver_takes_is_published_at_the_windows_ceiling() {
        let (publisher, seen, telemetry) = publisher_over(201, Duration::from_millis(400));
        let burst = 2_000;
        let started = Instant::now();
        for i in 0..burst {
            publisher.publish_later(mk_event("Pulled", &format!("image {i}")), mk_ref("p"));
        }
        while seen.lock().answered < burst {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let took = started.elapsed();
        let seen = seen.lock();
        assert_eq!(EventMetrics::of(&telemetry).events_dropped.get(), 0);
        assert_eq!(
            seen.most_in_flight, MAX_WINDOW,
            "the window reached its ceiling"
        );
        assert!(
            took < Duration::from_secs(20),
            "{burst} Events took {took:?}; at {FIRST_WINDOW} in flight they take 100 s"
        );
    }

    /// The Events' share of a fleet of `replicas`, following `count` until stopped.
    struct FleetShare {
        share: Arc<WriteShare>,
        count: tokio::sync::watch::Sender<u32>,
        stop: tokio_util::sync::CancellationToken,
        following: tokio::task::JoinHandle<()>,
    }

    impl FleetShare {
        async fn of(replicas: u32) -> Self {
            let share = WriteShare::new("events", MAX_WINDOW, 1);
            let (count, receiver) = tokio::sync::watch::channel(replicas);
            let stop = tokio_util::sync::CancellationToken::new();
            let following = {
                let (share, stop) = (Arc::clone(&share), stop.clone());
                tokio::spawn(async move { share.follow(receiver, stop).await })
            };
            tokio::task::yield_now().await;
            Self {
                share,
                count,
                stop,
                following,
            }
        }

        async fn stop(self) {
            self.stop.cancel();
            self.following.await.unwrap();
        }
    }

    /// Ten replicas each opening the window to [`MAX_WINDOW`] would put ten times the
    /// fleet's Events in the apiserver's flight: a replica keeps to its share, as it changes.
    #[tokio::test(start_paused = true)]
    async fn a_replica_keeps_to_its_share_of_the_fleets_publications() {
        let fleet = FleetShare::of(10).await;
        let (share, count) = (Arc::clone(&fleet.share), &fleet.count);
        let (publisher, seen, _) = publisher_yielding(
            201,
            Duration::from_millis(400),
            None,
            Some(Arc::clone(&share)),
        );
        for i in 0..500 {
            publisher.publish_later(mk_event("Pulled", &format!("image {i}")), mk_ref("p"));
        }
        until_answered(&seen, 250).await;
        assert_eq!(seen.lock().most_in_flight, 7, "64 over ten, rounded up");
        count.send_replace(1);
        until_answered(&seen, 500).await;
        assert!(
            seen.lock().most_in_flight > 7,
            "alone again, the window opens past the old share"
        );
        fleet.stop().await;
    }

    /// A replica's turn comes after the others' answer times, each counted at most as
    /// [`SLOW_ANSWER`].
    #[test]
    fn a_turn_waits_the_others_answer_times_capped_at_a_slow_answer() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        // (took, others, next turn after now)
        for (took, others, wait) in [
            (ms(100), 9, ms(900)),
            (ms(100), 0, ms(0)),
            (ms(250), 3, ms(750)),
            (Duration::from_secs(60), 9, SLOW_ANSWER * 9),
        ] {
            let mut turn = FleetTurn::default();
            turn.published(took, others, now);
            assert_eq!(
                turn.waits_until(now),
                (!wait.is_zero()).then_some(now + wait),
                "{took:?} taken, {others} others"
            );
        }
        assert_eq!(
            FleetTurn::default().waits_until(now),
            None,
            "no turn taken yet"
        );
    }

    /// While pod writes wait, ten replicas together keep about one routine publication in
    /// flight: each waits out nine answer times between its own. Alone, a replica sends them
    /// back to back.
    #[tokio::test(start_paused = true)]
    async fn yielding_replicas_take_turns_so_the_fleet_has_about_one_routine_event_in_flight() {
        let fleet = FleetShare::of(10).await;
        let (share, count) = (Arc::clone(&fleet.share), &fleet.count);
        let always: Precedence = Arc::new(|| true);
        let (publisher, seen, telemetry) = publisher_yielding(
            201,
            Duration::from_millis(100),
            Some(always),
            Some(Arc::clone(&share)),
        );
        for i in 0..200 {
            publisher.publish_later(mk_event("Started", &format!("container {i}")), mk_ref("p"));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let answered = seen.lock().answered;
        assert!(
            (9..=11).contains(&answered),
            "one turn a second (100 ms, then 900 ms for the nine others): {answered} in 10 s"
        );

        count.send_replace(1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let alone = seen.lock().answered - answered;
        assert!(
            (90..=100).contains(&alone),
            "alone, one at a time back to back: {alone} in 10 s"
        );
        assert_eq!(seen.lock().most_in_flight, 1);
        assert_eq!(EventMetrics::of(&telemetry).events_dropped.get(), 0);
        fleet.stop().await;
    }

    /// An apiserver answering 429 closes the window to one publication at a time.
    #[tokio::test(start_paused = true)]
    async fn an_apiserver_at_its_limit_gets_one_event_at_a_time() {
        let (publisher, seen, _) = publisher_over(429, Duration::from_millis(100));
        for i in 0..60 {
            publisher.publish_later(mk_event("Pulled", &format!("image {i}")), mk_ref("p"));
        }
        while seen.lock().answered < 60 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seen = seen.lock();
        assert_eq!(
            seen.most_in_flight, FIRST_WINDOW,
            "it started at the first window"
        );
        assert!(
            seen.in_flight_at_arrival[20..].iter().all(|n| *n == 1),
            "after the first refusals, one at a time: {:?}",
            seen.in_flight_at_arrival
        );
    }

    /// An apiserver that takes every Event but past its latency objective closes the window
    /// too: the pods' own writes queue behind the same apiserver.
    #[tokio::test(start_paused = true)]
    async fn an_apiserver_past_its_latency_objective_gets_one_event_at_a_time() {
        let (publisher, seen, telemetry) = publisher_over(201, Duration::from_millis(1500));
        for i in 0..40 {
            publisher.publish_later(mk_event("Pulled", &format!("image {i}")), mk_ref("p"));
        }
        while seen.lock().answered < 40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seen = seen.lock();
        assert!(
            seen.in_flight_at_arrival[16..].iter().all(|n| *n == 1),
            "after the first slow answers, one at a time: {:?}",
            seen.in_flight_at_arrival
        );
        assert_eq!(
            EventMetrics::of(&telemetry).events_dropped.get(),
            0,
            "slow, not lost"
        );
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
