//! Alibaba Cloud RPC signature, version 1.0 (HMAC-SHA1).
//!
//! Every parameter except `Signature` is sorted by name, name and value are percent-encoded
//! (RFC 3986 unreserved characters stay, everything else becomes `%XY` of its UTF-8 bytes), the
//! pairs are joined with `&`, and the result is encoded once more behind `METHOD&%2F&`. The
//! signature is the Base64 HMAC-SHA1 of that string, keyed by the AccessKey secret plus `&`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;

/// `SignatureMethod` of this scheme.
pub const SIGNATURE_METHOD: &str = "HMAC-SHA1";
/// `SignatureVersion` of this scheme.
pub const SIGNATURE_VERSION: &str = "1.0";
/// The parameter carrying the signature (never part of what is signed).
pub const SIGNATURE_PARAMETER: &str = "Signature";

/// Percent-encodes `text` the way the signature requires: `A-Z a-z 0-9 - _ . ~` stay, every
/// other byte of the UTF-8 text becomes `%XY` with uppercase hex (so a space is `%20`, `*` is
/// `%2A` and `/` is `%2F`).
pub fn percent_encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0F)]));
        }
    }
    encoded
}

/// The canonicalized query string: every parameter but `Signature`, encoded, sorted by encoded
/// name, joined with `&`. The same text serves as the request body.
pub fn canonicalized_query<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut pairs: Vec<(String, String)> = params
        .into_iter()
        .filter(|(key, _)| *key != SIGNATURE_PARAMETER)
        .map(|(key, value)| (percent_encode(key), percent_encode(value)))
        .collect();
    pairs.sort();
    let mut query = String::new();
    for (key, value) in pairs {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(&key);
        query.push('=');
        query.push_str(&value);
    }
    query
}

/// `METHOD&%2F&` + the encoded canonicalized query.
pub fn string_to_sign<'a>(
    method: &str,
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    format!(
        "{method}&{}&{}",
        percent_encode("/"),
        percent_encode(&canonicalized_query(params))
    )
}

/// Base64(HMAC-SHA1(secret + "&", string_to_sign)).
pub fn sign(access_key_secret: &str, string_to_sign: &str) -> String {
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{access_key_secret}&").as_bytes(),
    );
    STANDARD.encode(hmac::sign(&key, string_to_sign.as_bytes()).as_ref())
}

/// Checks the `Signature` among `params` against `access_key_secret`. On a mismatch the error
/// is the string the server signed, which is what the service reports so a client can compare.
pub fn verify(
    method: &str,
    params: &[(String, String)],
    access_key_secret: &str,
) -> Result<(), String> {
    let expected = string_to_sign(method, params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let given = params
        .iter()
        .find(|(key, _)| key == SIGNATURE_PARAMETER)
        .map(|(_, value)| value.as_bytes())
        .unwrap_or_default();
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{access_key_secret}&").as_bytes(),
    );
    // Constant-time comparison of the MAC itself, not of its Base64 text.
    let decoded = STANDARD.decode(given).map_err(|_| expected.clone())?;
    hmac::verify(&key, expected.as_bytes(), &decoded).map_err(|_| expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example Alibaba Cloud publishes for signature version 1.0.
    #[test]
    fn published_example_is_reproduced_exactly() {
        let params = [
            ("AccessKeyId", "testid"),
            ("Action", "DescribeRegions"),
            ("Format", "XML"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf"),
            ("SignatureVersion", "1.0"),
            ("Timestamp", "2016-02-23T12:46:24Z"),
            ("Version", "2014-05-26"),
        ];
        let text = string_to_sign("GET", params);
        assert_eq!(
            text,
            "GET&%2F&AccessKeyId%3Dtestid%26Action%3DDescribeRegions%26Format%3DXML%26SignatureMethod%3DHMAC-SHA1%26SignatureNonce%3D3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf%26SignatureVersion%3D1.0%26Timestamp%3D2016-02-23T12%253A46%253A24Z%26Version%3D2014-05-26"
        );
        assert_eq!(sign("testsecret", &text), "OLeaidS1JvxuMvnyHOwuJ+uX5qY=");
    }

    #[test]
    fn order_of_parameters_does_not_matter_and_signature_is_left_out() {
        let sorted = string_to_sign("POST", [("A", "1"), ("B", "2")]);
        let shuffled = string_to_sign("POST", [("Signature", "x"), ("B", "2"), ("A", "1")]);
        assert_eq!(sorted, shuffled);
    }

    #[test]
    fn percent_encoding_edge_cases() {
        let cases = [
            ("a b", "a%20b"),
            ("*", "%2A"),
            ("~", "~"),
            ("/", "%2F"),
            ("+", "%2B"),
            ("=&", "%3D%26"),
            ("-_.", "-_."),
            ("é", "%C3%A9"),
            ("容器", "%E5%AE%B9%E5%99%A8"),
            ("[\"eci-1\"]", "%5B%22eci-1%22%5D"),
            ("", ""),
        ];
        for (raw, encoded) in cases {
            assert_eq!(percent_encode(raw), encoded, "{raw:?}");
        }
    }

    #[test]
    fn verification_accepts_the_right_secret_only() {
        let mut params: Vec<(String, String)> = [("Action", "X"), ("Tag.1.Key", "a b*~")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let text = string_to_sign("POST", params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        params.push(("Signature".into(), sign("secret", &text)));
        assert_eq!(verify("POST", &params, "secret"), Ok(()));
        assert_eq!(verify("POST", &params, "other"), Err(text.clone()));
        assert!(verify("GET", &params, "secret").is_err());
        params.last_mut().expect("signature").1 = "not base64!".into();
        assert_eq!(verify("POST", &params, "secret"), Err(text));
    }
}
