//! The pure parts of the streaming routes: query options, upgrade and protocol negotiation,
//! resize parsing, WebSocket framing.

use axum::extract::ws::Message;
use axum::http::{HeaderMap, HeaderValue};

use super::exec::{MAX_PENDING_RESIZE, complete_json_values};
use super::websocket::Framing;
use super::*;

#[test]
fn options_are_read_as_the_kubelet_reads_them() {
    let options = ExecOptions::parse(
        "command=sh&command=-c&command=echo+%22a+b%22+%27c%27&input=1&output=1&error=1",
        true,
    )
    .expect("valid");
    assert_eq!(options.command, ["sh", "-c", "echo \"a b\" 'c'"]);
    assert!(options.stdin && options.stdout && options.stderr && !options.tty);
    // The stdin/stdout/stderr spellings too; a TTY drops stderr.
    let options = ExecOptions::parse(
        "command=bash&stdin=true&stdout=true&stderr=true&tty=1",
        true,
    )
    .expect("valid");
    assert!(options.tty && options.stdin && options.stdout && !options.stderr);
    // Empty arguments survive, and so does an argument that looks like a parameter.
    let options = ExecOptions::parse("command=printf&command=&command=tty%3D1&output=1", true)
        .expect("valid");
    assert_eq!(options.command, ["printf", "", "tty=1"]);
    assert!(!options.tty);
    assert!(matches!(
        ExecOptions::parse("command=ls", true),
        Err(StreamError::BadRequest(_))
    ));
    assert!(matches!(
        ExecOptions::parse("output=1", true),
        Err(StreamError::BadRequest(_))
    ));
    // attach needs no command.
    assert!(ExecOptions::parse("output=1", false).is_ok());
}

#[test]
fn upgrades_and_protocols_are_negotiated() {
    let mut headers = HeaderMap::new();
    assert_eq!(upgrade_kind(&headers), None);
    headers.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
    assert_eq!(upgrade_kind(&headers), Some(Upgrade::Spdy));
    headers.insert("upgrade", HeaderValue::from_static("WebSocket"));
    assert_eq!(upgrade_kind(&headers), Some(Upgrade::WebSocket));

    let mut headers = HeaderMap::new();
    for protocol in ["v4.channel.k8s.io", "v5.channel.k8s.io, v3.channel.k8s.io"] {
        headers.append(
            "x-stream-protocol-version",
            HeaderValue::from_static(protocol),
        );
    }
    let client = offered(&headers);
    assert_eq!(
        client,
        [
            "v4.channel.k8s.io",
            "v5.channel.k8s.io",
            "v3.channel.k8s.io"
        ]
    );
    // The newest we serve, whatever the client's order.
    assert_eq!(
        negotiate(&client, &EXEC_PROTOCOLS).expect("common"),
        "v5.channel.k8s.io"
    );
    assert_eq!(
        negotiate(&["v2.channel.k8s.io".to_owned()], &EXEC_PROTOCOLS).expect("common"),
        "v2.channel.k8s.io"
    );
    assert_eq!(
        negotiate(&[], &EXEC_PROTOCOLS).expect("default"),
        "channel.k8s.io"
    );
    let refused = negotiate(&["v9.channel.k8s.io".to_owned()], &EXEC_PROTOCOLS);
    assert!(matches!(refused, Err(StreamError::Protocol { .. })));
    assert_eq!(
        negotiate(
            &[PORT_FORWARD_PROTOCOL.to_owned()],
            &[PORT_FORWARD_PROTOCOL]
        )
        .expect("pf"),
        PORT_FORWARD_PROTOCOL
    );
}

#[test]
fn websocket_port_forward_ports_are_read_from_the_query() {
    assert_eq!(
        forwarded_ports(Some("ports=8080,%209090&port=53")).expect("valid"),
        [8080, 9090, 53]
    );
    let many = format!("ports={}", vec!["1"; 127].join(","));
    assert_eq!(forwarded_ports(Some(&many)).expect("127 fit").len(), 127);
    for refused in [
        None,
        Some(""),
        Some("other=1"),
        Some("ports="),
        Some("ports=65536"),
        Some("ports=80,x"),
        Some("ports=-1"),
    ] {
        assert!(
            matches!(forwarded_ports(refused), Err(StreamError::BadRequest(_))),
            "{refused:?}"
        );
    }
    let too_many = format!("ports={}", vec!["1"; 128].join(","));
    assert!(
        forwarded_ports(Some(&too_many)).is_err(),
        "128 ports need 256 channels"
    );
}

#[test]
fn resize_stream_values_are_taken_whole() {
    let mut pending = br#"{"Width":80,"Height":24}{"Width":100,"#.to_vec();
    let values = complete_json_values(&mut pending);
    assert_eq!(values, [br#"{"Height":24,"Width":80}"#.to_vec()]);
    assert_eq!(pending, br#"{"Width":100,"#.to_vec());
    pending.extend_from_slice(br#""Height":30}"#);
    assert_eq!(complete_json_values(&mut pending).len(), 1);
    assert!(pending.is_empty());
    pending.extend_from_slice(b"garbage");
    assert!(complete_json_values(&mut pending).is_empty());
    assert!(pending.is_empty(), "invalid bytes are dropped");
}

#[test]
fn an_unfinished_resize_message_is_dropped_past_its_bound() {
    let mut pending = br#"{"Width":"#.to_vec();
    // Whitespace keeps the value valid and unfinished for ever.
    let mut sent = pending.len();
    while sent <= MAX_PENDING_RESIZE {
        assert_eq!(pending.len(), sent, "kept while within the bound");
        pending.extend_from_slice(&[b' '; 512]);
        sent += 512;
        assert!(complete_json_values(&mut pending).is_empty());
    }
    assert!(pending.is_empty(), "dropped once past the bound");
    // The stream goes on: the next whole message is taken.
    pending.extend_from_slice(br#"{"Width":80,"Height":24}"#);
    assert_eq!(complete_json_values(&mut pending).len(), 1);
}

#[test]
fn websocket_framing_binary_and_base64() {
    let binary = Framing::of("v5.channel.k8s.io");
    assert!(binary.close_signal && !binary.base64);
    let message = binary.encode(1, b"hi");
    assert_eq!(message, Message::Binary(vec![1, b'h', b'i'].into()));
    assert_eq!(
        binary.decode(&message),
        Some((1, bytes::Bytes::from_static(b"hi")))
    );
    assert_eq!(binary.decode(&Message::Binary(Vec::new().into())), None);

    let base64 = Framing::of("v4.base64.channel.k8s.io");
    assert!(base64.base64 && !base64.close_signal);
    let message = base64.encode(2, b"hi");
    assert_eq!(message, Message::Text("2aGk=".into()));
    assert_eq!(
        base64.decode(&message),
        Some((2, bytes::Bytes::from_static(b"hi")))
    );
    assert_eq!(base64.decode(&Message::Text("x!!".into())), None);
    assert_eq!(base64.decode(&Message::Binary(vec![0].into())), None);
}

/// The routes served in process against an embedded mock-eci (real processes, echo ports) and a
/// Kubernetes API that knows one pod, driven by hand: SPDY with our codec, WebSocket with
/// tungstenite.
mod in_process {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use clap::Parser as _;
    use eci_proto::v20180808::{
        Container, CreateContainerGroupRequest, DescribeContainerGroupsRequest, Port,
    };
    use futures::{SinkExt as _, StreamExt as _};
    use serde_json::{Value, json};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

    use crate::eci::Backend;
    use crate::eci::GrpcBackend;
    use crate::kubelet::spdy::Frame;
    use crate::kubelet::spdy::test_client::Client;
    use crate::kubelet::{KubeletState, auth};
    use crate::ops::metrics::Telemetry;

    const NODE: &str = "vn-0";
    const ECHO_PORT: u16 = 18_090;

    struct Scene {
        addr: std::net::SocketAddr,
        mock: mock_eci::MockServer,
    }

    impl Scene {
        /// Calls of `action` mock-eci answered so far, whatever the result.
        fn eci_calls(&self, action: &str) -> f64 {
            let series = format!("mock_eci_calls_total{{action=\"{action}\",");
            self.mock
                .mock()
                .render_metrics()
                .lines()
                .filter(|line| line.starts_with(&series))
                .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
                .sum()
        }
    }

    /// A Kubernetes API answering every request with the pod `ns/box` on this node.
    fn kube_client() -> kube::Client {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "box", "namespace": "ns", "uid": "uid-1"},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "app:1"}]},
        })
        .to_string();
        let service =
            tower::service_fn(move |_request: axum::http::Request<kube::client::Body>| {
                let pod = pod.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        axum::http::Response::builder()
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(pod.into_bytes()))
                            .expect("response"),
                    )
                }
            });
        kube::Client::new(service, "default")
    }

    /// The scene, its groups' IPs (and echo listeners) in `cidr`: a block per test, as the
    /// tests of this module run side by side.
    async fn scene(cidr: &str) -> Scene {
        let config = mock_eci::MockConfig::parse_from([
            "mock-eci",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--provisioning-delay",
            "50ms",
            "--scheduling-delay",
            "10ms",
            "--no-rate-limits",
            "--ip-cidr",
            cidr,
            "--port-echo",
        ]);
        let mock = mock_eci::MockServer::start(config).await.expect("mock-eci");
        let eci: Backend = Arc::new(GrpcBackend::connect_lazy(&mock.endpoint()).expect("endpoint"));
        let group = eci
            .create_container_group(CreateContainerGroupRequest {
                region_id: "cn-hangzhou".into(),
                security_group_id: "sg-1".into(),
                v_switch_id: "vsw-1".into(),
                container_group_name: "ns-box".into(),
                container: vec![Container {
                    name: "app".into(),
                    image: "app:1".into(),
                    port: vec![Port {
                        port: i32::from(ECHO_PORT),
                        protocol: "TCP".into(),
                    }],
                    ..Container::default()
                }],
                ..CreateContainerGroupRequest::default()
            })
            .await
            .expect("group")
            .container_group_id;
        let mut ip = String::new();
        for _ in 0..100 {
            let groups = eci
                .describe_container_groups(DescribeContainerGroupsRequest {
                    region_id: "cn-hangzhou".into(),
                    container_group_ids: vec![group.clone()],
                    ..DescribeContainerGroupsRequest::default()
                })
                .await
                .expect("describe");
            if let Some(running) = groups
                .container_groups
                .first()
                .filter(|g| g.status == "Running")
            {
                ip.clone_from(&running.intranet_ip);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // mock-eci's echo listener follows the group within half a second.
        for _ in 0..100 {
            if TcpStream::connect((ip.as_str(), ECHO_PORT)).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = kube_client();
        let state = KubeletState {
            config: crate::kubelet::pod_lookup::tests::test_config(),
            client: client.clone(),
            eci,
            groups: crate::pods::GroupDirectory::fixed([("uid-1".to_owned(), group.clone())]),
            node_pods: crate::k8s::shared_watch::SharedWatch::new("test pod"),
            telemetry: Arc::new(Telemetry::new()),
            guard: Arc::new(auth::Guard::new(
                NODE.into(),
                Arc::new(auth::ApiReviewer::new(client)),
                Arc::new(auth::ClientCa::default()),
            )),
            stop: tokio_util::sync::CancellationToken::new(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, super::routes().with_state(state)).await;
        });
        Scene { addr, mock }
    }

    /// Sends the upgrade request and reads the answer's head.
    async fn upgrade(
        addr: std::net::SocketAddr,
        path: &str,
        protocols: &[&str],
    ) -> (TcpStream, String) {
        let mut socket = TcpStream::connect(addr).await.expect("connect");
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: kubelet\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n"
        );
        for protocol in protocols {
            request.push_str(&format!("X-Stream-Protocol-Version: {protocol}\r\n"));
        }
        request.push_str("\r\n");
        socket.write_all(request.as_bytes()).await.expect("write");
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if socket.read(&mut byte).await.expect("read") == 0 {
                break;
            }
            head.push(byte[0]);
        }
        (socket, String::from_utf8_lossy(&head).to_lowercase())
    }

    /// Reads frames until every stream in `ids` ended; the data per stream.
    async fn collect(client: &mut Client<TcpStream>, ids: &[u32]) -> Vec<Vec<u8>> {
        let mut data = vec![Vec::new(); ids.len()];
        let mut open: Vec<u32> = ids.to_vec();
        while !open.is_empty() {
            match client.next().await {
                Some(Frame::Data {
                    stream,
                    fin,
                    data: chunk,
                }) => {
                    if let Some(i) = ids.iter().position(|id| *id == stream) {
                        data[i].extend_from_slice(&chunk);
                    }
                    if fin {
                        open.retain(|id| *id != stream);
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        data
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spdy_exec_websocket_exec_and_spdy_port_forward() {
        let scene = scene("127.79.0.0/16").await;

        // SPDY exec: stdin through a shell, stdout, stderr and the exit code.
        let path = "/exec/ns/box/app?command=sh&command=-c&command=cat%3B+echo+oops+%3E%262%3B+exit+3&input=1&output=1&error=1";
        let (socket, head) = upgrade(
            scene.addr,
            path,
            &["v4.channel.k8s.io", "v5.channel.k8s.io"],
        )
        .await;
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(
            head.contains("x-stream-protocol-version: v5.channel.k8s.io"),
            "{head}"
        );
        let mut client = Client::new(socket);
        for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
            client.open(id, &[("streamtype", kind)], false).await;
        }
        client
            .send(Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"hi\n"),
            })
            .await;
        let [error, stdout, stderr]: [Vec<u8>; 3] = collect(&mut client, &[1, 5, 7])
            .await
            .try_into()
            .expect("three");
        assert_eq!(stdout, b"hi\n");
        assert_eq!(stderr, b"oops\n");
        let status: Value = serde_json::from_slice(&error).expect("a Status");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(
            status["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );

        // No common protocol: 403, as the kubelet answers.
        let (_, head) = upgrade(scene.addr, path, &["v9.channel.k8s.io"]).await;
        assert!(head.starts_with("http/1.1 403"), "{head}");
        // A pod of another node is 404; a missing command is 400.
        let (_, head) = upgrade(
            scene.addr,
            "/exec/ns/box/uid-2/app?command=true&output=1",
            &["v5.channel.k8s.io"],
        )
        .await;
        assert!(head.starts_with("http/1.1 404"), "{head}");
        let (_, head) = upgrade(
            scene.addr,
            "/exec/ns/box/app?output=1",
            &["v5.channel.k8s.io"],
        )
        .await;
        assert!(head.starts_with("http/1.1 400"), "{head}");

        // WebSocket exec (v5): stdin closed by the close signal.
        let url = format!(
            "ws://{}/exec/ns/box/app?command=cat&input=1&output=1&error=1",
            scene.addr
        );
        let mut request = url.into_client_request().expect("request");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "v5.channel.k8s.io".parse().expect("header"),
        );
        let (mut ws, response) = tokio_tungstenite::connect_async(request).await.expect("ws");
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "v5.channel.k8s.io"
        );
        ws.send(Message::Binary(b"\x00over websocket".to_vec().into()))
            .await
            .expect("send");
        ws.send(Message::Binary(vec![255, 0].into()))
            .await
            .expect("close stdin");
        let (mut out, mut status) = (Vec::new(), Value::Null);
        while let Some(Ok(message)) = ws.next().await {
            if let Message::Binary(data) = message {
                match data.split_first() {
                    Some((1, rest)) => out.extend_from_slice(rest),
                    Some((3, rest)) => status = serde_json::from_slice(rest).expect("status"),
                    _ => {}
                }
            }
        }
        assert_eq!(out, b"over websocket");
        assert_eq!(status["status"], "Success");

        // SPDY port-forward: a pair per connection, bytes both ways to the group's port.
        let (socket, head) =
            upgrade(scene.addr, "/portForward/ns/box", &["portforward.k8s.io"]).await;
        assert!(head.starts_with("http/1.1 101"), "{head}");
        let mut client = Client::new(socket);
        let port = ECHO_PORT.to_string();
        client
            .open(
                1,
                &[("streamtype", "error"), ("port", &port), ("requestid", "0")],
                true,
            )
            .await;
        client
            .open(
                3,
                &[("streamtype", "data"), ("port", &port), ("requestid", "0")],
                false,
            )
            .await;
        let mut echoed = Vec::new();
        client
            .send(Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"ping"),
            })
            .await;
        let [error, data]: [Vec<u8>; 2] =
            collect(&mut client, &[1, 3]).await.try_into().expect("two");
        echoed.extend_from_slice(&data);
        assert_eq!(
            echoed,
            b"ping",
            "error stream: {}",
            String::from_utf8_lossy(&error)
        );
        assert!(error.is_empty());
        // A port nothing listens on: the error stream says so.
        client
            .open(
                5,
                &[("streamtype", "error"), ("port", "1"), ("requestid", "1")],
                true,
            )
            .await;
        client
            .open(
                7,
                &[("streamtype", "data"), ("port", "1"), ("requestid", "1")],
                false,
            )
            .await;
        let [error, _]: [Vec<u8>; 2] = collect(&mut client, &[5, 7]).await.try_into().expect("two");
        let error = String::from_utf8_lossy(&error);
        assert!(
            error.starts_with("error forwarding port 1 to pod ns/box, uid uid-1:"),
            "{error}"
        );
    }

    /// `attach -i`: no ECI call reaches a running container's stdin. The session is refused
    /// with a `BadRequest` Status that says so and names `exec -i`, before any ECI call, and
    /// nothing arrives on stdout (input is never taken and silently dropped).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn attach_with_stdin_is_refused_with_the_reason_before_any_eci_call() {
        let scene = scene("127.74.0.0/16").await;
        let before = [
            scene.eci_calls("ExecContainerCommand"),
            scene.eci_calls("DescribeContainerLog"),
        ];
        let (socket, head) = upgrade(
            scene.addr,
            "/attach/ns/box/app?input=1&output=1&error=1",
            &["v5.channel.k8s.io"],
        )
        .await;
        assert!(head.starts_with("http/1.1 101"), "{head}");
        let mut client = Client::new(socket);
        for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
            client.open(id, &[("streamtype", kind)], false).await;
        }
        client
            .send(Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"typed\n"),
            })
            .await;
        let [error, stdout, stderr]: [Vec<u8>; 3] = collect(&mut client, &[1, 5, 7])
            .await
            .try_into()
            .expect("three");
        assert!(stdout.is_empty() && stderr.is_empty());
        let status: Value = serde_json::from_slice(&error).expect("a Status");
        assert_eq!(
            (&status["status"], &status["reason"], &status["code"]),
            (&json!("Failure"), &json!("BadRequest"), &json!(400)),
            "{status}"
        );
        let message = status["message"].as_str().unwrap_or_default();
        for said in ["attach -i", "stdin", "kubectl exec -i"] {
            assert!(message.contains(said), "{said:?} in {message:?}");
        }
        let after = [
            scene.eci_calls("ExecContainerCommand"),
            scene.eci_calls("DescribeContainerLog"),
        ];
        assert_eq!(before, after, "no ECI call for a refused attach");
        assert!(
            scene.eci_calls("DescribeContainerGroups") > 0.0,
            "the counters read are mock-eci's (the scene described its group)"
        );
    }
}
