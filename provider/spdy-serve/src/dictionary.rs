//! The SPDY/3 header-compression dictionary (SPDY/3 draft, section 2.6.10.1): the zlib
//! preset dictionary both ends load before the first header block.

/// Names the dictionary lists with a 32-bit big-endian length before each.
const WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// What follows the length-prefixed names: common values run together.
const TAIL: &str = concat!(
    "10010120120220520630030230330430530630740240540640740840941041141241341441541641",
    "7502504505203 Non-Authoritative Information204 No Content301 Moved Permanently40",
    "0 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept O",
    "ct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag",
    "e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/",
    "javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1",
    ",utf-,*,enq=0.",
);

/// The dictionary's length in bytes, as the specification gives it.
pub(super) const LEN: usize = 1423;

/// The dictionary's bytes.
pub(super) fn bytes() -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN);
    for word in WORDS {
        let len = u32::try_from(word.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(word.as_bytes());
    }
    out.extend_from_slice(TAIL.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn dictionary_is_the_specifications() {
        let bytes = super::bytes();
        assert_eq!(bytes.len(), super::LEN);
        assert!(bytes.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
        assert!(bytes.ends_with(b",*,enq=0."));
        // Adler-32 of the dictionary, the DICTID a zlib stream using it announces.
        assert_eq!(adler32(&bytes), 0xe3c6_a7c2);
    }

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for byte in data {
            a = (a + u32::from(*byte)) % 65_521;
            b = (b + a) % 65_521;
        }
        (b << 16) | a
    }
}
