//! The Selector engine on an arbitrary world: a JSON document with the pod, its namespace's
//! labels, Selector objects (validated into rules as the cache does; invalid ones are left out,
//! as the cache leaves them), the legacy ConfigMap's `selectors` text, the built-in defaults or
//! not, and a capacity view; then `engine::decide`. No input panics, and the answer does not
//! depend on the order the Selectors were listed in (every replica must agree).
//!
//! ```json
//! {"pod": {...}, "namespaceLabels": {"k": "v"}, "selectors": [{"apiVersion": "eci.aliyun.com/v1",
//!  "kind": "Selector", ...}], "profile": "[...]", "defaults": true, "ownNamespaceOnly": false,
//!  "capacity": {"normalAllocatable": {"cpu": "8", "memory": "16Gi"}, "normalRequested": {...},
//!  "vnodeRequested": {"default": {"cpu": "1"}}}}
//! ```

#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vne_core::quantity::Quantity;
use vne_core::selector::crd::Selector;
use vne_core::selector::engine::{
    Capacity, Input, Origin, Resources, Rule, Scope, Vnode, decide, default_rules,
    pending_effect_patch, pod_requests, rule_from_selector, rules_from_profile, tolerates,
};

fn resources(value: &Value) -> Resources {
    let get = |name: &str| {
        value[name]
            .as_str()
            .and_then(|text| Quantity::parse(text).ok())
            .unwrap_or_default()
    };
    Resources {
        cpu: get("cpu"),
        memory: get("memory"),
    }
}

fn capacity(value: &Value) -> Capacity {
    Capacity {
        normal_allocatable: resources(&value["normalAllocatable"]),
        normal_requested: resources(&value["normalRequested"]),
        vnode_requested: value["vnodeRequested"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(namespace, used)| (namespace.clone(), resources(used)))
            .collect::<HashMap<_, _>>(),
    }
}

/// The Selectors' rules as the cache keeps them: valid ones, one per namespace/name.
fn selector_rules(value: &Value) -> Vec<Rule> {
    let mut seen = BTreeSet::new();
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|object| serde_json::from_value::<Selector>(object.clone()).ok())
        .filter_map(|selector| rule_from_selector(&selector).ok())
        .filter(|rule| match &rule.origin {
            Origin::Crd {
                namespace, name, ..
            } => seen.insert((namespace.clone(), name.clone())),
            _ => true,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(world) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(pod) = serde_json::from_value::<Pod>(world["pod"].clone()) else {
        return;
    };
    let namespace_labels: BTreeMap<String, String> =
        serde_json::from_value(world["namespaceLabels"].clone()).unwrap_or_default();
    let selectors = selector_rules(&world["selectors"]);
    let mut profile = world["profile"]
        .as_str()
        .and_then(|text| rules_from_profile(text).ok())
        .unwrap_or_default();
    if world["defaults"].as_bool().unwrap_or(true) {
        profile.extend(default_rules());
    }
    let capacity = capacity(&world["capacity"]);
    let vnode = Vnode::default();
    // ownNamespaceOnly (the seeds' name): the namespaced scope with no Selector in the home.
    let scope = if world["ownNamespaceOnly"].as_bool().unwrap_or(false) {
        Scope::Namespaced {
            home: "kube-system".into(),
        }
    } else {
        Scope::Cluster
    };
    let input = Input {
        pod: &pod,
        namespace_labels: &namespace_labels,
        selectors: &selectors,
        profile: &profile,
        capacity: &capacity,
        vnode: &vnode,
        scope: &scope,
    };
    let decision = decide(input);

    let reversed: Vec<Rule> = selectors.iter().rev().cloned().collect();
    let again = decide(Input {
        selectors: &reversed,
        ..input
    });
    assert_eq!(again, decision, "the Selectors' order changed the decision");

    // What the daemon does with the mutated pod later: its pending effect, its toleration, its
    // requests for the namespace budget.
    let _ = pending_effect_patch(&decision.pod);
    let _ = tolerates(&decision.pod, &vnode);
    let _ = pod_requests(&decision.pod);
    // The mutated pod is still a pod.
    let written = serde_json::to_value(&decision.pod).expect("the pod serializes");
    let _: Pod = serde_json::from_value(written).expect("the mutated pod reads back");
});
