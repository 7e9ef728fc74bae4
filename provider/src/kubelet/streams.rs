//! The kubelet's streaming endpoints (`/exec`, `/attach`, `/portForward`): routes are added
//! here and merged by `kubelet::router`, behind its authentication and authorization.
//!
//! Each request is upgraded in place (hyper's upgrade; tls-serve serves HTTP/1.1 with
//! upgrades): `Upgrade: SPDY/3.1` (what the apiserver speaks to kubelets, [`super::spdy`]) or
//! `Upgrade: websocket` (the channel protocols, for clients that call the kubelet directly).
//! `exec` bridges the streams to ECI's `ExecContainerCommand` session ([`exec`]);
//! `portForward` carries each connection to the container group's IP ([`portforward`]).

mod exec;
mod portforward;
mod websocket;

pub use self::exec::complete_json_values;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::{Instrument as _, debug, warn};

use super::KubeletState;
use super::pod_lookup::LookupError;

/// The remotecommand protocols over SPDY, newest first (`X-Stream-Protocol-Version`).
pub const EXEC_PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// The port-forward protocol over SPDY.
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";
/// The header both sides name their protocol in.
const PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// A streaming request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The pod or container is not here.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The query asks for nothing or for something malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The request is not an upgrade this side speaks.
    #[error("Upgrade request required: Upgrade: SPDY/3.1 or websocket")]
    NoUpgrade,
    /// No protocol both sides speak.
    #[error(
        "unable to upgrade: unable to negotiate protocol: client supports {client:?}, server supports {server:?}"
    )]
    Protocol {
        /// What the client offered.
        client: Vec<String>,
        /// What we serve.
        server: Vec<&'static str>,
    },
}

impl IntoResponse for StreamError {
    fn into_response(self) -> Response {
        let status = match self {
            Self::Lookup(error) => return error.into_response(),
            Self::BadRequest(_) | Self::NoUpgrade => StatusCode::BAD_REQUEST,
            Self::Protocol { .. } => StatusCode::FORBIDDEN,
        };
        (status, self.to_string()).into_response()
    }
}

/// The streaming routes: GET and POST, with and without the pod's uid.
pub fn routes() -> Router<KubeletState> {
    Router::new()
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(exec_route).post(exec_route),
        )
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(exec_uid_route).post(exec_uid_route),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach_route).post(attach_route),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(attach_uid_route).post(attach_uid_route),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(port_forward_route).post(port_forward_route),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(port_forward_uid_route).post(port_forward_uid_route),
        )
}

/// What an exec or attach asks for (the kubelet's query parameters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// `command`, repeated, each argument exactly as given.
    pub command: Vec<String>,
    /// `input` (or `stdin`).
    pub stdin: bool,
    /// `output` (or `stdout`).
    pub stdout: bool,
    /// `error` (or `stderr`); never with a TTY (the terminal merges it into stdout).
    pub stderr: bool,
    /// `tty`.
    pub tty: bool,
}

impl ExecOptions {
    /// Reads the query as the kubelet does; `exec` needs a command, both need a stream.
    pub fn parse(query: &str, exec: bool) -> Result<Self, StreamError> {
        let mut options = Self::default();
        let truthy = |value: &str| matches!(value, "1" | "true" | "True" | "TRUE");
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "command" => options.command.push(value.into_owned()),
                "input" | "stdin" => options.stdin = truthy(&value),
                "output" | "stdout" => options.stdout = truthy(&value),
                "error" | "stderr" => options.stderr = truthy(&value),
                "tty" => options.tty = truthy(&value),
                _ => {}
            }
        }
        if options.tty {
            options.stderr = false;
        }
        if !options.stdin && !options.stdout && !options.stderr {
            return Err(StreamError::BadRequest(
                "you must specify at least 1 of stdin, stdout, stderr".into(),
            ));
        }
        if exec && options.command.is_empty() {
            return Err(StreamError::BadRequest(
                "you must specify a command (the command parameter)".into(),
            ));
        }
        Ok(options)
    }
}

/// The ports a WebSocket port-forward asks for (`?ports=80,443`; `port` and `ports`, repeated
/// or comma-joined): at least one and at most 127, as each takes two of the one-byte channels.
/// Pure, so the fuzz target `kubelet_request` calls it.
pub fn forwarded_ports(query: Option<&str>) -> Result<Vec<u16>, StreamError> {
    let ports: Result<Vec<u16>, _> = query
        .map(|query| {
            form_urlencoded::parse(query.as_bytes())
                .filter(|(key, _)| key == "ports" || key == "port")
                .flat_map(|(_, value)| {
                    value
                        .split(',')
                        .map(|port| port.trim().parse::<u16>())
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .unwrap_or_else(|| Ok(Vec::new()));
    match ports {
        Ok(ports) if !ports.is_empty() && ports.len() <= 127 => Ok(ports),
        _ => Err(StreamError::BadRequest(
            "query parameter \"port\" is required: a comma-separated list of ports".into(),
        )),
    }
}

/// Which upgrade the client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// `Upgrade: SPDY/3.1`.
    Spdy,
    /// `Upgrade: websocket`.
    WebSocket,
}

/// The upgrade asked for, if any.
pub fn upgrade_kind(headers: &HeaderMap) -> Option<Upgrade> {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|token| match token.trim().to_ascii_lowercase().as_str() {
            "spdy/3.1" => Some(Upgrade::Spdy),
            "websocket" => Some(Upgrade::WebSocket),
            _ => None,
        })
}

/// The protocols the client offers in `X-Stream-Protocol-Version` (repeated or comma-joined).
pub fn offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|protocol| protocol.trim().to_owned())
        .filter(|protocol| !protocol.is_empty())
        .collect()
}

/// The newest of `server` (newest first) that the client offers; a client that offers
/// nothing gets the oldest, as the kubelet's handshake does.
pub fn negotiate(client: &[String], server: &[&'static str]) -> Result<&'static str, StreamError> {
    if client.is_empty() {
        return server.last().copied().ok_or(StreamError::NoUpgrade);
    }
    server
        .iter()
        .copied()
        .find(|protocol| client.iter().any(|offered| offered == protocol))
        .ok_or_else(|| StreamError::Protocol {
            client: client.to_vec(),
            server: server.to_vec(),
        })
}

/// The 101 answer to a SPDY upgrade, naming the protocol chosen.
fn switching_to_spdy(protocol: &str) -> Response {
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Ok(value) = HeaderValue::from_str(protocol) {
        headers.insert(PROTOCOL_HEADER, value);
    }
    response
}

/// The pod's uid, when the path names one, must be the pod's.
fn check_uid(uid: Option<&str>, target: &super::pod_lookup::Target) -> Result<(), StreamError> {
    match uid {
        Some(uid) if uid != target.uid => Err(StreamError::Lookup(LookupError::NoPod {
            namespace: target.namespace.clone(),
            name: target.pod.clone(),
        })),
        _ => Ok(()),
    }
}

async fn exec_route(
    State(state): State<KubeletState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    remote_command(state, (namespace, pod, None, container), true, request).await
}

async fn exec_uid_route(
    State(state): State<KubeletState>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    remote_command(state, (namespace, pod, Some(uid), container), true, request).await
}

async fn attach_route(
    State(state): State<KubeletState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    remote_command(state, (namespace, pod, None, container), false, request).await
}

async fn attach_uid_route(
    State(state): State<KubeletState>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    remote_command(
        state,
        (namespace, pod, Some(uid), container),
        false,
        request,
    )
    .await
}

async fn port_forward_route(
    State(state): State<KubeletState>,
    Path((namespace, pod)): Path<(String, String)>,
    request: Request,
) -> Response {
    portforward::serve(state, namespace, pod, None, request).await
}

async fn port_forward_uid_route(
    State(state): State<KubeletState>,
    Path((namespace, pod, uid)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    portforward::serve(state, namespace, pod, Some(uid), request).await
}

/// exec (`is_exec`) or attach: checks, upgrades, and runs the session on its own task.
async fn remote_command(
    state: KubeletState,
    (namespace, pod, uid, container): (String, String, Option<String>, String),
    is_exec: bool,
    mut request: Request,
) -> Response {
    // Read before any await: a request is not Sync, so no future may hold a reference to it.
    let options = ExecOptions::parse(request.uri().query().unwrap_or_default(), is_exec);
    let upgrade = upgrade_kind(request.headers()).ok_or(StreamError::NoUpgrade);
    let prepared = async {
        let (options, upgrade) = (options?, upgrade?);
        let (_, target) = state.locate(&namespace, &pod, &container).await?;
        check_uid(uid.as_deref(), &target)?;
        Ok::<_, StreamError>((options, upgrade, target))
    }
    .await;
    let (options, upgrade, target) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            debug!(error = %crate::ops::chain::Chain(&error), "exec/attach refused");
            return error.into_response();
        }
    };
    let command = if is_exec {
        exec::Command::Exec(options.command.clone())
    } else {
        exec::Command::Attach
    };
    match upgrade {
        Upgrade::Spdy => {
            let protocol = match negotiate(&offered(request.headers()), &EXEC_PROTOCOLS) {
                Ok(protocol) => protocol,
                Err(error) => return error.into_response(),
            };
            let on_upgrade = hyper::upgrade::on(&mut request);
            let session = async move {
                match on_upgrade.await {
                    Ok(upgraded) => {
                        let connection =
                            super::spdy::Connection::serve(hyper_util::rt::TokioIo::new(upgraded));
                        exec::serve_spdy(state, target, options, command, protocol, connection)
                            .await;
                    }
                    Err(error) => warn!(%error, "the SPDY upgrade failed"),
                }
            };
            tokio::spawn(session.instrument(tracing::Span::current()));
            switching_to_spdy(protocol)
        }
        Upgrade::WebSocket => websocket::serve_exec(state, target, options, command, request).await,
    }
}

#[cfg(test)]
mod tests;
