//! The kubelet API's reading of a request, as anyone who reaches the kubelet port may send it:
//! an HTTP/1.1 request head (method, path and query, headers), then a body that stands for
//! what the request's handler reads next — ECI's log page for `containerLogs`, the resize
//! stream for `exec`. Read by the pure parsers the handlers call: the authorization
//! subresource of the path (`auth::subresources`, `auth::verb`), the `containerLogs` query
//! (`LogOptions::parse`) and the log lines it selects, follows and writes (`parse_page`,
//! `select`, `Cursor`, `Output`, `first_request`, `next_request`), the `exec`/`attach` query
//! (`ExecOptions::parse`), the upgrade and protocol negotiation (`upgrade_kind`, `offered`,
//! `negotiate`), the WebSocket port-forward's ports (`forwarded_ports`) and the terminal-size
//! stream (`complete_json_values`). No request panics, and a follower polling the same page
//! twice writes nothing the second time.
//!
//! ```text
//! GET /containerLogs/default/web-0/app?tailLines=10&timestamps=1 HTTP/1.1
//! Upgrade: SPDY/3.1
//!
//! 2026-11-21T08:00:00.000000001Z hello
//! ```

#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use virtual_node_eci::kubelet::auth;
use virtual_node_eci::kubelet::logs::{self, Cursor, LogOptions, Output};
use virtual_node_eci::kubelet::pod_lookup::Target;
use virtual_node_eci::kubelet::streams::{
    self, EXEC_PROTOCOLS, ExecOptions, PORT_FORWARD_PROTOCOL,
};

struct Request<'a> {
    method: Method,
    path: &'a str,
    query: Option<&'a str>,
    headers: HeaderMap,
    body: &'a [u8],
}

/// The request head as hyper would hand it over (invalid header lines left out), and the body.
fn request(data: &[u8]) -> Option<Request<'_>> {
    let (head, body) = match data.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => (&data[..at], &data[at + 4..]),
        None => (data, &[][..]),
    };
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = Method::from_bytes(first.next()?.as_bytes()).ok()?;
    let target = first.next()?;
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_bytes(value.trim().as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    Some(Request {
        method,
        path,
        query,
        headers,
        body,
    })
}

fn logs(query: Option<&str>, page: &str) {
    let now: Timestamp = "2026-11-21T08:00:00Z".parse().expect("a time");
    let Ok(options) = LogOptions::parse(query, now) else {
        return;
    };
    assert!(options.tail_lines.is_none_or(|lines| lines >= 0));
    assert!(options.limit_bytes.is_none_or(|limit| limit >= 1));
    assert!(options.since_seconds.is_none_or(|seconds| seconds >= 1));
    let target = Target {
        namespace: "default".into(),
        pod: "web-0".into(),
        uid: "u-1".into(),
        container: "app".into(),
        group_id: "eci-1".into(),
    };
    let _ = options.first_request(&target, "cn-hangzhou");
    let lines = logs::parse_page(page);
    let selected = options.select(&lines);
    let mut output = Output::new(&options);
    let written = output.render(&selected);
    if let Some(limit) = options.limit_bytes {
        assert!(
            written.len() as u64 <= limit,
            "{} bytes written past limitBytes={limit}",
            written.len()
        );
    }
    // Following: the first page, then the same page again, which holds nothing new.
    let mut cursor = Cursor::default();
    cursor.take_new(lines.clone());
    let again = cursor.take_new(lines);
    assert!(again.is_empty(), "a line was written twice: {again:?}");
    let _ = output.render(&again);
    let _ = logs::next_request(&options, &cursor, &target, "cn-hangzhou", false);
}

fuzz_target!(|data: &[u8]| {
    let Some(request) = request(data) else {
        return;
    };
    let _ = auth::verb(&request.method);
    assert!(!auth::subresources(request.path).is_empty());

    logs(request.query, &String::from_utf8_lossy(request.body));

    let query = request.query.unwrap_or_default();
    for exec in [true, false] {
        if let Ok(options) = ExecOptions::parse(query, exec) {
            assert!(options.stdin || options.stdout || options.stderr);
            assert!(!(options.tty && options.stderr));
        }
    }
    let _ = streams::upgrade_kind(&request.headers);
    let offered = streams::offered(&request.headers);
    if let Ok(protocol) = streams::negotiate(&offered, &EXEC_PROTOCOLS) {
        assert!(EXEC_PROTOCOLS.contains(&protocol));
    }
    let _ = streams::negotiate(&offered, &[PORT_FORWARD_PROTOCOL]);
    if let Ok(ports) = streams::forwarded_ports(request.query) {
        assert!((1..=127).contains(&ports.len()));
    }
    let mut pending = request.body.to_vec();
    for value in streams::complete_json_values(&mut pending) {
        let _: serde_json::Value =
            serde_json::from_slice(&value).expect("a taken value is whole JSON");
    }
});
