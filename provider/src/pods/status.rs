//! Statuses: incremental polling, pod status writes, events, vanished groups.

#[allow(clippy::wildcard_imports)]
use super::*;

impl PodController {
    /// Writes a pod status with optimistic concurrency: the patch carries the latest
    /// resourceVersion we know; on a conflict the pod is read again and the write retried once.
    pub(super) async fn write_status(&self, pod: &Pod, status: Value) {
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let uid = pod.uid().unwrap_or_default();
        let latest_rv = |fallback: &Pod| {
            self.tracked()
                .get(&uid)
                .and_then(|t| {
                    t.pod
                        .as_ref()
                        .and_then(|p| p.metadata.resource_version.clone())
                })
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
                    return;
                }
                Err(kube::Error::Api(conflict)) if conflict.code == 409 && attempt == 0 => {
                    self.inner.telemetry.kube_request("pod_get");
                    match api.get(&pod.name_any()).await {
                        Ok(fresh) if fresh.uid().as_deref() == Some(uid.as_str()) => {
                            self.remember(&uid, fresh);
                        }
                        _ => return,
                    }
                }
                Err(error) => {
                    warn!(pod = %pod_key(pod), %error, "could not write the pod status; the next poll retries");
                    if let Some(t) = self.tracked().get_mut(&uid) {
                        t.written = None;
                    }
                    return;
                }
            }
        }
    }

    /// Keeps the copy of a pod the API just returned: its resourceVersion is what the next
    /// write carries (resourceVersions are opaque, so the latest answer wins, not a comparison).
    pub(super) fn remember(&self, uid: &str, pod: Pod) {
        if let Some(t) = self.tracked().get_mut(uid) {
            t.pod = Some(Arc::new(pod));
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
        self.inner.telemetry.kube_request("event_publish");
        if let Err(error) = self
            .inner
            .recorder
            .publish(&event, &pod.object_ref(&()))
            .await
        {
            debug!(%error, "could not publish an event");
        }
    }

    pub(super) async fn poll_statuses(self, stop: CancellationToken) -> anyhow::Result<()> {
        let config = &self.inner.settings.config;
        let mut ticks = tokio::time::interval(config.pod_status_poll_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let window =
            i32::try_from(config.pod_status_poll_interval.as_secs() + 3).unwrap_or(i32::MAX);
        let mut last_full = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let full = last_full.elapsed() >= config.pod_resync_interval;
            let groups = match self
                .list_groups(if full { None } else { Some(window) })
                .await
            {
                Ok(groups) => groups,
                Err(error) => {
                    debug!(%error, "status poll failed; next interval");
                    continue;
                }
            };
            if full {
                last_full = tokio::time::Instant::now();
                self.detect_vanished(&groups).await;
                self.redrive();
            }
            self.count_phases();
            // Statuses are written in parallel: a burst of changes must not queue behind itself.
            futures::stream::iter(groups)
                .for_each_concurrent(32, |group| self.apply_status(group))
                .await;
        }
    }

    pub(super) fn count_phases(&self) {
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for tracked in self.tracked().values() {
            if let Some(pod) = &tracked.pod {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into());
                *counts.entry(phase).or_default() += 1;
            }
        }
        self.inner.telemetry.pods.clear();
        for (phase, count) in counts {
            self.inner
                .telemetry
                .pods
                .get_or_create(&crate::telemetry::PhaseLabels { phase })
                .set(count);
        }
    }

    pub(super) async fn apply_status(&self, group: ContainerGroupStatus) {
        let Some(uid) = tag(&group, naming::TAG_POD_UID) else {
            return;
        };
        let (pod, written, new_events) = {
            let mut tracked = self.tracked();
            let Some(entry) = tracked.get_mut(&uid) else {
                return;
            };
            if entry.deleting || group.status == "Terminating" {
                return;
            }
            entry
                .group
                .get_or_insert_with(|| group.container_group_id.clone());
            let Some(pod) = entry.pod.clone() else { return };
            let new_events: Vec<_> = group
                .events
                .iter()
                .filter(|e| {
                    entry
                        .events_seen
                        .insert(hash_of(&(&e.reason, &e.message, e.count)))
                })
                .cloned()
                .collect();
            (pod, entry.written, new_events)
        };
        for event in new_events {
            let kind = if event.r#type == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.event(&pod, kind, &event.reason, &event.message).await;
        }
        let status = pod_status::pod_status(&pod, &group, SystemTime::now());
        let fingerprint = hash_of(&pod_status::fingerprint(&status).to_string());
        let current = pod.status.as_ref().map(|s| {
            hash_of(
                &pod_status::fingerprint(&serde_json::to_value(s).unwrap_or_default()).to_string(),
            )
        });
        // Nothing new: neither what we wrote last nor what the pod already shows (an adopted
        // pod after a restart is not rewritten).
        if written == Some(fingerprint) || current == Some(fingerprint) {
            return;
        }
        self.write_status(&pod, status).await;
        if let Some(changed) = humantime::parse_rfc3339_weak(&group.status_change_time)
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
        {
            self.inner
                .telemetry
                .pod_status_propagation_seconds
                .observe(changed.as_secs_f64());
        }
        if let Some(entry) = self.tracked().get_mut(&uid) {
            entry.written = Some(fingerprint);
        }
    }

    /// Pods whose group is missing from a full listing, confirmed by a direct read, fail
    /// with reason `NotFound`.
    pub(super) async fn detect_vanished(&self, groups: &[ContainerGroupStatus]) {
        let present: HashSet<&str> = groups
            .iter()
            .map(|g| g.container_group_id.as_str())
            .collect();
        let suspects: Vec<(String, String, Arc<Pod>)> = self
            .tracked()
            .iter()
            .filter(|(_, t)| !t.deleting && !t.creating)
            .filter_map(|(uid, t)| Some((uid.clone(), t.group.clone()?, t.pod.clone()?)))
            .filter(|(_, id, _)| !present.contains(id.as_str()))
            .collect();
        for (uid, id, pod) in suspects {
            if matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ) {
                continue;
            }
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
