//! Deleting: graceful group deletion, batched waits for removal, pod removal, pods that went
//! while nobody watched.
//!
//! Every deletion is data ([`Deletion`], keyed by [`DeletionKey`]) in the queue of its next
//! step — ECI calls in one, pod removals in another served within the removal share: a
//! worker tries the step, and [`Deletion::after`] (pure, table-tested) says where it goes — the
//! next step at once, the same step after a back-off (a timer in the queue), or the removal
//! watch while the group's grace period runs. Nothing waits in a task of its own.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use eci_proto::v20180808::DeleteContainerGroupRequest;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Adopted, PodController, backoff, pod_key, pod_key_parts, slim};
use crate::pods::workqueue::WorkQueue;
use vne_core::lifecycle::{Lifecycle, Trigger};

/// Reads in flight at most when confirming that unlisted pods are gone.
const CONFIRMING: usize = 8;
/// How long past a pod's grace period its group may take to disappear before it is deleted
/// again by force: ECI ends the group itself when the grace period it was created with runs
/// out, and the removal watcher sees that within a poll or two.
const REMOVAL_SLACK: Duration = Duration::from_secs(2);

/// Group deletion workers: each turn is one ECI call. Waits (a grace period, a retry's
/// back-off) are held as data, not workers.
const DELETERS: usize = 32;
/// Pod removal workers: each turn is one apiserver delete, taken within the removal share
/// (a worker takes its permit before its pod, so none holds a pod while the share is full).
const REMOVERS: usize = 32;
/// Groups the removal watch reads at once: the answers describe whole groups, and a scale-in
/// has every deleted pod's group waiting at once (the reads are one call per 20 ids either
/// way).
const REMOVAL_READS_AT_ONCE: usize = 200;
/// Failed pod removals in a row before the pod is left to its next resync.
const POD_REMOVAL_TRIES: u32 = 8;
/// Failed group deletions in a row before each further one is logged as a warning (an outage
/// would otherwise log a line per pod per retry).
const QUIET_GROUP_FAILURES: u32 = 8;

/// What a deletion is keyed by in the deletion queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum DeletionKey {
    /// A pod of this node, by UID: its group, if any, then (for a pod being deleted) the pod.
    Pod(String),
    /// A group whose pod is gone, by group id.
    Group(String),
}

/// Why a group is deleted, which says what follows once ECI accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Purpose {
    /// The pod is being deleted: its grace period is honoured, then the pod is removed
    /// (grace 0, UID precondition). It stays Terminating until its group is gone, rather than
    /// be removed from under a group that would run on with nobody to delete it (the orphan
    /// collector leaves the groups of live nodes alone).
    PodDeleted(DeletionTarget),
    /// The pod failed at its active deadline and stays: only its group goes, gracefully.
    PastDeadline,
    /// The pod is gone already: only its group is left, deleted by force.
    PodRemoved,
}

/// The next call a deletion makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Ask ECI to delete the group: gracefully (ECI honours the grace period the group was
    /// created with, and removes it without a second call) or by force.
    DeleteGroup { force: bool },
    /// The group is gone, or there was none: remove the pod.
    RemovePod,
}

/// A deletion in progress, held as data in the deletion queue (or, while its group's graceful
/// deletion runs, in the removal watch): a scale-in has every deleted pod's deletion waiting at
/// once, so each is a few names, not a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Deletion {
    purpose: Purpose,
    /// The group to delete (`None`: the pod had none).
    group: Option<String>,
    step: Step,
    /// Failed tries of this step in a row (each retry waits longer).
    failures: u32,
}

/// Where a deletion goes once its step was tried (see [`Deletion::after`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// Try the same step again after the back-off of its `n`th failure in a row (from 0;
    /// [`backoff`], jittered).
    Retry(u32),
    /// Go on to this step at once.
    Go(Step),
    /// The graceful deletion was accepted: wait this long (the grace period plus
    /// [`REMOVAL_SLACK`]) for the group to go; past it, delete it by force.
    AwaitGone(Duration),
    /// Nothing is left to do.
    Done,
    /// The pod could not be removed: its next resync tries again.
    GiveUp,
}

impl Deletion {
    /// A pod's deletion, from its deletion grace period: with no grace left, one forced delete;
    /// otherwise one graceful delete, forced only if the group outlives its grace period.
    /// Deletions share an account-wide quota (1,000 a minute per region), so one wasted call
    /// per pod would halve the speed of every scale-in.
    pub(super) fn of_pod(target: DeletionTarget, group: Option<String>) -> Self {
        let step = match group {
            Some(_) => Step::DeleteGroup {
                force: target.grace <= 0,
            },
            None => Step::RemovePod,
        };
        Self::new(Purpose::PodDeleted(target), group, step)
    }

    /// The group of a pod that passed its active deadline (the pod stays).
    pub(super) fn past_deadline(group: String) -> Self {
        Self::new(
            Purpose::PastDeadline,
            Some(group),
            Step::DeleteGroup { force: false },
        )
    }

    /// The group of a pod that is gone.
    pub(super) fn of_removed_pod(group: String) -> Self {
        Self::new(
            Purpose::PodRemoved,
            Some(group),
            Step::DeleteGroup { force: true },
        )
    }

    fn new(purpose: Purpose, group: Option<String>, step: Step) -> Self {
        Self {
            purpose,
            group,
            step,
            failures: 0,
        }
    }

    /// Where the deletion goes after its step succeeded (ECI accepted the group's deletion or
    /// knows no such group; the pod was removed or is gone) or failed. Pure.
    pub(super) fn after(&self, succeeded: bool) -> Next {
        match (self.step, succeeded, &self.purpose) {
            (Step::DeleteGroup { .. }, false, _) => Next::Retry(self.failures),
            (Step::DeleteGroup { force: false }, true, Purpose::PodDeleted(target)) => {
                let grace = Duration::from_secs(u64::try_from(target.grace).unwrap_or(0));
                Next::AwaitGone(grace.saturating_add(REMOVAL_SLACK))
            }
            (Step::DeleteGroup { .. }, true, Purpose::PodDeleted(_)) => Next::Go(Step::RemovePod),
            (Step::DeleteGroup { .. }, true, _) | (Step::RemovePod, true, _) => Next::Done,
            (Step::RemovePod, false, _) if self.failures + 1 < POD_REMOVAL_TRIES => {
                Next::Retry(self.failures)
            }
            (Step::RemovePod, false, _) => Next::GiveUp,
        }
    }

    /// The deletion with its step tried again (`retry`) or moved on to `step`.
    fn then(mut self, step: Step) -> Self {
        self.failures = if self.step == step {
            self.failures + 1
        } else {
            0
        };
        self.step = step;
        self
    }

    /// Whether the group is known gone once the deletion goes on as `next` (the pod's
    /// lifecycle is told, so that its removal does not delete the group again).
    fn group_gone(&self, next: &Next) -> bool {
        self.group.is_some()
            && matches!(self.step, Step::DeleteGroup { .. })
            && match next {
                Next::Go(Step::RemovePod) => true,
                Next::Done => self.purpose == Purpose::PastDeadline,
                _ => false,
            }
    }
}

/// A deletion whose group's graceful deletion ECI accepted, waiting in the removal watch for
/// the group to go.
#[derive(Debug)]
pub(super) struct AwaitingGone {
    key: DeletionKey,
    deletion: Deletion,
    /// Past this, the group is deleted by force.
    until: tokio::time::Instant,
}

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
            self.inner.metrics.pods_deleted_during_watch_gap.inc();
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
        self.inner.syncs.forget(&uid);
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

    /// Deletes group `id` (force), again and again until ECI confirms it gone, for a group
    /// whose pod is gone already: nothing else would ever delete it while this replica runs
    /// (the orphan collector leaves the groups of live nodes alone). A stop drops it; the
    /// successor adopts the group and, finding its pod gone, deletes it.
    pub(super) fn delete_group_eventually(&self, id: String) {
        let deletion = Deletion::of_removed_pod(id.clone());
        self.queue_deletion(DeletionKey::Group(id), deletion);
    }

    /// Deletion workers, until `stop`: one step of one deletion per turn; what it leads to is
    /// queued again (at once, after a back-off, or once the group is gone). A stop drops what
    /// waits: the successor finds the pods still Terminating (or adopts the groups of removed
    /// pods and finds them gone) and starts over.
    pub(super) async fn delete_all(self, stop: CancellationToken) -> anyhow::Result<()> {
        let step = |this: &Self| {
            let this = this.clone();
            move |key, deletion| {
                let this = this.clone();
                async move { this.take_step(key, deletion).await }
            }
        };
        let removals = self.inner.pod_removals.serve_within(
            REMOVERS,
            self.inner.shares.removals.permits(),
            &stop,
            step(&self),
        );
        let deletions = self.inner.deletions.serve(DELETERS, &stop, step(&self));
        tokio::join!(removals, deletions);
        Ok(())
    }

    /// Queues `deletion` where its next step is taken: a group's deletion (an ECI call) in
    /// the deletion queue, a pod's removal (an apiserver write) in the removal queue. A pod's
    /// deletion is in one of them at a time, as it moves from step to step.
    pub(super) fn queue_deletion(&self, key: DeletionKey, deletion: Deletion) {
        self.queue_for(deletion.step).push(key, deletion);
    }

    fn queue_for(&self, step: Step) -> &WorkQueue<DeletionKey, Deletion> {
        match step {
            Step::DeleteGroup { .. } => &self.inner.deletions,
            Step::RemovePod => &self.inner.pod_removals,
        }
    }

    /// Tries `deletion`'s step and carries on as [`Deletion::after`] says.
    async fn take_step(&self, key: DeletionKey, deletion: Deletion) {
        let succeeded = match (deletion.step, &deletion.group, &deletion.purpose) {
            (Step::DeleteGroup { force }, Some(id), _) => {
                Box::pin(self.delete_group(id, force, &deletion)).await
            }
            (Step::RemovePod, _, Purpose::PodDeleted(target)) => {
                Box::pin(self.remove_pod(&key, target)).await
            }
            // Nothing to delete: done.
            _ => true,
        };
        self.carry_on(key, deletion, succeeded);
    }

    /// Moves `deletion` on from its step's outcome.
    fn carry_on(&self, key: DeletionKey, deletion: Deletion, succeeded: bool) {
        let next = deletion.after(succeeded);
        if let (DeletionKey::Pod(uid), true) = (&key, deletion.group_gone(&next)) {
            self.advance(uid, Trigger::GroupDeleted);
        }
        match next {
            Next::Retry(failures) => {
                let step = deletion.step;
                let queue = self.queue_for(step);
                queue.push_after(key, deletion.then(step), backoff(failures));
            }
            Next::Go(step) => self.queue_deletion(key, deletion.then(step)),
            Next::AwaitGone(wait) => {
                let Some(id) = deletion.group.clone() else {
                    return;
                };
                let until = tokio::time::Instant::now() + wait;
                let awaiting = AwaitingGone {
                    key,
                    deletion,
                    until,
                };
                self.inner.awaiting_removal.lock().insert(id, awaiting);
            }
            Next::Done => {}
            Next::GiveUp => {
                if let DeletionKey::Pod(uid) = &key {
                    warn!(pod_uid = %uid, "could not delete the pod; the next resync tries again");
                    self.advance(uid, Trigger::PodDeletionFailed);
                }
            }
        }
    }

    /// Removes the pod (grace 0, with its UID as precondition; its worker holds a permit of
    /// this replica's share of removals): whether it is removed or gone.
    async fn remove_pod(&self, key: &DeletionKey, target: &DeletionTarget) -> bool {
        let DeletionKey::Pod(uid) = key else {
            return true;
        };
        let api: Api<Pod> = Api::namespaced(self.inner.client.clone(), &target.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.inner.telemetry.kube_request("pod_delete");
        match api.delete(&target.name, &params).await {
            Ok(_) => {
                info!(pod = %format!("{}/{}", target.namespace, target.name), "pod deleted after its container group stopped");
                true
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => true,
            Err(error) => {
                debug!(%error, pod = %format!("{}/{}", target.namespace, target.name), "could not delete the pod; retrying");
                false
            }
        }
    }

    /// Tells deletions waiting for their groups to go ([`AwaitingGone`]) when they are gone, or
    /// past their grace period: one DescribeContainerGroups per 20 groups per interval, however
    /// many pods are being deleted (the reads go through [`Self::describe_groups`], shared with
    /// the other lookups of the moment; a failed read counts as still there).
    pub(super) async fn watch_removals(self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut ticks = tokio::time::interval(
            self.inner
                .config
                .args
                .pod_status_poll_interval
                .min(Duration::from_millis(500)),
        );
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let ids: Vec<String> = self.inner.awaiting_removal.lock().keys().cloned().collect();
            for chunk in ids.chunks(REMOVAL_READS_AT_ONCE) {
                if stop.is_cancelled() {
                    return Ok(());
                }
                self.settle_removals(chunk).await;
            }
        }
    }

    /// Reads the groups `ids` of [`AwaitingGone`] deletions, and moves on those gone or past
    /// their grace period.
    async fn settle_removals(&self, ids: &[String]) {
        let reads = self
            .describe_groups(ids, super::describe::Lookup::Existence)
            .await;
        let now = tokio::time::Instant::now();
        for (id, read) in reads {
            let gone = matches!(read, Ok(None));
            let awaiting = {
                let mut waiting = self.inner.awaiting_removal.lock();
                match waiting.get(&id) {
                    Some(awaiting) if gone || now >= awaiting.until => waiting.remove(&id),
                    _ => None,
                }
            };
            if let Some(AwaitingGone { key, deletion, .. }) = awaiting {
                let step = if gone {
                    Step::RemovePod
                } else {
                    Step::DeleteGroup { force: true }
                };
                if let (DeletionKey::Pod(uid), true) = (&key, gone) {
                    self.advance(uid, Trigger::GroupDeleted);
                }
                self.queue_deletion(key, deletion.then(step));
            }
        }
    }

    /// Deletes group `id` (one call; the deletion queue retries): whether ECI accepted the
    /// deletion or knows no such group.
    async fn delete_group(&self, id: &str, force: bool, deletion: &Deletion) -> bool {
        let deleted = self
            .inner
            .backend
            .delete_container_group(DeleteContainerGroupRequest {
                region_id: self.inner.config.site.region.clone(),
                container_group_id: id.to_owned(),
                force,
                ..DeleteContainerGroupRequest::default()
            })
            .await;
        let error = match deleted {
            Ok(_) => return true,
            Err(error) if error.is_not_found() => return true,
            Err(error) => error,
        };
        let failures = deletion.failures + 1;
        let why = match deletion.purpose {
            Purpose::PodDeleted(_) => "the pod stays until its container group is gone",
            Purpose::PastDeadline => "the pod passed its active deadline",
            Purpose::PodRemoved => "the pod is removed already",
        };
        if failures >= QUIET_GROUP_FAILURES || !error.is_retryable() {
            warn!(eci_id = %id, %error, failures, "could not delete the container group ({why}); trying again");
        } else {
            debug!(eci_id = %id, %error, failures, "could not delete the container group; trying again");
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn target(grace: i64) -> DeletionTarget {
        DeletionTarget {
            namespace: "default".into(),
            name: "web-0".into(),
            grace,
        }
    }

    fn group_step(force: bool) -> Step {
        Step::DeleteGroup { force }
    }

    /// The spec of a deletion's steps: where each outcome leads, and when the pod's lifecycle
    /// learns that the group is gone.
    #[test]
    fn each_step_leads_on_as_its_outcome_says() {
        let pod = |grace| Deletion::of_pod(target(grace), Some("eci-1".into()));
        let removing = |failures| Deletion {
            failures,
            ..Deletion::of_pod(target(30), None)
        };
        let forced = pod(30).then(group_step(true));
        let cases = [
            // (case, deletion, succeeded, next, group known gone)
            (
                "graceful accepted",
                pod(30),
                true,
                Next::AwaitGone(Duration::from_secs(32)),
                false,
            ),
            (
                "no grace: forced, then the pod",
                pod(0),
                true,
                Next::Go(Step::RemovePod),
                true,
            ),
            (
                "negative grace reads as none",
                pod(-1),
                true,
                Next::Go(Step::RemovePod),
                true,
            ),
            ("refused: retried", pod(30), false, Next::Retry(0), false),
            (
                "outlived, forced",
                forced,
                true,
                Next::Go(Step::RemovePod),
                true,
            ),
            (
                "no group: the pod at once",
                Deletion::of_pod(target(30), None),
                true,
                Next::Done,
                false,
            ),
            (
                "pod removal failed",
                removing(0),
                false,
                Next::Retry(0),
                false,
            ),
            (
                "pod removal failed 7 times",
                removing(6),
                false,
                Next::Retry(6),
                false,
            ),
            (
                "pod removal failed 8 times",
                removing(7),
                false,
                Next::GiveUp,
                false,
            ),
            ("pod removed", removing(3), true, Next::Done, false),
            (
                "past deadline: graceful, no wait",
                Deletion::past_deadline("eci-1".into()),
                true,
                Next::Done,
                true,
            ),
            (
                "removed pod's group: forced",
                Deletion::of_removed_pod("eci-1".into()),
                true,
                Next::Done,
                false,
            ),
            (
                "removed pod's group refused",
                Deletion::of_removed_pod("eci-1".into()),
                false,
                Next::Retry(0),
                false,
            ),
        ];
        for (case, deletion, succeeded, next, gone) in cases {
            let found = deletion.after(succeeded);
            assert_eq!(found, next, "{case}");
            assert_eq!(deletion.group_gone(&found), gone, "{case}: group gone");
        }
        assert_eq!(
            pod(0).step,
            group_step(true),
            "no grace: forced from the start"
        );
        assert_eq!(pod(1).step, group_step(false));
        assert_eq!(Deletion::of_pod(target(1), None).step, Step::RemovePod);
        assert_eq!(
            Deletion::past_deadline("eci-1".into()).step,
            group_step(false)
        );
    }

    #[test]
    fn a_retry_counts_failures_and_a_new_step_starts_afresh() {
        let deletion = Deletion::of_removed_pod("eci-1".into());
        let retried = deletion.then(group_step(true)).then(group_step(true));
        assert_eq!(retried.failures, 2);
        assert_eq!(retried.after(false), Next::Retry(2));
        let moved = retried.then(Step::RemovePod);
        assert_eq!(moved.failures, 0);
    }

    /// A scale-in has every deleted pod's deletion waiting at once: each is a few names and
    /// a step held in a queue, not a task.
    #[test]
    fn a_waiting_deletion_is_a_few_names() {
        let bytes = std::mem::size_of::<AwaitingGone>();
        assert!(
            bytes <= 160,
            "a waiting deletion holds {bytes} bytes besides its names"
        );
    }
}
