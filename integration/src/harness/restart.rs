//! Restarting the fixture's own etcd and kube-apiserver — the ones kube-controller-manager,
//! kube-scheduler, kwok, the host agent and every daemon use — as an operator's upgrade or a
//! crash would: the running process is found by its command line (the playground started it),
//! stopped (SIGKILL, or SIGTERM with a grace), and started again with the same command line,
//! on the same ports and data, by this test process. Then the harness waits until it serves.
//!
//! The new process is owned by a thread of this test process that lives as long as the process
//! does: `setpriv --pdeathsig KILL` (see [`Process::spawn`]) kills it when the test binary exits,
//! so it never outlives the suite (the playground, which started the first one, stops the rest
//! of the control plane at the same moment). Everything else in the cluster sees a real
//! restart: connections reset, watches broken, a fresh watch cache (apiserver) or a store
//! reopened from its WAL (etcd).
//!
//! Fixture only (with `E2E_KUBECONFIG` there is nothing of ours to restart), and it disturbs
//! every test sharing the cluster: run such cases alone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::disruption::send_signal;
use super::{Harness, HarnessError};
use crate::cluster::etcd;
use crate::proc_stat::ProcStat;
use crate::process::{Process, ProcessError};

/// A component of the fixture's control plane that [`Harness::restart_control_plane`]
/// restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// etcd.
    Etcd,
    /// The fixture's kube-apiserver (not a [`super::SecondApiserver`]).
    KubeApiserver,
}

impl Component {
    fn binary(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::KubeApiserver => "kube-apiserver",
        }
    }
}

/// How the component goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: a crash.
    Kill,
    /// SIGTERM, then SIGKILL after the grace.
    Term(Duration),
}

/// What a restart took.
#[derive(Debug, Clone, Copy)]
pub struct Restarted {
    /// From the signal until the old process was gone.
    pub stopped_after: Duration,
    /// From the signal until the new one served (etcd's `/health`, the apiserver's `/readyz`).
    pub serving_after: Duration,
}

struct SpawnRequest {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    log_dir: PathBuf,
    reply: oneshot::Sender<Result<Option<u32>, ProcessError>>,
}

/// The thread that owns restarted components for the rest of the test process's life.
fn keeper() -> &'static mpsc::UnboundedSender<SpawnRequest> {
    static KEEPER: OnceLock<mpsc::UnboundedSender<SpawnRequest>> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (sender, mut requests) = mpsc::unbounded_channel::<SpawnRequest>();
        let spawned = std::thread::Builder::new()
            .name("control-plane-keeper".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async move {
                    let mut held: HashMap<String, Process> = HashMap::new();
                    while let Some(request) = requests.recv().await {
                        // The previous incarnation (stopped by the caller) is reaped.
                        if let Some(mut old) = held.remove(&request.name) {
                            old.kill().await;
                        }
                        let spawned = Process::spawn(
                            &request.name,
                            &request.program,
                            &request.args,
                            &[],
                            &request.log_dir,
                        );
                        let answer = spawned.map(|process| {
                            let pid = process.pid();
                            held.insert(request.name.clone(), process);
                            pid
                        });
                        let _ = request.reply.send(answer);
                    }
                    // The sender lives in a static: this is never reached while the process runs.
                    std::future::pending::<()>().await;
                });
            });
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the control-plane keeper thread");
        }
        sender
    })
}

/// A process's command line (`/proc/PID/cmdline`).
fn command_line(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!args.is_empty()).then_some(args)
}

/// Whether the process is still running: one of its threads is (a zombie waiting for its
/// parent to reap it is not). Every thread counts, not only the first: killed, a
/// multi-threaded program's first thread can be a zombie while the others are still exiting,
/// and its files — etcd's listening sockets among them — stay open until the last is gone (a
/// restarted etcd once found its port still bound that way, and exited).
fn alive(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.filter_map(Result::ok).any(|thread| {
        std::fs::read_to_string(thread.path().join("stat"))
            .is_ok_and(|stat| ProcStat::parse(&stat).is_some_and(|s| s.runs()))
    })
}

/// Running processes whose program is called `binary` and whose command line has every one of
/// `markers`: their pid and command line.
fn find(binary: &str, markers: &[String]) -> Vec<(u32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| alive(*pid))
        .filter_map(|pid| Some((pid, command_line(pid)?)))
        .filter(|(_, args)| {
            Path::new(&args[0]).file_name().and_then(|n| n.to_str()) == Some(binary)
                && markers.iter().all(|m| args.iter().any(|a| a == m))
        })
        .collect()
}

/// A running control-plane component, as [`Harness::restart_control_plane`] found it.
struct Running {
    /// The fixture's etcd client URL.
    etcd_url: String,
    pid: u32,
    /// Its command line, program first.
    args: Vec<String>,
}

/// Gives etcd's peer listener a fresh port in `args`: while etcd was down another process may
/// have bound the old one (seen once: `bind: address already in use`, and the restarted etcd
/// exited). Nothing connects to it in a one-member cluster, and the member's advertised peer
/// URL comes from its data directory on a restart.
fn fresh_peer_port(args: &mut [String]) -> Result<(), HarnessError> {
    let fresh = format!(
        "--listen-peer-urls=http://127.0.0.1:{}",
        crate::process::free_port().map_err(|e| HarnessError::Setup(e.to_string()))?
    );
    for arg in args {
        if arg.starts_with("--listen-peer-urls=") {
            arg.clone_from(&fresh);
        }
    }
    Ok(())
}

/// Starts `component` again with the command line `args` on the keeper thread, logging to
/// `log_dir`.
async fn respawn(
    component: Component,
    args: &[String],
    log_dir: &Path,
) -> Result<(), HarnessError> {
    let name = format!("{}-restarted", component.binary());
    let (reply, answer) = oneshot::channel();
    keeper()
        .send(SpawnRequest {
            name,
            program: PathBuf::from(&args[0]),
            args: args[1..].to_vec(),
            log_dir: log_dir.to_path_buf(),
            reply,
        })
        .map_err(|_| HarnessError::Setup("the control-plane keeper thread is gone".into()))?;
    answer
        .await
        .map_err(|_| HarnessError::Setup("the control-plane keeper thread is gone".into()))??;
    Ok(())
}

impl Harness {
    /// The fixture apiserver's port (from the admin kubeconfig's server URL).
    fn api_port(&self) -> Result<u16, HarnessError> {
        self.api_url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| HarnessError::Setup(format!("no port in {}", self.api_url)))
    }

    /// Restarts `component` of the fixture's control plane (see the module's documentation):
    /// stops it as `stop` says, starts it again with the same command line, and waits up to
    /// `timeout` until it serves — and, after etcd, until the apiserver is ready again.
    pub async fn restart_control_plane(
        &mut self,
        component: Component,
        stop: Stop,
        timeout: Duration,
    ) -> Result<Restarted, HarnessError> {
        let Running {
            etcd_url,
            pid,
            mut args,
        } = self.running(component)?;
        if component == Component::Etcd {
            fresh_peer_port(&mut args)?;
        }
        let signalled = Instant::now();
        self.stop_component(component, pid, stop).await?;
        let stopped_after = signalled.elapsed();
        respawn(component, &args, &self.fixture_dir).await?;
        self.wait_serving(component, &etcd_url, timeout).await?;
        Ok(Restarted {
            stopped_after,
            serving_after: signalled.elapsed(),
        })
    }

    /// The one running process of `component` in the fixture's control plane.
    fn running(&self, component: Component) -> Result<Running, HarnessError> {
        if self.kind != super::ClusterKind::Fixture {
            return Err(HarnessError::Setup(
                "restarting etcd or kube-apiserver needs the fixture's control plane, not E2E_KUBECONFIG's cluster".into(),
            ));
        }
        let etcd_url = etcd::url_in(&self.fixture_dir)?;
        let markers = match component {
            Component::Etcd => vec![format!("--listen-client-urls={etcd_url}")],
            Component::KubeApiserver => vec![
                format!("--etcd-servers={etcd_url}"),
                format!("--secure-port={}", self.api_port()?),
            ],
        };
        let found = find(component.binary(), &markers);
        let [(pid, args)] = found.as_slice() else {
            return Err(HarnessError::Setup(format!(
                "expected one running {} with {markers:?}, found {}",
                component.binary(),
                found.len()
            )));
        };
        Ok(Running {
            etcd_url,
            pid: *pid,
            args: args.clone(),
        })
    }

    /// Stops `component`'s process `pid` as `stop` says and waits until it is gone.
    async fn stop_component(
        &self,
        component: Component,
        pid: u32,
        stop: Stop,
    ) -> Result<(), HarnessError> {
        match stop {
            Stop::Kill => send_signal(pid, "KILL", component.binary())?,
            Stop::Term(grace) => {
                send_signal(pid, "TERM", component.binary())?;
                let gone = self
                    .wait_for(
                        &format!("{} to stop after SIGTERM", component.binary()),
                        grace,
                        |_| async move { !alive(pid) },
                    )
                    .await;
                if gone.is_err() {
                    send_signal(pid, "KILL", component.binary())?;
                }
            }
        }
        self.wait_for(
            &format!("{} (pid {pid}) to be gone", component.binary()),
            Duration::from_secs(30),
            |_| async move { !alive(pid) },
        )
        .await
    }

    /// Waits up to `timeout` until the restarted `component` serves: etcd healthy at
    /// `etcd_url` (after etcd), then the apiserver ready.
    async fn wait_serving(
        &self,
        component: Component,
        etcd_url: &str,
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        if component == Component::Etcd {
            let health = format!("{etcd_url}/health");
            self.wait_for("etcd to be healthy again", timeout, |_| {
                let health = health.clone();
                async move {
                    match reqwest::get(&health).await {
                        Ok(r) if r.status().is_success() => r
                            .json::<serde_json::Value>()
                            .await
                            .is_ok_and(|v| v["health"] == "true"),
                        _ => false,
                    }
                }
            })
            .await?;
        }
        self.wait_ready(timeout).await
    }

    /// Waits up to `timeout` until kube-apiserver says it is ready (`/readyz`, which checks
    /// its etcd too).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), HarnessError> {
        self.wait_for("kube-apiserver to be ready", timeout, |h| async move {
            let request = http::Request::get("/readyz").body(Vec::new());
            match request {
                Ok(request) => h
                    .client
                    .request_text(request)
                    .await
                    .is_ok_and(|t| t.trim() == "ok"),
                Err(_) => false,
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
