//! Downward API values: the pod fields (`fieldRef`) and container resources
//! (`resourceFieldRef`) an env var or a downwardAPI volume file can expose, as the kubelet
//! resolves them (`pkg/fieldpath` and `ExtractResourceValueByContainerName`).
//!
//! Values known only where the pod runs (its IPs, its node) are named, not resolved: the daemon
//! hands those to ECI, the host agent fills them in itself.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::{Quantity, QuantityError};

/// A reference the kubelet would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownwardError {
    /// A `fieldRef` path the kubelet does not resolve (or a whole map outside a volume).
    #[error(
        "fieldRef {path:?} is not supported; use metadata.name|namespace|uid|labels['k']|annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP(s) or status.hostIP(s)"
    )]
    UnsupportedField {
        /// The path given.
        path: String,
    },
    /// A `resourceFieldRef` resource other than `limits.` or `requests.` of cpu, memory,
    /// ephemeral-storage or a huge page size.
    #[error("resourceFieldRef {resource:?} is not a supported resource field")]
    UnsupportedResource {
        /// The resource given.
        resource: String,
    },
    /// A negative divisor.
    #[error("resourceFieldRef divisor {divisor:?} must be positive")]
    Divisor {
        /// The divisor given.
        divisor: String,
    },
    /// A quantity (the container's resource or the divisor) that does not parse.
    #[error("resourceFieldRef")]
    Quantity(#[from] QuantityError),
}

/// What a `fieldRef` resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// Known from the pod object.
    Known(String),
    /// `spec.nodeName`: the node the pod runs on.
    NodeName,
    /// `status.podIP`: the pod's (first) address.
    PodIp,
    /// `status.podIPs`: its addresses, comma-separated.
    PodIps,
    /// `status.hostIP` and `status.hostIPs`: the node's address.
    HostIp,
}

/// Resolves a `fieldRef` path. `whole_maps` allows `metadata.labels` and
/// `metadata.annotations` themselves, which only downwardAPI volume files may name.
pub fn field(pod: &Pod, path: &str, whole_maps: bool) -> Result<FieldValue, DownwardError> {
    let meta = &pod.metadata;
    let known = |value: Option<&String>| Ok(FieldValue::Known(value.cloned().unwrap_or_default()));
    if let Some(key) = subscript(path, "metadata.labels") {
        return known(meta.labels.as_ref().and_then(|m| m.get(key)));
    }
    if let Some(key) = subscript(path, "metadata.annotations") {
        return known(meta.annotations.as_ref().and_then(|m| m.get(key)));
    }
    match path {
        "metadata.name" => known(meta.name.as_ref()),
        "metadata.namespace" => known(meta.namespace.as_ref()),
        "metadata.uid" => known(meta.uid.as_ref()),
        "metadata.labels" if whole_maps => Ok(FieldValue::Known(map_file(meta.labels.as_ref()))),
        "metadata.annotations" if whole_maps => {
            Ok(FieldValue::Known(map_file(meta.annotations.as_ref())))
        }
        "spec.nodeName" => Ok(FieldValue::NodeName),
        "spec.serviceAccountName" => known(
            pod.spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_ref()),
        ),
        "status.podIP" => Ok(FieldValue::PodIp),
        "status.podIPs" => Ok(FieldValue::PodIps),
        "status.hostIP" | "status.hostIPs" => Ok(FieldValue::HostIp),
        _ => Err(DownwardError::UnsupportedField {
            path: path.to_owned(),
        }),
    }
}

/// `metadata.labels['key']` → `key` (the only subscript form the API accepts).
fn subscript<'p>(path: &'p str, field: &str) -> Option<&'p str> {
    path.strip_prefix(field)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

/// Labels or annotations as the kubelet writes them to a file: `key="value"` lines sorted by
/// key, each value quoted as Go's `%q` quotes it.
pub fn map_file(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(key, value)| format!("{key}={}", go_quote(value)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote`. Go also escapes printable-looking runes it classes as not printable
/// (format characters such as U+00AD); Rust's standard library has no such class, so those are
/// written as they are.
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Which of a container's resource lists a `resourceFieldRef` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `limits.<name>`.
    Limits,
    /// `requests.<name>`.
    Requests,
}

/// Resolves a `resourceFieldRef` (`limits.cpu`, `requests.memory`, …) against `container`.
/// `unset` gives the value of a resource the container does not set (the kubelet: the node's
/// allocatable for limits, zero for requests). The value is rounded up to a whole number of
/// divisors: for CPU in milli-units, for the rest in units, as the kubelet does.
pub fn resource(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    unset: impl Fn(Side, &str) -> Quantity,
) -> Result<String, DownwardError> {
    let unsupported = || DownwardError::UnsupportedResource {
        resource: resource.to_owned(),
    };
    let (side, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let side = match side {
        "limits" => Side::Limits,
        "requests" => Side::Requests,
        _ => return Err(unsupported()),
    };
    let known = matches!(name, "cpu" | "memory" | "ephemeral-storage");
    if !known && !name.starts_with("hugepages-") {
        return Err(unsupported());
    }
    let resources = container.resources.as_ref();
    let list = match side {
        Side::Limits => resources.and_then(|r| r.limits.as_ref()),
        Side::Requests => resources.and_then(|r| r.requests.as_ref()),
    };
    let value = match list.and_then(|m| m.get(name)) {
        Some(set) => Quantity::parse(&set.0)?,
        None => unset(side, name),
    };
    let divisor_text = divisor.filter(|d| !d.is_empty()).unwrap_or("1");
    let mut by = Quantity::parse(divisor_text)?;
    // An unset divisor reaches us as "0" (the API's zero quantity): the kubelet divides by 1.
    if by.nanos() == 0 {
        by = Quantity::parse("1")?;
    }
    if by.nanos() < 0 {
        return Err(DownwardError::Divisor {
            divisor: divisor_text.to_owned(),
        });
    }
    let units = if name == "cpu" {
        div_ceil(value.milli_ceil(), by.milli_ceil())
    } else {
        div_ceil(value.value_ceil(), by.value_ceil())
    };
    Ok(units.to_string())
}

/// `a / b` rounded towards positive infinity (`b` > 0).
fn div_ceil(a: i128, b: i128) -> i128 {
    a.div_euclid(b) + i128::from(a.rem_euclid(b) != 0)
}

#[cfg(test)]
mod tests;
