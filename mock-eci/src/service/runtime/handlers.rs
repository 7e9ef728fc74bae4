//! Probes and lifecycle hooks of the real runtime, run as ECI runs them: an exec in the
//! container, an HTTP GET or a TCP connection to the group's address. The engine decides
//! what the outcomes mean ([`crate::engine::probe`]); this is where they are produced.
//!
//! Requests go to the group's own address only: a hook's `Host` naming anything else fails
//! (what a pod author writes must not make mock-eci reach other hosts from its own network).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use eci_proto::v20180808::{ExecAction, HttpGetAction, LifecycleHandler, Probe, TcpSocketAction};

use super::{RealRuntime, chain};
use crate::engine::probe::{ProbeKind, ProbeOutcome, ProbeTiming};
use crate::engine::real::Observation;
use crate::service::MockEci;

/// Most of an exec's output kept for the failure message.
const OUTPUT_KEPT: u64 = 4 * 1024;

/// One probe's or hook's action.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    Exec(&'a ExecAction),
    HttpGet(&'a HttpGetAction),
    TcpSocket(&'a TcpSocketAction),
}

impl<'a> Action<'a> {
    /// The probe's action (validation lets exactly one through).
    pub fn of_probe(probe: &'a Probe) -> Option<Self> {
        Self::pick(
            probe.exec.as_ref(),
            probe.http_get.as_ref(),
            probe.tcp_socket.as_ref(),
        )
    }

    /// The hook's action, if it has one.
    pub fn of_hook(handler: &'a LifecycleHandler) -> Option<Self> {
        Self::pick(
            handler.exec.as_ref(),
            handler.http_get.as_ref(),
            handler.tcp_socket.as_ref(),
        )
    }

    fn pick(
        exec: Option<&'a ExecAction>,
        http: Option<&'a HttpGetAction>,
        tcp: Option<&'a TcpSocketAction>,
    ) -> Option<Self> {
        exec.filter(|exec| !exec.command.is_empty())
            .map(Self::Exec)
            .or(http.map(Self::HttpGet))
            .or(tcp.map(Self::TcpSocket))
    }
}

/// Where a container's probes and hooks run.
#[derive(Debug, Clone)]
pub struct Target {
    pub runtime: Arc<RealRuntime>,
    pub group: String,
    pub container: String,
    pub ip: Ipv4Addr,
}

impl Target {
    /// Runs `action`, stopped after `limit` (then a failure).
    pub async fn run(&self, action: Action<'_>, limit: Duration) -> ProbeOutcome {
        let outcome = match action {
            Action::Exec(exec) => self.exec(&exec.command, limit).await,
            Action::HttpGet(http) => self.http_get(http, limit).await,
            Action::TcpSocket(tcp) => self.tcp(tcp, limit).await,
        };
        match outcome {
            Ok(()) => ProbeOutcome::Success,
            Err(message) => ProbeOutcome::Failure { message },
        }
    }

    async fn exec(&self, argv: &[String], limit: Duration) -> Result<(), String> {
        use tokio::io::AsyncReadExt as _;
        let (program, args) = self
            .runtime
            .exec_command(&self.group, &self.container, argv, false)
            .map_err(|error| chain(&error))?;
        let mut child = tokio::process::Command::new(&program)
            .args(args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| format!("cannot run {}: {error}", program.display()))?;
        let mut output = Vec::new();
        let waited = tokio::time::timeout(limit, async {
            if let Some(stdout) = child.stdout.take() {
                let _ = stdout.take(OUTPUT_KEPT).read_to_end(&mut output).await;
            }
            child.wait().await
        })
        .await;
        let status = match waited {
            Ok(status) => status.map_err(|error| error.to_string())?,
            Err(_elapsed) => {
                let _ = crate::sandbox::container::end_exec(&mut child).await;
                return Err(format!("command timed out after {limit:?}"));
            }
        };
        if status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&output).trim().to_owned();
        let code = status.code().unwrap_or(-1);
        Err(if text.is_empty() {
            format!("command exited with code {code}")
        } else {
            text
        })
    }

    async fn http_get(&self, http: &HttpGetAction, limit: Duration) -> Result<(), String> {
        let address = self.address(&http.host, http.port)?;
        let scheme = if http.scheme.eq_ignore_ascii_case("HTTPS") {
            "https"
        } else {
            "http"
        };
        let path = if http.path.starts_with('/') {
            http.path.clone()
        } else {
            format!("/{}", http.path)
        };
        let url = format!("{scheme}://{address}{path}");
        let mut request = self.runtime.http.get(&url).timeout(limit);
        for header in &http.http_header {
            request = request.header(&header.name, &header.value);
        }
        let response = request
            .send()
            .await
            .map_err(|error| format!("Get {url:?}: {}", chain(&error)))?;
        let status = response.status().as_u16();
        if (200..400).contains(&status) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {status}"))
        }
    }

    async fn tcp(&self, tcp: &TcpSocketAction, limit: Duration) -> Result<(), String> {
        let address = self.address(&tcp.host, tcp.port)?;
        match tokio::time::timeout(limit, tokio::net::TcpStream::connect(address)).await {
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(error)) => Err(format!("dial tcp {address}: {error}")),
            Err(_elapsed) => Err(format!("dial tcp {address}: timed out after {limit:?}")),
        }
    }

    /// The group's address and `port`; a `host` other than the group's is refused.
    fn address(&self, host: &str, port: i32) -> Result<SocketAddr, String> {
        let port = u16::try_from(port)
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("port {port} is out of range"))?;
        if !host.is_empty() && host.parse::<Ipv4Addr>().ok() != Some(self.ip) {
            return Err(format!(
                "host {host:?}: only the group's own address {} is reachable",
                self.ip
            ));
        }
        Ok(SocketAddr::from((self.ip, port)))
    }
}

/// Runs `kind`'s probe of run `run` until aborted: after the initial delay, then every
/// period, each outcome reported to the engine.
pub async fn probe_loop(target: Target, run: u32, kind: ProbeKind, probe: Probe, mock: MockEci) {
    let Some(action) = Action::of_probe(&probe) else {
        return;
    };
    let timing = ProbeTiming::of(kind, &probe);
    tokio::time::sleep(timing.initial_delay).await;
    loop {
        let outcome = target.run(action, timing.timeout).await;
        if let ProbeOutcome::Failure { message } = &outcome {
            tracing::debug!(group = %target.group, container = %target.container, ?kind, %message, "probe failed");
        }
        let observation = Observation::Probe { kind, outcome };
        mock.observe(&target.group, &target.container, run, &observation);
        tokio::time::sleep(timing.period).await;
    }
}
