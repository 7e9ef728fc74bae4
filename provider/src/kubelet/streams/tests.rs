//! The pure parts of the streaming routes: query options, upgrade and protocol negotiation,
//! resize parsing, WebSocket framing.

use axum::extract::ws::Message;
use axum::http::{HeaderMap, HeaderValue};

use super::exec::complete_json_values;
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
