//! The patch types of the Kubernetes API: JSON merge patch (RFC 7386), JSON patch (RFC 6902)
//! and strategic merge patch.
//!
//! The strategic merge patch knows the list merge keys by field name — the lists kubectl and
//! the daemon touch (containers, env, ports, volumes, volumeMounts, conditions,
//! ownerReferences, addresses, imagePullSecrets, hostAliases, finalizers) — rather than from a
//! per-type schema; other lists are replaced, as the API does for lists without a strategy. It
//! honours `$patch: delete|replace`, `$deleteFromPrimitiveList/<field>`, and accepts (and
//! ignores) `$setElementOrder/<field>` and `$retainKeys`.

use serde_json::{Map, Value};

/// How a patch body is to be applied, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// The patch type of a content type, if it is one.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// A patch that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatchError(pub String);

/// Applies `patch` of `kind` to `target`.
pub fn apply(kind: PatchType, target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    match kind {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(PatchError("a merge patch must be a JSON object".into()));
            }
            json_patch::merge(target, patch);
            Ok(())
        }
        PatchType::Json => {
            let operations: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|error| PatchError(format!("invalid JSON patch: {error}")))?;
            json_patch::patch(target, &operations).map_err(|error| PatchError(format!("the JSON patch could not be applied: {error}")))
        }
        PatchType::Strategic => {
            if !patch.is_object() {
                return Err(PatchError("a strategic merge patch must be a JSON object".into()));
            }
            strategic_merge(target, patch);
            Ok(())
        }
        PatchType::Apply => Err(PatchError(
            "server-side apply is not supported by the API stand-in; use a merge, JSON or strategic merge patch".into(),
        )),
    }
}

enum ListStrategy {
    MergeByKey(&'static str),
    MergePrimitives,
    Replace,
}

fn list_strategy(field: &str, items: &[Value]) -> ListStrategy {
    let has = |key: &str| items.iter().any(|item| item.get(key).is_some());
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => ListStrategy::MergeByKey("name"),
        "volumeMounts" => ListStrategy::MergeByKey("mountPath"),
        "volumeDevices" => ListStrategy::MergeByKey("devicePath"),
        "ports" if has("containerPort") => ListStrategy::MergeByKey("containerPort"),
        "ports" if has("port") => ListStrategy::MergeByKey("port"),
        "conditions" | "addresses" => ListStrategy::MergeByKey("type"),
        "ownerReferences" => ListStrategy::MergeByKey("uid"),
        "hostAliases" => ListStrategy::MergeByKey("ip"),
        "topologySpreadConstraints" => ListStrategy::MergeByKey("topologyKey"),
        "finalizers" => ListStrategy::MergePrimitives,
        _ => ListStrategy::Replace,
    }
}

/// Applies a strategic merge patch.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replacement = patch.clone();
        replacement.remove("$patch");
        *target = Value::Object(replacement);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(object) = target.as_object_mut() else {
        return;
    };
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) =
                (object.get_mut(field), value.as_array())
            {
                list.retain(|item| !remove.contains(item));
            }
            continue;
        }
        match value {
            Value::Null => {
                object.remove(key);
            }
            Value::Object(inner)
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") =>
            {
                object.remove(key);
            }
            Value::Array(items) => {
                let merged = merge_list(object.remove(key), key, items);
                object.insert(key.clone(), merged);
            }
            Value::Object(_) => {
                let entry = object.entry(key.clone()).or_insert(Value::Null);
                strategic_merge(entry, value);
            }
            _ => {
                object.insert(key.clone(), value.clone());
            }
        }
    }
}

fn merge_list(existing: Option<Value>, field: &str, items: &[Value]) -> Value {
    let replace_all = items
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace_all {
        return Value::Array(
            items
                .iter()
                .filter(|item| item.get("$patch").is_none())
                .cloned()
                .collect(),
        );
    }
    let mut list = match existing {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    };
    match list_strategy(field, items) {
        ListStrategy::Replace => return Value::Array(items.to_vec()),
        ListStrategy::MergePrimitives => {
            for item in items {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
        ListStrategy::MergeByKey(merge_key) => {
            for item in items {
                let key = item.get(merge_key);
                let position = key.and_then(|key| {
                    list.iter()
                        .position(|existing| existing.get(merge_key) == Some(key))
                });
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (position, delete) {
                    (Some(index), true) => {
                        list.remove(index);
                    }
                    (None, true) => {}
                    (Some(index), false) => strategic_merge(&mut list[index], item),
                    (None, false) => {
                        let mut fresh = Value::Null;
                        strategic_merge(&mut fresh, item);
                        list.push(fresh);
                    }
                }
            }
        }
    }
    Value::Array(list)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let mut pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"tolerations": [{"key": "x"}]}});
        apply(
            PatchType::Merge,
            &mut pod,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"tolerations": []}}),
        )
        .unwrap();
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"tolerations": []}})
        );
    }

    #[test]
    fn json_patch_operations_and_failures() {
        let mut pod = json!({"spec": {"tolerations": [{"key": "a"}]}});
        let patch = json!([
            {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "b"}},
            {"op": "test", "path": "/spec/tolerations/0/key", "value": "a"},
            {"op": "add", "path": "/spec/nodeSelector", "value": {"k": "v"}}
        ]);
        apply(PatchType::Json, &mut pod, &patch).unwrap();
        assert_eq!(pod["spec"]["tolerations"][1]["key"], "b");
        assert_eq!(pod["spec"]["nodeSelector"]["k"], "v");
        let failing = json!([{"op": "test", "path": "/spec/tolerations/0/key", "value": "zzz"}]);
        assert!(apply(PatchType::Json, &mut pod, &failing).is_err());
        assert!(apply(PatchType::Json, &mut pod, &json!({"op": "add"})).is_err());
    }

    #[test]
    fn strategic_merge_by_keys() {
        let mut pod = json!({
            "metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "rs"}]},
            "spec": {
                "containers": [
                    {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80}]},
                    {"name": "side", "image": "side:1"}
                ],
                "tolerations": [{"key": "old"}]
            },
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}
        });
        let patch = json!({
            "metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {
                "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
                "containers": [
                    {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}]},
                    {"name": "side", "$patch": "delete"}
                ],
                "tolerations": [{"key": "new"}]
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        apply(PatchType::Strategic, &mut pod, &patch).unwrap();
        assert_eq!(pod["metadata"]["finalizers"], json!(["b"]));
        let containers = pod["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0]["image"], "app:2");
        assert_eq!(
            containers[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(containers[0]["ports"], json!([{"containerPort": 80}]));
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([{"key": "new"}]),
            "lists without a strategy are replaced"
        );
        assert_eq!(
            pod["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
    }

    #[test]
    fn strategic_merge_directives() {
        let mut node = json!({"spec": {"unschedulable": true, "taints": [{"key": "a"}]}, "metadata": {"labels": {"x": "1"}}});
        apply(
            PatchType::Strategic,
            &mut node,
            &json!({"spec": {"unschedulable": null}}),
        )
        .unwrap();
        assert_eq!(node["spec"].get("unschedulable"), None);
        apply(
            PatchType::Strategic,
            &mut node,
            &json!({"metadata": {"labels": {"$patch": "replace", "y": "2"}}}),
        )
        .unwrap();
        assert_eq!(node["metadata"]["labels"], json!({"y": "2"}));
        apply(
            PatchType::Strategic,
            &mut node,
            &json!({"spec": {"taints": [{"key": "b"}, {"$patch": "replace"}]}}),
        )
        .unwrap();
        assert_eq!(node["spec"]["taints"], json!([{"key": "b"}]));
    }

    #[test]
    fn service_ports_merge_by_port() {
        let mut service = json!({"spec": {"ports": [{"port": 443, "name": "https"}]}});
        apply(
            PatchType::Strategic,
            &mut service,
            &json!({"spec": {"ports": [{"port": 443, "targetPort": 9443}, {"port": 80}]}}),
        )
        .unwrap();
        assert_eq!(
            service["spec"]["ports"],
            json!([{"port": 443, "name": "https", "targetPort": 9443}, {"port": 80}])
        );
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json"),
            Some(PatchType::Strategic)
        );
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
        assert!(apply(PatchType::Apply, &mut json!({}), &json!({})).is_err());
    }
}
