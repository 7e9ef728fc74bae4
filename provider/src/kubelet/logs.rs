//! `GET /containerLogs/{namespace}/{pod}/{container}` from ECI `DescribeContainerLog`, with the
//! kubelet's query (`follow`, `previous`, `timestamps`, `sinceSeconds`, `sinceTime`,
//! `tailLines`, `limitBytes`) and its output: lines in order, `timestamps` as an RFC 3339
//! timestamp with nine fractional digits and a space, `limitBytes` counting the bytes written
//! (timestamps included), `since` before `tail`.
//!
//! ECI has no streaming and returns at most the newest 2,000 lines. Every call asks for
//! timestamps (stripped unless the client asked for them): `follow` polls from the last
//! timestamp seen, which ECI includes again, and a [`Cursor`] drops what was already written —
//! lines sharing that last timestamp are matched by content, so none is written twice and none
//! is lost. It ends when the container instance ends (its status on the pod), the pod goes, the
//! client leaves, `limitBytes` is reached, or the daemon stops. Polls come every
//! `KUBELET_LOG_POLL_INTERVAL` while lines arrive, backing off to 5x when none do.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use eci_proto::EciError;
use eci_proto::v20180808::DescribeContainerLogRequest;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::{Instrument as _, debug, warn};

use super::KubeletState;
use super::pod_lookup::{LookupError, Target, container_status};
use crate::ops::chain::Chain;

/// ECI's largest `Tail`.
pub const ECI_MAX_TAIL: i64 = 2_000;
/// How many times the poll interval an idle follower waits at most.
const IDLE_BACKOFF: u32 = 5;

/// A log request that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The query is not a valid PodLogOptions.
    #[error("{0}")]
    BadQuery(String),
    /// The pod, container or group was not found.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// ECI refused or failed the log request.
    #[error("ECI cannot return the log of container {container} of pod {pod}")]
    Eci {
        /// `<namespace>/<name>`.
        pod: String,
        /// The container.
        container: String,
        /// Why.
        #[source]
        source: EciError,
    },
}

impl IntoResponse for LogError {
    fn into_response(self) -> Response {
        match self {
            Self::Lookup(lookup) => lookup.into_response(),
            Self::BadQuery(message) => (StatusCode::BAD_REQUEST, message).into_response(),
            Self::Eci { ref source, .. } => {
                // A parameter ECI refuses (no previous instance for `previous`, a range) is the
                // request's fault; the rest is ECI's. Both bodies reach kubectl as they are.
                let status = if source.code.starts_with("InvalidParameter")
                    || source.code.starts_with("MissingParameter")
                {
                    StatusCode::BAD_REQUEST
                } else if source.is_not_found() {
                    StatusCode::NOT_FOUND
                } else {
                    warn!(error = %Chain(&self), "container log request failed");
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                (status, Chain(&self).to_string()).into_response()
            }
        }
    }
}

/// The query of a log request (the kubelet's `v1.PodLogOptions`), checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogOptions {
    /// Keep the response open and write lines as they come.
    pub follow: bool,
    /// The previous (terminated) instance of the container.
    pub previous: bool,
    /// Prefix each line with its timestamp.
    pub timestamps: bool,
    /// `sinceSeconds`, as given (ECI takes it too).
    pub since_seconds: Option<i64>,
    /// Only lines at or after this time (from `sinceTime`, or now − `sinceSeconds`).
    pub since: Option<Timestamp>,
    /// Only the last lines.
    pub tail_lines: Option<i64>,
    /// At most this many bytes written.
    pub limit_bytes: Option<u64>,
}

/// The kubelet's reading of a boolean query parameter: only `0`, `f`, `false`, `n`, `no`
/// (any case) are false; present with any other value (or none) is true.
fn boolean(value: &str) -> bool {
    !(value == "0"
        || ["f", "false", "n", "no"]
            .iter()
            .any(|no| value.eq_ignore_ascii_case(no)))
}

fn integer(name: &str, value: &str) -> Result<i64, LogError> {
    value
        .parse()
        .map_err(|_| LogError::BadQuery(format!("{name}: {value:?} is not an integer")))
}

impl LogOptions {
    /// Reads and checks a query string (`None`: no query) at `now`, as the kubelet does:
    /// `tail` is the old spelling of `tailLines` (`all` = unset), `tailLines` ≥ 0,
    /// `limitBytes` ≥ 1, `sinceSeconds` ≥ 1, at most one of `sinceSeconds` and `sinceTime`,
    /// and `stream` only `All` (ECI does not keep stdout and stderr apart).
    pub fn parse(query: Option<&str>, now: Timestamp) -> Result<Self, LogError> {
        let mut options = Self::default();
        let mut since_time = None;
        let mut tail = None;
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match key.as_ref() {
                "follow" => options.follow = boolean(&value),
                "previous" => options.previous = boolean(&value),
                "timestamps" => options.timestamps = boolean(&value),
                "sinceSeconds" => options.since_seconds = Some(integer("sinceSeconds", &value)?),
                "sinceTime" => {
                    since_time = Some(value.parse::<Timestamp>().map_err(|_| {
                        LogError::BadQuery(format!("sinceTime: {value:?} is not an RFC 3339 time"))
                    })?);
                }
                "tailLines" => options.tail_lines = Some(integer("tailLines", &value)?),
                "tail" => tail = Some(value.into_owned()),
                "limitBytes" => {
                    let limit = integer("limitBytes", &value)?;
                    if limit < 1 {
                        return Err(LogError::BadQuery(format!(
                            "limitBytes: {limit}: must be greater than 0"
                        )));
                    }
                    options.limit_bytes = u64::try_from(limit).ok();
                }
                "stream" if value != "All" => {
                    return Err(LogError::BadQuery(format!(
                        "unable to return the given log stream: {value:?}: ECI keeps stdout and stderr in one log"
                    )));
                }
                // `insecureSkipTLSVerifyBackend` and others are the apiserver's business.
                _ => {}
            }
        }
        if let Some(tail) = tail.filter(|t| !t.is_empty()) {
            options.tail_lines = if tail == "all" {
                None
            } else {
                Some(integer("tail", &tail)?)
            };
        }
        if let Some(lines) = options.tail_lines.filter(|lines| *lines < 0) {
            return Err(LogError::BadQuery(format!(
                "tailLines: {lines}: must be greater than or equal to 0"
            )));
        }
        options.since = match (options.since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err(LogError::BadQuery(
                    "at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
                ));
            }
            (Some(seconds), None) if seconds < 1 => {
                return Err(LogError::BadQuery(format!(
                    "sinceSeconds: {seconds}: must be greater than 0"
                )));
            }
            (Some(seconds), None) => Some(
                now.checked_sub(jiff::SignedDuration::from_secs(seconds))
                    .unwrap_or(Timestamp::MIN),
            ),
            (None, since_time) => since_time,
        };
        Ok(options)
    }

    /// The first `DescribeContainerLog` of a request: timestamps always, ECI's tail capped at
    /// 2,000 (a follow with `tailLines=0` still reads one line, to know where to go on from).
    pub fn first_request(&self, target: &Target, region: &str) -> DescribeContainerLogRequest {
        let tail = self
            .tail_lines
            .unwrap_or(ECI_MAX_TAIL)
            .clamp(1, ECI_MAX_TAIL);
        DescribeContainerLogRequest {
            region_id: region.to_owned(),
            container_group_id: target.group_id.clone(),
            container_name: target.container.clone(),
            start_time: match (self.since_seconds, self.since) {
                (None, Some(since)) => request_time(since),
                _ => String::new(),
            },
            tail: i32::try_from(tail).ok(),
            last_time: self.previous,
            since_seconds: self
                .since_seconds
                .map(|seconds| i32::try_from(seconds).unwrap_or(i32::MAX)),
            limit_bytes: None,
            timestamps: true,
        }
    }

    /// The first page's lines to write: those at or after `since`, then the last `tail`.
    pub fn select(&self, lines: &[Line]) -> Vec<Line> {
        let kept: Vec<Line> = lines
            .iter()
            .filter(|line| self.since.is_none_or(|since| line.at >= since))
            .cloned()
            .collect();
        let tail = self
            .tail_lines
            .and_then(|tail| usize::try_from(tail).ok())
            .unwrap_or(kept.len());
        kept[kept.len().saturating_sub(tail)..].to_vec()
    }
}

/// The poll after the first: from the cursor's last timestamp on (ECI includes it again), or
/// from `since` while nothing was seen yet; ECI's largest tail, and the previous instance's
/// log when the followed instance has just been replaced.
pub fn next_request(
    options: &LogOptions,
    cursor: &Cursor,
    target: &Target,
    region: &str,
    previous_instance: bool,
) -> DescribeContainerLogRequest {
    let mut request = options.first_request(target, region);
    request.last_time = previous_instance;
    request.tail = i32::try_from(ECI_MAX_TAIL).ok();
    // Absolute from now on: `sinceSeconds` again would count from the poll, not the request.
    if let Some(from) = cursor.last.or(options.since) {
        request.start_time = request_time(from);
        request.since_seconds = None;
    }
    request
}

/// RFC 3339 in UTC with nine fractional digits: the kubelet's `RFC3339NanoFixed`. Any time a
/// query or ECI can name, 1970 and before included (humantime's formatter panics there).
pub fn rfc3339_nanos(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S.%9fZ").to_string()
}

/// A time to ask ECI for logs from: no log is older than the epoch, so earlier times (a
/// `sinceTime` of 1960, a `sinceSeconds` of centuries) ask from the epoch.
fn request_time(at: Timestamp) -> String {
    rfc3339_nanos(at.max(Timestamp::UNIX_EPOCH))
}

/// One log line: its timestamp and its text (without the line break).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// When it was written.
    pub at: Timestamp,
    /// What was written.
    pub text: String,
}

/// The lines of a `DescribeContainerLog` answer asked with timestamps (`<RFC 3339> <text>`).
/// A line without a readable timestamp (a runtime's continuation) takes the one before it;
/// one before any timestamp is dropped, as it cannot be placed in time.
pub fn parse_page(content: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut last: Option<Timestamp> = None;
    for raw in content.split_inclusive('\n') {
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let (stamp, text) = raw.split_once(' ').unwrap_or((raw, ""));
        match stamp.parse::<Timestamp>() {
            Ok(at) => {
                last = Some(at);
                lines.push(Line {
                    at,
                    text: text.to_owned(),
                });
            }
            Err(_) => {
                if let Some(at) = last {
                    lines.push(Line {
                        at,
                        text: raw.to_owned(),
                    });
                }
            }
        }
    }
    lines
}

/// Where a follower is: the last timestamp written, and the lines written with exactly that
/// timestamp (the next poll returns them again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The newest timestamp seen.
    pub last: Option<Timestamp>,
    /// The texts seen at `last`, in order.
    at_last: Vec<String>,
}

impl Cursor {
    /// The lines of `page` not seen before, in order; the cursor moves past them. A page is
    /// what ECI returned from `last` on: older lines are old, lines at `last` that were seen
    /// are matched in order (one seen line matches one returned line, so two identical lines
    /// written in the same instant are both kept), newer lines are new.
    pub fn take_new(&mut self, page: Vec<Line>) -> Vec<Line> {
        let mut fresh = Vec::new();
        // How many of `at_last` this page has matched so far.
        let mut matched = 0;
        for line in page {
            match self.last {
                Some(last) if line.at < last => {}
                Some(last) if line.at == last => {
                    if let Some(found) = self.at_last[matched..]
                        .iter()
                        .position(|seen| *seen == line.text)
                    {
                        matched += found + 1;
                    } else {
                        self.at_last.push(line.text.clone());
                        matched = self.at_last.len();
                        fresh.push(line);
                    }
                }
                _ => {
                    self.last = Some(line.at);
                    self.at_last = vec![line.text.clone()];
                    matched = 1;
                    fresh.push(line);
                }
            }
        }
        fresh
    }
}

/// Writes lines the kubelet's way and counts `limitBytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    timestamps: bool,
    remaining: Option<u64>,
}

impl Output {
    /// For `options`.
    pub fn new(options: &LogOptions) -> Self {
        Self {
            timestamps: options.timestamps,
            remaining: options.limit_bytes,
        }
    }

    /// The bytes of `lines`, cut where `limitBytes` runs out (mid-line, as the kubelet cuts).
    pub fn render(&mut self, lines: &[Line]) -> Vec<u8> {
        let mut out = Vec::new();
        for line in lines {
            if self.remaining == Some(0) {
                break;
            }
            let start = out.len();
            if self.timestamps {
                out.extend_from_slice(rfc3339_nanos(line.at).as_bytes());
                out.push(b' ');
            }
            out.extend_from_slice(line.text.as_bytes());
            out.push(b'\n');
            if let Some(remaining) = &mut self.remaining {
                let written = u64::try_from(out.len() - start).unwrap_or(u64::MAX);
                if written >= *remaining {
                    out.truncate(start + usize::try_from(*remaining).unwrap_or(usize::MAX));
                    *remaining = 0;
                } else {
                    *remaining -= written;
                }
            }
        }
        out
    }

    /// `limitBytes` is used up: nothing more will be written.
    pub fn is_full(&self) -> bool {
        self.remaining == Some(0)
    }
}

/// What became of the container instance a follower follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instance {
    /// Still running (or not started yet).
    Running,
    /// It ended; its log is complete.
    Ended,
    /// It ended and a new instance started: its log is now ECI's "previous" log.
    Restarted,
}

/// The followed instance's fate, from the pod now (`None`: gone). `uid` is the followed pod's,
/// `restarts` the container's restart count when following began.
pub fn instance(pod: Option<&Pod>, uid: &str, container: &str, restarts: i32) -> Instance {
    let Some(pod) = pod.filter(|pod| pod.metadata.uid.as_deref() == Some(uid)) else {
        return Instance::Ended;
    };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Instance::Ended;
    }
    match container_status(pod, container) {
        Some(status) if status.restart_count > restarts => Instance::Restarted,
        Some(status)
            if status
                .state
                .as_ref()
                .is_some_and(|state| state.terminated.is_some()) =>
        {
            Instance::Ended
        }
        _ => Instance::Running,
    }
}

/// `GET /containerLogs/{namespace}/{pod}/{container}`.
pub async fn container_logs(
    State(state): State<KubeletState>,
    Path((namespace, name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, LogError> {
    let options = LogOptions::parse(query.as_deref(), Timestamp::now())?;
    let (pod, target) = state.locate(&namespace, &name, &container).await?;
    let restarts = container_status(&pod, &container).map_or(0, |status| status.restart_count);
    let page = fetch(
        &state,
        &target,
        options.first_request(&target, &state.config.site.region),
    )
    .await?;
    let lines = parse_page(&page);
    let selected = options.select(&lines);
    let mut cursor = Cursor::default();
    cursor.take_new(lines);
    let mut output = Output::new(&options);
    let first = output.render(&selected);
    debug!(
        group = %target.group_id,
        lines = selected.len(),
        bytes = first.len(),
        follow = options.follow,
        "container log"
    );
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    // A previous instance has ended: there is nothing to follow.
    if !options.follow || options.previous || output.is_full() {
        return Ok((text, first).into_response());
    }
    let (sender, receiver) = mpsc::channel::<Bytes>(16);
    if !first.is_empty() {
        // Fits: the channel is empty.
        let _ = sender.try_send(Bytes::from(first));
    }
    let follower = Follower {
        state,
        target,
        options,
        cursor,
        output,
        restarts,
        sender,
    };
    tokio::spawn(follower.run().in_current_span());
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), receiver))
    });
    Ok((text, Body::from_stream(body)).into_response())
}

async fn fetch(
    state: &KubeletState,
    target: &Target,
    request: DescribeContainerLogRequest,
) -> Result<String, LogError> {
    target
        .lane()
        .run(state.eci.describe_container_log(request))
        .await
        .map(|answer| answer.content)
        .map_err(|source| LogError::Eci {
            pod: format!("{}/{}", target.namespace, target.pod),
            container: target.container.clone(),
            source,
        })
}

/// A `follow` in progress.
struct Follower {
    state: KubeletState,
    target: Target,
    options: LogOptions,
    cursor: Cursor,
    output: Output,
    restarts: i32,
    sender: mpsc::Sender<Bytes>,
}

impl Follower {
    async fn run(mut self) {
        let base = self.state.config.args.kubelet_log_poll_interval;
        let mut pause = base;
        loop {
            tokio::select! {
                () = self.sender.closed() => {
                    debug!("the client left");
                    return;
                }
                () = self.state.stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            // Read before the poll: an instance that has ended has written everything the
            // poll then returns.
            let fate = match self
                .state
                .pod_on_this_node(&self.target.namespace, &self.target.pod)
                .await
            {
                Ok(pod) => instance(
                    pod.as_ref(),
                    &self.target.uid,
                    &self.target.container,
                    self.restarts,
                ),
                Err(error) => {
                    warn!(error = %Chain(&error), "cannot read the pod of a followed log; polling on");
                    Instance::Running
                }
            };
            let request = next_request(
                &self.options,
                &self.cursor,
                &self.target,
                &self.state.config.site.region,
                fate == Instance::Restarted,
            );
            let page = match fetch(&self.state, &self.target, request).await {
                Ok(page) => page,
                Err(error) => {
                    warn!(error = %Chain(&error), "a log poll failed");
                    if fate != Instance::Running {
                        return;
                    }
                    pause = backoff(pause, base);
                    continue;
                }
            };
            let lines = parse_page(&page);
            let full_page = lines.len() >= usize::try_from(ECI_MAX_TAIL).unwrap_or(usize::MAX);
            let first_new = lines.first().map(|line| line.at);
            let gap = full_page && self.cursor.last.is_some_and(|last| first_new > Some(last));
            let fresh: Vec<Line> = self
                .cursor
                .take_new(lines)
                .into_iter()
                .filter(|line| self.options.since.is_none_or(|since| line.at >= since))
                .collect();
            if gap {
                warn!(
                    limit = ECI_MAX_TAIL,
                    "more lines arrived between two polls than ECI returns at once; some were skipped"
                );
            }
            pause = if fresh.is_empty() {
                backoff(pause, base)
            } else {
                base
            };
            let chunk = self.output.render(&fresh);
            if !chunk.is_empty() && self.sender.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
            if self.output.is_full() || fate != Instance::Running {
                debug!(?fate, "log follow ends");
                return;
            }
        }
    }
}

/// The next idle pause: doubled, at most [`IDLE_BACKOFF`] times the poll interval.
fn backoff(pause: Duration, base: Duration) -> Duration {
    (pause * 2).min(base * IDLE_BACKOFF)
}

#[cfg(test)]
mod tests;
