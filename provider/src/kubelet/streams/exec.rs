//! exec and attach: the client's streams (SPDY or WebSocket) bridged to ECI.
//!
//! **ECI.** `ExecContainerCommand` (the command as a JSON list, `TTY`, `Stdin`) answers a
//! `WebSocketUri`; we connect to it and speak the Kubernetes channel protocol
//! (`v5.channel.k8s.io`, else `v4.channel.k8s.io`; see mock-eci's `exec_session` for why): the
//! client's stdin and terminal sizes go up, stdout, stderr and the final `Status` come down.
//! `Sync=true` is not used, though it saves the WebSocket for a one-shot command: its
//! `SyncResponse` is stdout and stderr run together with no exit code, and nothing arrives
//! before the command ends, so `kubectl exec … -- sh -c 'exit 3'` could not exit 3.
//!
//! **The client.** The `error` stream gets one `metav1.Status` (v4 and v5): Success, or the
//! Failure ECI reported (reason `NonZeroExitCode`, cause `ExitCode` with the code), which is
//! how kubectl learns the exit code; v1–v3 get the failure's message as text. A stream that
//! ends without a status is reported as Success (ECI's stream may carry none; logged).
//!
//! **Attach.** ECI has no way to reach a running container's own stdin or terminal: its one
//! interactive call, `ExecContainerCommand`, starts a new process, and the container's
//! `Stdin`/`Tty` settings at creation are reachable by no later call. attach is served by
//! following the container's output (`DescribeContainerLog`, polled from the last line seen)
//! onto stdout until the container ends or the client leaves. `attach -i` (and so `-it`: kubectl
//! uses a terminal only with stdin) is refused before any ECI call with a `BadRequest` Status
//! that says so and points to `exec -i`, rather than taking input that would reach nothing.

use std::time::Duration;

use bytes::Bytes;
use eci_proto::v20180808::{DescribeContainerLogRequest, ExecContainerCommandRequest};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::super::KubeletState;
use super::super::pod_lookup::Target;
use super::super::spdy::{Connection, Stream, StreamWriter};
use super::ExecOptions;
use crate::config::AddressKind;

/// How long the client has to open its streams after the upgrade (the kubelet's default).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// The protocols we ask ECI's WebSocket for, newest first.
const ECI_PROTOCOLS: &str = "v5.channel.k8s.io, v4.channel.k8s.io";

/// The WebSocket ECI's exec session runs on.
type EciSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Command {
    /// exec: a command, arguments exactly as given.
    Exec(Vec<String>),
    /// attach: the container's own output.
    Attach,
}

/// The exec bridge failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExecError {
    /// ECI refused or failed the call.
    #[error("ECI ExecContainerCommand")]
    Eci(#[source] eci_proto::EciError),
    /// ECI handed out a stream the transport policy refuses (`ws://` without the flag).
    #[error("refusing ECI's exec stream")]
    Insecure(#[source] crate::config::TransportError),
    /// ECI's WebSocket could not be reached.
    #[error("cannot connect to ECI's exec stream")]
    Connect(#[source] tokio_tungstenite::tungstenite::Error),
    /// ECI's log could not be read (attach).
    #[error("ECI DescribeContainerLog")]
    Log(#[source] eci_proto::EciError),
    /// ECI cannot give a running container's stdin (attach -i, -it).
    #[error(
        "attach -i is not available on ECI: no ECI call reaches a running container's own stdin or terminal (attach without -i follows the container's output; kubectl exec -i runs a new process that reads stdin)"
    )]
    AttachStdin,
}

/// One output stream of the client.
#[derive(Debug, Clone)]
pub(super) enum Sink {
    /// A SPDY stream.
    Spdy(StreamWriter),
    /// A channel of a WebSocket (its writer task takes channel-prefixed payloads).
    WebSocket {
        /// The channel byte.
        channel: u8,
        /// The connection's writer.
        tx: mpsc::Sender<(u8, Bytes)>,
    },
}

impl Sink {
    /// Writes `data`; false once the client cannot take more.
    pub(super) async fn write(&self, data: Bytes) -> bool {
        match self {
            Self::Spdy(writer) => writer.write(data).await.is_ok(),
            Self::WebSocket { channel, tx } => tx.send((*channel, data)).await.is_ok(),
        }
    }

    /// Ends the stream (SPDY: FLAG_FIN; a WebSocket channel just stops).
    pub(super) async fn close(&self) {
        if let Self::Spdy(writer) = self {
            let _ = writer.close().await;
        }
    }
}

/// How the `error` stream words the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StatusFormat {
    /// v4 and v5: a `metav1.Status` as JSON.
    Json,
    /// channel.k8s.io to v3: a failure's message as text, nothing on success.
    Text,
}

/// The client's side of a session.
#[derive(Debug)]
pub(super) struct ClientStreams {
    /// The client's stdin; ends when it closes stdin.
    pub(super) stdin: Option<mpsc::Receiver<Bytes>>,
    /// Terminal sizes as a stream of JSON objects.
    pub(super) resize: Option<mpsc::Receiver<Bytes>>,
    /// stdout.
    pub(super) stdout: Option<Sink>,
    /// stderr.
    pub(super) stderr: Option<Sink>,
    /// The outcome.
    pub(super) error: Option<Sink>,
    /// How the outcome is worded.
    pub(super) format: StatusFormat,
    /// Cancelled when the client has gone.
    pub(super) gone: CancellationToken,
}

/// The status format of a negotiated protocol.
pub(super) fn status_format(protocol: &str) -> StatusFormat {
    if protocol.starts_with("v4.") || protocol.starts_with("v5.") {
        StatusFormat::Json
    } else {
        StatusFormat::Text
    }
}

/// SPDY: waits for the streams the options call for, runs the session, closes the connection.
pub(super) async fn serve_spdy(
    state: KubeletState,
    target: Target,
    options: ExecOptions,
    command: Command,
    protocol: &'static str,
    mut connection: Connection,
) {
    let resize_supported = !matches!(protocol, "v2.channel.k8s.io" | "channel.k8s.io");
    let mut wanted = Wanted {
        error: true,
        stdin: options.stdin,
        stdout: options.stdout,
        stderr: options.stderr,
        resize: options.tty && resize_supported,
    };
    let mut streams = ClientStreams {
        stdin: None,
        resize: None,
        stdout: None,
        stderr: None,
        error: None,
        format: status_format(protocol),
        gone: connection.closed_token(),
    };
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while wanted.any() {
        let stream = tokio::select! {
            stream = connection.accept() => stream,
            () = &mut deadline => {
                warn!("the client did not open its streams within 30 s");
                connection.close().await;
                return;
            }
        };
        let Some(stream) = stream else {
            debug!("the client left before opening its streams");
            return;
        };
        accept_stream(stream, &mut wanted, &mut streams).await;
    }
    run(&state, &target, &options, &command, streams).await;
    connection.close().await;
}

struct Wanted {
    error: bool,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    resize: bool,
}

impl Wanted {
    fn any(&self) -> bool {
        self.error || self.stdin || self.stdout || self.stderr || self.resize
    }
}

async fn accept_stream(stream: Stream, wanted: &mut Wanted, streams: &mut ClientStreams) {
    let kind = stream.header("streamtype").unwrap_or_default().to_owned();
    let Stream {
        incoming, writer, ..
    } = stream;
    match kind.as_str() {
        "error" if wanted.error => {
            wanted.error = false;
            streams.error = Some(Sink::Spdy(writer));
        }
        "stdin" if wanted.stdin => {
            wanted.stdin = false;
            streams.stdin = Some(incoming);
        }
        "stdout" if wanted.stdout => {
            wanted.stdout = false;
            streams.stdout = Some(Sink::Spdy(writer));
        }
        "stderr" if wanted.stderr => {
            wanted.stderr = false;
            streams.stderr = Some(Sink::Spdy(writer));
        }
        "resize" if wanted.resize => {
            wanted.resize = false;
            streams.resize = Some(incoming);
        }
        other => {
            debug!(stream_type = other, "refusing an unexpected stream");
            let _ = writer
                .reset(super::super::spdy::frame::rst::REFUSED_STREAM)
                .await;
        }
    }
}

/// Runs the session against ECI and reports the outcome on the error stream.
pub(super) async fn run(
    state: &KubeletState,
    target: &Target,
    options: &ExecOptions,
    command: &Command,
    mut streams: ClientStreams,
) {
    let started = std::time::Instant::now();
    let outcome = match command {
        Command::Exec(command) => exec(state, target, options, command, &mut streams).await,
        Command::Attach => attach(state, target, options, &mut streams).await,
    };
    let status = match outcome {
        Ok(status) => status,
        Err(error) => {
            let status = failure_status(&error);
            if matches!(error, ExecError::AttachStdin) {
                info!(error = %crate::ops::chain::Chain(&error), "attach refused");
            } else {
                warn!(error = %crate::ops::chain::Chain(&error), "exec failed");
            }
            status
        }
    };
    for sink in [&streams.stdout, &streams.stderr].into_iter().flatten() {
        sink.close().await;
    }
    let failed = status.get("status").and_then(Value::as_str) != Some("Success");
    let reason = status
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    info!(failed, reason, elapsed_ms, "exec session ended");
    if let Some(error) = &streams.error {
        let body = match streams.format {
            StatusFormat::Json => Some(status.to_string()),
            StatusFormat::Text if failed => Some(
                status
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("command failed")
                    .to_owned(),
            ),
            StatusFormat::Text => None,
        };
        if let Some(body) = body {
            error.write(Bytes::from(body)).await;
        }
        error.close().await;
    }
}

/// The Status a failed session ends with: what the client asked and ECI cannot serve is the
/// client's `BadRequest` (400), as a kubelet answers an attach it cannot make; the rest is the
/// server's `InternalError` (500). kubectl prints the message and exits 1 either way.
pub(super) fn failure_status(error: &ExecError) -> Value {
    let (reason, code) = match error {
        ExecError::AttachStdin => ("BadRequest", 400),
        _ => ("InternalError", 500),
    };
    json!({
        "metadata": {}, "status": "Failure", "reason": reason,
        "message": crate::ops::chain::Chain(error).to_string(), "code": code,
    })
}

fn success() -> Value {
    json!({"metadata": {}, "status": "Success"})
}

async fn exec(
    state: &KubeletState,
    target: &Target,
    options: &ExecOptions,
    command: &[String],
    streams: &mut ClientStreams,
) -> Result<Value, ExecError> {
    let (socket, v5) = open_eci_session(state, target, options, command).await?;
    let (mut up, mut down) = socket.split();
    let (up_tx, mut up_rx) = mpsc::channel::<Message>(16);
    let writer = tokio::spawn(async move {
        while let Some(message) = up_rx.recv().await {
            if up.send(message).await.is_err() {
                return;
            }
        }
        let _ = up.close().await;
    });
    let mut forwarders = Vec::new();
    if let Some(stdin) = streams.stdin.take() {
        forwarders.push(tokio::spawn(forward_stdin(stdin, up_tx.clone(), v5)));
    }
    if let Some(resize) = streams.resize.take() {
        forwarders.push(tokio::spawn(forward_resize(resize, up_tx.clone())));
    }
    let status = relay_output(state, &mut down, streams).await;
    for forwarder in forwarders {
        forwarder.abort();
    }
    drop(up_tx);
    let _ = writer.await;
    Ok(final_status(status))
}

/// Asks ECI to start the command and connects to the WebSocket it answers; true when the
/// session speaks `v5.channel.k8s.io`.
async fn open_eci_session(
    state: &KubeletState,
    target: &Target,
    options: &ExecOptions,
    command: &[String],
) -> Result<(EciSocket, bool), ExecError> {
    let request = ExecContainerCommandRequest {
        region_id: state.config.site.region.clone(),
        container_group_id: target.group_id.clone(),
        container_name: target.container.clone(),
        command: command.to_vec(),
        tty: options.tty,
        stdin: Some(options.stdin),
        sync: false,
    };
    let answer = target
        .lane()
        .run(state.eci.exec_container_command(request))
        .await
        .map_err(ExecError::Eci)?;
    // The stream carries what the user types and what the command prints: TLS unless the
    // operator allowed plaintext.
    state
        .config
        .site
        .stream_transport()
        .check(&answer.web_socket_uri, AddressKind::Stream)
        .map_err(ExecError::Insecure)?;
    let mut request = answer
        .web_socket_uri
        .as_str()
        .into_client_request()
        .map_err(ExecError::Connect)?;
    request.headers_mut().insert(
        "sec-websocket-protocol",
        axum::http::HeaderValue::from_static(ECI_PROTOCOLS),
    );
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(ExecError::Connect)?;
    let v5 = response
        .headers()
        .get("sec-websocket-protocol")
        .is_some_and(|p| p.as_bytes() == b"v5.channel.k8s.io");
    Ok((socket, v5))
}

/// The client's stdin up to ECI (channel 0), then its end when the protocol can say it.
async fn forward_stdin(mut stdin: mpsc::Receiver<Bytes>, up: mpsc::Sender<Message>, v5: bool) {
    while let Some(data) = stdin.recv().await {
        if up.send(Message::Binary(prefixed(0, &data))).await.is_err() {
            return;
        }
    }
    // v5 closes stdin and keeps the session (`tar -xf -` of kubectl cp ends on it); v4
    // cannot say it, so a command reading to its input's end waits for the client.
    if v5 {
        let _ = up
            .send(Message::Binary(Bytes::from_static(&[255, 0])))
            .await;
    } else {
        warn!("the client closed stdin; ECI's exec stream (v4.channel.k8s.io) cannot pass that on");
    }
}

/// The client's terminal sizes up to ECI (channel 4), one JSON value per message.
async fn forward_resize(mut resize: mpsc::Receiver<Bytes>, up: mpsc::Sender<Message>) {
    let mut pending = Vec::new();
    while let Some(data) = resize.recv().await {
        pending.extend_from_slice(&data);
        for size in complete_json_values(&mut pending) {
            if up.send(Message::Binary(prefixed(4, &size))).await.is_err() {
                return;
            }
        }
    }
}

/// ECI's stdout and stderr down to the client until the session, the client or the daemon
/// ends; the Status ECI sent on channel 3, if any.
async fn relay_output<S>(
    state: &KubeletState,
    down: &mut S,
    streams: &ClientStreams,
) -> Option<Value>
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let mut status = None;
    loop {
        let message = tokio::select! {
            message = down.next() => message,
            () = streams.gone.cancelled() => {
                debug!("the client left; ending the ECI session");
                break;
            }
            () = state.stop.cancelled() => break,
        };
        let data = match message {
            Some(Ok(Message::Binary(data))) => data,
            Some(Ok(Message::Text(text))) => Bytes::from(text.as_str().to_owned()),
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => continue,
            Some(Err(error)) => {
                debug!(%error, "ECI's exec stream failed");
                break;
            }
        };
        let Some((&channel, payload)) = data.split_first() else {
            continue;
        };
        let payload = data.slice_ref(payload);
        let sink = match channel {
            1 => streams.stdout.as_ref(),
            2 => streams.stderr.as_ref(),
            3 => {
                status = serde_json::from_slice::<Value>(&payload).ok();
                continue;
            }
            _ => None,
        };
        if let Some(sink) = sink {
            if !payload.is_empty() && !sink.write(payload).await {
                break;
            }
        }
    }
    status
}

/// What the client's error stream gets: ECI's Status, or Success when it sent a Success or none.
fn final_status(status: Option<Value>) -> Value {
    match status {
        Some(status) if status.get("status").and_then(Value::as_str) == Some("Success") => {
            success()
        }
        Some(status) => status,
        None => {
            debug!("ECI's exec stream ended without a status");
            success()
        }
    }
}

fn prefixed(channel: u8, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    Bytes::from(out)
}

/// The most bytes of one unfinished resize message kept while waiting for its end: a real one
/// (`{"Width":…,"Height":…}`) is ~30 bytes; a client that never finishes one must not grow
/// the buffer (and the re-parse of it on every frame) without bound.
pub(super) const MAX_PENDING_RESIZE: usize = 4096;

/// Takes the complete JSON values off the front of `pending` (the resize stream is a stream of
/// JSON objects, which frames may split or join); invalid bytes, and an unfinished value longer
/// than [`MAX_PENDING_RESIZE`], are dropped. Public for the fuzz target `kubelet_request`.
pub fn complete_json_values(pending: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut values = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(pending).into_iter::<Value>();
    let mut consumed = 0;
    loop {
        match stream.next() {
            Some(Ok(value)) => {
                consumed = stream.byte_offset();
                values.push(value.to_string().into_bytes());
            }
            Some(Err(error)) if error.is_eof() => break,
            // Garbage (or nothing left): drop it all.
            Some(Err(_)) | None => {
                consumed = pending.len();
                break;
            }
        }
    }
    pending.drain(..consumed);
    if pending.len() > MAX_PENDING_RESIZE {
        debug!(
            bytes = pending.len(),
            "dropping an unfinished resize message longer than any real one"
        );
        pending.clear();
    }
    values
}

async fn attach(
    state: &KubeletState,
    target: &Target,
    options: &ExecOptions,
    streams: &mut ClientStreams,
) -> Result<Value, ExecError> {
    if options.stdin {
        return Err(ExecError::AttachStdin);
    }
    // Output from now on: what the container writes after the client attached.
    let mut since = jiff::Timestamp::now();
    let mut seen_at_since: Vec<String> = Vec::new();
    let mut polls = 0u64;
    loop {
        let request = DescribeContainerLogRequest {
            region_id: state.config.site.region.clone(),
            container_group_id: target.group_id.clone(),
            container_name: target.container.clone(),
            start_time: since.to_string(),
            timestamps: true,
            ..DescribeContainerLogRequest::default()
        };
        let answer = target
            .lane()
            .run(state.eci.describe_container_log(request))
            .await
            .map_err(ExecError::Log)?;
        let mut lines = Vec::new();
        for line in answer.content.lines() {
            let Some((stamp, text)) = line.split_once(' ') else {
                continue;
            };
            let Ok(at) = stamp.parse::<jiff::Timestamp>() else {
                continue;
            };
            if at < since || (at == since && seen_at_since.iter().any(|seen| seen == line)) {
                continue;
            }
            if at > since {
                since = at;
                seen_at_since.clear();
            }
            seen_at_since.push(line.to_owned());
            lines.push(format!("{text}\n"));
        }
        if !lines.is_empty() {
            if let Some(stdout) = &streams.stdout {
                if !stdout.write(Bytes::from(lines.concat())).await {
                    return Ok(success());
                }
            }
        }
        polls += 1;
        // The container's end ends the attach (checked every few polls: one pod read each).
        if polls % 4 == 0 && !still_running(state, target).await {
            return Ok(success());
        }
        tokio::select! {
            () = tokio::time::sleep(state.config.args.kubelet_log_poll_interval) => {}
            () = streams.gone.cancelled() => return Ok(success()),
            () = state.stop.cancelled() => return Ok(success()),
        }
    }
}

/// Whether the attached container still runs (the pod, this pod, still on this node).
async fn still_running(state: &KubeletState, target: &Target) -> bool {
    match state.pod_on_this_node(&target.namespace, &target.pod).await {
        Ok(Some(pod)) => {
            pod.metadata.uid.as_deref() == Some(target.uid.as_str())
                && super::super::pod_lookup::container_status(&pod, &target.container)
                    .and_then(|status| status.state.as_ref())
                    .is_none_or(|state| state.terminated.is_none())
        }
        Ok(None) => false,
        // The API could not say: keep attached rather than cut a live session.
        Err(_) => true,
    }
}
