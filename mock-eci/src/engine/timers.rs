//! The engine's agenda: future state transitions, ordered by time.
//!
//! Transitions are not driven by background tasks: every API call first applies all
//! transitions due by "now", each at its own scheduled time. That keeps the mock deterministic
//! (paused-time tests see exact times), cheap (no task per group) and persistable (the agenda is
//! plain data saved with the groups).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// What happens when a timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimerKind {
    /// Pending → Scheduling: capacity and an IP address are claimed.
    BeginScheduling,
    /// Scheduling → the first init container (or the containers) start.
    Provisioned,
    /// A container's run `run` exits as its behaviour planned.
    Exit {
        /// Init container or regular container.
        init: bool,
        /// Index in its list.
        index: usize,
        /// The run (restart count) the exit belongs to.
        run: u32,
    },
    /// A back-off ended: the container starts its next run.
    Restart {
        /// Init container or regular container.
        init: bool,
        /// Index in its list.
        index: usize,
        /// The run that ended.
        run: u32,
    },
    /// A running container becomes ready.
    Ready {
        /// Index among the regular containers.
        index: usize,
        /// The run it belongs to.
        run: u32,
    },
    /// `ErrImagePull` turns into `ImagePullBackOff`.
    PullBackOff {
        /// Init container or regular container.
        init: bool,
        /// Index in its list.
        index: usize,
    },
    /// `ActiveDeadlineSeconds` passed.
    Deadline,
    /// RestartContainerGroup finished.
    RestartDone,
    /// UpdateContainerGroup finished.
    UpdateDone,
    /// UpdateContainerGroup finished rewriting `ConfigFileVolume` files in place.
    FilesRewritten,
    /// The grace period of a deletion ended: the group disappears.
    TerminationDone,
    /// The retention of a finished group ended: the group disappears.
    Retire,
}

/// One scheduled transition of one group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timer {
    /// When it fires.
    pub at: Millis,
    /// Tie-breaker: the order timers were set.
    pub seq: u64,
    /// The group.
    pub group: String,
    /// The group's epoch when set; a timer from an older epoch is stale and ignored.
    pub epoch: u32,
    /// What happens.
    pub kind: TimerKind,
}

/// The agenda.
#[derive(Debug, Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<Timer>>,
    seq: u64,
}

impl Timers {
    /// Schedules `kind` for `group` at `at`.
    pub fn set(&mut self, at: Millis, group: &str, epoch: u32, kind: TimerKind) {
        self.seq += 1;
        self.heap.push(Reverse(Timer {
            at,
            seq: self.seq,
            group: group.to_owned(),
            epoch,
            kind,
        }));
    }

    /// Removes and returns the earliest timer due at or before `now`.
    pub fn pop_due(&mut self, now: Millis) -> Option<Timer> {
        if self
            .heap
            .peek()
            .is_some_and(|Reverse(timer)| timer.at <= now)
        {
            self.heap.pop().map(|Reverse(timer)| timer)
        } else {
            None
        }
    }

    /// Every pending timer, for persistence.
    pub fn to_vec(&self) -> Vec<Timer> {
        let mut timers: Vec<Timer> = self
            .heap
            .iter()
            .map(|Reverse(timer)| timer.clone())
            .collect();
        timers.sort();
        timers
    }

    /// An agenda holding `timers`.
    pub fn from_vec(timers: Vec<Timer>) -> Self {
        let seq = timers.iter().map(|timer| timer.seq).max().unwrap_or(0);
        Self {
            heap: timers.into_iter().map(Reverse).collect(),
            seq,
        }
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No pending timers.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut timers = Timers::default();
        timers.set(20, "b", 0, TimerKind::Provisioned);
        timers.set(10, "a", 0, TimerKind::BeginScheduling);
        timers.set(20, "a", 0, TimerKind::Deadline);
        assert!(timers.pop_due(9).is_none());
        assert_eq!(timers.pop_due(30).unwrap().group, "a");
        let next = timers.pop_due(30).unwrap();
        assert_eq!(
            (next.group.as_str(), next.kind),
            ("b", TimerKind::Provisioned)
        );
        assert_eq!(timers.pop_due(30).unwrap().kind, TimerKind::Deadline);
        assert!(timers.is_empty());
    }

    #[test]
    fn round_trips_through_a_vec() {
        let mut timers = Timers::default();
        timers.set(5, "a", 1, TimerKind::Retire);
        let mut restored = Timers::from_vec(timers.to_vec());
        restored.set(5, "b", 0, TimerKind::Retire);
        assert_eq!(restored.pop_due(5).unwrap().group, "a");
        assert_eq!(restored.len(), 1);
    }
}
