//! Who may call the scheduler extender. Its bind creates `pods/binding` as the daemon, and its
//! filter holds places in units, so it answers only a caller that could bind pods itself.
//!
//! Authentication is the kubelet API's (`crate::k8s::callers`): a client certificate
//! chaining to the client CA (kube-scheduler's, through `extenders[].tlsConfig`
//! `certFile`/`keyFile` or `certData`/`keyData`), else a bearer token a TokenReview accepts;
//! neither → 401. Authorization is one SubjectAccessReview, [`question`]: may the caller
//! `create` `pods/binding` in every namespace? kube-scheduler's own role
//! (`system:kube-scheduler`) grants exactly that, so no extra RBAC is needed, and the extender
//! never lets anyone do what the API would not let them do directly; denied → 403.
//!
//! A body declared larger than the limit is refused (413) before any review is asked, so an
//! anonymous flood costs neither a TokenReview nor the memory of its body.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rustls::pki_types::CertificateDer;
use tls_serve::ConnectionInfo;
use tracing::{debug, warn};

use crate::k8s::callers::{
    AuthError, Authenticator, Authorizer, ClientCa, ResourceQuestion, Reviewer, UserInfo, bearer,
};
use crate::ops::chain::Chain;

/// What a caller must be allowed: binding pods anywhere, as kube-scheduler may.
pub fn question() -> ResourceQuestion {
    ResourceQuestion {
        verb: "create",
        group: "",
        resource: "pods",
        subresource: "binding",
        namespace: String::new(),
        name: String::new(),
    }
}

/// What was decided about a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Go on.
    Allowed(UserInfo),
    /// No usable credentials (401).
    Unauthenticated,
    /// Authenticated, not allowed (403).
    Forbidden(UserInfo),
}

/// The decision from who the caller is and, when known, whether they may bind pods.
pub fn decide(user: Option<UserInfo>, may_bind: bool) -> Decision {
    match user {
        None => Decision::Unauthenticated,
        Some(user) if may_bind => Decision::Allowed(user),
        Some(user) => Decision::Forbidden(user),
    }
}

/// The answer to a caller who may not go on (`None`: go on). A TokenReview that could not be
/// made is a 401 (the caller may retry), as the kubelet answers; a SubjectAccessReview that
/// could not be made a 500.
pub fn refusal(decision: &Result<Decision, AuthError>) -> Option<(StatusCode, String)> {
    match decision {
        Ok(Decision::Allowed(_)) => None,
        Ok(Decision::Unauthenticated) | Err(AuthError::TokenReview(_)) => {
            Some((StatusCode::UNAUTHORIZED, "Unauthorized\n".to_owned()))
        }
        Ok(Decision::Forbidden(user)) => {
            let wanted = question();
            Some((
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden: user {} may not {} {}/{} in every namespace, which the scheduler extender requires\n",
                    user.name, wanted.verb, wanted.resource, wanted.subresource
                ),
            ))
        }
        Err(error) => Some((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Authorization error: {}\n", Chain(error)),
        )),
    }
}

/// Whether the request says its body is longer than `limit` (a body without a length is
/// held to the limit as it is read instead).
pub fn declared_too_large(headers: &HeaderMap, limit: usize) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .is_some_and(|length| length > u64::try_from(limit).unwrap_or(u64::MAX))
}

/// Authentication and authorization of the extender's callers.
#[derive(Debug)]
pub struct CallerGuard {
    authenticator: Authenticator,
    authorizer: Authorizer,
    body_limit: usize,
}

impl CallerGuard {
    /// Asking `reviewer`, trusting client certificates of `client_ca`, refusing bodies
    /// declared longer than `body_limit`.
    pub fn new(reviewer: Arc<dyn Reviewer>, client_ca: Arc<ClientCa>, body_limit: usize) -> Self {
        Self {
            authenticator: Authenticator::new(Arc::clone(&reviewer), client_ca),
            authorizer: Authorizer::new(reviewer),
            body_limit,
        }
    }

    /// Who is calling and whether they may.
    pub async fn judge(
        &self,
        certificates: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
    ) -> Result<Decision, AuthError> {
        let Some(user) = self
            .authenticator
            .authenticate(certificates, bearer(headers))
            .await?
        else {
            return Ok(decide(None, false));
        };
        let may_bind = self.authorizer.allowed(&user, &question()).await?;
        Ok(decide(Some(user), may_bind))
    }
}

/// The middleware in front of the extender's routes.
pub async fn guard(
    State(callers): State<Arc<CallerGuard>>,
    request: Request,
    next: Next,
) -> Response {
    if declared_too_large(request.headers(), callers.body_limit) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the scheduler extender takes bodies of at most {} bytes\n",
                callers.body_limit
            ),
        )
            .into_response();
    }
    let certificates = request
        .extensions()
        .get::<ConnectionInfo>()
        .and_then(|info| info.peer_certificates.clone());
    let decision = callers
        .judge(certificates.as_deref(), request.headers())
        .await;
    let path = request.uri().path().to_owned();
    match (&decision, refusal(&decision)) {
        (_, None) => next.run(request).await,
        (Err(error), Some(answer)) => {
            warn!(%path, error = %Chain(error), "cannot judge a scheduler extender caller");
            answer.into_response()
        }
        (Ok(decision), Some(answer)) => {
            debug!(%path, ?decision, "scheduler extender caller refused");
            answer.into_response()
        }
    }
}

#[cfg(test)]
mod tests;
