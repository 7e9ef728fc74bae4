//! Deleting: graceful group deletion, batched waits for removal, pod removal, pods that went
//! while nobody watched.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use backon::Retryable as _;
use eci_proto::EciError;
use eci_proto::v20180808::DeleteContainerGroupRequest;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::lifecycle::{Lifecycle, Trigger};
use super::{Adopted, PodController, backoff, pod_key, pod_key_parts, retry_delays, slim};

/// Reads in flight at most when confirming that unlisted pods are gone.
const CONFIRMING: usize = 8;
/// How long past a pod's grace period its group may take to disappear before it is deleted
/// again by force: ECI ends the group itself when the grace period it was created with runs
/// out, and the removal watcher sees that within a poll or two.
const REMOVAL_SLACK: Duration = Duration::from_secs(2);

/// How a pod's container group is deleted, from the pod's deletion grace period.
///
/// ECI honours the grace period the group was created with: a graceful delete ends in the
/// group's removal without a second call. A forced delete is sent only when no grace is left,
/// or when the group outlives its grace period (plus [`REMOVAL_SLACK`]) and is still there.
/// Deletions share an account-wide quota (1,000 a minute per region), so one wasted call per
/// pod halves the speed of every scale-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupDeletion {
    /// No grace period: one forced delete.
    Immediate,
    /// One graceful delete, then wait this long for the group to go.
    Graceful {
        /// The grace period plus the slack.
        wait: Duration,
    },
}

impl GroupDeletion {
    /// The plan for a pod deleted with `grace_seconds` (negative read as none).
    fn for_grace(grace_seconds: i64) -> Self {
        match u64::try_from(grace_seconds) {
            Ok(0) | Err(_) => Self::Immediate,
            Ok(seconds) => Self::Graceful {
                wait: Duration::from_secs(seconds).saturating_add(REMOVAL_SLACK),
            },
        }
    }
}

/// At most this many bytes are held by a pod's deletion while it waits for the group to go
/// (the size of [`PodController::delete`]'s future; a test holds it there). A scale-in has
/// every deleted pod's deletion waiting at once, so this is memory per pod: a future holding
/// the watched pod, the calls' futures unboxed and the pod-delete answer across its retry's
/// wait is several times larger, plus the pod's copy, and a large scale-in's deletions would
/// be a large share of the daemon's peak.
#[cfg(test)]
pub(super) const DELETION_BYTES: usize = 768;

/// What a pod's deletion needs of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeletionTarget {
    pub(super) namespace: String,
    pub(super) name: String,
    /// The deletion's grace period in seconds (30, the default, when the pod gives none).
    pub(super) grace: i64,
}

impl DeletionTarget {
    pub(super) fn of(pod: &Pod) -> Self {
        let (namespace, name) = pod_key_parts(pod);
        Self {
            namespace,
            name,
            grace: pod.metadata.deletion_grace_period_seconds.unwrap_or(30),
        }
    }
}

/// Whose deletion waits while a group deletion is retried, for the log line that says so.
#[derive(Clone, Copy)]
pub(super) enum Waiting {
    /// The pod's own deletion: it stays Terminating until the group is gone.
    PodTerminating,
    /// The pod stays, failed at its active deadline; only its group goes.
    PastDeadline,
    /// Nothing: the pod is gone already and only its group is left.
    PodRemoved,
}

/// A pod tracked but missing from a list, and how to look it up.
pub(super) struct Missing {
    uid: String,
    /// Namespace and name: from the kept pod, or from an adopted group's tags.
    key: Option<(String, String)>,
}

impl PodController {
    /// The pods tracked but not `listed` by a completed (re)list, with how to look each up:
    /// its kept copy, or for an adopted group whose pod was never seen, the names its tags
    /// give (`unseen`). Only memory is read: the watch calls it and must not wait.
    pub(super) fn unlisted(
        &self,
        listed: &HashSet<String>,
        unseen: &HashMap<String, Adopted>,
    ) -> Vec<Missing> {
        let kept: Vec<(String, Option<slim::PodCopy>)> = self
            .tracked()
            .iter()
            .filter(|(uid, _)| !listed.contains(*uid))
            .map(|(uid, t)| (uid.clone(), t.pod.clone()))
            .collect();
        kept.into_iter()
            .map(|(uid, kept)| {
                let key = kept
                    .and_then(|kept| kept.pod())
                    .map(|pod| (pod.namespace().unwrap_or_default(), pod.name_any()))
                    .or_else(|| {
                        let group = unseen.get(&uid)?;
                        Some((group.namespace.clone()?, group.name.clone()?))
                    });
                Missing { uid, key }
            })
            .collect()
    }

    /// Settles a completed (re)list: every pod tracked but not listed ([`Self::unlisted`]) —
    /// deleted while the watch was broken or the daemon stopped, so no Delete event will ever
    /// say so — is confirmed gone with a direct read (a missing pod, or one of that name with
    /// another UID) and then handled as a deletion: its group is deleted at once (the pod is
    /// gone, so no grace period is left to honour) and it is counted in
    /// `virtual_node_eci_pods_deleted_during_watch_gap_total`. At start the tracked pods are the
    /// adopted groups, so orphans left by pods deleted while the daemon was stopped go the same
    /// way. A pod that cannot be confirmed gone (the read failed) stays tracked for the next
    /// list. Runs beside the watch, not in it; a pod an earlier list's settling already took
    /// is not counted again. How many pods were gone.
    pub(super) async fn settle_list(&self, missing: Vec<Missing>) -> usize {
        let confirmed: Vec<String> = futures::stream::iter(missing)
            .map(|missing| async move { self.is_gone(&missing).await.then_some(missing.uid) })
            .buffer_unordered(CONFIRMING)
            .filter_map(|gone| async move { gone })
            .collect()
            .await;
        let mut gone = 0;
        for uid in &confirmed {
            let Some(tracked) = self.tracked().remove(uid) else {
                continue;
            };
            gone += 1;
            self.inner.tokens.forget(uid);
            self.inner.telemetry.pods_deleted_during_watch_gap.inc();
            match tracked.lifecycle.into_group() {
                Some(id) => {
                    info!(pod_uid = %uid, eci_id = %id, "the pod was deleted while nobody watched; deleting its container group");
                    self.delete_group_eventually(id.into());
                }
                None => {
                    info!(pod_uid = %uid, "the pod was deleted while nobody watched; it had no container group");
                }
            }
        }
        gone
    }

    /// Whether a pod missing from a list is really gone (a failed read says no).
    async fn is_gone(&self, missing: &Missing) -> bool {
        let Some((namespace, name)) = &missing.key else {
            // An adopted group whose tags do not name its pod: nothing to look up, so it is
            // left to the cluster-wide orphan collector.
            warn!(pod_uid = %missing.uid, "a container group of this node names no pod; keeping it");
            return false;
        };
        let pods: Api<Pod> = Api::namespaced(self.inner.client.clone(), namespace);
        self.inner.telemetry.kube_request("pod_get");
        match pods.get_opt(name).await {
            Ok(Some(pod)) => pod.uid().as_deref() != Some(missing.uid.as_str()),
            Ok(None) => true,
            Err(error) => {
                warn!(%error, pod = %format!("{namespace}/{name}"), "cannot confirm that an unlisted pod is gone; the next list tries again");
                false
            }
        }
    }

    /// A pod left the watch. Removed without going through our deletion (force-deleted, or by
    /// the pod garbage collector), its group must go too — in the background: the watch must
    /// not wait on ECI (an outage would hold every other pod of the node back).
    pub(super) fn forget(&self, pod: &Pod) {
        let Some(uid) = pod.uid() else { return };
        let Some(tracked) = self.tracked().remove(&uid) else {
            return;
        };
        self.inner.tokens.forget(&uid);
        self.inner.deadlines.forget(&uid);
        match tracked.lifecycle {
            // Our own deletion of the pod is under way (a grace period of 0 brings the pod's
            // removal right after its deletionTimestamp): it deletes the group until ECI
            // accepts, whatever becomes of the pod, so a second call would only be refused.
            Lifecycle::Deleting { group: Some(id) } => {
                debug!(pod = %pod_key(pod), eci_id = %id, "pod removed while its deletion runs; that deletion ends the container group");
            }
            lifecycle => {
                if let Some(id) = lifecycle.into_group() {
                    info!(pod = %pod_key(pod), eci_id = %id, "pod removed; deleting its container group");
                    self.delete_group_eventually(id.into());
                }
            }
        }
    }

    /// Deletes group `id` (force) in the background, again and again until ECI confirms it
    /// gone, for a group whose pod is gone already: nothing else would ever delete it while
    /// this replica runs (the orphan collector leaves the groups of live nodes alone). A stop
    /// abandons it; the successor adopts the group and, finding its pod gone, deletes it.
    pub(super) fn delete_group_eventually(&self, id: String) {
        let controller = self.clone();
        self.spawn_pod_task(async move {
            controller
                .delete_group_until_accepted(&id, true, Waiting::PodRemoved)
                .await;
        });
    }

    /// Deletes `group` (the pod's, when its deletion was seen) as the pod's grace period
    /// allows, then the pod.
    ///
    /// Every pod being deleted has one of these waiting for its group to go (a scale-in has
    /// one per pod at once), so what it holds is kept small: the pod's names, not the
    /// pod, and the calls' own futures boxed, alive only while a call is ([`DELETION_BYTES`]).
    pub(super) async fn delete(self, pod: DeletionTarget, uid: String, group: Option<String>) {
        if let Some(id) = &group {
            Box::pin(self.delete_group_for_pod(id, GroupDeletion::for_grace(pod.grace))).await;
        }
        // The group is gone: the pod's removal from the watch must not delete it again.
        self.advance(&uid, Trigger::GroupDeleted);
        let api: Api<Pod> = Api::namespaced(self.inner.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        for attempt in 0..8 {
            // A block of its own: the answer (a whole Pod) and the turn are dropped before the
            // back-off's wait, not kept in it.
            {
                let _turn = self.inner.shares.removals.acquire().await;
                self.inner.telemetry.kube_request("pod_delete");
                match Box::pin(api.delete(&pod.name, &params)).await {
                    Ok(_) => {
                        info!(eci_id = ?group, "pod deleted after its container group stopped");
                        return;
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                        return;
                    }
                    Err(error) => debug!(%error, attempt, "could not delete the pod; retrying"),
                }
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
        warn!("could not delete the pod; the next resync tries again");
        self.advance(&uid, Trigger::PodDeletionFailed);
    }

    /// Deletes the group of a pod being deleted as `plan` says; returns once ECI accepted a
    /// deletion and the group is gone or has outlived its grace period.
    async fn delete_group_for_pod(&self, id: &str, plan: GroupDeletion) {
        let wait = match plan {
            GroupDeletion::Immediate => {
                self.delete_group_until_accepted(id, true, Waiting::PodTerminating)
                    .await;
                return;
            }
            GroupDeletion::Graceful { wait } => wait,
        };
        Box::pin(self.delete_group_until_accepted(id, false, Waiting::PodTerminating)).await;
        let (gone, until_gone) = tokio::sync::oneshot::channel();
        self.inner
            .awaiting_removal
            .lock()
            .entry(id.to_owned())
            .or_default()
            .push(gone);
        if tokio::time::timeout(wait, until_gone).await.is_ok() {
            return;
        }
        // Past its grace period: stop it now, unless it went meanwhile (a failed read counts
        // as still there).
        if !matches!(
            Box::pin(self.describe_group(id, super::describe::Lookup::Existence)).await,
            Ok(None)
        ) {
            Box::pin(self.delete_group_until_accepted(id, true, Waiting::PodTerminating)).await;
        }
    }

    /// Deletes group `id`, again and again until ECI accepts (or says it is gone already).
    /// For a pod being deleted, the pod stays (Terminating) meanwhile rather than be removed
    /// from under a group that would then run on with nobody to delete it (the orphan
    /// collector leaves the groups of live nodes alone). A stop abandons it; the successor
    /// finds the pod still Terminating (or, for a removed pod, adopts the group and finds its
    /// pod gone) and starts over.
    pub(super) async fn delete_group_until_accepted(
        &self,
        id: &str,
        force: bool,
        waiting: Waiting,
    ) {
        let mut round = 0;
        while !Box::pin(self.delete_group(id, force)).await {
            round += 1;
            match waiting {
                Waiting::PodTerminating => {
                    warn!(eci_id = %id, round, "could not delete the container group; the pod stays until it is gone, trying again");
                }
                Waiting::PastDeadline => {
                    warn!(eci_id = %id, round, "could not delete the container group of a pod past its active deadline; trying again");
                }
                Waiting::PodRemoved => {
                    warn!(eci_id = %id, round, "the container group of a removed pod is not deleted yet; trying again");
                }
            }
            tokio::time::sleep(backoff(round + 3)).await;
        }
    }

    /// Tells deletions when their groups are gone: one DescribeContainerGroups per 20 groups
    /// per interval, however many pods are being deleted (the reads go through
    /// [`Self::describe_groups`], shared with the other lookups of the moment).
    pub(super) async fn watch_removals(self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut ticks = tokio::time::interval(
            self.inner
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
                let mut waiting = self.inner.awaiting_removal.lock();
                // Waiters that gave up (grace period over) are dropped.
                waiting.retain(|_, senders| {
                    senders.retain(|s| !s.is_closed());
                    !senders.is_empty()
                });
                waiting.keys().cloned().collect()
            };
            // Shared with the other lookups of the moment, 20 ids per call; a failed read
            // counts as still there.
            let reads = self
                .describe_groups(&ids, super::describe::Lookup::Existence)
                .await;
            let mut waiting = self.inner.awaiting_removal.lock();
            for (id, read) in reads {
                if matches!(read, Ok(None)) {
                    for sender in waiting.remove(&id).into_iter().flatten() {
                        let _ = sender.send(());
                    }
                }
            }
        }
    }

    /// Deletes group `id` (retrying what ECI may answer later, up to eight times): whether ECI
    /// accepted the deletion or knows no such group.
    pub(super) async fn delete_group(&self, id: &str, force: bool) -> bool {
        let deleted = (|| {
            self.inner
                .backend
                .delete_container_group(DeleteContainerGroupRequest {
                    region_id: self.inner.config.region.clone(),
                    container_group_id: id.to_owned(),
                    force,
                    ..DeleteContainerGroupRequest::default()
                })
        })
        .retry(retry_delays().with_max_times(8))
        .when(EciError::is_retryable)
        .await;
        match deleted {
            Ok(_) => true,
            Err(error) if error.is_not_found() => true,
            Err(error) => {
                warn!(eci_id = %id, %error, "could not delete the container group");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tracing::Instrument as _;

    use super::{GroupDeletion, REMOVAL_SLACK};

    /// A scale-in has every deleted pod's deletion waiting for its group at once: what each
    /// holds then is bounded, the pod's names rather than the watched pod, the calls' futures
    /// boxed (unboxed, they would sit in it across the wait, beside the pod's copy).
    #[tokio::test]
    async fn a_deletion_waiting_for_its_group_holds_a_few_hundred_bytes() {
        let (controller, _) = super::super::tests::controller(std::sync::Arc::default());
        let target = super::DeletionTarget::of(&super::super::tests::terminating_pod());
        assert_eq!(
            (
                target.namespace.as_str(),
                target.name.as_str(),
                target.grace
            ),
            ("default", "web-0", 1)
        );
        let deletion = controller
            .delete(target, "u-1".into(), Some("eci-1".into()))
            .instrument(tracing::info_span!("reconcile"));
        let bytes = std::mem::size_of_val(&deletion);
        assert!(
            bytes <= super::DELETION_BYTES,
            "a waiting deletion holds {bytes} bytes"
        );
    }

    /// The part of a deletion that is alive while it waits out the grace period for its group
    /// to go (boxed by the deletion): as small as the deletion itself.
    #[tokio::test]
    async fn the_wait_for_a_group_to_go_holds_a_few_hundred_bytes() {
        let (controller, _) = super::super::tests::controller(std::sync::Arc::default());
        let plan = GroupDeletion::for_grace(30);
        let waiting = controller.delete_group_for_pod("eci-1", plan);
        let bytes = std::mem::size_of_val(&waiting);
        assert!(
            bytes <= super::DELETION_BYTES,
            "the wait holds {bytes} bytes"
        );
    }

    #[test]
    fn one_graceful_delete_unless_no_grace_is_left() {
        let graceful = |seconds| GroupDeletion::Graceful {
            wait: Duration::from_secs(seconds) + REMOVAL_SLACK,
        };
        for (grace, plan) in [
            (0, GroupDeletion::Immediate),
            (-1, GroupDeletion::Immediate),
            (1, graceful(1)),
            (30, graceful(30)),
            (i64::MAX, graceful(u64::try_from(i64::MAX).unwrap())),
        ] {
            assert_eq!(GroupDeletion::for_grace(grace), plan, "grace {grace}");
        }
    }
}
