//! Deleting: graceful group deletion, batched waits for removal, pod removal, orphans.

#[allow(clippy::wildcard_imports)]
use super::*;

impl PodController {
    /// Groups of this node whose pod is gone (confirmed by a direct read) are deleted.
    pub(super) async fn collect_orphans(&self, groups: &[Adopted], listed: &HashSet<String>) {
        for group in groups.iter().filter(|g| !listed.contains(&g.uid)) {
            let (Some(namespace), Some(name)) = (&group.namespace, &group.name) else {
                continue;
            };
            let pods: Api<Pod> = Api::namespaced(self.inner.client.clone(), namespace);
            match pods.get_opt(name).await {
                Ok(Some(pod)) if pod.uid().as_deref() == Some(group.uid.as_str()) => continue,
                Ok(_) => {
                    info!(eci_id = %group.id, pod = %format!("{namespace}/{name}"), "deleting an orphaned container group: its pod no longer exists");
                    self.delete_group(&group.id, true).await;
                    self.tracked().remove(&group.uid);
                }
                Err(error) => {
                    warn!(%error, eci_id = %group.id, "cannot confirm whether the group's pod exists; keeping the group");
                }
            }
        }
    }

    pub(super) async fn forget(&self, pod: &Pod) {
        let Some(uid) = pod.uid() else { return };
        let group = self.tracked().remove(&uid).and_then(|t| t.group);
        // Removed without going through our deletion (force-deleted): the group must go too.
        if let Some(id) = group {
            info!(pod = %pod_key(pod), eci_id = %id, "pod removed; deleting its container group");
            self.delete_group(&id, true).await;
        }
    }

    pub(super) async fn delete(self, pod: Arc<Pod>, uid: String) {
        let group = self.tracked().get(&uid).and_then(|t| t.group.clone());
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0);
        if let Some(id) = &group {
            self.delete_group(id, false).await;
            let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
            let (gone, until_gone) = tokio::sync::oneshot::channel();
            self.inner
                .awaiting_removal
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(id.clone())
                .or_default()
                .push(gone);
            if tokio::time::timeout(grace, until_gone).await.is_err() {
                // The grace period is over: stop it now.
                self.delete_group(id, true).await;
            }
        }
        // The group is gone: the pod's removal from the watch must not delete it again.
        if let Some(t) = self.tracked().get_mut(&uid) {
            t.group = None;
        }
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        for attempt in 0..8 {
            self.inner.telemetry.kube_request("pod_delete");
            match api.delete(&pod.name_any(), &params).await {
                Ok(_) => {
                    info!(eci_id = ?group, "pod deleted after its container group stopped");
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => return,
                Err(error) => {
                    debug!(%error, attempt, "could not delete the pod; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
        warn!("could not delete the pod; the next resync tries again");
        if let Some(t) = self.tracked().get_mut(&uid) {
            t.deleting = false;
        }
    }

    /// Drives every tracked pod again (after a failed step, nothing else might wake it).
    pub(super) fn redrive(&self) {
        let kept: Vec<slim::Kept> = self
            .tracked()
            .values()
            .filter_map(|t| t.pod.clone())
            .collect();
        let pods = kept.iter().filter_map(slim::Kept::pod);
        for pod in pods {
            self.observe(pod);
        }
    }

    /// Tells deletions when their groups are gone: one DescribeContainerGroups per 20 groups
    /// per interval, however many pods are being deleted.
    pub(super) async fn watch_removals(self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut ticks = tokio::time::interval(
            self.inner
                .settings
                .config
                .pod_status_poll_interval
                .min(Duration::from_millis(500)),
        );
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let ids: Vec<String> = {
                let mut waiting = self
                    .inner
                    .awaiting_removal
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // Waiters that gave up (grace period over) are dropped.
                waiting.retain(|_, senders| {
                    senders.retain(|s| !s.is_closed());
                    !senders.is_empty()
                });
                waiting.keys().cloned().collect()
            };
            for chunk in ids.chunks(20) {
                let Ok(answer) = self
                    .inner
                    .backend
                    .describe_container_groups(DescribeContainerGroupsRequest {
                        region_id: self.inner.settings.config.region.clone(),
                        container_group_ids: chunk.to_vec(),
                        limit: Some(20),
                        ..DescribeContainerGroupsRequest::default()
                    })
                    .await
                else {
                    continue;
                };
                let present: HashSet<&str> = answer
                    .container_groups
                    .iter()
                    .map(|g| g.container_group_id.as_str())
                    .collect();
                let mut waiting = self
                    .inner
                    .awaiting_removal
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                for id in chunk.iter().filter(|id| !present.contains(id.as_str())) {
                    for sender in waiting.remove(id).into_iter().flatten() {
                        let _ = sender.send(());
                    }
                }
            }
        }
    }

    pub(super) async fn group_exists(&self, id: &str) -> Result<bool, EciError> {
        let answer = self
            .inner
            .backend
            .describe_container_groups(DescribeContainerGroupsRequest {
                region_id: self.inner.settings.config.region.clone(),
                container_group_ids: vec![id.to_owned()],
                ..DescribeContainerGroupsRequest::default()
            })
            .await?;
        Ok(!answer.container_groups.is_empty())
    }

    pub(super) async fn delete_group(&self, id: &str, force: bool) {
        let mut attempt = 0;
        loop {
            let result = self
                .inner
                .backend
                .delete_container_group(DeleteContainerGroupRequest {
                    region_id: self.inner.settings.config.region.clone(),
                    container_group_id: id.to_owned(),
                    force,
                    ..DeleteContainerGroupRequest::default()
                })
                .await;
            match result {
                Ok(_) => return,
                Err(error) if error.is_not_found() => return,
                Err(error) if error.is_retryable() && attempt < 8 => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(error) => {
                    warn!(eci_id = %id, %error, "could not delete the container group; the next resync retries");
                    return;
                }
            }
        }
    }
}
