//! The server side of SPDY/3.1, as the apiserver and kubectl speak it to kubelets for exec,
//! attach and port-forward (`Upgrade: SPDY/3.1`). No maintained Rust crate serves SPDY (the
//! protocol was retired by HTTP/2; Kubernetes still uses it between the apiserver and kubelets),
//! so this crate implements the part a kubelet needs. It knows nothing of Kubernetes or of the
//! daemon: the kubelet API (`virtual-node-eci`'s `kubelet::streams`) gives the streams meaning.
//!
//!
//! - [`frame`]: the pure frame codec (DATA, SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING,
//!   GOAWAY, HEADERS, WINDOW_UPDATE), never panicking on any input; [`decode`] is the entry a
//!   fuzz target calls.
//! - [`headers`]: header blocks, zlib-compressed with the SPDY/3 dictionary ([`dictionary`]),
//!   one compression context per direction for the whole connection, as the spec requires.
//! - [`conn`]: a connection task that replies to each stream the peer opens and hands it to the
//!   handler with its headers (the kubelet's streams say what they are in `streamtype`), carries
//!   DATA both ways with half-close (FLAG_FIN), RST_STREAM, PING and GOAWAY, and flow control
//!   (64 KiB initial windows, WINDOW_UPDATE as the handler consumes).
//!
//! One interop fact shapes the flow control: spdystream, the Go library behind client-go and the
//! apiserver, implements none (it never sends WINDOW_UPDATE and ignores ours; TCP is its only
//! backpressure). So our send windows are enforced only once the peer shows it keeps them (its
//! first WINDOW_UPDATE or an INITIAL_WINDOW_SIZE setting); before that, a slow peer slows us
//! through TCP. We always announce what we consumed, and back-pressure a peer that overruns our
//! window by reading no further rather than resetting it.

pub mod conn;
mod dictionary;
pub mod frame;
pub mod headers;

#[cfg(any(test, feature = "test-client"))]
pub mod test_client;
#[cfg(test)]
mod tests;

pub use conn::{Connection, Stream, StreamWriter};
pub use frame::Frame;
pub use headers::Headers;

/// A SPDY frame, header block or connection failed.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    /// A control frame names a version other than 3.
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    /// A control frame's length does not fit its type.
    #[error("{kind} frame with a payload of {length} bytes")]
    Length {
        /// The frame type.
        kind: &'static str,
        /// Its payload length.
        length: usize,
    },
    /// A payload is longer than a frame can carry.
    #[error("a frame payload of {0} bytes exceeds SPDY's 16 MiB")]
    TooLarge(usize),
    /// A header block cannot be read or written.
    #[error("header block: {0}")]
    HeaderBlock(&'static str),
    /// The peer broke the protocol (stream ids, frames on unknown streams).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The connection's transport failed.
    #[error("SPDY connection I/O")]
    Io(#[source] std::io::Error),
    /// The stream or connection is closed or was reset.
    #[error("the SPDY stream is closed")]
    Closed,
}

/// Decodes every frame of `input` in order, inflating header blocks with one fresh receiving
/// context as a connection would: the fuzz entry point. Bytes after the last whole frame are
/// an error, and so is any malformed frame or header block; no input panics.
pub fn decode(input: &[u8]) -> Result<Vec<(Frame, Option<Headers>)>, SpdyError> {
    let mut inflater = headers::Inflater::default();
    let mut frames = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let Some((frame, used)) = frame::decode_one(rest)? else {
            return Err(SpdyError::Protocol(format!(
                "{} bytes do not make a whole frame",
                rest.len()
            )));
        };
        rest = &rest[used..];
        let headers = match &frame {
            Frame::SynStream { block, .. }
            | Frame::SynReply { block, .. }
            | Frame::Headers { block, .. } => Some(inflater.headers(block)?),
            _ => None,
        };
        frames.push((frame, headers));
    }
    Ok(frames)
}
