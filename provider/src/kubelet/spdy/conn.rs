//! A SPDY/3.1 server connection: a reader task (frames in, streams accepted, windows announced)
//! and a writer task (the only one touching the socket's write half and the sending zlib
//! context, so header blocks are compressed in the order they are sent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::SpdyError;
use super::frame::{self, Frame, rst, settings};
use super::headers::{Deflater, Headers, Inflater};

/// SPDY/3's initial window, per stream and for the connection.
pub const INITIAL_WINDOW: i64 = 64 * 1024;
/// The largest DATA frame we send.
const MAX_CHUNK: usize = 32 * 1024;
/// We announce consumed bytes in WINDOW_UPDATEs of at least this much (half a window).
const UPDATE_THRESHOLD: u32 = 32 * 1024;
/// Frames buffered per stream before the reader waits for the handler.
const STREAM_BUFFER: usize = 16;

enum Out {
    Frame(Frame),
    Reply(u32),
    Close(oneshot::Sender<()>),
}

/// Send-side flow control, shared by every writer of the connection.
#[derive(Debug)]
struct Flow {
    /// Enforced once the peer shows it keeps windows (see the module doc).
    active: bool,
    initial: i64,
    connection: i64,
    streams: HashMap<u32, i64>,
    /// Streams the peer reset: writes to them fail.
    reset: Vec<u32>,
}

struct Shared {
    out: mpsc::Sender<Out>,
    flow: Mutex<Flow>,
    changed: Notify,
    closed: CancellationToken,
}

/// One stream the peer opened (we replied to it already).
#[derive(Debug)]
pub struct Stream {
    /// Its id.
    pub id: u32,
    /// Its headers (lowercase names).
    pub headers: Headers,
    /// What the peer sends; ends at the peer's FLAG_FIN, a reset or the connection's end.
    pub incoming: mpsc::Receiver<Bytes>,
    /// Our half.
    pub writer: StreamWriter,
}

impl Stream {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        super::headers::get(&self.headers, name)
    }
}

/// Our half of a stream: data, FLAG_FIN, RST_STREAM.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWriter")
            .field("id", &self.id)
            .finish()
    }
}

impl StreamWriter {
    /// Sends `data`, in frames the peer's windows allow.
    pub async fn write(&self, mut data: Bytes) -> Result<(), SpdyError> {
        while !data.is_empty() {
            let take = self.reserve(data.len()).await?;
            let chunk = data.split_to(take);
            self.send(Frame::Data {
                stream: self.id,
                fin: false,
                data: chunk,
            })
            .await?;
        }
        Ok(())
    }

    /// Closes our half (an empty DATA frame with FLAG_FIN).
    pub async fn close(&self) -> Result<(), SpdyError> {
        self.send(Frame::Data {
            stream: self.id,
            fin: true,
            data: Bytes::new(),
        })
        .await
    }

    /// Resets the stream.
    pub async fn reset(&self, status: u32) -> Result<(), SpdyError> {
        self.send(Frame::RstStream {
            stream: self.id,
            status,
        })
        .await
    }

    async fn send(&self, frame: Frame) -> Result<(), SpdyError> {
        self.shared
            .out
            .send(Out::Frame(frame))
            .await
            .map_err(|_| SpdyError::Closed)
    }

    /// Waits until some of `wanted` bytes may be sent and takes them from the windows.
    async fn reserve(&self, wanted: usize) -> Result<usize, SpdyError> {
        let wanted = wanted.min(MAX_CHUNK);
        loop {
            let changed = self.shared.changed.notified();
            {
                let mut flow = self.shared.flow.lock().map_err(|_| SpdyError::Closed)?;
                if flow.reset.contains(&self.id) || self.shared.closed.is_cancelled() {
                    return Err(SpdyError::Closed);
                }
                if !flow.active {
                    return Ok(wanted);
                }
                let stream = flow.streams.get(&self.id).copied().unwrap_or(0);
                let available = stream.min(flow.connection);
                if available > 0 {
                    let take = wanted.min(usize::try_from(available).unwrap_or(wanted));
                    let taken = i64::try_from(take).unwrap_or(i64::MAX);
                    flow.connection -= taken;
                    if let Some(window) = flow.streams.get_mut(&self.id) {
                        *window -= taken;
                    }
                    return Ok(take);
                }
            }
            tokio::select! {
                () = changed => {}
                () = self.shared.closed.cancelled() => return Err(SpdyError::Closed),
            }
        }
    }
}

/// A served SPDY connection.
pub struct Connection {
    accept: mpsc::Receiver<Stream>,
    shared: Arc<Shared>,
    reader: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.shared.closed.cancel();
    }
}

impl Connection {
    /// Serves SPDY on `io` (an upgraded HTTP connection).
    pub fn serve<T>(io: T) -> Self
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (out, out_rx) = mpsc::channel(64);
        let shared = Arc::new(Shared {
            out,
            flow: Mutex::new(Flow {
                active: false,
                initial: INITIAL_WINDOW,
                connection: INITIAL_WINDOW,
                streams: HashMap::new(),
                reset: Vec::new(),
            }),
            changed: Notify::new(),
            closed: CancellationToken::new(),
        });
        let (accept_tx, accept) = mpsc::channel(16);
        tokio::spawn(write_loop(write, out_rx, Arc::clone(&shared)));
        let reader = tokio::spawn(read_loop(read, accept_tx, Arc::clone(&shared)));
        Self {
            accept,
            shared,
            reader,
        }
    }

    /// The next stream the peer opens; `None` once the connection is gone.
    pub async fn accept(&mut self) -> Option<Stream> {
        self.accept.recv().await
    }

    /// Completes when the peer has gone (its side closed, failed or said GOAWAY).
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await;
    }

    /// A token cancelled when the peer has gone.
    pub fn closed_token(&self) -> CancellationToken {
        self.shared.closed.clone()
    }

    /// Sends what is queued, then GOAWAY, and closes our side.
    pub async fn close(self) {
        let (done, wait) = oneshot::channel();
        if self.shared.out.send(Out::Close(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut write: W,
    mut queue: mpsc::Receiver<Out>,
    shared: Arc<Shared>,
) {
    let mut writer = FrameWriter::default();
    while let Some(out) = queue.recv().await {
        writer.push(out);
        // Write what queued up together: one syscall for a burst of small frames.
        while writer.done.is_none() && writer.buffer.len() < MAX_CHUNK {
            match queue.try_recv() {
                Ok(out) => writer.push(out),
                Err(_) => break,
            }
        }
        if write.write_all(&writer.buffer).await.is_err() || write.flush().await.is_err() {
            shared.closed.cancel();
            shared.changed.notify_waiters();
            return;
        }
        writer.buffer.clear();
        if let Some(ack) = writer.done.take() {
            let _ = write.shutdown().await;
            let _ = ack.send(());
            return;
        }
    }
    let _ = write.shutdown().await;
}

/// Encodes what the writer task is handed; owns the sending zlib context.
#[derive(Default)]
struct FrameWriter {
    deflater: Deflater,
    buffer: BytesMut,
    last_stream: u32,
    done: Option<oneshot::Sender<()>>,
}

impl FrameWriter {
    fn push(&mut self, out: Out) {
        let result = match out {
            Out::Frame(frame) => frame::encode(&frame, &mut self.buffer),
            Out::Reply(stream) => {
                self.last_stream = self.last_stream.max(stream);
                self.deflater.headers(&Headers::new()).and_then(|block| {
                    frame::encode(
                        &Frame::SynReply {
                            stream,
                            fin: false,
                            block: block.into(),
                        },
                        &mut self.buffer,
                    )
                })
            }
            Out::Close(ack) => {
                self.done = Some(ack);
                frame::encode(
                    &Frame::GoAway {
                        last_good: self.last_stream,
                        status: frame::goaway::OK,
                    },
                    &mut self.buffer,
                )
            }
        };
        if let Err(error) = result {
            debug!(%error, "dropping a frame that cannot be encoded");
        }
    }
}

struct Incoming {
    tx: Option<mpsc::Sender<Bytes>>,
    unannounced: u32,
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut read: R,
    accept: mpsc::Sender<Stream>,
    shared: Arc<Shared>,
) {
    let result = read_frames(&mut read, &accept, &shared).await;
    match &result {
        Ok(()) => debug!("SPDY peer closed the connection"),
        Err(error) => {
            debug!(%error, "SPDY connection ended");
            if let SpdyError::Protocol(_)
            | SpdyError::HeaderBlock(_)
            | SpdyError::Version(_)
            | SpdyError::Length { .. } = error
            {
                let status = frame::goaway::PROTOCOL_ERROR;
                let _ = shared
                    .out
                    .send(Out::Frame(Frame::GoAway {
                        last_good: 0,
                        status,
                    }))
                    .await;
            }
        }
    }
    shared.closed.cancel();
    shared.changed.notify_waiters();
}

async fn read_frames<R: AsyncRead + Unpin>(
    read: &mut R,
    accept: &mpsc::Sender<Stream>,
    shared: &Arc<Shared>,
) -> Result<(), SpdyError> {
    let mut inflater = Inflater::default();
    let mut streams: HashMap<u32, Incoming> = HashMap::new();
    let mut last_peer_stream = 0u32;
    let mut connection_unannounced = 0u32;
    let mut buffer = BytesMut::with_capacity(16 * 1024);
    let send = |frame: Frame| async {
        shared
            .out
            .send(Out::Frame(frame))
            .await
            .map_err(|_| SpdyError::Closed)
    };
    loop {
        while let Some((frame, used)) = frame::decode_one(&buffer)? {
            buffer.advance(used);
            match frame {
                Frame::SynStream {
                    stream,
                    flags,
                    block,
                    ..
                } => {
                    // Inflate first: the context advances with every block, refused or not.
                    let headers = inflater.headers(&block)?;
                    if stream % 2 == 0 || stream <= last_peer_stream {
                        return Err(SpdyError::Protocol(format!(
                            "SYN_STREAM {stream} after {last_peer_stream} (client ids are odd and rising)"
                        )));
                    }
                    last_peer_stream = stream;
                    let (tx, incoming) = mpsc::channel(STREAM_BUFFER);
                    let closed = flags & (frame::FLAG_FIN | frame::FLAG_UNIDIRECTIONAL) != 0;
                    streams.insert(
                        stream,
                        Incoming {
                            tx: (!closed).then_some(tx),
                            unannounced: 0,
                        },
                    );
                    if let Ok(mut flow) = shared.flow.lock() {
                        let initial = flow.initial;
                        flow.streams.insert(stream, initial);
                    }
                    shared
                        .out
                        .send(Out::Reply(stream))
                        .await
                        .map_err(|_| SpdyError::Closed)?;
                    let accepted = Stream {
                        id: stream,
                        headers,
                        incoming,
                        writer: StreamWriter {
                            id: stream,
                            shared: Arc::clone(shared),
                        },
                    };
                    if accept.send(accepted).await.is_err() {
                        send(Frame::RstStream {
                            stream,
                            status: rst::REFUSED_STREAM,
                        })
                        .await?;
                    }
                }
                Frame::Data { stream, fin, data } => {
                    let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
                    let Some(entry) = streams.get_mut(&stream) else {
                        send(Frame::RstStream {
                            stream,
                            status: rst::INVALID_STREAM,
                        })
                        .await?;
                        continue;
                    };
                    if let Some(tx) = &entry.tx {
                        if !data.is_empty() && tx.send(data).await.is_err() {
                            // The handler stopped reading this stream: drop what comes.
                            entry.tx = None;
                        }
                    }
                    if fin {
                        entry.tx = None;
                    } else if length > 0 {
                        entry.unannounced += length;
                        if entry.unannounced >= UPDATE_THRESHOLD {
                            let delta = std::mem::take(&mut entry.unannounced);
                            send(Frame::WindowUpdate { stream, delta }).await?;
                        }
                    }
                    connection_unannounced += length;
                    if connection_unannounced >= UPDATE_THRESHOLD {
                        let delta = std::mem::take(&mut connection_unannounced);
                        send(Frame::WindowUpdate { stream: 0, delta }).await?;
                    }
                }
                Frame::SynReply { block, .. } | Frame::Headers { block, .. } => {
                    // Keep the receiving context in step; a server needs nothing from these.
                    inflater.headers(&block)?;
                }
                Frame::RstStream { stream, status } => {
                    debug!(stream, status, "the peer reset a stream");
                    streams.remove(&stream);
                    if let Ok(mut flow) = shared.flow.lock() {
                        flow.reset.push(stream);
                    }
                    shared.changed.notify_waiters();
                }
                Frame::Settings { entries, .. } => {
                    // Only the initial window matters to us; the others are advisory.
                    let initial = entries
                        .iter()
                        .rev()
                        .find(|(_, id, _)| *id == settings::INITIAL_WINDOW_SIZE)
                        .map(|(_, _, value)| i64::from(*value));
                    if let Some(initial) = initial {
                        if let Ok(mut flow) = shared.flow.lock() {
                            let delta = initial - flow.initial;
                            flow.initial = initial;
                            flow.active = true;
                            for window in flow.streams.values_mut() {
                                *window += delta;
                            }
                        }
                        shared.changed.notify_waiters();
                    }
                }
                Frame::Ping { id } => {
                    // Client pings are odd; an even id would be the answer to one of ours.
                    if id % 2 == 1 {
                        send(Frame::Ping { id }).await?;
                    }
                }
                Frame::GoAway { .. } => return Ok(()),
                Frame::WindowUpdate { stream, delta } => {
                    let overflow = shared.flow.lock().is_ok_and(|mut flow| {
                        flow.active = true;
                        let delta = i64::from(delta);
                        if stream == 0 {
                            flow.connection += delta;
                            false
                        } else {
                            flow.streams.get_mut(&stream).is_some_and(|window| {
                                *window += delta;
                                *window > i64::from(i32::MAX)
                            })
                        }
                    });
                    shared.changed.notify_waiters();
                    if overflow {
                        send(Frame::RstStream {
                            stream,
                            status: rst::FLOW_CONTROL_ERROR,
                        })
                        .await?;
                    }
                }
                Frame::Unknown { kind } => debug!(kind, "ignoring an unknown control frame"),
            }
        }
        let read_now = read.read_buf(&mut buffer).await.map_err(SpdyError::Io)?;
        if read_now == 0 {
            return Ok(());
        }
    }
}
