//! The virtual Node as data: its labels, taint, status and conditions, and how to adopt an
//! existing Node without stripping what others put there. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Value, json};

use crate::config::{NodeArgs, WithSite};
use crate::eci::misconfig::Misconfiguration;
use crate::node::eci_health::EciHealth;

/// The label (and taint key) of virtual nodes that eci-profile targets.
pub const VNODE_LABEL: &str = "k8s.aliyun.com/vnode";
/// Annotation recording which labels and taints this daemon manages, so a configuration
/// change removes our old ones and never anyone else's.
pub const MANAGED_ANNOTATION: &str = "virtual-node-eci.aliyun.com/managed";
/// Annotation: this node was cordoned by its own decommission (value: when). A replica that
/// serves the node again lifts that cordon — and only that one, never an admin's.
pub const DECOMMISSION_ANNOTATION: &str = "virtual-node-eci.aliyun.com/decommissioning";
/// The Kubernetes version we present ourselves as until the control plane's is known.
pub const KUBERNETES_COMPAT: &str = "v1.33.0";

pub use crate::k8s::rfc3339;

/// The node's `kubeletVersion` before the control plane's version is known: the Kubernetes
/// version we are compatible with, then what we are.
pub fn kubelet_version() -> String {
    format!(
        "{KUBERNETES_COMPAT}-virtual-node-eci-{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The node's `kubeletVersion` under a control plane whose `/version` says `git_version`: its
/// `vMAJOR.MINOR.PATCH` (a vendor's suffix dropped), then what we are — as ack-virtual-node
/// does, so version-skew checks (kubectl, upgrade tools, conformance dashboards) see a kubelet
/// of the control plane's own minor. `None` when `git_version` is not such a version.
pub fn kubelet_version_for(git_version: &str) -> Option<String> {
    let core = git_version.strip_prefix('v')?;
    let core = core.split(['-', '+']).next()?;
    let parts: Vec<&str> = core.split('.').collect();
    let [major, minor, patch] = parts.as_slice() else {
        return None;
    };
    let number = |part: &str| part.parse::<u32>().ok();
    let (major, minor, patch) = (number(major)?, number(minor)?, number(patch)?);
    Some(format!(
        "v{major}.{minor}.{patch}-virtual-node-eci-{}",
        env!("CARGO_PKG_VERSION")
    ))
}

fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Our labels: the administrator's extra ones (`NODE_LABELS`), then the daemon's own.
pub fn desired_labels(config: &WithSite<NodeArgs>) -> BTreeMap<String, String> {
    let mut labels = config.site.node_labels.clone();
    for (key, value) in [
        (VNODE_LABEL, "true"),
        ("type", "virtual-kubelet"),
        ("kubernetes.io/role", "agent"),
        ("kubernetes.io/hostname", config.site.node_name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", architecture()),
        (
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "true",
        ),
        ("topology.kubernetes.io/region", config.site.region.as_str()),
    ] {
        labels.insert(key.to_owned(), value.to_owned());
    }
    if let Some(zone) = &config.site.zone {
        labels.insert("topology.kubernetes.io/zone".to_owned(), zone.to_owned());
    }
    labels
}

/// Our taint.
pub fn desired_taint(config: &WithSite<NodeArgs>) -> Taint {
    Taint {
        key: config.site.taint_key.clone(),
        value: Some(config.site.taint_value.clone()),
        effect: config.site.taint_effect.as_str().to_owned(),
        time_added: None,
    }
}

fn managed_record(config: &WithSite<NodeArgs>) -> String {
    json!({"labels": desired_labels(config).keys().collect::<Vec<_>>(), "taints": [config.site.taint_key]}).to_string()
}

/// A Node to create when none exists.
pub fn new_node(config: &WithSite<NodeArgs>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.site.node_name,
            "labels": desired_labels(config),
            "annotations": {MANAGED_ANNOTATION: managed_record(config)},
        },
        "spec": {"taints": [taint_json(&desired_taint(config))]},
    })
}

fn taint_json(taint: &Taint) -> Value {
    serde_json::to_value(taint).unwrap_or_default()
}

/// The JSON merge patch that makes an existing Node ours — our labels and taint set, labels
/// and taints we managed before but no longer want removed, everything else (other labels,
/// annotations, `spec.unschedulable`, other taints) untouched — or `None` when it already is.
/// The patch carries the Node's resourceVersion, so a concurrent change is a conflict, not a
/// lost update.
pub fn adoption_patch(existing: &Node, config: &WithSite<NodeArgs>) -> Option<Value> {
    let labels = existing.metadata.labels.clone().unwrap_or_default();
    let annotations = existing.metadata.annotations.clone().unwrap_or_default();
    let previously: Value = annotations
        .get(MANAGED_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_else(|| json!({}));
    let list = |field: &str| -> BTreeSet<String> {
        previously
            .get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let desired = desired_labels(config);

    let mut label_patch = serde_json::Map::new();
    for (key, value) in &desired {
        if labels.get(key) != Some(value) {
            label_patch.insert(key.clone(), Value::String(value.clone()));
        }
    }
    for stale in list("labels")
        .iter()
        .filter(|key| !desired.contains_key(*key) && labels.contains_key(*key))
    {
        label_patch.insert(stale.clone(), Value::Null);
    }

    let ours = desired_taint(config);
    let mut our_keys = list("taints");
    our_keys.insert(ours.key.clone());
    let current_taints = existing
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.clone())
        .unwrap_or_default();
    let mut taints: Vec<Taint> = current_taints
        .iter()
        .filter(|taint| !our_keys.contains(&taint.key))
        .cloned()
        .collect();
    taints.push(ours);
    let taints_changed = !same_taints(&taints, &current_taints);

    let record = managed_record(config);
    let annotation_changed = annotations.get(MANAGED_ANNOTATION) != Some(&record);
    // A decommission that did not finish left its cordon; serving the node again lifts it.
    let lift_cordon = annotations.contains_key(DECOMMISSION_ANNOTATION);
    if label_patch.is_empty() && !taints_changed && !annotation_changed && !lift_cordon {
        return None;
    }
    let mut patch = json!({"metadata": {"resourceVersion": existing.metadata.resource_version}});
    if !label_patch.is_empty() {
        patch["metadata"]["labels"] = Value::Object(label_patch);
    }
    if annotation_changed {
        patch["metadata"]["annotations"][MANAGED_ANNOTATION] = Value::String(record);
    }
    if taints_changed {
        patch["spec"]["taints"] = taints.iter().map(taint_json).collect();
    }
    if lift_cordon {
        patch["metadata"]["annotations"][DECOMMISSION_ANNOTATION] = Value::Null;
        patch["spec"]["unschedulable"] = Value::Null;
    }
    Some(patch)
}

fn same_taints(a: &[Taint], b: &[Taint]) -> bool {
    let key = |t: &Taint| (t.key.clone(), t.value.clone(), t.effect.clone());
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": message})
}

/// Type of the node condition that says whether ECI refuses this daemon's configuration.
/// Abnormal-true, like the kubelet's pressure conditions and node-problem-detector's.
pub const MISCONFIGURED_CONDITION: &str = "EciMisconfigured";

/// The misconfiguration condition: True with the service's code and the fix, or False.
fn misconfiguration_condition(misconfigured: Option<&Misconfiguration>) -> Value {
    match misconfigured {
        Some(found) => condition(
            MISCONFIGURED_CONDITION,
            "True",
            found.problem.reason(),
            &format!(
                "{}; new pods are kept off this node (taint {}) until a call succeeds",
                found.describe(),
                MISCONFIGURED_TAINT
            ),
        ),
        None => condition(
            MISCONFIGURED_CONDITION,
            "False",
            "EciConfigured",
            "ECI accepts this daemon's credentials, permissions, clock and account",
        ),
    }
}

/// The taint that keeps new pods off the node while ECI refuses its configuration.
pub const MISCONFIGURED_TAINT: &str = "virtual-node.eci/misconfigured";

/// The node's taints with [`MISCONFIGURED_TAINT`] added (`misconfigured`) or removed, the
/// others kept in order — or `None` when they already are so.
pub fn misconfigured_taints(current: &[Taint], misconfigured: bool) -> Option<Vec<Taint>> {
    let has = current.iter().any(|t| t.key == MISCONFIGURED_TAINT);
    if has == misconfigured {
        return None;
    }
    let mut taints: Vec<Taint> = current
        .iter()
        .filter(|t| t.key != MISCONFIGURED_TAINT)
        .cloned()
        .collect();
    if misconfigured {
        taints.push(Taint {
            key: MISCONFIGURED_TAINT.to_owned(),
            value: None,
            // NoSchedule, not NoExecute: the pods already running keep running — their
            // groups are fine, only new calls are refused.
            effect: "NoSchedule".to_owned(),
            time_added: None,
        });
    }
    Some(taints)
}

/// The node conditions for a health and a misconfiguration.
pub fn conditions(
    config: &WithSite<NodeArgs>,
    health: &EciHealth,
    misconfigured: Option<&Misconfiguration>,
) -> Vec<Value> {
    let region = &config.site.region;
    let ready = match health {
        EciHealth::Reachable => condition(
            "Ready",
            "True",
            "EciReachable",
            &format!("virtual-node-eci is ready: the ECI API in {region} answers"),
        ),
        EciHealth::Unknown => condition(
            "Ready",
            "Unknown",
            "EciNotProbed",
            "virtual-node-eci has not reached the ECI API yet",
        ),
        EciHealth::Unreachable { since, error } => condition(
            "Ready",
            "False",
            "EciUnreachable",
            &format!(
                "the ECI API in {region} has failed every call since {}: {error}",
                rfc3339(*since)
            ),
        ),
    };
    vec![
        ready,
        condition(
            "MemoryPressure",
            "False",
            "EciHasSufficientMemory",
            "ECI allocates memory per container group",
        ),
        condition(
            "DiskPressure",
            "False",
            "EciHasNoDiskPressure",
            "ECI allocates storage per container group",
        ),
        condition(
            "PIDPressure",
            "False",
            "EciHasSufficientPID",
            "ECI allocates PIDs per container group",
        ),
        condition(
            "NetworkUnavailable",
            "False",
            "EciNetworkReady",
            "container groups get their IPs from the configured vSwitches",
        ),
        misconfiguration_condition(misconfigured),
    ]
}

/// The whole node status: conditions (keeping the transition times of unchanged ones from
/// `previous`), capacity, allocatable, addresses, endpoints and nodeInfo.
pub fn status(
    config: &WithSite<NodeArgs>,
    health: &EciHealth,
    misconfigured: Option<&Misconfiguration>,
    previous: Option<&Value>,
    now: SystemTime,
    kubelet_version: &str,
) -> Value {
    let now_text = rfc3339(now);
    let previous_conditions = previous
        .and_then(|status| status.get("conditions"))
        .and_then(Value::as_array);
    let conditions: Vec<Value> = conditions(config, health, misconfigured)
        .into_iter()
        .map(|mut condition| {
            let before = previous_conditions
                .and_then(|list| list.iter().find(|c| c.get("type") == condition.get("type")));
            let transition = match before {
                Some(before) if before.get("status") == condition.get("status") => before
                    .get("lastTransitionTime")
                    .cloned()
                    .unwrap_or_else(|| Value::String(now_text.clone())),
                _ => Value::String(now_text.clone()),
            };
            condition["lastHeartbeatTime"] = Value::String(now_text.clone());
            condition["lastTransitionTime"] = transition;
            condition
        })
        .collect();
    let resources = json!({
        "cpu": config.args.quota_cpu,
        "memory": config.args.quota_memory,
        "pods": config.args.quota_pods.to_string(),
        "ephemeral-storage": config.args.quota_ephemeral_storage,
    });
    json!({
        "conditions": conditions,
        "capacity": resources,
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": config.site.internal_ip.to_string()},
            {"type": "Hostname", "address": config.site.node_name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": config.site.kubelet_port}},
        "nodeInfo": {
            "machineID": config.site.node_name,
            "systemUUID": config.site.node_name,
            "bootID": "",
            "kernelVersion": "",
            "osImage": "Alibaba Cloud Elastic Container Instance",
            "containerRuntimeVersion": "eci://2018-08-08",
            "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": architecture(),
        },
    })
}

/// A status without its heartbeat times: two statuses with the same fingerprint need no write.
pub fn fingerprint(status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for condition in conditions {
            if let Some(condition) = condition.as_object_mut() {
                condition.remove("lastHeartbeatTime");
                condition.remove("lastTransitionTime");
            }
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Config;

    fn mk_config(args: &[&str]) -> WithSite<NodeArgs> {
        let mut all = vec![
            "virtual-node-eci",
            "--pod-name",
            "virtual-node-eci-1",
            "--pod-ip",
            "10.1.2.3",
            "--eci=embedded",
            "--vswitch=vsw-test",
            "--security-group=sg-test",
            "--cluster-name=c",
        ];
        all.extend_from_slice(args);
        let settings = Config::parse_from(all).settings().unwrap();
        settings.with_site(&settings.config.node)
    }

    fn mk_node(value: Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_new_node_carries_our_labels_and_taint() {
        let node = new_node(&mk_config(&["--zone", "cn-hangzhou-k"]));
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels["k8s.aliyun.com/vnode"], "true");
        assert_eq!(labels["type"], "virtual-kubelet");
        assert_eq!(labels["kubernetes.io/role"], "agent");
        assert_eq!(labels["kubernetes.io/hostname"], "virtual-node-eci-1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(
            labels["node.kubernetes.io/exclude-from-external-load-balancers"],
            "true"
        );
        assert_eq!(labels["topology.kubernetes.io/region"], "cn-hangzhou");
        assert_eq!(labels["topology.kubernetes.io/zone"], "cn-hangzhou-k");
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "k8s.aliyun.com/vnode", "value": "true", "effect": "NoSchedule"}])
        );
        assert!(
            new_node(&mk_config(&[]))["metadata"]["labels"]
                .get("topology.kubernetes.io/zone")
                .is_none()
        );
    }

    #[test]
    fn the_administrators_labels_join_ours_and_leave_with_the_setting() {
        let config = mk_config(&["--node-labels", "team=platform,node.kubernetes.io/pool=eci"]);
        let node = new_node(&config);
        assert_eq!(node["metadata"]["labels"]["team"], "platform");
        assert_eq!(node["metadata"]["labels"]["node.kubernetes.io/pool"], "eci");
        // Dropped from the setting: the adoption patch removes it (it is in the managed record).
        let mut existing = node;
        existing["metadata"]["annotations"][MANAGED_ANNOTATION] = json!(managed_record(&config));
        let patch = adoption_patch(&mk_node(existing), &mk_config(&[])).unwrap();
        assert_eq!(
            patch["metadata"]["labels"],
            json!({"team": null, "node.kubernetes.io/pool": null})
        );
    }

    #[test]
    fn no_extra_label_can_override_ours() {
        // Every label the daemon sets is either reserved (refused by NODE_LABELS' parser) or
        // named in the list the parser refuses by name: the two cannot drift apart.
        for key in desired_labels(&mk_config(&["--zone", "z"])).keys() {
            assert!(
                crate::config::is_reserved_label(key)
                    || crate::config::NODE_LABELS_SET_BY_DAEMON.contains(&key.as_str()),
                "{key} could be overridden through NODE_LABELS"
            );
        }
    }

    #[test]
    fn taint_follows_the_virtual_kubelet_variables() {
        let node = new_node(&mk_config(&[
            "--taint-key",
            "virtual-kubelet.io/provider",
            "--taint-value",
            "eci",
            "--taint-effect",
            "NoExecute",
        ]));
        assert_eq!(
            node["spec"]["taints"][0],
            json!({"key": "virtual-kubelet.io/provider", "value": "eci", "effect": "NoExecute"})
        );
    }

    #[test]
    fn adoption_lifts_only_the_cordon_of_an_unfinished_decommission() {
        let config = mk_config(&[]);
        let mut existing = new_node(&config);
        existing["metadata"]["annotations"][MANAGED_ANNOTATION] = json!(managed_record(&config));
        existing["spec"]["unschedulable"] = json!(true);
        assert_eq!(
            adoption_patch(&mk_node(existing.clone()), &config),
            None,
            "an admin's cordon stays"
        );
        existing["metadata"]["annotations"][DECOMMISSION_ANNOTATION] =
            json!("2026-11-21T00:00:00Z");
        let patch = adoption_patch(&mk_node(existing), &config).unwrap();
        assert_eq!(patch["spec"], json!({"unschedulable": null}));
        assert_eq!(
            patch["metadata"]["annotations"],
            json!({DECOMMISSION_ANNOTATION: null})
        );
    }

    #[test]
    fn adoption_keeps_what_others_put_there() {
        let config = mk_config(&[]);
        let mut existing = new_node(&config);
        existing["metadata"]["resourceVersion"] = json!("42");
        existing["metadata"]["labels"]["team"] = json!("payments");
        existing["metadata"]["annotations"]["note"] = json!("by hand");
        existing["spec"]["unschedulable"] = json!(true);
        existing["spec"]["taints"] = json!([
            {"key": "k8s.aliyun.com/vnode", "value": "true", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
        ]);
        assert_eq!(
            adoption_patch(&mk_node(existing.clone()), &config),
            None,
            "nothing to do"
        );

        // Someone removed our label and taint: they come back, the rest stays.
        existing["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("type");
        existing["spec"]["taints"].as_array_mut().unwrap().remove(0);
        let patch = adoption_patch(&mk_node(existing), &config).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(
            patch["metadata"]["labels"],
            json!({"type": "virtual-kubelet"})
        );
        let taints = patch["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 3);
        assert!(
            taints
                .iter()
                .any(|t| t["key"] == "node.kubernetes.io/unreachable")
        );
        assert!(
            patch["spec"].get("unschedulable").is_none(),
            "a cordon is never touched"
        );
    }

    #[test]
    fn a_changed_configuration_replaces_our_old_taint_and_labels_only() {
        let old = mk_config(&["--zone", "cn-hangzhou-k"]);
        let mut existing = new_node(&old);
        existing["metadata"]["resourceVersion"] = json!("7");
        existing["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}));
        let new = mk_config(&["--taint-effect", "NoExecute"]);
        let patch = adoption_patch(&mk_node(existing), &new).unwrap();
        assert_eq!(
            patch["metadata"]["labels"]["topology.kubernetes.io/zone"],
            Value::Null,
            "our old zone label goes"
        );
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, {"key": "k8s.aliyun.com/vnode", "value": "true", "effect": "NoExecute"}])
        );
    }

    #[test]
    fn status_has_capacity_addresses_and_conditions() {
        let config = mk_config(&["--quota-pods", "100", "--kubelet-port", "11250"]);
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let status = status(
            &config,
            &EciHealth::Reachable,
            None,
            None,
            now,
            &kubelet_version(),
        );
        assert_eq!(
            status["capacity"],
            json!({"cpu": "6000", "memory": "12Ti", "pods": "100", "ephemeral-storage": "90Ti"})
        );
        assert_eq!(status["allocatable"], status["capacity"]);
        assert_eq!(
            status["addresses"][0],
            json!({"type": "InternalIP", "address": "10.1.2.3"})
        );
        assert_eq!(
            status["addresses"][1],
            json!({"type": "Hostname", "address": "virtual-node-eci-1"})
        );
        assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 11250);
        assert!(
            status["nodeInfo"]["kubeletVersion"]
                .as_str()
                .unwrap()
                .starts_with("v1.33.0-virtual-node-eci-")
        );
        let ready = &status["conditions"][0];
        assert_eq!(
            (
                ready["type"].as_str(),
                ready["status"].as_str(),
                ready["reason"].as_str()
            ),
            (Some("Ready"), Some("True"), Some("EciReachable"))
        );
        let pressure: Vec<&str> = status["conditions"].as_array().unwrap()[1..]
            .iter()
            .map(|c| c["status"].as_str().unwrap())
            .collect();
        assert_eq!(pressure, vec!["False"; 5]);
        assert_eq!(status["conditions"][5]["type"], MISCONFIGURED_CONDITION);
    }

    #[test]
    fn transitions_keep_their_time_and_heartbeats_do_not_count_as_changes() {
        let config = mk_config(&[]);
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let t1 = t0 + std::time::Duration::from_secs(60);
        let version = kubelet_version();
        let first = status(&config, &EciHealth::Reachable, None, None, t0, &version);
        let second = status(
            &config,
            &EciHealth::Reachable,
            None,
            Some(&first),
            t1,
            &version,
        );
        assert_eq!(second["conditions"][0]["lastTransitionTime"], rfc3339(t0));
        assert_eq!(second["conditions"][0]["lastHeartbeatTime"], rfc3339(t1));
        assert_eq!(fingerprint(&first), fingerprint(&second));

        let down = EciHealth::Unreachable {
            since: t0,
            error: "connection refused".into(),
        };
        let third = status(&config, &down, None, Some(&second), t1, &version);
        assert_eq!(third["conditions"][0]["status"], "False");
        assert_eq!(third["conditions"][0]["reason"], "EciUnreachable");
        assert!(
            third["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("connection refused")
        );
        assert_eq!(third["conditions"][0]["lastTransitionTime"], rfc3339(t1));
        assert_ne!(fingerprint(&second), fingerprint(&third));
    }

    #[test]
    fn a_misconfiguration_is_a_condition_and_a_taint() {
        use crate::eci::misconfig::{Problem, misconfiguration};
        let found = misconfiguration(
            "CreateContainerGroup",
            &eci_proto::EciError::new("Forbidden.RAM", "User not authorized"),
        )
        .unwrap();
        assert_eq!(found.problem, Problem::Permission);
        let config = mk_config(&[]);
        let conditions = conditions(&config, &EciHealth::Reachable, Some(&found));
        let ours = conditions
            .iter()
            .find(|c| c["type"] == MISCONFIGURED_CONDITION)
            .unwrap();
        assert_eq!(ours["status"], "True");
        assert_eq!(ours["reason"], "EciPermissionDenied");
        let message = ours["message"].as_str().unwrap();
        assert!(
            message.contains("Forbidden.RAM") && message.contains("RAM"),
            "{message}"
        );
        assert_eq!(
            conditions[0]["status"], "True",
            "ECI answers: Ready stays, so the node lifecycle controller evicts nothing"
        );

        let other = Taint {
            key: "k8s.aliyun.com/vnode".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        let tainted = misconfigured_taints(std::slice::from_ref(&other), true).unwrap();
        assert_eq!(tainted.len(), 2);
        assert_eq!(tainted[0], other);
        assert_eq!(
            (tainted[1].key.as_str(), tainted[1].effect.as_str()),
            (MISCONFIGURED_TAINT, "NoSchedule")
        );
        assert_eq!(
            misconfigured_taints(&tainted, true),
            None,
            "already tainted"
        );
        assert_eq!(
            misconfigured_taints(&tainted, false),
            Some(vec![other.clone()])
        );
        assert_eq!(misconfigured_taints(&[other], false), None);
    }

    #[test]
    fn the_kubelet_version_follows_the_control_plane() {
        let ours = env!("CARGO_PKG_VERSION");
        for (server, expected) in [
            ("v1.37.2", Some(format!("v1.37.2-virtual-node-eci-{ours}"))),
            (
                "v1.31.4-aliyun.1",
                Some(format!("v1.31.4-virtual-node-eci-{ours}")),
            ),
            (
                "v1.30.0-eks-1a2b3c",
                Some(format!("v1.30.0-virtual-node-eci-{ours}")),
            ),
            (
                "v1.38.0+k3s1",
                Some(format!("v1.38.0-virtual-node-eci-{ours}")),
            ),
            ("1.37.2", None),
            ("v1.37", None),
            ("v1.x.2", None),
            ("", None),
        ] {
            assert_eq!(kubelet_version_for(server), expected, "{server:?}");
        }
        let status = status(
            &mk_config(&[]),
            &EciHealth::Reachable,
            None,
            None,
            SystemTime::UNIX_EPOCH,
            "v1.37.2-virtual-node-eci-0.1.0",
        );
        assert_eq!(
            status["nodeInfo"]["kubeletVersion"],
            "v1.37.2-virtual-node-eci-0.1.0"
        );
    }
}
