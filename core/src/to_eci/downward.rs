//! Downward API values on ECI: the kubelet's resolution ([`crate::downward`]) with what only
//! ECI knows left to ECI. Shared by [`super::env`] and [`super::volumes`].

use crate::downward::{self as core, Side};
use crate::quantity::{Format, Quantity};
use k8s_openapi::api::core::v1::{Container, ObjectFieldSelector, Pod, ResourceFieldSelector};

use super::{Rejection, reject};

/// What a field reference resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FieldValue {
    /// Known now.
    Literal(String),
    /// Known only once ECI runs the group (`status.podIP`, `status.hostIP`): ECI fills it in.
    Eci(&'static str),
}

/// Resolves a `fieldRef`. `node` is the virtual node's name.
pub(super) fn field(
    pod: &Pod,
    selector: &ObjectFieldSelector,
    node: &str,
    at: &str,
    allow_maps: bool,
) -> Result<FieldValue, Rejection> {
    let value = core::field(pod, &selector.field_path, allow_maps)
        .map_err(|e| reject(at, e.to_string()))?;
    Ok(match value {
        core::FieldValue::Known(text) => FieldValue::Literal(text),
        core::FieldValue::NodeName => FieldValue::Literal(node.to_owned()),
        // An ECI group has one address.
        core::FieldValue::PodIp | core::FieldValue::PodIps => FieldValue::Eci("status.podIP"),
        core::FieldValue::HostIp => FieldValue::Eci("status.hostIP"),
    })
}

/// Resolves a `resourceFieldRef` against `container`, sized as ECI sizes it: a resource the
/// container leaves unset is the other list's (the apiserver defaults requests to limits),
/// else `default`, the group's default size (cores, GiB); ephemeral storage is ECI's 30 GiB.
pub(super) fn resource(
    container: &Container,
    selector: &ResourceFieldSelector,
    default: (f64, f64),
    at: &str,
) -> Result<String, Rejection> {
    let name = selector
        .resource
        .split_once('.')
        .map_or("", |(_, name)| name);
    if !matches!(name, "cpu" | "memory" | "ephemeral-storage") {
        return Err(reject(
            at,
            format!(
                "resourceFieldRef {:?} is not supported; use limits or requests of cpu, memory or ephemeral-storage",
                selector.resource
            ),
        ));
    }
    let unset = |side: Side, name: &str| {
        let resources = container.resources.as_ref();
        let other = match side {
            Side::Limits => resources.and_then(|r| r.requests.as_ref()),
            Side::Requests => resources.and_then(|r| r.limits.as_ref()),
        };
        let from_other = other
            .and_then(|list| list.get(name))
            .and_then(|q| Quantity::parse(&q.0).ok());
        from_other.unwrap_or_else(|| group_default(name, default))
    };
    let divisor = selector.divisor.as_ref().map(|q| q.0.as_str());
    core::resource(container, &selector.resource, divisor, unset)
        .map_err(|e| reject(at, e.to_string()))
}

/// The group's default size of `name` when no container sets it.
fn group_default(name: &str, (cores, gib): (f64, f64)) -> Quantity {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let amount = match name {
        "cpu" => cores,
        "memory" => gib * GIB,
        _ => 30.0 * GIB,
    };
    // Whole milli-units: a group's size never has finer parts.
    #[allow(clippy::cast_possible_truncation)]
    let millis = (amount * 1000.0).round() as i128;
    Quantity::from_nanos(millis * 1_000_000, Format::DecimalSi)
}
