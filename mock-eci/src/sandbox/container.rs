//! One running container: the OCI runtime's `run` in the foreground as our child (it waits for
//! the container and exits with its status, then deletes it), its stdout and stderr pumped to a
//! log file, and a stop that sends SIGTERM, then SIGKILL once the grace period is over.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::files::{Stream, log_line};

/// Longest wait for the runtime to run a container's process once `run` started.
const START_BOUND: Duration = Duration::from_secs(10);
/// A line longer than this is logged in parts (the kubelet's bound too).
const MAX_LOG_CHUNK: u64 = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("could not start the OCI runtime {runtime}")]
    Spawn {
        runtime: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not wait for container {id}")]
    Wait {
        id: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write the log of container {id}")]
    Log {
        id: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the log pump of container {id} ended abnormally")]
    Pump {
        id: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// How a container ended: its exit code, 128 + the signal's number if a signal ended it (the
/// convention ECI and Kubernetes report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
}

impl Exit {
    fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .or_else(|| status.signal().map(|signal| 128 + signal))
            .unwrap_or(-1);
        Self { code }
    }
}

#[derive(Debug)]
enum State {
    Running {
        child: Child,
        pump: JoinHandle<std::io::Result<()>>,
    },
    Exited(Exit),
}

/// A container the runtime runs; see the module's doc.
#[derive(Debug)]
pub struct Container {
    id: String,
    runtime: PathBuf,
    runtime_root: PathBuf,
    state: State,
}

impl Container {
    /// Starts `runtime run` on the bundle and the log pump into `log`.
    pub async fn start(
        runtime: &Path,
        runtime_root: &Path,
        id: &str,
        bundle: &Path,
        log: &Path,
    ) -> Result<Self, ContainerError> {
        let mut child = Command::new(runtime)
            .arg("--root")
            .arg(runtime_root)
            .args(["run", "--bundle"])
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ContainerError::Spawn {
                runtime: runtime.to_owned(),
                source,
            })?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ContainerError::Spawn {
                runtime: runtime.to_owned(),
                source: std::io::Error::other("the runtime's output streams were not piped"),
            });
        };
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .await
            .map_err(|source| ContainerError::Log {
                id: id.to_owned(),
                source,
            })?;
        let pump = tokio::spawn(pump(stdout, stderr, file));
        let mut container = Self {
            id: id.to_owned(),
            runtime: runtime.to_owned(),
            runtime_root: runtime_root.to_owned(),
            state: State::Running { child, pump },
        };
        container.wait_running().await;
        tracing::info!(container = id, "container started");
        Ok(container)
    }

    /// Waits until the runtime runs the container's process (so that a caller told it started
    /// can exec into it), or its `run` ended, or [`START_BOUND`] passed.
    async fn wait_running(&mut self) {
        let deadline = tokio::time::Instant::now() + START_BOUND;
        loop {
            let ended = match &mut self.state {
                State::Running { child, .. } => !matches!(child.try_wait(), Ok(None)),
                State::Exited(_) => true,
            };
            if ended {
                return;
            }
            let state = self
                .runtime_command()
                .args(["state", &self.id])
                .output()
                .await;
            if let Ok(output) = state {
                let status = serde_json::from_slice::<serde_json::Value>(&output.stdout)
                    .ok()
                    .and_then(|state| state["status"].as_str().map(str::to_owned));
                if matches!(status.as_deref(), Some("running" | "stopped")) {
                    return;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(container = %self.id, "the runtime did not report the container running in time");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How it ended, once it has (and that was seen by a wait or a stop).
    pub fn exit(&self) -> Option<Exit> {
        match self.state {
            State::Exited(exit) => Some(exit),
            State::Running { .. } => None,
        }
    }

    /// Waits for the container to end by itself.
    pub async fn wait(&mut self) -> Result<Exit, ContainerError> {
        let status = match &mut self.state {
            State::Exited(exit) => return Ok(*exit),
            State::Running { child, .. } => child.wait().await,
        };
        self.finish(status).await
    }

    /// SIGTERM, then SIGKILL if the container still runs after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Result<Exit, ContainerError> {
        if let State::Exited(exit) = self.state {
            return Ok(exit);
        }
        self.signal("TERM").await;
        let in_grace = match &mut self.state {
            State::Running { child, .. } => tokio::time::timeout(grace, child.wait()).await,
            State::Exited(exit) => return Ok(*exit),
        };
        let status = match in_grace {
            Ok(status) => status,
            Err(_elapsed) => {
                tracing::info!(container = %self.id, ?grace, "grace period over: SIGKILL");
                self.signal("KILL").await;
                match &mut self.state {
                    State::Running { child, .. } => child.wait().await,
                    State::Exited(exit) => return Ok(*exit),
                }
            }
        };
        self.finish(status).await
    }

    /// Asks the runtime to signal the container's init; a container already gone is no error
    /// (it is what the caller wants), so failures are logged only.
    async fn signal(&self, signal: &str) {
        let output = self
            .runtime_command()
            .args(["kill", &self.id, signal])
            .output()
            .await;
        match output {
            Ok(output) if output.status.success() => {}
            Ok(output) => tracing::debug!(
                container = %self.id,
                signal,
                stderr = %String::from_utf8_lossy(&output.stderr).trim(),
                "runtime kill refused (container gone?)"
            ),
            Err(error) => tracing::warn!(container = %self.id, signal, %error, "runtime kill"),
        }
    }

    /// Removes whatever the runtime still holds for the container (normally nothing: `run`
    /// deletes it on exit; this covers a runtime that was itself killed).
    pub async fn force_delete(&self) {
        let output = self
            .runtime_command()
            .args(["delete", "--force", &self.id])
            .output()
            .await;
        if let Err(error) = output {
            tracing::warn!(container = %self.id, %error, "runtime delete");
        }
    }

    fn runtime_command(&self) -> Command {
        let mut command = Command::new(&self.runtime);
        command.arg("--root").arg(&self.runtime_root);
        command
    }

    async fn finish(
        &mut self,
        status: std::io::Result<ExitStatus>,
    ) -> Result<Exit, ContainerError> {
        let status = status.map_err(|source| ContainerError::Wait {
            id: self.id.clone(),
            source,
        })?;
        let exit = Exit::from_status(status);
        // The container counts as exited only once its output is all in the log: a caller
        // that drops this future meanwhile (a `select!`) sees it running still, and its next
        // wait (the child's status is kept) waits for the rest of the log. Reporting the exit
        // earlier let a finished group's log be read, or archived, cut short.
        let pumped = match &mut self.state {
            State::Running { pump, .. } => Some(pump.await),
            State::Exited(_) => None,
        };
        self.state = State::Exited(exit);
        if let Some(pumped) = pumped {
            let pumped = pumped.map_err(|source| ContainerError::Pump {
                id: self.id.clone(),
                source,
            })?;
            pumped.map_err(|source| ContainerError::Log {
                id: self.id.clone(),
                source,
            })?;
        }
        tracing::info!(container = %self.id, code = exit.code, "container exited");
        Ok(exit)
    }
}

/// How many timestamped chunks may wait for the log file.
const LOG_CHANNEL: usize = 64;

/// Copies both streams into the log file, each chunk timestamped as it arrives, until both
/// close (the container and everything it started have exited).
async fn pump(
    stdout: impl AsyncRead + Unpin,
    stderr: impl AsyncRead + Unpin,
    mut file: tokio::fs::File,
) -> std::io::Result<()> {
    let (sender, mut receiver) = mpsc::channel::<Vec<u8>>(LOG_CHANNEL);
    let out = read_chunks(stdout, Stream::Stdout, sender.clone());
    let err = read_chunks(stderr, Stream::Stderr, sender);
    // Every line waiting is written at once: each write of a `tokio::fs::File` is a trip to
    // the blocking pool, and one trip per line left a chatty container's log far behind its
    // output on a busy machine.
    let write = async {
        let mut lines = Vec::with_capacity(LOG_CHANNEL);
        let mut batch = Vec::new();
        while receiver.recv_many(&mut lines, LOG_CHANNEL).await > 0 {
            batch.clear();
            lines
                .drain(..)
                .for_each(|line| batch.extend_from_slice(&line));
            file.write_all(&batch).await?;
        }
        file.flush().await
    };
    tokio::try_join!(out, err, write).map(|_| ())
}

async fn read_chunks(
    stream: impl AsyncRead + Unpin,
    which: Stream,
    sender: mpsc::Sender<Vec<u8>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut chunk = Vec::new();
    loop {
        chunk.clear();
        let read = (&mut reader)
            .take(MAX_LOG_CHUNK)
            .read_until(b'\n', &mut chunk)
            .await?;
        if read == 0 {
            return Ok(());
        }
        let line = log_line(jiff::Timestamp::now(), which, &chunk);
        if sender.send(line).await.is_err() {
            return Ok(());
        }
    }
}

/// How long an exec's process gets between SIGTERM and SIGKILL when its caller leaves.
const EXEC_GRACE: Duration = Duration::from_secs(2);

/// Ends the OCI runtime's `exec` child: SIGTERM first, which the runtime forwards to the
/// command in the container, SIGKILL after [`EXEC_GRACE`]. (A SIGKILL alone would end the
/// runtime and leave the command running in the container.)
pub async fn end_exec(child: &mut Child) -> std::io::Result<ExitStatus> {
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if let Ok(status) = tokio::time::timeout(EXEC_GRACE, child.wait()).await {
            return status;
        }
    }
    let _ = child.start_kill();
    child.wait().await
}
