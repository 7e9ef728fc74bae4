//! Watches: initial state or replay from a resourceVersion, then live changes, bookmarks,
//! timeouts, and 410 for versions too old — as newline-delimited JSON events.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::State;
use super::api::{Api, ListOptions};
use super::error::ApiError;
use super::registry::ResourceType;
use super::store::{Change, ChangeKind};

/// What to watch.
#[derive(Debug, Clone)]
pub(super) struct WatchRequest {
    /// The type.
    pub(super) resource: ResourceType,
    /// The version to present objects in.
    pub(super) version: String,
    /// Only this namespace.
    pub(super) namespace: Option<String>,
    /// Selectors.
    pub(super) options: ListOptions,
    /// `resourceVersion`.
    pub(super) resource_version: Option<String>,
    /// `allowWatchBookmarks`.
    pub(super) bookmarks: bool,
    /// `timeoutSeconds`.
    pub(super) timeout: Duration,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn gone_line(message: &str) -> Bytes {
    line("ERROR", &ApiError::gone(message).to_status())
}

impl WatchRequest {
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        if change.key != self.resource.key()
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != change.namespace)
        {
            return None;
        }
        let now_matches = self.options.matches(&change.object);
        let kind = match change.kind {
            ChangeKind::Added => now_matches.then_some("ADDED"),
            ChangeKind::Deleted => now_matches.then_some("DELETED"),
            ChangeKind::Modified => {
                let was = change
                    .old
                    .as_ref()
                    .is_some_and(|old| self.options.matches(old));
                match (was, now_matches) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
        }?;
        Some(line(
            kind,
            &Api::present(&self.resource, &self.version, change.object.clone()),
        ))
    }

    fn bookmark(&self, rv: u64) -> Bytes {
        line(
            "BOOKMARK",
            &json!({"kind": self.resource.kind, "apiVersion": self.resource.api_version(&self.version), "metadata": {"resourceVersion": rv.to_string()}}),
        )
    }
}

/// Starts a watch; the receiver yields the response body's chunks.
pub(super) fn start(
    state: &Arc<State>,
    request: WatchRequest,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    let (tx, rx) = mpsc::channel(1024);
    if state.faults.take_expired_watch() {
        let _ = tx.try_send(gone_line(
            "too old resource version (expired by a stand-in fault)",
        ));
        return Ok(rx);
    }
    let (first, changes) = {
        let api = state.lock();
        let mut first = Vec::new();
        match request.resource_version.as_deref() {
            None | Some("" | "0") => {
                if let Some(objects) = api.store.objects(&request.resource.key()) {
                    for ((namespace, _), object) in objects {
                        if request.namespace.as_ref().is_none_or(|ns| ns == namespace)
                            && request.options.matches(object)
                        {
                            first.push(line(
                                "ADDED",
                                &Api::present(&request.resource, &request.version, object.clone()),
                            ));
                        }
                    }
                }
            }
            Some(text) => {
                let rv: u64 = text.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version: {text:?}"))
                })?;
                if rv < api.store.compacted() {
                    let _ = tx.try_send(gone_line(&format!(
                        "too old resource version: {rv} ({})",
                        api.store.compacted()
                    )));
                    return Ok(rx);
                }
                first.extend(
                    api.store
                        .changes_since(rv)
                        .filter_map(|change| request.event_for(change)),
                );
            }
        }
        (first, api.store.subscribe())
    };
    let state = Arc::clone(state);
    tokio::spawn(async move {
        for chunk in first {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        follow(&state, &request, changes, &tx).await;
    });
    Ok(rx)
}

async fn follow(
    state: &Arc<State>,
    request: &WatchRequest,
    mut changes: broadcast::Receiver<Arc<Change>>,
    tx: &mpsc::Sender<Bytes>,
) {
    let mut closer = state.faults.watch_closer();
    let deadline = tokio::time::sleep(request.timeout);
    tokio::pin!(deadline);
    let mut bookmarks = tokio::time::interval(state.options.bookmark_interval);
    bookmarks.tick().await;
    loop {
        tokio::select! {
            change = changes.recv() => match change {
                Ok(change) => {
                    if let Some(chunk) = request.event_for(&change) {
                        if tx.send(chunk).await.is_err() {
                            return;
                        }
                    }
                }
                // Too slow a reader, or shutdown: end the watch; the client watches again.
                Err(_) => return,
            },
            _ = bookmarks.tick(), if request.bookmarks => {
                // Every change up to `rv` is already in the channel: deliver what is buffered
                // first, so the bookmark never claims a version whose events are still queued.
                let mut rv = state.lock().store.rv();
                while let Ok(change) = changes.try_recv() {
                    rv = rv.max(change.rv);
                    if let Some(chunk) = request.event_for(&change) {
                        if tx.send(chunk).await.is_err() {
                            return;
                        }
                    }
                }
                if tx.send(request.bookmark(rv)).await.is_err() {
                    return;
                }
            }
            () = &mut deadline => return,
            _ = closer.changed() => return,
            () = tx.closed() => return,
        }
    }
}
