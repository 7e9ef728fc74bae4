//! Who may call the webhook. When the operator names callers (`WEBHOOK_CALLERS`), a review is
//! read only from one of them, proven by a client certificate of the cluster's client CA or a
//! bearer token the API server accepts — the kubelet API's authentication (`k8s::callers`).
//! Without names the webhook answers any caller, within its listener's bounds: kube-apiserver
//! presents credentials to webhooks only once its admission configuration gives it some.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tls_serve::ConnectionInfo;
use tracing::{debug, warn};

use crate::k8s::callers::{Authenticator, UserInfo, bearer};
use crate::ops::chain::Chain;

/// What a caller may do with the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerAccess {
    /// One of the named callers.
    Allowed,
    /// No credentials the cluster vouches for.
    Unauthenticated,
    /// A known user the operator did not name.
    Refused(String),
}

/// Judges a caller, `user` being who its credentials proved it is (pure).
pub fn judge(user: Option<&UserInfo>, names: &BTreeSet<String>) -> CallerAccess {
    match user {
        None => CallerAccess::Unauthenticated,
        Some(user) if names.contains(&user.name) => CallerAccess::Allowed,
        Some(user) => CallerAccess::Refused(user.name.clone()),
    }
}

/// The callers the operator named, and how a caller proves its name.
pub struct WebhookCallers {
    names: BTreeSet<String>,
    authenticator: Authenticator,
}

impl std::fmt::Debug for WebhookCallers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookCallers")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl WebhookCallers {
    /// `names` may call, as `authenticator` proves them.
    pub fn new(names: impl IntoIterator<Item = String>, authenticator: Authenticator) -> Self {
        Self {
            names: names.into_iter().collect(),
            authenticator,
        }
    }
}

/// In front of the review route: 401 without credentials the cluster vouches for, 403 for a
/// caller not named, 503 when the credentials could not be checked; the body is not read
/// before the caller is known.
pub async fn guard(
    State(callers): State<Arc<WebhookCallers>>,
    request: Request,
    next: Next,
) -> Response {
    let certificates = request
        .extensions()
        .get::<ConnectionInfo>()
        .and_then(|info| info.peer_certificates.clone());
    let user = match callers
        .authenticator
        .authenticate(certificates.as_deref(), bearer(request.headers()))
        .await
    {
        Ok(user) => user,
        Err(error) => {
            warn!(error = %Chain(&error), "cannot check the webhook caller's credentials");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot check credentials now\n",
            )
                .into_response();
        }
    };
    match judge(user.as_ref(), &callers.names) {
        CallerAccess::Allowed => next.run(request).await,
        CallerAccess::Unauthenticated => {
            debug!("refused a webhook call without credentials");
            (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response()
        }
        CallerAccess::Refused(name) => {
            debug!(user = %name, "refused a webhook call from a caller not in WEBHOOK_CALLERS");
            (
                StatusCode::FORBIDDEN,
                format!("user {name:?} may not call this webhook\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_and_proven_callers_are_served() {
        let names: BTreeSet<String> = ["kube-apiserver-kubelet-client".to_owned()].into();
        let user = |name: &str| UserInfo {
            name: name.into(),
            ..UserInfo::default()
        };
        for (caller, want) in [
            (None, CallerAccess::Unauthenticated),
            (
                Some(user("kube-apiserver-kubelet-client")),
                CallerAccess::Allowed,
            ),
            (
                Some(user("system:serviceaccount:team-a:admin")),
                CallerAccess::Refused("system:serviceaccount:team-a:admin".into()),
            ),
            // Names are exact: no prefix or case folding.
            (
                Some(user("kube-apiserver-kubelet-client-2")),
                CallerAccess::Refused("kube-apiserver-kubelet-client-2".into()),
            ),
            (
                Some(user("Kube-Apiserver-Kubelet-Client")),
                CallerAccess::Refused("Kube-Apiserver-Kubelet-Client".into()),
            ),
        ] {
            assert_eq!(judge(caller.as_ref(), &names), want, "{caller:?}");
        }
    }
}
