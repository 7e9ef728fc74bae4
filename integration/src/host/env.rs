//! A container's environment, resolved the kubelet's way (pure: the ConfigMaps, Secrets and
//! Services it reads are fetched beforehand).
//!
//! Order, as `kubelet_pods.go` `makeEnvironmentVariables`: `envFrom` sources in order, then
//! `env` entries in order (each may refer to the variables before it and to the service
//! variables with `$(VAR)`), then the service variables that nothing overrode.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapKeySelector, Container, EnvVarSource, Pod, Secret, SecretKeySelector,
    Service,
};
use vne_core::downward::{self, DownwardError, FieldValue, Side};
use vne_core::expansion::expand;
use vne_core::quantity::Quantity;
use vne_core::service_env;

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
    /// A `fieldRef` or `resourceFieldRef` the kubelet refuses (or a quantity that does not
    /// parse).
    #[error("downward API")]
    Downward(#[from] DownwardError),
    /// A `resourceFieldRef` names a container the pod does not have.
    #[error("container {name} not found in the pod")]
    ContainerNotFound {
        /// The container.
        name: String,
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

/// The service variables of the kubelet (`getServiceEnvVarMap`): the Services (with a cluster
/// IP) of the pod's namespace when `enableServiceLinks` is not false, and always `kubernetes`
/// (here the API server itself, `api_host:api_port`, in place of `default/kubernetes`).
pub(crate) fn service_env<'s>(
    pod: &Pod,
    services: impl IntoIterator<Item = &'s Service>,
    api_host: &str,
    api_port: u16,
) -> Vec<(String, String)> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.enable_service_links)
        .unwrap_or(true);
    let apiserver = service_env::apiserver_service(None, Some(api_host), Some(api_port));
    // Collected: a Vec of the pod's Services (which outlive the apiserver's, made here) passes
    // as one of shorter-lived references.
    let services: Vec<&Service> = services.into_iter().collect();
    service_env::variables(namespace, links, apiserver.as_ref(), services)
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
    add_env_from(&mut env, container, sources)?;

    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let raw = var.value.as_deref().unwrap_or_default();
                expand(raw, |name| {
                    env.get(name).or_else(|| services.get(name).copied())
                })
            }
            Some(source) => match source_value(ctx, container, sources, source, namespace)? {
                Some(value) => value,
                None => continue,
            },
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

/// Adds the variables of the container's `envFrom` ConfigMaps and Secrets, prefixed.
fn add_env_from(
    env: &mut OrderedEnv,
    container: &Container,
    sources: &EnvSources,
) -> Result<(), EnvError> {
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
    Ok(())
}

/// The value of a variable's `valueFrom`; `None` when an optional source or key is missing
/// (the variable is left out).
fn source_value(
    ctx: FieldContext<'_>,
    container: &Container,
    sources: &EnvSources,
    source: &EnvVarSource,
    namespace: &str,
) -> Result<Option<String>, EnvError> {
    if let Some(field) = &source.field_ref {
        env_field_value(ctx, &field.field_path).map(Some)
    } else if let Some(resource) = &source.resource_field_ref {
        let target = match resource.container_name.as_deref().filter(|n| !n.is_empty()) {
            Some(name) => find_container(ctx.pod, name)?,
            None => container,
        };
        resource_value(
            target,
            &resource.resource,
            resource.divisor.as_ref().map(|d| d.0.as_str()),
        )
        .map(Some)
    } else if let Some(key_ref) = &source.config_map_key_ref {
        config_map_key(sources, key_ref, namespace)
    } else if let Some(key_ref) = &source.secret_key_ref {
        secret_key(sources, key_ref, namespace)
    } else {
        Ok(Some(String::new()))
    }
}

/// A `configMapKeyRef`'s value; `None` when it is optional and missing.
fn config_map_key(
    sources: &EnvSources,
    key_ref: &ConfigMapKeySelector,
    namespace: &str,
) -> Result<Option<String>, EnvError> {
    let optional = key_ref.optional == Some(true);
    match sources
        .config_maps
        .get(&key_ref.name)
        .and_then(Option::as_ref)
    {
        None if optional => Ok(None),
        None => Err(EnvError::ConfigMapNotFound {
            name: key_ref.name.clone(),
        }),
        Some(cm) => match cm.data.as_ref().and_then(|d| d.get(&key_ref.key)) {
            Some(value) => Ok(Some(value.clone())),
            None if optional => Ok(None),
            None => Err(EnvError::ConfigMapKeyNotFound {
                namespace: namespace.to_owned(),
                name: key_ref.name.clone(),
                key: key_ref.key.clone(),
            }),
        },
    }
}

/// A `secretKeyRef`'s value; `None` when it is optional and missing.
fn secret_key(
    sources: &EnvSources,
    key_ref: &SecretKeySelector,
    namespace: &str,
) -> Result<Option<String>, EnvError> {
    let optional = key_ref.optional == Some(true);
    match sources.secrets.get(&key_ref.name).and_then(Option::as_ref) {
        None if optional => Ok(None),
        None => Err(EnvError::SecretNotFound {
            name: key_ref.name.clone(),
        }),
        Some(secret) => match secret.data.as_ref().and_then(|d| d.get(&key_ref.key)) {
            Some(value) => Ok(Some(String::from_utf8_lossy(&value.0).into_owned())),
            None if optional => Ok(None),
            None => Err(EnvError::SecretKeyNotFound {
                namespace: namespace.to_owned(),
                name: key_ref.name.clone(),
                key: key_ref.key.clone(),
            }),
        },
    }
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

/// A `fieldRef` value for an environment variable.
pub(crate) fn env_field_value(ctx: FieldContext<'_>, path: &str) -> Result<String, EnvError> {
    field_value(ctx, path, false)
}

/// A `fieldRef` value; `whole_maps` allows `metadata.labels` and `metadata.annotations`
/// (downward API volumes only).
pub(crate) fn field_value(
    ctx: FieldContext<'_>,
    path: &str,
    whole_maps: bool,
) -> Result<String, EnvError> {
    Ok(match downward::field(ctx.pod, path, whole_maps)? {
        FieldValue::Known(text) => text,
        FieldValue::NodeName => ctx
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        FieldValue::PodIp => ctx.pod_ips.first().cloned().unwrap_or_default(),
        FieldValue::PodIps => ctx.pod_ips.join(","),
        FieldValue::HostIp => ctx.host_ip.to_owned(),
    })
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

/// A `resourceFieldRef` value (`limits.cpu`, `requests.memory`, …): unset limits are the node's
/// allocatable, unset requests zero, as on a kubelet.
pub(crate) fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, EnvError> {
    let unset = |side: Side, name: &str| {
        let allocatable = NODE_ALLOCATABLE.iter().find(|(n, _)| *n == name);
        match (side, allocatable) {
            (Side::Limits, Some((_, amount))) => Quantity::parse(amount).unwrap_or_default(),
            _ => Quantity::default(),
        }
    };
    Ok(downward::resource(container, resource, divisor, unset)?)
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
            EnvError::Downward(DownwardError::UnsupportedField {
                path: "spec.hostname".into()
            })
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
                Err(EnvError::Downward(DownwardError::UnsupportedResource {
                    resource: "limits.gpu".into(),
                })),
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
