//! Who may call the kubelet API, decided as the kubelet decides it.
//!
//! Authentication ([`crate::k8s::callers`]): a client certificate chaining to the client CA
//! (the apiserver presents its `--kubelet-client-certificate`; user = CN, groups = O), else a
//! bearer token checked with a TokenReview. Anonymous requests get 401. Authorization: a
//! SubjectAccessReview on `nodes`, name = this node, verb from the HTTP method and subresource
//! from the path exactly as the kubelet maps them (its fine-grained subresource first for
//! `/pods`, `/healthz`, `/configz`, then the coarse one); denied → 403. Both answers are cached
//! briefly, with the kubelet's TTLs, in bounded caches.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rustls::pki_types::CertificateDer;
use tls_serve::ConnectionInfo;
use tracing::{debug, warn};

use super::KubeletState;
pub use crate::k8s::callers::{
    ApiReviewer, AuthError, Authenticator, Authorizer, ClientCa, ClientCaSource,
    RequestClientCertificate, ResourceQuestion, Reviewer, UserInfo, bearer,
};
use crate::ops::chain::Chain;

/// The verb the kubelet authorizes an HTTP method as (empty for methods it does not map).
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// `path` is `prefix` or below it (the kubelet's `isSubpath`; a trailing `/` of the prefix
/// does not count).
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The `nodes` subresources a path is authorized as, in the order the kubelet asks (access
/// to any one of them is enough): the fine-grained one first where there is one, then the
/// coarse one (`proxy` for everything without its own: containerLogs, exec, attach,
/// portForward, run, …).
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(2);
    if is_subpath(path, "/allocatedPods")
        || is_subpath(path, "/pods")
        || is_subpath(path, "/runningpods/")
    {
        out.push("pods");
    } else if is_subpath(path, "/healthz") {
        out.push("healthz");
    } else if is_subpath(path, "/configz") {
        out.push("configz");
    }
    out.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else if is_subpath(path, "/statusz") {
        "statusz"
    } else if is_subpath(path, "/flagz") {
        "configz"
    } else {
        "proxy"
    });
    out
}

/// What the guard decided about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    /// Go on, as this user.
    Allowed(UserInfo),
    /// No usable credentials (401).
    Unauthenticated,
    /// Authenticated, but not allowed (403).
    Forbidden {
        /// The user.
        user: UserInfo,
        /// The verb asked.
        verb: &'static str,
        /// The subresources asked, in order.
        subresources: Vec<&'static str>,
    },
}

/// Authentication and authorization of every kubelet API request.
pub struct Guard {
    node: String,
    authenticator: Authenticator,
    authorizer: Authorizer,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("node", &self.node)
            .field("authenticator", &self.authenticator)
            .field("authorizer", &self.authorizer)
            .finish()
    }
}

impl Guard {
    /// A guard for `node`, asking `reviewer`, trusting client certificates of `client_ca`.
    pub fn new(node: String, reviewer: Arc<dyn Reviewer>, client_ca: Arc<ClientCa>) -> Self {
        Self {
            node,
            authenticator: Authenticator::new(Arc::clone(&reviewer), client_ca),
            authorizer: Authorizer::new(reviewer),
        }
    }

    /// Who is calling (see [`Authenticator::authenticate`]).
    pub async fn authenticate(
        &self,
        certificates: Option<&[CertificateDer<'static>]>,
        token: Option<&str>,
    ) -> Result<Option<UserInfo>, AuthError> {
        self.authenticator.authenticate(certificates, token).await
    }

    /// Whether `user` may make this request.
    pub async fn authorize(
        &self,
        user: UserInfo,
        method: &Method,
        path: &str,
    ) -> Result<Authorization, AuthError> {
        let verb = verb(method);
        let subresources = subresources(path);
        for subresource in &subresources {
            let question = ResourceQuestion::node(verb, subresource, &self.node);
            if self.authorizer.allowed(&user, &question).await? {
                return Ok(Authorization::Allowed(user));
            }
        }
        Ok(Authorization::Forbidden {
            user,
            verb,
            subresources,
        })
    }

    /// Authenticates and authorizes one request.
    pub async fn judge(
        &self,
        certificates: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
        method: &Method,
        path: &str,
    ) -> Result<Authorization, AuthError> {
        match self.authenticate(certificates, bearer(headers)).await? {
            None => Ok(Authorization::Unauthenticated),
            Some(user) => self.authorize(user, method, path).await,
        }
    }
}

/// The kubelet's answer for no usable credentials.
fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, "Unauthorized").into_response()
}

/// The middleware in front of every route: 401 without usable credentials, 403 when not
/// allowed, 500 when the decision could not be made; otherwise the route runs with the
/// caller's [`UserInfo`] as a request extension.
pub async fn guard(
    State(state): State<KubeletState>,
    mut request: Request,
    next: Next,
) -> Response {
    let certificates = request
        .extensions()
        .get::<ConnectionInfo>()
        .and_then(|info| info.peer_certificates.clone());
    let path = request.uri().path().to_owned();
    let verdict = state
        .guard
        .judge(
            certificates.as_deref(),
            request.headers(),
            request.method(),
            &path,
        )
        .await;
    match verdict {
        Ok(Authorization::Allowed(user)) => {
            tracing::Span::current().record("user", user.name.as_str());
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Ok(Authorization::Unauthenticated) => unauthorized(),
        Ok(Authorization::Forbidden {
            user,
            verb,
            subresources,
        }) => {
            tracing::Span::current().record("user", user.name.as_str());
            debug!(verb, ?subresources, "forbidden");
            (
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
                    user.name,
                    subresources.join(" ")
                ),
            )
                .into_response()
        }
        Err(error @ AuthError::TokenReview(_)) => {
            warn!(error = %Chain(&error), "cannot authenticate a kubelet API request");
            unauthorized()
        }
        Err(error) => {
            warn!(error = %Chain(&error), "cannot authorize a kubelet API request");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization error (path={path}): {}", Chain(&error)),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests;
