//! Engine tests: every policy, ties, both modes, defaults, invalid Selectors, the seeds' examples.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::crd::Selector;
use super::engine::{
    Capacity, Decision, Input, PENDING_EFFECT_ANNOTATION, POLICY_ANNOTATION, Resources, Rule,
    SELECTOR_ANNOTATION, Scope, Vnode, decide, default_rules, pending_effect_patch, pod_requests,
    rule_from_selector, rules_from_profile,
};
use crate::quantity::Quantity;

#[allow(clippy::needless_pass_by_value)] // json! borrows
fn mk_pod(namespace: &str, labels: Value, spec: Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "app", "image": "nginx"}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": namespace, "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

#[allow(clippy::needless_pass_by_value)] // json! borrows
fn mk_selector(name: &str, created: &str, spec: Value) -> Selector {
    serde_json::from_value(json!({
        "apiVersion": "eci.aliyun.com/v1",
        "kind": "Selector",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": spec,
    }))
    .unwrap()
}

fn rule(spec: Value) -> Rule {
    rule_from_selector(&mk_selector("s", "2026-01-01T00:00:00Z", spec)).unwrap()
}

struct World {
    namespace_labels: BTreeMap<String, String>,
    selectors: Vec<Rule>,
    profile: Vec<Rule>,
    capacity: Capacity,
    scope: Scope,
}

impl World {
    fn new(selectors: Vec<Rule>) -> Self {
        Self {
            namespace_labels: BTreeMap::new(),
            selectors,
            profile: default_rules(),
            capacity: Capacity::default(),
            scope: Scope::Namespaced {
                home: "kube-system".into(),
            },
        }
    }

    fn decide(&self, pod: &Pod) -> Decision {
        decide(Input {
            pod,
            namespace_labels: &self.namespace_labels,
            selectors: &self.selectors,
            profile: &self.profile,
            capacity: &self.capacity,
            vnode: &Vnode::default(),
            scope: &self.scope,
        })
    }
}

fn q(text: &str) -> Quantity {
    Quantity::parse(text).unwrap()
}

fn view(pod: &Pod) -> Value {
    serde_json::to_value(pod).unwrap()
}

const TOLERATION: &str =
    r#"{"effect":"NoSchedule","key":"k8s.aliyun.com/vnode","operator":"Equal","value":"true"}"#;

fn toleration() -> Value {
    serde_json::from_str(TOLERATION).unwrap()
}

fn nginx() -> Pod {
    mk_pod("default", json!({"app": "nginx"}), json!({}))
}

#[test]
fn virtual_node_only_adds_toleration_and_one_node_selector_key_and_overwrites() {
    let world = World::new(vec![rule(json!({
        "objectLabels": {"matchLabels": {"app": "nginx"}},
        "effect": {"labels": {"tier": "eci"}, "annotations": {"k8s.aliyun.com/eci-use-specs": "2-4Gi"}},
        "policy": {"virtualNodeOnly": {}},
    }))]);
    let pod = mk_pod(
        "default",
        json!({"app": "nginx", "tier": "web"}),
        json!({"nodeSelector": {"disk": "ssd"}}),
    );
    let decision = world.decide(&pod);
    let out = view(&decision.pod);
    assert_eq!(out["spec"]["tolerations"], json!([toleration()]));
    assert_eq!(
        out["spec"]["nodeSelector"],
        json!({"disk": "ssd", "k8s.aliyun.com/vnode": "true"}),
        "other keys stay"
    );
    assert_eq!(
        out["metadata"]["labels"]["tier"], "eci",
        "Selector values overwrite"
    );
    assert_eq!(
        out["metadata"]["annotations"]["k8s.aliyun.com/eci-use-specs"],
        "2-4Gi"
    );
    assert_eq!(
        out["metadata"]["annotations"][SELECTOR_ANNOTATION],
        "default/s"
    );
    assert!(decision.reason.contains("virtualNodeOnly"));
}

#[test]
fn an_existing_toleration_is_not_duplicated() {
    let world = World::new(vec![rule(
        json!({"objectLabels": {}, "policy": {"fair": {}}}),
    )]);
    for existing in [
        toleration(),
        json!({"key": "k8s.aliyun.com/vnode", "operator": "Exists"}),
        json!({"operator": "Exists"}),
        json!({"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true"}),
    ] {
        let pod = mk_pod(
            "default",
            json!({}),
            json!({"tolerations": [existing.clone()]}),
        );
        let out = view(&world.decide(&pod).pod);
        assert_eq!(out["spec"]["tolerations"], json!([existing]), "{existing}");
    }
    let other = json!({"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "false"});
    let pod = mk_pod("default", json!({}), json!({"tolerations": [&other]}));
    let out = view(&world.decide(&pod).pod);
    assert_eq!(out["spec"]["tolerations"], json!([other, toleration()]));
}

#[test]
fn fair_adds_the_toleration_and_defers_the_effect_to_binding() {
    let world = World::new(vec![rule(json!({
        "objectLabels": {"matchLabels": {"app": "nginx"}},
        "effect": {"labels": {"eci-schedulable": "true"}, "annotations": {"k8s.aliyun.com/eci-auto-imc": "true"}},
        "policy": {"fair": {}},
    }))]);
    let decision = world.decide(&nginx());
    let out = view(&decision.pod);
    assert_eq!(out["spec"]["tolerations"], json!([toleration()]));
    assert!(out["spec"].get("nodeSelector").is_none());
    assert!(
        out["metadata"]["labels"].get("eci-schedulable").is_none(),
        "not before binding"
    );
    let pending: Value = serde_json::from_str(
        out["metadata"]["annotations"][PENDING_EFFECT_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(pending["labels"]["eci-schedulable"], "true");

    let patch = pending_effect_patch(&decision.pod).unwrap();
    assert_eq!(
        patch["metadata"]["labels"],
        json!({"eci-schedulable": "true"})
    );
    assert_eq!(
        patch["metadata"]["annotations"],
        json!({"k8s.aliyun.com/eci-auto-imc": "true", PENDING_EFFECT_ANNOTATION: null})
    );
    assert!(pending_effect_patch(&nginx()).is_none());
}

#[test]
fn normal_node_only_requires_non_virtual_nodes_in_every_term() {
    let world = World::new(vec![rule(
        json!({"objectLabels": {}, "policy": {"normalNodeOnly": {}}}),
    )]);
    let pod = mk_pod(
        "default",
        json!({}),
        json!({
            "tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            ]}}},
        }),
    );
    let out = view(&world.decide(&pod).pod);
    let terms = &out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(terms.as_array().unwrap().len(), 2);
    for term in terms.as_array().unwrap() {
        assert!(
            term["matchExpressions"]
                .as_array()
                .unwrap()
                .contains(&json!(
                    {"key": "k8s.aliyun.com/vnode", "operator": "NotIn", "values": ["true"]}
                ))
        );
    }
    let bare = view(&world.decide(&mk_pod("default", json!({}), json!({}))).pod);
    assert_eq!(
        bare["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "k8s.aliyun.com/vnode", "operator": "NotIn", "values": ["true"]}]}])
    );
}

#[test]
fn normal_node_prefer_prefers_normal_nodes_and_spills_at_the_ratio() {
    let spec = json!({"objectLabels": {}, "policy": {"normalNodePrefer": {"cpuRatio": 80, "memoryRatio": 90}}});
    let mut world = World::new(vec![rule(spec)]);
    world.capacity.normal_allocatable = Resources {
        cpu: q("100"),
        memory: q("1000"),
    };
    world.capacity.normal_requested = Resources {
        cpu: q("79"),
        memory: q("899"),
    };
    let calm = view(&world.decide(&nginx()).pod);
    assert_eq!(
        calm["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        json!([{"weight": 100, "preference": {"matchExpressions": [{"key": "k8s.aliyun.com/vnode", "operator": "NotIn", "values": ["true"]}]}}])
    );
    assert!(
        calm["spec"].get("tolerations").is_none(),
        "below both ratios"
    );
    assert_eq!(
        calm["metadata"]["annotations"][POLICY_ANNOTATION],
        "normalNodePrefer"
    );

    world.capacity.normal_requested.cpu = q("80");
    let busy = view(&world.decide(&nginx()).pod);
    assert_eq!(
        busy["spec"]["tolerations"],
        json!([toleration()]),
        "cpu at the ratio"
    );

    world.capacity.normal_requested = Resources {
        cpu: q("10"),
        memory: q("950"),
    };
    let full = world.decide(&nginx());
    assert_eq!(
        view(&full.pod)["spec"]["tolerations"],
        json!([toleration()]),
        "memory above"
    );
    assert!(full.reason.contains("may use virtual nodes now"));

    let unset = World::new(vec![rule(
        json!({"objectLabels": {}, "policy": {"normalNodePrefer": {}}}),
    )]);
    assert!(
        view(&unset.decide(&nginx()).pod)["spec"]
            .get("tolerations")
            .is_none()
    );
}

#[test]
fn namespace_resource_limit_places_pods_while_the_budget_lasts() {
    let spec = json!({
        "objectLabels": {},
        "policy": {"namespaceResourceLimit": {"namespace": "team-a", "limits": {"cpu": "4", "memory": "8Gi"}}},
    });
    // An administrator's budget: in the daemon's namespace, it reaches team-a.
    let mut world = World::new(vec![selector_in("kube-system", spec)]);
    let pod = mk_pod(
        "team-a",
        json!({}),
        json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}),
    );
    world.capacity.vnode_requested = HashMap::from([(
        "team-a".to_owned(),
        Resources {
            cpu: q("3"),
            memory: q("1e9"),
        },
    )]);
    let within = world.decide(&pod);
    assert_eq!(
        view(&within.pod)["spec"]["nodeSelector"]["k8s.aliyun.com/vnode"],
        "true"
    );
    assert!(within.warning.is_none());

    world.capacity.vnode_requested.insert(
        "team-a".into(),
        Resources {
            cpu: q("3.5"),
            memory: q("1e9"),
        },
    );
    let beyond = world.decide(&pod);
    let out = view(&beyond.pod);
    assert!(out["spec"].get("nodeSelector").is_none());
    assert!(
        out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_object()
    );
    assert!(beyond.warning.unwrap().contains("stays on normal nodes"));

    // Another namespace: the Selector does not apply (the defaults may).
    let elsewhere = mk_pod("team-b", json!({}), json!({}));
    assert_eq!(world.decide(&elsewhere).pod, elsewhere);
}

#[test]
fn a_budget_is_compared_exactly() {
    // 100m used and 200m asked is exactly the 300m budget (as floats, 0.1 + 0.2 > 0.3).
    let spec = json!({
        "objectLabels": {},
        "policy": {"namespaceResourceLimit": {"namespace": "team-a", "limits": {"cpu": "300m"}}},
    });
    let mut world = World::new(vec![selector_in("kube-system", spec)]);
    world.capacity.vnode_requested = HashMap::from([(
        "team-a".to_owned(),
        Resources {
            cpu: q("100m"),
            memory: q("0"),
        },
    )]);
    let pod = mk_pod(
        "team-a",
        json!({}),
        json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "200m"}}}]}),
    );
    let decision = world.decide(&pod);
    assert!(decision.warning.is_none(), "{:?}", decision.warning);
    assert_eq!(
        view(&decision.pod)["spec"]["nodeSelector"]["k8s.aliyun.com/vnode"],
        "true"
    );
}

#[test]
fn the_highest_priority_wins_alone_and_ties_are_deterministic() {
    let low = mk_selector(
        "low",
        "2026-01-01T00:00:00Z",
        json!({"objectLabels": {}, "priority": 1, "effect": {"labels": {"from": "low", "low": "1"}}}),
    );
    let high = mk_selector(
        "high",
        "2026-01-03T00:00:00Z",
        json!({"objectLabels": {}, "priority": 5, "effect": {"labels": {"from": "high"}}, "policy": {"fair": {}}}),
    );
    let world = World::new(
        [low, high]
            .iter()
            .map(|s| rule_from_selector(s).unwrap())
            .collect(),
    );
    let decision = world.decide(&nginx());
    let out = view(&decision.pod);
    assert_eq!(
        out["metadata"]["annotations"][SELECTOR_ANNOTATION],
        "default/high"
    );
    assert!(
        out["metadata"]["labels"].get("low").is_none(),
        "effects are not merged"
    );

    let older = mk_selector(
        "zzz",
        "2026-01-01T00:00:00Z",
        json!({"objectLabels": {}, "effect": {"labels": {"from": "older"}}}),
    );
    let newer = mk_selector(
        "aaa",
        "2026-01-02T00:00:00Z",
        json!({"objectLabels": {}, "effect": {"labels": {"from": "newer"}}}),
    );
    for order in [[&older, &newer], [&newer, &older]] {
        let world = World::new(
            order
                .iter()
                .map(|s| rule_from_selector(s).unwrap())
                .collect(),
        );
        assert_eq!(
            view(&world.decide(&nginx()).pod)["metadata"]["labels"]["from"],
            "older"
        );
    }
    let b = mk_selector(
        "b",
        "2026-01-01T00:00:00Z",
        json!({"objectLabels": {}, "effect": {"labels": {"from": "b"}}}),
    );
    let a = mk_selector(
        "a",
        "2026-01-01T00:00:00Z",
        json!({"objectLabels": {}, "effect": {"labels": {"from": "a"}}}),
    );
    for order in [[&a, &b], [&b, &a]] {
        let world = World::new(
            order
                .iter()
                .map(|s| rule_from_selector(s).unwrap())
                .collect(),
        );
        assert_eq!(
            view(&world.decide(&nginx()).pod)["metadata"]["labels"]["from"],
            "a"
        );
    }
}

#[test]
fn both_selectors_must_match_and_no_policy_means_virtual_node_only() {
    let mut world = World::new(vec![rule(json!({
        "objectLabels": {"matchLabels": {"app": "nginx"}},
        "namespaceLabels": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["test", "dev"]}]},
    }))]);
    world.profile.clear();
    assert_eq!(
        world.decide(&nginx()).pod,
        nginx(),
        "namespace does not match"
    );
    world.namespace_labels.insert("env".into(), "dev".into());
    let out = view(&world.decide(&nginx()).pod);
    assert_eq!(out["spec"]["nodeSelector"]["k8s.aliyun.com/vnode"], "true");
    assert_eq!(out["spec"]["tolerations"], json!([toleration()]));
    let other = mk_pod("default", json!({"app": "redis"}), json!({}));
    assert_eq!(world.decide(&other).pod, other, "pod does not match");
}

#[test]
fn invalid_selectors_are_refused_with_the_reason() {
    for (spec, needle) in [
        (
            json!({"policy": {"fair": {}}}),
            "set objectLabels, namespaceLabels or both",
        ),
        (
            json!({"objectLabels": {}, "policy": {"fair": {}, "virtualNodeOnly": {}}}),
            "set exactly one",
        ),
        (
            json!({"objectLabels": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}),
            "unknown operator",
        ),
        (
            json!({"objectLabels": {}, "policy": {"normalNodePrefer": {"cpuRatio": 150}}}),
            "0–100",
        ),
        (
            json!({"objectLabels": {}, "policy": {"namespaceResourceLimit": {"namespace": "a", "limits": {"cpu": "lots"}}}}),
            "not a Kubernetes quantity",
        ),
        (
            json!({"objectLabels": {}, "policy": {"namespaceResourceLimit": {"namespace": "a", "limits": {"pods": "3"}}}}),
            "not supported",
        ),
        (
            json!({"objectLabels": {}, "policy": {"namespaceResourceLimit": {"namespace": "", "limits": {}}}}),
            "namespace is empty",
        ),
    ] {
        let error = rule_from_selector(&mk_selector("bad", "2026-01-01T00:00:00Z", spec.clone()))
            .unwrap_err();
        assert!(error.contains(needle), "{spec}: {error}");
    }
}

#[allow(clippy::needless_pass_by_value)] // json! borrows
fn selector_in(namespace: &str, spec: Value) -> Rule {
    let mut selector = mk_selector("s", "2026-01-01T00:00:00Z", spec);
    selector.metadata.namespace = Some(namespace.into());
    rule_from_selector(&selector).unwrap()
}

#[test]
fn a_selector_reaches_its_own_namespace_and_the_daemons_reaches_all() {
    let namespaced = Scope::Namespaced {
        home: "kube-system".into(),
    };
    // (scope, the Selector's namespace, the pod's namespace, whether it changes the pod)
    let table = [
        (&namespaced, "team-a", "team-a", true),
        (&namespaced, "team-a", "team-b", false),
        (&namespaced, "team-b", "team-a", false),
        (&namespaced, "kube-system", "team-a", true),
        (&namespaced, "kube-system", "kube-system", true),
        (&Scope::Cluster, "team-a", "team-b", true),
        (&Scope::Cluster, "team-a", "team-a", true),
    ];
    for (scope, home_of_selector, pod_namespace, changes) in table {
        let mut world = World::new(vec![selector_in(
            home_of_selector,
            json!({"objectLabels": {}, "effect": {"labels": {"x": "y"}}, "policy": {"virtualNodeOnly": {}}}),
        )]);
        world.profile.clear();
        world.scope = scope.clone();
        let pod = mk_pod(pod_namespace, json!({}), json!({}));
        let decision = world.decide(&pod);
        assert_eq!(
            decision.pod != pod,
            changes,
            "{scope:?}: a Selector in {home_of_selector} on a pod in {pod_namespace}: {}",
            decision.reason
        );
    }
}

#[test]
fn a_foreign_selector_of_higher_priority_does_not_win_over_the_namespaces_own() {
    let mut world = World::new(vec![
        selector_in(
            "team-a",
            json!({"objectLabels": {}, "priority": 100, "effect": {"labels": {"from": "a"}}}),
        ),
        selector_in(
            "team-b",
            json!({"objectLabels": {}, "priority": 1, "effect": {"labels": {"from": "b"}}}),
        ),
    ]);
    world.profile.clear();
    let pod = mk_pod("team-b", json!({}), json!({}));
    let decided = world.decide(&pod).pod;
    assert_eq!(decided.metadata.labels.unwrap()["from"], "b");
}

#[test]
fn configmap_selectors_and_defaults_reach_every_namespace_in_either_scope() {
    let mut world = World::new(Vec::new());
    let pod = mk_pod("team-a", json!({"alibabacloud.com/eci": "true"}), json!({}));
    for scope in [
        Scope::Namespaced {
            home: "kube-system".into(),
        },
        Scope::Cluster,
    ] {
        world.scope = scope;
        assert_ne!(world.decide(&pod).pod, pod, "{:?}", world.scope);
    }
}

fn seed_profile() -> Vec<Rule> {
    let map: Value = serde_saphyr::from_str(include_str!(
        "../../../deploy/examples/eci-profile-configmap.yaml"
    ))
    .unwrap();
    rules_from_profile(map["data"]["selectors"].as_str().unwrap()).unwrap()
}

#[test]
fn the_configmap_samples_place_pods_and_never_overwrite() {
    let mut world = World::new(Vec::new());
    world.profile = seed_profile();
    assert_eq!(world.profile.len(), 3);

    // Sample 1: namespace type=eci AND pod created-by-eci=true.
    let pod = mk_pod("default", json!({"created-by-eci": "true"}), json!({}));
    assert_eq!(world.decide(&pod).pod, pod);
    world.namespace_labels.insert("type".into(), "eci".into());
    let out = view(&world.decide(&pod).pod);
    assert_eq!(out["spec"]["nodeSelector"]["k8s.aliyun.com/vnode"], "true");

    // Samples 2 and 3 both match: the earlier one's spec wins; a pod's own value is kept.
    world.namespace_labels = BTreeMap::from([("gpu".to_owned(), "true".to_owned())]);
    let amd = mk_pod("default", json!({"amd": "true"}), json!({}));
    let out = view(&world.decide(&amd).pod);
    assert_eq!(
        out["metadata"]["annotations"]["k8s.aliyun.com/eci-use-specs"],
        "ecs.gn6v-c8g1.2xlarge"
    );
    let mut own = amd;
    own.metadata.annotations = Some(BTreeMap::from([(
        "k8s.aliyun.com/eci-use-specs".to_owned(),
        "4-8Gi".to_owned(),
    )]));
    let out = view(&world.decide(&own).pod);
    assert_eq!(
        out["metadata"]["annotations"]["k8s.aliyun.com/eci-use-specs"],
        "4-8Gi"
    );
    assert_eq!(out["spec"]["tolerations"], json!([toleration()]));
}

#[test]
fn broken_configmaps_are_explained() {
    assert!(
        rules_from_profile("{")
            .unwrap_err()
            .contains("not a JSON array")
    );
    assert!(
        rules_from_profile(r#"[{"objectSelector": {}}]"#)
            .unwrap_err()
            .contains("#1 has no name")
    );
    assert!(
        rules_from_profile(r#"[{"name": "x"}]"#)
            .unwrap_err()
            .contains("selector x")
    );
}

#[test]
fn the_defaults_place_labelled_pods_and_namespaces() {
    let world = World::new(Vec::new());
    let labelled = mk_pod(
        "default",
        json!({"alibabacloud.com/eci": "true"}),
        json!({}),
    );
    assert_eq!(
        view(&world.decide(&labelled).pod)["spec"]["nodeSelector"]["k8s.aliyun.com/vnode"],
        "true"
    );
    for (key, value) in [
        ("alibabacloud.com/eci", "true"),
        ("virtual-node-affinity-injection", "enabled"),
    ] {
        let mut world = World::new(Vec::new());
        world.namespace_labels.insert(key.into(), value.into());
        assert_eq!(
            view(&world.decide(&nginx()).pod)["spec"]["nodeSelector"]["k8s.aliyun.com/vnode"],
            "true",
            "{key}"
        );
    }
    let mut off = World::new(Vec::new());
    off.profile.clear();
    assert_eq!(
        off.decide(&labelled).pod,
        labelled,
        "defaults can be turned off"
    );
}

#[test]
fn a_selector_wins_over_the_configmap() {
    let mut world = World::new(vec![rule(
        json!({"objectLabels": {"matchLabels": {"amd": "true"}}, "policy": {"normalNodeOnly": {}}}),
    )]);
    world.profile = seed_profile();
    let out = view(
        &world
            .decide(&mk_pod("default", json!({"amd": "true"}), json!({})))
            .pod,
    );
    assert!(out["spec"].get("nodeSelector").is_none());
    assert!(
        out["metadata"]["annotations"]
            .get("k8s.aliyun.com/eci-use-specs")
            .is_none()
    );
}

#[test]
fn nothing_matching_changes_nothing() {
    let mut world = World::new(vec![rule(
        json!({"objectLabels": {"matchLabels": {"app": "db"}}}),
    )]);
    world.profile.clear();
    let decision = world.decide(&nginx());
    assert_eq!(decision.pod, nginx());
    assert_eq!(decision.reason, "no selector matches");
}

#[test]
fn the_seed_examples_are_valid_selectors() {
    for (file, text) in [
        (
            "selector-fair.yaml",
            include_str!("../../../deploy/examples/selector-fair.yaml"),
        ),
        (
            "selector-fair-with-namespace.yaml",
            include_str!("../../../deploy/examples/selector-fair-with-namespace.yaml"),
        ),
        (
            "selector-normal-node-prefer.yaml",
            include_str!("../../../deploy/examples/selector-normal-node-prefer.yaml"),
        ),
        (
            "selector-virtual-node-only.yaml",
            include_str!("../../../deploy/examples/selector-virtual-node-only.yaml"),
        ),
    ] {
        let selector: Selector =
            serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let rule = rule_from_selector(&selector).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(rule.object.is_some(), "{file}");
    }
}

#[test]
fn requests_sum_containers_and_take_the_largest_init_container() {
    let pod = mk_pod(
        "default",
        json!({}),
        json!({
            "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            ],
            "initContainers": [{"name": "i", "image": "i", "resources": {"requests": {"cpu": "4"}}}],
        }),
    );
    let requests = pod_requests(&pod);
    assert_eq!(requests.cpu, q("4"));
    assert_eq!(requests.memory, q("2Gi"));
}
