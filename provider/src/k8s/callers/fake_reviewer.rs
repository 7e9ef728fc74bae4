//! A pretend cluster for the tests of every listener that authenticates its callers (the
//! kubelet API, the scheduler extender): known tokens, exact grants, and how many reviews were
//! asked (cached answers must not ask again).

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::{HeaderMap, header};

use super::{AuthError, ResourceQuestion, Reviewer, UserInfo};

/// Tokens and grants of a pretend cluster, counting the reviews asked.
#[derive(Debug, Default)]
pub struct FakeReviewer {
    /// token → user name.
    pub tokens: Vec<(&'static str, &'static str)>,
    /// (user, the one question they are allowed): anything else is refused.
    pub grants: Vec<(&'static str, ResourceQuestion)>,
    /// TokenReviews asked.
    pub token_reviews: AtomicUsize,
    /// SubjectAccessReviews asked.
    pub access_reviews: AtomicUsize,
}

#[async_trait::async_trait]
impl Reviewer for FakeReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
        self.token_reviews.fetch_add(1, Ordering::SeqCst);
        Ok(self
            .tokens
            .iter()
            .find(|(known, _)| *known == token)
            .map(|(_, name)| UserInfo {
                name: (*name).to_owned(),
                ..UserInfo::default()
            }))
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        asked: &ResourceQuestion,
    ) -> Result<bool, AuthError> {
        self.access_reviews.fetch_add(1, Ordering::SeqCst);
        Ok(self
            .grants
            .iter()
            .any(|(name, granted)| *name == user.name && granted == asked))
    }
}

/// Request headers carrying `token` as a bearer token.
pub fn with_token(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let value = format!("Bearer {token}")
        .parse()
        .unwrap_or_else(|_| unreachable!("a test token is a valid header value"));
    headers.insert(header::AUTHORIZATION, value);
    headers
}
