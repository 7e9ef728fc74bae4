//! Interactive `ExecContainerCommand` (no `Sync`): its `WebSocketUri` streams the command, run
//! in the container (real runtime) or answered by the simulation (simulated runtime).
//!
//! **Where the command runs.** With `--runtime real`, in the container: the OCI runtime's
//! `exec` enters the container's namespaces and cgroup (its processes, host name and files
//! only) with the environment, working directory and user of the container's own process;
//! stdin, TTY and the exit code are the command's. With `TTY=true` the runtime is given a
//! pseudo-terminal as its stdio — the pty pair comes from `rustix` (safe wrappers: the
//! workspace forbids `unsafe`), and `setsid --ctty` (util-linux) makes it the runtime's
//! controlling terminal, which a safe `Command` cannot do — and the runtime relays it to the
//! terminal it gives the command; resizes go to the pty with `TIOCSWINSZ` and on from there.
//! The simulated runtime has no container to enter and runs nothing on mock-eci's host (that
//! would hand a tenant the machine): its sessions answer from `engine::exec::simulate`, after
//! reading stdin to its end when the command reads it (a bare `cat`).
//!
//! **The stream.** Alibaba Cloud does not document the frames of its exec WebSocket. mock-eci
//! speaks the Kubernetes channel protocol (`v5.channel.k8s.io`, also `v4.channel.k8s.io`), which
//! a Kubernetes-based service would expose and which carries what a kubelet needs: binary
//! messages whose first byte is the channel — 0 stdin, 1 stdout, 2 stderr, 3 the final
//! `metav1.Status` (with the exit code as a `NonZeroExitCode` cause), 4 terminal size
//! (`{"Width":…,"Height":…}`); in v5 the client closes stdin with `[255, 0]`. A URI serves one
//! connection within 30 s of the call, as ECI's do; it is served by the admin listener
//! (`GET /exec/{session}`), `ws://<admin address>/exec/<session>`.
//!
//! The session itself (what was asked, its one-use id, its expiry) is engine data:
//! `engine::exec_session`. This front only takes it and serves it.

use std::io;
use std::os::fd::OwnedFd;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::engine::exec::{Simulated, Simulation, reads_stdin, simulate};
use crate::engine::exec_session::{ExecTarget, PendingExec};
use crate::service::MockEci;
use crate::service::runtime::RealRuntime;

/// The subprotocols served, newest first.
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Channel numbers of the stream.
pub mod channel {
    /// Stdin (client to server).
    pub const STDIN: u8 = 0;
    /// Stdout.
    pub const STDOUT: u8 = 1;
    /// Stderr.
    pub const STDERR: u8 = 2;
    /// The final status.
    pub const ERROR: u8 = 3;
    /// Terminal size.
    pub const RESIZE: u8 = 4;
    /// v5: the client closes the channel in the next byte.
    pub const CLOSE: u8 = 255;
}

/// A running exec could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExecSessionError {
    /// The session's container is not one the runtime can enter.
    #[error("cannot enter container {container} of {group}")]
    Target {
        group: String,
        container: String,
        #[source]
        source: crate::sandbox::SandboxError,
    },
    /// A session of a real container, but mock-eci runs no real runtime.
    #[error("no real runtime runs container {container} of {group}")]
    NoRuntime { group: String, container: String },
    /// No pseudo-terminal could be opened.
    #[error("cannot open a pseudo-terminal")]
    Pty(#[source] io::Error),
    /// The command could not be started.
    #[error("cannot run {program:?}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// `GET /exec/{session}` on the admin listener: the WebSocket of one exec.
pub async fn serve(
    State(mock): State<MockEci>,
    Path(session): Path<String>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(exec) = mock.take_exec(&session) else {
        return (
            StatusCode::NOT_FOUND,
            "no such exec session (used already, or older than 30 s)",
        )
            .into_response();
    };
    let upgrade = upgrade.protocols(PROTOCOLS);
    let v5 = upgrade
        .selected_protocol()
        .is_some_and(|p| p.as_bytes() == PROTOCOLS[0].as_bytes());
    let runtime = mock.real_runtime();
    upgrade.on_upgrade(move |socket| async move {
        info!(command = ?exec.command, tty = exec.tty, stdin = exec.stdin, group = %exec.group, container = %exec.container, "exec session started");
        match &exec.target {
            ExecTarget::Simulated(simulation) => simulated(socket, &exec, simulation, v5).await,
            ExecTarget::Container => run(socket, &exec, runtime, v5).await,
        }
    })
}

/// The child's stdin: a pipe, or the terminal's master side.
struct Input {
    writer: Box<dyn AsyncWrite + Send + Unpin>,
    /// A terminal has no end of input of its own: its EOF character (^D) says it.
    pty: bool,
}

/// Most stdin a simulated session keeps.
const MAX_SIMULATED_INPUT: usize = 16 << 20;

/// A simulated session: reads stdin to its end if the command reads it, then answers.
async fn simulated(socket: WebSocket, exec: &PendingExec, simulation: &Simulation, v5: bool) {
    let (mut sink, mut source) = socket.split();
    let mut stdin = Vec::new();
    if exec.stdin && reads_stdin(&exec.command) {
        while let Some(Ok(message)) = source.next().await {
            let data = match &message {
                Message::Binary(data) => data.as_ref(),
                Message::Text(text) => text.as_bytes(),
                Message::Close(_) => break,
                _ => continue,
            };
            match data.split_first() {
                Some((&channel::STDIN, payload)) => {
                    let room = MAX_SIMULATED_INPUT.saturating_sub(stdin.len());
                    stdin.extend_from_slice(&payload[..payload.len().min(room)]);
                }
                Some((&channel::CLOSE, [channel::STDIN, ..])) if v5 => break,
                _ => {}
            }
        }
    }
    let Simulated {
        stdout,
        stderr,
        exit_code,
    } = simulate(&exec.command, simulation, &stdin);
    // A terminal has one stream.
    let streams = if exec.tty {
        vec![(channel::STDOUT, [stdout, stderr].concat())]
    } else {
        vec![(channel::STDOUT, stdout), (channel::STDERR, stderr)]
    };
    let status = exit_code_status(exit_code);
    let frames = streams
        .into_iter()
        .filter(|(_, data)| !data.is_empty())
        .map(|(channel, data)| frame(channel, &data))
        .chain([frame(channel::ERROR, status.to_string().as_bytes())]);
    for message in frames {
        if sink.send(Message::Binary(message.into())).await.is_err() {
            return;
        }
    }
    let _ = sink.send(Message::Close(None)).await;
}

async fn run(socket: WebSocket, exec: &PendingExec, runtime: Option<Arc<RealRuntime>>, v5: bool) {
    let (mut sink, mut source) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(32);
    let sender = tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            if sink.send(Message::Binary(message.into())).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    let (early, size) = if exec.tty {
        first_size(&mut source).await
    } else {
        (None, None)
    };
    let started = match start(exec, runtime.as_deref(), size) {
        Ok(started) => started,
        Err(error) => {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "reason": "InternalError",
                "message": super::ErrorChain(&error).to_string(),
            });
            finish(out_tx, sender, &status).await;
            return;
        }
    };
    let Started {
        mut child,
        input,
        outputs,
        pty,
    } = started;
    let pumps: Vec<_> = outputs
        .into_iter()
        .map(|(channel, reader)| tokio::spawn(pump(reader, channel, out_tx.clone())))
        .collect();
    let mut input = if exec.stdin { input } else { None };
    if let (None, Some(data)) = (size, early) {
        handle_input(&data, &mut input, pty.as_ref(), v5).await;
    }
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            message = source.next() => match message {
                Some(Ok(Message::Binary(data))) => {
                    handle_input(&data, &mut input, pty.as_ref(), v5).await;
                }
                Some(Ok(Message::Text(text))) => {
                    handle_input(text.as_bytes(), &mut input, pty.as_ref(), v5).await;
                }
                Some(Ok(_)) => {}
                // The client went away: the command goes with it, as an exec's does.
                Some(Err(_)) | None => break crate::sandbox::container::end_exec(&mut child).await,
            },
        }
    };
    drop(input);
    for pump in pumps {
        let _ = pump.await;
    }
    let status = match status {
        Ok(status) => exit_status(status),
        Err(error) => json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "InternalError",
            "message": format!("waiting for the command: {error}"),
        }),
    };
    debug!(%status, "exec session ended");
    finish(out_tx, sender, &status).await;
}

/// Sends the final status and waits until everything was sent.
async fn finish(
    out: mpsc::Sender<Vec<u8>>,
    sender: tokio::task::JoinHandle<()>,
    status: &serde_json::Value,
) {
    let _ = out
        .send(frame(channel::ERROR, status.to_string().as_bytes()))
        .await;
    drop(out);
    let _ = sender.await;
}

/// A TTY session's first message, and the terminal size if it is one. The terminal gets the
/// client's first size (kubectl sends it first) before the runtime starts, which copies it to
/// the command's terminal — just after the command started, as it relays every later resize,
/// so a command that asks at once may still see 0x0.
async fn first_size(
    source: &mut futures::stream::SplitStream<WebSocket>,
) -> (Option<Vec<u8>>, Option<rustix::termios::Winsize>) {
    let early = match tokio::time::timeout(FIRST_RESIZE, source.next()).await {
        Ok(Some(Ok(Message::Binary(data)))) => Some(data.to_vec()),
        Ok(Some(Ok(Message::Text(text)))) => Some(text.as_bytes().to_vec()),
        _ => None,
    };
    let size = early.as_deref().and_then(|data| match data.split_first() {
        Some((&channel::RESIZE, payload)) => terminal_size(payload),
        _ => None,
    });
    (early, size)
}

async fn handle_input(data: &[u8], input: &mut Option<Input>, pty: Option<&OwnedFd>, v5: bool) {
    let Some((&channel, payload)) = data.split_first() else {
        return;
    };
    match channel {
        channel::STDIN => {
            let failed = match input.as_mut() {
                Some(input) => {
                    input.writer.write_all(payload).await.is_err()
                        || input.writer.flush().await.is_err()
                }
                None => false,
            };
            if failed {
                *input = None;
            }
        }
        channel::RESIZE => {
            if let (Some(master), Some(size)) = (pty, terminal_size(payload)) {
                let _ = rustix::termios::tcsetwinsize(master, size);
            }
        }
        channel::CLOSE if v5 && payload.first() == Some(&channel::STDIN) => {
            if let Some(mut open) = input.take() {
                if open.pty {
                    let _ = open.writer.write_all(&[4]).await;
                }
                let _ = open.writer.shutdown().await;
            }
        }
        _ => {}
    }
}

/// How long a TTY session waits for the client's first message, the terminal's size.
const FIRST_RESIZE: std::time::Duration = std::time::Duration::from_secs(1);

/// A resize message's `{"Width":…,"Height":…}`.
fn terminal_size(payload: &[u8]) -> Option<rustix::termios::Winsize> {
    let size = serde_json::from_slice::<serde_json::Value>(payload).ok()?;
    let dimension = |key: &str| {
        size.get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .unwrap_or(0)
    };
    Some(rustix::termios::Winsize {
        ws_row: dimension("Height"),
        ws_col: dimension("Width"),
        ws_xpixel: 0,
        ws_ypixel: 0,
    })
}

fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    out
}

/// The final status the kubelet writes for an exit status.
pub fn exit_status(status: ExitStatus) -> serde_json::Value {
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1);
    exit_code_status(code)
}

/// The final status the kubelet writes for an exit code.
fn exit_code_status(code: i32) -> serde_json::Value {
    if code == 0 {
        return json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    }
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// A stream of the child's output: a pipe, or the terminal's master side.
type Output = Box<dyn AsyncRead + Send + Unpin>;

async fn pump(mut output: Output, channel: u8, out: mpsc::Sender<Vec<u8>>) {
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        // A terminal reads EIO once the child and its descendants closed it: the end.
        let read = output.read(&mut buffer).await;
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out.send(frame(channel, &buffer[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

struct Started {
    child: tokio::process::Child,
    input: Option<Input>,
    outputs: Vec<(u8, Output)>,
    pty: Option<OwnedFd>,
}

/// Starts the OCI runtime's exec of the session's command in its container.
fn start(
    exec: &PendingExec,
    runtime: Option<&RealRuntime>,
    size: Option<rustix::termios::Winsize>,
) -> Result<Started, ExecSessionError> {
    let Some(runtime) = runtime else {
        return Err(ExecSessionError::NoRuntime {
            group: exec.group.clone(),
            container: exec.container.clone(),
        });
    };
    let (program, args) = runtime
        .exec_command(&exec.group, &exec.container, &exec.command, exec.tty)
        .map_err(|source| ExecSessionError::Target {
            group: exec.group.clone(),
            container: exec.container.clone(),
            source,
        })?;
    let program = program.display().to_string();
    if exec.tty {
        let mut command = tokio::process::Command::new("setsid");
        command
            .arg("--ctty")
            .arg("--wait")
            .arg(&program)
            .args(&args);
        start_in_terminal(command, &program, size)
    } else {
        let mut command = tokio::process::Command::new(&program);
        command.args(&args);
        start_piped(command, &program, exec.stdin)
    }
}

/// The runtime's own environment; the command's is the container's.
fn runtime_env(command: &mut tokio::process::Command) -> &mut tokio::process::Command {
    command
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .current_dir("/")
        .kill_on_drop(true)
}

fn spawn_error(program: &str) -> impl FnOnce(io::Error) -> ExecSessionError {
    let program = program.to_owned();
    move |source| ExecSessionError::Spawn { program, source }
}

/// Without a terminal: stdin (if asked), stdout and stderr are pipes.
fn start_piped(
    mut command: tokio::process::Command,
    program: &str,
    stdin: bool,
) -> Result<Started, ExecSessionError> {
    runtime_env(&mut command)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(spawn_error(program))?;
    let input = child.stdin.take().map(|stdin| Input {
        writer: Box::new(stdin),
        pty: false,
    });
    let mut outputs: Vec<(u8, Output)> = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        outputs.push((channel::STDOUT, Box::new(stdout)));
    }
    if let Some(stderr) = child.stderr.take() {
        outputs.push((channel::STDERR, Box::new(stderr)));
    }
    Ok(Started {
        child,
        input,
        outputs,
        pty: None,
    })
}

/// With a terminal of `size`: the pty's other end is the runtime's stdio and controlling
/// terminal (`command` is `setsid --ctty …`).
fn start_in_terminal(
    mut command: tokio::process::Command,
    program: &str,
    size: Option<rustix::termios::Winsize>,
) -> Result<Started, ExecSessionError> {
    let (master, slave) = open_pty().map_err(ExecSessionError::Pty)?;
    if let Some(size) = size {
        rustix::termios::tcsetwinsize(&master, size)
            .map_err(|e| ExecSessionError::Pty(e.into()))?;
    }
    let stdio = || {
        slave
            .try_clone()
            .map(Stdio::from)
            .map_err(ExecSessionError::Pty)
    };
    runtime_env(&mut command)
        .stdin(stdio()?)
        .stdout(stdio()?)
        .stderr(stdio()?);
    let child = command.spawn().map_err(spawn_error(program))?;
    // Only the child holds the terminal's other end now: its exit ends our reads.
    drop(slave);
    // Blocking reads and writes of the master run on tokio's blocking pool (tokio::fs::File):
    // registering the descriptor with the reactor would take `unsafe`.
    let file = |fd: &OwnedFd| {
        fd.try_clone()
            .map(|fd| tokio::fs::File::from_std(std::fs::File::from(fd)))
            .map_err(ExecSessionError::Pty)
    };
    Ok(Started {
        child,
        input: Some(Input {
            writer: Box::new(file(&master)?),
            pty: true,
        }),
        outputs: vec![(channel::STDOUT, Box::new(file(&master)?))],
        pty: Some(master),
    })
}

fn open_pty() -> io::Result<(OwnedFd, std::fs::File)> {
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(std::ffi::OsStr::new(&*String::from_utf8_lossy(
            name.as_bytes(),
        )))?;
    Ok((master, slave))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_become_the_kubelets_status() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(exit_status(ExitStatus::from_raw(0))["status"], "Success");
        let failed = exit_status(ExitStatus::from_raw(3 << 8));
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(failed["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(failed["details"]["causes"][0]["message"], "3");
        // Killed by SIGKILL: 128 + 9, as a shell reports it.
        assert_eq!(
            exit_status(ExitStatus::from_raw(9))["details"]["causes"][0]["message"],
            "137"
        );
    }
}
