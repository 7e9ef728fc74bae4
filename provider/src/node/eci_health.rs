//! ECI reachability, from the outcomes of periodic cheap calls: the node stays Ready through
//! short blips and turns NotReady only after ECI has failed for longer than a threshold.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// What the node should say about ECI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EciHealth {
    /// No probe has finished yet.
    Unknown,
    /// The last probe succeeded, or failures are younger than the threshold.
    Reachable,
    /// Every probe for longer than the threshold failed.
    Unreachable {
        /// When the failures started (wall clock, for the condition message).
        since: SystemTime,
        /// The latest failure.
        error: String,
    },
}

/// Tracks probe outcomes.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    threshold: Duration,
    probed: bool,
    failing_since: Option<(Instant, SystemTime)>,
    last_error: String,
}

impl HealthTracker {
    /// A tracker that reports Unreachable after `threshold` of uninterrupted failures.
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold,
            probed: false,
            failing_since: None,
            last_error: String::new(),
        }
    }

    /// A probe succeeded.
    pub fn record_success(&mut self) {
        self.probed = true;
        self.failing_since = None;
        self.last_error.clear();
    }

    /// A probe failed at `now` (`wall` is the same moment on the wall clock).
    pub fn record_failure(&mut self, now: Instant, wall: SystemTime, error: impl Into<String>) {
        self.probed = true;
        self.failing_since.get_or_insert((now, wall));
        self.last_error = error.into();
    }

    /// The health at `now`.
    pub fn health(&self, now: Instant) -> EciHealth {
        match self.failing_since {
            _ if !self.probed => EciHealth::Unknown,
            Some((since, wall)) if now.duration_since(since) >= self.threshold => {
                EciHealth::Unreachable {
                    since: wall,
                    error: self.last_error.clone(),
                }
            }
            _ => EciHealth::Reachable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn short_blips_keep_the_node_ready_long_outages_do_not() {
        let mut tracker = HealthTracker::new(Duration::from_secs(30));
        let start = Instant::now();
        assert_eq!(tracker.health(start), EciHealth::Unknown);
        tracker.record_success();
        assert_eq!(tracker.health(start), EciHealth::Reachable);

        tracker.record_failure(Instant::now(), SystemTime::UNIX_EPOCH, "connection refused");
        tokio::time::advance(Duration::from_secs(20)).await;
        tracker.record_failure(Instant::now(), SystemTime::now(), "connection refused");
        assert_eq!(
            tracker.health(Instant::now()),
            EciHealth::Reachable,
            "20 s of failures is a blip"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        tracker.record_failure(Instant::now(), SystemTime::now(), "deadline exceeded");
        match tracker.health(Instant::now()) {
            EciHealth::Unreachable { since, error } => {
                assert_eq!(
                    since,
                    SystemTime::UNIX_EPOCH,
                    "the outage started at the first failure"
                );
                assert_eq!(error, "deadline exceeded");
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        tracker.record_success();
        assert_eq!(
            tracker.health(Instant::now()),
            EciHealth::Reachable,
            "one success recovers"
        );
    }
}
