//! Pod → `CreateContainerGroupRequest`: pure, no I/O. The caller fetches the ConfigMaps and
//! Secrets the pod references (and the service account tokens its projected volumes ask for),
//! takes the Services from its cache, and passes them in [`Context`].

pub mod annotations;
pub mod claims;
mod container;
mod downward;
mod env;
pub mod naming;
pub mod sidecars;
mod volumes;

use crate::service_env;

pub(crate) use container::size;
pub use volumes::downward_metadata;
pub(crate) use volumes::has_token;

use std::collections::BTreeMap;

use std::sync::Arc;

use base64::Engine as _;
use eci_proto::v20180808::{
    CreateContainerGroupRequest, DnsConfig, DnsOption, HostAliase, ImageRegistryCredential,
    PodSecurityContext as PodSecurity, Sysctl, Tag, Volume,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, Pod, PodSecurityContext, Secret, Service,
};
use serde_json::Value;

use crate::refs::{Token, TokenSource};

/// Pod annotation: `vCPU-memory` pairs and/or ECS instance types for the group (what every
/// annotation does: [`annotations::TABLE`]).
pub const ANNOTATION_USE_SPECS: &str = annotations::USE_SPECS;
/// ClusterIP Service access from the group (`true`/`false`): ack-virtual-node's pod annotation.
/// On a pod it overrides `ECI_KUBE_PROXY`; the group carries the decision as a tag of the same
/// key (the public CreateContainerGroup has no parameter for it).
pub const ANNOTATION_KUBE_PROXY: &str = "k8s.aliyun.com/eci-kube-proxy-enabled";

/// Why a pod cannot be turned into a container group (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Rejection {
    /// The pod field at fault, e.g. `spec.volumes[1] (data)`.
    pub field: String,
    /// What is wrong and what would work.
    pub reason: String,
    /// It may work later (a referenced ConfigMap or Secret may still be created).
    pub retryable: bool,
    /// The container the kubelet would show waiting with `CreateContainerConfigError`: one of
    /// its settings cannot be resolved as the pod stands (retryable: the pod may change).
    pub config_error_in: Option<String>,
}

fn reject(field: &str, reason: impl Into<String>) -> Rejection {
    Rejection {
        field: field.to_owned(),
        reason: reason.into(),
        retryable: false,
        config_error_in: None,
    }
}

fn missing(field: &str, kind: &str, name: &str) -> Rejection {
    Rejection {
        field: field.to_owned(),
        reason: format!(
            "{kind} {name:?} does not exist (mark the reference optional if that is expected)"
        ),
        retryable: true,
        config_error_in: None,
    }
}

/// Everything besides the pod that the translation needs.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// ECI region.
    pub region: &'a str,
    /// Default vSwitch(es).
    pub vswitch: &'a str,
    /// Default security group.
    pub security_group: &'a str,
    /// Cluster name (tag).
    pub cluster_name: &'a str,
    /// The virtual node (tag, `spec.nodeName`).
    pub node_name: &'a str,
    /// Cluster DNS servers for `dnsPolicy: ClusterFirst`.
    pub cluster_dns: &'a [String],
    /// Cluster domain, e.g. `cluster.local`.
    pub cluster_domain: &'a str,
    /// ConfigMaps of the pod's namespace that it references, by name.
    pub config_maps: &'a BTreeMap<String, ConfigMap>,
    /// Secrets of the pod's namespace that it references, by name.
    pub secrets: &'a BTreeMap<String, Secret>,
    /// The PersistentVolume each of the pod's PersistentVolumeClaims is bound to, by claim
    /// name (the caller checked the binding: see [`crate::refs::bound_volumes`]).
    pub claims: &'a BTreeMap<String, PersistentVolume>,
    /// The tokens issued for the pod's projected `serviceAccountToken` sources.
    pub service_account_tokens: &'a BTreeMap<TokenSource, Token>,
    /// The size resource references fall back to when a container sets none (vCPU, GiB).
    pub default_spec: (f64, f64),
    /// The apiserver's Service as pods should reach it (see
    /// [`service_env::apiserver_service`]); `None` when there is none.
    pub apiserver: Option<&'a Service>,
    /// The Services of the pod's namespace (service links).
    pub services: &'a [Arc<Service>],
    /// ClusterIP Service access from the group unless the pod's annotation says otherwise
    /// (`ECI_KUBE_PROXY`).
    pub kube_proxy: bool,
}

/// Translates a pod bound to our node.
pub fn translate(pod: &Pod, cx: &Context<'_>) -> Result<CreateContainerGroupRequest, Rejection> {
    let meta = &pod.metadata;
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| reject("spec", "the pod has no spec"))?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let uid = meta
        .uid
        .clone()
        .ok_or_else(|| reject("metadata.uid", "the pod has no uid yet"))?;
    refuse_unsupported(spec)?;
    let (containers, init_containers) = all_containers(pod, spec, cx, &namespace)?;
    let annotations = meta.annotations.clone().unwrap_or_default();
    let mut tags = naming::tags(cx.cluster_name, cx.node_name, &namespace, &name, &uid);
    // The pod's `eci-kube-proxy-enabled` replaces it (see `annotations`).
    tags.push(Tag {
        key: ANNOTATION_KUBE_PROXY.to_owned(),
        value: cx.kube_proxy.to_string(),
    });
    let dns_config = dns(pod, cx)?;
    let mut request = CreateContainerGroupRequest {
        region_id: cx.region.to_owned(),
        security_group_id: cx.security_group.to_owned(),
        v_switch_id: cx.vswitch.to_owned(),
        container_group_name: naming::container_group_name(&namespace, &name),
        restart_policy: spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into()),
        tag: tags,
        container: containers,
        init_container: init_containers,
        volume: volumes::volumes(pod, cx)?,
        dns_policy: dns_policy(pod, !cx.cluster_dns.is_empty()).to_owned(),
        dns_config,
        host_aliase: spec
            .host_aliases
            .iter()
            .flatten()
            .map(|a| HostAliase {
                ip: a.ip.clone(),
                hostname: a.hostnames.clone().unwrap_or_default(),
            })
            .collect(),
        image_registry_credential: credentials(pod, cx),
        client_token: uid,
        active_deadline_seconds: spec.active_deadline_seconds,
        termination_grace_period_seconds: Some(spec.termination_grace_period_seconds.unwrap_or(30)),
        host_name: hostname(pod, cx),
        security_context: sysctls(spec.security_context.as_ref())?,
        share_process_namespace: spec.share_process_namespace == Some(true),
        ..CreateContainerGroupRequest::default()
    };
    // Last: `eci-use-specs` sizes against the containers, and the pod's annotations override
    // the daemon's defaults set above.
    annotations::apply(&annotations, &mut request)?;
    volumes::mount_read_only_claims(pod, &mut request);
    Ok(request)
}

/// What no ECI container group can be: sharing the host's namespaces, ephemeral containers,
/// no container at all.
fn refuse_unsupported(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), Rejection> {
    for (flag, field) in [
        (spec.host_network, "spec.hostNetwork"),
        (spec.host_pid, "spec.hostPID"),
        (spec.host_ipc, "spec.hostIPC"),
    ] {
        if flag == Some(true) {
            return Err(reject(
                field,
                "ECI container groups cannot share the host's namespaces",
            ));
        }
    }
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(reject(
            "spec.ephemeralContainers",
            "ephemeral containers are not supported on ECI",
        ));
    }
    if spec.containers.is_empty() {
        return Err(reject(
            "spec.containers",
            "a pod needs at least one container",
        ));
    }
    Ok(())
}

/// The group's containers and init containers, each with its environment: native sidecars
/// (init containers that always restart) run as containers of the group.
fn all_containers(
    pod: &Pod,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    cx: &Context<'_>,
    namespace: &str,
) -> Result<
    (
        Vec<eci_proto::v20180808::Container>,
        Vec<eci_proto::v20180808::Container>,
    ),
    Rejection,
> {
    let service_env = service_env::variables(
        namespace,
        spec.enable_service_links.unwrap_or(true),
        cx.apiserver,
        cx.services.iter().map(AsRef::as_ref),
    );
    let sidecars = sidecars::count(spec)?;
    // Regular init containers come first (`sidecars::count`): a sidecar's position is its
    // index less theirs.
    let first_sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .take_while(|c| !sidecars::is_sidecar(c))
        .count();
    let pod_security = spec.security_context.as_ref();
    let mut containers = Vec::new();
    let mut init_containers = Vec::new();
    for (index, c) in spec.init_containers.iter().flatten().enumerate() {
        let at = format!("spec.initContainers[{index}] ({})", c.name);
        let mut env = env::environment(pod, c, cx, &service_env, &at)?;
        if sidecars::is_sidecar(c) {
            env.extend(sidecars::variables(index - first_sidecar, sidecars, &env));
            containers.push(container::container(c, pod_security, env, &at)?);
        } else {
            init_containers.push(init_container(c, pod_security, env, &at)?);
        }
    }
    for (index, c) in spec.containers.iter().enumerate() {
        let at = format!("spec.containers[{index}] ({})", c.name);
        let env = env::environment(pod, c, cx, &service_env, &at)?;
        containers.push(container::container(c, pod_security, env, &at)?);
    }
    Ok((containers, init_containers))
}

/// An init container as `InitContainer.N` takes it.
fn init_container(
    c: &k8s_openapi::api::core::v1::Container,
    pod_security: Option<&k8s_openapi::api::core::v1::PodSecurityContext>,
    env: Vec<eci_proto::v20180808::EnvironmentVar>,
    at: &str,
) -> Result<eci_proto::v20180808::Container, Rejection> {
    let mut init = container::container(c, pod_security, env, at)?;
    if init.security_context_privileged == Some(true) {
        return Err(reject(
            &format!("{at}.securityContext.privileged"),
            "ECI runs privileged containers, but not privileged init containers",
        ));
    }
    // What `InitContainer.N` has no parameter for (see [`limits`]).
    init.security_context_run_as_group = None;
    init.security_context_run_as_non_root = None;
    (init.stdin, init.stdin_once, init.tty) = (false, false, false);
    Ok(init)
}

/// What the group will do differently from what the pod asks, though it runs: one readable
/// line per field, for a Warning Event when the group is created (ECI has no parameter for
/// them; see `container::probe_limits`).
pub fn limits(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut limits = container::pod_security_limits(spec.security_context.as_ref());
    for (index, c) in spec.containers.iter().enumerate() {
        let at = format!("spec.containers[{index}] ({})", c.name);
        limits.extend(container::probe_limits(c, &at));
        limits.extend(container::security_limits(c, &at));
    }
    let pod_context = spec.security_context.as_ref();
    for (index, c) in spec.init_containers.iter().flatten().enumerate() {
        let at = format!("spec.initContainers[{index}] ({})", c.name);
        limits.extend(container::security_limits(c, &at));
        if sidecars::is_sidecar(c) {
            // A container of the group on ECI: what holds for containers holds for it.
            limits.extend(container::probe_limits(c, &at));
            continue;
        }
        let own = c.security_context.as_ref();
        if own
            .and_then(|s| s.run_as_group)
            .or(pod_context.and_then(|p| p.run_as_group))
            .is_some()
        {
            limits.push(format!(
                "{at}: runAsGroup is not applied to init containers on ECI (no such parameter)"
            ));
        }
        if own
            .and_then(|s| s.run_as_non_root)
            .or(pod_context.and_then(|p| p.run_as_non_root))
            == Some(true)
        {
            limits.push(format!(
                "{at}: runAsNonRoot is not enforced for init containers on ECI (no such parameter)"
            ));
        }
        if c.stdin == Some(true) || c.tty == Some(true) {
            limits.push(format!(
                "{at}: stdin and tty are not available to init containers on ECI"
            ));
        }
    }
    limits
}

/// Sysctls Kubernetes counts as safe (namespaced, isolated per pod): the kubelet allows these
/// without `--allowed-unsafe-sysctls`, and ECI takes them as `SecurityContext.Sysctl.N`.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_wmem",
];

/// `securityContext.sysctls`: the safe ones pass; any other is refused as the kubelet refuses
/// it by default (`SysctlForbidden`), since a virtual node allows no unsafe sysctl.
fn sysctls(context: Option<&PodSecurityContext>) -> Result<Option<PodSecurity>, Rejection> {
    let requested = context.and_then(|c| c.sysctls.as_ref());
    let mut sysctl = Vec::new();
    for (index, entry) in requested.into_iter().flatten().enumerate() {
        // `net.ipv4.conf.eth0.x` and `net/ipv4/...` spellings are normalised as the kubelet does.
        let name = entry.name.replace('/', ".");
        if !SAFE_SYSCTLS.contains(&name.as_str()) {
            return Err(reject(
                &format!("spec.securityContext.sysctls[{index}]"),
                format!(
                    "{name} is not a safe sysctl; virtual nodes allow no unsafe sysctls (SysctlForbidden)"
                ),
            ));
        }
        sysctl.push(Sysctl {
            name,
            value: entry.value.clone(),
        });
    }
    Ok((!sysctl.is_empty()).then_some(PodSecurity { sysctl }))
}

/// The hostname inside the group, as the kubelet gives it: `spec.hostname` or else the pod's
/// name, at most 63 characters without a trailing `-` or `.`; with `setHostnameAsFQDN` and a
/// subdomain, the fully qualified name.
fn hostname(pod: &Pod, cx: &Context<'_>) -> String {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let short = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .unwrap_or(name);
    let short = truncate_hostname(short);
    let subdomain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty());
    match subdomain {
        Some(subdomain) if spec.and_then(|s| s.set_hostname_as_fqdn) == Some(true) => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            format!("{short}.{subdomain}.{namespace}.svc.{}", cx.cluster_domain)
        }
        _ => short.to_owned(),
    }
}

/// The kubelet's hostname truncation: 63 bytes, then no trailing `-` or `.`.
fn truncate_hostname(name: &str) -> &str {
    let cut = name.char_indices().nth(63).map_or(name.len(), |(i, _)| i);
    name[..cut].trim_end_matches(['-', '.'])
}

/// ECI's `DnsPolicy`: whose resolvers the instance gets, as the kubelet decides a pod's.
/// `Default` (the VPC's resolver, with any `DnsConfig` merged in, as the kubelet merges
/// `dnsConfig` into the node's) for a pod asking for `Default`, and for `ClusterFirst` when no
/// cluster DNS is known (the kubelet falls back to `Default` then); otherwise `None`: only our
/// `DnsConfig` (the cluster DNS for `ClusterFirst`, the pod's own for `None`).
fn dns_policy(pod: &Pod, cluster_dns_known: bool) -> &'static str {
    match pod.spec.as_ref().and_then(|s| s.dns_policy.as_deref()) {
        Some("None") => "None",
        Some("Default") => "Default",
        _ if cluster_dns_known => "None",
        _ => "Default",
    }
}

/// Only the pod's volumes that carry service account tokens, as ECI volumes: what a token
/// refresh hands to the running group (`UpdateContainerGroup`).
pub fn token_volumes(pod: &Pod, cx: &Context<'_>) -> Result<Vec<Volume>, Rejection> {
    volumes::token_volumes(pod, cx)
}

/// The pod's file volumes (`configMap`, `secret`, `projected`, `downwardAPI`) as ECI volumes,
/// as their sources are now: what a push of changed contents hands to the running group.
pub fn file_volumes(pod: &Pod, cx: &Context<'_>) -> Result<Vec<Volume>, Rejection> {
    volumes::file_volumes(pod, cx)
}

/// DNS: `ClusterFirst` (the default) points at the cluster DNS with the usual search path;
/// `None` uses only `dnsConfig`; `Default` keeps ECI's resolver; `dnsConfig` is merged in.
fn dns(pod: &Pod, cx: &Context<'_>) -> Result<Option<DnsConfig>, Rejection> {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.clone())
        .unwrap_or_else(|| "ClusterFirst".into());
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut config = match policy.as_str() {
        "ClusterFirst" | "ClusterFirstWithHostNet" if !cx.cluster_dns.is_empty() => DnsConfig {
            name_server: cx.cluster_dns.to_vec(),
            search: vec![
                format!("{namespace}.svc.{}", cx.cluster_domain),
                format!("svc.{}", cx.cluster_domain),
                cx.cluster_domain.to_owned(),
            ],
            option: vec![DnsOption {
                name: "ndots".into(),
                value: "5".into(),
            }],
        },
        "ClusterFirst" | "ClusterFirstWithHostNet" | "Default" | "None" => DnsConfig::default(),
        other => {
            return Err(reject(
                "spec.dnsPolicy",
                format!("{other:?} is not a DNS policy"),
            ));
        }
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        config
            .name_server
            .extend(extra.nameservers.clone().unwrap_or_default());
        config
            .search
            .extend(extra.searches.clone().unwrap_or_default());
        for option in extra.options.iter().flatten() {
            let name = option.name.clone().unwrap_or_default();
            config.option.retain(|o| o.name != name);
            config.option.push(DnsOption {
                name,
                value: option.value.clone().unwrap_or_default(),
            });
        }
    }
    if policy == "None" && config.name_server.is_empty() {
        return Err(reject(
            "spec.dnsConfig",
            "dnsPolicy None needs dnsConfig.nameservers",
        ));
    }
    Ok((config != DnsConfig::default()).then_some(config))
}

/// `imagePullSecrets` (dockerconfigjson or dockercfg) as registry credentials. A missing or
/// malformed secret is skipped, as the kubelet does (the pull may still work anonymously).
fn credentials(pod: &Pod, cx: &Context<'_>) -> Vec<ImageRegistryCredential> {
    pod.spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .filter_map(|reference| cx.secrets.get(&reference.name))
        .flat_map(registry_credentials)
        .collect()
}

/// The registry credentials a pull Secret (dockerconfigjson or dockercfg) holds: one per
/// registry with a user name; none when it holds neither format.
pub fn registry_credentials(secret: &Secret) -> Vec<ImageRegistryCredential> {
    let mut out = Vec::new();
    let data = secret.data.clone().unwrap_or_default();
    let parsed: Option<Value> = data
        .get(".dockerconfigjson")
        .and_then(|raw| serde_json::from_slice::<Value>(&raw.0).ok())
        .and_then(|v| v.get("auths").cloned())
        .or_else(|| {
            data.get(".dockercfg")
                .and_then(|raw| serde_json::from_slice(&raw.0).ok())
        });
    for (server, entry) in parsed
        .as_ref()
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let text = |field: &str| {
            entry
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (mut user, mut password) = (text("username"), text("password"));
        if user.is_empty() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(text("auth"))
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            if let Some((u, p)) = decoded.as_deref().and_then(|d| d.split_once(':')) {
                (user, password) = (u.to_owned(), p.to_owned());
            }
        }
        if !user.is_empty() {
            out.push(ImageRegistryCredential {
                server: server
                    .trim_start_matches("https://")
                    .trim_end_matches('/')
                    .to_owned(),
                user_name: user,
                password,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
