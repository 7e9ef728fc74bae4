//! A SPDY/3.1 client driven frame by frame with the codec, as spdystream drives one: for tests
//! of a served connection, here and in the crates that serve streams over it. It panics on
//! anything unexpected (a test's failure), so it is built only for tests (`test-client`).

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

use crate::frame::{Frame, decode_one, encode};
use crate::headers::{Deflater, Headers, Inflater};

/// A client driven by hand with the codec: what spdystream does, frame by frame.
#[derive(Debug)]
pub struct Client<T = DuplexStream> {
    io: T,
    deflater: Deflater,
    /// Inflates the header blocks of the frames [`Client::next`] returns.
    pub inflater: Inflater,
    buffer: BytesMut,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Client<T> {
    /// A client speaking over `io`.
    pub fn new(io: T) -> Self {
        Self {
            io,
            deflater: Deflater::default(),
            inflater: Inflater::default(),
            buffer: BytesMut::new(),
        }
    }

    /// Sends `frame`.
    pub async fn send(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        encode(&frame, &mut out).expect("encode");
        self.io.write_all(&out).await.expect("write");
    }

    /// Opens `stream` with `headers` (`fin`: and half-closes it).
    pub async fn open(&mut self, stream: u32, headers: &[(&str, &str)], fin: bool) {
        let headers: Headers = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let block = self.deflater.headers(&headers).expect("deflate");
        self.send(Frame::SynStream {
            stream,
            associated: 0,
            priority: 0,
            flags: u8::from(fin),
            block: block.into(),
        })
        .await;
    }

    /// The next frame the server sends (`None` once it closed the connection).
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some((frame, used)) = decode_one(&self.buffer).expect("valid frame") {
                let _ = self.buffer.split_to(used);
                return Some(frame);
            }
            let read =
                tokio::time::timeout(Duration::from_secs(5), self.io.read_buf(&mut self.buffer))
                    .await
                    .expect("a frame within 5 s")
                    .expect("read");
            if read == 0 {
                return None;
            }
        }
    }
}
