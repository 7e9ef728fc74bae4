//! Downward API values: the pod fields and container resources env vars and downwardAPI
//! volumes can expose. Shared by [`super::env`] and [`super::volumes`].

use k8s_openapi::api::core::v1::{Container, ObjectFieldSelector, Pod, ResourceFieldSelector};

use super::{Rejection, reject};
use crate::k8s::quantity;

/// What a field reference resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FieldValue {
    /// Known now.
    Literal(String),
    /// Known only once ECI runs the group (`status.podIP`, `status.hostIP`): ECI fills it in.
    Eci(&'static str),
}

fn map_entry(map: Option<&std::collections::BTreeMap<String, String>>, key: &str) -> String {
    map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
}

/// `key="value"` lines, sorted, as the kubelet writes label and annotation files.
pub(super) fn map_file(map: Option<&std::collections::BTreeMap<String, String>>) -> String {
    map.map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n")
    })
    .unwrap_or_default()
}

/// Resolves a `fieldRef`. `node` is the virtual node's name.
pub(super) fn field(
    pod: &Pod,
    selector: &ObjectFieldSelector,
    node: &str,
    at: &str,
    allow_maps: bool,
) -> Result<FieldValue, Rejection> {
    let meta = &pod.metadata;
    let path = selector.field_path.as_str();
    let literal = |s: Option<&String>| Ok(FieldValue::Literal(s.cloned().unwrap_or_default()));
    let bracketed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['").or_else(|| rest.strip_prefix("[\"")))
            .and_then(|rest| rest.strip_suffix("']").or_else(|| rest.strip_suffix("\"]")))
    };
    match path {
        "metadata.name" => literal(meta.name.as_ref()),
        "metadata.namespace" => literal(meta.namespace.as_ref()),
        "metadata.uid" => literal(meta.uid.as_ref()),
        "spec.nodeName" => Ok(FieldValue::Literal(node.to_owned())),
        "spec.serviceAccountName" => literal(
            pod.spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_ref()),
        ),
        "status.podIP" | "status.podIPs" => Ok(FieldValue::Eci("status.podIP")),
        "status.hostIP" | "status.hostIPs" => Ok(FieldValue::Eci("status.hostIP")),
        "metadata.labels" if allow_maps => Ok(FieldValue::Literal(map_file(meta.labels.as_ref()))),
        "metadata.annotations" if allow_maps => {
            Ok(FieldValue::Literal(map_file(meta.annotations.as_ref())))
        }
        _ => {
            if let Some(key) = bracketed("metadata.labels") {
                return Ok(FieldValue::Literal(map_entry(meta.labels.as_ref(), key)));
            }
            if let Some(key) = bracketed("metadata.annotations") {
                return Ok(FieldValue::Literal(map_entry(
                    meta.annotations.as_ref(),
                    key,
                )));
            }
            Err(reject(
                at,
                format!(
                    "fieldRef {path:?} is not supported; use metadata.name|namespace|uid|labels['k']|annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP or status.hostIP"
                ),
            ))
        }
    }
}

/// Resolves a `resourceFieldRef` against `container` (sized as ECI sizes it: the limit, else
/// the request, else `default` — the group's default size).
pub(super) fn resource(
    container: &Container,
    selector: &ResourceFieldSelector,
    default: (f64, f64),
    at: &str,
) -> Result<String, Rejection> {
    let resources = container.resources.as_ref();
    let pick = |field: &str, kind: &str| {
        let from = |map: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >| { map.and_then(|m| m.get(kind)).map(|q| q.0.clone()) };
        match field {
            "limits" => from(resources.and_then(|r| r.limits.as_ref()))
                .or_else(|| from(resources.and_then(|r| r.requests.as_ref()))),
            _ => from(resources.and_then(|r| r.requests.as_ref()))
                .or_else(|| from(resources.and_then(|r| r.limits.as_ref()))),
        }
    };
    let (field, kind) = selector.resource.split_once('.').ok_or_else(|| {
        reject(
            at,
            format!(
                "resourceFieldRef {:?} is not a resource field",
                selector.resource
            ),
        )
    })?;
    let value = match kind {
        "cpu" => match pick(field, "cpu") {
            Some(q) => quantity::parse(&q).map_err(|e| reject(at, e.to_string()))?,
            None => default.0,
        },
        "memory" => match pick(field, "memory") {
            Some(q) => quantity::parse(&q).map_err(|e| reject(at, e.to_string()))?,
            None => default.1 * 1024.0 * 1024.0 * 1024.0,
        },
        "ephemeral-storage" => match pick(field, "ephemeral-storage") {
            Some(q) => quantity::parse(&q).map_err(|e| reject(at, e.to_string()))?,
            None => 30.0 * 1024.0 * 1024.0 * 1024.0,
        },
        other => {
            return Err(reject(
                at,
                format!(
                    "resourceFieldRef resource {other:?} is not supported; use cpu, memory or ephemeral-storage"
                ),
            ));
        }
    };
    let divisor = match &selector.divisor {
        Some(q) => quantity::parse(&q.0).map_err(|e| reject(at, e.to_string()))?,
        None => 1.0,
    };
    if divisor <= 0.0 {
        return Err(reject(at, "resourceFieldRef divisor must be positive"));
    }
    // The kubelet rounds up to a whole number of divisors.
    #[allow(clippy::cast_possible_truncation)]
    let units = (value / divisor - 1e-9).ceil().max(0.0) as u64;
    Ok(units.to_string())
}
