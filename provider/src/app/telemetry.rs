//! The daemon's whole set of metrics: the registry and every part's own [`MetricSet`],
//! registered before any part runs, so `/metrics` serves every family from the start, of the
//! areas this replica runs or not, as the alerts and the dashboard expect.

use crate::admission::AdmissionMetrics;
use crate::fleet::FleetMetrics;
use crate::node::NodeMetrics;
use crate::ops::events::EventMetrics;
use crate::ops::metrics::{MetricSet, Telemetry};
use crate::placement::extender::PlacementMetrics;
use crate::pods::PodMetrics;

/// A registry holding every metric the daemon serves.
pub fn every_metric() -> Telemetry {
    let telemetry = Telemetry::new();
    NodeMetrics::of(&telemetry);
    FleetMetrics::of(&telemetry);
    PodMetrics::of(&telemetry);
    AdmissionMetrics::of(&telemetry);
    PlacementMetrics::of(&telemetry);
    EventMetrics::of(&telemetry);
    telemetry
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::ops::metrics::{EciLabels, ResultLabels};
    use crate::placement::extender::{PlacementLabels, VerbLabels};
    use crate::pods::PhaseLabels;

    /// `telemetry` after one series in every labelled family, as a running daemon has them: a
    /// labelled family is rendered once it has a series.
    fn with_a_series_each(telemetry: Telemetry) -> Telemetry {
        let ok = || ResultLabels {
            result: "ok".into(),
        };
        telemetry.kube_request("node_status_patch");
        telemetry
            .eci_calls
            .get_or_create(&EciLabels {
                action: "CreateContainerGroup",
                result: "ok".into(),
            })
            .inc();
        let node = NodeMetrics::of(&telemetry);
        node.eci_probes.get_or_create(&ok()).inc();
        node.lease_renewals.get_or_create(&ok()).inc();
        Telemetry::count(&FleetMetrics::of(&telemetry).drains, "drained");
        let pods = PodMetrics::of(&telemetry);
        pods.token_refreshes.get_or_create(&ok()).inc();
        let running = PhaseLabels {
            phase: "Running".into(),
        };
        pods.pods.get_or_create(&running).set(1);
        Telemetry::count(
            &AdmissionMetrics::of(&telemetry).admission_reviews,
            "patched",
        );
        let placement = PlacementMetrics::of(&telemetry);
        let placed = PlacementLabels {
            policy: "default/p".into(),
            unit: "1".into(),
            by: "extender",
        };
        placement.placement_pods_placed.get_or_create(&placed).inc();
        placement
            .placement_extender_seconds
            .get_or_create(&VerbLabels { verb: "filter" })
            .observe(0.001);
        telemetry
    }

    /// The families a rendering declares (`# TYPE <name> <kind>`), each with the names its
    /// samples take: a counter's `_total`, a histogram's `_bucket`, `_sum` and `_count`.
    fn served_names(text: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for rest in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let Some((name, kind)) = rest.split_once(' ') else {
                continue;
            };
            names.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
        names
    }

    /// Every `virtual_node_eci_…` name in `text`.
    fn named(text: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut rest = text;
        while let Some(at) = rest.find("virtual_node_eci_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
        names
    }

    #[test]
    fn every_metric_the_docs_rules_and_dashboard_name_is_served() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let sources = [
            "docs/operations.md",
            "docs/compatibility.md",
            "charts/virtual-node-eci/files/prometheus-rules.yaml",
            "charts/virtual-node-eci/files/prometheus-rules_test.yaml",
            "charts/virtual-node-eci/files/grafana-dashboard.json",
        ];
        let mut wanted = BTreeSet::new();
        for source in sources {
            let text = std::fs::read_to_string(root.join(source)).expect(source);
            wanted.extend(named(&text));
        }
        assert!(wanted.len() >= 20, "the names were found: {wanted:?}");
        let served = served_names(&with_a_series_each(every_metric()).render());
        let missing: Vec<_> = wanted.difference(&served).collect();
        assert!(
            missing.is_empty(),
            "not served: {missing:?} (served: {served:?})"
        );
    }

    #[test]
    fn each_family_is_registered_once_however_many_parts_ask() {
        let telemetry = with_a_series_each(every_metric());
        let before = telemetry.render();
        PodMetrics::of(&telemetry).pod_create_retries.inc();
        EventMetrics::of(&telemetry);
        let after = telemetry.render();
        let families = |text: &str| text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(families(&after), families(&before));
        assert_eq!(families(&before), 23, "{before}");
        assert!(
            after.contains("virtual_node_eci_pod_create_retries_total 1"),
            "{after}"
        );
    }
}
