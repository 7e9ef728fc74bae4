//! Containers: command, ports, mounts, probes, security context, lifecycle hooks, resources.
//!
//! Resources: ECI sizes a container with one number per resource: its **limit** when set,
//! else its **request**; unset means "share the group". `nvidia.com/gpu` becomes `Gpu`.
//! Probes: readiness and liveness map one to one (named ports resolved); ECI has no startup
//! probe, so a startup probe's window (`initialDelaySeconds + periodSeconds ×
//! failureThreshold`) is added to the liveness probe's initial delay — the liveness probe
//! then starts when the startup probe would have given up — and dropped when there is no
//! liveness probe. gRPC probes are rejected. Security: `capabilities.add`, `runAsUser` and
//! `readOnlyRootFilesystem` map; `privileged` is rejected; `capabilities.drop`,
//! `runAsNonRoot`, `seccompProfile` and friends are not enforceable on ECI and are ignored.
//! Lifecycle `sleep` handlers become `sleep <n>` exec handlers.

use eci_proto::v20180808 as eci;
use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Rejection, reject};
use crate::k8s::quantity;

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
pub(super) struct Size {
    /// vCPU.
    pub(super) cpu: Option<f64>,
    /// GiB.
    pub(super) memory: Option<f64>,
    /// GPUs.
    pub(super) gpu: Option<i32>,
}

/// The container's [`Size`].
pub(super) fn size(container: &Container, at: &str) -> Result<Size, Rejection> {
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
        .map(|word| super::expansion::expand(word, defined))
        .collect()
}

pub(super) fn container(
    container: &Container,
    env: Vec<eci::EnvironmentVar>,
    at: &str,
) -> Result<eci::Container, Rejection> {
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| reject(&format!("{at}.image"), "an image is required"))?;
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
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        if mount.sub_path_expr.is_some() {
            return Err(reject(
                &format!("{at}.volumeMounts"),
                "subPathExpr is not supported on ECI; use subPath",
            ));
        }
        mounts.push(eci::VolumeMount {
            name: mount.name.clone(),
            mount_path: mount.mount_path.clone(),
            sub_path: mount.sub_path.clone().unwrap_or_default(),
            read_only: mount.read_only.unwrap_or(false),
            mount_propagation: mount.mount_propagation.clone().unwrap_or_default(),
        });
    }
    let startup_window = container.startup_probe.as_ref().map_or(0, |p| {
        p.initial_delay_seconds.unwrap_or(0)
            + p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3)
    });
    let security = match &container.security_context {
        Some(sc) if sc.privileged == Some(true) => {
            return Err(reject(
                &format!("{at}.securityContext.privileged"),
                "privileged containers cannot run on ECI",
            ));
        }
        Some(sc) => Some(eci::ContainerSecurityContext {
            capability: sc
                .capabilities
                .as_ref()
                .and_then(|c| c.add.clone())
                .map(|add| eci::Capability { add }),
            read_only_root_filesystem: sc.read_only_root_filesystem.unwrap_or(false),
            run_as_user: sc.run_as_user,
        }),
        None => None,
    };
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
        security_context: security,
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
