//! The server on 127.0.0.1:0 with real clients: what it serves, a reload, what it refuses, a
//! client stalling its handshake, a stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{ClientAuth, ConnectionInfo, ReloadableCertificate, Timeouts, TlsServer};

/// A CA that signs leaves.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
pub(crate) struct Leaf {
    pub(crate) cert: String,
    pub(crate) key: String,
}

impl Pki {
    pub(crate) fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = params.self_signed(&key).unwrap().pem();
        Self {
            ca_pem,
            issuer: Issuer::new(params, key),
        }
    }

    pub(crate) fn leaf(&self, names: &[&str]) -> Leaf {
        self.sign(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self, name: &str) -> Leaf {
        self.sign(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn sign(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![usage];
        Leaf {
            cert: params.signed_by(&key, &self.issuer).unwrap().pem(),
            key: key.serialize_pem(),
        }
    }
}

fn router() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(400)).await;
                "slow"
            }),
        )
        .route(
            "/peer",
            get(|Extension(info): Extension<ConnectionInfo>| async move {
                format!(
                    "{} certificate(s) from {}",
                    info.peer_certificates.map_or(0, |chain| chain.len()),
                    info.remote_addr.ip()
                )
            }),
        )
}

struct Running {
    addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

async fn start(server: TlsServer) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.serve(listener, router(), stop).await }
    });
    Running { addr, stop, task }
}

fn serving(leaf: &Leaf) -> Arc<ReloadableCertificate> {
    Arc::new(ReloadableCertificate::from_pem(leaf.cert.as_bytes(), leaf.key.as_bytes()).unwrap())
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

struct Client {
    trusted: String,
    alpn: &'static [u8],
    versions: &'static [&'static rustls::SupportedProtocolVersion],
    identity: Option<Leaf>,
}

impl Client {
    fn trusting(ca_pem: &str) -> Self {
        Self {
            trusted: ca_pem.to_owned(),
            alpn: b"http/1.1",
            versions: rustls::DEFAULT_VERSIONS,
            identity: None,
        }
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<Tls> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.trusted.as_bytes()).unwrap())
            .unwrap();
        let builder =
            rustls::ClientConfig::builder_with_provider(Arc::new(crate::crypto_provider()))
                .with_protocol_versions(self.versions)
                .unwrap()
                .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some(leaf) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(leaf.cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![self.alpn.to_vec()];
        let tcp = TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }
}

/// An HTTP connection over `stream`, speaking what ALPN chose.
enum Http {
    One(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    Two(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Http {
    async fn over(stream: Tls) -> Self {
        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = hyper_util::rt::TokioIo::new(stream);
        if h2 {
            let (sender, connection) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            Self::Two(sender)
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(connection);
            Self::One(sender)
        }
    }

    async fn get(&mut self, path: &str) -> hyper::Result<(hyper::Version, String)> {
        let request = hyper::Request::get(format!("https://localhost{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = match self {
            Self::One(sender) => sender.send_request(request).await?,
            Self::Two(sender) => sender.send_request(request).await?,
        };
        let version = response.version();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((version, String::from_utf8_lossy(&body).into_owned()))
    }
}

async fn fetch(client: &Client, addr: SocketAddr, path: &str) -> (hyper::Version, String) {
    let stream = client.connect(addr).await.unwrap();
    Http::over(stream).await.get(path).await.unwrap()
}

#[tokio::test]
async fn serves_http1_and_http2_by_alpn_over_tls_1_2_and_1_3() {
    let pki = Pki::new("test CA");
    let server = TlsServer::new(serving(&pki.leaf(&["localhost"])), ClientAuth::None).unwrap();
    let running = start(server).await;
    let http1 = Client::trusting(&pki.ca_pem);
    assert_eq!(
        fetch(&http1, running.addr, "/").await,
        (hyper::Version::HTTP_11, "ok".to_owned())
    );
    let http2 = Client {
        alpn: b"h2",
        ..Client::trusting(&pki.ca_pem)
    };
    assert_eq!(
        fetch(&http2, running.addr, "/").await,
        (hyper::Version::HTTP_2, "ok".to_owned())
    );
    static TLS12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
    static TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    for (versions, expected) in [
        (TLS12, rustls::ProtocolVersion::TLSv1_2),
        (TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let client = Client {
            versions,
            ..Client::trusting(&pki.ca_pem)
        };
        let stream = client.connect(running.addr).await.unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(expected));
    }
    running.stop.cancel();
    running.task.await.unwrap();
}

#[tokio::test]
async fn a_new_certificate_is_seen_by_new_connections_and_open_ones_stay() {
    let (old_ca, new_ca) = (Pki::new("old CA"), Pki::new("new CA"));
    let certificate = serving(&old_ca.leaf(&["localhost"]));
    let server = TlsServer::new(certificate.clone(), ClientAuth::None).unwrap();
    let running = start(server).await;

    let trusts_old = Client::trusting(&old_ca.ca_pem);
    let trusts_new = Client::trusting(&new_ca.ca_pem);
    let mut open = Http::over(trusts_old.connect(running.addr).await.unwrap()).await;
    assert_eq!(open.get("/").await.unwrap().1, "ok");
    assert!(
        trusts_new.connect(running.addr).await.is_err(),
        "not yet the new certificate"
    );

    let renewed = new_ca.leaf(&["localhost"]);
    certificate
        .replace_pem(renewed.cert.as_bytes(), renewed.key.as_bytes())
        .unwrap();
    assert_eq!(fetch(&trusts_new, running.addr, "/").await.1, "ok");
    assert!(
        trusts_old.connect(running.addr).await.is_err(),
        "a new connection gets the new certificate"
    );
    assert_eq!(
        open.get("/").await.unwrap().1,
        "ok",
        "the connection opened before the reload still serves"
    );
    running.stop.cancel();
    running.task.await.unwrap();
}

/// A ClientHello offering only `version` (no supported_versions extension, as TLS 1.1 and
/// 1.2 clients send it), with what rustls needs to get as far as the version check.
fn client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut body = version.to_vec();
    body.extend([7u8; 32]); // random
    body.push(0); // no session id
    body.extend([0x00, 0x02, 0xc0, 0x2b]); // ECDHE-ECDSA-AES128-GCM-SHA256
    body.extend([0x01, 0x00]); // null compression
    let extensions = [
        &[0x00, 0x0d, 0x00, 0x04, 0x00, 0x02, 0x04, 0x03][..], // signature_algorithms: ecdsa_secp256r1_sha256
        &[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17][..], // supported_groups: secp256r1
    ]
    .concat();
    body.extend(u16::try_from(extensions.len()).unwrap().to_be_bytes());
    body.extend(extensions);
    let mut handshake = vec![0x01, 0x00];
    handshake.extend(u16::try_from(body.len()).unwrap().to_be_bytes());
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend(u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend(handshake);
    record
}

/// Sends `bytes` and reads what comes back until the server closes or, when it waits for
/// more, for a second.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read_to_end(&mut answer)).await;
    answer
}

#[tokio::test]
async fn tls_1_1_and_plain_http_are_refused() {
    let pki = Pki::new("test CA");
    let server = TlsServer::new(serving(&pki.leaf(&["localhost"])), ClientAuth::None).unwrap();
    let running = start(server).await;

    let answer = exchange(running.addr, &client_hello([3, 2])).await;
    // One alert record (21): fatal (2), protocol_version (70); no ServerHello.
    assert_eq!(answer, [21, 3, 3, 0, 2, 2, 70]);
    // The same hello as TLS 1.2 is answered with a ServerHello (a handshake record, 22).
    let answer = exchange(running.addr, &client_hello([3, 3])).await;
    assert_eq!(answer.first(), Some(&22), "{answer:?}");

    let answer = exchange(running.addr, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");

    assert_eq!(
        fetch(&Client::trusting(&pki.ca_pem), running.addr, "/")
            .await
            .1,
        "ok",
        "refusals leave the server serving"
    );
    running.stop.cancel();
    running.task.await.unwrap();
}

#[tokio::test]
async fn a_stalled_handshake_blocks_nobody_and_is_cut_at_its_deadline() {
    let pki = Pki::new("test CA");
    let timeouts = Timeouts {
        handshake: Duration::from_millis(800),
        ..Timeouts::default()
    };
    let server = TlsServer::new(serving(&pki.leaf(&["localhost"])), ClientAuth::None)
        .unwrap()
        .with_timeouts(timeouts);
    let running = start(server).await;

    // Half a ClientHello, then silence.
    let mut stalled = TcpStream::connect(running.addr).await.unwrap();
    stalled
        .write_all(&client_hello([3, 3])[..20])
        .await
        .unwrap();
    let stalled_at = Instant::now();

    let started = Instant::now();
    assert_eq!(
        fetch(&Client::trusting(&pki.ca_pem), running.addr, "/")
            .await
            .1,
        "ok"
    );
    let served_in = started.elapsed();
    assert!(
        served_in < timeouts.handshake,
        "served in {served_in:?} beside a stalled client"
    );

    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stalled.read_to_end(&mut rest))
        .await
        .expect("the stalled client is disconnected");
    let cut_after = stalled_at.elapsed();
    assert!(
        cut_after >= timeouts.handshake && cut_after < timeouts.handshake * 3,
        "cut after {cut_after:?}"
    );
    running.stop.cancel();
    running.task.await.unwrap();
}

#[tokio::test]
async fn a_stop_lets_requests_in_flight_finish_and_cuts_them_at_the_drain_deadline() {
    let pki = Pki::new("test CA");
    let client = Client::trusting(&pki.ca_pem);
    for (drain, finishes) in [
        (Duration::from_secs(5), true),
        (Duration::from_millis(100), false),
    ] {
        let server = TlsServer::new(serving(&pki.leaf(&["localhost"])), ClientAuth::None)
            .unwrap()
            .with_timeouts(Timeouts {
                drain,
                ..Timeouts::default()
            });
        let running = start(server).await;
        let mut http = Http::over(client.connect(running.addr).await.unwrap()).await;
        let in_flight = tokio::spawn(async move { http.get("/slow").await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped = Instant::now();
        running.stop.cancel();
        let answer = in_flight.await.unwrap();
        running.task.await.unwrap();
        let took = stopped.elapsed();
        if finishes {
            assert_eq!(answer.unwrap().1, "slow");
        } else {
            assert!(answer.is_err(), "cut at the deadline: {answer:?}");
        }
        assert!(took < Duration::from_secs(2), "stopped in {took:?}");
        assert!(
            client.connect(running.addr).await.is_err(),
            "no longer accepting"
        );
    }
}

#[tokio::test]
async fn a_client_verifier_plugs_in_and_the_handler_sees_the_client_certificate() {
    let (server_ca, client_ca) = (Pki::new("server CA"), Pki::new("client CA"));
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(client_ca.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(crate::crypto_provider()),
    )
    .allow_unauthenticated()
    .build()
    .unwrap();
    let server = TlsServer::new(
        serving(&server_ca.leaf(&["localhost"])),
        ClientAuth::Verify(verifier),
    )
    .unwrap();
    let running = start(server).await;

    let anonymous = Client::trusting(&server_ca.ca_pem);
    assert_eq!(
        fetch(&anonymous, running.addr, "/peer").await.1,
        "0 certificate(s) from 127.0.0.1"
    );
    let known = Client {
        identity: Some(client_ca.client("system:node:vn-0")),
        ..Client::trusting(&server_ca.ca_pem)
    };
    assert_eq!(
        fetch(&known, running.addr, "/peer").await.1,
        "1 certificate(s) from 127.0.0.1"
    );
    let stranger = Client {
        identity: Some(server_ca.client("stranger")),
        ..Client::trusting(&server_ca.ca_pem)
    };
    let refused = match stranger.connect(running.addr).await {
        // TLS 1.3: the client learns of the refusal at its first read.
        Ok(stream) => Http::over(stream).await.get("/peer").await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a certificate from another CA is refused");
    running.stop.cancel();
    running.task.await.unwrap();
}

/// A handler that takes the connection over after `101 Switching Protocols` (as SPDY and
/// WebSocket streams of the kubelet API do) and echoes what it reads.
fn upgrading_router() -> Router {
    Router::new().route(
        "/echo",
        get(|mut request: axum::extract::Request| async move {
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let mut io = hyper_util::rt::TokioIo::new(upgrade.await.unwrap());
                let mut buffer = [0_u8; 64];
                let read = io.read(&mut buffer).await.unwrap();
                io.write_all(&buffer[..read]).await.unwrap();
                io.shutdown().await.unwrap();
            });
            axum::response::Response::builder()
                .status(hyper::StatusCode::SWITCHING_PROTOCOLS)
                .header(hyper::header::CONNECTION, "Upgrade")
                .header(hyper::header::UPGRADE, "echo")
                .body(axum::body::Body::empty())
                .unwrap()
        }),
    )
}

#[tokio::test]
async fn an_http1_upgrade_hands_the_connection_to_the_handler() {
    let pki = Pki::new("test CA");
    let server = TlsServer::new(serving(&pki.leaf(&["localhost"])), ClientAuth::None).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { server.serve(listener, upgrading_router(), stop).await }
    });

    let mut stream = Client::trusting(&pki.ca_pem).connect(addr).await.unwrap();
    stream
        .write_all(b"GET /echo HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0_u8; 1];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "{head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream.write_all(b"through the upgrade").await.unwrap();
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"through the upgrade");

    stop.cancel();
    task.await.unwrap();
}

/// A plain server with short limits, echoing the length of the body it reads.
async fn limited(limits: crate::Limits) -> (SocketAddr, CancellationToken) {
    let app = Router::new().route(
        "/echo",
        axum::routing::post(|body: Bytes| async move { body.len().to_string() }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let serving = stop.clone();
    tokio::spawn(async move {
        crate::PlainServer::new(limits)
            .serve(listener, app, serving)
            .await;
    });
    (addr, stop)
}

/// Sends `bytes`, then reads until the server closes (or 10 s pass): what it answered and
/// when it closed.
async fn send_and_wait_for_close(addr: SocketAddr, bytes: &[u8]) -> (String, Option<Duration>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .ok()
        .map(|_| started.elapsed());
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

#[tokio::test]
async fn a_slow_or_oversized_request_is_answered_or_cut_before_it_is_buffered() {
    let limits = crate::Limits {
        connections: 8,
        header_read: Duration::from_millis(300),
        body_bytes: 1024,
        body_read: Duration::from_millis(300),
        buffered_bytes: 4096,
    };
    let (addr, stop) = limited(limits).await;
    let post = |length: usize| {
        format!("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n").into_bytes()
    };
    type Check = fn(&str) -> bool;
    let cases: [(&str, Vec<u8>, Check); 4] = [
        (
            "a body within the limit",
            [post(3), b"abc".to_vec()].concat(),
            |a| a.starts_with("HTTP/1.1 200") && a.ends_with('3'),
        ),
        // Answered at once, not a byte of the body read.
        (
            "a declared body over the limit",
            post(8 * 1024 * 1024),
            |a| a.starts_with("HTTP/1.1 413"),
        ),
        (
            "a body that stalls",
            [post(1000), b"abc".to_vec()].concat(),
            |a| a.starts_with("HTTP/1.1 400"),
        ),
        (
            "a head that stalls",
            b"POST /echo HTTP/1.1\r\nHost:".to_vec(),
            |a| !a.contains("200"),
        ),
    ];
    for (what, bytes, answered) in cases {
        let (answer, closed) = send_and_wait_for_close(addr, &bytes).await;
        assert!(answered(&answer), "{what}: {answer:?}");
        // The server closes: at once, or at the deadline (with room for a slow machine).
        let closed = closed.unwrap_or_else(|| panic!("{what}: still open after 10 s"));
        assert!(
            closed < Duration::from_secs(5),
            "{what}: closed after {closed:?}"
        );
    }
    stop.cancel();
}
