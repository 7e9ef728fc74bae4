//! Probes and lifecycle hooks against a container: `httpGet` (HTTP, or HTTPS without
//! verification, as the kubelet does), `tcpSocket`, `exec` (inside the container's namespaces)
//! and `sleep` hooks; the default host is the pod's IP and a named port resolves through the
//! container's ports. gRPC probes are not supported: they count as successes (with a warning).

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ExecAction, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::process::{self, Tools};

/// A probe or hook could not be run as specified.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    /// A named port is not one of the container's ports.
    #[error("port {name:?} is not a named port of the container")]
    UnknownPort {
        /// The name.
        name: String,
    },
    /// The port number is out of range.
    #[error("port {port} is out of range")]
    BadPort {
        /// The number.
        port: i32,
    },
    /// The handler has no action the agent knows.
    #[error("the probe or hook has no supported action")]
    NoAction,
}

/// One probe's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Passed.
    Success,
    /// Failed, with why.
    Failure(String),
}

/// What a probe runs against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The pod's IP.
    pub(crate) pod_ip: &'a str,
    /// The container (for named ports).
    pub(crate) container: &'a Container,
    /// Its process, for exec actions.
    pub(crate) pid: u32,
    /// Its environment, for exec actions.
    pub(crate) env: &'a [(String, String)],
    /// HTTP client (no certificate verification, no proxy).
    pub(crate) http: &'a reqwest::Client,
    /// The agent's tools.
    pub(crate) tools: &'a Tools,
}

/// The probe's timing with the API defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) initial_delay: Duration,
    pub(crate) period: Duration,
    pub(crate) timeout: Duration,
    pub(crate) success_threshold: u32,
    pub(crate) failure_threshold: u32,
}

impl Timing {
    /// Defaults: delay 0, period 10 s, timeout 1 s, thresholds 1 and 3.
    pub(crate) fn of(probe: &Probe) -> Self {
        let seconds = |value: Option<i32>, default: u64, min: u64| {
            Duration::from_secs(
                value
                    .and_then(|v| u64::try_from(v).ok())
                    .unwrap_or(default)
                    .max(min),
            )
        };
        let count = |value: Option<i32>, default: u32| {
            value
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(default)
                .max(1)
        };
        Self {
            initial_delay: seconds(probe.initial_delay_seconds, 0, 0),
            period: seconds(probe.period_seconds, 10, 1),
            timeout: seconds(probe.timeout_seconds, 1, 1),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

/// Consecutive results → a verdict once a threshold is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Thresholds {
    successes: u32,
    failures: u32,
}

impl Thresholds {
    /// Records one result; `Some(true)` when the success threshold is (still) met,
    /// `Some(false)` when the failure threshold is, `None` in between.
    pub(crate) fn record(&mut self, success: bool, timing: &Timing) -> Option<bool> {
        if success {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            (self.successes >= timing.success_threshold).then_some(true)
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            (self.failures >= timing.failure_threshold).then_some(false)
        }
    }
}

/// Which of a container's probes runs: how its messages name it and which of its failures
/// are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    /// `startupProbe`: holds back the other two until it passes.
    Startup,
    /// `readinessProbe`: sets the container's readiness.
    Readiness,
    /// `livenessProbe`: restarts the container when it fails for good.
    Liveness,
}

impl ProbeKind {
    /// The name that starts its event messages (`Liveness probe failed: …`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Readiness => "Readiness",
            Self::Liveness => "Liveness",
        }
    }

    /// Whether a failed try is reported as an `Unhealthy` event, given what
    /// [`Thresholds::record`] made of it: every failed readiness or liveness try is, but a
    /// startup probe is expected to fail while the container comes up, so only the try that
    /// makes it fail for good is.
    pub(crate) fn reports_failure(self, met: Option<bool>) -> bool {
        self != Self::Startup || met == Some(false)
    }

    /// Why the container is restarted once this probe has failed for good (the `Killing`
    /// event reads `Container <name> <reason>, will be restarted`).
    pub(crate) fn restart_reason(self) -> String {
        format!("failed {} probe", self.name().to_lowercase())
    }
}

/// Resolves a probe port: a number, or the name of one of the container's ports.
pub(crate) fn port(container: &Container, port: &IntOrString) -> Result<u16, ProbeError> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| ProbeError::UnknownPort { name: name.clone() })?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|n| *n != 0)
        .ok_or(ProbeError::BadPort { port: number })
}

/// Runs a probe once.
pub(crate) async fn probe_once(probe: &Probe, target: Target<'_>, timeout: Duration) -> Verdict {
    if let Some(action) = &probe.http_get {
        return http_get(action, target, timeout).await;
    }
    if let Some(action) = &probe.tcp_socket {
        return tcp_socket(action, target, timeout).await;
    }
    if let Some(action) = &probe.exec {
        return exec(action, target, Some(timeout)).await;
    }
    if probe.grpc.is_some() {
        tracing::warn!("gRPC probes are not supported by the host agent: counted as successes");
        return Verdict::Success;
    }
    Verdict::Failure(ProbeError::NoAction.to_string())
}

/// Runs a lifecycle hook (preStop/postStart) to its end or `timeout`.
pub(crate) async fn hook(
    handler: &LifecycleHandler,
    target: Target<'_>,
    timeout: Duration,
) -> Verdict {
    let run = async {
        if let Some(action) = &handler.exec {
            exec(action, target, None).await
        } else if let Some(action) = &handler.http_get {
            http_get(action, target, timeout).await
        } else if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(
                u64::try_from(sleep.seconds).unwrap_or(0),
            ))
            .await;
            Verdict::Success
        } else if let Some(action) = &handler.tcp_socket {
            tcp_socket(action, target, timeout).await
        } else {
            Verdict::Failure(ProbeError::NoAction.to_string())
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or_else(|_| Verdict::Failure(format!("hook did not finish within {timeout:?}")))
}

fn host<'a>(explicit: Option<&'a str>, target: Target<'a>) -> &'a str {
    explicit.filter(|h| !h.is_empty()).unwrap_or(target.pod_ip)
}

async fn http_get(action: &HTTPGetAction, target: Target<'_>, timeout: Duration) -> Verdict {
    let port = match port(target.container, &action.port) {
        Ok(port) => port,
        Err(error) => return Verdict::Failure(error.to_string()),
    };
    let scheme = if action
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"))
    {
        "https"
    } else {
        "http"
    };
    let host = host(action.host.as_deref(), target);
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let path = action.path.as_deref().unwrap_or("/");
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let url = format!("{scheme}://{host}:{port}{path}");
    let mut request = target
        .http
        .get(&url)
        .timeout(timeout)
        .header("User-Agent", "kube-probe/1.37")
        .header("Accept", "*/*");
    for header in action.http_headers.iter().flatten() {
        request = request.header(header.name.as_str(), header.value.as_str());
    }
    match request.send().await {
        Ok(response) if (200..400).contains(&response.status().as_u16()) => Verdict::Success,
        Ok(response) => Verdict::Failure(format!(
            "HTTP probe failed with statuscode: {}",
            response.status().as_u16()
        )),
        Err(error) => Verdict::Failure(format!("Get {url:?}: {error}")),
    }
}

async fn tcp_socket(action: &TCPSocketAction, target: Target<'_>, timeout: Duration) -> Verdict {
    let port = match port(target.container, &action.port) {
        Ok(port) => port,
        Err(error) => return Verdict::Failure(error.to_string()),
    };
    let host = host(action.host.as_deref(), target);
    let addr = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    };
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => Verdict::Success,
        Ok(Err(error)) => Verdict::Failure(format!("dial tcp {addr}: {error}")),
        Err(_) => Verdict::Failure(format!("dial tcp {addr}: timeout")),
    }
}

async fn exec(action: &ExecAction, target: Target<'_>, timeout: Option<Duration>) -> Verdict {
    let command = action.command.clone().unwrap_or_default();
    let Some(mut cmd) = process::exec_in(target.tools, target.pid, &command, target.env) else {
        return Verdict::Failure("exec action without a command".into());
    };
    let run = cmd.output();
    let output = match timeout {
        Some(timeout) => match tokio::time::timeout(timeout, run).await {
            Ok(output) => output,
            Err(_) => return Verdict::Failure(format!("command timed out after {timeout:?}")),
        },
        None => run.await,
    };
    match output {
        Ok(output) if output.status.success() => Verdict::Success,
        Ok(output) => Verdict::Failure(format!(
            "command {command:?} exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim()
        )),
        Err(error) => Verdict::Failure(format!("command {command:?}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn timing_defaults() {
        let t = Timing::of(&Probe::default());
        assert_eq!(
            t,
            Timing {
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
        let t = Timing::of(&Probe {
            initial_delay_seconds: Some(2),
            period_seconds: Some(0),
            timeout_seconds: Some(5),
            success_threshold: Some(2),
            failure_threshold: Some(1),
            ..Probe::default()
        });
        assert_eq!(
            (
                t.initial_delay,
                t.period,
                t.timeout,
                t.success_threshold,
                t.failure_threshold
            ),
            (
                Duration::from_secs(2),
                Duration::from_secs(1),
                Duration::from_secs(5),
                2,
                1
            )
        );
    }

    #[test]
    fn thresholds() {
        let timing = Timing {
            success_threshold: 2,
            failure_threshold: 3,
            ..Timing::of(&Probe::default())
        };
        let mut t = Thresholds::default();
        let results: Vec<Option<bool>> = [true, true, false, false, false, false, true, true]
            .iter()
            .map(|ok| t.record(*ok, &timing))
            .collect();
        assert_eq!(
            results,
            [
                None,
                Some(true),
                None,
                None,
                Some(false),
                Some(false),
                None,
                Some(true)
            ]
        );
    }

    #[test]
    fn probe_kinds_report_and_restart() {
        let cases = [
            (ProbeKind::Startup, None, false),
            (ProbeKind::Startup, Some(true), false),
            (ProbeKind::Startup, Some(false), true),
            (ProbeKind::Readiness, None, true),
            (ProbeKind::Readiness, Some(false), true),
            (ProbeKind::Liveness, None, true),
            (ProbeKind::Liveness, Some(false), true),
        ];
        for (kind, met, reported) in cases {
            assert_eq!(kind.reports_failure(met), reported, "{kind:?} {met:?}");
        }
        assert_eq!(ProbeKind::Startup.restart_reason(), "failed startup probe");
        assert_eq!(
            ProbeKind::Liveness.restart_reason(),
            "failed liveness probe"
        );
        assert_eq!(ProbeKind::Readiness.name(), "Readiness");
    }

    #[test]
    fn ports() {
        let container = Container {
            ports: Some(vec![ContainerPort {
                name: Some("admin".into()),
                container_port: 8080,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        };
        let cases = [
            (IntOrString::Int(80), Ok(80)),
            (IntOrString::String("admin".into()), Ok(8080)),
            (IntOrString::String("81".into()), Ok(81)),
            (
                IntOrString::String("metrics".into()),
                Err(ProbeError::UnknownPort {
                    name: "metrics".into(),
                }),
            ),
            (
                IntOrString::Int(70000),
                Err(ProbeError::BadPort { port: 70000 }),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(port(&container, &input), want, "{input:?}");
        }
    }

    #[tokio::test]
    async fn tcp_and_http_probes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    break;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                    let mut buf = vec![0u8; 1024];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).to_string();
                    let status = if request.starts_with("GET /healthz ") {
                        "200 OK"
                    } else {
                        "500 Oops"
                    };
                    let _ = stream
                        .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes())
                        .await;
                });
            }
        });
        let container = Container {
            ports: Some(vec![ContainerPort {
                name: Some("admin".into()),
                container_port: i32::from(port),
                ..ContainerPort::default()
            }]),
            ..Container::default()
        };
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let tools = Tools {
            setpriv: "setpriv".into(),
            unshare: "unshare".into(),
            sh: "sh".into(),
            mount: "mount".into(),
            mkdir: "mkdir".into(),
            touch: "touch".into(),
            hostname: None,
            nsenter: "nsenter".into(),
            kill: "kill".into(),
        };
        let target = Target {
            pod_ip: "127.0.0.1",
            container: &container,
            pid: 0,
            env: &[],
            http: &http,
            tools: &tools,
        };
        let http_probe = |path: &str| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::String("admin".into()),
                ..HTTPGetAction::default()
            }),
            ..Probe::default()
        };
        let second = Duration::from_secs(1);
        assert_eq!(
            probe_once(&http_probe("/healthz"), target, second).await,
            Verdict::Success
        );
        assert!(
            matches!(probe_once(&http_probe("/other"), target, second).await, Verdict::Failure(m) if m.contains("500"))
        );
        let tcp = |port: IntOrString| Probe {
            tcp_socket: Some(TCPSocketAction { host: None, port }),
            ..Probe::default()
        };
        assert_eq!(
            probe_once(&tcp(IntOrString::String("admin".into())), target, second).await,
            Verdict::Success
        );
        server.abort();
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        assert!(matches!(
            probe_once(
                &tcp(IntOrString::Int(i32::from(closed_port))),
                target,
                second
            )
            .await,
            Verdict::Failure(_)
        ));
    }
}
