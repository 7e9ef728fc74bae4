//! `meta.k8s.io/v1` Table output, which `kubectl get` asks for: nodes and pods get kubectl's
//! usual columns, other types Name and Age.

use std::time::SystemTime;

use serde_json::{Value, json};

/// Whether the client asked for a Table.
pub(super) fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

fn column(name: &str, kind: &str, format: &str) -> Value {
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": 0})
}

fn age(object: &Value) -> String {
    let created = object
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    let Some(created) = created else {
        return "<unknown>".into();
    };
    let seconds = SystemTime::now()
        .duration_since(created)
        .map_or(0, |d| d.as_secs());
    match seconds {
        0..120 => format!("{seconds}s"),
        120..7_200 => format!("{}m", seconds / 60),
        7_200..172_800 => format!("{}h", seconds / 3_600),
        _ => format!("{}d", seconds / 86_400),
    }
}

fn name(object: &Value) -> String {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn node_status(node: &Value) -> String {
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    let mut status = match ready {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    status
}

fn node_roles(node: &Value) -> String {
    let labels = node.pointer("/metadata/labels").and_then(Value::as_object);
    let mut roles: Vec<String> = labels
        .into_iter()
        .flatten()
        .filter_map(
            |(key, value)| match key.strip_prefix("node-role.kubernetes.io/") {
                Some(role) => Some(role.to_owned()),
                None if key == "kubernetes.io/role" => value.as_str().map(str::to_owned),
                None => None,
            },
        )
        .collect();
    roles.sort();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

fn pod_columns(pod: &Value) -> Vec<Value> {
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses.iter().filter(|s| s["ready"] == true).count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    let waiting = statuses
        .iter()
        .find_map(|s| s.pointer("/state/waiting/reason").and_then(Value::as_str));
    let status = if pod.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating".to_owned()
    } else if let Some(reason) = waiting {
        reason.to_owned()
    } else {
        pod.pointer("/status/reason")
            .or_else(|| pod.pointer("/status/phase"))
            .and_then(Value::as_str)
            .unwrap_or("Pending")
            .to_owned()
    };
    vec![
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts),
        json!(age(pod)),
    ]
}

/// The objects of a list (or one object) as a Table.
pub(super) fn table(group: &str, plural: &str, objects: &[Value], resource_version: &str) -> Value {
    let mut columns = vec![column("Name", "string", "name")];
    let core = group.is_empty();
    match (core, plural) {
        (true, "nodes") => columns.extend([
            column("Status", "string", ""),
            column("Roles", "string", ""),
            column("Age", "string", ""),
            column("Version", "string", ""),
        ]),
        (true, "pods") => columns.extend([
            column("Ready", "string", ""),
            column("Status", "string", ""),
            column("Restarts", "integer", ""),
            column("Age", "string", ""),
        ]),
        _ => columns.push(column("Age", "string", "")),
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![json!(name(object))];
            match (core, plural) {
                (true, "nodes") => cells.extend([
                    json!(node_status(object)),
                    json!(node_roles(object)),
                    json!(age(object)),
                    object.pointer("/status/nodeInfo/kubeletVersion").cloned().unwrap_or_else(|| json!("")),
                ]),
                (true, "pods") => cells.extend(pod_columns(object)),
                _ => cells.push(json!(age(object))),
            }
            let metadata = object.get("metadata").cloned().unwrap_or_default();
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version}, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_rows_show_readiness_cordons_and_roles() {
        let node = json!({
            "metadata": {"name": "vn-0", "labels": {"kubernetes.io/role": "agent"}, "creationTimestamp": humantime::format_rfc3339_seconds(SystemTime::now()).to_string()},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.0-x"}}
        });
        let table = table("", "nodes", &[node], "5");
        let cells = &table["rows"][0]["cells"];
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "agent");
        assert!(cells[3].as_str().unwrap().ends_with('s'));
        assert_eq!(cells[4], "v1.33.0-x");
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
    }

    #[test]
    fn pod_rows_show_readiness_and_status() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{}, {}]}, "status": {"phase": "Running",
            "containerStatuses": [{"ready": true, "restartCount": 2}, {"ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        let cells = table("", "pods", &[pod], "1")["rows"][0]["cells"].clone();
        assert_eq!(
            cells,
            json!(["p", "1/2", "CrashLoopBackOff", 3, "<unknown>"])
        );
    }
}
