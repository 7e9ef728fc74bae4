use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::placement::policy::{NextUnits, ResourcePolicySpec, Unit};

fn q(text: &str) -> Quantity {
    Quantity::parse(text).unwrap()
}

fn requests(pairs: &[(&str, &str)]) -> Requests {
    pairs.iter().map(|(k, v)| ((*k).into(), q(v))).collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

fn unit(value: serde_json::Value) -> Unit {
    serde_json::from_value(value).unwrap()
}

fn view(pods: u32, terminating: u32, has_room: bool) -> UnitView {
    UnitView {
        pods,
        used: requests(&[("cpu", &format!("{}", pods * 2))]),
        terminating,
        has_room,
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// Every `whenTryNextUnits` policy against the situations that tell them apart.
#[test]
fn when_try_next_units_table() {
    use NextUnits::{
        ExceedMax, LackResourceAndNoTerminating, LackResourceOrExceedMax, TimeoutOrExceedMax,
    };
    let capped = unit(serde_json::json!({"resource": "ecs", "max": 2}));
    let uncapped = unit(serde_json::json!({"resource": "ecs"}));
    let scaling = unit(serde_json::json!({"resource": "ecs", "podLabels": {
        "k8s.aliyun.com/resource-policy-wait-for-ecs-scaling": "true"}}));
    let cpu_capped = unit(serde_json::json!({"resource": "ecs", "maxResources": {"cpu": "4"}}));
    let pod = requests(&[("cpu", "2")]);
    // (policy, unit, view, waited, want): P = place, W = wait, N = next.
    let cases: Vec<(NextUnits, &Unit, UnitView, Duration, char, &str)> = vec![
        // Room below max: every policy places.
        (
            LackResourceOrExceedMax,
            &capped,
            view(1, 0, true),
            Duration::ZERO,
            'P',
            "",
        ),
        (
            LackResourceAndNoTerminating,
            &capped,
            view(1, 0, true),
            Duration::ZERO,
            'P',
            "",
        ),
        (
            ExceedMax,
            &capped,
            view(1, 0, true),
            Duration::ZERO,
            'P',
            "",
        ),
        (
            TimeoutOrExceedMax,
            &capped,
            view(1, 0, true),
            Duration::ZERO,
            'P',
            "",
        ),
        // At max: every policy moves on, whatever the room.
        (
            LackResourceOrExceedMax,
            &capped,
            view(2, 0, true),
            Duration::ZERO,
            'N',
            "full (max 2)",
        ),
        (
            LackResourceAndNoTerminating,
            &capped,
            view(2, 0, true),
            Duration::ZERO,
            'N',
            "full (max 2)",
        ),
        (
            ExceedMax,
            &capped,
            view(2, 0, true),
            Duration::ZERO,
            'N',
            "full (max 2)",
        ),
        (
            TimeoutOrExceedMax,
            &capped,
            view(2, 0, false),
            Duration::ZERO,
            'N',
            "full (max 2)",
        ),
        // maxResources: 2 CPU used + 2 asked fits 4; 4 used + 2 does not.
        (
            LackResourceOrExceedMax,
            &cpu_capped,
            view(1, 0, true),
            Duration::ZERO,
            'P',
            "",
        ),
        (
            LackResourceOrExceedMax,
            &cpu_capped,
            view(2, 0, true),
            Duration::ZERO,
            'N',
            "full (maxResources cpu 4: 4 used, 2 asked)",
        ),
        // Below max, no room.
        (
            LackResourceOrExceedMax,
            &capped,
            view(1, 0, false),
            Duration::ZERO,
            'N',
            "no node fits the pod",
        ),
        (
            LackResourceAndNoTerminating,
            &capped,
            view(1, 0, false),
            Duration::ZERO,
            'N',
            "no node fits the pod",
        ),
        (
            ExceedMax,
            &capped,
            view(1, 0, false),
            Duration::ZERO,
            'W',
            "below its max but no node fits the pod (ExceedMax)",
        ),
        (
            TimeoutOrExceedMax,
            &capped,
            view(1, 0, false),
            Duration::ZERO,
            'W',
            "no node fits the pod yet; waiting up to 60s (TimeoutOrExceedMax), 60s left",
        ),
        (
            TimeoutOrExceedMax,
            &capped,
            view(1, 0, false),
            MINUTE,
            'N',
            "no node fitted within the 60s timeout",
        ),
        // No limits, no room.
        (
            ExceedMax,
            &uncapped,
            view(3, 0, false),
            Duration::ZERO,
            'N',
            "no node fits the pod and no max",
        ),
        (
            TimeoutOrExceedMax,
            &uncapped,
            view(3, 0, false),
            Duration::ZERO,
            'N',
            "no node fits the pod",
        ),
        (
            TimeoutOrExceedMax,
            &scaling,
            view(3, 0, false),
            Duration::from_secs(59),
            'W',
            "no node fits the pod yet; waiting up to 60s (TimeoutOrExceedMax), 1s left",
        ),
        (
            TimeoutOrExceedMax,
            &scaling,
            view(3, 0, false),
            Duration::from_secs(61),
            'N',
            "no node fitted within the 60s timeout",
        ),
        // Pods terminating in the unit hold LackResourceAndNoTerminating back, full or not.
        (
            LackResourceAndNoTerminating,
            &capped,
            view(2, 1, true),
            Duration::ZERO,
            'W',
            "1 of its pods still terminating (LackResourceAndNoTerminating)",
        ),
        (
            LackResourceAndNoTerminating,
            &uncapped,
            view(2, 2, false),
            Duration::ZERO,
            'W',
            "2 of its pods still terminating (LackResourceAndNoTerminating)",
        ),
        (
            LackResourceOrExceedMax,
            &uncapped,
            view(2, 2, false),
            Duration::ZERO,
            'N',
            "no node fits the pod",
        ),
    ];
    for (i, (next, unit, view, waited, want, why)) in cases.into_iter().enumerate() {
        let got = judge(next, MINUTE, unit, &view, &pod, waited);
        let (kind, text) = match &got {
            UnitFit::Place => ('P', ""),
            UnitFit::Wait(why) => ('W', why.as_str()),
            UnitFit::Next(why) => ('N', why.as_str()),
        };
        assert_eq!(
            (kind, text),
            (want, why),
            "case {i}: {next:?} {view:?} waited {waited:?}"
        );
    }
}

fn seed_policy() -> ResourcePolicySpec {
    serde_json::from_value(serde_json::json!({
        "selector": {"app": "nginx"},
        "strategy": "prefer",
        "units": [
            {"resource": "ecs", "nodeSelector": {"paidtype": "subscription"}, "max": 2},
            {"resource": "ecs", "nodeSelector": {"paidtype": "pay-as-you-go"}},
            {"resource": "eci"},
        ],
    }))
    .unwrap()
}

#[test]
fn choose_walks_the_units_in_order_and_explains() {
    let spec = seed_policy();
    let pod = requests(&[("cpu", "2")]);
    let full_first = [view(2, 0, true), view(0, 0, true), view(0, 0, true)];
    let choice = choose(&spec, &full_first, &pod, Duration::ZERO);
    assert_eq!(choice.destination, Destination::Place(1));
    assert_eq!(
        explain(&spec, &choice),
        "placed in unit 2 (ecs paidtype=pay-as-you-go): unit 1 (ecs paidtype=subscription) full (max 2)"
    );
    let only_eci = [view(2, 0, true), view(2, 0, false), view(0, 0, true)];
    let choice = choose(&spec, &only_eci, &pod, Duration::ZERO);
    assert_eq!(choice.destination, Destination::Place(2));
    assert_eq!(
        explain(&spec, &choice),
        "placed in unit 3 (eci): unit 1 (ecs paidtype=subscription) full (max 2); unit 2 (ecs paidtype=pay-as-you-go) no node fits the pod"
    );
    let nowhere = [view(2, 0, true), view(2, 0, false), view(0, 0, false)];
    let choice = choose(&spec, &nowhere, &pod, Duration::ZERO);
    assert_eq!(choice.destination, Destination::Nowhere);
    assert!(explain(&spec, &choice).starts_with("no unit can take the pod: unit 1"));
    let first = [view(0, 0, true), view(0, 0, true), view(0, 0, true)];
    let choice = choose(&spec, &first, &pod, Duration::ZERO);
    assert_eq!(
        explain(&spec, &choice),
        "placed in unit 1 (ecs paidtype=subscription)"
    );
}

#[test]
fn nodes_belong_to_the_first_unit_that_selects_them() {
    let spec = seed_policy();
    let vnodes = VirtualNodes::default();
    let cases = [
        (labels(&[("paidtype", "subscription")]), Some(0)),
        (labels(&[("paidtype", "pay-as-you-go")]), Some(1)),
        (labels(&[("k8s.aliyun.com/vnode", "true")]), Some(2)),
        // A virtual node never counts as ECS, whatever its labels.
        (
            labels(&[
                ("k8s.aliyun.com/vnode", "true"),
                ("paidtype", "subscription"),
            ]),
            Some(2),
        ),
        (labels(&[("paidtype", "spot")]), None),
    ];
    for (node, want) in cases {
        assert_eq!(unit_of_node(&spec, &node, &vnodes), want, "{node:?}");
    }
}

#[test]
fn counting_follows_ignore_terminating_and_ignore_previous() {
    let mut spec = seed_policy();
    let live = PodFacts {
        terminating: false,
        finished: false,
        predates_policy: false,
    };
    let terminating = PodFacts {
        terminating: true,
        ..live
    };
    let old = PodFacts {
        predates_policy: true,
        ..live
    };
    let done = PodFacts {
        finished: true,
        ..live
    };
    // Defaults: terminating ignored, previous counted.
    assert!(counts(&spec, &live));
    assert!(!counts(&spec, &terminating));
    assert!(counts(&spec, &old));
    assert!(!counts(&spec, &done));
    spec.ignore_terminating_pod = Some(false);
    spec.ignore_previous_pod = Some(true);
    assert!(counts(&spec, &terminating));
    assert!(!counts(&spec, &old));
}

#[test]
fn groups_come_from_match_label_keys() {
    let mut spec = seed_policy();
    assert_eq!(group_of(&spec, &labels(&[])), Ok(String::new()));
    spec.match_label_keys = vec!["pod-template-hash".into(), "tier".into()];
    assert_eq!(
        group_of(
            &spec,
            &labels(&[("pod-template-hash", "abc"), ("tier", "web")])
        ),
        Ok("pod-template-hash=abc,tier=web".into())
    );
    assert_eq!(
        group_of(&spec, &labels(&[("pod-template-hash", "abc")])),
        Err("tier".into())
    );
}

#[test]
fn unit_marks_are_required_of_counted_pods_except_the_scaling_hint() {
    let u = unit(serde_json::json!({"resource": "ecs", "podLabels": {
        "tier": "a", "k8s.aliyun.com/resource-policy-wait-for-ecs-scaling": "true"},
        "podAnnotations": {"note": "x"}}));
    assert!(carries_unit_marks(
        &u,
        &labels(&[("tier", "a")]),
        &labels(&[("note", "x")])
    ));
    assert!(!carries_unit_marks(
        &u,
        &labels(&[("tier", "a")]),
        &labels(&[])
    ));
    assert!(!carries_unit_marks(
        &u,
        &labels(&[]),
        &labels(&[("note", "x")])
    ));
}

#[test]
fn earlier_units_cost_more_to_delete() {
    let costs: Vec<i32> = (0..3).map(|i| deletion_cost(i, 3)).collect();
    assert_eq!(costs, vec![300, 200, 100]);
}

fn term(pairs: &[(&str, &str, &str)]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(
            pairs
                .iter()
                .map(|(k, op, v)| NodeSelectorRequirement {
                    key: (*k).into(),
                    operator: (*op).into(),
                    values: Some(vec![(*v).into()]),
                })
                .collect(),
        ),
        match_fields: None,
    }
}

#[test]
fn pinning_ors_the_units_and_never_loosens_the_pod() {
    let spec = seed_policy();
    let vnodes = VirtualNodes::default();
    let units: Vec<&Unit> = spec.units.iter().collect();
    let terms = pin_terms(&units, &vnodes, &[]);
    assert_eq!(
        terms,
        vec![
            term(&[
                ("paidtype", "In", "subscription"),
                ("k8s.aliyun.com/vnode", "NotIn", "true")
            ]),
            term(&[
                ("paidtype", "In", "pay-as-you-go"),
                ("k8s.aliyun.com/vnode", "NotIn", "true")
            ]),
            term(&[("k8s.aliyun.com/vnode", "In", "true")]),
        ]
    );
    // The pod asked for zone a or zone b: each of its terms is ANDed with each unit's.
    let existing = [term(&[("zone", "In", "a")]), term(&[("zone", "In", "b")])];
    let terms = pin_terms(&units[2..], &vnodes, &existing);
    assert_eq!(
        terms,
        vec![
            term(&[("zone", "In", "a"), ("k8s.aliyun.com/vnode", "In", "true")]),
            term(&[("zone", "In", "b"), ("k8s.aliyun.com/vnode", "In", "true")]),
        ]
    );
}

#[test]
fn fitting_compares_what_is_left() {
    let allocatable = requests(&[("cpu", "2"), ("memory", "4Gi"), ("pods", "110")]);
    let cases = [
        (
            requests(&[]),
            requests(&[("cpu", "2"), ("pods", "1")]),
            true,
        ),
        (requests(&[("cpu", "1")]), requests(&[("cpu", "2")]), false),
        (
            requests(&[("cpu", "1500m")]),
            requests(&[("cpu", "500m")]),
            true,
        ),
        (requests(&[]), requests(&[("nvidia.com/gpu", "1")]), false),
        (requests(&[]), requests(&[("nvidia.com/gpu", "0")]), true),
    ];
    for (requested, asked, want) in cases {
        assert_eq!(
            fits(&allocatable, &requested, &asked),
            want,
            "{requested:?} + {asked:?}"
        );
    }
}
