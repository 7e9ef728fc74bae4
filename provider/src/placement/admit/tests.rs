// Fixtures take `json!` values built inline by each caller.
#![allow(clippy::needless_pass_by_value)]

use serde_json::json;
use vne_core::placement::decide::VirtualNodes;
use vne_core::placement::policy::ResourcePolicy;

use super::*;
use crate::placement::state::{DELETION_COST_ANNOTATION, UNIT_ANNOTATION};

fn index() -> PlacementIndex {
    let index = PlacementIndex::new(VirtualNodes::default());
    let policy: ResourcePolicy = serde_json::from_value(json!({
        "metadata": {"name": "nginx", "namespace": "ns"},
        "spec": {
            "selector": {"app": "nginx"},
            "units": [
                {"resource": "ecs", "nodeSelector": {"paidtype": "subscription"}, "max": 1,
                 "podLabels": {"unit": "first"}},
                {"resource": "eci"},
            ],
        },
    }))
    .unwrap();
    index.set_policies([policy]);
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "sub", "labels": {"paidtype": "subscription"}},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}},
    }))
    .unwrap();
    let virtual_node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "vk", "labels": {"k8s.aliyun.com/vnode": "true"}},
        "status": {"allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "10000"}},
    }))
    .unwrap();
    index.set_nodes([node, virtual_node]);
    index.set_pods(Vec::<Pod>::new());
    index
}

fn pod(labels: serde_json::Value, extra: serde_json::Value) -> Pod {
    let mut value = json!({
        "metadata": {"generateName": "nginx-", "namespace": "ns", "labels": labels},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    });
    if let Some(spec) = extra.as_object() {
        for (k, v) in spec {
            value["spec"][k] = v.clone();
        }
    }
    serde_json::from_value(value).unwrap()
}

fn terms(pod: &Pod) -> serde_json::Value {
    serde_json::to_value(pod).unwrap()["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .clone()
}

#[test]
fn pods_no_policy_selects_are_left_alone() {
    let admitted = admit(
        &index(),
        pod(json!({"app": "db"}), json!({})),
        &Enforcement::Extender,
        false,
        SystemTime::now(),
    );
    assert!(admitted.is_none());
}

#[test]
fn with_the_extender_the_pod_is_narrowed_to_every_unit_and_tolerates_virtual_nodes() {
    let admitted = admit(
        &index(),
        pod(json!({"app": "nginx"}), json!({})),
        &Enforcement::Extender,
        false,
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(admitted.unit, None);
    assert_eq!(
        terms(&admitted.pod),
        json!([
            {"matchExpressions": [
                {"key": "paidtype", "operator": "In", "values": ["subscription"]},
                {"key": "k8s.aliyun.com/vnode", "operator": "NotIn", "values": ["true"]}]},
            {"matchExpressions": [{"key": "k8s.aliyun.com/vnode", "operator": "In", "values": ["true"]}]},
        ])
    );
    let tolerations =
        serde_json::to_value(&admitted.pod.spec.as_ref().unwrap().tolerations).unwrap();
    assert_eq!(
        tolerations,
        json!([{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}])
    );
}

#[test]
fn what_the_pod_requires_is_kept_and_its_toleration_not_doubled() {
    let admitted = admit(
        &index(),
        pod(
            json!({"app": "nginx"}),
            json!({
                "tolerations": [{"operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
            }),
        ),
        &Enforcement::Extender,
        false,
        SystemTime::now(),
    )
    .unwrap();
    let terms = terms(&admitted.pod);
    assert_eq!(terms.as_array().unwrap().len(), 2);
    for term in terms.as_array().unwrap() {
        assert_eq!(term["matchExpressions"][0]["key"], "zone");
    }
    assert_eq!(admitted.pod.spec.unwrap().tolerations.unwrap().len(), 1);
}

#[test]
fn without_an_extender_admission_picks_the_first_unit_with_room_and_reserves_it() {
    let index = index();
    let enforcement = Enforcement::Admission {
        why: "no scheduler extender is serving".into(),
    };
    let first = admit(
        &index,
        pod(json!({"app": "nginx"}), json!({})),
        &enforcement,
        false,
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(first.unit, Some(0));
    let annotations = first.pod.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[UNIT_ANNOTATION], "1");
    assert_eq!(annotations[DELETION_COST_ANNOTATION], "200");
    assert_eq!(annotations[PLACED_BY_ANNOTATION], "admission");
    assert_eq!(first.pod.metadata.labels.as_ref().unwrap()["unit"], "first");
    assert_eq!(
        first.note,
        "placed in unit 1 (ecs paidtype=subscription) (at admission: no scheduler extender is serving)"
    );
    assert_eq!(terms(&first.pod).as_array().unwrap().len(), 1);
    // The reservation holds unit 1's only place (max 1): the next pod goes to ECI.
    let second = admit(
        &index,
        pod(json!({"app": "nginx"}), json!({})),
        &enforcement,
        false,
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(second.unit, Some(1));
    assert!(
        second
            .note
            .starts_with("placed in unit 2 (eci): unit 1 (ecs paidtype=subscription) full (max 1)")
    );
    // A dry run decides the same but reserves nothing.
    let dry = admit(
        &index,
        pod(json!({"app": "nginx"}), json!({})),
        &enforcement,
        true,
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(dry.unit, Some(1));
}
