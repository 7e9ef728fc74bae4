//! Statuses: incremental polling, pod status writes (server-side apply of what we own),
//! readiness re-evaluation, events, vanished groups.

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

use super::carried;
use super::lifecycle::{self, Lifecycle};
use super::{
    FIELD_MANAGER, PodController, REFRESH_WRITERS, STATUS_WRITERS, hash_of, pod_key, slim, tag,
};
use crate::pods::from_eci;
use crate::pods::to_eci::naming;

use crate::pods::from_eci::INSTANCE_CREATED;

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

/// A group state waiting for its pod's status write, kept encoded (protobuf) until a writer
/// takes it: decoded, a group is several times its encoding in allocations, and a burst of
/// creations queues one per pod, a large share of the burst's peak memory (measured:
/// docs/performance.md). Decoding it again costs a writer microseconds.
#[derive(Debug, Clone)]
pub(super) struct Queued {
    group: Box<[u8]>,
    /// The hash of the group's whole state ([`hash_of`]), recorded once it is applied.
    pub(super) state: u64,
}

impl Queued {
    pub(super) fn new(group: &ContainerGroupStatus, state: u64) -> Self {
        Self {
            group: prost::Message::encode_to_vec(group).into_boxed_slice(),
            state,
        }
    }

    /// The group as queued.
    pub(super) fn group(&self) -> Result<ContainerGroupStatus, prost::DecodeError> {
        prost::Message::decode(&*self.group)
    }
}

impl PodController {
    /// Writes what `compute` makes of `pod` as the pod's status, with server-side apply under
    /// our field manager on the `status` subresource: only the fields and conditions we own
    /// change (see [`from_eci::owned`]), so conditions others own survive, and whatever we
    /// wrote before and leave out now is removed. The apply also carries our annotations of
    /// the pod (see [`carried`](super::carried)). It carries `pod`'s resourceVersion: on a
    /// conflict the pod is read again and the status computed again from it (a readiness
    /// gate may have changed meanwhile), up to three times.
    pub(super) async fn write_status(
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
            let mut body = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": basis.namespace(),
                    "resourceVersion": basis.resource_version(),
                },
                "status": &status,
            });
            let carried = self.carried_values(&uid);
            if let Some(values) = &carried {
                let mut annotations = carried::as_json(values);
                let shown = basis.annotations();
                for key in carried::contradicted(values, |key| shown.get(key).map(String::as_str)) {
                    warn!(pod = %pod_key(pod), annotation = key, "the pod shows a value ECI did not give for an annotation of ours; clearing it");
                    annotations[key] = Value::String(String::new());
                }
                body["metadata"]["annotations"] = annotations;
                // The group's pod and no other of the same name.
                body["metadata"]["uid"] = Value::String(uid.clone());
            }
            self.inner.telemetry.kube_request("pod_status_patch");
            match api.patch_status(&name, &params, &Patch::Apply(body)).await {
                Ok(updated) => {
                    if let Some(t) = self.tracked().get_mut(&uid)
                        && let Some(values) = &carried
                    {
                        t.carried.stored(values);
                    }
                    self.remember(&uid, updated);
                    return Written::Stored(from_eci::fingerprint(&status));
                }
                Err(kube::Error::Api(conflict)) if conflict.code == 409 && attempt < 2 => {
                    self.inner.telemetry.kube_request("pod_get");
                    match api.get(&name).await {
                        Ok(again) if again.uid().as_deref() == Some(uid.as_str()) => {
                            debug!(pod = %pod_key(pod), sent = ?basis.resource_version(), found = ?again.resource_version(), last_writer = ?last_writer(&again), "a status apply met a conflict; applying again to the pod as read");
                            self.remember(&uid, again.clone());
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

    /// Shows on the pod why no group was created for it: `phase`, `reason` and `message` in
    /// its status, the `ContainerInstanceCreated=False` condition, one Warning Event. Not the
    /// group's state: once a group exists, its state is written over this.
    pub(super) async fn show_not_created(
        &self,
        pod: &Pod,
        phase: &str,
        reason: &str,
        message: &str,
    ) {
        self.show_not_created_as(pod, phase, reason, reason, message)
            .await;
    }

    /// [`Self::show_not_created`] with a pod reason other than the condition's (a pod that
    /// failed for lack of stock is `ProviderFailed`, its condition says `NoStock`, as ACK
    /// shows them).
    pub(super) async fn show_not_created_as(
        &self,
        pod: &Pod,
        phase: &str,
        pod_reason: &str,
        reason: &str,
        message: &str,
    ) {
        let now = crate::k8s::rfc3339(SystemTime::now());
        self.write_status(pod, |current| {
            let mut status = from_eci::with_phase(current, phase, pod_reason, message);
            let condition = json!({
                "type": INSTANCE_CREATED, "status": "False", "reason": reason,
                "message": message, "lastTransitionTime": now,
            });
            match status["conditions"].as_array_mut() {
                Some(conditions) => {
                    conditions.retain(|c| c["type"] != INSTANCE_CREATED);
                    conditions.push(condition);
                }
                None => status["conditions"] = json!([condition]),
            }
            Some(status)
        })
        .await;
        if let Some(uid) = pod.uid()
            && let Some(entry) = self.tracked().get_mut(&uid)
        {
            entry.forget_status();
        }
        self.event(pod, EventType::Warning, reason, message).await;
    }

    /// The annotations of ours the pod's next status apply carries.
    fn carried_values(&self, uid: &str) -> Option<carried::Values> {
        self.tracked().get(uid)?.carried.values().cloned()
    }

    /// A status poll went by: pods whose annotations waited [`carried::FLUSH_AFTER_POLLS`]
    /// polls for a status write get one of their own — unless a status write of the pod is
    /// queued or under way already (it carries them: a burst's queue can be seconds long).
    pub(super) fn flush_carried(&self) {
        let due: Vec<String> = self
            .tracked()
            .iter_mut()
            .filter_map(|(uid, t)| t.carried.poll_passed().then(|| uid.clone()))
            .collect();
        for uid in due {
            if !self.inner.statuses.is_busy(&uid) {
                self.inner.refreshes.push(uid, ());
            }
        }
    }

    /// Keeps the copy of a pod the API just returned: its resourceVersion is what the next
    /// write carries (resourceVersions are opaque, so the latest answer wins, not a comparison).
    pub(super) fn remember(&self, uid: &str, pod: Pod) {
        if let Some(t) = self.tracked().get_mut(uid) {
            t.keep_answer(&Arc::new(pod));
        }
    }

    pub(super) async fn event(&self, pod: &Pod, kind: EventType, reason: &str, note: &str) {
        let event = Event {
            type_: kind,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self
            .inner
            .events
            .publish(&event, &pod.object_ref(&()))
            .await
        {
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
        let mut ticks = tokio::time::interval(config.pod_status_poll_interval);
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
            let full = started.duration_since(last_full) >= config.pod_resync_interval;
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
            self.flush_carried();
            if full {
                last_full = started;
                self.detect_vanished(&present).await;
                self.replay();
            }
            self.count_phases();
        }
    }

    /// Queues the groups whose state differs from what was last applied to their pod (encoded:
    /// [`Queued`]).
    pub(super) fn queue_changed(&self, groups: Vec<ContainerGroupStatus>) {
        let tracked = self.tracked();
        for mut group in groups {
            let Some(uid) = tag(&group, naming::TAG_POD_UID) else {
                continue;
            };
            let state = hash_of(&prost::Message::encode_to_vec(&group));
            let Some(entry) = tracked.get(&uid) else {
                continue;
            };
            if entry.applied == Some(state) {
                continue;
            }
            // What waits in the queue is only what applying needs: no tags, no Normal events
            // already published (a burst can queue thousands of groups). Warnings stay: the
            // latest one explains a failed schedule in the pod status.
            group.tags = Vec::new();
            group
                .events
                .retain(|e| e.r#type == "Warning" || entry.events.is_new(e));
            self.inner.statuses.push(uid, Queued::new(&group, state));
        }
    }

    /// Status writers: apply queued group states to their pods, one pod at a time each.
    pub(super) async fn write_statuses(self, stop: CancellationToken) -> anyhow::Result<()> {
        let this = self.clone();
        self.inner
            .statuses
            .serve_within(
                STATUS_WRITERS,
                self.inner.shares.statuses.permits(),
                &stop,
                move |uid, queued| {
                let this = this.clone();
                async move {
                    match queued.group() {
                        Ok(group) => this.apply_status(&uid, group, queued.state).await,
                        // Not expected of what `Queued::new` encoded. Nothing was recorded as
                        // applied, so the group's next change or the next full poll queues it
                        // again.
                        Err(error) => warn!(pod_uid = %uid, %error, "a queued group state does not decode; skipped"),
                    }
                }
            })
            .await;
        Ok(())
    }

    /// Refresh writers: pods whose readiness gates or generation changed while their group
    /// did not (see [`from_eci::refresh`]) get their status written again, so a gate turning
    /// True turns Ready without waiting for ECI to change; so do pods whose new annotations
    /// waited for a status write too long (the status as it shows, with them).
    pub(super) async fn refresh_statuses(self, stop: CancellationToken) -> anyhow::Result<()> {
        let this = self.clone();
        self.inner
            .refreshes
            .serve(REFRESH_WRITERS, &stop, move |uid, ()| {
                let this = this.clone();
                async move { this.refresh_status(&uid).await }
            })
            .await;
        Ok(())
    }

    pub(super) async fn refresh_status(&self, uid: &str) {
        // Not beside a status write of the pod: one of the two would meet a conflict.
        let _held = self.inner.statuses.hold(uid.to_owned()).await;
        let (kept, epoch, pending) = {
            let tracked = self.tracked();
            match tracked.get(uid) {
                Some(t) if t.lifecycle.live_group().is_some() => {
                    (t.pod.clone(), t.status_epoch, t.carried.is_pending())
                }
                _ => (None, 0, false),
            }
        };
        let Some(pod) = kept.and_then(|kept| kept.pod()) else {
            return;
        };
        let now = SystemTime::now();
        let compute = |current: &Pod| {
            from_eci::refresh(current, now).or_else(|| pending.then(|| shown_status(current)))
        };
        if let Written::Stored(written) = self.write_status(&pod, compute).await {
            debug!(pod = %pod_key(&pod), "status written again for the pod's readiness gates, generation or our waiting annotations");
            if let Some(entry) = self.tracked().get_mut(uid) {
                entry.record_status(epoch, written, None);
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
        self.inner.telemetry.pods.clear();
        for (phase, count) in counts {
            self.inner
                .telemetry
                .pods
                .get_or_create(&crate::ops::metrics::PhaseLabels { phase })
                .set(count);
        }
    }

    /// Writes the pod status the group's state implies (when it differs from what the pod
    /// shows), then turns the group's new ECI events into Events in the background.
    pub(super) async fn apply_status(&self, uid: &str, group: ContainerGroupStatus, state: u64) {
        let (kept, written, epoch, new_events) = {
            let mut tracked = self.tracked();
            let Some(entry) = tracked.get_mut(uid) else {
                return;
            };
            if entry.lifecycle.is_deleting()
                || group.status == "Terminating"
                || entry.applied == Some(state)
            {
                return;
            }
            entry.on(uid, lifecycle::Event::Found(&group.container_group_id));
            let Some(kept) = entry.pod.clone() else {
                return;
            };
            let new_events = entry.events.take_new(&group.events);
            (kept, entry.written, entry.status_epoch, new_events)
        };
        let Some(pod) = kept.pod() else { return };
        let now = SystemTime::now();
        let status = from_eci::pod_status(&pod, &group, now);
        let fingerprint = from_eci::fingerprint(&status);
        // Nothing new: what we wrote last, or — before our first write, e.g. an adopted pod
        // after a restart — what the pod already shows of ours.
        let unchanged = match written {
            Some(written) => written == fingerprint,
            None => pod.status.as_ref().is_some_and(|current| {
                serde_json::to_value(current).is_ok_and(|current| {
                    from_eci::fingerprint(&from_eci::owned(&current)) == fingerprint
                })
            }),
        };
        let outcome = if unchanged {
            Written::Unneeded
        } else {
            // Computed from the pod it is written to: again from a fresh read after a conflict.
            self.write_status(&pod, |current| {
                Some(from_eci::pod_status(current, &group, now))
            })
            .await
        };
        if let Written::Stored(_) = outcome {
            if let Some(changed) = humantime::parse_rfc3339_weak(&group.status_change_time)
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
            {
                self.inner
                    .telemetry
                    .pod_status_propagation_seconds
                    .observe(changed.as_secs_f64());
            }
        }
        let written = match outcome {
            Written::Stored(written) => Some(written),
            Written::Unneeded => Some(fingerprint),
            Written::Failed => None,
        };
        if let Some(written) = written
            && let Some(entry) = self.tracked().get_mut(uid)
        {
            entry.record_status(epoch, written, Some(state));
        }
        let regarding = pod.object_ref(&());
        for event in new_events {
            let kind = if event.r#type == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.inner.events.publish_later(
                Event {
                    type_: kind,
                    reason: event.reason,
                    note: Some(event.message.chars().take(1000).collect()),
                    action: "Reconcile".into(),
                    secondary: None,
                },
                regarding.clone(),
            );
        }
    }

    /// Pods whose group is missing from a full listing, confirmed by a direct read, fail
    /// with reason `NotFound`.
    pub(super) async fn detect_vanished(&self, present: &HashSet<String>) {
        let suspects: Vec<(String, String, slim::PodCopy)> = self
            .tracked()
            .iter()
            .filter_map(|(uid, t)| match &t.lifecycle {
                Lifecycle::Created { group, .. } => {
                    Some((uid.clone(), group.to_string(), t.pod.clone()?))
                }
                _ => None,
            })
            .filter(|(_, id, kept)| {
                !present.contains(id) && !matches!(kept.phase(), Some("Succeeded" | "Failed"))
            })
            .collect();
        // One read for all of them (shared calls of up to 20 ids); a failed read says nothing.
        let ids: Vec<String> = suspects.iter().map(|(_, id, _)| id.clone()).collect();
        let mut reads = self.describe_groups(&ids, super::describe::Pace::Now).await;
        for (uid, id, kept) in suspects {
            let Some(pod) = kept.pod() else { continue };
            if let Some(Ok(None)) = reads.remove(&id) {
                warn!(pod = %pod_key(&pod), eci_id = %id, "the container group vanished");
                let message = format!("the ECI container group {id} no longer exists");
                let now = SystemTime::now();
                self.write_status(&pod, |current| {
                    Some(from_eci::lost(current, "NotFound", &message, now))
                })
                .await;
                self.event(&pod, EventType::Warning, "NotFound", &message)
                    .await;
                self.advance(&uid, lifecycle::Event::Vanished);
            }
        }
    }
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
    fn a_queued_state_is_the_group_as_queued() {
        let group = ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            status: "Running".into(),
            ..ContainerGroupStatus::default()
        };
        let queued = Queued::new(&group, 7);
        assert_eq!((queued.group().unwrap(), queued.state), (group, 7));
    }
}
