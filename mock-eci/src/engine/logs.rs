//! Deterministic synthetic container logs.
//!
//! A run writes `[<name>] starting <image>` when it starts, `[<name>] heartbeat <k>` every
//! `MOCK_ECI_LOG_INTERVAL` (default 1 s) while it runs, and `[<name>] exited with code <n>` when
//! it ends. Lines are computed from the run's times, never stored, so logs cost no memory.

use std::ops::RangeInclusive;

use crate::clock::{Millis, rfc3339_nanos};
use crate::engine::group::RunState;

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

/// The log of one run: its synthetic lines and the `appended` lines (admin API) that fall in
/// the run, in time order (at one instant: synthetic, then appended in the order written, then
/// the exit line), then `since`, `tail` and `limit_bytes`.
pub fn render(
    name: &str,
    image: &str,
    state: &RunState,
    interval_ms: Millis,
    now: Millis,
    appended: &[(Millis, String)],
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
    let in_window =
        |at: Millis| at >= started_at && at <= end && query.since.is_none_or(|s| at >= s);

    // (time, order within an instant, text)
    let mut lines: Vec<(Millis, u8, String)> =
        heartbeat_numbers(started_at, end, exit.is_some(), interval, query)
            .map(|k| {
                let text = if k == 0 {
                    format!("[{name}] starting {image}")
                } else {
                    format!("[{name}] heartbeat {k}")
                };
                (started_at + k * interval, 0, text)
            })
            .collect();
    lines.extend(
        appended
            .iter()
            .filter(|(at, _)| in_window(*at))
            .map(|(at, text)| (*at, 1, text.clone())),
    );
    if let Some(code) = exit.filter(|_| in_window(end)) {
        lines.push((end, 2, format!("[{name}] exited with code {code}")));
    }
    // Stable: appended lines keep the order they were written in.
    lines.sort_by_key(|(at, order, _)| (*at, *order));
    let first = lines.len().saturating_sub(query.tail);
    joined(&lines[first..], query)
}

/// The numbers of the synthetic lines (0 is the start line, then the heartbeats) of a run
/// from `started_at` to `end` that `query` can return.
fn heartbeat_numbers(
    started_at: Millis,
    end: Millis,
    exited: bool,
    interval: Millis,
    query: LogQuery,
) -> RangeInclusive<Millis> {
    // Heartbeat k is written at started_at + k·interval; k = 0 is the start line.
    let last_k = (end - started_at).max(0) / interval;
    let last_k = if exited && started_at + last_k * interval == end && last_k > 0 {
        last_k - 1 // the exit line takes that instant
    } else {
        last_k
    };
    let first_k = match query.since {
        Some(since) if since > started_at => (since - started_at + interval - 1) / interval,
        _ => 0,
    };
    let heartbeats = if first_k > last_k {
        0
    } else {
        last_k - first_k + 1
    };
    let tail = i64::try_from(query.tail).unwrap_or(i64::MAX);
    // Only the newest `tail` synthetic lines can be among the newest `tail` of all: the rest
    // is never computed.
    let skip = (heartbeats - tail).max(0);
    (first_k + skip)..=last_k
}

/// The selected `lines` as the log's text: one a line, with timestamps if asked, cut at
/// `limit_bytes`.
fn joined(lines: &[(Millis, u8, String)], query: LogQuery) -> String {
    let mut out = String::new();
    for (at, _, text) in lines {
        if query.timestamps {
            out.push_str(&rfc3339_nanos(*at));
            out.push(' ');
        }
        out.push_str(text);
        out.push('\n');
    }
    if let Some(limit) = query.limit_bytes {
        truncate_at_char_boundary(&mut out, limit);
    }
    out
}

/// A real container's log files as the service read them (CRI format).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RealLogs {
    /// The current (or last) run's log.
    pub current: String,
    /// The run before it, once the container restarted.
    pub previous: Option<String>,
}

/// A real container's log (CRI lines: `<RFC 3339 time> <stream> <F|P> <text>`) as ECI answers
/// it: partial chunks joined into their line (a last one never ended keeps no newline, as the
/// kubelet reads it), then `since`, `tail`, `limit_bytes`, and the line's time in front when
/// `timestamps`. Lines that are not CRI lines are skipped.
pub fn render_cri(text: &str, query: LogQuery) -> String {
    // (time text, time, line, ended by a newline)
    let mut lines: Vec<(String, Option<Millis>, String, bool)> = Vec::new();
    let mut partial: Option<(String, String)> = None;
    for raw in text.lines() {
        let mut fields = raw.splitn(4, ' ');
        let (Some(time), Some(stream), Some(tag), Some(body)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next().or(Some("")),
        ) else {
            continue;
        };
        let is_cri = matches!(stream, "stdout" | "stderr") && matches!(tag, "F" | "P");
        if !is_cri {
            continue;
        }
        let (first_time, mut line) = partial
            .take()
            .unwrap_or_else(|| (time.to_owned(), String::new()));
        line.push_str(body);
        match tag {
            "P" => partial = Some((first_time, line)),
            _ => {
                let at = crate::clock::parse_rfc3339(&first_time);
                lines.push((first_time, at, line, true));
            }
        }
    }
    // Output cut short (the run ended mid-line): the text as written, without a newline.
    if let Some((time, line)) = partial {
        let at = crate::clock::parse_rfc3339(&time);
        lines.push((time, at, line, false));
    }
    if let Some(since) = query.since {
        lines.retain(|(_, at, ..)| at.is_none_or(|at| at >= since));
    }
    let first = lines.len().saturating_sub(query.tail);
    let mut out = String::new();
    for (time, _, line, ended) in &lines[first..] {
        if query.timestamps {
            out.push_str(time);
            out.push(' ');
        }
        out.push_str(line);
        if *ended {
            out.push('\n');
        }
    }
    if let Some(limit) = query.limit_bytes {
        truncate_at_char_boundary(&mut out, limit);
    }
    out
}

/// The kubelet's bounds on a terminated container's message: the last 4 KiB of its
/// termination-message file; in the fallback, its log's last 80 lines, the first 2 KiB of them
/// (pkg/kubelet/container: `MaxContainerTerminationMessageLength`,
/// `MaxContainerTerminationMessageLogLines`, `MaxContainerTerminationMessageLogLength`).
pub const MESSAGE_FILE_BYTES: usize = 4 * 1024;
const MESSAGE_LOG_LINES: usize = 80;
const MESSAGE_LOG_BYTES: usize = 2 * 1024;

/// Whether a run's message may come from its log: policy `FallbackToLogsOnError` and a failed
/// exit, as the kubelet decides it.
pub fn falls_back_to_log(policy: &str, exit_code: i32) -> bool {
    policy == "FallbackToLogsOnError" && exit_code != 0
}

/// A terminated run's message as the kubelet makes it: the tail of what the container wrote to
/// its termination-message file (`file`, read up to [`MESSAGE_FILE_BYTES`] from its end), or,
/// when that is empty and the run [`falls_back_to_log`], the tail of its CRI log (`log`).
pub fn termination_message(file: &[u8], log: Option<&str>) -> String {
    let start = file.len().saturating_sub(MESSAGE_FILE_BYTES);
    let written = String::from_utf8_lossy(&file[start..]).into_owned();
    match log {
        Some(log) if written.is_empty() => render_cri(
            log,
            LogQuery {
                since: None,
                tail: MESSAGE_LOG_LINES,
                limit_bytes: Some(MESSAGE_LOG_BYTES),
                timestamps: false,
            },
        ),
        _ => written,
    }
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
            &[],
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
        let log = render("app", "busybox", &state, 1_000, 99_000, &[], ALL);
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
            &[],
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
            &[],
            LogQuery { tail: 2, ..ALL },
        );
        assert_eq!(tail, "[app] heartbeat 9\n[app] heartbeat 10\n");
        let since = render(
            "app",
            "nginx",
            &running,
            1_000,
            now,
            &[],
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
            &[],
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
            &[],
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
    fn appended_lines_merge_in_time_order_within_their_run() {
        let state = RunState::Terminated {
            exit_code: 0,
            reason: "Completed".into(),
            message: String::new(),
            signal: None,
            started_at: 10_000,
            finished_at: 13_000,
        };
        let appended = [
            (9_000, "from an earlier run".to_owned()),
            (11_000, "first".to_owned()),
            (11_000, "second".to_owned()),
            (12_500, "third".to_owned()),
            (13_000, "last words".to_owned()),
            (14_000, "from a later run".to_owned()),
        ];
        let log = render("app", "img", &state, 1_000, 99_000, &appended, ALL);
        assert_eq!(
            log,
            "[app] starting img\n[app] heartbeat 1\nfirst\nsecond\n[app] heartbeat 2\nthird\nlast words\n[app] exited with code 0\n"
        );
        let tail = render(
            "app",
            "img",
            &state,
            1_000,
            99_000,
            &appended,
            LogQuery { tail: 3, ..ALL },
        );
        assert_eq!(tail, "third\nlast words\n[app] exited with code 0\n");
        let since = render(
            "app",
            "img",
            &state,
            1_000,
            99_000,
            &appended,
            LogQuery {
                since: Some(11_000),
                tail: 2,
                ..ALL
            },
        );
        assert_eq!(since, "last words\n[app] exited with code 0\n");
        let stamped = render(
            "app",
            "img",
            &state,
            1_000,
            99_000,
            &appended,
            LogQuery {
                since: Some(11_000),
                timestamps: true,
                ..ALL
            },
        );
        assert_eq!(
            stamped.lines().take(2).collect::<Vec<_>>(),
            [
                "1970-01-01T00:00:11.000000000Z [app] heartbeat 1",
                "1970-01-01T00:00:11.000000000Z first"
            ]
        );
    }

    #[test]
    fn waiting_container_has_no_log() {
        let waiting = RunState::Waiting {
            reason: "ContainerCreating".into(),
            message: String::new(),
        };
        assert_eq!(render("app", "nginx", &waiting, 1_000, 5_000, &[], ALL), "");
    }

    #[test]
    fn the_termination_message_is_the_file_or_in_the_fallback_the_logs_tail() {
        let log: String = (1..=100)
            .map(|n| format!("2026-11-29T10:00:00.000000000Z stdout F line {n}\n"))
            .collect();
        let big_file = "x".repeat(MESSAGE_FILE_BYTES + 10);
        let last_80: String = (21..=100).map(|n| format!("line {n}\n")).collect();
        // (file, log offered, expected)
        let cases: [(&str, Option<&str>, String); 7] = [
            ("DONE", None, "DONE".into()),
            ("DONE", Some(&log), "DONE".into()),
            ("", None, String::new()),
            ("", Some(&log), last_80),
            (&big_file, None, "x".repeat(MESSAGE_FILE_BYTES)),
            (
                "",
                Some("2026-11-29T10:00:00Z stderr P par\n2026-11-29T10:00:00Z stderr F tial\n"),
                "partial\n".into(),
            ),
            // Output the run ended mid-line (`echo -n DONE`) keeps no newline.
            (
                "",
                Some("2026-11-29T10:00:00Z stdout P DONE\n"),
                "DONE".into(),
            ),
        ];
        for (file, log, expected) in cases {
            assert_eq!(
                termination_message(file.as_bytes(), log),
                expected,
                "file {file:.20?}"
            );
        }
        let long_lines: String = (0..80)
            .map(|_| format!("2026-11-29T10:00:00Z stdout F {}\n", "y".repeat(99)))
            .collect();
        assert_eq!(
            termination_message(b"", Some(&long_lines)).len(),
            MESSAGE_LOG_BYTES
        );
        assert!(falls_back_to_log("FallbackToLogsOnError", 1));
        assert!(!falls_back_to_log("FallbackToLogsOnError", 0));
        assert!(!falls_back_to_log("File", 2));
        assert!(!falls_back_to_log("", 2));
    }

    #[test]
    fn a_real_log_joins_partial_chunks_and_applies_since_tail_limit_and_timestamps() {
        let text = "2026-11-28T21:00:00.5Z stdout F first\n\
                    2026-11-28T21:00:01Z stderr P half\n\
                    2026-11-28T21:00:01.2Z stderr F  and half\n\
                    not a log line\n\
                    2026-11-28T21:00:02Z stdout F \n\
                    2026-11-28T21:00:03Z stdout F last\n";
        assert_eq!(render_cri(text, ALL), "first\nhalf and half\n\nlast\n");
        let tail = LogQuery { tail: 2, ..ALL };
        assert_eq!(render_cri(text, tail), "\nlast\n");
        let since = crate::clock::parse_rfc3339("2026-11-28T21:00:01Z");
        let stamped = LogQuery {
            since,
            timestamps: true,
            tail: 2,
            ..ALL
        };
        assert_eq!(
            render_cri(text, stamped),
            "2026-11-28T21:00:02Z \n2026-11-28T21:00:03Z last\n"
        );
        let from_since = LogQuery { since, ..ALL };
        assert_eq!(render_cri(text, from_since), "half and half\n\nlast\n");
        let limited = LogQuery {
            limit_bytes: Some(7),
            ..ALL
        };
        assert_eq!(render_cri(text, limited), "first\nh");
    }
}
