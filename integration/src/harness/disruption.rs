//! Breaking things on purpose, the way a real cluster breaks: freezing a process (SIGSTOP /
//! SIGCONT), compacting etcd's history, and a second kube-apiserver on the fixture's etcd that
//! a daemon talks to and the test crashes and restarts — a daemon's watch then has to resume
//! from a resourceVersion the apiserver may no longer serve (410 Gone), and relist.
//!
//! The etcd and apiserver parts need the fixture's control plane (its directory says where
//! etcd is and how the apiserver runs); with `E2E_KUBECONFIG` they answer
//! [`HarnessError::Setup`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ClusterKind, Harness, HarnessError};
use crate::cluster::etcd;
use crate::http_check::HttpCheck;
use crate::process::{Process, free_port};

/// The process name of the second apiserver.
const SECOND_APISERVER: &str = "kube-apiserver-2";

/// A second kube-apiserver on the fixture's etcd (see [`Harness::start_second_apiserver`]).
#[derive(Debug, Clone)]
pub struct SecondApiserver {
    args: Vec<String>,
    ca: PathBuf,
    port: u16,
    /// A kubeconfig for daemons (their ServiceAccount's token) that points at this apiserver.
    pub daemon_kubeconfig: PathBuf,
}

impl SecondApiserver {
    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

fn setup(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

impl Harness {
    fn fixture_only(&self, what: &str) -> Result<(), HarnessError> {
        match self.kind {
            ClusterKind::Fixture => Ok(()),
            ClusterKind::External => Err(setup(format!(
                "{what} needs the fixture's control plane, not E2E_KUBECONFIG's cluster"
            ))),
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process called `name`.
    pub fn signal_process(&mut self, name: &str, signal: &str) -> Result<(), HarnessError> {
        let pid = self
            .process(name)
            .and_then(|p| p.pid())
            .ok_or_else(|| setup(format!("no running process called {name}")))?;
        send_signal(pid, signal, name)
    }

    /// Compacts the fixture's etcd up to its current revision and returns that revision.
    pub async fn compact_etcd(&self) -> Result<i64, HarnessError> {
        self.fixture_only("compacting etcd")?;
        let url = etcd::url_in(&self.fixture_dir)?;
        Ok(etcd::compact(&url).await?)
    }

    /// Starts a second kube-apiserver on the fixture's etcd: the fixture apiserver's flags with
    /// a port of its own and `extra` flags after them (`--watch-cache=false` makes it serve
    /// every watch from etcd, so a compaction is what expires old resourceVersions). Waits
    /// until it is ready.
    pub async fn start_second_apiserver(
        &mut self,
        extra: &[&str],
    ) -> Result<SecondApiserver, HarnessError> {
        self.fixture_only("a second apiserver")?;
        let flags_file = self.fixture_dir.join(etcd::APISERVER_ARGS_FILE);
        let flags = std::fs::read_to_string(&flags_file).map_err(|source| HarnessError::Io {
            what: format!("read {}", flags_file.display()),
            source,
        })?;
        let port = free_port()?;
        let mut args: Vec<String> = flags
            .lines()
            .filter(|flag| !flag.starts_with("--secure-port="))
            .map(str::to_owned)
            .collect();
        args.push(format!("--secure-port={port}"));
        args.extend(extra.iter().map(|flag| (*flag).to_owned()));
        let (ca, daemon_kubeconfig) = self.kubeconfig_for_port(port)?;
        let second = SecondApiserver {
            args,
            ca,
            port,
            daemon_kubeconfig,
        };
        self.restart_second_apiserver(&second).await?;
        Ok(second)
    }

    /// The daemon kubeconfig pointed at `port`, written beside the harness's files, and the CA
    /// it trusts.
    fn kubeconfig_for_port(&self, port: u16) -> Result<(PathBuf, PathBuf), HarnessError> {
        let text = std::fs::read_to_string(&self.daemon_kubeconfig).map_err(|source| {
            HarnessError::Io {
                what: format!("read {}", self.daemon_kubeconfig.display()),
                source,
            }
        })?;
        let mut config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| setup(e.to_string()))?;
        let mut ca = None;
        for cluster in config["clusters"].as_array_mut().into_iter().flatten() {
            cluster["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
            ca = cluster["cluster"]["certificate-authority"]
                .as_str()
                .map(PathBuf::from);
        }
        let ca = ca.ok_or_else(|| setup("the daemon kubeconfig names no CA file"))?;
        let path = self
            .dir()
            .join(format!("daemon-{SECOND_APISERVER}.kubeconfig"));
        std::fs::write(&path, config.to_string()).map_err(|source| HarnessError::Io {
            what: format!("write {}", path.display()),
            source,
        })?;
        Ok((ca, path))
    }

    /// Kills the second apiserver (SIGKILL, as a crash: every connection to it breaks).
    pub async fn kill_second_apiserver(&mut self) {
        if let Some(process) = self.process(SECOND_APISERVER) {
            process.kill().await;
        }
        self.processes.retain(|p| p.name() != SECOND_APISERVER);
    }

    /// Starts the second apiserver (again), with the same flags and port; waits until it is
    /// ready.
    pub async fn restart_second_apiserver(
        &mut self,
        second: &SecondApiserver,
    ) -> Result<(), HarnessError> {
        let program = self.upstream_apiserver().await?;
        let process = Process::spawn(
            SECOND_APISERVER,
            &program,
            &second.args,
            &[],
            self.dir.path(),
        )?;
        self.processes.push(process);
        let ca = std::fs::read(&second.ca).map_err(|source| HarnessError::Io {
            what: format!("read {}", second.ca.display()),
            source,
        })?;
        let readyz = HttpCheck::trusting(&ca, format!("{}/readyz", second.server()))
            .map_err(|e| setup(e.to_string()))?;
        // A cold apiserver on a busy 2-core machine takes tens of seconds.
        self.wait_for(
            &format!("{SECOND_APISERVER} to be ready"),
            Duration::from_secs(180),
            |_| readyz.clone().passes(),
        )
        .await
    }

    async fn upstream_apiserver(&self) -> Result<PathBuf, HarnessError> {
        let shared = super::fixture::shared().await?;
        shared
            .upstream
            .path("kube-apiserver")
            .map(Path::to_path_buf)
            .map_err(|e| setup(e.to_string()))
    }
}

/// Sends `signal` (`TERM`, `STOP`, …) to process `pid`, called `name` in errors.
pub(super) fn send_signal(pid: u32, signal: &str, name: &str) -> Result<(), HarnessError> {
    // `kill` keeps this crate free of unsafe signal calls.
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|source| HarnessError::Io {
            what: format!("send SIG{signal} to {name} (pid {pid})"),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(setup(format!(
            "kill -{signal} {pid} ({name}) failed: {status}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_reaches_a_live_process_and_not_a_reaped_one() {
        // Signal 0 only checks that the process exists and may be signalled.
        assert!(send_signal(std::process::id(), "0", "this test").is_ok());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let refused = send_signal(pid, "0", "true").unwrap_err();
        assert!(
            matches!(&refused, HarnessError::Setup(m) if m.starts_with(&format!("kill -0 {pid} (true) failed"))),
            "{refused:?}"
        );
    }
}
