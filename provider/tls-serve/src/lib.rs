//! tls-serve: the workspace's one HTTPS server — the provider's admission webhook, mock-eci's
//! OpenAPI front and the kubelet API all serve through it.
//!
//! It owns what every TLS endpoint needs and none should write again: rustls with TLS 1.2 as
//! the floor, HTTP/1.1 (with upgrades) and HTTP/2 by ALPN, handshakes off the accept loop under a deadline (a
//! slow client delays nobody else), a certificate replaced while serving (from files it
//! watches, or by the caller) without dropping connections, a graceful drain on a
//! `CancellationToken`, a place for a client-certificate verifier, and [`Limits`] on what any
//! caller may hold (connections, head and body time, body bytes), checked before a handler runs
//! — the same for the plain-HTTP [`PlainServer`]. What is served is an
//! axum `Router`; certificates are the caller's to obtain.

mod certificate;
mod chain;
mod limits;
mod server;
#[cfg(test)]
mod tests;

pub use certificate::{CertificateError, CertificateFiles, ReloadableCertificate, certified_key};
pub use chain::Chain;
pub use limits::{BodyError, Limits};
pub(crate) use server::crypto_provider;
pub use server::{ClientAuth, ConnectionInfo, PlainServer, ServerError, Timeouts, TlsServer};

// Callers name rustls types (verifiers, certified keys) in this crate's API.
pub use rustls;
