//! Port-forward: each forwarded connection carried to the container group's intranet IP.
//!
//! Over SPDY (`portforward.k8s.io`) the client opens a pair of streams per connection, `error`
//! and `data`, sharing a `requestID` and naming the `port`; bytes go both ways on `data`
//! (half-closes passed on), and a failure to connect is written on `error`, as the kubelet
//! words it. The WebSocket form (`?ports=…`, a data and an error channel per port, each opened
//! by the port as two little-endian bytes) is in [`super::websocket`].

use std::collections::HashMap;
use std::net::IpAddr;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use eci_proto::v20180808::DescribeContainerGroupsRequest;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tracing::{Instrument as _, debug, info, warn};

use super::super::KubeletState;
use super::super::pod_lookup::LookupError;
use super::super::spdy::{Connection, Stream};
use super::{PORT_FORWARD_PROTOCOL, StreamError, Upgrade, negotiate, offered, upgrade_kind};

/// Where the pod's ports are.
#[derive(Debug, Clone)]
pub(super) struct PodAddress {
    /// `<namespace>/<name>`, for messages.
    pub(super) pod: String,
    /// The pod's uid.
    pub(super) uid: String,
    /// The group's intranet IP.
    pub(super) ip: IpAddr,
}

/// `/portForward/{namespace}/{pod}[/{uid}]`.
pub(super) async fn serve(
    state: KubeletState,
    namespace: String,
    pod: String,
    uid: Option<String>,
    mut request: Request,
) -> Response {
    // Read before any await: a request is not Sync, so no future may hold a reference to it.
    let upgrade = upgrade_kind(request.headers()).ok_or(StreamError::NoUpgrade);
    let prepared = async {
        let upgrade = upgrade?;
        let address = locate(&state, &namespace, &pod, uid.as_deref()).await?;
        Ok::<_, StreamError>((upgrade, address))
    }
    .await;
    let (upgrade, address) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    match upgrade {
        Upgrade::Spdy => {
            if let Err(error) = negotiate(&offered(request.headers()), &[PORT_FORWARD_PROTOCOL]) {
                return error.into_response();
            }
            let on_upgrade = hyper::upgrade::on(&mut request);
            let session = async move {
                match on_upgrade.await {
                    Ok(upgraded) => {
                        let connection = Connection::serve(hyper_util::rt::TokioIo::new(upgraded));
                        serve_spdy(address, connection).await;
                    }
                    Err(error) => warn!(%error, "the SPDY upgrade failed"),
                }
            };
            tokio::spawn(session.instrument(tracing::Span::current()));
            let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            headers.insert(
                "x-stream-protocol-version",
                HeaderValue::from_static(PORT_FORWARD_PROTOCOL),
            );
            response
        }
        Upgrade::WebSocket => super::websocket::serve_port_forward(state, address, request).await,
    }
}

async fn locate(
    state: &KubeletState,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<PodAddress, StreamError> {
    let no_pod = || {
        StreamError::Lookup(LookupError::NoPod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    };
    let pod = state
        .pod_on_this_node(namespace, name)
        .await?
        .ok_or_else(no_pod)?;
    let first = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let (_, target) = state.locate(namespace, name, &first).await?;
    if uid.is_some_and(|uid| uid != target.uid) {
        return Err(no_pod());
    }
    let request = DescribeContainerGroupsRequest {
        region_id: state.config.site.region.clone(),
        container_group_ids: vec![target.group_id.clone()],
        ..DescribeContainerGroupsRequest::default()
    };
    let groups = target
        .lane()
        .run(state.eci.describe_container_groups(request))
        .await
        .map_err(|source| {
            StreamError::Lookup(LookupError::Eci {
                pod: format!("{namespace}/{name}"),
                source,
            })
        })?;
    let ip = groups
        .container_groups
        .first()
        .and_then(|group| group.intranet_ip.parse().ok())
        .ok_or_else(|| {
            StreamError::BadRequest(format!(
                "pod {namespace}/{name} has no IP yet: its ECI container group is not running"
            ))
        })?;
    Ok(PodAddress {
        pod: format!("{namespace}/{name}"),
        uid: target.uid,
        ip,
    })
}

/// Pairs the client's streams by `requestID` and forwards each pair.
async fn serve_spdy(address: PodAddress, mut connection: Connection) {
    let mut pending: HashMap<String, (Option<Stream>, Option<Stream>)> = HashMap::new();
    let gone = connection.closed_token();
    let mut forwards = tokio::task::JoinSet::new();
    while let Some(stream) = connection.accept().await {
        let request = stream.header("requestid").unwrap_or_default().to_owned();
        let kind = stream.header("streamtype").unwrap_or_default().to_owned();
        let pair = pending.entry(request.clone()).or_default();
        match kind.as_str() {
            "error" => pair.0 = Some(stream),
            "data" => pair.1 = Some(stream),
            other => {
                debug!(stream_type = other, "refusing an unexpected stream");
                let _ = stream
                    .writer
                    .reset(super::super::spdy::frame::rst::REFUSED_STREAM)
                    .await;
                continue;
            }
        }
        let complete = matches!(pending.get(&request), Some((Some(_), Some(_))));
        if let Some((Some(error), Some(data))) =
            complete.then(|| pending.remove(&request)).flatten()
        {
            let address = address.clone();
            let gone = gone.clone();
            forwards.spawn(
                async move {
                    tokio::select! {
                        () = forward_pair(&address, error, data) => {}
                        () = gone.cancelled() => {}
                    }
                }
                .in_current_span(),
            );
        }
        while forwards.try_join_next().is_some() {}
    }
    forwards.shutdown().await;
}

async fn forward_pair(address: &PodAddress, error: Stream, data: Stream) {
    let port = data
        .header("port")
        .and_then(|port| port.parse::<u16>().ok())
        .unwrap_or(0);
    let Stream {
        incoming, writer, ..
    } = data;
    let result = forward(address.ip, port, incoming, |chunk| {
        let writer = writer.clone();
        async move { writer.write(chunk).await.is_ok() }
    })
    .await;
    let _ = writer.close().await;
    if let Err(cause) = result {
        let message = format!(
            "error forwarding port {port} to pod {}, uid {}: {cause}",
            address.pod, address.uid
        );
        info!(%message, "port-forward failed");
        let _ = error.writer.write(Bytes::from(message)).await;
    }
    let _ = error.writer.close().await;
}

/// Connects to `ip:port` and carries bytes both ways: from `incoming` until it ends (then
/// half-closes the socket), to `write` until the socket's end.
pub(super) async fn forward<W, F>(
    ip: IpAddr,
    port: u16,
    mut incoming: tokio::sync::mpsc::Receiver<Bytes>,
    write: W,
) -> Result<(), std::io::Error>
where
    W: Fn(Bytes) -> F,
    F: std::future::Future<Output = bool>,
{
    let socket = TcpStream::connect((ip, port)).await?;
    let _ = socket.set_nodelay(true);
    let (mut read_half, mut write_half) = socket.into_split();
    let up = async move {
        while let Some(chunk) = incoming.recv().await {
            if write_half.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = write_half.shutdown().await;
    };
    let down = async {
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            match read_half.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if !write(Bytes::copy_from_slice(&buffer[..n])).await {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(up, down);
    Ok(())
}
