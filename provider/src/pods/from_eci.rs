//! ECI group status → Pod status: phase, conditions, container statuses, IPs, start time.
//! Pure: the caller writes the result only when [`fingerprint`] says it changed.
//!
//! Not wired to a pod controller yet: that is the pod lifecycle work.

use std::time::SystemTime;

use eci_proto::v20180808::{ContainerGroupStatus, ContainerInfo, ContainerState};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};

use crate::k8s::rfc3339;

/// The Pod phase of an ECI group status (`None`: keep the pod's current phase).
pub fn phase(status: &str) -> Option<&'static str> {
    match status {
        "Pending" | "Scheduling" => Some("Pending"),
        "Running" | "Restarting" | "Updating" => Some("Running"),
        "Succeeded" => Some("Succeeded"),
        "Failed" | "ScheduleFailed" | "Expired" => Some("Failed"),
        // Terminating, or a status this version does not know.
        _ => None,
    }
}

fn state(state: Option<&ContainerState>, container_id: &str) -> Value {
    let Some(state) = state else {
        return json!({"waiting": {"reason": "ContainerCreating"}});
    };
    let mut out = Map::new();
    let text = |s: &str| (!s.is_empty()).then(|| Value::String(s.to_owned()));
    match state.state.as_str() {
        "Running" => {
            out.insert(
                "running".into(),
                json!({"startedAt": text(&state.start_time)}),
            );
        }
        "Terminated" => {
            let mut terminated = json!({
                "exitCode": state.exit_code.unwrap_or(0),
                "reason": text(&state.reason),
                "message": text(&state.message),
                "startedAt": text(&state.start_time),
                "finishedAt": text(&state.finish_time),
            });
            if let Some(signal) = state.signal {
                terminated["signal"] = json!(signal);
            }
            if !container_id.is_empty() {
                terminated["containerID"] = json!(format!("eci://{container_id}"));
            }
            out.insert("terminated".into(), terminated);
        }
        _ => {
            let reason = if state.reason.is_empty() {
                "ContainerCreating"
            } else {
                state.reason.as_str()
            };
            out.insert(
                "waiting".into(),
                json!({"reason": reason, "message": text(&state.message)}),
            );
        }
    }
    strip_nulls(Value::Object(out))
}

fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

fn container_statuses(
    spec: &[k8s_openapi::api::core::v1::Container],
    infos: &[ContainerInfo],
) -> Vec<Value> {
    spec.iter()
        .map(|container| {
            let info = infos.iter().find(|i| i.name == container.name);
            let container_id = info.map(|i| i.container_id.as_str()).unwrap_or_default();
            let mut status = json!({
                "name": container.name,
                "image": container.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": info.is_some_and(|i| i.ready),
                "started": info.is_some_and(|i| i.started),
                "restartCount": info.map_or(0, |i| i.restart_count),
                "state": state(info.and_then(|i| i.current_state.as_ref()), container_id),
                "lastState": info.and_then(|i| i.previous_state.as_ref()).map_or_else(|| json!({}), |p| state(Some(p), "")),
            });
            if !container_id.is_empty() {
                status["containerID"] = json!(format!("eci://{container_id}"));
            }
            status
        })
        .collect()
}

fn condition(kind: &str, ok: bool, reason: &str, message: &str) -> Value {
    let mut condition = json!({"type": kind, "status": if ok { "True" } else { "False" }});
    if !ok {
        condition["reason"] = json!(reason);
        condition["message"] = json!(message);
    }
    condition
}

fn not_done<'a>(infos: impl Iterator<Item = (&'a str, bool)>) -> Vec<&'a str> {
    infos
        .filter(|(_, done)| !done)
        .map(|(name, _)| name)
        .collect()
}

/// The Pod status for `group`. Conditions keep their `lastTransitionTime` from `pod` when
/// their status did not change; `now` stamps the others. A failed schedule is explained with
/// the group's latest Warning event.
pub fn pod_status(pod: &Pod, group: &ContainerGroupStatus, now: SystemTime) -> Value {
    let no_spec = k8s_openapi::api::core::v1::PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let current = pod.status.clone().unwrap_or_default();
    let phase = phase(&group.status)
        .map(str::to_owned)
        .or_else(|| current.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let init = container_statuses(
        spec.init_containers.as_deref().unwrap_or_default(),
        &group.init_containers,
    );
    let main = container_statuses(&spec.containers, &group.containers);

    let initialized = not_done(init.iter().map(|s| {
        (
            s["name"].as_str().unwrap_or_default(),
            s.pointer("/state/terminated/exitCode")
                .and_then(Value::as_i64)
                == Some(0),
        )
    }));
    let unready = not_done(
        main.iter()
            .map(|s| (s["name"].as_str().unwrap_or_default(), s["ready"] == true)),
    );
    let list = |names: &[&str]| format!("[{}]", names.join(" "));
    let conditions_ready = unready.is_empty() && phase == "Running";
    let mut conditions = vec![
        condition("PodScheduled", true, "", ""),
        condition(
            "Initialized",
            initialized.is_empty(),
            "ContainersNotInitialized",
            &format!("containers with incomplete status: {}", list(&initialized)),
        ),
        condition(
            "ContainersReady",
            conditions_ready,
            "ContainersNotReady",
            &format!("containers with unready status: {}", list(&unready)),
        ),
        condition(
            "Ready",
            conditions_ready,
            "ContainersNotReady",
            &format!("containers with unready status: {}", list(&unready)),
        ),
    ];
    if phase == "Succeeded" || phase == "Failed" {
        // A finished pod's containers are not "unready", they are done.
        for c in conditions.iter_mut().skip(2) {
            c["reason"] = json!("PodCompleted");
            c["message"] = json!("");
        }
    }
    let now_text = rfc3339(now);
    let previous = current.conditions.unwrap_or_default();
    for c in &mut conditions {
        let before = previous
            .iter()
            .find(|p| Some(p.type_.as_str()) == c["type"].as_str());
        let time = match before {
            Some(p) if Some(p.status.as_str()) == c["status"].as_str() => p
                .last_transition_time
                .as_ref()
                .map_or_else(|| now_text.clone(), |t| t.0.to_string()),
            _ => now_text.clone(),
        };
        c["lastTransitionTime"] = json!(time);
    }

    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": main,
        "initContainerStatuses": init,
    });
    if !group.intranet_ip.is_empty() {
        status["podIP"] = json!(group.intranet_ip);
        status["podIPs"] = json!([{"ip": group.intranet_ip}]);
        // The ECI instance is the pod's host.
        status["hostIP"] = json!(group.intranet_ip);
        status["hostIPs"] = json!([{"ip": group.intranet_ip}]);
    }
    if !group.creation_time.is_empty() {
        status["startTime"] = json!(group.creation_time);
    }
    match group.status.as_str() {
        "ScheduleFailed" => {
            let warning = group.events.iter().rev().find(|e| e.r#type == "Warning");
            status["reason"] = json!("ScheduleFailed");
            status["message"] = json!(warning.map_or_else(
                || "ECI could not schedule the container group".to_owned(),
                |e| format!("{}: {}", e.reason, e.message)
            ));
        }
        "Expired" => {
            status["reason"] = json!("Expired");
            status["message"] = json!("the spot ECI instance was reclaimed");
        }
        _ => {}
    }
    status
}

/// A hash of a status without its conditions' transition and probe times: equal fingerprints
/// need no write. Computed by walking the JSON (no copy, no text), object keys in sorted order.
pub fn fingerprint(status: &Value) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    fn walk(value: &Value, in_conditions: bool, hasher: &mut std::hash::DefaultHasher) {
        match value {
            Value::Null => 0u8.hash(hasher),
            Value::Bool(b) => (1u8, b).hash(hasher),
            Value::Number(n) => (2u8, n).hash(hasher),
            Value::String(text) => (3u8, text).hash(hasher),
            Value::Array(items) => {
                (4u8, items.len()).hash(hasher);
                for item in items {
                    walk(item, in_conditions, hasher);
                }
            }
            Value::Object(map) => {
                let mut keys: Vec<&String> = map
                    .keys()
                    .filter(|k| {
                        !(in_conditions && (*k == "lastTransitionTime" || *k == "lastProbeTime"))
                    })
                    .collect();
                keys.sort_unstable();
                (5u8, keys.len()).hash(hasher);
                for key in keys {
                    key.hash(hasher);
                    // Only the conditions' own members carry the times left out.
                    walk(&map[key.as_str()], key == "conditions", hasher);
                }
            }
        }
    }
    let mut hasher = std::hash::DefaultHasher::new();
    walk(status, false, &mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::Event;

    use super::*;

    fn mk_pod(init: bool) -> Pod {
        let mut spec = json!({"containers": [{"name": "app", "image": "nginx:1.27"}, {"name": "side", "image": "envoy"}]});
        if init {
            spec["initContainers"] = json!([{"name": "migrate", "image": "migrate:1"}]);
        }
        serde_json::from_value(json!({"metadata": {"name": "web-0", "namespace": "default"}, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}})).unwrap()
    }

    fn info(name: &str, state: &str, ready: bool, exit: Option<i32>) -> ContainerInfo {
        ContainerInfo {
            name: name.into(),
            ready,
            started: state == "Running",
            restart_count: 0,
            current_state: Some(ContainerState {
                state: state.into(),
                exit_code: exit,
                start_time: "2026-11-21T03:00:00Z".into(),
                ..ContainerState::default()
            }),
            container_id: format!("{name}-id"),
            ..ContainerInfo::default()
        }
    }

    fn mk_group(status: &str, containers: Vec<ContainerInfo>) -> ContainerGroupStatus {
        ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            status: status.into(),
            intranet_ip: if status == "Pending" {
                String::new()
            } else {
                "192.168.0.2".into()
            },
            creation_time: "2026-11-21T02:59:58Z".into(),
            containers,
            ..ContainerGroupStatus::default()
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + seconds)
    }

    fn condition<'a>(status: &'a Value, kind: &str) -> &'a Value {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .unwrap()
    }

    #[test]
    fn phases() {
        for (eci, pod) in [
            ("Pending", "Pending"),
            ("Scheduling", "Pending"),
            ("Running", "Running"),
            ("Restarting", "Running"),
            ("Succeeded", "Succeeded"),
            ("Failed", "Failed"),
            ("ScheduleFailed", "Failed"),
            ("Expired", "Failed"),
        ] {
            assert_eq!(phase(eci), Some(pod), "{eci}");
        }
        assert_eq!(phase("Terminating"), None);
    }

    #[test]
    fn a_running_group_with_one_unready_container() {
        let group = mk_group(
            "Running",
            vec![
                info("app", "Running", true, None),
                info("side", "Running", false, None),
            ],
        );
        let status = pod_status(&mk_pod(false), &group, at(0));
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["podIP"], "192.168.0.2");
        assert_eq!(status["podIPs"], json!([{"ip": "192.168.0.2"}]));
        assert_eq!(status["startTime"], "2026-11-21T02:59:58Z");
        assert_eq!(condition(&status, "PodScheduled")["status"], "True");
        assert_eq!(condition(&status, "Initialized")["status"], "True");
        let ready = condition(&status, "Ready");
        assert_eq!(
            (ready["status"].as_str(), ready["reason"].as_str()),
            (Some("False"), Some("ContainersNotReady"))
        );
        assert_eq!(ready["message"], "containers with unready status: [side]");
        let app = &status["containerStatuses"][0];
        assert_eq!(app["containerID"], "eci://app-id");
        assert_eq!(app["state"]["running"]["startedAt"], "2026-11-21T03:00:00Z");
        assert_eq!(app["image"], "nginx:1.27");
    }

    #[test]
    fn init_containers_hold_initialization() {
        let mut group = mk_group("Pending", vec![]);
        group.init_containers = vec![info("migrate", "Running", false, None)];
        let status = pod_status(&mk_pod(true), &group, at(0));
        assert_eq!(status["phase"], "Pending");
        let initialized = condition(&status, "Initialized");
        assert_eq!(
            (
                initialized["status"].as_str(),
                initialized["message"].as_str()
            ),
            (
                Some("False"),
                Some("containers with incomplete status: [migrate]")
            )
        );
        assert_eq!(
            status["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        assert!(status.get("podIP").is_none());
    }

    #[test]
    fn terminated_containers_and_restarts() {
        let mut crashed = info("app", "Waiting", false, None);
        crashed.current_state = Some(ContainerState {
            state: "Waiting".into(),
            reason: "CrashLoopBackOff".into(),
            message: "back-off 10s".into(),
            ..ContainerState::default()
        });
        crashed.previous_state = Some(ContainerState {
            state: "Terminated".into(),
            exit_code: Some(3),
            reason: "Error".into(),
            signal: None,
            start_time: "2026-11-21T03:00:00Z".into(),
            finish_time: "2026-11-21T03:00:05Z".into(),
            ..ContainerState::default()
        });
        crashed.restart_count = 2;
        let group = mk_group(
            "Running",
            vec![crashed, info("side", "Running", true, None)],
        );
        let status = pod_status(&mk_pod(false), &group, at(0));
        let app = &status["containerStatuses"][0];
        assert_eq!(app["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(app["lastState"]["terminated"]["exitCode"], 3);
        assert_eq!(
            app["lastState"]["terminated"]["finishedAt"],
            "2026-11-21T03:00:05Z"
        );
        assert_eq!(app["restartCount"], 2);

        let done = mk_group(
            "Succeeded",
            vec![
                info("app", "Terminated", false, Some(0)),
                info("side", "Terminated", false, Some(0)),
            ],
        );
        let status = pod_status(&mk_pod(false), &done, at(0));
        assert_eq!(status["phase"], "Succeeded");
        assert_eq!(condition(&status, "Ready")["reason"], "PodCompleted");
        assert_eq!(
            status["containerStatuses"][0]["state"]["terminated"]["containerID"],
            "eci://app-id"
        );
    }

    #[test]
    fn schedule_failures_and_spot_reclaims_explain_themselves() {
        let mut group = mk_group("ScheduleFailed", vec![]);
        group.intranet_ip.clear();
        group.events = vec![Event {
            r#type: "Warning".into(),
            reason: "VSwitchIpNotEnough".into(),
            message: "The vSwitch vsw-1 has no free IP address".into(),
            ..Event::default()
        }];
        let status = pod_status(&mk_pod(false), &group, at(0));
        assert_eq!(
            (status["phase"].as_str(), status["reason"].as_str()),
            (Some("Failed"), Some("ScheduleFailed"))
        );
        assert_eq!(
            status["message"],
            "VSwitchIpNotEnough: The vSwitch vsw-1 has no free IP address"
        );
        let status = pod_status(&mk_pod(false), &mk_group("Expired", vec![]), at(0));
        assert_eq!(status["reason"], "Expired");
    }

    #[test]
    fn unchanged_statuses_keep_their_times_and_fingerprints() {
        let group = mk_group(
            "Running",
            vec![
                info("app", "Running", true, None),
                info("side", "Running", true, None),
            ],
        );
        let first = pod_status(&mk_pod(false), &group, at(0));
        let mut pod = mk_pod(false);
        pod.status = Some(serde_json::from_value(first.clone()).unwrap());
        let second = pod_status(&pod, &group, at(60));
        assert_eq!(
            condition(&second, "Ready")["lastTransitionTime"],
            rfc3339(at(0))
        );
        assert_eq!(fingerprint(&first), fingerprint(&second));
        let mut unready = group;
        unready.containers[1].ready = false;
        let third = pod_status(&pod, &unready, at(90));
        assert_eq!(
            condition(&third, "Ready")["lastTransitionTime"],
            rfc3339(at(90))
        );
        assert_ne!(fingerprint(&second), fingerprint(&third));
    }

    #[test]
    fn fingerprints_ignore_condition_times_and_key_order_only() {
        let a = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t1"}]});
        let b = json!({"conditions": [{"lastTransitionTime": "t2", "status": "True", "type": "Ready"}], "phase": "Running"});
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let flipped =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]});
        assert_ne!(fingerprint(&a), fingerprint(&flipped));
        // A time outside the conditions (a container's start) is part of the status.
        let started =
            |t: &str| json!({"containerStatuses": [{"name": "app", "lastTransitionTime": t}]});
        assert_ne!(fingerprint(&started("t1")), fingerprint(&started("t2")));
    }
}
