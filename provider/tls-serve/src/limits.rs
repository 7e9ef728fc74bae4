//! What an unauthenticated caller may hold on a listener: connections, time to send a request
//! head and its body, body bytes. Checked before any handler runs and before a body is
//! buffered, so that no caller — authenticated or not — can grow the server's memory by
//! opening connections and sending (or not sending) large bodies slowly.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; further clients wait in the kernel's backlog until one
    /// closes.
    pub connections: usize,
    /// A client must send a request's head (line and headers) within this time, including the
    /// first one after the handshake and each next one on a kept-alive connection.
    pub header_read: Duration,
    /// The largest request body; a larger declared `Content-Length` is answered 413 before a
    /// byte of it is read, a larger chunked body fails when it passes the limit.
    pub body_bytes: u64,
    /// A request's whole body must arrive within this time from its head.
    pub body_read: Duration,
    /// Body bytes all requests of the listener may hold at once (each reserves its declared
    /// length, or `body_bytes` when chunked, until its body is read); a request that cannot
    /// reserve within `body_read` is answered 503.
    pub buffered_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            header_read: Duration::from_secs(10),
            body_bytes: 1024 * 1024,
            body_read: Duration::from_secs(10),
            buffered_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Reservations are counted in KiB: a semaphore counts permits in `u32`.
const UNIT: u64 = 1024;

fn units(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX)
}

/// Why a request body was cut.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// More than [`Limits::body_bytes`].
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Not complete within [`Limits::body_read`].
    #[error("request body not received within {after:?}")]
    TimedOut {
        /// The limit.
        after: Duration,
    },
    /// The connection failed while reading.
    #[error("cannot read the request body")]
    Read(#[source] hyper::Error),
}

/// The per-listener state behind [`Limits`]: the body-bytes budget.
#[derive(Debug, Clone)]
pub(crate) struct BodyGate {
    limits: Limits,
    budget: Arc<Semaphore>,
}

impl BodyGate {
    pub(crate) fn new(limits: Limits) -> Self {
        let total = usize::try_from(units(limits.buffered_bytes.max(limits.body_bytes)))
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            limits,
            budget: Arc::new(Semaphore::new(total)),
        }
    }

    /// The request with its body bounded, or the answer that refuses it (and closes the
    /// connection) before any of its body is read.
    pub(crate) async fn admit(
        &self,
        request: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Request<axum::body::Body>, Response> {
        let limit = self.limits.body_bytes;
        let hint = request.body().size_hint();
        if request.body().is_end_stream() || hint.upper() == Some(0) {
            return Ok(request.map(axum::body::Body::new));
        }
        if hint.lower() > limit {
            return Err(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {limit} bytes"),
            ));
        }
        let reserve = hint.upper().unwrap_or(limit).min(limit);
        let deadline = tokio::time::Instant::now() + self.limits.body_read;
        let permit = tokio::time::timeout_at(
            deadline,
            Arc::clone(&self.budget).acquire_many_owned(units(reserve)),
        )
        .await;
        let Ok(Ok(permit)) = permit else {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many request bodies in flight; retry".to_owned(),
            ));
        };
        let after = self.limits.body_read;
        Ok(request.map(|inner| {
            axum::body::Body::new(Bounded {
                inner,
                read: 0,
                limit,
                after,
                deadline: Box::pin(tokio::time::sleep_until(deadline)),
                permit: Some(permit),
            })
        }))
    }
}

/// An answer that ends the connection: its body is not read.
fn refuse(status: StatusCode, message: String) -> Response {
    let mut response = (status, message).into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body cut at a size and a deadline, holding its share of the budget until it is
/// read or dropped.
struct Bounded {
    inner: hyper::body::Incoming,
    read: u64,
    limit: u64,
    after: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Body for Bounded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.permit.is_none() {
            return Poll::Ready(None);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.permit = None;
            let after = self.after;
            return Poll::Ready(Some(Err(BodyError::TimedOut { after })));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.permit = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                self.permit = None;
                Poll::Ready(Some(Err(BodyError::Read(error))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let size = frame.data_ref().map_or(0, Bytes::len);
                self.read += u64::try_from(size).unwrap_or(u64::MAX);
                if self.read > self.limit {
                    self.permit = None;
                    let limit = self.limit;
                    return Poll::Ready(Some(Err(BodyError::TooLarge { limit })));
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.permit.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
