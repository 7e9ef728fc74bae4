//! A container's environment, resolved the kubelet's way (pure: the ConfigMaps, Secrets and
//! Services it reads are fetched beforehand).
//!
//! Order, as `kubelet_pods.go` `makeEnvironmentVariables`: `envFrom` sources in order, then
//! `env` entries in order (each may refer to the variables before it and to the service
//! variables with `$(VAR)`), then the service variables that nothing overrode.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};

/// Resolving a container's environment (or a downward API value) failed; the kubelet reports
/// these as `CreateContainerConfigError`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    /// A referenced ConfigMap does not exist and the reference is not optional.
    #[error("configmap \"{name}\" not found")]
    ConfigMapNotFound {
        /// The ConfigMap.
        name: String,
    },
    /// A referenced ConfigMap key does not exist and the reference is not optional.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound {
        /// The pod's namespace.
        namespace: String,
        /// The ConfigMap.
        name: String,
        /// The key.
        key: String,
    },
    /// A referenced Secret does not exist and the reference is not optional.
    #[error("secret \"{name}\" not found")]
    SecretNotFound {
        /// The Secret.
        name: String,
    },
    /// A referenced Secret key does not exist and the reference is not optional.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound {
        /// The pod's namespace.
        namespace: String,
        /// The Secret.
        name: String,
        /// The key.
        key: String,
    },
    /// A `fieldRef` names a field the kubelet does not support there.
    #[error("unsupported fieldPath: {path}")]
    UnsupportedFieldPath {
        /// The field path.
        path: String,
    },
    /// A `resourceFieldRef` names an unsupported resource.
    #[error("unsupported container resource: {resource}")]
    UnsupportedResource {
        /// The resource (e.g. `limits.cpu`).
        resource: String,
    },
    /// A `resourceFieldRef` names a container the pod does not have.
    #[error("container {name} not found in the pod")]
    ContainerNotFound {
        /// The container.
        name: String,
    },
    /// A quantity (resource value or divisor) does not parse.
    #[error("invalid quantity {value:?}")]
    InvalidQuantity {
        /// The text.
        value: String,
    },
}

/// What the pod's sandbox knows that the Pod object from the watch may not show yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FieldContext<'a> {
    /// The pod.
    pub(crate) pod: &'a Pod,
    /// The pod's IPs (its loopback address).
    pub(crate) pod_ips: &'a [String],
    /// The node's IP.
    pub(crate) host_ip: &'a str,
}

/// The ConfigMaps and Secrets (of the pod's namespace) an environment refers to; `None`: not
/// found.
#[derive(Debug, Default, Clone)]
pub(crate) struct EnvSources {
    /// ConfigMaps by name.
    pub(crate) config_maps: BTreeMap<String, Option<ConfigMap>>,
    /// Secrets by name.
    pub(crate) secrets: BTreeMap<String, Option<Secret>>,
}

/// The node's allocatable resources: the kubelet's default for unset limits.
pub(crate) const NODE_ALLOCATABLE: &[(&str, &str)] = &[
    ("cpu", "8"),
    ("memory", "16Gi"),
    ("ephemeral-storage", "100Gi"),
    ("pods", "110"),
];

/// Names of the ConfigMaps and Secrets the container's environment refers to.
pub(crate) fn referenced_objects(container: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for from in container.env_from.iter().flatten() {
        if let Some(cm) = &from.config_map_ref {
            config_maps.insert(cm.name.clone());
        }
        if let Some(secret) = &from.secret_ref {
            secrets.insert(secret.name.clone());
        }
    }
    for var in container.env.iter().flatten() {
        let Some(source) = &var.value_from else {
            continue;
        };
        if let Some(cm) = &source.config_map_key_ref {
            config_maps.insert(cm.name.clone());
        }
        if let Some(secret) = &source.secret_key_ref {
            secrets.insert(secret.name.clone());
        }
    }
    (config_maps, secrets)
}

/// The service variables of the kubelet's `envvars.FromServices`: `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT[_<PORT>]` and the Docker link variables, for the Services (with a
/// cluster IP) of the pod's namespace when `enableServiceLinks` is not false, and always for
/// `kubernetes` (here the API server itself, `api_host:api_port`; the real `default/kubernetes`
/// Service is skipped).
pub(crate) fn service_env<'s>(
    pod: &Pod,
    services: impl IntoIterator<Item = &'s Service>,
    api_host: &str,
    api_port: u16,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.enable_service_links)
        .unwrap_or(true);
    if links {
        let mut in_namespace: Vec<&Service> = services
            .into_iter()
            .filter(|svc| svc.metadata.namespace.as_deref() == Some(namespace))
            .filter(|svc| {
                !(namespace == "default" && svc.metadata.name.as_deref() == Some("kubernetes"))
            })
            .collect();
        in_namespace.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for svc in in_namespace {
            let Some(spec) = &svc.spec else { continue };
            let Some(ip) = spec
                .cluster_ip
                .as_deref()
                .filter(|ip| !ip.is_empty() && *ip != "None")
            else {
                continue;
            };
            let ports: Vec<(Option<&str>, i32, &str)> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.as_deref(),
                        p.port,
                        p.protocol.as_deref().unwrap_or("TCP"),
                    )
                })
                .collect();
            push_service_vars(
                &mut out,
                svc.metadata.name.as_deref().unwrap_or_default(),
                ip,
                &ports,
            );
        }
    }
    push_service_vars(
        &mut out,
        "kubernetes",
        api_host,
        &[(Some("https"), i32::from(api_port), "TCP")],
    );
    out
}

fn push_service_vars(
    out: &mut Vec<(String, String)>,
    name: &str,
    ip: &str,
    ports: &[(Option<&str>, i32, &str)],
) {
    let Some((_, first, _)) = ports.first() else {
        return;
    };
    let prefix = name.replace('-', "_").to_uppercase();
    out.push((format!("{prefix}_SERVICE_HOST"), ip.to_owned()));
    out.push((format!("{prefix}_SERVICE_PORT"), first.to_string()));
    for (port_name, port, _) in ports {
        if let Some(port_name) = port_name.filter(|n| !n.is_empty()) {
            let suffix = port_name.replace('-', "_").to_uppercase();
            out.push((format!("{prefix}_SERVICE_PORT_{suffix}"), port.to_string()));
        }
    }
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    for (i, (_, port, protocol)) in ports.iter().enumerate() {
        let lower = protocol.to_lowercase();
        let url = format!("{lower}://{host}:{port}");
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{port}_{}", protocol.to_uppercase());
        out.push((port_prefix.clone(), url));
        out.push((format!("{port_prefix}_PROTO"), lower));
        out.push((format!("{port_prefix}_PORT"), port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), ip.to_owned()));
    }
}

/// The container's environment, in a stable order (`envFrom`/`env` order, then the service
/// variables). `service_env` comes from [`service_env`].
pub(crate) fn resolve(
    ctx: FieldContext<'_>,
    container: &Container,
    sources: &EnvSources,
    service_env: &[(String, String)],
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = ctx.pod.metadata.namespace.as_deref().unwrap_or("default");
    let services: HashMap<&str, &str> = service_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut env = OrderedEnv::default();

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        if let Some(cm_ref) = &from.config_map_ref {
            match sources
                .config_maps
                .get(&cm_ref.name)
                .and_then(Option::as_ref)
            {
                Some(cm) => {
                    for (key, value) in cm.data.iter().flatten() {
                        env.set(&format!("{prefix}{key}"), value.clone());
                    }
                }
                None if cm_ref.optional == Some(true) => {}
                None => {
                    return Err(EnvError::ConfigMapNotFound {
                        name: cm_ref.name.clone(),
                    });
                }
            }
        }
        if let Some(secret_ref) = &from.secret_ref {
            match sources
                .secrets
                .get(&secret_ref.name)
                .and_then(Option::as_ref)
            {
                Some(secret) => {
                    for (key, value) in secret.data.iter().flatten() {
                        env.set(
                            &format!("{prefix}{key}"),
                            String::from_utf8_lossy(&value.0).into_owned(),
                        );
                    }
                }
                None if secret_ref.optional == Some(true) => {}
                None => {
                    return Err(EnvError::SecretNotFound {
                        name: secret_ref.name.clone(),
                    });
                }
            }
        }
    }

    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let raw = var.value.as_deref().unwrap_or_default();
                expand(raw, |name| {
                    env.get(name).or_else(|| services.get(name).copied())
                })
            }
            Some(source) => {
                if let Some(field) = &source.field_ref {
                    env_field_value(ctx, &field.field_path)?
                } else if let Some(resource) = &source.resource_field_ref {
                    let target = match resource.container_name.as_deref().filter(|n| !n.is_empty())
                    {
                        Some(name) => find_container(ctx.pod, name)?,
                        None => container,
                    };
                    resource_value(
                        target,
                        &resource.resource,
                        resource.divisor.as_ref().map(|d| d.0.as_str()),
                    )?
                } else if let Some(key_ref) = &source.config_map_key_ref {
                    let optional = key_ref.optional == Some(true);
                    match sources
                        .config_maps
                        .get(&key_ref.name)
                        .and_then(Option::as_ref)
                    {
                        None if optional => continue,
                        None => {
                            return Err(EnvError::ConfigMapNotFound {
                                name: key_ref.name.clone(),
                            });
                        }
                        Some(cm) => match cm.data.as_ref().and_then(|d| d.get(&key_ref.key)) {
                            Some(value) => value.clone(),
                            None if optional => continue,
                            None => {
                                return Err(EnvError::ConfigMapKeyNotFound {
                                    namespace: namespace.to_owned(),
                                    name: key_ref.name.clone(),
                                    key: key_ref.key.clone(),
                                });
                            }
                        },
                    }
                } else if let Some(key_ref) = &source.secret_key_ref {
                    let optional = key_ref.optional == Some(true);
                    match sources.secrets.get(&key_ref.name).and_then(Option::as_ref) {
                        None if optional => continue,
                        None => {
                            return Err(EnvError::SecretNotFound {
                                name: key_ref.name.clone(),
                            });
                        }
                        Some(secret) => {
                            match secret.data.as_ref().and_then(|d| d.get(&key_ref.key)) {
                                Some(value) => String::from_utf8_lossy(&value.0).into_owned(),
                                None if optional => continue,
                                None => {
                                    return Err(EnvError::SecretKeyNotFound {
                                        namespace: namespace.to_owned(),
                                        name: key_ref.name.clone(),
                                        key: key_ref.key.clone(),
                                    });
                                }
                            }
                        }
                    }
                } else {
                    String::new()
                }
            }
        };
        env.set(&var.name, value);
    }

    for (name, value) in service_env {
        if env.get(name).is_none() {
            env.set(name, value.clone());
        }
    }
    Ok(env.into_vec())
}

/// The container's command line: `command` (else none: the image's default) and `args`, with
/// `$(VAR)` expanded against the resolved environment.
pub(crate) fn expand_command(
    container: &Container,
    env: &[(String, String)],
) -> (Vec<String>, Vec<String>) {
    let vars: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let lookup = |name: &str| vars.get(name).copied();
    let command = container
        .command
        .iter()
        .flatten()
        .map(|part| expand(part, lookup))
        .collect();
    let args = container
        .args
        .iter()
        .flatten()
        .map(|part| expand(part, lookup))
        .collect();
    (command, args)
}

/// `$(VAR)` expansion as Kubernetes' `third_party/forked/golang/expansion`: `$(NAME)` becomes
/// the variable's value, or stays as written when there is none; `$$` is a literal `$`; any
/// other `$` (also a trailing one, and an unclosed `$(`) stays as it is.
pub(crate) fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if after.is_empty() {
            out.push('$');
            rest = after;
            break;
        }
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(close) => {
                    let name = &inner[..close];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[close + 1..];
                }
                None => {
                    // Incomplete reference: `$(` is kept and scanning goes on after it.
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            // `$` followed by anything else: both kept.
            let next = after.chars().next().map_or(0, char::len_utf8);
            out.push('$');
            out.push_str(&after[..next]);
            rest = &after[next..];
        }
    }
    out.push_str(rest);
    out
}

/// A `fieldRef` value for an environment variable.
pub(crate) fn env_field_value(ctx: FieldContext<'_>, path: &str) -> Result<String, EnvError> {
    field_value(ctx, path, false)
}

/// A `fieldRef` value: the paths the kubelet supports; `whole_maps` allows `metadata.labels`
/// and `metadata.annotations` (downward API volumes only), rendered as sorted `key="value"`
/// lines.
pub(crate) fn field_value(
    ctx: FieldContext<'_>,
    path: &str,
    whole_maps: bool,
) -> Result<String, EnvError> {
    let pod = ctx.pod;
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let unsupported = || EnvError::UnsupportedFieldPath {
        path: path.to_owned(),
    };
    if let Some(key) = subscript(path, "metadata.labels") {
        return Ok(meta
            .labels
            .as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default());
    }
    if let Some(key) = subscript(path, "metadata.annotations") {
        return Ok(meta
            .annotations
            .as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default());
    }
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" if whole_maps => format_map(meta.labels.as_ref()),
        "metadata.annotations" if whole_maps => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_owned(),
        _ => return Err(unsupported()),
    };
    Ok(value)
}

/// `metadata.labels['key']` → `key`.
fn subscript<'p>(path: &'p str, field: &str) -> Option<&'p str> {
    let inner = path
        .strip_prefix(field)?
        .strip_prefix("['")?
        .strip_suffix("']")?;
    Some(inner)
}

/// The downward API's rendering of labels and annotations: `key="value"` lines, sorted, the
/// value quoted like Go's `%q`.
pub(crate) fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote` for the characters that appear in labels and annotations.
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn find_container<'p>(pod: &'p Pod, name: &str) -> Result<&'p Container, EnvError> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
        .ok_or_else(|| EnvError::ContainerNotFound {
            name: name.to_owned(),
        })
}

/// A `resourceFieldRef` value (`limits.cpu`, `requests.memory`, …): unset limits default to the
/// node's allocatable, unset requests to 0; CPU is rounded up in units of the divisor's
/// milli-value, everything else in units of its value (kubelet `ExtractResourceValueByContainerName`).
pub(crate) fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, EnvError> {
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| EnvError::UnsupportedResource {
            resource: resource.to_owned(),
        })?;
    let supported =
        matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
    if !supported || !matches!(kind, "limits" | "requests") {
        return Err(EnvError::UnsupportedResource {
            resource: resource.to_owned(),
        });
    }
    let resources = container.resources.as_ref();
    let set = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        _ => resources.and_then(|r| r.requests.as_ref()),
    }
    .and_then(|m| m.get(name))
    .map(|q| q.0.clone());
    let text = match set {
        Some(text) => text,
        None if kind == "limits" => NODE_ALLOCATABLE
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("0", |(_, v)| *v)
            .to_owned(),
        None => "0".to_owned(),
    };
    let value = parse_quantity(&text).ok_or_else(|| EnvError::InvalidQuantity {
        value: text.clone(),
    })?;
    let divisor_text = divisor.filter(|d| !d.is_empty()).unwrap_or("1");
    let divisor_nanos = parse_quantity(divisor_text)
        .filter(|d| *d > 0)
        .ok_or_else(|| EnvError::InvalidQuantity {
            value: divisor_text.to_owned(),
        })?;
    let scaled = if name == "cpu" {
        div_ceil(milli_value(value), milli_value(divisor_nanos).max(1))
    } else {
        div_ceil(whole_value(value), whole_value(divisor_nanos).max(1))
    };
    Ok(scaled.to_string())
}

/// Quantity in nano-units → milli-units, rounded up (`Quantity.MilliValue`).
fn milli_value(nanos: i128) -> i128 {
    div_ceil(nanos, 1_000_000)
}

/// Quantity in nano-units → units, rounded up (`Quantity.Value`).
fn whole_value(nanos: i128) -> i128 {
    div_ceil(nanos, 1_000_000_000)
}

fn div_ceil(a: i128, b: i128) -> i128 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) == (b < 0)) {
        q + 1
    } else {
        q
    }
}

/// A Kubernetes quantity (`100m`, `128Mi`, `1.5`, `2e3`, `1G`) in nano-units, rounded up to a
/// nano-unit; `None` when it does not parse or overflows.
pub(crate) fn parse_quantity(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(number_len);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{whole}{fraction}");
    let mantissa: i128 = digits.parse().ok()?;
    let fraction_len = u32::try_from(fraction.len()).ok()?;
    // value = mantissa / 10^fraction_len * base^exp
    let (binary_shift, decimal_exp): (u32, i32) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        _ => {
            let exp = suffix.strip_prefix(['e', 'E'])?;
            let exp: i32 = exp.parse().ok()?;
            if exp.abs() > 30 {
                return None;
            }
            (0, exp)
        }
    };
    let mut numerator = mantissa.checked_mul(1_000_000_000)?;
    numerator = numerator.checked_mul(1i128.checked_shl(binary_shift)?)?;
    let mut denominator = 10i128.checked_pow(fraction_len)?;
    if decimal_exp >= 0 {
        numerator = numerator.checked_mul(10i128.checked_pow(decimal_exp.unsigned_abs())?)?;
    } else {
        denominator = denominator.checked_mul(10i128.checked_pow(decimal_exp.unsigned_abs())?)?;
    }
    let value = div_ceil(numerator, denominator);
    Some(if negative { -value } else { value })
}

/// Environment variables in definition order; a redefinition replaces the value in place.
#[derive(Debug, Default)]
struct OrderedEnv {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl OrderedEnv {
    fn set(&mut self, name: &str, value: String) {
        match self.index.get(name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.to_owned(), self.vars.len());
                self.vars.push((name.to_owned(), value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }

    fn into_vec(self) -> Vec<(String, String)> {
        self.vars
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
        ObjectFieldSelector, PodSpec, ResourceFieldSelector, ResourceRequirements, SecretEnvSource,
        SecretKeySelector, ServicePort, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("apps".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([
                    ("app".into(), "web".into()),
                    ("tier".into(), "a \"b\"".into()),
                ])),
                annotations: Some(BTreeMap::from([("note".into(), "hi".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("host-0".into()),
                service_account_name: Some("sa".into()),
                containers: vec![Container {
                    name: "main".into(),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn literal(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn from_source(name: &str, source: EnvVarSource) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(source),
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        from_source(
            name,
            EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: path.into(),
                }),
                ..EnvVarSource::default()
            },
        )
    }

    fn sources() -> EnvSources {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([
                ("A".into(), "from-cm".into()),
                ("B".into(), "b".into()),
            ])),
            ..ConfigMap::default()
        };
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "password".into(),
                ByteString(b"s3cret".to_vec()),
            )])),
            ..Secret::default()
        };
        EnvSources {
            config_maps: BTreeMap::from([("cfg".into(), Some(cm)), ("gone".into(), None)]),
            secrets: BTreeMap::from([("creds".into(), Some(secret)), ("nosecret".into(), None)]),
        }
    }

    fn run(container: &Container) -> Result<Vec<(String, String)>, EnvError> {
        let pod = pod();
        let ips = vec!["127.0.0.7".to_owned()];
        let ctx = FieldContext {
            pod: &pod,
            pod_ips: &ips,
            host_ip: "127.0.0.1",
        };
        let services = vec![("KUBERNETES_SERVICE_HOST".to_owned(), "127.0.0.1".to_owned())];
        resolve(ctx, container, &sources(), &services)
    }

    fn get<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let vars = HashMap::from([("A", "1"), ("B", "two"), ("EMPTY", "")]);
        let lookup = |name: &str| vars.get(name).copied();
        let cases = [
            ("plain", "plain"),
            ("$(A)", "1"),
            ("x$(A)y$(B)z", "x1ytwoz"),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$1"),
            ("$$", "$"),
            ("$", "$"),
            ("a$", "a$"),
            ("$A", "$A"),
            ("$(A", "$(A"),
            ("$(A$(B)", "$(A$(B)"),
            ("$()", "$()"),
            ("$(EMPTY)x", "x"),
            ("é$(A)ü$é", "é1ü$é"),
            ("$(A)$(A)", "11"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, lookup), want, "input {input:?}");
        }
    }

    #[test]
    fn literals_field_refs_and_expansion() {
        let container = Container {
            name: "main".into(),
            env: Some(vec![
                field("POD_NAME", "metadata.name"),
                field("POD_NAMESPACE", "metadata.namespace"),
                field("POD_UID", "metadata.uid"),
                field("POD_IP", "status.podIP"),
                field("POD_IPS", "status.podIPs"),
                field("HOST_IP", "status.hostIP"),
                field("NODE", "spec.nodeName"),
                field("SA", "spec.serviceAccountName"),
                field("APP", "metadata.labels['app']"),
                field("NOTE", "metadata.annotations['note']"),
                field("NONE", "metadata.labels['none']"),
                literal("ADDR", "$(POD_IP):8080"),
                literal("LATER", "$(DEFINED_AFTER)"),
                literal("DEFINED_AFTER", "x"),
                literal("SVC", "$(KUBERNETES_SERVICE_HOST)"),
                literal("ESCAPED", "$$(POD_IP)"),
            ]),
            command: Some(vec!["/bin/app".into(), "--listen=$(ADDR)".into()]),
            args: Some(vec![
                "$(NODE)".into(),
                "$(UNKNOWN)".into(),
                "$$(NODE)".into(),
            ]),
            ..Container::default()
        };
        let env = run(&container).unwrap();
        let want = [
            ("POD_NAME", "web-0"),
            ("POD_NAMESPACE", "apps"),
            ("POD_UID", "u-1"),
            ("POD_IP", "127.0.0.7"),
            ("POD_IPS", "127.0.0.7"),
            ("HOST_IP", "127.0.0.1"),
            ("NODE", "host-0"),
            ("SA", "sa"),
            ("APP", "web"),
            ("NOTE", "hi"),
            ("NONE", ""),
            ("ADDR", "127.0.0.7:8080"),
            ("LATER", "$(DEFINED_AFTER)"),
            ("SVC", "127.0.0.1"),
            ("ESCAPED", "$(POD_IP)"),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ];
        for (name, value) in want {
            assert_eq!(get(&env, name), Some(value), "{name}");
        }
        let (command, args) = expand_command(&container, &env);
        assert_eq!(command, ["/bin/app", "--listen=127.0.0.7:8080"]);
        assert_eq!(args, ["host-0", "$(UNKNOWN)", "$(NODE)"]);
    }

    #[test]
    fn config_maps_and_secrets_honour_optional() {
        let key_ref = |name: &str, key: &str, optional: Option<bool>| EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: name.into(),
                key: key.into(),
                optional,
            }),
            ..EnvVarSource::default()
        };
        let secret_ref = |name: &str, key: &str, optional: Option<bool>| EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: name.into(),
                key: key.into(),
                optional,
            }),
            ..EnvVarSource::default()
        };
        type Case = (EnvVarSource, Result<Option<&'static str>, EnvError>);
        let cases: Vec<Case> = vec![
            (key_ref("cfg", "A", None), Ok(Some("from-cm"))),
            (key_ref("cfg", "Z", Some(true)), Ok(None)),
            (
                key_ref("cfg", "Z", None),
                Err(EnvError::ConfigMapKeyNotFound {
                    namespace: "apps".into(),
                    name: "cfg".into(),
                    key: "Z".into(),
                }),
            ),
            (key_ref("gone", "A", Some(true)), Ok(None)),
            (key_ref("unfetched", "A", Some(true)), Ok(None)),
            (
                key_ref("gone", "A", Some(false)),
                Err(EnvError::ConfigMapNotFound {
                    name: "gone".into(),
                }),
            ),
            (secret_ref("creds", "password", None), Ok(Some("s3cret"))),
            (secret_ref("creds", "user", Some(true)), Ok(None)),
            (
                secret_ref("creds", "user", None),
                Err(EnvError::SecretKeyNotFound {
                    namespace: "apps".into(),
                    name: "creds".into(),
                    key: "user".into(),
                }),
            ),
            (secret_ref("nosecret", "x", Some(true)), Ok(None)),
            (
                secret_ref("nosecret", "x", None),
                Err(EnvError::SecretNotFound {
                    name: "nosecret".into(),
                }),
            ),
        ];
        for (source, want) in cases {
            let container = Container {
                name: "main".into(),
                env: Some(vec![from_source("V", source.clone())]),
                ..Container::default()
            };
            let got = run(&container).map(|env| get(&env, "V").map(str::to_owned));
            assert_eq!(got, want.map(|v| v.map(str::to_owned)), "{source:?}");
        }
    }

    #[test]
    fn env_from_with_prefix_then_env_overrides() {
        let container = Container {
            name: "main".into(),
            env_from: Some(vec![
                EnvFromSource {
                    config_map_ref: Some(ConfigMapEnvSource {
                        name: "cfg".into(),
                        optional: None,
                    }),
                    prefix: Some("CM_".into()),
                    secret_ref: None,
                },
                EnvFromSource {
                    config_map_ref: None,
                    prefix: None,
                    secret_ref: Some(SecretEnvSource {
                        name: "creds".into(),
                        optional: None,
                    }),
                },
                EnvFromSource {
                    config_map_ref: Some(ConfigMapEnvSource {
                        name: "gone".into(),
                        optional: Some(true),
                    }),
                    prefix: None,
                    secret_ref: None,
                },
            ]),
            env: Some(vec![
                literal("CM_B", "override"),
                literal("USE", "$(CM_A)-$(password)"),
            ]),
            ..Container::default()
        };
        let env = run(&container).unwrap();
        assert_eq!(get(&env, "CM_A"), Some("from-cm"));
        assert_eq!(get(&env, "CM_B"), Some("override"));
        assert_eq!(get(&env, "password"), Some("s3cret"));
        assert_eq!(get(&env, "USE"), Some("from-cm-s3cret"));

        let missing = Container {
            name: "main".into(),
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "gone".into(),
                    optional: None,
                }),
                prefix: None,
                secret_ref: None,
            }]),
            ..Container::default()
        };
        assert_eq!(
            run(&missing).unwrap_err().to_string(),
            "configmap \"gone\" not found"
        );
    }

    #[test]
    fn unsupported_field_path_is_an_error() {
        let container = Container {
            name: "main".into(),
            env: Some(vec![
                field("X", "spec.hostname"),
                field("Y", "metadata.labels"),
            ]),
            ..Container::default()
        };
        assert_eq!(
            run(&container).unwrap_err(),
            EnvError::UnsupportedFieldPath {
                path: "spec.hostname".into()
            }
        );
    }

    #[test]
    fn downward_maps_render_like_go() {
        let pod = pod();
        let ips: Vec<String> = Vec::new();
        let ctx = FieldContext {
            pod: &pod,
            pod_ips: &ips,
            host_ip: "127.0.0.1",
        };
        assert_eq!(
            field_value(ctx, "metadata.labels", true).unwrap(),
            "app=\"web\"\ntier=\"a \\\"b\\\"\""
        );
        assert_eq!(field_value(ctx, "status.podIP", false).unwrap(), "");
    }

    #[test]
    fn quantities_parse() {
        let cases: [(&str, Option<i128>); 14] = [
            ("1", Some(1_000_000_000)),
            ("100m", Some(100_000_000)),
            ("1.5", Some(1_500_000_000)),
            ("128Mi", Some(134_217_728_000_000_000)),
            ("1Ki", Some(1_024_000_000_000)),
            ("1k", Some(1_000_000_000_000)),
            ("2e3", Some(2_000_000_000_000)),
            ("1E-3", Some(1_000_000)),
            ("5n", Some(5)),
            ("0.1n", Some(1)),
            ("-1", Some(-1_000_000_000)),
            ("1x", None),
            ("", None),
            ("1..2", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_quantity(text), want, "{text}");
        }
    }

    #[test]
    fn resource_field_refs() {
        let resources = |limits: &[(&str, &str)], requests: &[(&str, &str)]| ResourceRequirements {
            limits: Some(
                limits
                    .iter()
                    .map(|(k, v)| ((*k).into(), Quantity((*v).into())))
                    .collect(),
            ),
            requests: Some(
                requests
                    .iter()
                    .map(|(k, v)| ((*k).into(), Quantity((*v).into())))
                    .collect(),
            ),
            ..ResourceRequirements::default()
        };
        let with = Container {
            name: "c".into(),
            resources: Some(resources(
                &[("cpu", "1500m"), ("memory", "512Mi")],
                &[("cpu", "100m")],
            )),
            ..Container::default()
        };
        let without = Container {
            name: "c".into(),
            ..Container::default()
        };
        type Case<'a> = (
            &'a Container,
            &'a str,
            Option<&'a str>,
            Result<&'a str, EnvError>,
        );
        let cases: [Case<'_>; 10] = [
            (&with, "limits.cpu", None, Ok("2")),
            (&with, "limits.cpu", Some("1m"), Ok("1500")),
            (&with, "requests.cpu", None, Ok("1")),
            (&with, "requests.cpu", Some("1m"), Ok("100")),
            (&with, "limits.memory", None, Ok("536870912")),
            (&with, "limits.memory", Some("1Mi"), Ok("512")),
            (&with, "requests.memory", None, Ok("0")),
            (&without, "limits.cpu", None, Ok("8")),
            (&without, "limits.memory", Some("1Gi"), Ok("16")),
            (
                &with,
                "limits.gpu",
                None,
                Err(EnvError::UnsupportedResource {
                    resource: "limits.gpu".into(),
                }),
            ),
        ];
        for (container, resource, divisor, want) in cases {
            assert_eq!(
                resource_value(container, resource, divisor),
                want.map(str::to_owned),
                "{resource} / {divisor:?}"
            );
        }
        // Through the environment, with a divisor.
        let container = Container {
            name: "main".into(),
            resources: with.resources.clone(),
            env: Some(vec![from_source(
                "MEM_MI",
                EnvVarSource {
                    resource_field_ref: Some(ResourceFieldSelector {
                        container_name: None,
                        divisor: Some(Quantity("1Mi".into())),
                        resource: "limits.memory".into(),
                    }),
                    ..EnvVarSource::default()
                },
            )]),
            ..Container::default()
        };
        assert_eq!(get(&run(&container).unwrap(), "MEM_MI"), Some("512"));
    }

    #[test]
    fn service_links_like_the_kubelet() {
        let svc = |ns: &str, name: &str, ip: &str, ports: &[(&str, i32)]| Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p)| ServicePort {
                            name: (!n.is_empty()).then(|| (*n).to_owned()),
                            port: *p,
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            status: None,
        };
        let services = vec![
            svc(
                "apps",
                "mock-eci",
                "127.100.0.5",
                &[("grpc", 50051), ("admin", 8080)],
            ),
            svc("apps", "headless", "None", &[("", 80)]),
            svc("other", "elsewhere", "127.100.0.6", &[("", 80)]),
        ];
        let mut pod = pod();
        let env = service_env(&pod, &services, "127.0.0.1", 6443);
        let want = [
            ("MOCK_ECI_SERVICE_HOST", "127.100.0.5"),
            ("MOCK_ECI_SERVICE_PORT", "50051"),
            ("MOCK_ECI_SERVICE_PORT_GRPC", "50051"),
            ("MOCK_ECI_SERVICE_PORT_ADMIN", "8080"),
            ("MOCK_ECI_PORT", "tcp://127.100.0.5:50051"),
            ("MOCK_ECI_PORT_50051_TCP", "tcp://127.100.0.5:50051"),
            ("MOCK_ECI_PORT_50051_TCP_PROTO", "tcp"),
            ("MOCK_ECI_PORT_50051_TCP_PORT", "50051"),
            ("MOCK_ECI_PORT_50051_TCP_ADDR", "127.100.0.5"),
            ("MOCK_ECI_PORT_8080_TCP", "tcp://127.100.0.5:8080"),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "6443"),
            ("KUBERNETES_PORT", "tcp://127.0.0.1:6443"),
            ("KUBERNETES_PORT_6443_TCP_ADDR", "127.0.0.1"),
        ];
        for (name, value) in want {
            assert_eq!(get(&env, name), Some(value), "{name}");
        }
        assert!(get(&env, "HEADLESS_SERVICE_HOST").is_none());
        assert!(get(&env, "ELSEWHERE_SERVICE_HOST").is_none());

        pod.spec.as_mut().unwrap().enable_service_links = Some(false);
        let env = service_env(&pod, &services, "127.0.0.1", 6443);
        assert!(get(&env, "MOCK_ECI_SERVICE_HOST").is_none());
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
    }
}
