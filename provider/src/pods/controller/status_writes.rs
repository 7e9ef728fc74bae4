//! Statuses: incremental polling, and the status writers — bringing a pod's status in line with
//! its group's state (server-side apply of what we own).
//!
//! The polls store the group's latest state in the pod's entry and queue the pod's sync
//! ([`PodController::sync`]), which queues its status write. The status writers have a queue
//! of their own, served within this replica's share of the fleet's status writes, as
//! virtual-kubelet keeps pod status updates apart from its pod syncs: a burst's creations are
//! decided as its pods come, never behind a backlog of writes, and a pod whose group changed
//! twice before its turn is written once. The writer reads what is from the pod's entry and
//! [`plan`] (pure) decides what to write. The writers are the one writer of pod status: what a
//! pod is to show in place of its group's state waits in its entry for them too
//! ([`notice`](super::notice)). So only they change what is recorded as written, one pod at a
//! time, and no write is ever recorded over a newer finding.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eci_proto::v20180808::ContainerGroupStatus;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::carried::{self, Backlog};
use super::notice::Notice;
use super::{FIELD_MANAGER, PodController, STATUS_WRITERS, hash_of, pod_key, shown, slim, tag};
use vne_core::from_eci;
use vne_core::lifecycle::{self, Lifecycle};
use vne_core::to_eci::naming;

/// What a status write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// Stored; the [`from_eci::fingerprint`] of what was written.
    Stored(u64),
    /// Nothing to write: `compute` found the pod (as given, or read again after a conflict)
    /// already showing what it would write.
    Unneeded,
    /// Not stored (logged); the next poll or event tries again.
    Failed,
}

/// The group's state as the polls last showed it. A state not applied yet is kept encoded
/// (protobuf) until a status writer takes it: decoded, a group is several times its encoding in
/// allocations, and a burst of creations keeps one per pod, a large share of the burst's peak
/// memory (measured: docs/performance.md). Decoding it again costs the writer microseconds.
#[derive(Debug, Default)]
pub(in crate::pods) struct SeenGroup {
    /// The hash of the latest state seen ([`hash_of`] of its encoding).
    state: Option<u64>,
    /// That state, encoded, until a status writer applies it.
    unsynced: Option<Box<[u8]>>,
}

impl SeenGroup {
    /// Keeps `group` (hashed as `state`) for the status writers unless it is the state seen
    /// last: whether the pod needs a sync for it.
    pub(super) fn see(&mut self, group: &ContainerGroupStatus, state: u64) -> bool {
        if self.state == Some(state) {
            return false;
        }
        self.state = Some(state);
        self.unsynced = Some(prost::Message::encode_to_vec(group).into_boxed_slice());
        true
    }

    /// The state not applied yet, decoded (taken: a status writer applies it once).
    pub(super) fn take(&mut self) -> Option<Result<ContainerGroupStatus, prost::DecodeError>> {
        self.unsynced
            .take()
            .map(|bytes| prost::Message::decode(&*bytes))
    }

    /// Forgets the state seen, so that the next poll showing the group hands it to the
    /// status writers again (after someone wrote over the pod, or a write failed).
    pub(super) fn forget(&mut self) {
        self.state = None;
    }

    /// Whether a state waits for the status writers.
    pub(super) fn waiting(&self) -> bool {
        self.unsynced.is_some()
    }
}

/// What a pod's sync reads of its entry, after its step, to tell whether the status writers
/// have work for the pod ([`Self::want_a_write`]): most syncs (a creation decided, the echo of
/// our own write, a deletion begun, a resync) have none, and the writer would unpack the pod
/// again only to find that out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Asks {
    /// The pod has a group not being deleted.
    live: bool,
    /// A group state waits to be applied.
    waiting: bool,
    /// The fingerprint of the status last written.
    written: Option<u64>,
    /// The kept copy is the watch's (not our own write's answer).
    watched: bool,
    /// Whether annotations of ours wait for a status write, and whether too long.
    annotations: Backlog,
}

impl Asks {
    /// Read from the pod's entry.
    pub(super) fn of(entry: &super::PodEntry, now: tokio::time::Instant, wait: Duration) -> Self {
        Self {
            live: entry.lifecycle.live_group().is_some(),
            waiting: entry.group.waiting(),
            written: entry.written,
            watched: entry.origin == super::Origin::Watched,
            annotations: entry.carried.backlog(now, wait),
        }
    }

    /// Whether [`plan`] would do anything for the pod as `glance` (of its kept copy) shows it. A
    /// waiting state always goes to the writers: they take it, publish its events and find out
    /// whether the pod shows it already.
    pub(super) fn want_a_write(&self, glance: &slim::Glance) -> bool {
        if self.waiting {
            return true;
        }
        let live = self.live && !glance.terminating;
        if !live {
            return false;
        }
        let decided = plan(Facts {
            live,
            group: Unsynced::Nothing,
            overwritten: written_over(self.watched, self.written, glance.shown),
            refresh: glance.refresh,
            annotations: self.annotations,
        });
        decided.write != Write::Nothing || decided.forget
    }
}

/// What a status writer finds, read from the pod's entry (see [`plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Facts {
    /// The pod has a group not being deleted, and no deletionTimestamp.
    pub(super) live: bool,
    /// The group's state not applied yet, against what the pod shows of ours.
    pub(super) group: Unsynced,
    /// What the pod shows of ours is not what we last wrote: someone wrote over it.
    pub(super) overwritten: bool,
    /// Readiness gates others set, or the generation, changed what the status is to be.
    pub(super) refresh: bool,
    /// Whether annotations of ours wait for a status write, and whether too long.
    pub(super) annotations: Backlog,
}

/// A group state not applied yet, compared with the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unsynced {
    /// None (or one of a group being deleted by ECI, which its pod's deletion reports).
    Nothing,
    /// It implies the status the pod shows already.
    Shown,
    /// It implies another status.
    Changed,
}

/// What a status writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    /// Nothing.
    Nothing,
    /// The status the group's state implies.
    Apply,
    /// Nothing, but the group's state is recorded as written: the pod shows it already.
    Record,
    /// The status as the pod shows it, refreshed for readiness gates and the generation, with
    /// our waiting annotations.
    Refresh,
}

/// What a status writer does for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) write: Write,
    /// Forget the group's state seen: someone wrote over the pod and no state is at hand, so
    /// the next full listing hands it to the writers again.
    pub(super) forget: bool,
}

/// A status writer's decision (pure; the table test is its specification).
pub(super) fn plan(facts: Facts) -> Plan {
    if !facts.live {
        return Plan {
            write: Write::Nothing,
            forget: false,
        };
    }
    let again = facts.refresh || facts.annotations == Backlog::Due;
    let write = match facts.group {
        Unsynced::Changed => Write::Apply,
        _ if again => Write::Refresh,
        Unsynced::Shown => Write::Record,
        Unsynced::Nothing => Write::Nothing,
    };
    let forget = facts.overwritten && facts.group == Unsynced::Nothing;
    Plan { write, forget }
}

impl PodController {
    /// Writes what `compute` makes of `pod` as the pod's status, with server-side apply under
    /// our field manager on the `status` subresource: only the fields and conditions we own
    /// change (see [`from_eci::owned`]), so conditions others own survive, and whatever we
    /// wrote before and leave out now is removed. The apply also carries our annotations of
    /// the pod (see [`carried`](super::carried)). It carries `pod`'s resourceVersion: on a
    /// conflict the pod is read again and the status computed again from it (a readiness
    /// gate may have changed meanwhile), up to three times.
    pub(super) async fn apply_status(
        &self,
        pod: &Pod,
        compute: impl Fn(&Pod) -> Option<Value>,
    ) -> Written {
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let uid = pod.uid().unwrap_or_default();
        let name = pod.name_any();
        // Forced: a field someone else wrote with the same meaning (the scheduler's
        // PodScheduled, the node lifecycle controller's Ready) is ours to write, as it is a
        // kubelet's. Other managers' conditions are never in what we apply.
        //
        // `fieldValidation=Ignore`: unset, it is `Warn`, and the apiserver parses every apply
        // body as YAML twice, the second time only to look for duplicate keys (which a body
        // serialised from a JSON map cannot have); unknown fields fail an apply whatever the
        // directive, as the schema's conversion refuses them. The second parse costs the
        // apiserver CPU at every write (measured: docs/performance.md).
        let params = PatchParams::apply(FIELD_MANAGER)
            .force()
            .validation_ignore();
        let mut fresh: Option<Pod> = None;
        for attempt in 0..3 {
            let basis = fresh.as_ref().unwrap_or(pod);
            let Some(status) = compute(basis) else {
                return Written::Unneeded;
            };
            let (body, carried) = self.apply_body(basis, &uid, &status);
            self.inner.telemetry.kube_request("pod_status_patch");
            match api.patch_status(&name, &params, &Patch::Apply(body)).await {
                Ok(updated) => {
                    if let Some(t) = self.tracked().get_mut(&uid)
                        && let Some(values) = &carried
                    {
                        t.carried.stored(values);
                    }
                    self.remember(&uid, updated, slim::version_of(basis));
                    return Written::Stored(from_eci::fingerprint(&status));
                }
                Err(kube::Error::Api(conflict)) if conflict.code == 409 && attempt < 2 => {
                    self.inner.telemetry.kube_request("pod_get");
                    match api.get(&name).await {
                        Ok(again) if again.uid().as_deref() == Some(uid.as_str()) => {
                            debug!(pod = %pod_key(pod), sent = ?basis.resource_version(), found = ?again.resource_version(), last_writer = ?last_writer(&again), "a status apply met a conflict; applying again to the pod as read");
                            self.remember(&uid, again.clone(), slim::version_of(basis));
                            fresh = Some(again);
                        }
                        _ => return Written::Failed,
                    }
                }
                Err(error) => {
                    warn!(pod = %pod_key(pod), %error, "could not write the pod status; the next poll retries");
                    if let Some(t) = self.tracked().get_mut(&uid) {
                        t.forget_status();
                    }
                    return Written::Failed;
                }
            }
        }
        Written::Failed
    }

    /// The body of a status apply of `status` to `basis` (its resourceVersion the
    /// precondition), with the annotations of ours it carries (see [`carried`]).
    fn apply_body(
        &self,
        basis: &Pod,
        uid: &str,
        status: &Value,
    ) -> (Value, Option<carried::Values>) {
        let mut body = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": basis.name_any(),
                "namespace": basis.namespace(),
                "resourceVersion": basis.resource_version(),
            },
            "status": status,
        });
        let carried = self.carried_values(uid);
        if let Some(values) = &carried {
            let mut annotations = carried::as_json(values);
            let shown = basis.annotations();
            for key in carried::contradicted(values, |key| shown.get(key).map(String::as_str)) {
                warn!(pod = %pod_key(basis), annotation = key, "the pod shows a value ECI did not give for an annotation of ours; clearing it");
                annotations[key] = Value::String(String::new());
            }
            body["metadata"]["annotations"] = annotations;
            // The group's pod and no other of the same name.
            body["metadata"]["uid"] = Value::String(uid.to_owned());
        }
        (body, carried)
    }

    /// The status writers: one pod at a time each, within this replica's share of the fleet's
    /// status writes (a worker takes a pod only once it has a permit, so newer states pushed
    /// meanwhile replace the one waiting).
    pub(super) async fn write_statuses(self, stop: CancellationToken) -> anyhow::Result<()> {
        let this = self.clone();
        self.inner
            .statuses
            .serve_within(
                STATUS_WRITERS,
                self.inner.shares.statuses.permits(),
                &stop,
                move |uid, ()| {
                    let this = this.clone();
                    async move { this.write_status_of(&uid).await }
                },
            )
            .await;
        Ok(())
    }

    /// Keeps `notice` for `pod`'s status writer, which writes it (see [`notice`](super::notice)).
    pub(super) fn show(&self, pod: &Pod, notice: Notice) {
        let Some(uid) = pod.uid() else { return };
        match self.tracked().get_mut(&uid) {
            Some(entry) => entry.notice = Some(Box::new(notice)),
            None => return,
        }
        self.inner.statuses.push(uid, ());
    }

    /// Writes the pod's notice, when one waits and still applies, then tells its Event. What
    /// was written of the group is forgotten: should the group exist after all, the next full
    /// listing hands its state to the writers again. A notice not written stays, unless a newer
    /// one came meanwhile, and is tried again after a back-off.
    async fn write_notice(&self, uid: &str) {
        let (notice, kept) = {
            let mut tracked = self.tracked();
            let Some(entry) = tracked.get_mut(uid) else {
                return;
            };
            let Some(notice) = entry.notice.take() else {
                return;
            };
            if notice.before_group() && entry.lifecycle.group().is_some() {
                return;
            }
            let Some(kept) = entry.pod.clone() else {
                return;
            };
            (notice, kept)
        };
        let Some(pod) = kept.pod() else { return };
        let written = self
            .apply_status(&pod, |current| notice.status(current))
            .await;
        let mut tracked = self.tracked();
        let Some(entry) = tracked.get_mut(uid) else {
            return;
        };
        entry.forget_status();
        match written {
            Written::Stored(_) => {
                drop(tracked);
                let (kind, reason, note) = notice.event();
                self.publish_later(&pod, kind, reason, note);
            }
            // Unless a newer notice came meanwhile (queued already).
            Written::Failed if entry.notice.is_none() => {
                let mut notice = notice;
                let delay = notice.failed();
                entry.notice = Some(notice);
                drop(tracked);
                self.inner.statuses.push_after(uid.to_owned(), (), delay);
            }
            Written::Failed | Written::Unneeded => {}
        }
    }

    /// The annotations of ours the pod's next status apply carries.
    fn carried_values(&self, uid: &str) -> Option<carried::Values> {
        self.tracked().get(uid)?.carried.values().cloned()
    }

    /// How long the annotations of ours wait for a status write before they get one of their
    /// own (see [`carried`]).
    pub(super) fn annotation_wait(&self) -> Duration {
        self.inner.config.args.pod_status_poll_interval * carried::FLUSH_AFTER_POLLS
    }

    /// Keeps the copy of a pod the API just returned for a write computed from the copy at
    /// version `basis` (see [`super::PodEntry::keep_answer`]).
    pub(super) fn remember(&self, uid: &str, pod: Pod, basis: u64) {
        if let Some(t) = self.tracked().get_mut(uid) {
            t.keep_answer(&Arc::new(pod), basis);
        }
    }

    /// Publishes an Event about `pod` in the background.
    pub(super) fn publish_later(&self, pod: &Pod, kind: EventType, reason: &str, note: &str) {
        let event = reconcile_event(kind, reason, note);
        self.inner.events.publish_later(event, pod.object_ref(&()));
    }

    /// Publishes an Event about `pod` and waits for the API's answer.
    pub(super) async fn event(&self, pod: &Pod, kind: EventType, reason: &str, note: &str) {
        let event = reconcile_event(kind, reason, note);
        let regarding = pod.object_ref(&());
        if let Err(error) = self.inner.events.publish(&event, &regarding).await {
            debug!(%error, "could not publish an event");
        }
    }

    /// Polls ECI for the node's changed groups every interval (all of them every resync
    /// interval) and queues the changed ones for the status writers; it never waits for writes.
    /// `listed_at`: when the listing this controller started from was requested.
    pub(super) async fn poll_statuses(
        self,
        listed_at: tokio::time::Instant,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let config = &self.inner.config;
        let mut ticks = tokio::time::interval(config.args.pod_status_poll_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_full = listed_at;
        // Every change since this instant has been seen.
        let mut seen_until = listed_at;
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let started = tokio::time::Instant::now();
            let full = started.duration_since(last_full) >= config.args.pod_resync_interval;
            let since = (!full).then(|| change_window(started.duration_since(seen_until)));
            let mut present = HashSet::new();
            let polled = self
                .visit_groups(since, |page| {
                    if full {
                        present.extend(page.iter().map(|g| g.container_group_id.clone()));
                    }
                    self.queue_changed(page);
                })
                .await;
            if let Err(error) = polled {
                debug!(%error, "status poll failed; the next one covers its window");
                continue;
            }
            seen_until = started;
            if full {
                last_full = started;
                self.detect_vanished(&present).await;
                self.resync();
            }
            self.count_phases();
        }
    }

    /// Stores each group's state in its pod's entry and queues the pod for a sync, unless it
    /// is the state seen last (encoded: [`SeenGroup`]).
    pub(super) fn queue_changed(&self, groups: Vec<ContainerGroupStatus>) {
        let mut tracked = self.tracked();
        for mut group in groups {
            let Some(uid) = tag(&group, naming::TAG_POD_UID) else {
                continue;
            };
            let Some(entry) = tracked.get_mut(&uid) else {
                continue;
            };
            let state = hash_of(&prost::Message::encode_to_vec(&group));
            // What the entry keeps is only what applying needs: no tags, no Normal events
            // already published (a burst keeps thousands of groups). Warnings stay: the
            // latest one explains a failed schedule in the pod status.
            group.tags = Vec::new();
            group
                .events
                .retain(|e| e.r#type == "Warning" || entry.events.is_new(e));
            if entry.group.see(&group, state) {
                self.inner.syncs.push(uid, ());
            }
        }
    }

    pub(super) fn count_phases(&self) {
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for kept in self.tracked().values().filter_map(|t| t.pod.as_ref()) {
            let phase = kept.phase().unwrap_or("Pending");
            // A handful of phases: allocate a key only the first time one is seen.
            match counts.get_mut(phase) {
                Some(count) => *count += 1,
                None => {
                    counts.insert(phase.to_owned(), 1);
                }
            }
        }
        self.inner.metrics.pods.clear();
        for (phase, count) in counts {
            self.inner
                .metrics
                .pods
                .get_or_create(&crate::pods::PhaseLabels { phase })
                .set(count);
        }
    }

    /// Brings the pod's status in line with what is known: reads the entry, lets [`plan`]
    /// decide, writes, records what was written, then turns the group's new ECI events into
    /// Events in the background.
    pub(super) async fn write_status_of(&self, uid: &str) {
        self.write_notice(uid).await;
        let Some(found) = self.find(uid) else { return };
        let now = SystemTime::now();
        let pod = &found.pod;
        let desired = found
            .group
            .as_ref()
            .map(|group| from_eci::pod_status(pod, group, now));
        let fingerprint = desired.as_ref().map(from_eci::fingerprint);
        let shown = shown(pod);
        // Before our first write (an adopted pod after a restart), or after someone wrote over
        // ours, the pod's own status is what a new state is compared with.
        let overwritten = written_over(found.watched, found.written, shown);
        let basis = if overwritten || found.written.is_none() {
            shown
        } else {
            found.written
        };
        let facts = Facts {
            live: found.live,
            group: match fingerprint {
                None => Unsynced::Nothing,
                Some(fingerprint) if Some(fingerprint) == basis => Unsynced::Shown,
                Some(_) => Unsynced::Changed,
            },
            overwritten,
            refresh: from_eci::refresh(pod, now).is_some(),
            annotations: found.annotations,
        };
        let decided = plan(facts);
        let written = match (decided.write, &found.group) {
            (Write::Apply, Some(group)) => {
                let outcome = self
                    .apply_status(pod, |current| {
                        Some(from_eci::pod_status(current, group, now))
                    })
                    .await;
                if let (Written::Stored(_), Some(at)) = (outcome, changed_at(group)) {
                    self.inner
                        .metrics
                        .pod_status_propagation_seconds
                        .observe(at.as_secs_f64());
                }
                outcome
            }
            (Write::Refresh, _) => {
                let pending = found.annotations != Backlog::Empty;
                self.apply_status(pod, |current| {
                    from_eci::refresh(current, now)
                        .or_else(|| pending.then(|| shown_status(current)))
                })
                .await
            }
            (Write::Record, _) => fingerprint.map_or(Written::Unneeded, Written::Stored),
            _ => Written::Unneeded,
        };
        self.record(uid, decided, written);
        self.publish_eci_events(pod, found.events);
    }

    /// What a status writer reads of a pod's entry (taking the group state it applies), with
    /// the lifecycle's `Found` step taken for that state.
    fn find(&self, uid: &str) -> Option<Found> {
        let (kept, unsynced) = {
            let mut tracked = self.tracked();
            let entry = tracked.get_mut(uid)?;
            let kept = entry.pod.clone()?;
            (kept, entry.group.take())
        };
        // Unpacked and decoded outside the lock: the watch and the polls wait on it.
        let pod = kept.pod();
        let decoded = unsynced.map(|state| {
            state.inspect_err(|error| {
                warn!(pod_uid = %uid, %error, "a group state kept for the sync does not decode; the next full listing hands it over again");
            })
        });
        let lost = matches!(decoded, Some(Err(_))) || (pod.is_none() && decoded.is_some());
        // A group being deleted by ECI: its pod's deletion reports it.
        let group = decoded
            .and_then(Result::ok)
            .filter(|group| group.status != "Terminating");
        let mut tracked = self.tracked();
        let entry = tracked.get_mut(uid)?;
        // Neither a copy that does not unpack nor a state that does not decode is expected of
        // what this process packed and encoded; a state taken and not applied is forgotten,
        // so that the next full listing hands it to the writers again.
        if lost {
            entry.group.forget();
        }
        let pod = pod?;
        let mut events = Vec::new();
        if let Some(group) = &group
            && !entry.lifecycle.is_deleting()
        {
            entry.on(uid, lifecycle::Trigger::Found(&group.container_group_id));
            events = entry.events.take_new(&group.events);
        }
        Some(Found {
            live: entry.lifecycle.live_group().is_some()
                && pod.metadata.deletion_timestamp.is_none(),
            watched: entry.origin == super::Origin::Watched,
            written: entry.written,
            annotations: entry
                .carried
                .backlog(tokio::time::Instant::now(), self.annotation_wait()),
            pod,
            group,
            events,
        })
    }

    /// Records what the sync wrote (or found written already), and what it forgets.
    fn record(&self, uid: &str, decided: Plan, written: Written) {
        let mut tracked = self.tracked();
        let Some(entry) = tracked.get_mut(uid) else {
            return;
        };
        match written {
            Written::Stored(fingerprint) => entry.written = Some(fingerprint),
            Written::Failed => entry.forget_status(),
            Written::Unneeded => {}
        }
        if decided.forget {
            entry.forget_status();
        }
    }

    /// Publishes a group's new ECI events as Events about its pod, in the background.
    fn publish_eci_events(&self, pod: &Pod, events: Vec<eci_proto::v20180808::Event>) {
        if events.is_empty() {
            return;
        }
        for event in events {
            let kind = if event.r#type == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.publish_later(pod, kind, &event.reason, &event.message);
        }
    }

    /// Pods whose group is missing from a full listing, confirmed by a direct read: their
    /// lifecycle records it and their sync fails them with reason `NotFound`
    /// ([`Self::show_lost`]).
    pub(super) async fn detect_vanished(&self, present: &HashSet<String>) {
        let suspects: Vec<(String, String)> = self
            .tracked()
            .iter()
            .filter_map(|(uid, t)| match &t.lifecycle {
                Lifecycle::Created { group, .. }
                    if !present.contains(&**group)
                        && !matches!(t.pod.as_ref()?.phase(), Some("Succeeded" | "Failed")) =>
                {
                    Some((uid.clone(), group.to_string()))
                }
                _ => None,
            })
            .collect();
        // One read for all of them (shared calls of up to 20 ids); a failed read says nothing.
        let ids: Vec<String> = suspects.iter().map(|(_, id)| id.clone()).collect();
        let mut reads = self
            .describe_groups(&ids, super::describe::Lookup::Existence)
            .await;
        for (uid, id) in suspects {
            if let Some(Ok(None)) = reads.remove(&id) {
                self.advance(&uid, lifecycle::Trigger::Vanished);
                self.inner.syncs.push(uid, ());
            }
        }
    }

    /// Fails `pod` with reason `NotFound`: its group `id` vanished (from the pod's sync).
    pub(super) fn show_lost(&self, pod: &Pod, id: &str) {
        warn!(eci_id = %id, "the container group vanished");
        self.show(pod, Notice::lost(id));
    }
}

/// An Event of ours about a pod (its note cut to the API's limit).
fn reconcile_event(kind: EventType, reason: &str, note: &str) -> Event {
    Event {
        type_: kind,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// What one sync works from.
struct Found {
    /// The pod as kept.
    pod: Arc<Pod>,
    /// The group's state not applied yet (none while the group is being deleted).
    group: Option<ContainerGroupStatus>,
    /// The group's ECI events not published yet.
    events: Vec<eci_proto::v20180808::Event>,
    /// The pod has a group not being deleted, and no deletionTimestamp.
    live: bool,
    /// The kept copy is the watch's (not the answer to a write of ours).
    watched: bool,
    /// The fingerprint of the status last written.
    written: Option<u64>,
    /// Whether annotations of ours wait for a status write.
    annotations: Backlog,
}

/// How long ago the group's state changed, as ECI says.
fn changed_at(group: &ContainerGroupStatus) -> Option<Duration> {
    let changed = humantime::parse_rfc3339_weak(&group.status_change_time).ok()?;
    SystemTime::now().duration_since(changed).ok()
}

/// Who wrote the pod last, as its managed fields say (for the log of a conflict).
fn last_writer(pod: &Pod) -> Option<String> {
    let entries = pod.metadata.managed_fields.as_ref()?;
    let last = entries.iter().max_by_key(|entry| entry.time.clone())?;
    Some(format!(
        "{} {} {}",
        last.manager.as_deref().unwrap_or_default(),
        last.operation.as_deref().unwrap_or_default(),
        last.subresource.as_deref().unwrap_or_default(),
    ))
}

/// Whether someone wrote over the status we last wrote (`written`), as the pod `shown` tells.
/// Only a copy the watch delivered can tell: our own write's answer shows ours.
fn written_over(watched: bool, written: Option<u64>, shown: Option<u64>) -> bool {
    watched && written.is_some_and(|written| shown != Some(written))
}

/// The status fields and conditions of ours the pod shows (for a write that changes none).
fn shown_status(pod: &Pod) -> Value {
    let status = pod
        .status
        .as_ref()
        .and_then(|status| serde_json::to_value(status).ok())
        .unwrap_or_default();
    from_eci::owned(&status)
}

/// Identifies an ECI event among a group's events (ECI repeats them with a growing count).
/// The `since_second` window covering every change since the last complete poll, `elapsed`
/// ago: whole seconds rounded up, plus one for second-granular change times. (Wider windows
/// only return the same changes again; a change missed anyway is caught by the full resync.)
fn change_window(elapsed: Duration) -> i32 {
    let seconds = elapsed
        .as_secs()
        .saturating_add(u64::from(elapsed.subsec_nanos() > 0) + 1);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_window_covers_the_time_since_the_last_complete_poll() {
        assert_eq!(change_window(Duration::from_millis(500)), 2);
        assert_eq!(change_window(Duration::from_secs(1)), 2);
        assert_eq!(change_window(Duration::from_millis(1001)), 3);
        // Polls that failed for a minute: the next one asks for the whole minute.
        assert_eq!(change_window(Duration::from_secs(61)), 62);
        assert_eq!(change_window(Duration::MAX), i32::MAX);
    }

    #[test]
    fn a_group_state_is_kept_for_the_sync_once_per_change() {
        let group = ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            status: "Running".into(),
            ..ContainerGroupStatus::default()
        };
        let mut seen = SeenGroup::default();
        assert!(seen.see(&group, 7), "new");
        assert!(!seen.see(&group, 7), "seen already: no sync");
        assert_eq!(seen.take().unwrap().unwrap(), group, "as kept");
        assert!(seen.take().is_none(), "applied once");
        assert!(!seen.see(&group, 7), "applied, and not changed since");
        seen.forget();
        assert!(
            seen.see(&group, 7),
            "forgotten: the next poll hands it over again"
        );
    }

    #[tokio::test]
    async fn a_state_taken_and_not_applied_is_handed_over_again_by_the_next_listing() {
        let (controller, _) = super::super::tests::controller(Arc::default());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1"},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
        }))
        .unwrap();
        let group = ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            status: "Running".into(),
            ..ContainerGroupStatus::default()
        };
        let mut entry = super::super::PodEntry {
            lifecycle: Lifecycle::Created {
                group: "eci-1".into(),
                annotated: true,
            },
            ..super::super::PodEntry::default()
        };
        entry.keep(&Arc::new(pod));
        assert!(entry.group.see(&group, 7));
        // A state whose encoding is corrupt: taken by the sync, never applied.
        entry.group.unsynced = Some(vec![0xff; 3].into_boxed_slice());
        controller.tracked().insert("u-1".into(), entry);
        let found = controller.find("u-1").expect("the pod is kept");
        assert!(found.group.is_none(), "nothing decoded to apply");
        let mut tracked = controller.tracked();
        assert!(
            tracked.get_mut("u-1").unwrap().group.see(&group, 7),
            "the same state, listed again, is handed to the sync"
        );
    }

    #[test]
    fn the_sync_writes_what_is_new_and_forgets_what_was_written_over() {
        use Backlog::{Due, Empty, Pending};
        use Unsynced::{Changed, Nothing, Shown};
        let (apply, record, refresh, none) =
            (Write::Apply, Write::Record, Write::Refresh, Write::Nothing);
        // (live, group state, overwritten, refresh, annotations) → (write, forget)
        let table = [
            // Not live (no group, being deleted, terminating): nothing, whatever is known.
            ((false, Changed, true, true, Due), (none, false)),
            // A new state: applied, carrying any waiting annotations with it.
            ((true, Changed, false, false, Empty), (apply, false)),
            ((true, Changed, true, true, Due), (apply, false)),
            // A state the pod shows already: recorded, no write.
            ((true, Shown, false, false, Empty), (record, false)),
            ((true, Shown, true, false, Empty), (record, false)),
            // Annotations not due yet wait for a write that has another reason.
            ((true, Shown, false, false, Pending), (record, false)),
            ((true, Nothing, false, false, Pending), (none, false)),
            // Gates, the generation or annotations due: the status as it shows, again.
            ((true, Shown, false, true, Empty), (refresh, false)),
            ((true, Nothing, false, false, Due), (refresh, false)),
            // Written over, no state at hand: forgotten until the next full listing.
            ((true, Nothing, true, false, Empty), (none, true)),
            ((true, Nothing, true, true, Empty), (refresh, true)),
            ((true, Nothing, false, false, Empty), (none, false)),
        ];
        for ((live, group, overwritten, refresh, annotations), (write, forget)) in table {
            let facts = Facts {
                live,
                group,
                overwritten,
                refresh,
                annotations,
            };
            assert_eq!(plan(facts), Plan { write, forget }, "{facts:?}");
        }
    }
}
