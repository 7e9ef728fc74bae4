//! A pod's resource requests as the scheduler counts them: the containers summed, each init
//! container's raise taken when larger, native sidecars (init containers with
//! `restartPolicy: Always`) added to the containers and to every init container after them,
//! the pod overhead added; limits stand in for missing requests (the API server defaults them
//! so).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use crate::quantity::Quantity;

/// Requests by resource name (`cpu`, `memory`, extended resources).
pub type Requests = BTreeMap<String, Quantity>;

fn of(resources: Option<&ResourceRequirements>) -> Requests {
    let mut out = Requests::new();
    let Some(resources) = resources else {
        return out;
    };
    for (name, quantity) in resources.limits.iter().flatten() {
        out.insert(name.clone(), parse(&quantity.0));
    }
    for (name, quantity) in resources.requests.iter().flatten() {
        out.insert(name.clone(), parse(&quantity.0));
    }
    out
}

/// Unparseable or negative amounts count as nothing (the API server refuses such pods).
fn parse(text: &str) -> Quantity {
    Quantity::parse(text)
        .ok()
        .filter(|q| !q.is_negative())
        .unwrap_or_default()
}

/// Adds `more` into `sum`.
pub fn add(sum: &mut Requests, more: &Requests) {
    for (name, quantity) in more {
        *sum.entry(name.clone()).or_default() += *quantity;
    }
}

/// The pod's effective requests.
pub fn pod_requests(pod: &Pod) -> Requests {
    let Some(spec) = &pod.spec else {
        return Requests::new();
    };
    let mut sum = Requests::new();
    for container in &spec.containers {
        add(&mut sum, &of(container.resources.as_ref()));
    }
    // Sidecars run beside whatever starts after them: each init container after one needs its
    // own requests plus theirs, and the containers need theirs on top.
    let (mut sidecars, mut init_peak) = (Requests::new(), Requests::new());
    for init in spec.init_containers.iter().flatten() {
        let own = of(init.resources.as_ref());
        let mut needs = sidecars.clone();
        add(&mut needs, &own);
        if init.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &own);
        }
        for (name, quantity) in needs {
            let entry = init_peak.entry(name).or_default();
            *entry = (*entry).max(quantity);
        }
    }
    add(&mut sum, &sidecars);
    for (name, quantity) in init_peak {
        let entry = sum.entry(name).or_default();
        *entry = (*entry).max(quantity);
    }
    for (name, quantity) in spec.overhead.iter().flatten() {
        *sum.entry(name.clone()).or_default() += parse(&quantity.0);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    #[test]
    fn containers_sum_init_containers_raise_overhead_adds() {
        let cases = [
            (
                "two containers",
                serde_json::json!({"spec": {"containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "200m"}}},
                ]}}),
                vec![("cpu", "300m"), ("memory", "1Gi")],
            ),
            (
                "limits stand in for requests",
                serde_json::json!({"spec": {"containers": [
                    {"name": "a", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}},
                ]}}),
                vec![("cpu", "2"), ("nvidia.com/gpu", "1")],
            ),
            (
                "a larger init container raises",
                serde_json::json!({"spec": {
                    "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3"}}}],
                    "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                }}),
                vec![("cpu", "3"), ("memory", "1Gi")],
            ),
            (
                "sidecars add to the containers and to the init containers after them",
                serde_json::json!({"spec": {
                    "initContainers": [
                        {"name": "early", "resources": {"requests": {"cpu": "2"}}},
                        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                        {"name": "late", "resources": {"requests": {"cpu": "3"}}},
                    ],
                    "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                }}),
                // cpu: max(2, 0.5 + 3, 1 + 0.5); memory: 1Gi + 256Mi.
                vec![("cpu", "3500m"), ("memory", "1280Mi")],
            ),
            (
                "overhead adds",
                serde_json::json!({"spec": {
                    "overhead": {"cpu": "250m"},
                    "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
                }}),
                vec![("cpu", "1250m")],
            ),
            (
                "nothing asked",
                serde_json::json!({"spec": {"containers": [{"name": "a"}]}}),
                vec![],
            ),
        ];
        for (name, value, want) in cases {
            let want: Requests = want.into_iter().map(|(k, v)| (k.into(), q(v))).collect();
            assert_eq!(pod_requests(&pod(value)), want, "{name}");
        }
    }
}
