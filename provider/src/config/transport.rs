//! Whether ECI traffic may travel unencrypted. Every ECI request carries the AccessKey's
//! signature (and an STS token), creates carry the pods' Secret values, and an exec stream
//! carries whatever the user types: all of it goes over TLS unless the operator says, with
//! `--eci-allow-insecure-endpoint`, that plaintext is fine (a mock-eci on loopback or in the
//! cluster). Pure decisions; the callers refuse at start or refuse the stream.

/// What the operator allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportPolicy {
    /// TLS only: `https://` endpoints, `wss://` streams.
    EncryptedOnly,
    /// Plaintext too (`http://`, `grpc://`, `ws://`): warned about at every start.
    PlaintextAllowed,
}

/// Which kind of address is being judged: they differ in their schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// An API endpoint: `https://` or `http://`.
    Endpoint,
    /// An exec stream ECI hands out: `wss://` or `ws://`.
    Stream,
}

/// How an accepted address is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Over TLS.
    Encrypted,
    /// In the clear (only when allowed).
    Plaintext,
}

/// An address the policy does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// Plaintext without the operator's say-so.
    #[error(
        "{address:?} is not encrypted ({scheme}://); ECI traffic must use {wanted}:// unless --eci-allow-insecure-endpoint (ECI_ALLOW_INSECURE_ENDPOINT) is set"
    )]
    Plaintext {
        /// The address, without its query (a stream URI's query may hold a session token).
        address: String,
        /// Its scheme.
        scheme: &'static str,
        /// The encrypted scheme it should have had.
        wanted: &'static str,
    },
    /// Not a URL of the expected kind at all.
    #[error("{address:?} is not a {expected} URL")]
    Scheme {
        /// The address, without its query.
        address: String,
        /// What was expected.
        expected: &'static str,
    },
}

impl TransportPolicy {
    /// The policy of the flag: plaintext only when asked for.
    pub fn from_flag(allow_insecure: bool) -> Self {
        if allow_insecure {
            Self::PlaintextAllowed
        } else {
            Self::EncryptedOnly
        }
    }

    /// Judges `address` as a `kind`: how it would be reached, or why it may not be.
    pub fn check(self, address: &str, kind: AddressKind) -> Result<Transport, TransportError> {
        let (secure, plain, expected) = match kind {
            AddressKind::Endpoint => ("https", "http", "http(s)"),
            AddressKind::Stream => ("wss", "ws", "ws(s)"),
        };
        // Schemes are case-insensitive (RFC 3986 §3.1).
        let scheme = address
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let shown = || without_query(address).to_owned();
        match scheme.as_deref() {
            Some(s) if s == secure => Ok(Transport::Encrypted),
            Some(s) if s == plain => match self {
                Self::PlaintextAllowed => Ok(Transport::Plaintext),
                Self::EncryptedOnly => Err(TransportError::Plaintext {
                    address: shown(),
                    scheme: plain,
                    wanted: secure,
                }),
            },
            _ => Err(TransportError::Scheme {
                address: shown(),
                expected,
            }),
        }
    }
}

/// `address` up to its query or fragment: what may be shown in errors and logs.
fn without_query(address: &str) -> &str {
    address.split(['?', '#']).next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_by_kind_and_policy() {
        use AddressKind::{Endpoint, Stream};
        use Transport::{Encrypted, Plaintext};
        use TransportPolicy::{EncryptedOnly, PlaintextAllowed};
        // (address, kind, policy, Some(transport) if accepted)
        let table: &[(&str, AddressKind, TransportPolicy, Option<Transport>)] = &[
            (
                "https://eci.cn-hangzhou.aliyuncs.com",
                Endpoint,
                EncryptedOnly,
                Some(Encrypted),
            ),
            (
                "HTTPS://eci.example",
                Endpoint,
                EncryptedOnly,
                Some(Encrypted),
            ),
            (
                "https://eci.example",
                Endpoint,
                PlaintextAllowed,
                Some(Encrypted),
            ),
            ("http://127.0.0.1:8080", Endpoint, EncryptedOnly, None),
            ("Http://127.0.0.1:8080", Endpoint, EncryptedOnly, None),
            (
                "http://127.0.0.1:8080",
                Endpoint,
                PlaintextAllowed,
                Some(Plaintext),
            ),
            ("eci.example", Endpoint, PlaintextAllowed, None),
            ("wss://eci.example/exec", Endpoint, PlaintextAllowed, None),
            ("ftp://eci.example", Endpoint, PlaintextAllowed, None),
            ("", Endpoint, PlaintextAllowed, None),
            (
                "wss://eci-exec.example/s?token=t",
                Stream,
                EncryptedOnly,
                Some(Encrypted),
            ),
            (
                "WSS://eci-exec.example/s",
                Stream,
                EncryptedOnly,
                Some(Encrypted),
            ),
            ("ws://127.0.0.1:9/s?token=t", Stream, EncryptedOnly, None),
            (
                "ws://127.0.0.1:9/s?token=t",
                Stream,
                PlaintextAllowed,
                Some(Plaintext),
            ),
            ("https://eci-exec.example/s", Stream, PlaintextAllowed, None),
            ("http://eci-exec.example/s", Stream, PlaintextAllowed, None),
            ("", Stream, EncryptedOnly, None),
        ];
        for &(address, kind, policy, want) in table {
            let got = policy.check(address, kind);
            assert_eq!(
                got.as_ref().ok().copied(),
                want,
                "{address:?} {kind:?} {policy:?}: {got:?}"
            );
        }
    }

    #[test]
    fn a_refusal_names_the_flag_and_hides_the_query() {
        let error = TransportPolicy::EncryptedOnly
            .check(
                "ws://127.0.0.1:9/exec/abc?token=secret#x",
                AddressKind::Stream,
            )
            .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("--eci-allow-insecure-endpoint"), "{text}");
        assert!(text.contains("wss://"), "{text}");
        assert!(text.contains("ws://127.0.0.1:9/exec/abc"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        let error = TransportPolicy::EncryptedOnly
            .check("http://mock:8080", AddressKind::Endpoint)
            .unwrap_err();
        assert!(error.to_string().contains("https://"), "{error}");
    }

    #[test]
    fn the_flag_chooses_the_policy() {
        assert_eq!(
            TransportPolicy::from_flag(false),
            TransportPolicy::EncryptedOnly
        );
        assert_eq!(
            TransportPolicy::from_flag(true),
            TransportPolicy::PlaintextAllowed
        );
    }
}
