//! What the benchmarks and cost tests read off processes and the apiserver: Prometheus text
//! reduced to sums by label, a process's CPU seconds and `/proc/<pid>/status` figures, and
//! quantiles. No figure here is asserted; the callers decide what to compare.

use std::collections::BTreeMap;

use crate::proc_stat::{ProcStat, TICKS_PER_SECOND};

/// Labels of one series, by name.
pub type Labels = BTreeMap<String, String>;

/// `name{labels} value` lines whose name is exactly `name`, as (labels, value).
pub fn series(text: &str, name: &str) -> Vec<(Labels, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            let (metric, labels) = key.split_once('{').unwrap_or((key, "}"));
            (metric == name).then(|| (labels_of(labels), value.parse().unwrap_or(0.0)))
        })
        .collect()
}

/// Sum of all of `name`'s series (a counter over every label set).
pub fn total(text: &str, name: &str) -> f64 {
    series(text, name).into_iter().map(|(_, value)| value).sum()
}

/// `a="x",b="y"}` → {a: x, b: y} (the label values read here hold no quotes or commas).
fn labels_of(text: &str) -> Labels {
    text.trim_end_matches('}')
        .split("\",")
        .filter_map(|pair| {
            let (key, value) = pair.split_once("=\"")?;
            Some((key.to_owned(), value.trim_end_matches('"').to_owned()))
        })
        .collect()
}

/// Sum of `name`'s series grouped by `key` (series with the same key added up; those it
/// names `None` left out).
pub fn grouped(
    text: &str,
    name: &str,
    key: impl Fn(&Labels) -> Option<String>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, value) in series(text, name) {
        if let Some(k) = key(&labels) {
            *out.entry(k).or_default() += value;
        }
    }
    out
}

/// `after - before`, per key, keeping the keys that grew.
pub fn diff(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// "VERB resource[/subresource]" of an apiserver request series.
pub fn verb_resource(labels: &Labels) -> Option<String> {
    let resource = labels.get("resource")?;
    let verb = labels.get("verb")?;
    Some(match labels.get("subresource").filter(|s| !s.is_empty()) {
        Some(sub) => format!("{verb} {resource}/{sub}"),
        None => format!("{verb} {resource}"),
    })
}

/// The apiserver's `apiserver_request_total` so far, by "VERB resource[/subresource]".
pub fn apiserver_requests(metrics: &str) -> BTreeMap<String, f64> {
    grouped(metrics, "apiserver_request_total", verb_resource)
}

/// The apiserver's `/metrics` text, read with `client` (an administrator's).
///
/// # Errors
/// The read's own.
pub async fn apiserver_metrics(client: &kube::Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

/// CPU seconds (user + system) process `pid` used so far; 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks = ProcStat::parse(&stat)
        .and_then(|s| s.cpu_ticks())
        .unwrap_or(0);
    ticks as f64 / TICKS_PER_SECOND
}

/// The processes under `root` (its children, theirs, …) whose command name is `name`, as
/// `/proc/<pid>/comm` gives it (at most 15 bytes: "kube-controller" for
/// kube-controller-manager). Processes started by another process tree are left out, so a
/// benchmark counts only its own control plane.
pub fn descendants_named(root: u32, name: &str) -> Vec<u32> {
    let parents: BTreeMap<u32, u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let under_root = |mut pid: u32| {
        while let Some(&parent) = parents.get(&pid) {
            if parent == root {
                return true;
            }
            pid = parent;
        }
        false
    };
    parents
        .keys()
        .copied()
        .filter(|&pid| under_root(pid))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .collect()
}

/// The parent's pid, the 2nd field after the command name of `/proc/<pid>/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ProcStat::parse(&stat)?.parent()
}

/// A `/proc/<pid>/status` figure in KiB (`field` with its colon, e.g. `VmHWM:`); 0 when the
/// process is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// The `q` quantile of sorted values (nearest rank); NaN for none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 3
apiserver_request_total{code="429",resource="pods",subresource="",verb="POST"} 2
apiserver_request_total{code="200",resource="pods",subresource="status",verb="APPLY"} 5
apiserver_request_total{code="200",resource="leases",verb="PUT"} 1
other_total 7
"#;

    #[test]
    fn requests_are_summed_by_verb_and_resource() {
        let requests = apiserver_requests(TEXT);
        assert_eq!(requests.get("POST pods"), Some(&5.0));
        assert_eq!(requests.get("APPLY pods/status"), Some(&5.0));
        assert_eq!(requests.get("PUT leases"), Some(&1.0));
        assert_eq!(requests.len(), 3);
        assert_eq!(series(TEXT, "other_total"), [(Labels::new(), 7.0)]);
    }

    #[test]
    fn a_total_sums_every_label_set_of_exactly_that_name() {
        let text = "# HELP x\nvirtual_node_eci_eci_calls_total{action=\"a\",result=\"ok\"} 3\nvirtual_node_eci_eci_calls_total{action=\"b\",result=\"ok\"} 4.5\nvirtual_node_eci_eci_calls_totalx 9\n";
        assert!((total(text, "virtual_node_eci_eci_calls_total") - 7.5).abs() < 1e-9);
        assert!((total(TEXT, "apiserver_request_total") - 11.0).abs() < 1e-9);
        assert!(total(TEXT, "absent_total").abs() < 1e-9);
    }

    #[test]
    fn only_this_process_tree_is_searched_by_name() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ours = descendants_named(std::process::id(), "sleep");
        let from_init = descendants_named(u32::MAX, "sleep");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(ours, [child.id()]);
        assert!(
            from_init.is_empty(),
            "no process descends from {}",
            u32::MAX
        );
    }

    #[test]
    fn a_diff_keeps_what_grew() {
        let before = apiserver_requests(TEXT);
        let mut after = before.clone();
        *after.get_mut("PUT leases").unwrap() += 2.0;
        assert_eq!(
            diff(&after, &before),
            [("PUT leases".to_owned(), 2.0)].into()
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let sorted = [1.0, 2.0, 3.0, 4.0];
        assert!((quantile(&sorted, 0.5) - 2.0).abs() < f64::EPSILON);
        assert!((quantile(&sorted, 0.99) - 4.0).abs() < f64::EPSILON);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn this_process_has_a_peak_rss() {
        assert!(proc_status_kib(std::process::id(), "VmHWM:") > 0.0);
        assert!(cpu_seconds(std::process::id()) >= 0.0);
    }
}
