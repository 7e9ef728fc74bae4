//! SPDY/3.1 frames: the pure codec. Header blocks stay compressed here; `headers` turns them into
//! name/value lists with the connection's zlib context.

use bytes::{BufMut, Bytes, BytesMut};

use super::SpdyError;

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;
/// FLAG_FIN: the sender's half of the stream is closed after this frame.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL (SYN_STREAM): the receiver never sends on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// The largest payload a frame's 24-bit length can name.
pub const MAX_LENGTH: usize = (1 << 24) - 1;
/// Every frame starts with eight bytes.
pub const HEADER_LEN: usize = 8;

/// Control frame types.
mod kind {
    pub(super) const SYN_STREAM: u16 = 1;
    pub(super) const SYN_REPLY: u16 = 2;
    pub(super) const RST_STREAM: u16 = 3;
    pub(super) const SETTINGS: u16 = 4;
    pub(super) const PING: u16 = 6;
    pub(super) const GOAWAY: u16 = 7;
    pub(super) const HEADERS: u16 = 8;
    pub(super) const WINDOW_UPDATE: u16 = 9;
}

/// RST_STREAM status codes (section 2.4.2).
pub mod rst {
    /// PROTOCOL_ERROR.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// INVALID_STREAM.
    pub const INVALID_STREAM: u32 = 2;
    /// REFUSED_STREAM.
    pub const REFUSED_STREAM: u32 = 3;
    /// CANCEL.
    pub const CANCEL: u32 = 5;
    /// INTERNAL_ERROR.
    pub const INTERNAL_ERROR: u32 = 6;
    /// FLOW_CONTROL_ERROR.
    pub const FLOW_CONTROL_ERROR: u32 = 7;
    /// STREAM_IN_USE.
    pub const STREAM_IN_USE: u32 = 8;
}

/// SETTINGS ids this side acts on.
pub mod settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u32 = 4;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u32 = 7;
}

/// GOAWAY status codes.
pub mod goaway {
    /// OK.
    pub const OK: u32 = 0;
    /// PROTOCOL_ERROR.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// INTERNAL_ERROR.
    pub const INTERNAL_ERROR: u32 = 2;
}

/// One frame, header blocks still compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// DATA.
    Data {
        /// The stream.
        stream: u32,
        /// FLAG_FIN.
        fin: bool,
        /// The payload.
        data: Bytes,
    },
    /// SYN_STREAM: the peer opens a stream.
    SynStream {
        /// The new stream's id.
        stream: u32,
        /// The stream it is associated with (0: none).
        associated: u32,
        /// Priority, 0 (highest) to 7.
        priority: u8,
        /// FLAG_FIN and FLAG_UNIDIRECTIONAL.
        flags: u8,
        /// The compressed header block.
        block: Bytes,
    },
    /// SYN_REPLY: the answer to a SYN_STREAM.
    SynReply {
        /// The stream.
        stream: u32,
        /// FLAG_FIN.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// RST_STREAM: the stream ends abnormally.
    RstStream {
        /// The stream.
        stream: u32,
        /// Why (see [`rst`]).
        status: u32,
    },
    /// SETTINGS: (flags, id, value) entries.
    Settings {
        /// FLAG_SETTINGS_CLEAR_SETTINGS.
        clear: bool,
        /// The entries.
        entries: Vec<(u8, u32, u32)>,
    },
    /// PING.
    Ping {
        /// Its id (odd from clients, even from servers).
        id: u32,
    },
    /// GOAWAY: no new streams after `last_good`.
    GoAway {
        /// The last stream the sender processed.
        last_good: u32,
        /// Why (see [`goaway`]).
        status: u32,
    },
    /// HEADERS: more headers on an open stream.
    Headers {
        /// The stream.
        stream: u32,
        /// FLAG_FIN.
        fin: bool,
        /// The compressed header block.
        block: Bytes,
    },
    /// WINDOW_UPDATE: the receiver consumed `delta` bytes (stream 0: the connection).
    WindowUpdate {
        /// The stream, or 0 for the connection.
        stream: u32,
        /// How many bytes more may be sent.
        delta: u32,
    },
    /// A control frame of a type this side does not know; the specification says to ignore it.
    Unknown {
        /// Its type.
        kind: u16,
    },
}

const STREAM_MASK: u32 = 0x7fff_ffff;

fn be32(bytes: &[u8], at: usize) -> u32 {
    // Callers check lengths first; a short slice reads as zeros rather than panicking.
    let mut word = [0u8; 4];
    if let Some(slice) = bytes.get(at..at + 4) {
        word.copy_from_slice(slice);
    }
    u32::from_be_bytes(word)
}

/// Decodes one frame from the front of `input`: `Ok(None)` when more bytes are needed,
/// otherwise the frame and how many bytes it took. Malformed frames are errors; no input panics.
pub fn decode_one(input: &[u8]) -> Result<Option<(Frame, usize)>, SpdyError> {
    if input.len() < HEADER_LEN {
        return Ok(None);
    }
    let first = be32(input, 0);
    let flags = input[4];
    let length = (be32(input, 4) & 0x00ff_ffff) as usize;
    let total = HEADER_LEN + length;
    if input.len() < total {
        return Ok(None);
    }
    let payload = Bytes::copy_from_slice(&input[HEADER_LEN..total]);
    let frame = if first & 0x8000_0000 == 0 {
        Frame::Data {
            stream: first & STREAM_MASK,
            fin: flags & FLAG_FIN != 0,
            data: payload,
        }
    } else {
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        control((first & 0xffff) as u16, flags, &payload)?
    };
    Ok(Some((frame, total)))
}

fn need(
    kind: &'static str,
    payload: &[u8],
    exactly: Option<usize>,
    at_least: usize,
) -> Result<(), SpdyError> {
    let ok = match exactly {
        Some(length) => payload.len() == length,
        None => payload.len() >= at_least,
    };
    if ok {
        Ok(())
    } else {
        Err(SpdyError::Length {
            kind,
            length: payload.len(),
        })
    }
}

/// Decodes a control frame's payload by its type; unknown types are kept (and ignored).
fn control(kind: u16, flags: u8, payload: &Bytes) -> Result<Frame, SpdyError> {
    Ok(match kind {
        kind::SYN_STREAM => {
            need("SYN_STREAM", payload, None, 10)?;
            Frame::SynStream {
                stream: be32(payload, 0) & STREAM_MASK,
                associated: be32(payload, 4) & STREAM_MASK,
                priority: payload[8] >> 5,
                flags,
                block: payload.slice(10..),
            }
        }
        kind::SYN_REPLY => {
            need("SYN_REPLY", payload, None, 4)?;
            Frame::SynReply {
                stream: be32(payload, 0) & STREAM_MASK,
                fin: flags & FLAG_FIN != 0,
                block: payload.slice(4..),
            }
        }
        kind::HEADERS => {
            need("HEADERS", payload, None, 4)?;
            Frame::Headers {
                stream: be32(payload, 0) & STREAM_MASK,
                fin: flags & FLAG_FIN != 0,
                block: payload.slice(4..),
            }
        }
        kind::RST_STREAM => {
            need("RST_STREAM", payload, Some(8), 8)?;
            Frame::RstStream {
                stream: be32(payload, 0) & STREAM_MASK,
                status: be32(payload, 4),
            }
        }
        kind::SETTINGS => settings_frame(flags, payload)?,
        kind::PING => {
            need("PING", payload, Some(4), 4)?;
            Frame::Ping {
                id: be32(payload, 0),
            }
        }
        kind::GOAWAY => {
            need("GOAWAY", payload, Some(8), 8)?;
            Frame::GoAway {
                last_good: be32(payload, 0) & STREAM_MASK,
                status: be32(payload, 4),
            }
        }
        kind::WINDOW_UPDATE => {
            need("WINDOW_UPDATE", payload, Some(8), 8)?;
            Frame::WindowUpdate {
                stream: be32(payload, 0) & STREAM_MASK,
                delta: be32(payload, 4) & STREAM_MASK,
            }
        }
        other => Frame::Unknown { kind: other },
    })
}

/// A SETTINGS payload: a count, then that many (flags, id, value) entries of 8 bytes each.
fn settings_frame(flags: u8, payload: &[u8]) -> Result<Frame, SpdyError> {
    need("SETTINGS", payload, None, 4)?;
    let count = be32(payload, 0) as usize;
    if count.checked_mul(8).and_then(|n| n.checked_add(4)) != Some(payload.len()) {
        return Err(SpdyError::Length {
            kind: "SETTINGS",
            length: payload.len(),
        });
    }
    let entries = (0..count)
        .map(|i| {
            let at = 4 + i * 8;
            let word = be32(payload, at);
            (
                (word >> 24) as u8,
                word & 0x00ff_ffff,
                be32(payload, at + 4),
            )
        })
        .collect();
    Ok(Frame::Settings {
        clear: flags & 0x01 != 0,
        entries,
    })
}

fn control_header(out: &mut BytesMut, kind: u16, flags: u8, length: usize) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u32((u32::from(flags) << 24) | (length as u32 & 0x00ff_ffff));
}

/// Encodes `frame` onto `out`. Payloads longer than a frame can carry are an error.
pub fn encode(frame: &Frame, out: &mut BytesMut) -> Result<(), SpdyError> {
    let check = |length: usize| {
        if length > MAX_LENGTH {
            Err(SpdyError::TooLarge(length))
        } else {
            Ok(length)
        }
    };
    match frame {
        Frame::Data { stream, fin, data } => {
            let length = check(data.len())?;
            out.put_u32(stream & STREAM_MASK);
            out.put_u32((u32::from(u8::from(*fin)) << 24) | length as u32);
            out.extend_from_slice(data);
        }
        Frame::SynStream {
            stream,
            associated,
            priority,
            flags,
            block,
        } => {
            control_header(out, kind::SYN_STREAM, *flags, check(10 + block.len())?);
            out.put_u32(stream & STREAM_MASK);
            out.put_u32(associated & STREAM_MASK);
            out.put_u8((priority & 0x07) << 5);
            out.put_u8(0);
            out.extend_from_slice(block);
        }
        Frame::SynReply { stream, fin, block } => {
            control_header(
                out,
                kind::SYN_REPLY,
                u8::from(*fin),
                check(4 + block.len())?,
            );
            out.put_u32(stream & STREAM_MASK);
            out.extend_from_slice(block);
        }
        Frame::Headers { stream, fin, block } => {
            control_header(out, kind::HEADERS, u8::from(*fin), check(4 + block.len())?);
            out.put_u32(stream & STREAM_MASK);
            out.extend_from_slice(block);
        }
        Frame::RstStream { stream, status } => {
            control_header(out, kind::RST_STREAM, 0, 8);
            out.put_u32(stream & STREAM_MASK);
            out.put_u32(*status);
        }
        Frame::Settings { clear, entries } => {
            control_header(
                out,
                kind::SETTINGS,
                u8::from(*clear),
                check(4 + entries.len() * 8)?,
            );
            out.put_u32(entries.len() as u32);
            for (flags, id, value) in entries {
                out.put_u32((u32::from(*flags) << 24) | (id & 0x00ff_ffff));
                out.put_u32(*value);
            }
        }
        Frame::Ping { id } => {
            control_header(out, kind::PING, 0, 4);
            out.put_u32(*id);
        }
        Frame::GoAway { last_good, status } => {
            control_header(out, kind::GOAWAY, 0, 8);
            out.put_u32(last_good & STREAM_MASK);
            out.put_u32(*status);
        }
        Frame::WindowUpdate { stream, delta } => {
            control_header(out, kind::WINDOW_UPDATE, 0, 8);
            out.put_u32(stream & STREAM_MASK);
            out.put_u32(delta & STREAM_MASK);
        }
        Frame::Unknown { kind } => control_header(out, *kind, 0, 0),
    }
    Ok(())
}
