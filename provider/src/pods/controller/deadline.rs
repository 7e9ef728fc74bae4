//! A pod's `activeDeadlineSeconds`, enforced as the kubelet enforces it
//! (`pkg/kubelet/active_deadline.go`): measured from the pod's `status.startTime`, passed once
//! the time since is at least the deadline; the pod then fails with reason
//! [`from_eci::DEADLINE_EXCEEDED`] and its message, and a Normal Event says so.
//!
//! ECI takes `ActiveDeadlineSeconds` only at CreateContainerGroup (UpdateContainerGroup has
//! no such parameter: proto/sdk/names.tsv), and ends the group itself when it passes. A
//! deadline set or lowered later is this module's: [`due_at`] is the deadline plus
//! [`ECI_FIRST`], so that where ECI enforces, its own ending (which keeps the group, and so the
//! logs) reaches the pod first, and the controller acts only on a pod that still runs.
//!
//! [`Deadlines`] wakes the controller for each pod when its deadline falls due: one timer
//! queue for all pods, fed by the controller's steps.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::info;

use super::delete::{Deletion, DeletionKey};
use super::lifecycle::{Effect, Trigger};
use super::status_sync::Written;
use super::{PodController, PodEntry, pod_key};
use crate::pods::from_eci::{self, DEADLINE_EXCEEDED, DEADLINE_MESSAGE};

/// How long after a deadline ECI is given to end the group itself (it was created with that
/// deadline), and the status sync to show it, before the controller stops the group: ten
/// status polls at the default interval, room for a loaded apiserver's slower writes.
pub(super) const ECI_FIRST: Duration = Duration::from_secs(10);

/// When the controller is to stop `pod` for its deadline: `None` without a deadline, before
/// the pod started (no `startTime`: its group does not exist yet) and once it finished.
pub(super) fn due_at(pod: &Pod) -> Option<SystemTime> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let started: SystemTime = status.start_time.as_ref()?.0.into();
    // The apiserver takes 1 to 2^31-1 seconds (68 years); a negative one is never due, and
    // neither is one past what a time can hold.
    let allowed = Duration::from_secs(u64::try_from(seconds).ok()?);
    started.checked_add(allowed)?.checked_add(ECI_FIRST)
}

/// The longest a timer waits: the timer queue refuses (panics on) times more than about two
/// years ahead, and the apiserver allows deadlines of 68 years. A pod woken before its
/// deadline gets its timer again from its step.
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// One timer per pod (by UID) waking the controller at its deadline (or after
/// [`LONGEST_WAIT`], whichever comes first). Setting a pod's timer again moves it; forgetting a
/// pod drops it.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    timers: Mutex<Timers>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Timers {
    queue: DelayQueue<String>,
    by_pod: HashMap<String, (delay_queue::Key, SystemTime)>,
}

impl Deadlines {
    fn timers(&self) -> MutexGuard<'_, Timers> {
        self.timers.lock()
    }

    /// Wakes the controller for pod `uid` at `at` (at once if `at` is past).
    pub(super) fn set(&self, uid: &str, at: SystemTime) {
        let wait = at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
            .min(LONGEST_WAIT);
        let when = Instant::now() + wait;
        let mut timers = self.timers();
        let Timers { queue, by_pod } = &mut *timers;
        match by_pod.get_mut(uid) {
            Some((_, set)) if *set == at => return,
            Some((key, set)) => {
                queue.reset_at(key, when);
                *set = at;
            }
            None => {
                let key = queue.insert_at(uid.to_owned(), when);
                by_pod.insert(uid.to_owned(), (key, at));
            }
        }
        drop(timers);
        self.changed.notify_one();
    }

    /// Drops pod `uid`'s timer, if it has one.
    pub(super) fn forget(&self, uid: &str) {
        let mut timers = self.timers();
        let Timers { queue, by_pod } = &mut *timers;
        if let Some((key, _)) = by_pod.remove(uid) {
            queue.remove(&key);
        }
    }

    /// Pods with a timer.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.timers().by_pod.len()
    }

    /// Hands each pod whose timer fell due to `due`, until `stop`.
    pub(super) async fn run(&self, stop: CancellationToken, due: impl Fn(String)) {
        loop {
            let expired = poll_fn(|cx| {
                let mut timers = self.timers();
                match timers.queue.poll_expired(cx) {
                    Poll::Ready(Some(expired)) => {
                        let uid = expired.into_inner();
                        timers.by_pod.remove(&uid);
                        Poll::Ready(uid)
                    }
                    // An empty queue ends its stream; a new timer notifies `changed`.
                    Poll::Ready(None) | Poll::Pending => Poll::Pending,
                }
            });
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.changed.notified() => {}
                uid = expired => due(uid),
            }
        }
    }
}

/// How soon a pod whose deadline passed is looked at again when its step had other work to do
/// first, or the failure's write did not land.
const AGAIN: Duration = Duration::from_secs(2);

impl PodController {
    /// After a pod's step: a running pod past its deadline is stopped, one before it gets a
    /// timer (while the step has other work, the deadline waits for the next).
    pub(super) fn mind_deadline(
        &self,
        entry: &mut PodEntry,
        uid: &str,
        pod: &Pod,
        effect: Option<Effect>,
    ) -> Option<Effect> {
        if pod.metadata.deletion_timestamp.is_some() {
            return effect;
        }
        let Some(due) = due_at(pod) else {
            return effect;
        };
        let now = SystemTime::now();
        match effect {
            None | Some(Effect::Nothing) if due <= now => entry.on(uid, Trigger::DeadlinePassed),
            effect => {
                let wake = if due > now { due } else { now + AGAIN };
                self.inner.deadlines.set(uid, wake);
                effect
            }
        }
    }

    /// Fails `pod` for its deadline, as the kubelet does (phase Failed,
    /// [`from_eci::DEADLINE_EXCEEDED`], a Normal Event), then queues the graceful deletion of
    /// `group` (its containers get their grace period and preStop hooks), tried until ECI
    /// accepts. A failed write is tried again by the pod's next step.
    pub(super) async fn stop_at_deadline(self, pod: Arc<Pod>, uid: String, group: Option<String>) {
        let now = SystemTime::now();
        let written = self
            .write_held(&pod, |current| {
                due_at(current)
                    .map(|_| from_eci::stopped(current, DEADLINE_EXCEEDED, DEADLINE_MESSAGE, now))
            })
            .await;
        match written {
            Written::Stored(_) => {
                info!(pod = %pod_key(&pod), eci_id = ?group, "the pod passed its active deadline; stopping its container group");
                self.event(&pod, EventType::Normal, DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
                    .await;
            }
            Written::Failed => self.inner.deadlines.set(&uid, now + AGAIN),
            Written::Unneeded => {}
        }
        if let Some(id) = group {
            let deletion = Deletion::past_deadline(id);
            self.inner.deletions.push(DeletionKey::Pod(uid), deletion);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(deadline: Option<i64>, started: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "job-1", "uid": "u-1"},
            "spec": {"containers": [{"name": "c"}], "activeDeadlineSeconds": deadline},
            "status": {"phase": phase, "startTime": started},
        }))
        .expect("a pod")
    }

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).expect("a time")
    }

    #[test]
    fn a_deadline_falls_due_from_the_start_time_once_eci_had_its_turn() {
        let started = "2026-11-29T10:00:00Z";
        let cases = [
            // (deadline, startTime, phase, due)
            (
                Some(30),
                Some(started),
                "Running",
                Some("2026-11-29T10:00:40Z"),
            ),
            (
                Some(30),
                Some(started),
                "Pending",
                Some("2026-11-29T10:00:40Z"),
            ),
            (
                Some(1),
                Some(started),
                "Running",
                Some("2026-11-29T10:00:11Z"),
            ),
            // No deadline, or not started yet: nothing to enforce.
            (None, Some(started), "Running", None),
            (Some(30), None, "Pending", None),
            // Finished: never again.
            (Some(30), Some(started), "Succeeded", None),
            (Some(30), Some(started), "Failed", None),
            // The longest the apiserver takes: due in 68 years, no overflow.
            (
                Some(i64::from(i32::MAX)),
                Some(started),
                "Running",
                Some("2094-12-17T13:14:17Z"),
            ),
            // Not a deadline the apiserver takes.
            (Some(-5), Some(started), "Running", None),
            (Some(i64::MAX), Some(started), "Running", None),
        ];
        for (deadline, start, phase, expected) in cases {
            assert_eq!(
                due_at(&pod(deadline, start, phase)),
                expected.map(at),
                "deadline {deadline:?}, started {start:?}, {phase}"
            );
        }
    }

    async fn next_due(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a timer falls due")
            .expect("the timers run")
    }

    #[tokio::test]
    async fn timers_fall_due_in_order_move_when_set_again_and_go_when_forgotten() {
        let deadlines = Arc::new(Deadlines::default());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let running = {
            let (deadlines, stop) = (Arc::clone(&deadlines), stop.clone());
            tokio::spawn(async move {
                deadlines
                    .run(stop, |uid| tx.send(uid).expect("the test listens"))
                    .await;
            })
        };
        let now = SystemTime::now();
        deadlines.set("later", now + Duration::from_millis(400));
        deadlines.set("forgotten", now + Duration::from_millis(100));
        deadlines.set("moved", now + Duration::from_secs(3600));
        deadlines.set("moved", now + Duration::from_millis(200));
        deadlines.set("past", now - Duration::from_secs(5));
        deadlines.forget("forgotten");
        // Past what the queue itself could wait for: held, woken within a day.
        deadlines.set(
            "in 68 years",
            now + Duration::from_secs(u64::from(u32::MAX / 2)),
        );
        assert_eq!(deadlines.len(), 4);
        assert_eq!(next_due(&mut rx).await, "past");
        assert_eq!(next_due(&mut rx).await, "moved");
        assert_eq!(next_due(&mut rx).await, "later");
        assert_eq!(deadlines.len(), 1, "a timer that fell due is gone");
        deadlines.forget("in 68 years");
        // Emptied, the queue still takes new timers.
        deadlines.set("again", SystemTime::now());
        assert_eq!(next_due(&mut rx).await, "again");
        stop.cancel();
        running.await.expect("the timers stop");
        assert!(rx.try_recv().is_err(), "nothing else fell due");
    }
}
