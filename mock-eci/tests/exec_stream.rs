//! Interactive exec over the WebSocketUri in the simulated runtime (answered by its interpreter,
//! never run on mock-eci's host: stdin, exit codes, streams, arguments exactly as given, the
//! container's env) and the port echo, on real sockets.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{REGION, env, mk_container, mk_request, start};
use eci_proto::v20180808::{ExecContainerCommandRequest, Port};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

/// What one session sent back.
#[derive(Debug, Default)]
struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Value,
}

async fn session(uri: &str, input: &[&[u8]], close_stdin: bool, resize: Option<&str>) -> Outcome {
    let mut request = uri.into_client_request().unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers().get("sec-websocket-protocol").unwrap(),
        "v5.channel.k8s.io"
    );
    if let Some(size) = resize {
        let mut message = vec![4];
        message.extend_from_slice(size.as_bytes());
        socket.send(Message::Binary(message.into())).await.unwrap();
    }
    for chunk in input {
        let mut message = vec![0];
        message.extend_from_slice(chunk);
        socket.send(Message::Binary(message.into())).await.unwrap();
    }
    if close_stdin {
        socket
            .send(Message::Binary(vec![255, 0].into()))
            .await
            .unwrap();
    }
    let mut outcome = Outcome::default();
    let read = async {
        while let Some(Ok(message)) = socket.next().await {
            let Message::Binary(data) = message else {
                continue;
            };
            match data.split_first() {
                Some((1, rest)) => outcome.stdout.extend_from_slice(rest),
                Some((2, rest)) => outcome.stderr.extend_from_slice(rest),
                Some((3, rest)) => outcome.status = serde_json::from_slice(rest).unwrap(),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .unwrap();
    outcome
}

#[tokio::test]
async fn exec_sessions_answer_from_the_simulation_and_never_run_on_the_host() {
    let mut h = start(&[
        "--admin-listen",
        "127.0.0.1:0",
        "--ip-cidr",
        "127.78.0.0/16",
        "--port-echo",
    ])
    .await;
    let mut request = mk_request("shell");
    let mut container = mk_container("app", vec![env("GREETING", "hi there")]);
    container.port = vec![Port {
        port: 18_080,
        protocol: "TCP".into(),
    }];
    request.container = vec![container];
    let id = h.create(request).await;
    let mut client = h.client.clone();
    let exec = |command: &[&str], tty: bool, stdin: bool| ExecContainerCommandRequest {
        region_id: REGION.into(),
        container_group_id: id.clone(),
        container_name: "app".into(),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        tty,
        stdin: Some(stdin),
        sync: false,
    };
    let mut uri = String::new();
    // The shared start provisions in 3 s.
    for _ in 0..100 {
        if let Ok(answer) = client
            .exec_container_command(exec(&["cat"], false, true))
            .await
        {
            uri = answer.into_inner().web_socket_uri;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(uri.starts_with("ws://127.0.0.1:"), "{uri}");

    // stdin through cat, closed by the v5 signal.
    let cat = session(&uri, &[b"hello ", b"world\n"], true, None).await;
    assert_eq!(cat.stdout, b"hello world\n");
    assert_eq!(cat.status["status"], "Success");
    // A URI serves once.
    let mut again = uri.as_str().into_client_request().unwrap();
    again.headers_mut().insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    assert!(tokio_tungstenite::connect_async(again).await.is_err());

    let mut run = async |command: &[&str], tty: bool, stdin: bool| {
        client
            .exec_container_command(exec(command, tty, stdin))
            .await
            .unwrap()
            .into_inner()
            .web_socket_uri
    };
    let exit = session(
        &run(
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
            false,
            false,
        )
        .await,
        &[],
        false,
        None,
    )
    .await;
    assert_eq!(exit.stdout, b"out\n");
    assert_eq!(exit.stderr, b"err\n");
    assert_eq!(exit.status["reason"], "NonZeroExitCode");
    assert_eq!(exit.status["details"]["causes"][0]["message"], "3");

    let args = session(
        &run(
            &["printf", "[%s]", "a b", "\"q\"", "", "$GREETING"],
            false,
            false,
        )
        .await,
        &[],
        false,
        None,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&args.stdout),
        "[a b][\"q\"][][$GREETING]"
    );
    let env = session(
        &run(&["printenv", "GREETING"], false, false).await,
        &[],
        false,
        None,
    )
    .await;
    assert_eq!(env.stdout, b"hi there\n");

    let missing = session(
        &run(&["no-such-program"], false, false).await,
        &[],
        false,
        None,
    )
    .await;
    assert_eq!(missing.status["status"], "Failure");
    assert_eq!(missing.status["details"]["causes"][0]["message"], "127");
    assert_eq!(missing.stderr, b"sh: no-such-program: not found\n");

    // Nothing runs on mock-eci's host: neither its files nor its programs are reached.
    let host_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(host_file.path(), "the host's").unwrap();
    for command in [
        vec!["cat", host_file.path().to_str().unwrap()],
        vec!["sh", "-c", "ls /"],
        vec!["uname", "-a"],
        vec!["ps"],
    ] {
        let outcome = session(&run(&command, false, false).await, &[], false, None).await;
        assert_eq!(outcome.status["status"], "Failure", "{command:?}");
        assert!(outcome.stdout.is_empty(), "{command:?}: {outcome:?}");
    }

    // With a terminal: one stream.
    let tty = session(
        &run(&["sh", "-c", "echo out; echo err >&2"], true, true).await,
        &[],
        false,
        Some(r#"{"Width":100,"Height":30}"#),
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&tty.stdout), "out\nerr\n");
    assert_eq!(tty.status["status"], "Success");

    // The declared port echoes at the group's IP.
    let ip = h.server.mock().groups()[0].intranet_ip.clone();
    assert!(ip.starts_with("127.78."), "{ip}");
    let mut socket = None;
    for _ in 0..50 {
        if let Ok(s) = tokio::net::TcpStream::connect((ip.as_str(), 18_080)).await {
            socket = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut socket = socket.expect("the echo listens");
    socket.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    socket.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping");
    h.server.stop().await.unwrap();
}
