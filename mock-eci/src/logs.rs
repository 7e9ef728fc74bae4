//! Deterministic synthetic container logs.
//!
//! A run writes `[<name>] starting <image>` when it starts, `[<name>] heartbeat <k>` every
//! `MOCK_ECI_LOG_INTERVAL` (default 1 s) while it runs, and `[<name>] exited with code <n>` when
//! it ends. Lines are computed from the run's times, never stored, so logs cost no memory.

use crate::clock::{Millis, rfc3339_nanos};
use crate::group::RunState;

/// What part of a log to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogQuery {
    /// Only lines at or after this time.
    pub since: Option<Millis>,
    /// At most this many lines, the newest.
    pub tail: usize,
    /// At most this many bytes, from the first selected line on.
    pub limit_bytes: Option<usize>,
    /// Prefix lines with RFC 3339 nanosecond timestamps.
    pub timestamps: bool,
}

/// The log of one run.
pub fn render(
    name: &str,
    image: &str,
    state: &RunState,
    interval_ms: Millis,
    now: Millis,
    query: LogQuery,
) -> String {
    let (started_at, end, exit) = match state {
        RunState::Waiting { .. } => return String::new(),
        RunState::Running { started_at } => (*started_at, now, None),
        RunState::Terminated {
            started_at,
            finished_at,
            exit_code,
            ..
        } => (*started_at, *finished_at, Some(*exit_code)),
    };
    let interval = interval_ms.max(1);
    // Heartbeat k is written at started_at + k·interval; k = 0 is the start line.
    let last_k = (end - started_at).max(0) / interval;
    let last_k = if exit.is_some() && started_at + last_k * interval == end && last_k > 0 {
        last_k - 1 // the exit line takes that instant
    } else {
        last_k
    };
    let first_k = match query.since {
        Some(since) if since > started_at => (since - started_at + interval - 1) / interval,
        _ => 0,
    };
    let exit_line = exit.filter(|_| query.since.is_none_or(|since| end >= since));

    let heartbeats = if first_k > last_k {
        0
    } else {
        last_k - first_k + 1
    };
    let total = heartbeats + i64::from(exit_line.is_some());
    let tail = i64::try_from(query.tail).unwrap_or(i64::MAX);
    let skip = (total - tail).max(0);

    let mut out = String::new();
    let mut push = |at: Millis, text: &str| {
        if query.timestamps {
            out.push_str(&rfc3339_nanos(at));
            out.push(' ');
        }
        out.push_str(text);
        out.push('\n');
    };
    for k in (first_k + skip.min(heartbeats))..=last_k {
        if heartbeats == 0 {
            break;
        }
        let text = if k == 0 {
            format!("[{name}] starting {image}")
        } else {
            format!("[{name}] heartbeat {k}")
        };
        push(started_at + k * interval, &text);
    }
    if let Some(code) = exit_line {
        if skip <= heartbeats {
            push(end, &format!("[{name}] exited with code {code}"));
        }
    }
    if let Some(limit) = query.limit_bytes {
        truncate_at_char_boundary(&mut out, limit);
    }
    out
}

fn truncate_at_char_boundary(text: &mut String, limit: usize) {
    if text.len() > limit {
        let mut cut = limit;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: LogQuery = LogQuery {
        since: None,
        tail: 500,
        limit_bytes: None,
        timestamps: false,
    };

    #[test]
    fn running_container_writes_a_line_per_interval() {
        let log = render(
            "app",
            "nginx",
            &RunState::Running { started_at: 0 },
            1_000,
            3_500,
            ALL,
        );
        assert_eq!(
            log,
            "[app] starting nginx\n[app] heartbeat 1\n[app] heartbeat 2\n[app] heartbeat 3\n"
        );
    }

    #[test]
    fn terminated_container_ends_with_its_exit_code() {
        let state = RunState::Terminated {
            exit_code: 3,
            reason: "Error".into(),
            message: String::new(),
            signal: None,
            started_at: 0,
            finished_at: 2_000,
        };
        let log = render("app", "busybox", &state, 1_000, 99_000, ALL);
        assert_eq!(
            log,
            "[app] starting busybox\n[app] heartbeat 1\n[app] exited with code 3\n"
        );
        let tail = render(
            "app",
            "busybox",
            &state,
            1_000,
            99_000,
            LogQuery { tail: 1, ..ALL },
        );
        assert_eq!(tail, "[app] exited with code 3\n");
    }

    #[test]
    fn tail_since_limit_and_timestamps() {
        let running = RunState::Running {
            started_at: 1_456_231_584_000,
        };
        let now = 1_456_231_584_000 + 10_000;
        let tail = render(
            "app",
            "nginx",
            &running,
            1_000,
            now,
            LogQuery { tail: 2, ..ALL },
        );
        assert_eq!(tail, "[app] heartbeat 9\n[app] heartbeat 10\n");
        let since = render(
            "app",
            "nginx",
            &running,
            1_000,
            now,
            LogQuery {
                since: Some(now - 1_500),
                ..ALL
            },
        );
        assert_eq!(since, "[app] heartbeat 9\n[app] heartbeat 10\n");
        let limited = render(
            "app",
            "nginx",
            &running,
            1_000,
            now,
            LogQuery {
                limit_bytes: Some(10),
                ..ALL
            },
        );
        assert_eq!(limited, "[app] star");
        let stamped = render(
            "app",
            "nginx",
            &running,
            1_000,
            now,
            LogQuery {
                tail: 1,
                timestamps: true,
                ..ALL
            },
        );
        assert_eq!(
            stamped,
            "2016-02-23T12:46:34.000000000Z [app] heartbeat 10\n"
        );
    }

    #[test]
    fn waiting_container_has_no_log() {
        let waiting = RunState::Waiting {
            reason: "ContainerCreating".into(),
            message: String::new(),
        };
        assert_eq!(render("app", "nginx", &waiting, 1_000, 5_000, ALL), "");
    }
}
