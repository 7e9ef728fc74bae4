//! mock-eci's OpenAPI front: the same fake ECI, spoken over HTTPS the way Alibaba Cloud's
//! RPC-style API is — signed form POSTs (signature version 1.0) answered with JSON — so the
//! daemon's real OpenAPI client runs against it unchanged.
//!
//! Every request is checked as the service checks it: API version, signature method, a known
//! AccessKey id, the STS token when one is configured, a timestamp within 15 minutes, a nonce
//! never seen in that window, and the signature itself (a mismatch answers
//! `SignatureDoesNotMatch` with the string the server signed). Parameters the service does not
//! define for the action (the official SDK's name table) are refused with `InvalidParameter`
//! naming them; the rest are decoded into the contract's request (documented parameters the fake
//! does not model are ignored, as a service ignoring a feature would) and served by the gRPC
//! service's own implementation, throttling and injected faults included. Answers take the
//! service's shapes ([`answer`]).

pub mod answer;
pub mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use eci_proto::EciError;
use eci_proto::openapi::signature::{SIGNATURE_METHOD, SIGNATURE_VERSION, verify};
use eci_proto::openapi::{API_VERSION, documented};
use eci_proto::v20180808::eci_server::Eci;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{Value, json};
use tls_serve::{ClientAuth, ReloadableCertificate, Timeouts, TlsServer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::service::MockEci;

/// How many requests [`OpenApiFront::recorded`] keeps.
pub const RECORDED_REQUESTS: usize = 1000;

/// How far a request's timestamp may be from the server's clock.
const TIMESTAMP_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The AccessKey the front accepts.
#[derive(Debug, Clone)]
pub struct FrontCredentials {
    /// The AccessKey id.
    pub access_key_id: String,
    /// The AccessKey secret.
    pub access_key_secret: String,
    /// When set, every request must carry this `SecurityToken` (an STS key).
    pub security_token: Option<String>,
}

/// A request as the front received it, for tests to inspect.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// GET or POST.
    pub method: String,
    /// Every parameter, `Signature` included.
    pub params: Vec<(String, String)>,
}

/// How often nonces older than the timestamp window are forgotten.
const NONCE_PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// Nonces seen within the timestamp window.
#[derive(Debug)]
struct Nonces {
    seen: HashMap<String, SystemTime>,
    pruned: SystemTime,
}

#[derive(Debug)]
struct Front {
    mock: MockEci,
    credentials: FrontCredentials,
    nonces: Mutex<Nonces>,
    recorded: Mutex<std::collections::VecDeque<Recorded>>,
}

/// The front, serving in the background.
#[derive(Debug)]
pub struct OpenApiFront {
    addr: SocketAddr,
    ca_pem: String,
    front: Arc<Front>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// The front could not start.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// The certificate could not be generated.
    #[error("cannot generate the OpenAPI front's certificate")]
    Certificate(#[source] rcgen::Error),
    /// TLS could not be set up.
    #[error("cannot set up TLS for the OpenAPI front")]
    Tls(#[source] tls_serve::ServerError),
    /// The TLS directory could not be written.
    #[error("cannot write {path} (--openapi-tls-dir)")]
    TlsDir {
        /// The file or directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate and key in the TLS directory are unusable.
    #[error("unusable certificate or key in --openapi-tls-dir")]
    Pem(#[source] tls_serve::CertificateError),
    /// The listener has no address.
    #[error("the OpenAPI listener has no address")]
    Address(#[source] std::io::Error),
}

impl OpenApiFront {
    /// Serves `mock` over HTTPS on `listener`. The certificate names `localhost` and
    /// `127.0.0.1` and comes from `tls_dir` (`ca.pem`, `tls.crt`, `tls.key`) when that holds
    /// one; otherwise it is generated, with its CA (see [`Self::ca_pem`]), and written there.
    pub fn start(
        listener: TcpListener,
        mock: MockEci,
        credentials: FrontCredentials,
        tls_dir: Option<&Path>,
    ) -> Result<Self, FrontError> {
        let addr = listener.local_addr().map_err(FrontError::Address)?;
        let (ca_pem, server) = tls(tls_dir)?;
        let front = Arc::new(Front {
            mock,
            credentials,
            nonces: Mutex::new(Nonces {
                seen: HashMap::new(),
                pruned: SystemTime::now(),
            }),
            recorded: Mutex::new(std::collections::VecDeque::new()),
        });
        let router = Router::new()
            .route("/", axum::routing::any(handle))
            .with_state(front.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let stop = shutdown.clone();
            async move { server.serve(listener, router, stop).await }
        });
        tracing::info!(%addr, "OpenAPI front serving (HTTPS)");
        Ok(Self {
            addr,
            ca_pem,
            front,
            shutdown,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA certificate (PEM) clients must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The latest requests received (at most [`RECORDED_REQUESTS`]), oldest first.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.front
            .recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Stops serving.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// The files of `--openapi-tls-dir`.
const CA_FILE: &str = "ca.pem";
const CERT_FILE: &str = "tls.crt";
const KEY_FILE: &str = "tls.key";

/// PEM of a CA, and of a serving certificate and key it signed.
struct Material {
    ca: String,
    cert: String,
    key: String,
}

fn generate() -> Result<Material, FrontError> {
    let ca_key = KeyPair::generate().map_err(FrontError::Certificate)?;
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(FrontError::Certificate)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "mock-eci OpenAPI CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(FrontError::Certificate)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(FrontError::Certificate)?;
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .map_err(FrontError::Certificate)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(FrontError::Certificate)?;
    Ok(Material {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// The material in `dir` when it is all there (a restart keeps its CA, so clients keep
/// trusting it), else fresh material, written to `dir` when one is given.
fn material(dir: Option<&Path>) -> Result<Material, FrontError> {
    if let Some(dir) = dir {
        let read = |name| std::fs::read_to_string(dir.join(name));
        if let (Ok(ca), Ok(cert), Ok(key)) = (read(CA_FILE), read(CERT_FILE), read(KEY_FILE)) {
            return Ok(Material { ca, cert, key });
        }
    }
    let material = generate()?;
    if let Some(dir) = dir {
        let write = |name, text: &str| {
            std::fs::write(dir.join(name), text).map_err(|source| FrontError::TlsDir {
                path: dir.join(name),
                source,
            })
        };
        std::fs::create_dir_all(dir).map_err(|source| FrontError::TlsDir {
            path: dir.to_owned(),
            source,
        })?;
        write(KEY_FILE, &material.key)?;
        write(CERT_FILE, &material.cert)?;
        write(CA_FILE, &material.ca)?;
    }
    Ok(material)
}

fn tls(dir: Option<&Path>) -> Result<(String, TlsServer), FrontError> {
    let material = material(dir)?;
    let certificate =
        ReloadableCertificate::from_pem(material.cert.as_bytes(), material.key.as_bytes())
            .map_err(FrontError::Pem)?;
    let server = TlsServer::new(Arc::new(certificate), ClientAuth::None)
        .map_err(FrontError::Tls)?
        // A stop comes from a test or a shutting-down fake: requests in flight (an injected
        // delay included) get a short grace, not a production drain.
        .with_timeouts(Timeouts {
            drain: Duration::from_secs(2),
            ..Timeouts::default()
        });
    Ok((material.ca, server))
}

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string().to_uppercase()
}

/// The HTTP status the service uses for an error code's family.
fn http_status(error: &EciError) -> StatusCode {
    match error.grpc_code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::PermissionDenied | tonic::Code::FailedPrecondition => StatusCode::FORBIDDEN,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        tonic::Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn error_response(error: &EciError) -> Response {
    if error.code == eci_proto::error::codes::FOREIGN_RESPONSE {
        // An injected proxy refusal: an HTML page, as a gateway or captive portal answers.
        return (
            StatusCode::FORBIDDEN,
            [(axum::http::header::CONTENT_TYPE, "text/html")],
            "<html><body><h1>403 Forbidden</h1>Access denied by proxy (simulated)</body></html>",
        )
            .into_response();
    }
    let request_id = if error.request_id.is_empty() {
        request_id()
    } else {
        error.request_id.clone()
    };
    (
        http_status(error),
        Json(json!({
            "RequestId": request_id,
            "HostId": "mock-eci",
            "Code": error.code,
            "Message": error.message,
            "Recommend": "https://api.aliyun.com/troubleshoot",
        })),
    )
        .into_response()
}

impl Front {
    /// Refuses a request the real gateway would: wrong protocol, unknown caller, stale time,
    /// bad signature or replayed nonce, in that order.
    fn check(&self, method: &str, params: &[(String, String)]) -> Result<(), EciError> {
        check_protocol(params)?;
        self.check_caller(params)?;
        let now = check_timestamp(params)?;
        let nonce = required(params, "SignatureNonce")?;
        required(params, "Signature")?;
        verify(method, params, &self.credentials.access_key_secret).map_err(|expected| {
            EciError::new(
                "SignatureDoesNotMatch",
                format!("Specified signature is not matched with our calculation. server string to sign is:{expected}"),
            )
        })?;
        self.remember_nonce(nonce, now)
    }

    /// The caller's `AccessKeyId`, and `SecurityToken` when the credentials have one, are
    /// the served ones.
    fn check_caller(&self, params: &[(String, String)]) -> Result<(), EciError> {
        if required(params, "AccessKeyId")? != self.credentials.access_key_id {
            return Err(EciError::new(
                "InvalidAccessKeyId.NotFound",
                "Specified access key is not found.",
            ));
        }
        if let Some(token) = &self.credentials.security_token {
            if param(params, "SecurityToken") != Some(token.as_str()) {
                return Err(EciError::new(
                    "InvalidSecurityToken.Mismatch",
                    "Specified SecurityToken is invalid.",
                ));
            }
        }
        Ok(())
    }

    /// Records `nonce` as used at `now`; a nonce seen within the timestamp window is a replay.
    fn remember_nonce(&self, nonce: &str, now: SystemTime) -> Result<(), EciError> {
        let mut nonces = self.nonces.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget nonces older than the window once a minute, not on every request.
        if now.duration_since(nonces.pruned).unwrap_or_default() > NONCE_PRUNE_INTERVAL {
            nonces
                .seen
                .retain(|_, seen| now.duration_since(*seen).unwrap_or_default() < TIMESTAMP_WINDOW);
            nonces.pruned = now;
        }
        if nonces.seen.insert(nonce.to_owned(), now).is_some() {
            return Err(EciError::new(
                "SignatureNonceUsed",
                "Specified signature nonce was used already.",
            ));
        }
        Ok(())
    }
}

/// The value of the parameter `name`, if given.
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The value of the parameter `name`, which must be given.
fn required<'a>(params: &'a [(String, String)], name: &str) -> Result<&'a str, EciError> {
    param(params, name).ok_or_else(|| {
        EciError::new(
            "MissingParameter",
            format!("The input parameter \"{name}\" that is mandatory for processing this request is not supplied."),
        )
    })
}

/// `Version`, `Format` and the signature method are the ones served.
fn check_protocol(params: &[(String, String)]) -> Result<(), EciError> {
    if required(params, "Version")? != API_VERSION {
        return Err(EciError::new(
            "InvalidVersion",
            format!("Specified parameter Version is not valid; ECI serves {API_VERSION}."),
        ));
    }
    // The generated SDKs send `json`, the older ones `JSON`.
    if !required(params, "Format")?.eq_ignore_ascii_case("JSON") {
        return Err(EciError::new(
            "InvalidParameter.Format",
            "this fake answers JSON only",
        ));
    }
    if required(params, "SignatureMethod")? != SIGNATURE_METHOD
        || required(params, "SignatureVersion")? != SIGNATURE_VERSION
    {
        return Err(EciError::new(
            "InvalidParameter.SignatureMethod",
            "Only HMAC-SHA1 signature version 1.0 is served.",
        ));
    }
    Ok(())
}

/// `Timestamp` is well formed and within the window of now; returns now.
fn check_timestamp(params: &[(String, String)]) -> Result<SystemTime, EciError> {
    let timestamp = required(params, "Timestamp")?;
    let sent = humantime::parse_rfc3339(timestamp).map_err(|_| {
        EciError::new(
            "InvalidTimeStamp.Format",
            "Specified time stamp or date value is not well formatted.",
        )
    })?;
    let now = SystemTime::now();
    let skew = now
        .duration_since(sent)
        .or_else(|_| sent.duration_since(now))
        .unwrap_or_default();
    if skew > TIMESTAMP_WINDOW {
        return Err(EciError::new(
            "InvalidTimeStamp.Expired",
            "Specified time stamp or date value is expired.",
        ));
    }
    Ok(now)
}

/// `params` as `action`'s request; documented parameters the contract does not carry are
/// ignored (the front refused undocumented ones already).
fn decoded<T: serde::de::DeserializeOwned>(
    action: &str,
    params: &[(String, String)],
) -> Result<T, EciError> {
    // The Python SDK writes booleans `True`/`False`, the others `true`/`false`: the service
    // takes either.
    let params: Vec<(String, String)> = params
        .iter()
        .map(|(name, value)| {
            let boolean =
                documented::request_parameter(action, name) == Some(documented::Kind::Bool);
            let value = if boolean {
                value.to_ascii_lowercase()
            } else {
                value.clone()
            };
            (name.clone(), value)
        })
        .collect();
    let decoded = wire::decode_lenient(&params)
        .map_err(|problem| EciError::new("InvalidParameter", format!("{action}: {problem}")))?;
    if !decoded.unmodelled.is_empty() {
        debug!(action, ignored = ?decoded.unmodelled, "documented parameters this fake does not model");
    }
    Ok(decoded.request)
}

macro_rules! dispatch {
    ($front:expr, $action:expr, $params:expr, { $($name:literal => $method:ident => $encode:path,)+ }) => {
        match $action {
            $($name => {
                let request = decoded($name, $params)?;
                $front
                    .mock
                    .$method(tonic::Request::new(request))
                    .await
                    .map(|response| $encode(&response.into_inner()))
                    .map_err(|status| EciError::from_status(&status))
            })+
            "DescribeContainerGroupStatus" => {
                let request = decoded("DescribeContainerGroupStatus", $params)?;
                $front
                    .mock
                    .describe_container_group_status(tonic::Request::new(request))
                    .await
                    .map(|response| wire::encode_status(&response.into_inner()))
                    .map_err(|status| EciError::from_status(&status))
            }
            other => Err(EciError::new(
                "InvalidAction.NotFound",
                format!("Specified api {other:?} is not found, please check your url and method."),
            )),
        }
    };
}

async fn serve_action(
    front: &Front,
    action: &str,
    params: &[(String, String)],
) -> Result<Value, EciError> {
    dispatch!(front, action, params, {
        "CreateContainerGroup" => create_container_group => wire::encode,
        "DescribeContainerGroups" => describe_container_groups => answer::describe_container_groups,
        "DeleteContainerGroup" => delete_container_group => wire::encode,
        "UpdateContainerGroup" => update_container_group => wire::encode,
        "RestartContainerGroup" => restart_container_group => wire::encode,
        "DescribeContainerLog" => describe_container_log => wire::encode,
        "ExecContainerCommand" => exec_container_command => wire::encode,
        "DescribeContainerGroupMetric" => describe_container_group_metric => answer::describe_container_group_metric,
        "DescribeMultiContainerGroupMetric" => describe_multi_container_group_metric => answer::describe_multi_container_group_metric,
        "CreateImageCache" => create_image_cache => wire::encode,
        "DescribeImageCaches" => describe_image_caches => wire::encode,
        "UpdateImageCache" => update_image_cache => wire::encode,
        "DeleteImageCache" => delete_image_cache => wire::encode,
    })
}

/// Refuses parameters the service does not define for `action` (the official SDK's name table,
/// `eci_proto::openapi::documented`), naming them. Stricter than the service, which may ignore
/// an unknown name: here that would hide a client bug that the real service would turn into a
/// silently different instance.
fn undocumented(action: &str, params: &[(String, String)]) -> Result<(), EciError> {
    if !documented::actions().contains(&action) {
        // Answered by the dispatch (`InvalidAction.NotFound`).
        return Ok(());
    }
    let unknown: Vec<&str> = params
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !documented::accepts_parameter(action, name))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(EciError::new(
        "InvalidParameter",
        format!(
            "{action}: parameter(s) the service does not define: {}",
            unknown.join(", ")
        ),
    ))
}

async fn handle(
    State(front): State<Arc<Front>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let mut params: Vec<(String, String)> = uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    if method == Method::POST {
        params.extend(form_urlencoded::parse(&body).into_owned());
    }
    {
        let mut recorded = front
            .recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if recorded.len() == RECORDED_REQUESTS {
            recorded.pop_front();
        }
        recorded.push_back(Recorded {
            method: method.to_string(),
            params: params.clone(),
        });
    }
    if let Err(error) = front.check(method.as_str(), &params) {
        debug!(code = %error.code, "OpenAPI request refused");
        return error_response(&error);
    }
    let action = params
        .iter()
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    if let Err(error) = undocumented(&action, &params) {
        debug!(code = %error.code, %action, "OpenAPI request refused");
        return error_response(&error);
    }
    match serve_action(&front, &action, &params).await {
        Ok(body) => Json(body).into_response(),
        Err(error) => error_response(&error),
    }
}
