use serde_json::json;

use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

const NOW: &str = "2026-11-23T10:00:00Z";

fn parse(query: &str) -> Result<LogOptions, LogError> {
    LogOptions::parse(Some(query), at(NOW))
}

fn bad(query: &str) -> String {
    match parse(query) {
        Err(LogError::BadQuery(message)) => message,
        other => panic!("{query}: {other:?}"),
    }
}

#[test]
fn the_query_is_read_as_the_kubelet_reads_it() {
    assert_eq!(
        LogOptions::parse(None, at(NOW)).unwrap(),
        LogOptions::default()
    );
    let all =
        parse("follow=true&previous=1&timestamps=True&tailLines=10&limitBytes=500&sinceSeconds=60")
            .unwrap();
    assert_eq!(
        all,
        LogOptions {
            follow: true,
            previous: true,
            timestamps: true,
            since_seconds: Some(60),
            since: Some(at("2026-11-23T09:59:00Z")),
            tail_lines: Some(10),
            limit_bytes: Some(500),
        }
    );
    // Booleans: only 0/f/false/n/no are false; a bare key is true.
    for (query, follow) in [
        ("follow", true),
        ("follow=", true),
        ("follow=yes", true),
        ("follow=0", false),
        ("follow=F", false),
        ("follow=False", false),
        ("follow=no", false),
    ] {
        assert_eq!(parse(query).unwrap().follow, follow, "{query}");
    }
    let since = parse("sinceTime=2026-11-23T09:30:00%2B08:00").unwrap();
    assert_eq!(since.since, Some(at("2026-11-23T01:30:00Z")));
    assert_eq!(since.since_seconds, None);
    // The old `tail` spelling; `all` is no tail.
    assert_eq!(parse("tail=5").unwrap().tail_lines, Some(5));
    assert_eq!(parse("tailLines=5&tail=all").unwrap().tail_lines, None);
    assert_eq!(parse("tailLines=0").unwrap().tail_lines, Some(0));
    assert_eq!(parse("stream=All").unwrap(), LogOptions::default());
    // The apiserver's own parameters pass.
    assert!(parse("insecureSkipTLSVerifyBackend=true").is_ok());
}

#[test]
fn invalid_queries_say_what_is_wrong() {
    assert_eq!(
        bad("tailLines=-1"),
        "tailLines: -1: must be greater than or equal to 0"
    );
    assert_eq!(bad("limitBytes=0"), "limitBytes: 0: must be greater than 0");
    assert_eq!(
        bad("sinceSeconds=0"),
        "sinceSeconds: 0: must be greater than 0"
    );
    assert_eq!(
        bad("sinceSeconds=5&sinceTime=2026-11-23T09:30:00Z"),
        "at most one of `sinceTime` or `sinceSeconds` may be specified"
    );
    assert_eq!(
        bad("sinceTime=yesterday"),
        "sinceTime: \"yesterday\" is not an RFC 3339 time"
    );
    assert_eq!(bad("tailLines=ten"), "tailLines: \"ten\" is not an integer");
    assert!(bad("stream=Stderr").contains("ECI keeps stdout and stderr in one log"));
}

fn target() -> Target {
    Target {
        namespace: "ns".into(),
        pod: "p".into(),
        uid: "uid-1".into(),
        container: "app".into(),
        group_id: "eci-1".into(),
    }
}

#[test]
fn eci_is_always_asked_for_timestamps_and_its_largest_tail_at_most() {
    let request = |query: &str| {
        parse(query)
            .unwrap()
            .first_request(&target(), "cn-hangzhou")
    };
    let plain = request("");
    assert_eq!(
        plain,
        DescribeContainerLogRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: "eci-1".into(),
            container_name: "app".into(),
            start_time: String::new(),
            tail: Some(2000),
            last_time: false,
            since_seconds: None,
            limit_bytes: None,
            timestamps: true,
        }
    );
    assert_eq!(request("tailLines=10").tail, Some(10));
    assert_eq!(request("tailLines=5000").tail, Some(2000));
    assert_eq!(
        request("tailLines=0").tail,
        Some(1),
        "one line, to know where a follow goes on from"
    );
    assert!(request("previous=true").last_time);
    // The client's limit counts bytes without ECI's timestamps: applied here, not by ECI.
    assert_eq!(request("limitBytes=10").limit_bytes, None);
    let seconds = request("sinceSeconds=30");
    assert_eq!(
        (seconds.since_seconds, seconds.start_time.as_str()),
        (Some(30), "")
    );
    let time = request("sinceTime=2026-11-23T09:30:00Z");
    assert_eq!(
        (time.since_seconds, time.start_time.as_str()),
        (None, "2026-11-23T09:30:00.000000000Z")
    );
}

#[test]
fn polls_go_on_from_the_last_timestamp_seen() {
    let options = parse("follow=true&tailLines=3&sinceSeconds=60").unwrap();
    let mut cursor = Cursor::default();
    let first = next_request(&options, &cursor, &target(), "r", false);
    assert_eq!(
        (first.start_time.as_str(), first.since_seconds, first.tail),
        ("2026-11-23T09:59:00.000000000Z", None, Some(2000)),
        "nothing seen yet: from the request's since, absolute"
    );
    cursor.take_new(parse_page("2026-11-23T09:59:30.5Z a\n"));
    let next = next_request(&options, &cursor, &target(), "r", true);
    assert_eq!(next.start_time, "2026-11-23T09:59:30.500000000Z");
    assert!(next.last_time, "the replaced instance's log");
}

#[test]
fn pages_are_read_with_their_timestamps() {
    let page = "2026-11-23T09:00:00.123456789Z first line\n\
                2026-11-23T09:00:01+08:00 with an offset\n\
                continued without a stamp\n\
                2026-11-23T09:00:02Z \n\
                2026-11-23T09:00:03Z last, unterminated";
    assert_eq!(
        parse_page(page),
        vec![
            Line {
                at: at("2026-11-23T09:00:00.123456789Z"),
                text: "first line".into()
            },
            Line {
                at: at("2026-11-23T01:00:01Z"),
                text: "with an offset".into()
            },
            Line {
                at: at("2026-11-23T01:00:01Z"),
                text: "continued without a stamp".into()
            },
            Line {
                at: at("2026-11-23T09:00:02Z"),
                text: String::new()
            },
            Line {
                at: at("2026-11-23T09:00:03Z"),
                text: "last, unterminated".into()
            },
        ]
    );
    assert_eq!(parse_page("no stamp before anything\n"), vec![]);
    assert_eq!(parse_page(""), vec![]);
}

/// Found by the fuzz target `kubelet_request` (its input is kept as
/// `fuzz/corpus/kubelet_request/crash-log-line-before-1970`): humantime's formatter panics for
/// times before the epoch, which a `sinceTime`, a `sinceSeconds` or ECI's own log lines can name.
#[test]
fn times_before_1970_are_written_not_a_panic() {
    assert_eq!(
        rfc3339_nanos(at("2026-11-21T08:00:03.5Z")),
        "2026-11-21T08:00:03.500000000Z"
    );
    assert_eq!(
        rfc3339_nanos(at("1960-01-02T03:04:05.000000007Z")),
        "1960-01-02T03:04:05.000000007Z"
    );
    // ECI is asked from the epoch: it keeps no older line.
    let old = parse("sinceTime=1960-01-01T00:00:00Z").unwrap();
    assert_eq!(
        old.first_request(&target(), "r").start_time,
        "1970-01-01T00:00:00.000000000Z"
    );
    let ages = parse("sinceSeconds=999999999999&follow=1").unwrap();
    assert_eq!(ages.since, Some(Timestamp::MIN));
    assert_eq!(
        next_request(&ages, &Cursor::default(), &target(), "r", false).start_time,
        "1970-01-01T00:00:00.000000000Z"
    );
    // A line ECI dates before 1970 is written with its own time.
    let page = parse_page("1013-11-21T08:00:05.5+08:00 restarted\n");
    let mut output = Output::new(&parse("timestamps=1").unwrap());
    assert_eq!(
        String::from_utf8(output.render(&page)).unwrap(),
        "1013-11-21T00:00:05.500000000Z restarted\n"
    );
}

fn lines(spec: &[(&str, &str)]) -> Vec<Line> {
    spec.iter()
        .map(|(stamp, text)| Line {
            at: at(&format!("2026-11-23T10:00:{stamp}Z")),
            text: (*text).to_owned(),
        })
        .collect()
}

fn texts(lines: &[Line]) -> Vec<&str> {
    lines.iter().map(|line| line.text.as_str()).collect()
}

#[test]
fn since_comes_before_tail() {
    let page = lines(&[("01", "a"), ("02", "b"), ("03", "c"), ("04", "d")]);
    let select = |query: &str| texts(&parse(query).unwrap().select(&page)).join("");
    assert_eq!(select(""), "abcd");
    assert_eq!(select("tailLines=2"), "cd");
    assert_eq!(select("tailLines=0"), "");
    assert_eq!(select("tailLines=10"), "abcd");
    assert_eq!(
        select("sinceTime=2026-11-23T10:00:02Z"),
        "bcd",
        "at since is kept"
    );
    assert_eq!(select("sinceTime=2026-11-23T10:00:02Z&tailLines=1"), "d");
    assert_eq!(
        select("sinceTime=2026-11-23T10:00:04Z&tailLines=3"),
        "d",
        "the tail of what since kept"
    );
}

#[test]
fn polled_pages_merge_without_duplicates_or_losses() {
    // (pages as ECI returns them from the last timestamp on, the lines expected new from each)
    /// (what the case shows, the pages ECI returns one poll after another, the lines written)
    type Case<'a> = (&'a str, &'a [&'a [(&'a str, &'a str)]], &'a [&'a str]);
    let table: &[Case<'_>] = &[
        (
            "pages that overlap on the last timestamp",
            &[
                &[("01", "a"), ("02", "b")],
                &[("02", "b"), ("03", "c")],
                &[("03", "c")],
            ],
            &["a", "b", "c"],
        ),
        (
            "a line written in the same instant as the last one seen, after the poll",
            &[
                &[("01", "a"), ("02", "b")],
                &[("02", "b"), ("02", "b2"), ("03", "c")],
            ],
            &["a", "b", "b2", "c"],
        ),
        (
            "two identical lines in one instant are two lines",
            &[
                &[("01", "x")],
                &[("01", "x"), ("01", "x")],
                &[("01", "x"), ("01", "x")],
            ],
            &["x", "x"],
        ),
        (
            "older lines (a second-precision StartTime) are not new",
            &[
                &[("01", "a"), ("02", "b")],
                &[("01", "a"), ("02", "b"), ("04", "d")],
            ],
            &["a", "b", "d"],
        ),
        (
            "empty polls change nothing",
            &[&[], &[("05", "e")], &[], &[("05", "e")]],
            &["e"],
        ),
        (
            "several lines at the last instant, then more there",
            &[
                &[("06", "p"), ("06", "q")],
                &[("06", "p"), ("06", "q"), ("06", "r")],
                &[("06", "p"), ("06", "q"), ("06", "r"), ("07", "s")],
            ],
            &["p", "q", "r", "s"],
        ),
    ];
    for (case, pages, expected) in table {
        let mut cursor = Cursor::default();
        let mut written = Vec::new();
        for page in *pages {
            written.extend(cursor.take_new(lines(page)));
        }
        assert_eq!(texts(&written), *expected, "{case}");
    }
}

#[test]
fn output_strips_or_writes_timestamps_and_counts_limit_bytes() {
    let page = lines(&[("01", "alpha"), ("02", "beta"), ("03", "gamma")]);
    let render = |query: &str| {
        let options = parse(query).unwrap();
        let mut output = Output::new(&options);
        let first = String::from_utf8(output.render(&page[..2])).unwrap();
        let then = String::from_utf8(output.render(&page[2..])).unwrap();
        (first, then, output.is_full())
    };
    assert_eq!(
        render(""),
        ("alpha\nbeta\n".into(), "gamma\n".into(), false)
    );
    assert_eq!(
        render("timestamps=true"),
        (
            "2026-11-23T10:00:01.000000000Z alpha\n2026-11-23T10:00:02.000000000Z beta\n".into(),
            "2026-11-23T10:00:03.000000000Z gamma\n".into(),
            false
        )
    );
    assert_eq!(
        render("limitBytes=8"),
        ("alpha\nbe".into(), String::new(), true),
        "cut mid-line, nothing after"
    );
    assert_eq!(
        render("limitBytes=11"),
        ("alpha\nbeta\n".into(), String::new(), true),
        "exactly used up"
    );
    assert_eq!(
        render("limitBytes=13"),
        ("alpha\nbeta\n".into(), "ga".into(), true),
        "the limit spans polls"
    );
    assert_eq!(
        render("limitBytes=32&timestamps=1"),
        (
            "2026-11-23T10:00:01.000000000Z a".into(),
            String::new(),
            true
        ),
        "timestamps count"
    );
}

fn pod(phase: &str, container: &serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": {"containers": [{"name": "app"}]},
        "status": {"phase": phase, "containerStatuses": [container]},
    }))
    .unwrap()
}

#[test]
fn a_follow_ends_with_its_container_instance() {
    let status = |restarts: i32, state: serde_json::Value| json!({"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": restarts, "state": state});
    let running = status(1, json!({"running": {}}));
    assert_eq!(
        instance(Some(&pod("Running", &running)), "uid-1", "app", 1),
        Instance::Running
    );
    assert_eq!(
        instance(
            Some(&pod(
                "Running",
                &status(1, json!({"terminated": {"exitCode": 0}}))
            )),
            "uid-1",
            "app",
            1
        ),
        Instance::Ended
    );
    assert_eq!(
        instance(
            Some(&pod("Running", &status(2, json!({"running": {}})))),
            "uid-1",
            "app",
            1
        ),
        Instance::Restarted
    );
    assert_eq!(
        instance(Some(&pod("Succeeded", &running)), "uid-1", "app", 1),
        Instance::Ended
    );
    assert_eq!(
        instance(None, "uid-1", "app", 1),
        Instance::Ended,
        "pod gone"
    );
    assert_eq!(
        instance(Some(&pod("Running", &running)), "uid-2", "app", 1),
        Instance::Ended,
        "another pod of the same name"
    );
    assert_eq!(
        instance(
            Some(&pod(
                "Pending",
                &status(0, json!({"waiting": {"reason": "ContainerCreating"}}))
            )),
            "uid-1",
            "app",
            0
        ),
        Instance::Running,
        "not started yet"
    );
}

#[test]
fn eci_refusals_are_the_requests_fault_and_failures_eci_s() {
    let answer = |code: &str| {
        LogError::Eci {
            pod: "ns/p".into(),
            container: "app".into(),
            source: EciError::new(code, "why"),
        }
        .into_response()
        .status()
    };
    assert_eq!(answer("InvalidParameter.LastTime"), StatusCode::BAD_REQUEST);
    assert_eq!(
        answer("InvalidContainerGroup.NotFound"),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        answer("ServiceUnavailable"),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        backoff(Duration::from_secs(4), Duration::from_secs(1)),
        Duration::from_secs(5)
    );
}
