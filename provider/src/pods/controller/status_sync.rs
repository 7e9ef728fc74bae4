//! Statuses: incremental polling, pod status writes, events, vanished groups.

#[allow(clippy::wildcard_imports)]
use super::*;

impl PodController {
    /// Writes a pod status with optimistic concurrency: the patch carries the latest
    /// resourceVersion we know; on a conflict the pod is read again and the write retried once.
    /// Whether the status was stored.
    pub(super) async fn write_status(&self, pod: &Pod, status: Value) -> bool {
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let uid = pod.uid().unwrap_or_default();
        let latest_rv = |fallback: &Pod| {
            self.tracked()
                .get(&uid)
                .and_then(|t| t.pod.as_ref()?.resource_version().map(str::to_owned))
                .or_else(|| fallback.metadata.resource_version.clone())
        };
        for attempt in 0..2 {
            let body = json!({"metadata": {"resourceVersion": latest_rv(pod)}, "status": &status});
            self.inner.telemetry.kube_request("pod_status_patch");
            match api
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(body),
                )
                .await
            {
                Ok(updated) => {
                    self.remember(&uid, updated);
                    return true;
                }
                Err(kube::Error::Api(conflict)) if conflict.code == 409 && attempt == 0 => {
                    self.inner.telemetry.kube_request("pod_get");
                    match api.get(&pod.name_any()).await {
                        Ok(fresh) if fresh.uid().as_deref() == Some(uid.as_str()) => {
                            self.remember(&uid, fresh);
                        }
                        _ => return false,
                    }
                }
                Err(error) => {
                    warn!(pod = %pod_key(pod), %error, "could not write the pod status; the next poll retries");
                    if let Some(t) = self.tracked().get_mut(&uid) {
                        t.written = None;
                        t.applied = None;
                    }
                    return false;
                }
            }
        }
        false
    }

    /// Keeps the copy of a pod the API just returned: its resourceVersion is what the next
    /// write carries (resourceVersions are opaque, so the latest answer wins, not a comparison).
    pub(super) fn remember(&self, uid: &str, pod: Pod) {
        if let Some(t) = self.tracked().get_mut(uid) {
            t.keep(&Arc::new(pod));
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
        let config = &self.inner.settings.config;
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
            if full {
                last_full = started;
                self.detect_vanished(&present).await;
                self.redrive();
            }
            self.count_phases();
        }
    }

    /// Queues the groups whose state differs from what was last applied to their pod.
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
                .retain(|e| e.r#type == "Warning" || !entry.events_seen.contains(&event_hash(e)));
            self.inner.statuses.push(uid, (group, state));
        }
    }

    /// Status writers: apply queued group states to their pods, one pod at a time each.
    pub(super) async fn write_statuses(self, stop: CancellationToken) -> anyhow::Result<()> {
        let this = &self;
        this.inner
            .statuses
            .serve(
                STATUS_WRITERS,
                &stop,
                move |uid, (group, state)| async move {
                    this.apply_status(&uid, group, state).await;
                },
            )
            .await;
        Ok(())
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
        let (kept, written, new_events) = {
            let mut tracked = self.tracked();
            let Some(entry) = tracked.get_mut(uid) else {
                return;
            };
            if entry.deleting || group.status == "Terminating" || entry.applied == Some(state) {
                return;
            }
            entry
                .group
                .get_or_insert_with(|| group.container_group_id.clone());
            let Some(kept) = entry.pod.clone() else {
                return;
            };
            let new_events: Vec<_> = group
                .events
                .iter()
                .filter(|e| entry.events_seen.insert(event_hash(e)))
                .cloned()
                .collect();
            (kept, entry.written, new_events)
        };
        let Some(pod) = kept.pod() else { return };
        let status = from_eci::pod_status(&pod, &group, SystemTime::now());
        let fingerprint = from_eci::fingerprint(&status);
        // Nothing new: what we wrote last, or — before our first write, e.g. an adopted pod
        // after a restart — what the pod already shows.
        let unchanged = match written {
            Some(written) => written == fingerprint,
            None => pod.status.as_ref().is_some_and(|current| {
                serde_json::to_value(current)
                    .is_ok_and(|current| from_eci::fingerprint(&current) == fingerprint)
            }),
        };
        let stored = unchanged || self.write_status(&pod, status).await;
        if !unchanged && stored {
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
        if stored {
            if let Some(entry) = self.tracked().get_mut(uid) {
                entry.written = Some(fingerprint);
                entry.applied = Some(state);
            }
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
        let suspects: Vec<(String, String, slim::Kept)> = self
            .tracked()
            .iter()
            .filter(|(_, t)| !t.deleting && !t.creating)
            .filter_map(|(uid, t)| Some((uid.clone(), t.group.clone()?, t.pod.clone()?)))
            .filter(|(_, id, kept)| {
                !present.contains(id) && !matches!(kept.phase(), Some("Succeeded" | "Failed"))
            })
            .collect();
        for (uid, id, kept) in suspects {
            let Some(pod) = kept.pod() else { continue };
            if let Ok(false) = self.group_exists(&id).await {
                warn!(pod = %pod_key(&pod), eci_id = %id, "the container group vanished");
                let message = format!("the ECI container group {id} no longer exists");
                self.write_status(
                    &pod,
                    json!({"phase": "Failed", "reason": "NotFound", "message": message}),
                )
                .await;
                self.event(&pod, EventType::Warning, "NotFound", &message)
                    .await;
                if let Some(t) = self.tracked().get_mut(&uid) {
                    t.group = None;
                    t.creating = true; // a vanished group is not re-created
                }
            }
        }
    }
}

/// Identifies an ECI event among a group's events (ECI repeats them with a growing count).
fn event_hash(event: &eci_proto::v20180808::Event) -> u64 {
    hash_of(&(&event.reason, &event.message, event.count))
}

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
}
