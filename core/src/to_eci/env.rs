//! Environment variables: literals, the downward API (with `status.podIP` handed to ECI's
//! field references), resources, ConfigMap and Secret keys (honouring `optional`), `envFrom`,
//! then the Service variables a kubelet adds (see [`crate::service_env`]).

use eci_proto::v20180808::{EnvironmentVar, FieldRef};
use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVarSource, Pod};

use super::downward::{self, FieldValue};
use super::{Context, Rejection, missing, reject};
use crate::expansion;

/// A name `envFrom` may give (a key, prefixed): the apiserver's relaxed rule, which the kubelet
/// relies on since relaxed names became the default: any printable ASCII but `=`. The API
/// already refuses such keys and prefixes; this keeps a name that could split a `NAME=value`
/// pair out of the group even so.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_graphic() || c == ' ')
        && !name.contains('=')
}

fn literal(key: &str, value: String) -> EnvironmentVar {
    EnvironmentVar {
        key: key.to_owned(),
        value,
        field_ref: None,
    }
}

/// The environment of `container` (`at` names it in rejections), followed by the `services`
/// variables it does not define itself.
pub(super) fn environment(
    pod: &Pod,
    container: &Container,
    cx: &Context<'_>,
    services: &[(String, String)],
    at: &str,
) -> Result<Vec<EnvironmentVar>, Rejection> {
    let mut vars: Vec<EnvironmentVar> = Vec::new();
    for (index, source) in container.env_from.iter().flatten().enumerate() {
        vars.extend(env_from(source, cx, &format!("{at}.envFrom[{index}]"))?);
    }
    for (index, var) in container.env.iter().flatten().enumerate() {
        let at = format!("{at}.env[{index}]");
        let Some(source) = &var.value_from else {
            // `$(NAME)` sees the Service variables and everything defined before it, as in
            // the kubelet; a name whose value only ECI knows (status.podIP) stays as written.
            let defined = |name: &str| {
                vars.iter()
                    .rev()
                    .find(|v| v.key == name)
                    .map(|v| (v.field_ref.is_none()).then_some(v.value.as_str()))
                    .unwrap_or_else(|| {
                        services
                            .iter()
                            .rev()
                            .find(|(key, _)| key == name)
                            .map(|(_, value)| value.as_str())
                    })
            };
            let value = expansion::expand(var.value.as_deref().unwrap_or_default(), defined);
            vars.push(literal(&var.name, value));
            continue;
        };
        vars.extend(value_from(pod, container, &var.name, source, cx, &at)?);
    }
    Ok(with_services(vars, services))
}

/// The variables of one `envFrom` source: its ConfigMap's or Secret's keys, prefixed (a
/// prefix may start with a digit or hold symbols, as the API allows).
fn env_from(
    source: &EnvFromSource,
    cx: &Context<'_>,
    at: &str,
) -> Result<Vec<EnvironmentVar>, Rejection> {
    let prefix = source.prefix.clone().unwrap_or_default();
    let entries: Vec<(String, String)> = if let Some(reference) = &source.config_map_ref {
        match cx.config_maps.get(&reference.name) {
            Some(map) => map.data.clone().unwrap_or_default().into_iter().collect(),
            None if reference.optional == Some(true) => Vec::new(),
            None => return Err(missing(at, "ConfigMap", &reference.name)),
        }
    } else if let Some(reference) = &source.secret_ref {
        match cx.secrets.get(&reference.name) {
            Some(secret) => secret
                .data
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect(),
            None if reference.optional == Some(true) => Vec::new(),
            None => return Err(missing(at, "Secret", &reference.name)),
        }
    } else {
        return Err(reject(at, "envFrom needs configMapRef or secretRef"));
    };
    Ok(entries
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .filter(|(k, _)| valid_env_name(k))
        .map(|(k, v)| literal(&k, v))
        .collect())
}

/// The variable `name` from its `valueFrom` source, if it has one (an optional key that is
/// missing gives none).
fn value_from(
    pod: &Pod,
    container: &Container,
    name: &str,
    source: &EnvVarSource,
    cx: &Context<'_>,
    at: &str,
) -> Result<Option<EnvironmentVar>, Rejection> {
    if let Some(selector) = &source.field_ref {
        return Ok(Some(
            match downward::field(pod, selector, cx.node_name, at, false)? {
                FieldValue::Literal(value) => literal(name, value),
                FieldValue::Eci(path) => EnvironmentVar {
                    key: name.to_owned(),
                    value: String::new(),
                    field_ref: Some(FieldRef {
                        field_path: path.to_owned(),
                    }),
                },
            },
        ));
    }
    if let Some(selector) = &source.resource_field_ref {
        let target = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
            None => container,
            Some(other) => pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
                .find(|c| c.name == other)
                .ok_or_else(|| reject(at, format!("resourceFieldRef names container {other:?}, which the pod does not have")))?,
        };
        let value = downward::resource(target, selector, cx.default_spec, at)?;
        return Ok(Some(literal(name, value)));
    }
    if let Some(selector) = &source.config_map_key_ref {
        let map = cx.config_maps.get(&selector.name);
        return match map
            .and_then(|m| m.data.as_ref())
            .and_then(|d| d.get(&selector.key))
        {
            Some(value) => Ok(Some(literal(name, value.clone()))),
            None if selector.optional == Some(true) => Ok(None),
            None if map.is_some() => Err(missing(
                at,
                "key in ConfigMap",
                &format!("{}/{}", selector.name, selector.key),
            )),
            None => Err(missing(at, "ConfigMap", &selector.name)),
        };
    }
    if let Some(selector) = &source.secret_key_ref {
        let secret = cx.secrets.get(&selector.name);
        return match secret
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(&selector.key))
        {
            Some(value) => Ok(Some(literal(
                name,
                String::from_utf8_lossy(&value.0).into_owned(),
            ))),
            None if selector.optional == Some(true) => Ok(None),
            None if secret.is_some() => Err(missing(
                at,
                "key in Secret",
                &format!("{}/{}", selector.name, selector.key),
            )),
            None => Err(missing(at, "Secret", &selector.name)),
        };
    }
    Err(reject(
        at,
        "valueFrom has no source ECI can use (fileKeyRef and others are not supported)",
    ))
}

/// `vars` with each name once (a later definition wins, as in Kubernetes), then the Service
/// variables the container did not define: the kubelet's order.
fn with_services(vars: Vec<EnvironmentVar>, services: &[(String, String)]) -> Vec<EnvironmentVar> {
    let mut seen = std::collections::HashSet::new();
    let mut deduplicated: Vec<EnvironmentVar> = vars
        .into_iter()
        .rev()
        .filter(|v| seen.insert(v.key.clone()))
        .collect();
    deduplicated.reverse();
    for (key, value) in services {
        if seen.insert(key.clone()) {
            deduplicated.push(literal(key, value.clone()));
        }
    }
    deduplicated
}
