//! The alerts and the dashboard (`charts/virtual-node-eci/files/`) are checked against the
//! real tools and the daemon itself: `promtool check rules` accepts the rules, `promtool test
//! rules` runs a unit test for every alert (and there is one for every alert), every metric
//! they and the dashboard query is one the daemon's `/metrics` serves, every alert has its
//! runbook section in docs/operations.md, and every dashboard query parses (as PromQL, by
//! promtool). promtool is Debian's (`apt-get install --no-install-recommends prometheus`, as
//! .ci/run does), found on PATH or at `PROMTOOL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use virtual_node_eci::admission::AdmissionMetrics;
use virtual_node_eci::app::telemetry::every_metric;
use virtual_node_eci::fleet::FleetMetrics;
use virtual_node_eci::node::NodeMetrics;
use virtual_node_eci::ops::metrics::{EciLabels, MetricSet as _, ResultLabels};
use virtual_node_eci::placement::extender::{PlacementLabels, PlacementMetrics, VerbLabels};
use virtual_node_eci::pods::{PhaseLabels, PodMetrics};

fn files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/virtual-node-eci/files")
}

fn promtool() -> PathBuf {
    std::env::var_os("PROMTOOL").map_or_else(|| PathBuf::from("promtool"), PathBuf::from)
}

fn run_promtool(args: &[&str], dir: &Path) -> String {
    let output = std::process::Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "run {}: {e}; install Debian's prometheus package \
                 (apt-get install --no-install-recommends prometheus) or set PROMTOOL",
                promtool().display()
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {}: {text}",
        args.join(" ")
    );
    text
}

fn rules() -> Value {
    let text = std::fs::read_to_string(files().join("prometheus-rules.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn alerts() -> Vec<Value> {
    rules()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(files().join("grafana-dashboard.json")).unwrap())
        .unwrap()
}

/// The dashboard's queries, Grafana's variables replaced by what Grafana would put there.
fn dashboard_queries() -> Vec<String> {
    let mut queries = Vec::new();
    for panel in dashboard()["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push(
                target["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "1m")
                    .replace("$pod", ".*"),
            );
        }
    }
    queries
}

/// The series names the daemon's `/metrics` serves (from each family's `# TYPE` line, as
/// Prometheus names the samples of each type). Labelled families appear once they have a
/// series, as in a running daemon: each gets one here.
fn served_series() -> BTreeSet<String> {
    let telemetry = every_metric();
    let result = |r: &str| ResultLabels { result: r.into() };
    let node = NodeMetrics::of(&telemetry);
    node.eci_probes.get_or_create(&result("ok")).inc();
    node.lease_renewals.get_or_create(&result("ok")).inc();
    let pods = PodMetrics::of(&telemetry);
    pods.token_refreshes.get_or_create(&result("ok")).inc();
    FleetMetrics::of(&telemetry)
        .drains
        .get_or_create(&result("drained"))
        .inc();
    AdmissionMetrics::of(&telemetry)
        .admission_reviews
        .get_or_create(&result("patched"))
        .inc();
    telemetry.kube_request("node_status_patch");
    telemetry
        .eci_calls
        .get_or_create(&EciLabels {
            action: "CreateContainerGroup",
            result: "ok".into(),
        })
        .inc();
    pods.pods
        .get_or_create(&PhaseLabels {
            phase: "Running".into(),
        })
        .set(1);
    let placement = PlacementMetrics::of(&telemetry);
    placement
        .placement_pods_placed
        .get_or_create(&PlacementLabels {
            policy: "default/p".into(),
            unit: "1".into(),
            by: "extender",
        })
        .inc();
    placement
        .placement_extender_seconds
        .get_or_create(&VerbLabels { verb: "filter" })
        .observe(0.001);
    let text = telemetry.render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// Metric names in a PromQL expression: the daemon's prefix is the only source it queries.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
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
fn promtool_accepts_the_rules() {
    let out = run_promtool(&["check", "rules", "prometheus-rules.yaml"], &files());
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_unit_tests_pass_and_cover_every_alert() {
    let out = run_promtool(&["test", "rules", "prometheus-rules_test.yaml"], &files());
    assert!(out.contains("SUCCESS"), "{out}");
    let text = std::fs::read_to_string(files().join("prometheus-rules_test.yaml")).unwrap();
    let tests: Value = serde_saphyr::from_str(&text).unwrap();
    let firing: BTreeSet<String> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().clone())
        .filter(|case| !case["exp_alerts"].as_array().unwrap().is_empty())
        .map(|case| case["alertname"].as_str().unwrap().to_owned())
        .collect();
    let quiet: BTreeSet<String> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().clone())
        .filter(|case| case["exp_alerts"].as_array().unwrap().is_empty())
        .map(|case| case["alertname"].as_str().unwrap().to_owned())
        .collect();
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        assert!(firing.contains(name), "no test where {name} fires");
        assert!(quiet.contains(name), "no test where {name} stays quiet");
    }
}

#[test]
fn every_metric_the_rules_and_the_dashboard_use_is_served() {
    let served = served_series();
    assert!(
        served.contains("virtual_node_eci_node_ready"),
        "the registry renders: {served:?}"
    );
    let mut used = BTreeSet::new();
    for alert in alerts() {
        used.extend(metric_names(alert["expr"].as_str().unwrap()));
    }
    for query in dashboard_queries() {
        used.extend(metric_names(&query));
    }
    for variable in dashboard()["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["definition"].as_str() {
            used.extend(metric_names(query));
        }
    }
    assert!(used.len() >= 10, "the names were found: {used:?}");
    let unknown: Vec<_> = used.difference(&served).collect();
    assert!(
        unknown.is_empty(),
        "not served by /metrics: {unknown:?} (served: {served:?})"
    );
}

#[test]
fn every_alert_has_its_runbook_in_the_operations_doc() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        let runbook = alert["annotations"]["runbook"].as_str().unwrap();
        assert_eq!(
            runbook,
            format!("docs/operations.md#{}", name.to_lowercase()),
            "{name}'s runbook annotation"
        );
        assert!(
            doc.lines().any(|l| l.starts_with('#') && l.contains(name)),
            "docs/operations.md has a section for {name}"
        );
    }
}

#[test]
fn every_dashboard_query_parses() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 10);
    // promtool parses every expression of a rules file: the queries as recording rules.
    let rules = serde_json::json!({"groups": [{
        "name": "dashboard",
        "rules": queries.iter().enumerate().map(|(i, q)| {
            serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": q})
        }).collect::<Vec<_>>(),
    }]});
    let dir = tempfile::tempdir().unwrap();
    // JSON is YAML.
    std::fs::write(dir.path().join("dashboard-rules.yaml"), rules.to_string()).unwrap();
    let out = run_promtool(&["check", "rules", "dashboard-rules.yaml"], dir.path());
    assert!(out.contains("SUCCESS"), "{out}");
}
