//! The churn load's per-daemon figures (each sample's `daemons`: RSS, open descriptors,
//! established TCP connections, ECI calls per second, CPU percent) laid out as text: churn's
//! progress lines and the reliability report's table read the same sample the same way.

use serde_json::Value;

/// The figures of a [`Layout::Cell`], in order, for the table's heading.
pub const CELL_FIGURES: &str = "RSS MiB / fds / TCP / ECI calls/s / CPU %";

/// How one daemon's figures are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A Markdown table cell, `12.3 / 40 / 5 / 1.2 / 8` ([`CELL_FIGURES`]); a figure the
    /// sample lacks shows as `—`, so a gap is not read as a zero.
    Cell,
    /// A progress line's bracket, `[rss 12.3 MiB, fds 40, tcp 5, eci 1.2/s, cpu 8%]`; a
    /// figure the sample lacks shows as zero.
    Brief,
}

/// Each daemon's figures in `sample["daemons"]`, in order (none without that array).
pub fn daemon_figures(sample: &Value, layout: Layout) -> Vec<String> {
    sample["daemons"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|daemon| one_daemon(daemon, layout))
        .collect()
}

fn one_daemon(daemon: &Value, layout: Layout) -> String {
    let missing = match layout {
        Layout::Cell => None,
        Layout::Brief => Some(0.0),
    };
    let figure = |key: &str, digits: usize| {
        daemon[key]
            .as_f64()
            .or(missing)
            .map_or_else(|| "—".to_owned(), |f| format!("{f:.digits$}"))
    };
    let rss = figure("rss_mib", 1);
    let eci = figure("eci_calls_per_s", 1);
    let cpu = figure("cpu_percent", 0);
    let (fds, tcp) = (&daemon["open_fds"], &daemon["tcp_established"]);
    match layout {
        Layout::Cell => format!("{rss} / {fds} / {tcp} / {eci} / {cpu}"),
        Layout::Brief => format!("[rss {rss} MiB, fds {fds}, tcp {tcp}, eci {eci}/s, cpu {cpu}%]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({"daemons": [
            {"rss_mib": 12.345, "open_fds": 40, "tcp_established": 5, "eci_calls_per_s": 1.25, "cpu_percent": 7.5},
            {"open_fds": 3, "tcp_established": 1},
        ]})
    }

    #[test]
    fn each_layout_rounds_the_same_and_shows_a_gap_its_own_way() {
        let cases = [
            (
                Layout::Cell,
                ["12.3 / 40 / 5 / 1.2 / 8", "— / 3 / 1 / — / —"],
            ),
            (
                Layout::Brief,
                [
                    "[rss 12.3 MiB, fds 40, tcp 5, eci 1.2/s, cpu 8%]",
                    "[rss 0.0 MiB, fds 3, tcp 1, eci 0.0/s, cpu 0%]",
                ],
            ),
        ];
        for (layout, expected) in cases {
            assert_eq!(daemon_figures(&sample(), layout), expected, "{layout:?}");
        }
    }

    #[test]
    fn a_sample_without_daemons_has_no_figures() {
        for layout in [Layout::Cell, Layout::Brief] {
            assert!(daemon_figures(&json!({}), layout).is_empty());
            assert!(daemon_figures(&json!({"daemons": []}), layout).is_empty());
        }
    }
}
