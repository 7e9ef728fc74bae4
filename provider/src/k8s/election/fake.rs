//! An in-memory Lease API for tests: get, create and replace with the apiserver's
//! preconditions (create of an existing Lease and a replace whose `resourceVersion` is stale
//! are conflicts), so races between contenders can be played without a control plane.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;

/// The stored Leases, by name (one namespace).
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeLeases {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    leases: HashMap<String, Lease>,
    version: u64,
}

fn status(code: StatusCode, reason: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": reason, "reason": reason, "code": code.as_u16(),
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

fn ok(code: StatusCode, lease: &Lease) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(
            serde_json::to_string(lease).expect("a Lease serializes"),
        ))
        .expect("a valid response")
}

impl FakeLeases {
    /// A client whose requests this fake answers.
    pub(crate) fn client(&self) -> kube::Client {
        let fake = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let fake = fake.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(Body::new(body), usize::MAX)
                    .await
                    .unwrap_or_default();
                Ok::<_, std::convert::Infallible>(fake.answer(
                    &parts.method,
                    parts.uri.path(),
                    &body,
                ))
            }
        });
        kube::Client::new(service, "default")
    }

    fn answer(&self, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
        let mut state = self.state.lock();
        let name = path
            .rsplit_once("/leases/")
            .map(|(_, name)| name.to_owned());
        let sent = || serde_json::from_slice::<Lease>(body).expect("a Lease was sent");
        match (method, name) {
            (&Method::GET, Some(name)) => match state.leases.get(&name) {
                Some(lease) => ok(StatusCode::OK, lease),
                None => status(StatusCode::NOT_FOUND, "NotFound"),
            },
            (&Method::POST, None) => {
                let mut lease = sent();
                let name = lease.metadata.name.clone().unwrap_or_default();
                if state.leases.contains_key(&name) {
                    return status(StatusCode::CONFLICT, "AlreadyExists");
                }
                state.version += 1;
                lease.metadata.resource_version = Some(state.version.to_string());
                lease.metadata.uid = Some(format!("uid-{}", state.version));
                state.leases.insert(name, lease.clone());
                ok(StatusCode::CREATED, &lease)
            }
            (&Method::PUT, Some(name)) => {
                let mut lease = sent();
                let Some(stored) = state.leases.get(&name) else {
                    // As the apiserver: a write naming the uid of an object that is gone fails
                    // its uid precondition.
                    return if lease.metadata.uid.is_some() {
                        status(StatusCode::CONFLICT, "Conflict")
                    } else {
                        status(StatusCode::NOT_FOUND, "NotFound")
                    };
                };
                if lease.metadata.resource_version.is_some()
                    && lease.metadata.resource_version != stored.metadata.resource_version
                {
                    return status(StatusCode::CONFLICT, "Conflict");
                }
                lease.metadata.uid.clone_from(&stored.metadata.uid);
                state.version += 1;
                lease.metadata.resource_version = Some(state.version.to_string());
                state.leases.insert(name, lease.clone());
                ok(StatusCode::OK, &lease)
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
        }
    }

    /// The stored Lease.
    pub(crate) fn get(&self, name: &str) -> Option<Lease> {
        let state = self.state.lock();
        state.leases.get(name).cloned()
    }

    /// Writes `lease` as someone else would (no precondition), returning what is stored.
    pub(crate) fn put(&self, lease: Lease) -> Lease {
        let mut state = self.state.lock();
        state.version += 1;
        let mut lease = lease;
        lease.metadata.resource_version = Some(state.version.to_string());
        let name = lease.metadata.name.clone().unwrap_or_default();
        state.leases.insert(name, lease.clone());
        lease
    }

    /// Deletes the Lease.
    pub(crate) fn delete(&self, name: &str) {
        let mut state = self.state.lock();
        state.leases.remove(name);
    }
}

/// A wall clock that starts at `start` and moves with tokio's (pausable) clock.
pub(crate) fn paused_clock(start: std::time::SystemTime) -> super::Clock {
    let base = tokio::time::Instant::now();
    Arc::new(move || start + base.elapsed())
}
