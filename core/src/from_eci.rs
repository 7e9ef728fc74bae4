//! ECI group status → Pod status: phase, conditions, container statuses, IPs, start time —
//! the part of a pod's status a kubelet owns, and nothing else (see [`owned`]): the controller
//! writes it with server-side apply under its own field manager, so conditions others own
//! (`DisruptionTarget`, readiness-gate conditions) survive. Ready honours
//! `spec.readinessGates`. Pure: the caller writes the result only when [`fingerprint`] says it
//! changed.

use std::time::SystemTime;

use eci_proto::v20180808::{ContainerGroupStatus, ContainerInfo, ContainerState};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodReadinessGate};
use serde_json::{Map, Value, json};

use crate::time::rfc3339;
use crate::to_eci::sidecars;

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

/// A time ECI reported, as the API server takes it (RFC 3339 in UTC); `None` when it is empty or
/// not a time: the API server refuses a status with an unreadable time whole, and the pod would
/// never show its state.
fn time(text: &str) -> Option<Value> {
    let at: jiff::Timestamp = text.parse().ok()?;
    // 0000-01-01T00:00:00Z: earlier years have no RFC 3339 form.
    (at.as_second() >= -62_167_219_200).then(|| Value::String(at.to_string()))
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
                json!({"startedAt": time(&state.start_time)}),
            );
        }
        "Terminated" => {
            let mut terminated = json!({
                "exitCode": state.exit_code.unwrap_or(0),
                "reason": text(&state.reason),
                "message": text(&state.message),
                "startedAt": time(&state.start_time),
                "finishedAt": time(&state.finish_time),
            });
            if let Some(signal) = state.signal {
                terminated["signal"] = json!(signal);
            }
            if !container_id.is_empty() {
                terminated["containerID"] = json!(container_id);
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

/// `containerID` for a container of group `group_id`: the service reports no runtime id, so it
/// is derived from what it does report — the group, the container and its restart count (a
/// restarted container is a new runtime container, as the kubelet's ids change) — once the
/// container has run at all.
fn derived_container_id(group_id: &str, info: &ContainerInfo) -> Option<String> {
    let ran = info.previous_state.is_some()
        || info
            .current_state
            .as_ref()
            .is_some_and(|s| matches!(s.state.as_str(), "Running" | "Terminated"));
    ran.then(|| format!("eci://{group_id}/{}/{}", info.name, info.restart_count))
}

/// The ECI container called `name`.
fn find<'a>(infos: &'a [ContainerInfo], name: &str) -> Option<&'a ContainerInfo> {
    infos.iter().find(|i| i.name == name)
}

/// The statuses of the containers `spec` lists, each from the ECI container `info_of` finds
/// for it.
fn container_statuses<'a>(
    group_id: &str,
    spec: &[k8s_openapi::api::core::v1::Container],
    info_of: impl Fn(&k8s_openapi::api::core::v1::Container) -> Option<&'a ContainerInfo>,
) -> Vec<Value> {
    spec.iter()
        .map(|container| {
            let info = info_of(container);
            let container_id = info
                .and_then(|i| derived_container_id(group_id, i))
                .unwrap_or_default();
            let current = info.and_then(|i| i.current_state.as_ref());
            // ECI has no startup probes: a running container has started.
            let started = current.is_some_and(|s| s.state == "Running");
            let mut status = json!({
                "name": container.name,
                "image": container.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": info.is_some_and(|i| i.ready),
                "started": started,
                "restartCount": info.map_or(0, |i| i.restart_count),
                "state": state(current, &container_id),
                "lastState": info.and_then(|i| i.previous_state.as_ref()).map_or_else(|| json!({}), |p| state(Some(p), "")),
            });
            if !container_id.is_empty() {
                status["containerID"] = json!(container_id);
            }
            if let Some(resources) = status_resources(container, info) {
                // As the kubelet: what was allocated is what the container was admitted with.
                if let Some(requests) = resources.get("requests") {
                    status["allocatedResources"] = requests.clone();
                }
                status["resources"] = resources;
            }
            status
        })
        .collect()
}

/// A container's CPU and memory as the kubelet reports them in its status: the spec's
/// requests and limits, with the one ECI sizes the container by (the limit, else the request)
/// replaced by what the ECI container runs with, when ECI states it (it shows 0 for a size it
/// was not given). `None` when the spec sets neither resource.
fn status_resources(
    container: &k8s_openapi::api::core::v1::Container,
    info: Option<&ContainerInfo>,
) -> Option<Value> {
    use crate::quantity::{Format, Quantity};
    let spec = container.resources.as_ref();
    let mut requests = Map::new();
    let mut limits = Map::new();
    for kind in ["cpu", "memory"] {
        let of = |list: Option<&std::collections::BTreeMap<String, _>>| {
            list.and_then(|l| l.get(kind))
                .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
        };
        let request = of(spec.and_then(|r| r.requests.as_ref()));
        let limit = of(spec.and_then(|r| r.limits.as_ref()));
        #[allow(clippy::cast_possible_truncation)]
        let runs = info.and_then(|info| match kind {
            "cpu" => (info.cpu > 0.0)
                .then(|| Quantity::from_nanos((info.cpu * 1e9).round() as i128, Format::DecimalSi)),
            _ => (info.memory > 0.0).then(|| {
                let bytes = (info.memory * f64::from(1u32 << 30)).round() as i128;
                Quantity::from_nanos(bytes * 1_000_000_000, Format::BinarySi)
            }),
        });
        let runs = runs.map(Quantity::canonical);
        match (request, limit) {
            (request, Some(limit)) => {
                limits.insert(kind.into(), json!(runs.unwrap_or(limit)));
                if let Some(request) = request {
                    requests.insert(kind.into(), json!(request));
                }
            }
            (Some(request), None) => {
                requests.insert(kind.into(), json!(runs.unwrap_or(request)));
            }
            (None, None) => {}
        }
    }
    let mut resources = Map::new();
    for (key, list) in [("requests", requests), ("limits", limits)] {
        if !list.is_empty() {
            resources.insert(key.into(), Value::Object(list));
        }
    }
    (!resources.is_empty()).then_some(Value::Object(resources))
}

/// Whether an init container's status shows it done with, as the kubelet counts it: a regular
/// one succeeded, a sidecar started.
fn initialized(sidecar: bool, status: &Value) -> bool {
    if sidecar {
        status["started"] == true
    } else {
        status
            .pointer("/state/terminated/exitCode")
            .and_then(Value::as_i64)
            == Some(0)
    }
}

/// The first init container not done with (see [`initialized`]), if any.
fn initializing(
    init_specs: &[k8s_openapi::api::core::v1::Container],
    init: &[Value],
) -> Option<usize> {
    init_specs
        .iter()
        .zip(init)
        .position(|(spec, status)| !initialized(sidecars::is_sidecar(spec), status))
}

/// What the kubelet shows of init containers that ECI does not: a regular init container that
/// succeeded is `ready`; in a pod with init containers, a container not created yet waits with
/// reason `PodInitializing` (the kubelet's default state there), whatever placeholder ECI
/// reports — each one after an init container not done with, and any other that never ran and
/// shows only ECI's `ContainerCreating`. Returns the first init container not done with.
fn show_initializing(
    init_specs: &[k8s_openapi::api::core::v1::Container],
    init: &mut [Value],
    main: &mut [Value],
) -> Option<usize> {
    if init_specs.is_empty() {
        return None;
    }
    for (spec, status) in init_specs.iter().zip(init.iter_mut()) {
        if !sidecars::is_sidecar(spec) {
            status["ready"] = json!(initialized(false, status));
        }
    }
    let current = initializing(init_specs, init);
    let after_current = init
        .iter_mut()
        .enumerate()
        .map(|(index, status)| (current.is_some_and(|c| index > c), status))
        .chain(main.iter_mut().map(|status| (current.is_some(), status)));
    for (after, status) in after_current {
        let never_ran = status["restartCount"] == 0 && status["lastState"] == json!({});
        let not_created = status["state"]
            .get("waiting")
            .is_some_and(|waiting| after || waiting["reason"] == "ContainerCreating");
        if never_ran && not_created {
            status["state"] = json!({"waiting": {"reason": "PodInitializing"}});
        }
    }
    current
}

fn condition(kind: &str, ok: bool, reason: &str, message: &str) -> Value {
    let mut condition = json!({"type": kind, "status": if ok { "True" } else { "False" }});
    if !ok {
        condition["reason"] = json!(reason);
        if !message.is_empty() {
            condition["message"] = json!(message);
        }
    }
    condition
}

fn not_done<'a>(infos: impl Iterator<Item = (&'a str, bool)>) -> Vec<&'a str> {
    infos
        .filter(|(_, done)| !done)
        .map(|(name, _)| name)
        .collect()
}

/// The condition types this daemon writes, as a kubelet does; every other condition on a pod
/// (`DisruptionTarget`, readiness-gate conditions, …) belongs to someone else and is never
/// written, so it survives our writes.
pub const OWN_CONDITIONS: [&str; 6] = [
    "PodScheduled",
    INSTANCE_CREATED,
    "Initialized",
    "ContainersReady",
    "Ready",
    RESIZE_PENDING,
];

/// The kubelet's condition for a resize it has not carried out; shown only while one waits.
pub const RESIZE_PENDING: &str = "PodResizePending";

/// Containers whose spec asks for another CPU or memory than their ECI container runs with:
/// an in-place resize (the pod's `resize` subresource), which ECI cannot carry out, since
/// UpdateContainerGroup restarts the instance. Each as `name (what it runs → what it asks)`.
/// Only what both sides state is compared (ECI shows 0 for a size it was not given).
fn resizes(pod: &Pod, group: &ContainerGroupStatus) -> Vec<String> {
    let differ = |asked: Option<f64>, runs: f64| {
        asked.is_some_and(|asked| runs > 0.0 && (asked - runs).abs() > runs * 1e-3)
    };
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    containers
        .iter()
        .filter_map(|container| {
            let info = find(&group.containers, &container.name)?;
            let asked = crate::to_eci::size(container, "").ok()?;
            (differ(asked.cpu, info.cpu) || differ(asked.memory, info.memory)).then(|| {
                format!(
                    "{} ({} → {})",
                    container.name,
                    size_text(Some(info.cpu), Some(info.memory)),
                    size_text(asked.cpu, asked.memory)
                )
            })
        })
        .collect()
}

/// `1 vCPU, 2 GiB`; `-` for a part not given.
fn size_text(cpu: Option<f64>, memory: Option<f64>) -> String {
    let part =
        |v: Option<f64>, unit: &str| v.map_or_else(|| "-".to_owned(), |v| format!("{v} {unit}"));
    format!("{}, {}", part(cpu, "vCPU"), part(memory, "GiB"))
}

/// [`RESIZE_PENDING`] with the kubelet's reason for a resize it cannot do (`Infeasible`), so
/// a resizer (a person, the VerticalPodAutoscaler's in-place mode) falls back to recreating
/// the pod; `None` when no resize waits.
fn resize_pending(pod: &Pod, group: &ContainerGroupStatus) -> Option<Value> {
    let waiting = resizes(pod, group);
    (!waiting.is_empty()).then(|| {
        json!({
            "type": RESIZE_PENDING, "status": "True", "reason": "Infeasible",
            "message": format!(
                "ECI cannot resize a running container in place (UpdateContainerGroup restarts the instance); recreate the pod to resize it: {}",
                waiting.join("; ")
            ),
        })
    })
}

/// The pod condition saying whether the ECI instance was created (ack-virtual-node's name).
pub const INSTANCE_CREATED: &str = "ContainerInstanceCreated";

/// ACK's reason while the instance is being created (`Scheduling` in ECI's words).
pub const CREATING: &str = "Creating";

/// `ContainerInstanceCreated` for a group in ECI status `status`: False while ECI is still
/// placing it (reason `Creating`, as ACK shows it) or when it could not (`ScheduleFailed`),
/// True from the moment it has an instance. A pod whose create was refused outright never
/// gets here: the controller writes that condition itself (its "not created" notice).
///
/// A spot instance ECI announced it will reclaim (a Warning `SpotToBeReleased` event, about 3
/// minutes ahead) stays True with reason `SpotToBeReleased` and the service's message, as ACK
/// shows it: the pod's owner can move the work before the instance goes.
fn instance_created(group: &ContainerGroupStatus) -> Value {
    let reclaim = group
        .events
        .iter()
        .rev()
        .find(|e| e.r#type == "Warning" && e.reason == SPOT_TO_BE_RELEASED);
    match (group.status.as_str(), reclaim) {
        ("" | "Scheduling", _) => condition(INSTANCE_CREATED, false, CREATING, "Creating"),
        ("ScheduleFailed", _) => condition(
            INSTANCE_CREATED,
            false,
            "ScheduleFailed",
            "ECI could not place the container group (its events say why)",
        ),
        (_, Some(event)) => json!({
            "type": INSTANCE_CREATED, "status": "True",
            "reason": SPOT_TO_BE_RELEASED, "message": event.message,
        }),
        _ => condition(INSTANCE_CREATED, true, "", ""),
    }
}

/// ECI's event (and ACK's condition reason) announcing a spot reclaim.
pub const SPOT_TO_BE_RELEASED: &str = "SpotToBeReleased";

/// The status fields besides `conditions` this daemon writes. Under server-side apply a field
/// we wrote before and leave out of a later write is removed, so every write carries all of
/// the ones that still apply.
const OWN_FIELDS: [&str; 11] = [
    "phase",
    "reason",
    "message",
    "containerStatuses",
    "initContainerStatuses",
    "podIP",
    "podIPs",
    "hostIP",
    "hostIPs",
    "startTime",
    "observedGeneration",
];

/// Reason of a Ready condition held False by a readiness gate (the kubelet's word).
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";

/// The Ready condition, derived as the kubelet's status manager does: the ContainersReady
/// condition's status, reason and message while it is not True; else False with reason
/// [`READINESS_GATES_NOT_READY`] while any of the pod's readiness gates has no condition or one
/// that is not True (read from `current`, the conditions the pod shows, which others own);
/// else True.
fn ready(containers_ready: &Value, gates: &[PodReadinessGate], current: &[PodCondition]) -> Value {
    if containers_ready["status"] != "True" {
        let mut ready = containers_ready.clone();
        ready["type"] = json!("Ready");
        return ready;
    }
    let unready: Vec<String> = gates
        .iter()
        .filter_map(|gate| {
            let kind = &gate.condition_type;
            match current.iter().find(|c| &c.type_ == kind) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {kind:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {kind:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    if unready.is_empty() {
        condition("Ready", true, "", "")
    } else {
        condition(
            "Ready",
            false,
            READINESS_GATES_NOT_READY,
            &unready.join(", "),
        )
    }
}

fn gates(pod: &Pod) -> &[PodReadinessGate] {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default()
}

/// Gives each condition its `lastTransitionTime` — kept from `previous` while its status did
/// not change, else `now` — and, where the pod has a generation (Kubernetes 1.33+), its
/// `observedGeneration`.
fn stamp(
    conditions: &mut [Value],
    previous: &[PodCondition],
    generation: Option<i64>,
    now: SystemTime,
) {
    let now_text = rfc3339(now);
    for c in conditions {
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
        if let Some(generation) = generation {
            c["observedGeneration"] = json!(generation);
        }
    }
}

/// The Pod status for `group`: every field this daemon owns (see [`owned`]). Conditions keep
/// their `lastTransitionTime` from `pod` when their status did not change; `now` stamps the
/// others. Ready honours `spec.readinessGates` against the conditions `pod` shows. A failed
/// schedule is explained with the group's latest Warning event.
pub fn pod_status(pod: &Pod, group: &ContainerGroupStatus, now: SystemTime) -> Value {
    let no_spec = k8s_openapi::api::core::v1::PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let current = pod.status.clone().unwrap_or_default();
    let phase = phase(&group.status)
        .map(str::to_owned)
        .or_else(|| current.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let group_id = group.container_group_id.as_str();
    let init_specs = spec.init_containers.as_deref().unwrap_or_default();
    // A native sidecar runs as a container of the group (see `to_eci::sidecars`).
    let mut init = container_statuses(group_id, init_specs, |c| {
        if sidecars::is_sidecar(c) {
            find(&group.containers, &c.name)
        } else {
            find(&group.init_containers, &c.name)
        }
    });
    let mut main = container_statuses(group_id, &spec.containers, |c| {
        find(&group.containers, &c.name)
    });
    let initializing = show_initializing(init_specs, &mut init, &mut main);
    // As the kubelet: a pod is Pending until its init containers are done with, even while
    // its ECI instance runs them.
    let phase = if phase == "Running" && initializing.is_some() {
        "Pending".to_owned()
    } else {
        phase
    };
    let previous = current.conditions.unwrap_or_default();
    let mut conditions = conditions(pod, group, &phase, (&init, &main), &previous);
    let generation = pod.metadata.generation;
    stamp(&mut conditions, &previous, generation, now);

    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": main,
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    if let Some(generation) = generation {
        status["observedGeneration"] = json!(generation);
    }
    show_group(&mut status, group);
    status
}

/// The pod's conditions as the kubelet sets them, from its containers' statuses (`init` and
/// `main`, as [`pod_status`] made them) and the conditions it shows (`previous`: a readiness
/// gate's).
fn conditions(
    pod: &Pod,
    group: &ContainerGroupStatus,
    phase: &str,
    (init, main): (&[Value], &[Value]),
    previous: &[PodCondition],
) -> Vec<Value> {
    let init_specs = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.init_containers.as_deref())
        .unwrap_or_default();
    let is_sidecar = |status: &Value| {
        init_specs
            .iter()
            .any(|c| sidecars::is_sidecar(c) && status["name"] == c.name.as_str())
    };
    // As the kubelet: initialized once every regular init container succeeded and every
    // sidecar started; ready once every container and every sidecar is.
    let initialized = not_done(init.iter().map(|s| {
        (
            s["name"].as_str().unwrap_or_default(),
            initialized(is_sidecar(s), s),
        )
    }));
    let unready = not_done(
        init.iter()
            .filter(|s| is_sidecar(s))
            .chain(main)
            .map(|s| (s["name"].as_str().unwrap_or_default(), s["ready"] == true)),
    );
    let list = |names: &[&str]| format!("[{}]", names.join(" "));
    let containers_ready = if phase == "Succeeded" || phase == "Failed" {
        // A finished pod's containers are not "unready", they are done.
        condition("ContainersReady", false, "PodCompleted", "")
    } else {
        condition(
            "ContainersReady",
            unready.is_empty() && phase == "Running",
            "ContainersNotReady",
            &format!("containers with unready status: {}", list(&unready)),
        )
    };
    let ready = ready(&containers_ready, gates(pod), previous);
    let mut conditions = vec![
        condition("PodScheduled", true, "", ""),
        instance_created(group),
        condition(
            "Initialized",
            initialized.is_empty(),
            "ContainersNotInitialized",
            &format!("containers with incomplete status: {}", list(&initialized)),
        ),
        containers_ready,
        ready,
    ];
    conditions.extend(resize_pending(pod, group));
    conditions
}

/// The reason of a pod past its active deadline (the kubelet's), and of ECI's event when it
/// ends a group at the deadline it was created with.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// The kubelet's message with [`DEADLINE_EXCEEDED`].
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// What the group itself shows on the pod: its address, its start, why it failed.
fn show_group(status: &mut Value, group: &ContainerGroupStatus) {
    // Only an address: the API server refuses a status whose pod IP is not one.
    if group.intranet_ip.parse::<core::net::IpAddr>().is_ok() {
        status["podIP"] = json!(group.intranet_ip);
        status["podIPs"] = json!([{"ip": group.intranet_ip}]);
        // The ECI instance is the pod's host.
        status["hostIP"] = json!(group.intranet_ip);
        status["hostIPs"] = json!([{"ip": group.intranet_ip}]);
    }
    if let Some(started) = time(&group.creation_time) {
        status["startTime"] = started;
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
        // ECI ended the group at the deadline it was created with: the kubelet's words.
        "Failed" if group.events.iter().any(|e| e.reason == DEADLINE_EXCEEDED) => {
            status["reason"] = json!(DEADLINE_EXCEEDED);
            status["message"] = json!(DEADLINE_MESSAGE);
        }
        _ => {}
    }
}

/// What of `status` (a pod status as JSON) this daemon owns: the [`OWN_FIELDS`] it has and the
/// [`OWN_CONDITIONS`] among its conditions. A write built from it changes nothing of anyone
/// else's, and compares with what [`pod_status`] computes.
pub fn owned(status: &Value) -> Value {
    let mut out = Map::new();
    for key in OWN_FIELDS {
        if let Some(value) = status.get(key).filter(|v| !v.is_null()) {
            out.insert(key.to_owned(), value.clone());
        }
    }
    let ours: Vec<Value> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["type"]
                .as_str()
                .is_some_and(|t| OWN_CONDITIONS.contains(&t))
        })
        .cloned()
        .collect();
    if !ours.is_empty() {
        out.insert("conditions".into(), Value::Array(ours));
    }
    Value::Object(out)
}

fn owned_of(pod: &Pod) -> Value {
    pod.status
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .map_or_else(|| json!({}), |s| owned(&s))
}

/// What this daemon owns of `pod`'s status with the phase, reason and message replaced: a
/// write that says why a pod does not run without dropping what was written of it before.
pub fn with_phase(pod: &Pod, phase: &str, reason: &str, message: &str) -> Value {
    let mut status = owned_of(pod);
    status["phase"] = json!(phase);
    status["reason"] = json!(reason);
    status["message"] = json!(message);
    status
}

/// The kubelet's waiting reason for a container whose settings it cannot resolve.
pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";

/// What the kubelet shows of a pod whose container `at_fault` it cannot configure: Pending,
/// that container waiting with [`CREATE_CONTAINER_CONFIG_ERROR`] and `message`, every other
/// container of the pod waiting as not created yet.
pub fn container_config_error(pod: &Pod, at_fault: &str, message: &str) -> Value {
    let mut status = with_phase(pod, "Pending", CREATE_CONTAINER_CONFIG_ERROR, message);
    let Some(spec) = pod.spec.as_ref() else {
        return status;
    };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (key, containers) in [
        ("initContainerStatuses", init),
        ("containerStatuses", spec.containers.as_slice()),
    ] {
        if containers.is_empty() {
            continue;
        }
        let mut statuses = container_statuses("", containers, |_| None);
        for container in &mut statuses {
            if container["name"] == at_fault {
                container["state"] = json!({"waiting": {
                    "reason": CREATE_CONTAINER_CONFIG_ERROR, "message": message,
                }});
            }
        }
        status[key] = Value::Array(statuses);
    }
    status
}

/// The status of a pod whose container group is gone for good: Failed with `reason` and
/// `message`, containers not ready, and each container not already terminated shown as the
/// kubelet shows a container it cannot find (`ContainerStatusUnknown`, exit code 137), its
/// last known state kept as `lastState`.
pub fn lost(pod: &Pod, reason: &str, message: &str, now: SystemTime) -> Value {
    ended(pod, reason, message, Ending::Lost, now)
}

/// The status of a pod this daemon stopped while it ran (past its active deadline): Failed
/// with `reason` and `message`, each container still running shown terminated as the kubelet
/// shows a container it killed (exit code 137, `Error`, finished `now`).
pub fn stopped(pod: &Pod, reason: &str, message: &str, now: SystemTime) -> Value {
    ended(pod, reason, message, Ending::Killed, now)
}

/// How the containers of a pod that [`ended`] are shown.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Not found: `ContainerStatusUnknown`, the last state known kept as `lastState`.
    Lost,
    /// Killed by us: terminated from the running state.
    Killed,
}

/// A Failed status with `reason` and `message`, every container not terminated yet shown
/// terminated as `ending` says, and not ready.
fn ended(pod: &Pod, reason: &str, message: &str, ending: Ending, now: SystemTime) -> Value {
    let mut status = with_phase(pod, "Failed", reason, message);
    for key in ["containerStatuses", "initContainerStatuses"] {
        for container in status[key].as_array_mut().into_iter().flatten() {
            if container.pointer("/state/terminated").is_some() {
                continue;
            }
            let last = container["state"].take();
            container["state"] = match ending {
                Ending::Lost => {
                    container["lastState"] = if last.get("running").is_some() {
                        last
                    } else {
                        container["lastState"].take()
                    };
                    json!({"terminated": {
                        "exitCode": 137,
                        "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                    }})
                }
                Ending::Killed => {
                    let mut terminated = json!({
                        "exitCode": 137,
                        "reason": "Error",
                        "finishedAt": crate::time::rfc3339(now),
                    });
                    if let Some(started) = last.pointer("/running/startedAt") {
                        terminated["startedAt"] = started.clone();
                    }
                    json!({ "terminated": terminated })
                }
            };
            container["ready"] = json!(false);
            container["started"] = json!(false);
        }
    }
    let previous = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut conditions: Vec<Value> = status["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != "ContainersReady" && c["type"] != "Ready")
        .collect();
    conditions.push(condition("ContainersReady", false, "PodCompleted", ""));
    conditions.push(condition("Ready", false, "PodCompleted", ""));
    stamp(&mut conditions, &previous, pod.metadata.generation, now);
    status["conditions"] = Value::Array(conditions);
    if let Some(generation) = pod.metadata.generation {
        status["observedGeneration"] = json!(generation);
    }
    status
}

/// The status to write when the pod itself changed while its group did not: a readiness
/// gate's condition (set by another controller) that changes what Ready must say, or a new
/// `metadata.generation` to acknowledge. `None` when the pod shows what it should, and for a
/// pod this daemon has not written a status for yet (no ContainersReady condition).
///
/// Without readiness gates Ready follows ContainersReady, by status: someone else may have set
/// it apart — the node lifecycle controller marks every pod of a node it lost touch with
/// NotReady, once, when the node turns NotReady (its Lease went stale, or the daemon reported
/// ECI unreachable) — and, as a kubelet's status manager does when it serves again, the pod is
/// given back what its containers say. The next ECI change would not do it: a running group
/// may never change again, and its pods would stay out of their Services' endpoints.
///
/// The generation is compared only when the pod shows an `observedGeneration` at all: an API
/// server without the field drops it, and comparing then would rewrite forever.
pub fn refresh(pod: &Pod, now: SystemTime) -> Option<Value> {
    let status = pod.status.as_ref()?;
    let generation = pod.metadata.generation;
    let generation_differs =
        status.observed_generation.is_some() && status.observed_generation != generation;
    let gates = gates(pod);
    let conditions = status.conditions.as_deref().unwrap_or_default();
    // The common case, on every watch event of every pod: decided before anything is built.
    if gates.is_empty() && !generation_differs {
        let status_of = |kind: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == kind)
                .map(|c| c.status.as_str())
        };
        if status_of("Ready") == Some(status_of("ContainersReady")?) {
            return None;
        }
    }
    let containers_ready = conditions.iter().find(|c| c.type_ == "ContainersReady")?;
    let wanted = ready(
        &serde_json::to_value(containers_ready).ok()?,
        gates,
        conditions,
    );
    let shown = conditions.iter().find(|c| c.type_ == "Ready");
    let ready_differs = shown.is_none_or(|c| {
        wanted["status"] != c.status.as_str()
            // Reason and message are the gates' account (without gates, whatever the status
            // was set with: not ours to fight over).
            || (!gates.is_empty()
                && (wanted["reason"].as_str() != c.reason.as_deref()
                    || wanted["message"].as_str() != c.message.as_deref()))
    });
    if !ready_differs && !generation_differs {
        return None;
    }
    let mut owned = owned(&serde_json::to_value(status).ok()?);
    let mut ours: Vec<Value> = owned["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != "Ready")
        .collect();
    ours.push(wanted);
    stamp(&mut ours, conditions, generation, now);
    owned["conditions"] = Value::Array(ours);
    if let Some(generation) = generation {
        owned["observedGeneration"] = json!(generation);
    }
    Some(owned)
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

    #[test]
    fn the_instance_created_condition_follows_the_group_as_ack_shows_it() {
        let cases = [
            ("Scheduling", "False", Some(CREATING)),
            ("", "False", Some(CREATING)),
            ("ScheduleFailed", "False", Some("ScheduleFailed")),
            ("Pending", "True", None),
            ("Running", "True", None),
            ("Succeeded", "True", None),
            ("Failed", "True", None),
            ("Expired", "True", None),
        ];
        let reclaim = |kind: &str| Event {
            r#type: kind.into(),
            reason: SPOT_TO_BE_RELEASED.into(),
            message: "reclaimed in about 3 minutes".into(),
            ..Event::default()
        };
        for (status, shown, reason) in cases {
            let got = instance_created(&mk_group(status, vec![]));
            assert_eq!(got["type"], INSTANCE_CREATED);
            assert_eq!(got["status"], shown, "{status}");
            assert_eq!(got["reason"].as_str(), reason, "{status}");
            // An announced reclaim shows once the instance exists, never before.
            let mut group = mk_group(status, vec![]);
            group.events = vec![reclaim("Warning")];
            let got = instance_created(&group);
            assert_eq!(got["status"], shown, "{status}");
            if shown == "True" {
                assert_eq!(got["reason"], SPOT_TO_BE_RELEASED, "{status}");
                assert_eq!(got["message"], "reclaimed in about 3 minutes");
            } else {
                assert_ne!(got["reason"], SPOT_TO_BE_RELEASED, "{status}");
            }
            // Only the service's Warning counts.
            group.events = vec![reclaim("Normal")];
            assert_eq!(
                instance_created(&group)["reason"].as_str(),
                reason,
                "{status}"
            );
        }
    }

    /// A pod asking for another size than its container runs with waits `Infeasible`, naming
    /// the container and both sizes; the condition goes once they agree again.
    #[test]
    fn a_resize_eci_cannot_carry_out_is_infeasible() {
        let sized = |cpu: &str, memory: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "web-0", "namespace": "default"},
                "spec": {"containers": [
                    {"name": "app", "image": "nginx", "resources": {"limits": {"cpu": cpu, "memory": memory}}},
                    {"name": "side", "image": "envoy"},
                ]},
            }))
            .unwrap()
        };
        let mut app = info("app", "Running", true, None);
        (app.cpu, app.memory) = (1.0, 2.0);
        // `side` runs with 0.25 vCPU the pod never asked for: nothing to compare.
        let mut side = info("side", "Running", true, None);
        side.cpu = 0.25;
        let group = mk_group("Running", vec![app, side]);
        let pending = |pod: &Pod| {
            pod_status(pod, &group, at(0))["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == RESIZE_PENDING)
                .cloned()
        };
        assert_eq!(pending(&sized("1", "2Gi")), None);
        assert_eq!(pending(&sized("1000m", "2048Mi")), None);
        for (cpu, memory) in [("2", "2Gi"), ("1", "3Gi")] {
            let shown = pending(&sized(cpu, memory)).expect("a resize waits");
            assert_eq!(shown["status"], "True");
            assert_eq!(shown["reason"], "Infeasible");
            let message = shown["message"].as_str().unwrap();
            assert!(message.contains("app (1 vCPU, 2 GiB → "), "{message}");
            assert!(!message.contains("side"), "{message}");
        }
    }

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
            restart_count: 0,
            current_state: Some(ContainerState {
                state: state.into(),
                exit_code: exit,
                start_time: "2026-11-21T03:00:00Z".into(),
                ..ContainerState::default()
            }),
            // DescribeContainerGroups carries no `Started` and no runtime id.
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

    /// Found by the fuzz target `eci_to_status` (its input is kept as
    /// `fuzz/corpus/eci_to_status/crash-unreadable-finish-time`): ECI's times and address went
    /// into the status as ECI wrote them, and the API server refuses a whole status over one
    /// unreadable time or IP, so the pod would never have shown its state.
    #[test]
    fn unreadable_times_and_addresses_from_eci_are_left_out() {
        let mut app = info("app", "Terminated", false, Some(1));
        let state = app.current_state.as_mut().unwrap();
        state.start_time = "2026-11-21T11:00:00+08:00".into();
        state.finish_time = "2026-11-21T07:58:01%".into();
        let mut side = info("side", "Running", true, None);
        side.current_state.as_mut().unwrap().start_time = "yesterday".into();
        let mut group = mk_group("Running", vec![app, side]);
        group.intranet_ip = "192.168.0.999".into();
        group.creation_time = "-0001-01-01T00:00:00Z".into();
        let status = pod_status(&mk_pod(false), &group, at(0));
        let typed: k8s_openapi::api::core::v1::PodStatus =
            serde_json::from_value(status.clone()).expect("a PodStatus");
        assert_eq!(typed.pod_ip, None);
        assert_eq!(typed.start_time, None);
        let terminated = &status["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(terminated["startedAt"], "2026-11-21T03:00:00Z", "in UTC");
        assert!(terminated.get("finishedAt").is_none(), "{terminated}");
        assert_eq!(
            status["containerStatuses"][1]["state"],
            json!({"running": {}})
        );
        group.intranet_ip = "fd00::2".into();
        assert_eq!(
            pod_status(&mk_pod(false), &group, at(0))["podIP"],
            "fd00::2"
        );
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
        assert_eq!(
            app["containerID"], "eci://eci-1/app/0",
            "derived: the answer has no id"
        );
        assert_eq!(app["started"], true, "derived from the Running state");
        assert_eq!(app["state"]["running"]["startedAt"], "2026-11-21T03:00:00Z");
        assert_eq!(app["image"], "nginx:1.27");
    }

    #[test]
    fn containers_after_an_unfinished_init_container_wait_with_pod_initializing() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"initContainers": [{"name": "init1", "image": "busybox"}, {"name": "init2", "image": "busybox"}],
                "containers": [{"name": "run1", "image": "busybox"}]}})).unwrap();
        let waiting = |name: &str| {
            let mut info = info(name, "Waiting", false, None);
            info.current_state.as_mut().unwrap().reason = "ContainerCreating".into();
            info
        };
        let reason = |status: &Value, kind: &str, index: usize| {
            status[kind][index]["state"]["waiting"]["reason"]
                .as_str()
                .map(str::to_owned)
        };
        let initializing = Some("PodInitializing".to_owned());
        let creating = Some("ContainerCreating".to_owned());
        // (init1, init2, run1 restarted before) → (init2's reason, run1's reason)
        let table = [
            // The first init container failed: nothing after it was created.
            (
                (Some(1), None, false),
                (initializing.clone(), initializing.clone()),
            ),
            // It runs still.
            (
                (None, None, false),
                (initializing.clone(), initializing.clone()),
            ),
            // It succeeded: the second one, not created yet, shows the kubelet's default in a
            // pod with init containers, not ECI's placeholder; the app still waits.
            (
                (Some(0), None, false),
                (initializing.clone(), initializing.clone()),
            ),
            // Both succeeded: the app, not created yet, still shows that default.
            ((Some(0), Some(0), false), (None, initializing.clone())),
            // A container that ran before keeps the state ECI reports.
            (
                (Some(1), None, true),
                (initializing.clone(), creating.clone()),
            ),
        ];
        for ((init1, init2, restarted), expected) in table {
            let mut group = mk_group("Pending", vec![waiting("run1")]);
            if restarted {
                group.containers[0].restart_count = 1;
            }
            let state = |name, exit: Option<i32>| match exit {
                Some(code) => info(name, "Terminated", false, Some(code)),
                None if name == "init1" => info(name, "Running", false, None),
                None => waiting(name),
            };
            group.init_containers = vec![state("init1", init1), state("init2", init2)];
            let status = pod_status(&pod, &group, at(0));
            assert_eq!(
                (
                    reason(&status, "initContainerStatuses", 1),
                    reason(&status, "containerStatuses", 0)
                ),
                expected,
                "{init1:?} {init2:?} {restarted}"
            );
        }
        // The first init container not created yet: the same default.
        let mut group = mk_group("Pending", vec![waiting("run1")]);
        group.init_containers = vec![waiting("init1"), waiting("init2")];
        let status = pod_status(&pod, &group, at(0));
        assert_eq!(reason(&status, "initContainerStatuses", 0), initializing);
        // An ECI reason that is not the placeholder stays (an image that cannot be pulled).
        let mut pulling = waiting("init1");
        pulling.current_state.as_mut().unwrap().reason = "ErrImagePull".into();
        group.init_containers = vec![pulling, waiting("init2")];
        let status = pod_status(&pod, &group, at(0));
        assert_eq!(
            reason(&status, "initContainerStatuses", 0).as_deref(),
            Some("ErrImagePull")
        );
        let plain = pod_status(
            &mk_pod(false),
            &mk_group("Pending", vec![waiting("app")]),
            at(0),
        );
        assert_eq!(
            reason(&plain, "containerStatuses", 0),
            creating,
            "no init containers: ECI's reason"
        );
    }

    /// As the kubelet: a regular init container that succeeded is ready, and the pod is Pending
    /// while its ECI instance runs an init container, Running once they are done.
    #[test]
    fn succeeded_init_containers_are_ready_and_the_pod_pends_until_they_are_done() {
        let mut group = mk_group("Running", vec![info("app", "Running", true, None)]);
        group.init_containers = vec![info("migrate", "Running", false, None)];
        let status = pod_status(&mk_pod(true), &group, at(0));
        assert_eq!(status["phase"], "Pending");
        assert_eq!(status["initContainerStatuses"][0]["ready"], false);
        group.init_containers = vec![info("migrate", "Terminated", false, Some(0))];
        let status = pod_status(&mk_pod(true), &group, at(0));
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["initContainerStatuses"][0]["ready"], true);
        group.init_containers = vec![info("migrate", "Terminated", false, Some(1))];
        let status = pod_status(&mk_pod(true), &group, at(0));
        assert_eq!(status["initContainerStatuses"][0]["ready"], false);
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
            status["containerStatuses"][0]["state"]["waiting"]["reason"], "PodInitializing",
            "not created until the init containers are done, as the kubelet shows it"
        );
        assert!(status.get("podIP").is_none());
    }

    #[test]
    fn a_native_sidecar_reports_as_an_init_container_and_counts_for_readiness() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web-0", "namespace": "default"},
            "spec": {"initContainers": [{"name": "migrate", "image": "migrate:1"}, {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}],
                "containers": [{"name": "app", "image": "nginx:1.27"}]}})).unwrap();
        let (status_of, names) = (
            |status: &Value, kind: &str, index: usize| status[kind][index].clone(),
            |status: &Value, kind: &str| -> Vec<String> {
                status[kind]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| s["name"].as_str().unwrap().to_owned())
                    .collect()
            },
        );
        // ECI runs the sidecar as a container: it is reported where the pod lists it.
        let mut group = mk_group(
            "Running",
            vec![
                info("proxy", "Running", false, None),
                info("app", "Running", true, None),
            ],
        );
        group.init_containers = vec![info("migrate", "Terminated", false, Some(0))];
        let status = pod_status(&pod, &group, at(0));
        assert_eq!(
            names(&status, "initContainerStatuses"),
            ["migrate", "proxy"]
        );
        assert_eq!(names(&status, "containerStatuses"), ["app"]);
        let proxy = status_of(&status, "initContainerStatuses", 1);
        assert_eq!(
            (proxy["started"].clone(), proxy["ready"].clone()),
            (json!(true), json!(false))
        );
        // Started is enough for initialization; readiness waits for the sidecar too.
        assert_eq!(condition(&status, "Initialized")["status"], "True");
        let ready = condition(&status, "ContainersReady");
        assert_eq!(
            (ready["status"].as_str(), ready["message"].as_str()),
            (
                Some("False"),
                Some("containers with unready status: [proxy]")
            )
        );
        // Not started yet: not initialized.
        group.containers[0] = info("proxy", "Waiting", false, None);
        let status = pod_status(&pod, &group, at(0));
        let initialized = condition(&status, "Initialized");
        assert_eq!(
            initialized["message"],
            "containers with incomplete status: [proxy]"
        );
        // Both ready: the pod is.
        group.containers[0] = info("proxy", "Running", true, None);
        let status = pod_status(&pod, &group, at(0));
        assert_eq!(condition(&status, "Ready")["status"], "True");
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
            "eci://eci-1/app/0"
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

    /// (gates, conditions others set, group) → (ContainersReady, Ready, Ready's reason, message)
    type GateRow<'a> = (
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a ContainerGroupStatus,
        (&'a str, &'a str, Option<&'a str>, Option<&'a str>),
    );

    /// Our conditions as (type, status, reason).
    type Explained = Vec<(&'static str, String, Option<String>)>;

    /// (gates, the gate's condition, our conditions shown, observedGeneration shown) → Ready
    /// written, as (status, reason); `None`: nothing to write.
    type RefreshRow = (
        &'static [&'static str],
        Option<&'static str>,
        Explained,
        Option<i64>,
        Option<(&'static str, Option<&'static str>)>,
    );

    /// A pod with readiness gates, `shown` being the conditions it shows (type, status).
    fn gated_pod(gates: &[&str], shown: &[(&str, &str)]) -> Pod {
        let mut pod = mk_pod(false);
        pod.metadata.generation = Some(3);
        pod.spec.as_mut().unwrap().readiness_gates = Some(
            gates
                .iter()
                .map(|g| PodReadinessGate {
                    condition_type: (*g).into(),
                })
                .collect(),
        );
        let conditions = shown
            .iter()
            .map(|(kind, status)| json!({"type": kind, "status": status, "lastTransitionTime": "2026-11-21T03:00:00Z"}))
            .collect::<Vec<_>>();
        pod.status = Some(
            serde_json::from_value(json!({"phase": "Running", "conditions": conditions})).unwrap(),
        );
        pod
    }

    #[test]
    fn readiness_gates_hold_ready_like_the_kubelet() {
        let running = mk_group(
            "Running",
            vec![
                info("app", "Running", true, None),
                info("side", "Running", true, None),
            ],
        );
        let half = mk_group(
            "Running",
            vec![
                info("app", "Running", true, None),
                info("side", "Running", false, None),
            ],
        );
        const LB: &str = "example.com/lb-ready";
        const DNS: &str = "example.com/dns";
        let table: &[GateRow<'_>] = &[
            (&[], &[], &running, ("True", "True", None, None)),
            (
                &[LB],
                &[(LB, "True")],
                &running,
                ("True", "True", None, None),
            ),
            (
                &[LB],
                &[],
                &running,
                (
                    "True",
                    "False",
                    Some(READINESS_GATES_NOT_READY),
                    Some(
                        "corresponding condition of pod readiness gate \"example.com/lb-ready\" does not exist.",
                    ),
                ),
            ),
            (
                &[LB],
                &[(LB, "False")],
                &running,
                (
                    "True",
                    "False",
                    Some(READINESS_GATES_NOT_READY),
                    Some(
                        "the status of pod readiness gate \"example.com/lb-ready\" is not \"True\", but False",
                    ),
                ),
            ),
            (
                &[LB, DNS],
                &[(LB, "True"), (DNS, "Unknown")],
                &running,
                (
                    "True",
                    "False",
                    Some(READINESS_GATES_NOT_READY),
                    Some(
                        "the status of pod readiness gate \"example.com/dns\" is not \"True\", but Unknown",
                    ),
                ),
            ),
            (
                &[LB, DNS],
                &[],
                &running,
                (
                    "True",
                    "False",
                    Some(READINESS_GATES_NOT_READY),
                    Some(
                        "corresponding condition of pod readiness gate \"example.com/lb-ready\" does not exist., corresponding condition of pod readiness gate \"example.com/dns\" does not exist.",
                    ),
                ),
            ),
            // Unready containers explain Ready themselves, gates or not.
            (
                &[LB],
                &[(LB, "True")],
                &half,
                (
                    "False",
                    "False",
                    Some("ContainersNotReady"),
                    Some("containers with unready status: [side]"),
                ),
            ),
            (
                &[LB],
                &[],
                &half,
                (
                    "False",
                    "False",
                    Some("ContainersNotReady"),
                    Some("containers with unready status: [side]"),
                ),
            ),
        ];
        for (gates, shown, group, (containers_ready, ready, reason, message)) in table {
            let pod = gated_pod(gates, shown);
            let status = pod_status(&pod, group, at(0));
            let row = format!("gates {gates:?}, shown {shown:?}");
            assert_eq!(
                condition(&status, "ContainersReady")["status"],
                *containers_ready,
                "{row}"
            );
            let got = condition(&status, "Ready");
            assert_eq!(
                (
                    got["status"].as_str(),
                    got["reason"].as_str(),
                    got["message"].as_str()
                ),
                (Some(*ready), *reason, *message),
                "{row}"
            );
            // Only our conditions are written: the gate conditions are someone else's.
            let types: Vec<&str> = status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap())
                .collect();
            // (No resize waits here: the last of ours is absent.)
            assert_eq!(types, OWN_CONDITIONS[..5], "{row}");
            for c in status["conditions"].as_array().unwrap() {
                assert_eq!(c["observedGeneration"], 3, "{row}: {c}");
            }
            assert_eq!(status["observedGeneration"], 3, "{row}");
        }
    }

    #[test]
    fn a_pod_without_a_generation_gets_no_observed_generation() {
        let group = mk_group("Running", vec![info("app", "Running", true, None)]);
        let status = pod_status(&mk_pod(false), &group, at(0));
        assert!(status.get("observedGeneration").is_none());
        assert!(
            status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c.get("observedGeneration").is_none())
        );
        // A pod without init containers gets no empty list (the API would not keep it, and
        // the next comparison would see a change that is not one).
        assert!(status.get("initContainerStatuses").is_none());
    }

    #[test]
    fn refresh_rewrites_ready_when_a_gate_someone_else_or_the_generation_changes_and_only_then() {
        const LB: &str = "example.com/lb-ready";
        let ours_ready = |ready: &str, reason: &str| -> Explained {
            vec![
                ("PodScheduled", "True".into(), None),
                ("Initialized", "True".into(), None),
                ("ContainersReady", "True".into(), None),
                (
                    "Ready",
                    ready.into(),
                    (!reason.is_empty()).then(|| reason.to_owned()),
                ),
            ]
        };
        let table: Vec<RefreshRow> = vec![
            // The gate turned True while Ready says the gates hold it: Ready turns True.
            (
                &[LB],
                Some("True"),
                ours_ready("False", READINESS_GATES_NOT_READY),
                Some(3),
                Some(("True", None)),
            ),
            // The gate turned False while Ready is True: Ready turns False.
            (
                &[LB],
                Some("False"),
                ours_ready("True", ""),
                Some(3),
                Some(("False", Some(READINESS_GATES_NOT_READY))),
            ),
            // Nothing changed.
            (&[LB], Some("True"), ours_ready("True", ""), Some(3), None),
            // No gates: a Ready set apart from ContainersReady by someone else (the node
            // lifecycle controller, on the pods of a node it lost touch with) is put back.
            (
                &[],
                None,
                ours_ready("False", ""),
                Some(3),
                Some(("True", None)),
            ),
            // No gates, nothing changed.
            (&[], None, ours_ready("True", ""), Some(3), None),
            // A new generation is acknowledged even with nothing else to change.
            (
                &[],
                None,
                ours_ready("True", ""),
                Some(2),
                Some(("True", None)),
            ),
            // An API server that drops observedGeneration: never compared.
            (&[], None, ours_ready("True", ""), None, None),
            // Nothing written by us yet (no ContainersReady): nothing to refresh.
            (
                &[LB],
                Some("True"),
                vec![("PodScheduled", "True".into(), None)],
                None,
                None,
            ),
        ];
        for (gates, gate, ours, observed, expected) in table {
            let mut pod = gated_pod(gates, &[]);
            let mut conditions: Vec<Value> = ours
                .iter()
                .map(|(kind, status, reason)| json!({"type": kind, "status": status, "reason": reason, "lastTransitionTime": "2026-11-21T03:00:00Z", "observedGeneration": observed}))
                .collect();
            if let Some(gate) = gate {
                conditions.push(json!({"type": LB, "status": gate, "lastTransitionTime": "2026-11-21T03:00:01Z"}));
            }
            pod.status = Some(serde_json::from_value(json!({
                "phase": "Running", "podIP": "192.168.0.2", "qosClass": "BestEffort",
                "observedGeneration": observed, "conditions": conditions,
                "containerStatuses": [{"name": "app", "image": "nginx:1.27", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}],
            })).unwrap());
            let row = format!("gates {gates:?}, gate {gate:?}, observed {observed:?}");
            let written = refresh(&pod, at(60));
            let Some((status, reason)) = expected else {
                assert_eq!(written, None, "{row}");
                continue;
            };
            let written = written.unwrap_or_else(|| panic!("{row}: a write"));
            let ready = condition(&written, "Ready");
            assert_eq!(
                (ready["status"].as_str(), ready["reason"].as_str()),
                (Some(status), reason),
                "{row}"
            );
            // Everything else we own is carried along (an apply drops what it leaves out)…
            assert_eq!(written["podIP"], "192.168.0.2", "{row}");
            assert_eq!(written["containerStatuses"][0]["name"], "app", "{row}");
            assert_eq!(
                condition(&written, "ContainersReady")["status"],
                "True",
                "{row}"
            );
            // …and nothing that is someone else's.
            assert!(written.get("qosClass").is_none(), "{row}");
            assert!(
                written["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|c| c["type"] != LB),
                "{row}"
            );
            assert_eq!(written["observedGeneration"], 3, "{row}");
            // Times move only for a condition whose status changed.
            let moved = ready["lastTransitionTime"] != "2026-11-21T03:00:00Z";
            let before = ours
                .iter()
                .find(|(k, ..)| *k == "Ready")
                .map(|(_, s, _)| s.as_str());
            assert_eq!(moved, before != Some(status), "{row}");
            assert_eq!(
                condition(&written, "Initialized")["lastTransitionTime"],
                "2026-11-21T03:00:00Z",
                "{row}"
            );
            // Applying it again changes nothing.
            let mut after = pod.clone();
            let mut shown = written.clone();
            shown["conditions"]
                .as_array_mut()
                .unwrap()
                .extend(gate.map(|g| json!({"type": LB, "status": g})));
            after.status = Some(serde_json::from_value(shown).unwrap());
            assert_eq!(refresh(&after, at(90)), None, "{row}: settled");
        }
    }

    #[test]
    fn only_our_fields_and_conditions_are_owned() {
        let shown = json!({
            "phase": "Running", "qosClass": "Burstable", "nominatedNodeName": "x", "podIP": "10.0.0.1",
            "reason": null,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                {"type": "example.com/lb-ready", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        });
        assert_eq!(
            owned(&shown),
            json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]})
        );
        assert_eq!(owned(&json!({"qosClass": "BestEffort"})), json!({}));
    }

    #[test]
    fn status_resources_are_the_specs_with_the_size_eci_runs() {
        let container = |resources: Value| -> k8s_openapi::api::core::v1::Container {
            serde_json::from_value(json!({"name": "app", "resources": resources})).unwrap()
        };
        let runs = |cpu: f64, memory: f64| ContainerInfo {
            name: "app".into(),
            cpu,
            memory,
            ..ContainerInfo::default()
        };
        // (spec resources, what ECI runs (vCPU, GiB), the status's resources)
        let cases = [
            (
                json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
                Some((1.0, 1.0)),
                json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
            ),
            (
                json!({"requests": {"cpu": "100m", "memory": "200Mi"}}),
                Some((0.1, 0.195_312_5)),
                json!({"requests": {"cpu": "100m", "memory": "200Mi"}}),
            ),
            // A resize asked for 2 vCPU; the container still runs with 1.
            (
                json!({"limits": {"cpu": "2"}}),
                Some((1.0, 0.0)),
                json!({"limits": {"cpu": "1"}}),
            ),
            // ECI states no size (0): the spec's own values.
            (
                json!({"limits": {"memory": "512Mi"}}),
                Some((0.0, 0.0)),
                json!({"limits": {"memory": "512Mi"}}),
            ),
            (
                json!({"requests": {"cpu": "250m"}}),
                None,
                json!({"requests": {"cpu": "250m"}}),
            ),
            (json!({}), Some((1.0, 2.0)), Value::Null),
        ];
        for (spec, size, expected) in cases {
            let info = size.map(|(cpu, memory)| runs(cpu, memory));
            let shown = status_resources(&container(spec.clone()), info.as_ref());
            assert_eq!(
                shown.unwrap_or(Value::Null),
                expected,
                "{spec} running {size:?}"
            );
        }
    }

    #[test]
    fn a_running_containers_status_carries_its_resources_and_what_was_allocated() {
        let mut pod = mk_pod(false);
        pod.spec.as_mut().unwrap().containers[0].resources = Some(
            serde_json::from_value(
                json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
            )
            .unwrap(),
        );
        let mut app = info("app", "Running", true, None);
        (app.cpu, app.memory) = (1.0, 1.0);
        let group = mk_group("Running", vec![app, info("side", "Running", true, None)]);
        let shown = pod_status(&pod, &group, at(0));
        let app = &shown["containerStatuses"][0];
        assert_eq!(
            app["resources"],
            json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}})
        );
        assert_eq!(app["allocatedResources"], json!({"cpu": "500m"}));
        let side = &shown["containerStatuses"][1];
        assert!(side.get("resources").is_none() && side.get("allocatedResources").is_none());
    }

    #[test]
    fn a_container_config_error_shows_on_that_container_and_the_others_wait_to_be_created() {
        let shown = container_config_error(&mk_pod(true), "side", "missing value for X");
        assert_eq!(
            (shown["phase"].as_str(), shown["reason"].as_str()),
            (Some("Pending"), Some(CREATE_CONTAINER_CONFIG_ERROR))
        );
        let waiting = |key: &str, index: usize| {
            let status = &shown[key][index];
            (
                status["name"].as_str().unwrap_or_default().to_owned(),
                status["state"]["waiting"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                status["ready"] == false && status["restartCount"] == 0,
            )
        };
        assert_eq!(
            [
                waiting("initContainerStatuses", 0),
                waiting("containerStatuses", 0),
                waiting("containerStatuses", 1)
            ],
            [
                ("migrate".into(), "ContainerCreating".into(), true),
                ("app".into(), "ContainerCreating".into(), true),
                ("side".into(), CREATE_CONTAINER_CONFIG_ERROR.into(), true),
            ]
        );
        assert_eq!(
            shown["containerStatuses"][1]["state"]["waiting"]["message"],
            "missing value for X"
        );
    }

    #[test]
    fn failures_replace_phase_reason_and_message_and_keep_the_rest() {
        let group = mk_group(
            "Running",
            vec![
                info("app", "Running", true, None),
                info("side", "Running", true, None),
            ],
        );
        let mut pod = mk_pod(false);
        let mut shown = pod_status(&pod, &group, at(0));
        shown["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "DisruptionTarget", "status": "True"}));
        shown["qosClass"] = json!("BestEffort");
        pod.status = Some(serde_json::from_value(shown).unwrap());

        let pending = with_phase(&pod, "Pending", "ProviderFailed", "quota");
        assert_eq!(
            (
                pending["phase"].as_str(),
                pending["reason"].as_str(),
                pending["message"].as_str()
            ),
            (Some("Pending"), Some("ProviderFailed"), Some("quota"))
        );
        assert_eq!(pending["podIP"], "192.168.0.2");
        assert!(pending.get("qosClass").is_none());
        assert!(
            pending["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["type"] != "DisruptionTarget")
        );

        let lost = lost(
            &pod,
            "NotFound",
            "the ECI container group eci-1 no longer exists",
            at(60),
        );
        assert_eq!(
            (lost["phase"].as_str(), lost["reason"].as_str()),
            (Some("Failed"), Some("NotFound"))
        );
        for kind in ["ContainersReady", "Ready"] {
            let c = condition(&lost, kind);
            assert_eq!(
                (c["status"].as_str(), c["reason"].as_str()),
                (Some("False"), Some("PodCompleted")),
                "{kind}"
            );
            assert_eq!(c["lastTransitionTime"], rfc3339(at(60)), "{kind}");
        }
        assert_eq!(
            condition(&lost, "Initialized")["lastTransitionTime"],
            rfc3339(at(0))
        );
        let app = &lost["containerStatuses"][0];
        assert_eq!(
            app["state"]["terminated"]["reason"],
            "ContainerStatusUnknown"
        );
        assert_eq!(app["state"]["terminated"]["exitCode"], 137);
        assert_eq!(
            app["lastState"]["running"]["startedAt"],
            "2026-11-21T03:00:00Z"
        );
        assert_eq!(
            (app["ready"].as_bool(), app["started"].as_bool()),
            (Some(false), Some(false))
        );
        assert_eq!(
            app["containerID"], "eci://eci-1/app/0",
            "what is known of the container stays"
        );
        // A container already terminated keeps its own account of how it ended.
        let mut done = pod.clone();
        let mut exited = pod_status(
            &pod,
            &mk_group(
                "Running",
                vec![
                    info("app", "Terminated", false, Some(2)),
                    info("side", "Running", true, None),
                ],
            ),
            at(0),
        );
        exited["qosClass"] = json!("BestEffort");
        done.status = Some(serde_json::from_value(exited).unwrap());
        let lost = super::lost(&done, "NotFound", "gone", at(60));
        assert_eq!(
            lost["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            2
        );
        assert_eq!(
            lost["containerStatuses"][1]["state"]["terminated"]["reason"],
            "ContainerStatusUnknown"
        );
    }

    #[test]
    fn a_pod_stopped_at_its_deadline_fails_with_its_containers_killed() {
        let group = mk_group(
            "Running",
            vec![
                info("app", "Terminated", false, Some(0)),
                info("side", "Running", true, None),
            ],
        );
        let mut pod = mk_pod(false);
        pod.status = Some(serde_json::from_value(pod_status(&pod, &group, at(0))).unwrap());
        let stopped = stopped(&pod, DEADLINE_EXCEEDED, DEADLINE_MESSAGE, at(60));
        assert_eq!(
            (
                stopped["phase"].as_str(),
                stopped["reason"].as_str(),
                stopped["message"].as_str()
            ),
            (
                Some("Failed"),
                Some(DEADLINE_EXCEEDED),
                Some(DEADLINE_MESSAGE)
            )
        );
        assert_eq!(condition(&stopped, "Ready")["status"], "False");
        let side = &stopped["containerStatuses"][1];
        assert_eq!(
            side["state"]["terminated"],
            json!({"exitCode": 137, "reason": "Error",
                "startedAt": "2026-11-21T03:00:00Z", "finishedAt": rfc3339(at(60))})
        );
        assert!(
            side.get("lastState")
                .is_none_or(|l| l.get("running").is_none())
        );
        assert_eq!(side["ready"], false);
        // What ended on its own keeps its own account.
        assert_eq!(
            stopped["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            0
        );
    }

    #[test]
    fn a_group_eci_ended_at_its_deadline_shows_the_kubelets_reason() {
        let mut group = mk_group("Failed", vec![info("app", "Terminated", false, Some(137))]);
        let status = pod_status(&mk_pod(false), &group, at(0));
        assert_eq!(
            status["reason"],
            Value::Null,
            "a plain failure has no reason"
        );
        group.events.push(eci_proto::v20180808::Event {
            r#type: "Warning".into(),
            reason: DEADLINE_EXCEEDED.into(),
            message: DEADLINE_MESSAGE.into(),
            ..Default::default()
        });
        let status = pod_status(&mk_pod(false), &group, at(0));
        assert_eq!(
            (
                status["phase"].as_str(),
                status["reason"].as_str(),
                status["message"].as_str()
            ),
            (
                Some("Failed"),
                Some(DEADLINE_EXCEEDED),
                Some(DEADLINE_MESSAGE)
            )
        );
    }
}
