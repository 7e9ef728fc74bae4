//! What tests do to the fixture's etcd directly: compact its history, so that a watch resuming
//! from an older resourceVersion (on an apiserver that reads etcd for it) gets 410 Gone, as it
//! does on a real cluster after the apiserver's periodic compaction. Through etcd's gRPC
//! gateway (JSON over HTTP on the client URL), so no etcd client library is needed.
//!
//! [`super::ControlPlane`] records etcd's client URL in [`URL_FILE`] of its directory, and the
//! apiserver's flags in [`APISERVER_ARGS_FILE`], so a test process that did not start the
//! control plane (the playground did) can still reach both.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The file in the control plane's directory that holds etcd's client URL.
pub const URL_FILE: &str = "etcd.url";
/// The file in the control plane's directory that holds kube-apiserver's flags, one a line.
pub const APISERVER_ARGS_FILE: &str = "kube-apiserver.args";

/// Reaching etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The control plane's directory does not say where etcd is.
    #[error("read {path} (is this directory a control plane's, started by this version?)")]
    Unknown {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// etcd did not answer, or refused.
    #[error("etcd {call} at {url}")]
    Call {
        /// The gateway path.
        call: &'static str,
        /// etcd's client URL.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// etcd's answer has no revision.
    #[error("etcd's answer to {call} has no header revision: {answer}")]
    NoRevision {
        /// The gateway path.
        call: &'static str,
        /// The answer.
        answer: Value,
    },
}

/// etcd's client URL, as the control plane in `dir` recorded it.
pub fn url_in(dir: &Path) -> Result<String, EtcdError> {
    let path = dir.join(URL_FILE);
    std::fs::read_to_string(&path)
        .map(|url| url.trim().to_owned())
        .map_err(|source| EtcdError::Unknown { path, source })
}

async fn call(url: &str, path: &'static str, body: Value) -> Result<Value, EtcdError> {
    let failed = |source| EtcdError::Call {
        call: path,
        url: url.to_owned(),
        source,
    };
    reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(failed)?
        .json()
        .await
        .map_err(failed)
}

/// Compacts etcd's history up to its current revision (physically: it returns once the old
/// revisions are gone) and returns that revision. Every resourceVersion before it is then
/// unavailable to watches served from etcd.
pub async fn compact(url: &str) -> Result<i64, EtcdError> {
    // Tests of one binary share the fixture's etcd: another may compact past the revision read
    // here before this compaction lands, which etcd refuses. The revision is then read again.
    const ATTEMPTS: usize = 5;
    let mut attempt = 1;
    loop {
        let revision = current_revision(url).await?;
        match call(
            url,
            "/v3/kv/compaction",
            json!({"revision": revision.to_string(), "physical": true}),
        )
        .await
        {
            Ok(_) => return Ok(revision),
            Err(EtcdError::Call { source, .. })
                if attempt < ATTEMPTS
                    && source.status() == Some(reqwest::StatusCode::BAD_REQUEST) =>
            {
                tracing::info!(revision, %source, "etcd refused the compaction (compacted past it meanwhile?); again");
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// The store's current revision.
async fn current_revision(url: &str) -> Result<i64, EtcdError> {
    // A range read of one key (`\0`) answers with the store's current revision in its header.
    const RANGE: &str = "/v3/kv/range";
    let answer = call(url, RANGE, json!({"key": "AA=="})).await?;
    // The gateway writes 64-bit integers as strings.
    answer
        .pointer("/header/revision")
        .and_then(|r| {
            r.as_str()
                .and_then(|r| r.parse().ok())
                .or_else(|| r.as_i64())
        })
        .ok_or(EtcdError::NoRevision {
            call: RANGE,
            answer,
        })
}
