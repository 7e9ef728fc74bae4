//! Container probes as the real runtime runs them: the schedule a probe asks for and the
//! state its results drive (the kubelet's rules, which ECI follows).
//!
//! Pure: the runtime driver runs each probe's action at the times [`ProbeTiming`] gives and
//! reports each outcome; [`ProbeState::after`] says what the outcomes amount to. ECI takes a
//! readiness and a liveness probe (`ReadinessProbe.*`, `LivenessProbe.*`); it has no startup
//! probe parameter (a client folds a startup probe into the liveness probe's delay).

use std::time::Duration;

use eci_proto::v20180808::Probe;
use serde::{Deserialize, Serialize};

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ProbeKind {
    /// Failing: the container is killed, and restarted as its restart policy says.
    Liveness,
    /// Passing: the container is ready.
    Readiness,
}

impl ProbeKind {
    /// The word ECI's (and the kubelet's) events use.
    pub fn word(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
        }
    }
}

/// One run of a probe's action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    Success,
    /// Failed, timed out or could not run: `message` says how.
    Failure {
        message: String,
    },
}

/// What a probe's results so far amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeState {
    /// Passing; `failures` failures in a row since (fewer than the failure threshold).
    Passing { failures: u32 },
    /// Failing; `successes` successes in a row since (fewer than the success threshold).
    Failing { successes: u32 },
}

impl ProbeState {
    /// Where a probe of this kind starts: a liveness probe counts as passing until it fails,
    /// a readiness probe as failing until it passes.
    pub fn initial(kind: ProbeKind) -> Self {
        match kind {
            ProbeKind::Liveness => Self::Passing { failures: 0 },
            ProbeKind::Readiness => Self::Failing { successes: 0 },
        }
    }

    pub fn is_passing(self) -> bool {
        matches!(self, Self::Passing { .. })
    }

    /// The state after one more outcome, under `timing`'s thresholds.
    pub fn after(self, passed: bool, timing: &ProbeTiming) -> Self {
        match (self, passed) {
            (Self::Passing { .. }, true) => Self::Passing { failures: 0 },
            (Self::Passing { failures }, false) if failures + 1 >= timing.failure_threshold => {
                Self::Failing { successes: 0 }
            }
            (Self::Passing { failures }, false) => Self::Passing {
                failures: failures + 1,
            },
            (Self::Failing { .. }, false) => Self::Failing { successes: 0 },
            (Self::Failing { successes }, true) if successes + 1 >= timing.success_threshold => {
                Self::Passing { failures: 0 }
            }
            (Self::Failing { successes }, true) => Self::Failing {
                successes: successes + 1,
            },
        }
    }
}

/// The probe states of one run of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probing {
    pub liveness: ProbeState,
    pub readiness: ProbeState,
}

impl Default for Probing {
    fn default() -> Self {
        Self {
            liveness: ProbeState::initial(ProbeKind::Liveness),
            readiness: ProbeState::initial(ProbeKind::Readiness),
        }
    }
}

impl Probing {
    pub fn get_mut(&mut self, kind: ProbeKind) -> &mut ProbeState {
        match kind {
            ProbeKind::Liveness => &mut self.liveness,
            ProbeKind::Readiness => &mut self.readiness,
        }
    }
}

/// When a probe runs and how its results count, from the request with the kubelet's
/// defaults for what is unset (0) and its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeTiming {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl ProbeTiming {
    /// Defaults: period 10 s, timeout 1 s, thresholds 1 (success) and 3 (failure). A
    /// liveness probe passes on one success whatever it asks (as the kubelet requires).
    pub fn of(kind: ProbeKind, probe: &Probe) -> Self {
        let seconds = |value: i32, default: u64| {
            Duration::from_secs(
                u64::try_from(value)
                    .ok()
                    .filter(|s| *s > 0)
                    .unwrap_or(default),
            )
        };
        let count = |value: i32, default: u32| {
            u32::try_from(value)
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or(default)
        };
        Self {
            initial_delay: seconds(probe.initial_delay_seconds, 0),
            period: seconds(probe.period_seconds, 10),
            timeout: seconds(probe.timeout_seconds, 1),
            success_threshold: match kind {
                ProbeKind::Liveness => 1,
                ProbeKind::Readiness => count(probe.success_threshold, 1),
            },
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(success_threshold: u32, failure_threshold: u32) -> ProbeTiming {
        ProbeTiming {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold,
            failure_threshold,
        }
    }

    /// The state after each outcome of `outcomes` ('+' passed, '-' failed), as 'P' or 'F'.
    fn walk(kind: ProbeKind, thresholds: (u32, u32), outcomes: &str) -> String {
        let timing = timing(thresholds.0, thresholds.1);
        let mut state = ProbeState::initial(kind);
        outcomes
            .chars()
            .map(|outcome| {
                state = state.after(outcome == '+', &timing);
                if state.is_passing() { 'P' } else { 'F' }
            })
            .collect()
    }

    #[test]
    fn outcomes_turn_into_states_by_the_thresholds() {
        use ProbeKind::{Liveness, Readiness};
        let cases = [
            // Liveness passes from the start and fails on the failure threshold in a row.
            (Liveness, (1, 3), "--+---", "PPPPPF"),
            (Liveness, (1, 1), "+-", "PF"),
            (Liveness, (1, 3), "---+", "PPFP"),
            // Readiness fails from the start and passes on the success threshold in a row.
            (Readiness, (1, 3), "+", "P"),
            (Readiness, (1, 3), "--", "FF"),
            (Readiness, (2, 3), "+-++", "FFFP"),
            (Readiness, (3, 1), "+++-+", "FFPFF"),
            (Readiness, (1, 2), "+-+--", "PPPPF"),
        ];
        for (kind, thresholds, outcomes, expected) in cases {
            assert_eq!(
                walk(kind, thresholds, outcomes),
                expected,
                "{kind:?} {thresholds:?} after {outcomes}"
            );
        }
    }

    #[test]
    fn unset_fields_take_the_kubelet_s_defaults_and_liveness_passes_on_one_success() {
        let unset = Probe::default();
        let defaults = ProbeTiming::of(ProbeKind::Readiness, &unset);
        assert_eq!(
            defaults,
            ProbeTiming {
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
        let asked = Probe {
            initial_delay_seconds: 5,
            period_seconds: 2,
            timeout_seconds: -1,
            success_threshold: 4,
            failure_threshold: 6,
            ..Probe::default()
        };
        let readiness = ProbeTiming::of(ProbeKind::Readiness, &asked);
        assert_eq!(readiness.initial_delay, Duration::from_secs(5));
        assert_eq!(readiness.period, Duration::from_secs(2));
        assert_eq!(
            readiness.timeout,
            Duration::from_secs(1),
            "negative: the default"
        );
        assert_eq!(
            (readiness.success_threshold, readiness.failure_threshold),
            (4, 6)
        );
        assert_eq!(
            ProbeTiming::of(ProbeKind::Liveness, &asked).success_threshold,
            1
        );
    }
}
