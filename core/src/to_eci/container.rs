//! Containers: command, ports, mounts, probes, security context, lifecycle hooks, resources.
//!
//! Resources: ECI sizes a container with one number per resource: its **limit** when set,
//! else its **request**; unset means "share the group". `nvidia.com/gpu` becomes `Gpu`.
//! Probes: readiness and liveness map one to one (named ports resolved); ECI has no startup
//! probe, so a startup probe's window (`initialDelaySeconds + periodSeconds ×
//! failureThreshold`) is added to the liveness probe's initial delay — the liveness probe
//! then starts when the startup probe would have given up — and dropped when there is no
//! liveness probe. gRPC probes are rejected; what ECI's probes cannot express (another host,
//! HTTP headers) is listed by [`probe_limits`] for a Warning Event. Security (the container's
//! settings over the pod's): `capabilities.add`, `runAsUser`, `runAsGroup`, `runAsNonRoot`,
//! `readOnlyRootFilesystem` and `privileged` map; what ECI has no parameter for
//! (`capabilities.drop`, `allowPrivilegeEscalation: false`, seccomp, AppArmor, SELinux, and the
//! pod's `fsGroup` and `supplementalGroups`) is not applied and is named by
//! [`security_limits`] and [`pod_security_limits`] for the same Warning Event.
//! Lifecycle `sleep` handlers become `sleep <n>` exec handlers.

use eci_proto::v20180808 as eci;
use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, LifecycleHandler, PodSecurityContext, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Rejection, reject};
use crate::quantity;

fn port_number(container: &Container, port: &IntOrString, at: &str) -> Result<i32, Rejection> {
    match port {
        IntOrString::Int(number) => Ok(*number),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| {
                reject(
                    at,
                    format!("named port {name:?} is not a port of the container"),
                )
            }),
    }
}

/// An HTTP GET action. `host` and `httpHeaders` are carried for lifecycle handlers, which ECI
/// takes with them; the OpenAPI client leaves them out of probes, which ECI takes without
/// (see [`probe_limits`]).
fn http_get(
    container: &Container,
    action: &HTTPGetAction,
    at: &str,
) -> Result<eci::HttpGetAction, Rejection> {
    Ok(eci::HttpGetAction {
        path: action.path.clone().unwrap_or_else(|| "/".into()),
        port: port_number(container, &action.port, at)?,
        scheme: action.scheme.clone().unwrap_or_else(|| "HTTP".into()),
        host: action.host.clone().unwrap_or_default(),
        http_header: action
            .http_headers
            .iter()
            .flatten()
            .map(|header| eci::HttpHeader {
                name: header.name.clone(),
                value: header.value.clone(),
            })
            .collect(),
    })
}

/// Hosts that mean "this pod" to a probe: the kubelet's default target is the pod's IP, and
/// ECI's probes run against the group itself.
fn is_own_host(host: &str) -> bool {
    matches!(host, "" | "localhost" | "127.0.0.1" | "::1")
}

/// What ECI's probes cannot do that a container's probes ask for: ECI's `HttpGet` takes a path,
/// port and scheme, its `TcpSocket` a port — no other host, no HTTP headers. Each entry names
/// the field and what happens instead (the probe runs against the group without it), for a
/// Warning Event: a different probe is never silent.
/// The security settings of `container` (`at`) ECI has no parameter for, one line each: the
/// group runs without them, which its author must hear (a dropped capability or a seccomp
/// profile believed in force is a weaker sandbox than the author thinks).
pub(super) fn security_limits(container: &Container, at: &str) -> Vec<String> {
    let Some(security) = container.security_context.as_ref() else {
        return Vec::new();
    };
    let mut limits = Vec::new();
    let dropped: Vec<&str> = security
        .capabilities
        .iter()
        .flat_map(|c| c.drop.iter().flatten())
        .map(String::as_str)
        .collect();
    if !dropped.is_empty() {
        limits.push(format!(
            "{at}.securityContext.capabilities.drop ({}): ECI has no parameter to drop capabilities; the container keeps ECI's default set",
            dropped.join(", ")
        ));
    }
    let unapplied = [
        ("seccompProfile", security.seccomp_profile.is_some()),
        ("appArmorProfile", security.app_armor_profile.is_some()),
        ("seLinuxOptions", security.se_linux_options.is_some()),
        ("procMount", security.proc_mount.is_some()),
    ];
    for (field, set) in unapplied {
        if set {
            limits.push(format!(
                "{at}.securityContext.{field}: ECI has no such parameter; not applied"
            ));
        }
    }
    if security.allow_privilege_escalation == Some(false) {
        limits.push(format!(
            "{at}.securityContext.allowPrivilegeEscalation: false is not enforced on ECI (no such parameter)"
        ));
    }
    limits
}

/// What of the pod's own security context (`spec.securityContext`) ECI has no parameter for.
pub(super) fn pod_security_limits(security: Option<&PodSecurityContext>) -> Vec<String> {
    let Some(security) = security else {
        return Vec::new();
    };
    let at = "spec.securityContext";
    let unapplied = [
        (
            "fsGroup",
            security.fs_group.is_some(),
            "volume files keep ECI's ownership",
        ),
        (
            "fsGroupChangePolicy",
            security.fs_group_change_policy.is_some(),
            "volume files keep ECI's ownership",
        ),
        (
            "supplementalGroups",
            security
                .supplemental_groups
                .as_ref()
                .is_some_and(|g| !g.is_empty()),
            "the processes get no extra groups",
        ),
        (
            "seccompProfile",
            security.seccomp_profile.is_some(),
            "not applied",
        ),
        (
            "appArmorProfile",
            security.app_armor_profile.is_some(),
            "not applied",
        ),
        (
            "seLinuxOptions",
            security.se_linux_options.is_some(),
            "not applied",
        ),
    ];
    unapplied
        .into_iter()
        .filter(|(_, set, _)| *set)
        .map(|(field, _, effect)| format!("{at}.{field}: ECI has no such parameter; {effect}"))
        .collect()
}

pub(super) fn probe_limits(container: &Container, at: &str) -> Vec<String> {
    let probes = [
        ("readinessProbe", container.readiness_probe.as_ref()),
        ("livenessProbe", container.liveness_probe.as_ref()),
        ("startupProbe", container.startup_probe.as_ref()),
    ];
    let mut limits = Vec::new();
    for (kind, probe) in probes {
        let Some(probe) = probe else { continue };
        if let Some(action) = &probe.http_get {
            let headers: Vec<&str> = action
                .http_headers
                .iter()
                .flatten()
                .map(|h| h.name.as_str())
                .collect();
            if !headers.is_empty() {
                limits.push(format!(
                    "{at}.{kind}.httpGet.httpHeaders ({}): ECI's HTTP probes send no headers; the probe runs without them",
                    headers.join(", ")
                ));
            }
            if let Some(host) = action.host.as_deref().filter(|h| !is_own_host(h)) {
                limits.push(format!(
                    "{at}.{kind}.httpGet.host ({host}): ECI probes only the group itself; the probe targets the group"
                ));
            }
        }
        if let Some(host) = probe
            .tcp_socket
            .as_ref()
            .and_then(|t| t.host.as_deref())
            .filter(|h| !is_own_host(h))
        {
            limits.push(format!(
                "{at}.{kind}.tcpSocket.host ({host}): ECI probes only the group itself; the probe targets the group"
            ));
        }
    }
    limits
}

/// A container's security settings in ECI's terms.
struct Security {
    context: Option<eci::ContainerSecurityContext>,
    privileged: Option<bool>,
    run_as_group: Option<i64>,
    run_as_non_root: Option<bool>,
}

/// The container's security context over the pod's (the container's setting wins, as the
/// kubelet applies them): `capabilities.add`, `readOnlyRootFilesystem`, `runAsUser`,
/// `runAsGroup`, `runAsNonRoot` and `privileged` (which the account must be allowed).
fn security(
    container: &Container,
    pod: Option<&PodSecurityContext>,
    at: &str,
) -> Result<Security, Rejection> {
    let own = container.security_context.as_ref();
    let run_as_user = own
        .and_then(|s| s.run_as_user)
        .or(pod.and_then(|p| p.run_as_user));
    let run_as_group = own
        .and_then(|s| s.run_as_group)
        .or(pod.and_then(|p| p.run_as_group));
    let run_as_non_root = own
        .and_then(|s| s.run_as_non_root)
        .or(pod.and_then(|p| p.run_as_non_root));
    if run_as_non_root == Some(true) && run_as_user == Some(0) {
        return Err(reject(
            &format!("{at}.securityContext"),
            "runAsNonRoot is set but runAsUser is 0 (root): the container could never start",
        ));
    }
    let capability = own
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .map(|add| eci::Capability { add });
    let read_only = own
        .and_then(|s| s.read_only_root_filesystem)
        .unwrap_or(false);
    let context = (capability.is_some() || read_only || run_as_user.is_some()).then_some(
        eci::ContainerSecurityContext {
            capability,
            read_only_root_filesystem: read_only,
            run_as_user,
        },
    );
    Ok(Security {
        context,
        privileged: own.and_then(|s| s.privileged).filter(|p| *p),
        run_as_group,
        run_as_non_root: run_as_non_root.filter(|n| *n),
    })
}

fn tcp_socket(
    container: &Container,
    action: &TCPSocketAction,
    at: &str,
) -> Result<eci::TcpSocketAction, Rejection> {
    Ok(eci::TcpSocketAction {
        port: port_number(container, &action.port, at)?,
        host: action.host.clone().unwrap_or_default(),
    })
}

fn probe(
    container: &Container,
    probe: &Probe,
    at: &str,
    extra_delay: i32,
) -> Result<eci::Probe, Rejection> {
    if probe.grpc.is_some() {
        return Err(reject(
            at,
            "gRPC probes are not supported on ECI; use exec, httpGet or tcpSocket",
        ));
    }
    Ok(eci::Probe {
        exec: probe.exec.as_ref().map(|e| eci::ExecAction {
            command: e.command.clone().unwrap_or_default(),
        }),
        http_get: probe
            .http_get
            .as_ref()
            .map(|h| http_get(container, h, at))
            .transpose()?,
        tcp_socket: probe
            .tcp_socket
            .as_ref()
            .map(|t| tcp_socket(container, t, at))
            .transpose()?,
        initial_delay_seconds: probe.initial_delay_seconds.unwrap_or(0) + extra_delay,
        period_seconds: probe.period_seconds.unwrap_or(10),
        timeout_seconds: probe.timeout_seconds.unwrap_or(1),
        success_threshold: probe.success_threshold.unwrap_or(1),
        failure_threshold: probe.failure_threshold.unwrap_or(3),
    })
}

fn handler(
    container: &Container,
    handler: &LifecycleHandler,
    at: &str,
) -> Result<eci::LifecycleHandler, Rejection> {
    let exec = match (&handler.exec, &handler.sleep) {
        (Some(exec), _) => Some(eci::ExecAction {
            command: exec.command.clone().unwrap_or_default(),
        }),
        (None, Some(sleep)) => Some(eci::ExecAction {
            command: vec!["sleep".into(), sleep.seconds.to_string()],
        }),
        (None, None) => None,
    };
    Ok(eci::LifecycleHandler {
        exec,
        http_get: handler
            .http_get
            .as_ref()
            .map(|h| http_get(container, h, at))
            .transpose()?,
        tcp_socket: handler
            .tcp_socket
            .as_ref()
            .map(|t| tcp_socket(container, t, at))
            .transpose()?,
    })
}

/// A container's size as ECI takes it, each part `None` when unset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Size {
    /// vCPU.
    pub(crate) cpu: Option<f64>,
    /// GiB.
    pub(crate) memory: Option<f64>,
    /// GPUs.
    pub(crate) gpu: Option<i32>,
}

/// The container's [`Size`].
pub(crate) fn size(container: &Container, at: &str) -> Result<Size, Rejection> {
    let resources = container.resources.as_ref();
    let get = |kind: &str| {
        resources
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(kind))
            .or_else(|| {
                resources
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get(kind))
            })
            .map(|q| quantity::parse(&q.0).map_err(|e| reject(at, e.to_string())))
            .transpose()
    };
    let cpu = get("cpu")?;
    let memory = get("memory")?.map(quantity::gib);
    #[allow(clippy::cast_possible_truncation)]
    let gpu = get("nvidia.com/gpu")?.map(|g| g.round() as i32);
    Ok(Size { cpu, memory, gpu })
}

/// One container in ECI's terms (`env` resolved by the caller).
/// `words` with `$(NAME)` expanded from the container's final environment, as the kubelet
/// expands command and args.
fn expand_all(words: Option<&[String]>, env: &[eci::EnvironmentVar]) -> Vec<String> {
    let defined = |name: &str| {
        env.iter()
            .find(|v| v.key == name && v.field_ref.is_none())
            .map(|v| v.value.as_str())
    };
    words
        .unwrap_or_default()
        .iter()
        .map(|word| crate::expansion::expand(word, defined))
        .collect()
}

/// The container's ports: TCP or UDP, as ECI takes them.
fn ports(container: &Container, at: &str) -> Result<Vec<eci::Port>, Rejection> {
    let mut ports = Vec::new();
    for port in container.ports.iter().flatten() {
        let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
        if protocol != "TCP" && protocol != "UDP" {
            return Err(reject(
                &format!("{at}.ports"),
                format!("protocol {protocol} is not supported on ECI; use TCP or UDP"),
            ));
        }
        ports.push(eci::Port {
            port: port.container_port,
            protocol,
        });
    }
    Ok(ports)
}

/// The container's volume mounts. ECI's VolumeMount has no `subPathExpr`: it is expanded here,
/// as the kubelet does, into the mount's SubPath (see [`expanded_sub_path`]).
fn mounts(
    container: &Container,
    env: &[eci::EnvironmentVar],
    at: &str,
) -> Result<Vec<eci::VolumeMount>, Rejection> {
    let mut mounts = Vec::new();
    for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let sub_path = match mount.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expression) => expanded_sub_path(expression, env).map_err(|problem| {
                problem.rejection(&container.name, &format!("{at}.volumeMounts[{index}]"))
            })?,
            None => mount.sub_path.clone().unwrap_or_default(),
        };
        mounts.push(eci::VolumeMount {
            name: mount.name.clone(),
            mount_path: mount.mount_path.clone(),
            sub_path,
            read_only: mount.read_only.unwrap_or(false),
            mount_propagation: mount.mount_propagation.clone().unwrap_or_default(),
        });
    }
    Ok(mounts)
}

/// Why a `subPathExpr` gives no sub-path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SubPathProblem {
    /// Variables it names have no value, or an empty one (the kubelet's "missing value").
    Missing(Vec<String>),
    /// It names a variable whose value only ECI learns (`status.podIP`).
    KnownOnlyToEci(String),
    /// It expands to an absolute path.
    Absolute(String),
    /// It expands to a path that steps out with `..`.
    Backsteps(String),
}

impl SubPathProblem {
    /// The first three wait, shown as the kubelet shows them (`CreateContainerConfigError` on
    /// the container; a pod's annotations, which variables may come from, can change); one ECI
    /// alone could resolve is refused.
    fn rejection(self, container: &str, at: &str) -> Rejection {
        let config_error = |reason: String| Rejection {
            field: at.to_owned(),
            reason,
            retryable: true,
            config_error_in: Some(container.to_owned()),
        };
        match self {
            Self::Missing(names) => config_error(format!(
                "subPathExpr: missing value for {}",
                names.join(", ")
            )),
            Self::Absolute(path) => config_error(format!(
                "subPathExpr: the sub-path {path:?} must not be an absolute path"
            )),
            Self::Backsteps(path) => config_error(format!(
                "subPathExpr: the sub-path {path:?} must not contain '..'"
            )),
            Self::KnownOnlyToEci(name) => reject(
                at,
                format!(
                    "subPathExpr names {name}, whose value ECI sets only once the group exists; use variables with literal or pod-metadata values"
                ),
            ),
        }
    }
}

/// `expression` with each `$(NAME)` replaced by the container's variable, as the kubelet expands
/// a `subPathExpr`: every name must have a non-empty value, and the result must be a relative
/// path that never steps out with `..`.
fn expanded_sub_path(
    expression: &str,
    env: &[eci::EnvironmentVar],
) -> Result<String, SubPathProblem> {
    let missing = std::cell::RefCell::new(Vec::<String>::new());
    let eci_only = std::cell::RefCell::new(None::<String>);
    let expanded = crate::expansion::expand(expression, |name| {
        match env.iter().rev().find(|var| var.key == name) {
            Some(var) if var.field_ref.is_some() => {
                eci_only.borrow_mut().get_or_insert_with(|| name.to_owned());
                None
            }
            Some(var) if !var.value.is_empty() => Some(var.value.as_str()),
            _ => {
                missing.borrow_mut().push(name.to_owned());
                None
            }
        }
    });
    if let Some(name) = eci_only.into_inner() {
        return Err(SubPathProblem::KnownOnlyToEci(name));
    }
    let mut missing = missing.into_inner();
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        return Err(SubPathProblem::Missing(missing));
    }
    if expanded.starts_with('/') {
        return Err(SubPathProblem::Absolute(expanded));
    }
    if expanded.split('/').any(|part| part == "..") {
        return Err(SubPathProblem::Backsteps(expanded));
    }
    Ok(expanded)
}

pub(super) fn container(
    container: &Container,
    pod_security: Option<&PodSecurityContext>,
    env: Vec<eci::EnvironmentVar>,
    at: &str,
) -> Result<eci::Container, Rejection> {
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| reject(&format!("{at}.image"), "an image is required"))?;
    let ports = ports(container, at)?;
    let mounts = mounts(container, &env, at)?;
    let startup_window = container.startup_probe.as_ref().map_or(0, |p| {
        p.initial_delay_seconds.unwrap_or(0)
            + p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3)
    });
    let security = security(container, pod_security, at)?;
    let Size { cpu, memory, gpu } = size(container, at)?;
    let lifecycle = container.lifecycle.as_ref();
    Ok(eci::Container {
        name: container.name.clone(),
        image,
        cpu,
        memory,
        gpu,
        command: expand_all(container.command.as_deref(), &env),
        arg: expand_all(container.args.as_deref(), &env),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        image_pull_policy: container.image_pull_policy.clone().unwrap_or_default(),
        environment_var: env,
        port: ports,
        volume_mount: mounts,
        readiness_probe: container
            .readiness_probe
            .as_ref()
            .map(|p| probe(container, p, &format!("{at}.readinessProbe"), 0))
            .transpose()?,
        liveness_probe: container
            .liveness_probe
            .as_ref()
            .map(|p| probe(container, p, &format!("{at}.livenessProbe"), startup_window))
            .transpose()?,
        security_context: security.context,
        security_context_privileged: security.privileged,
        security_context_run_as_group: security.run_as_group,
        security_context_run_as_non_root: security.run_as_non_root,
        lifecycle_post_start_handler: lifecycle
            .and_then(|l| l.post_start.as_ref())
            .map(|h| handler(container, h, &format!("{at}.lifecycle.postStart")))
            .transpose()?,
        lifecycle_pre_stop_handler: lifecycle
            .and_then(|l| l.pre_stop.as_ref())
            .map(|h| handler(container, h, &format!("{at}.lifecycle.preStop")))
            .transpose()?,
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        termination_message_path: container
            .termination_message_path
            .clone()
            .unwrap_or_default(),
        termination_message_policy: container
            .termination_message_policy
            .clone()
            .unwrap_or_default(),
    })
}
