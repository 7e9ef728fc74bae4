//! The accept loop: TLS handshakes on their own tasks under a deadline, HTTP/1.1 or HTTP/2 per
//! connection (ALPN), and a stop that lets requests in flight finish.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use rustls::pki_types::CertificateDer;
use rustls::server::ResolvesServerCert;
use rustls::server::danger::ClientCertVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

/// The server cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// rustls refused the configuration (for instance a client verifier without roots).
    #[error("cannot build the TLS configuration")]
    Config(#[source] rustls::Error),
}

/// Whether clients present certificates.
#[derive(Debug, Clone, Default)]
pub enum ClientAuth {
    /// They don't (webhooks, the OpenAPI front).
    #[default]
    None,
    /// The verifier decides: required, or optional (`allow_unauthenticated`) with the
    /// handler deciding what an anonymous client may do. What was presented reaches the
    /// handler as [`ConnectionInfo::peer_certificates`].
    Verify(Arc<dyn ClientCertVerifier>),
}

/// Where a request came from; every request carries it as an extension
/// (`axum::Extension<ConnectionInfo>`).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The client's address.
    pub remote_addr: SocketAddr,
    /// The verified client certificate chain, leaf first (only with [`ClientAuth::Verify`]
    /// and a client that presented one).
    pub peer_certificates: Option<Arc<[CertificateDer<'static>]>>,
}

/// How long things may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A client that has not finished its TLS handshake by then is disconnected.
    pub handshake: Duration,
    /// After a stop, how long requests in flight may take before their connections are cut.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: Duration::from_secs(10),
            drain: Duration::from_secs(10),
        }
    }
}

/// The ring provider, the one the workspace builds rustls with.
pub(crate) fn crypto_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// An HTTPS server: TLS 1.2 and 1.3 only, HTTP/2 and HTTP/1.1 offered by ALPN, the
/// certificate from `certificate` at each handshake.
#[derive(Clone)]
pub struct TlsServer {
    acceptor: tokio_rustls::TlsAcceptor,
    timeouts: Timeouts,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl TlsServer {
    /// A server presenting `certificate` (a [`crate::ReloadableCertificate`] to renew it while
    /// serving), with `client_auth`.
    pub fn new(
        certificate: Arc<dyn ResolvesServerCert>,
        client_auth: ClientAuth,
    ) -> Result<Self, ServerError> {
        // Named, not "safe defaults": below TLS 1.2 is refused whatever rustls' defaults become.
        let builder = rustls::ServerConfig::builder_with_provider(Arc::new(crypto_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(ServerError::Config)?;
        let builder = match client_auth {
            ClientAuth::None => builder.with_no_client_auth(),
            ClientAuth::Verify(verifier) => builder.with_client_cert_verifier(verifier),
        };
        let mut config = builder.with_cert_resolver(certificate);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            timeouts: Timeouts::default(),
        })
    }

    /// The same server with other timeouts.
    #[must_use]
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Serves `router` on `listener` until `stop`, then stops accepting, lets requests in
    /// flight finish (idle connections close at once, HTTP/2 clients get a GOAWAY) for up to
    /// [`Timeouts::drain`], cuts what is left, and returns. A failed accept (a file
    /// descriptor limit, an aborted connection) is logged and accepting goes on.
    pub async fn serve(&self, listener: TcpListener, router: Router, stop: CancellationToken) {
        let connections = TaskTracker::new();
        // Cancelled when the drain deadline passes: connections still open are cut.
        let cut = CancellationToken::new();
        let local = listener.local_addr().ok();
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, remote_addr)) => {
                    connections.spawn(connection(
                        stream,
                        remote_addr,
                        self.acceptor.clone(),
                        router.clone(),
                        self.timeouts.handshake,
                        stop.clone(),
                        cut.clone(),
                    ));
                }
                Err(error) => {
                    warn!(address = ?local, %error, "cannot accept a connection; retrying");
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            }
        }
        drop(listener);
        connections.close();
        let open = connections.len();
        if tokio::time::timeout(self.timeouts.drain, connections.wait())
            .await
            .is_err()
        {
            info!(address = ?local, open = connections.len(), "drain deadline passed; closing the connections left");
            cut.cancel();
            connections.wait().await;
        } else if open > 0 {
            debug!(address = ?local, open, "connections drained");
        }
    }
}

/// One connection: handshake (bounded by `handshake_timeout`), then HTTP until the client
/// leaves, or `stop` asks it to finish (graceful) and `cut` ends it.
async fn connection(
    stream: TcpStream,
    remote_addr: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    handshake_timeout: Duration,
    stop: CancellationToken,
    cut: CancellationToken,
) {
    // Requests and answers are small: don't hold them back for coalescing.
    let _ = stream.set_nodelay(true);
    let handshake = tokio::select! {
        () = stop.cancelled() => return,
        handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream)) => handshake,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            debug!(%remote_addr, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            debug!(%remote_addr, timeout = ?handshake_timeout, "TLS handshake timed out");
            return;
        }
    };
    let info = ConnectionInfo {
        remote_addr,
        peer_certificates: stream.get_ref().1.peer_certificates().map(Arc::from),
    };
    let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        request.extensions_mut().insert(info.clone());
        let router = router.clone();
        async move {
            Ok::<_, Infallible>(
                router
                    .oneshot(request.map(axum::body::Body::new))
                    .await
                    .unwrap_or_else(|never| match never {}),
            )
        }
    });
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    // A timer lets hyper bound how long a client may take to send a request's head (HTTP/1)
    // and keep-alive pings (HTTP/2).
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .http2()
        .timer(hyper_util::rt::TokioTimer::new());
    // With upgrades: HTTP/1.1 `Connection: Upgrade` (SPDY/3.1 and WebSocket streams of the
    // kubelet API) hands the connection to the handler through `hyper::upgrade::on`; a plain
    // `serve_connection` would answer the 101 and then drop the upgraded stream.
    let connection =
        builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                result = connection.as_mut() => result,
                () = cut.cancelled() => Ok(()),
            }
        }
    };
    if let Err(error) = result {
        debug!(%remote_addr, %error, "connection ended with an error");
    }
}
