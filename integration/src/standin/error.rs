//! API errors, answered as `meta/v1 Status` objects like kube-apiserver's.

use serde_json::{Value, json};

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// The Status reason (`NotFound`, `Conflict`, …).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details`, when the API gives them.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 NotFound for `plural` `name`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        let mut error = Self::new(404, "NotFound", format!("{what} \"{name}\" not found"));
        error.details = Some(json!({"name": name, "group": group, "kind": plural}));
        error
    }

    /// 404 for a path the API does not serve.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        let mut error = Self::new(
            409,
            "AlreadyExists",
            format!("{what} \"{name}\" already exists"),
        );
        error.details = Some(json!({"name": name, "group": group, "kind": plural}));
        error
    }

    /// 409 Conflict (optimistic concurrency, preconditions).
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let what = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        let mut error = Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {what} \"{name}\": {why}"),
        );
        error.details = Some(json!({"name": name, "group": group, "kind": plural}));
        error
    }

    /// 410 Expired (a resourceVersion too old to watch from).
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 422 Invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 429 TooManyRequests.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// With `details`.
    #[must_use]
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The Status object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// A success Status.
pub fn success_status(code: u16, details: Option<Value>) -> Value {
    let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code});
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}
