//! SPDY/3 header blocks: the name/value list (section 2.6.10) and its zlib compression with the
//! SPDY/3 dictionary. Each direction of a connection is one zlib stream: every block the peer
//! sends continues the same context (ending in a sync flush), so one [`Inflater`] reads every
//! block of a connection in order, and one [`Deflater`] writes ours.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::{SpdyError, dictionary};

/// The most header bytes one block may inflate to (the kubelet's streams carry a few dozen).
pub const MAX_BLOCK: usize = 256 * 1024;

/// A header block: lowercase names, values with NUL between multiple values.
pub type Headers = Vec<(String, String)>;

/// The first value of header `name` (names are lowercase on the wire).
pub fn get<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.split('\0').next().unwrap_or_default())
}

/// Serialises `headers` (uncompressed).
pub fn encode_block(headers: &Headers) -> Vec<u8> {
    let mut out = Vec::new();
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len(headers.len()));
    for (name, value) in headers {
        out.extend_from_slice(&len(name.len()));
        out.extend_from_slice(name.to_ascii_lowercase().as_bytes());
        out.extend_from_slice(&len(value.len()));
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Parses an uncompressed block. Empty or repeated names, and bytes left over, are errors.
pub fn decode_block(block: &[u8]) -> Result<Headers, SpdyError> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], SpdyError> {
        let slice = at
            .checked_add(n)
            .and_then(|end| block.get(at..end))
            .ok_or(SpdyError::HeaderBlock("truncated"))?;
        at += n;
        Ok(slice)
    };
    let word = |bytes: &[u8]| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let count = word(take(4)?);
    let mut headers = Headers::new();
    // Names seen, for the repeat check: a block may hold ~24,000 names within MAX_BLOCK, and
    // comparing each with every earlier one cost seconds of CPU per frame.
    let mut names = std::collections::HashSet::new();
    for _ in 0..count {
        let length = word(take(4)?);
        let name = take(length)?;
        if name.is_empty() {
            return Err(SpdyError::HeaderBlock("empty header name"));
        }
        let name = std::str::from_utf8(name)
            .map_err(|_| SpdyError::HeaderBlock("header name is not UTF-8"))?
            .to_owned();
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(SpdyError::HeaderBlock("header name is not lowercase"));
        }
        let length = word(take(4)?);
        let value = std::str::from_utf8(take(length)?)
            .map_err(|_| SpdyError::HeaderBlock("header value is not UTF-8"))?
            .to_owned();
        if !names.insert(name.clone()) {
            return Err(SpdyError::HeaderBlock("repeated header name"));
        }
        headers.push((name, value));
    }
    if at != block.len() {
        return Err(SpdyError::HeaderBlock("bytes after the last header"));
    }
    Ok(headers)
}

/// The receiving zlib context of one connection.
pub struct Inflater {
    inner: Decompress,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("total_in", &self.inner.total_in())
            .finish()
    }
}

impl Default for Inflater {
    fn default() -> Self {
        Self {
            inner: Decompress::new(true),
        }
    }
}

impl Inflater {
    /// Inflates the next block of the peer's stream and parses it.
    pub fn headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        decode_block(&self.inflate(block)?)
    }

    /// Inflates the next block of the peer's stream.
    pub fn inflate(&mut self, block: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_BLOCK {
                    return Err(SpdyError::HeaderBlock("header block inflates too large"));
                }
                out.reserve(out.len().max(256));
            }
            let (in_before, out_before) = (self.inner.total_in(), out.len());
            let result = self
                .inner
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let consumed = usize::try_from(self.inner.total_in() - in_before).unwrap_or(usize::MAX);
            input = input.get(consumed..).unwrap_or_default();
            match result {
                Ok(Status::StreamEnd) => {
                    return Err(SpdyError::HeaderBlock("the header stream ended"));
                }
                Ok(_) => {
                    let full = out.len() == out.capacity();
                    if input.is_empty() && !full {
                        return Ok(out);
                    }
                    if consumed == 0 && out.len() == out_before && !full {
                        // Nothing moves: the block ends inside a deflate block.
                        return Err(SpdyError::HeaderBlock("truncated compressed block"));
                    }
                }
                Err(error) if error.needs_dictionary().is_some() => {
                    self.inner
                        .set_dictionary(&dictionary::bytes())
                        .map_err(|_| {
                            SpdyError::HeaderBlock("the block names another dictionary")
                        })?;
                }
                Err(_) => return Err(SpdyError::HeaderBlock("not a zlib stream")),
            }
        }
    }
}

/// The sending zlib context of one connection.
pub struct Deflater {
    inner: Compress,
    primed: bool,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater")
            .field("total_out", &self.inner.total_out())
            .finish()
    }
}

impl Default for Deflater {
    fn default() -> Self {
        Self {
            inner: Compress::new(Compression::default(), true),
            primed: false,
        }
    }
}

impl Deflater {
    /// Compresses `headers` as the next block of our stream.
    pub fn headers(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        self.deflate(&encode_block(headers))
    }

    /// Compresses `block` as the next block of our stream (ending in a sync flush).
    pub fn deflate(&mut self, block: &[u8]) -> Result<Vec<u8>, SpdyError> {
        if !self.primed {
            self.inner
                .set_dictionary(&dictionary::bytes())
                .map_err(|_| SpdyError::HeaderBlock("cannot load the dictionary"))?;
            self.primed = true;
        }
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut input = block;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.len().max(64));
            }
            let before = self.inner.total_in();
            self.inner
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|_| SpdyError::HeaderBlock("compression failed"))?;
            let consumed = usize::try_from(self.inner.total_in() - before).unwrap_or(usize::MAX);
            input = input.get(consumed..).unwrap_or_default();
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}
