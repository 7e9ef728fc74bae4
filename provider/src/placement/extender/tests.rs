// Fixtures take `json!` values built inline by each caller.
#![allow(clippy::needless_pass_by_value)]

use vne_core::placement::decide::VirtualNodes;
use vne_core::placement::policy::ResourcePolicy;

use super::*;

fn index() -> PlacementIndex {
    let index = PlacementIndex::new(VirtualNodes::default());
    let policy: ResourcePolicy = serde_json::from_value(json!({
        "metadata": {"name": "nginx", "namespace": "ns", "creationTimestamp": "2026-11-23T09:00:00Z"},
        "spec": {
            "selector": {"app": "nginx"},
            "units": [
                {"resource": "ecs", "nodeSelector": {"paidtype": "subscription"}, "max": 1},
                {"resource": "ecs", "nodeSelector": {"paidtype": "pay-as-you-go"}},
                {"resource": "eci"},
            ],
            "whenTryNextUnits": {"policy": "TimeoutOrExceedMax", "timeout": "1m"},
        },
    }))
    .unwrap();
    index.set_policies([policy]);
    let node = |name: &str, labels: serde_json::Value| -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    };
    index.set_nodes([
        node("sub", json!({"paidtype": "subscription"})),
        node("payg", json!({"paidtype": "pay-as-you-go"})),
        node("vk", json!({"k8s.aliyun.com/vnode": "true"})),
        node("other", json!({})),
    ]);
    index.set_pods(Vec::<Pod>::new());
    index
}

/// The body kube-scheduler sends (Go field names, `nodeCacheCapable`).
fn args(labels: serde_json::Value, nodes: &[&str]) -> ExtenderArgs {
    serde_json::from_value(json!({
        "Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": labels,
            "creationTimestamp": "2026-11-23T10:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}},
        "Nodes": null,
        "NodeNames": nodes,
    }))
    .unwrap()
}

fn at(text: &str) -> SystemTime {
    text.parse::<k8s_openapi::jiff::Timestamp>().unwrap().into()
}

#[test]
fn pods_without_a_policy_pass_untouched() {
    let result = filter_nodes(
        &index(),
        &args(json!({"app": "other"}), &["sub", "other"]),
        SystemTime::now(),
    );
    assert_eq!(result.node_names, Some(vec!["sub".into(), "other".into()]));
    assert!(result.failed_nodes.is_empty());
}

#[test]
fn filter_keeps_the_first_unit_with_room() {
    let index = index();
    let result = filter_nodes(
        &index,
        &args(json!({"app": "nginx"}), &["payg", "sub", "vk", "other"]),
        SystemTime::now(),
    );
    assert_eq!(result.node_names, Some(vec!["sub".into()]));
    assert_eq!(result.failed_nodes.len(), 3);
    assert_eq!(
        result.failed_nodes["payg"],
        "ResourcePolicy ns/nginx: placed in unit 1 (ecs paidtype=subscription)"
    );
    // The explanation waits for the bind's Event.
    assert_eq!(
        index.take_explanation("u1").as_deref(),
        Some("placed in unit 1 (ecs paidtype=subscription)")
    );
}

#[test]
fn filter_waits_out_the_timeout_below_max_then_moves_on() {
    let index = index();
    // The subscription node did not pass the scheduler's own filters (no room).
    let early = filter_nodes(
        &index,
        &args(json!({"app": "nginx"}), &["payg", "vk"]),
        at("2026-11-23T10:00:30Z"),
    );
    assert_eq!(early.node_names, Some(vec![]));
    assert!(
        early.failed_nodes["payg"].contains("waiting for unit 1 (ecs paidtype=subscription)"),
        "{early:?}"
    );
    let late = filter_nodes(
        &index,
        &args(json!({"app": "nginx"}), &["payg", "vk"]),
        at("2026-11-23T10:01:00Z"),
    );
    assert_eq!(late.node_names, Some(vec!["payg".into()]));
}

#[test]
fn prioritize_prefers_earlier_units() {
    let scores = prioritize_nodes(
        &index(),
        &args(json!({"app": "nginx"}), &["vk", "payg", "sub", "other"]),
    );
    let scores: Vec<(&str, i64)> = scores.iter().map(|h| (h.host.as_str(), h.score)).collect();
    assert_eq!(
        scores,
        vec![("vk", 3), ("payg", 6), ("sub", 10), ("other", 0)]
    );
}

#[test]
fn answers_use_the_schedulers_field_names() {
    let result = FilterResult {
        node_names: Some(vec!["a".into()]),
        ..FilterResult::default()
    };
    let wire = serde_json::to_value(&result).unwrap();
    assert_eq!(wire["NodeNames"], json!(["a"]));
    assert_eq!(wire["Error"], json!(""));
    let binding: BindingArgs = serde_json::from_value(
        json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}),
    )
    .unwrap();
    assert_eq!(
        (
            binding.pod_name.as_str(),
            binding.pod_uid.as_str(),
            binding.node.as_str()
        ),
        ("p", "u", "n")
    );
    let priority = serde_json::to_value(HostPriority {
        host: "n".into(),
        score: 3,
    })
    .unwrap();
    assert_eq!(priority, json!({"Host": "n", "Score": 3}));
}
