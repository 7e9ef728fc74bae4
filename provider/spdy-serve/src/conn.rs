//! A SPDY/3.1 server connection: a reader task (frames in, streams accepted, windows announced)
//! and a writer task (the only one touching the socket's write half and the sending zlib
//! context, so header blocks are compressed in the order they are sent).

use std::collections::HashMap;
use std::ops::ControlFlow;
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

impl Flow {
    /// The peer's SETTINGS changed the initial window: every open stream's window moves by the
    /// difference, as SPDY/3 says.
    fn set_initial_window(&mut self, initial: i64) {
        let delta = initial - self.initial;
        self.initial = initial;
        self.active = true;
        for window in self.streams.values_mut() {
            *window += delta;
        }
    }

    /// Credits a WINDOW_UPDATE (stream 0 is the connection); true when a stream's window
    /// overflows (a flow-control error for that stream).
    fn credit(&mut self, stream: u32, delta: u32) -> bool {
        self.active = true;
        let delta = i64::from(delta);
        if stream == 0 {
            self.connection += delta;
            false
        } else {
            self.streams.get_mut(&stream).is_some_and(|window| {
                *window += delta;
                *window > i64::from(i32::MAX)
            })
        }
    }
}

struct Shared {
    out: mpsc::Sender<Out>,
    flow: Mutex<Flow>,
    changed: Notify,
    closed: CancellationToken,
}

impl Shared {
    async fn send(&self, frame: Frame) -> Result<(), SpdyError> {
        self.out
            .send(Out::Frame(frame))
            .await
            .map_err(|_| SpdyError::Closed)
    }
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
        self.shared.send(frame).await
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

/// What the reader keeps between frames: the receiving zlib context and the peer's streams.
struct Reader<'a> {
    accept: &'a mpsc::Sender<Stream>,
    shared: &'a Arc<Shared>,
    inflater: Inflater,
    streams: HashMap<u32, Incoming>,
    last_peer_stream: u32,
    connection_unannounced: u32,
}

async fn read_frames<R: AsyncRead + Unpin>(
    read: &mut R,
    accept: &mpsc::Sender<Stream>,
    shared: &Arc<Shared>,
) -> Result<(), SpdyError> {
    let mut reader = Reader {
        accept,
        shared,
        inflater: Inflater::default(),
        streams: HashMap::new(),
        last_peer_stream: 0,
        connection_unannounced: 0,
    };
    let mut buffer = BytesMut::with_capacity(16 * 1024);
    loop {
        while let Some((frame, used)) = frame::decode_one(&buffer)? {
            buffer.advance(used);
            if reader.on_frame(frame).await?.is_break() {
                return Ok(());
            }
        }
        let read_now = read.read_buf(&mut buffer).await.map_err(SpdyError::Io)?;
        if read_now == 0 {
            return Ok(());
        }
    }
}

impl Reader<'_> {
    /// Handles one frame; `Break` when the peer said GOAWAY.
    async fn on_frame(&mut self, frame: Frame) -> Result<ControlFlow<()>, SpdyError> {
        match frame {
            Frame::SynStream {
                stream,
                flags,
                block,
                ..
            } => self.on_syn_stream(stream, flags, &block).await?,
            Frame::Data { stream, fin, data } => self.on_data(stream, fin, data).await?,
            Frame::SynReply { block, .. } | Frame::Headers { block, .. } => {
                // Keep the receiving context in step; a server needs nothing from these.
                self.inflater.headers(&block)?;
            }
            Frame::RstStream { stream, status } => {
                debug!(stream, status, "the peer reset a stream");
                self.streams.remove(&stream);
                if let Ok(mut flow) = self.shared.flow.lock() {
                    flow.reset.push(stream);
                }
                self.shared.changed.notify_waiters();
            }
            Frame::Settings { entries, .. } => self.on_settings(&entries),
            Frame::Ping { id } => {
                // Client pings are odd; an even id would be the answer to one of ours.
                if id % 2 == 1 {
                    self.shared.send(Frame::Ping { id }).await?;
                }
            }
            Frame::GoAway { .. } => return Ok(ControlFlow::Break(())),
            Frame::WindowUpdate { stream, delta } => self.on_window_update(stream, delta).await?,
            Frame::Unknown { kind } => debug!(kind, "ignoring an unknown control frame"),
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Accepts a stream the peer opened: replies to it and hands it to the server.
    async fn on_syn_stream(
        &mut self,
        stream: u32,
        flags: u8,
        block: &[u8],
    ) -> Result<(), SpdyError> {
        // Inflate first: the context advances with every block, refused or not.
        let headers = self.inflater.headers(block)?;
        if stream % 2 == 0 || stream <= self.last_peer_stream {
            return Err(SpdyError::Protocol(format!(
                "SYN_STREAM {stream} after {} (client ids are odd and rising)",
                self.last_peer_stream
            )));
        }
        self.last_peer_stream = stream;
        let (tx, incoming) = mpsc::channel(STREAM_BUFFER);
        let closed = flags & (frame::FLAG_FIN | frame::FLAG_UNIDIRECTIONAL) != 0;
        self.streams.insert(
            stream,
            Incoming {
                tx: (!closed).then_some(tx),
                unannounced: 0,
            },
        );
        if let Ok(mut flow) = self.shared.flow.lock() {
            let initial = flow.initial;
            flow.streams.insert(stream, initial);
        }
        self.shared
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
                shared: Arc::clone(self.shared),
            },
        };
        if self.accept.send(accepted).await.is_err() {
            self.shared
                .send(Frame::RstStream {
                    stream,
                    status: rst::REFUSED_STREAM,
                })
                .await?;
        }
        Ok(())
    }

    /// Passes data to its stream's handler and announces what was consumed.
    async fn on_data(&mut self, stream: u32, fin: bool, data: Bytes) -> Result<(), SpdyError> {
        let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let Some(entry) = self.streams.get_mut(&stream) else {
            return self
                .shared
                .send(Frame::RstStream {
                    stream,
                    status: rst::INVALID_STREAM,
                })
                .await;
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
                self.shared
                    .send(Frame::WindowUpdate { stream, delta })
                    .await?;
            }
        }
        self.connection_unannounced += length;
        if self.connection_unannounced >= UPDATE_THRESHOLD {
            let delta = std::mem::take(&mut self.connection_unannounced);
            self.shared
                .send(Frame::WindowUpdate { stream: 0, delta })
                .await?;
        }
        Ok(())
    }

    fn on_settings(&self, entries: &[(u8, u32, u32)]) {
        // Only the initial window matters to us; the others are advisory.
        let initial = entries
            .iter()
            .rev()
            .find(|(_, id, _)| *id == settings::INITIAL_WINDOW_SIZE)
            .map(|(_, _, value)| i64::from(*value));
        if let Some(initial) = initial {
            if let Ok(mut flow) = self.shared.flow.lock() {
                flow.set_initial_window(initial);
            }
            self.shared.changed.notify_waiters();
        }
    }

    async fn on_window_update(&self, stream: u32, delta: u32) -> Result<(), SpdyError> {
        let overflow = self
            .shared
            .flow
            .lock()
            .is_ok_and(|mut flow| flow.credit(stream, delta));
        self.shared.changed.notify_waiters();
        if overflow {
            self.shared
                .send(Frame::RstStream {
                    stream,
                    status: rst::FLOW_CONTROL_ERROR,
                })
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod flow_tests {
    use super::*;

    fn flow(streams: &[(u32, i64)]) -> Flow {
        Flow {
            active: false,
            initial: INITIAL_WINDOW,
            connection: INITIAL_WINDOW,
            streams: streams.iter().copied().collect(),
            reset: Vec::new(),
        }
    }

    #[test]
    fn a_new_initial_window_moves_every_open_stream_by_the_difference() {
        let mut flow = flow(&[(1, 10), (3, INITIAL_WINDOW)]);
        flow.set_initial_window(INITIAL_WINDOW + 100);
        assert!(flow.active);
        assert_eq!(flow.initial, INITIAL_WINDOW + 100);
        assert_eq!(flow.streams[&1], 110);
        assert_eq!(flow.streams[&3], INITIAL_WINDOW + 100);
        assert_eq!(
            flow.connection, INITIAL_WINDOW,
            "SETTINGS leave the connection alone"
        );
    }

    #[test]
    fn window_updates_credit_the_connection_or_one_stream() {
        let mut flow = flow(&[(1, 10)]);
        assert!(!flow.credit(0, 5));
        assert_eq!(flow.connection, INITIAL_WINDOW + 5);
        assert!(!flow.credit(1, 5));
        assert_eq!(flow.streams[&1], 15);
        assert!(!flow.credit(7, 5), "an unknown stream is no overflow");
        assert!(flow.active);
    }

    #[test]
    fn a_stream_window_past_i32_max_overflows() {
        let mut flow = flow(&[(1, i64::from(i32::MAX) - 1)]);
        assert!(!flow.credit(1, 1));
        assert!(flow.credit(1, 1));
    }
}
