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
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

use crate::limits::{BodyGate, Limits};

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
/// certificate from `certificate` at each handshake, every caller bounded by [`Limits`].
#[derive(Clone)]
pub struct TlsServer {
    acceptor: tokio_rustls::TlsAcceptor,
    timeouts: Timeouts,
    limits: Limits,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("timeouts", &self.timeouts)
            .field("limits", &self.limits)
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
            limits: Limits::default(),
        })
    }

    /// The same server with other timeouts.
    #[must_use]
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// The same server with other limits.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves `router` on `listener` until `stop`, then stops accepting, lets requests in
    /// flight finish (idle connections close at once, HTTP/2 clients get a GOAWAY) for up to
    /// [`Timeouts::drain`], cuts what is left, and returns. A failed accept (a file
    /// descriptor limit, an aborted connection) is logged and accepting goes on.
    pub async fn serve(&self, listener: TcpListener, router: Router, stop: CancellationToken) {
        let acceptor = self.acceptor.clone();
        let handshake = self.timeouts.handshake;
        accept_loop(
            listener,
            self.timeouts,
            self.limits,
            stop,
            move |stream, remote_addr, served| {
                let acceptor = acceptor.clone();
                async move {
                    let Some(stream) =
                        handshake_within(acceptor, stream, remote_addr, handshake, &served.stop)
                            .await
                    else {
                        return;
                    };
                    let (_, session) = stream.get_ref();
                    let info = ConnectionInfo {
                        remote_addr,
                        peer_certificates: session.peer_certificates().map(Arc::from),
                    };
                    let http2 = session.alpn_protocol() == Some(b"h2");
                    http(stream, info, http2, served).await;
                }
            },
            router,
        )
        .await;
    }
}

/// A plain-HTTP server (HTTP/1.1 only) with the same [`Limits`] and drain as [`TlsServer`]:
/// for what must answer without TLS (probes, an opted-in metrics port).
#[derive(Debug, Clone, Default)]
pub struct PlainServer {
    timeouts: Timeouts,
    limits: Limits,
}

impl PlainServer {
    /// A server with `limits` and the default timeouts.
    pub fn new(limits: Limits) -> Self {
        Self {
            timeouts: Timeouts::default(),
            limits,
        }
    }

    /// Serves `router` on `listener` until `stop`, as [`TlsServer::serve`] does.
    pub async fn serve(&self, listener: TcpListener, router: Router, stop: CancellationToken) {
        accept_loop(
            listener,
            self.timeouts,
            self.limits,
            stop,
            |stream, remote_addr, served| async move {
                let info = ConnectionInfo {
                    remote_addr,
                    peer_certificates: None,
                };
                http(stream, info, false, served).await;
            },
            router,
        )
        .await;
    }
}

/// What every connection of one listener shares.
#[derive(Clone)]
struct Served {
    router: Router,
    limits: Limits,
    gate: BodyGate,
    stop: CancellationToken,
    cut: CancellationToken,
}

/// Accepts until `stop` (at most [`Limits::connections`] open at once), runs `connection` for
/// each on its own task, then drains.
async fn accept_loop<C, F>(
    listener: TcpListener,
    timeouts: Timeouts,
    limits: Limits,
    stop: CancellationToken,
    connection: C,
    router: Router,
) where
    C: Fn(TcpStream, SocketAddr, Served) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let connections = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(limits.connections.max(1)));
    // Cancelled when the drain deadline passes: connections still open are cut.
    let cut = CancellationToken::new();
    let served = Served {
        router,
        limits,
        gate: BodyGate::new(limits),
        stop: stop.clone(),
        cut: cut.clone(),
    };
    let local = listener.local_addr().ok();
    loop {
        let slot = tokio::select! {
            () = stop.cancelled() => break,
            slot = Arc::clone(&slots).acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, remote_addr)) => {
                // Requests and answers are small: don't hold them back for coalescing.
                let _ = stream.set_nodelay(true);
                let serving = connection(stream, remote_addr, served.clone());
                connections.spawn(async move {
                    serving.await;
                    drop(slot);
                });
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
    if tokio::time::timeout(timeouts.drain, connections.wait())
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

/// The TLS handshake, bounded by `timeout`; `None` when it fails, times out or `stop` comes.
async fn handshake_within(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    remote_addr: SocketAddr,
    timeout: Duration,
    stop: &CancellationToken,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let handshake = tokio::select! {
        () = stop.cancelled() => return None,
        handshake = tokio::time::timeout(timeout, acceptor.accept(stream)) => handshake,
    };
    match handshake {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            debug!(%remote_addr, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(%remote_addr, ?timeout, "TLS handshake timed out");
            None
        }
    }
}

/// Runs a hyper connection until it ends, or `stop` asks it to finish and `cut` ends it.
macro_rules! drive {
    ($connection:ident, $stop:ident, $cut:ident) => {{
        tokio::pin!($connection);
        tokio::select! {
            result = $connection.as_mut() => result,
            () = $stop.cancelled() => {
                $connection.as_mut().graceful_shutdown();
                tokio::select! {
                    result = $connection.as_mut() => result,
                    () = $cut.cancelled() => Ok(()),
                }
            }
        }
    }};
}

/// The largest request head (HTTP/1.1 read buffer) and header list (HTTP/2) a client may send.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// HTTP/2 flow-control windows: what a client may send ahead of the handler's reading.
const STREAM_WINDOW: u32 = 64 * 1024;
const CONNECTION_WINDOW: u32 = 256 * 1024;

/// HTTP on an established connection until the client leaves, or `stop` asks it to finish
/// (graceful) and `cut` ends it. HTTP/2 when ALPN chose it, else HTTP/1.1 with upgrades
/// (SPDY/3.1 and WebSocket streams of the kubelet API reach the handler through
/// `hyper::upgrade::on`).
async fn http<I>(io: I, info: ConnectionInfo, http2: bool, served: Served)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let remote_addr = info.remote_addr;
    let Served {
        router,
        limits,
        gate,
        stop,
        cut,
    } = served;
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let router = router.clone();
        let gate = gate.clone();
        let info = info.clone();
        async move {
            let mut request = match gate.admit(request).await {
                Ok(request) => request,
                Err(refusal) => return Ok::<_, Infallible>(refusal),
            };
            request.extensions_mut().insert(info);
            Ok(router
                .oneshot(request)
                .await
                .unwrap_or_else(|never| match never {}))
        }
    });
    let io = hyper_util::rt::TokioIo::new(io);
    let result = if http2 {
        let mut builder =
            hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .max_header_list_size(u32::try_from(MAX_HEAD_BYTES).unwrap_or(u32::MAX))
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .keep_alive_interval(Some(limits.header_read * 3))
            .keep_alive_timeout(limits.header_read);
        let connection = builder.serve_connection(io, service);
        drive!(connection, stop, cut)
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read)
            .max_buf_size(MAX_HEAD_BYTES);
        let connection = builder.serve_connection(io, service).with_upgrades();
        drive!(connection, stop, cut)
    };
    if let Err(error) = result {
        debug!(%remote_addr, %error, "connection ended with an error");
    }
}
