//! The WebSocket forms of exec, attach and port-forward, for clients that call the kubelet
//! directly (the apiserver itself speaks SPDY to kubelets).
//!
//! Every message starts with its channel: one byte in the binary protocols
//! (`v5.channel.k8s.io`, `v4.channel.k8s.io`, `channel.k8s.io`), an ASCII digit followed by
//! base64 in the `base64.channel.k8s.io` variants. exec: 0 stdin, 1 stdout, 2 stderr, 3 the
//! status, 4 terminal size; in v5 the client closes stdin with `[255, 0]`. Port-forward
//! (`?ports=a,b`): data on channel 2i and errors on 2i+1 for the i-th port, each channel opened
//! by the port as two little-endian bytes.

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts as _, Request};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug};

use super::super::KubeletState;
use super::super::pod_lookup::Target;
use super::exec::{self, ClientStreams, Command, Sink, StatusFormat};
use super::portforward::{self, PodAddress};
use super::{ExecOptions, forwarded_ports};

/// exec and attach over WebSocket, newest first.
pub(super) const EXEC_PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];
/// Port-forward over WebSocket.
pub(super) const PORT_FORWARD_PROTOCOLS: [&str; 5] = [
    "portforward.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// How a protocol frames its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Framing {
    /// base64 text messages instead of binary.
    pub(super) base64: bool,
    /// v5: `[255, channel]` closes a channel.
    pub(super) close_signal: bool,
}

impl Framing {
    /// The framing of `protocol` (none negotiated: binary channels).
    pub(super) fn of(protocol: &str) -> Self {
        Self {
            base64: protocol.contains("base64"),
            close_signal: protocol.starts_with("v5."),
        }
    }

    /// One message for `channel`.
    pub(super) fn encode(self, channel: u8, data: &[u8]) -> Message {
        if self.base64 {
            Message::Text(
                format!("{}{}", char::from(b'0' + channel % 10), BASE64.encode(data)).into(),
            )
        } else {
            let mut out = Vec::with_capacity(data.len() + 1);
            out.push(channel);
            out.extend_from_slice(data);
            Message::Binary(out.into())
        }
    }

    /// The channel and payload of a message; `None` for control and malformed messages.
    pub(super) fn decode(self, message: &Message) -> Option<(u8, Bytes)> {
        match message {
            Message::Binary(data) if !self.base64 => {
                let (&channel, payload) = data.split_first()?;
                Some((channel, Bytes::copy_from_slice(payload)))
            }
            Message::Text(text) if self.base64 => {
                let text = text.as_str();
                let channel = text.as_bytes().first()?.checked_sub(b'0')?;
                let payload = BASE64.decode(text.get(1..)?).ok()?;
                Some((channel, Bytes::from(payload)))
            }
            _ => None,
        }
    }
}

async fn upgrade(
    request: Request,
    state: &KubeletState,
    protocols: [&'static str; 5],
) -> Result<(WebSocketUpgrade, Framing), Response> {
    let (mut parts, _body) = request.into_parts();
    let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, state)
        .await
        .map_err(IntoResponse::into_response)?
        .protocols(protocols);
    let framing = Framing::of(
        upgrade
            .selected_protocol()
            .and_then(|p| p.to_str().ok())
            .unwrap_or_default(),
    );
    Ok((upgrade, framing))
}

/// Spawns the writer of `sink`: channel-tagged payloads out, then a close.
fn writer(
    mut sink: futures::stream::SplitSink<WebSocket, Message>,
    framing: Framing,
) -> (mpsc::Sender<(u8, Bytes)>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<(u8, Bytes)>(32);
    let task = tokio::spawn(async move {
        while let Some((channel, data)) = rx.recv().await {
            if sink.send(framing.encode(channel, &data)).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    (tx, task)
}

/// exec or attach over WebSocket.
pub(super) async fn serve_exec(
    state: KubeletState,
    target: Target,
    options: ExecOptions,
    command: Command,
    request: Request,
) -> Response {
    let (upgrade, framing) = match upgrade(request, &state, EXEC_PROTOCOLS).await {
        Ok(upgraded) => upgraded,
        Err(response) => return response,
    };
    let format = if upgrade
        .selected_protocol()
        .is_some_and(|p| p.as_bytes().starts_with(b"v4.") || p.as_bytes().starts_with(b"v5."))
    {
        StatusFormat::Json
    } else {
        StatusFormat::Text
    };
    let span = tracing::Span::current();
    upgrade.on_upgrade(move |socket| {
        async move {
            let (sink, mut source) = socket.split();
            let (tx, write_task) = writer(sink, framing);
            let gone = CancellationToken::new();
            let (stdin_tx, stdin) = mpsc::channel::<Bytes>(16);
            let (resize_tx, resize) = mpsc::channel::<Bytes>(4);
            let reader = {
                let gone = gone.clone();
                tokio::spawn(async move {
                    let mut stdin_tx = Some(stdin_tx);
                    while let Some(Ok(message)) = source.next().await {
                        if let Message::Close(_) = message {
                            break;
                        }
                        match framing.decode(&message) {
                            Some((0, data)) => {
                                if let Some(tx) = &stdin_tx {
                                    let _ = tx.send(data).await;
                                }
                            }
                            Some((4, data)) => {
                                let _ = resize_tx.send(data).await;
                            }
                            Some((255, data))
                                if framing.close_signal && data.first() == Some(&0) =>
                            {
                                stdin_tx = None;
                            }
                            _ => {}
                        }
                    }
                    gone.cancel();
                })
            };
            let sink = |channel: u8| Sink::WebSocket {
                channel,
                tx: tx.clone(),
            };
            let streams = ClientStreams {
                stdin: options.stdin.then_some(stdin),
                resize: options.tty.then_some(resize),
                stdout: options.stdout.then(|| sink(1)),
                stderr: options.stderr.then(|| sink(2)),
                error: Some(sink(3)),
                format,
                gone,
            };
            exec::run(&state, &target, &options, &command, streams).await;
            drop(tx);
            let _ = write_task.await;
            reader.abort();
        }
        .instrument(span)
    })
}

/// Port-forward over WebSocket: one connection per port in `?ports=`.
pub(super) async fn serve_port_forward(
    state: KubeletState,
    address: PodAddress,
    request: Request,
) -> Response {
    let ports = match forwarded_ports(request.uri().query()) {
        Ok(ports) => ports,
        Err(error) => return error.into_response(),
    };
    let (upgrade, framing) = match upgrade(request, &state, PORT_FORWARD_PROTOCOLS).await {
        Ok(upgraded) => upgraded,
        Err(response) => return response,
    };
    let span = tracing::Span::current();
    upgrade.on_upgrade(move |socket| {
        async move {
            let (sink, mut source) = socket.split();
            let (tx, write_task) = writer(sink, framing);
            let mut inputs = Vec::new();
            let mut forwards = tokio::task::JoinSet::new();
            for (index, port) in ports.iter().copied().enumerate() {
                let data_channel = u8::try_from(index * 2).unwrap_or(u8::MAX);
                let error_channel = data_channel.saturating_add(1);
                for channel in [data_channel, error_channel] {
                    let _ = tx
                        .send((channel, Bytes::copy_from_slice(&port.to_le_bytes())))
                        .await;
                }
                let (input_tx, input) = mpsc::channel::<Bytes>(16);
                inputs.push(input_tx);
                let tx = tx.clone();
                let address = address.clone();
                forwards.spawn(async move {
                    let data_tx = tx.clone();
                    let result = portforward::forward(address.ip, port, input, |chunk| {
                        let data_tx = data_tx.clone();
                        async move { data_tx.send((data_channel, chunk)).await.is_ok() }
                    })
                    .await;
                    if let Err(cause) = result {
                        let message = format!(
                            "error forwarding port {port} to pod {}, uid {}: {cause}",
                            address.pod, address.uid
                        );
                        let _ = tx.send((error_channel, Bytes::from(message))).await;
                    }
                });
            }
            drop(tx);
            let reading = async {
                while let Some(Ok(message)) = source.next().await {
                    if let Message::Close(_) = message {
                        break;
                    }
                    if let Some((channel, data)) = framing.decode(&message) {
                        // Data channels are even; what a client sends on an error channel is ignored.
                        let input = inputs
                            .get(usize::from(channel / 2))
                            .filter(|_| channel % 2 == 0);
                        if let Some(input) = input {
                            let _ = input.send(data).await;
                        }
                    }
                }
            };
            reading.await;
            debug!("the port-forward client left");
            drop(inputs);
            forwards.shutdown().await;
            write_task.abort();
        }
        .instrument(span)
    })
}
