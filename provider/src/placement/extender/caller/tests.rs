use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use tower::ServiceExt as _;

use super::*;
use crate::k8s::callers::fake_reviewer::{FakeReviewer, with_token};

fn cluster() -> Arc<FakeReviewer> {
    Arc::new(FakeReviewer {
        tokens: vec![
            ("scheduler-token", "system:kube-scheduler"),
            ("tenant-token", "tenant-admin"),
        ],
        grants: vec![("system:kube-scheduler", question())],
        ..FakeReviewer::default()
    })
}

fn guard_of(reviewer: &Arc<FakeReviewer>, body_limit: usize) -> CallerGuard {
    CallerGuard::new(
        Arc::clone(reviewer) as Arc<dyn Reviewer>,
        Arc::new(ClientCa::default()),
        body_limit,
    )
}

fn user(name: &str) -> UserInfo {
    UserInfo {
        name: name.to_owned(),
        ..UserInfo::default()
    }
}

#[test]
fn the_question_is_creating_pods_binding_in_every_namespace() {
    let asked = question();
    assert_eq!(
        (asked.verb, asked.group, asked.resource, asked.subresource),
        ("create", "", "pods", "binding")
    );
    assert_eq!((asked.namespace.as_str(), asked.name.as_str()), ("", ""));
}

#[test]
fn decisions_and_their_answers() {
    let table: &[(Option<&str>, bool, Option<StatusCode>)] = &[
        (None, false, Some(StatusCode::UNAUTHORIZED)),
        // Allowed means nothing without a user.
        (None, true, Some(StatusCode::UNAUTHORIZED)),
        (Some("tenant"), false, Some(StatusCode::FORBIDDEN)),
        (Some("scheduler"), true, None),
    ];
    for (name, may_bind, status) in table {
        let decision = decide(name.map(user), *may_bind);
        let answer = refusal(&Ok(decision.clone()));
        assert_eq!(
            answer.as_ref().map(|(status, _)| *status),
            *status,
            "{name:?} {may_bind}: {decision:?}"
        );
    }
    let (_, text) = refusal(&Ok(Decision::Forbidden(user("tenant")))).unwrap();
    assert!(
        text.contains("tenant") && text.contains("pods/binding"),
        "{text}"
    );
}

#[test]
fn a_review_that_cannot_be_made_refuses() {
    let unreachable = || kube::Error::Service("connection refused".into());
    let token = refusal(&Err(AuthError::TokenReview(unreachable())));
    assert_eq!(token.map(|(s, _)| s), Some(StatusCode::UNAUTHORIZED));
    let access = refusal(&Err(AuthError::AccessReview(unreachable())));
    assert_eq!(
        access.map(|(s, _)| s),
        Some(StatusCode::INTERNAL_SERVER_ERROR)
    );
}

#[test]
fn declared_lengths_against_the_limit() {
    let headers = |length: Option<&str>| {
        let mut headers = HeaderMap::new();
        if let Some(length) = length {
            headers.insert(header::CONTENT_LENGTH, length.parse().unwrap());
        }
        headers
    };
    for (length, too_large) in [
        (None, false),
        (Some("0"), false),
        (Some("100"), false),
        (Some("101"), true),
        (Some("18446744073709551615"), true),
        // Not a length: left to the limit applied while reading.
        (Some("lots"), false),
    ] {
        assert_eq!(
            declared_too_large(&headers(length), 100),
            too_large,
            "{length:?}"
        );
    }
}

#[tokio::test]
async fn callers_are_judged_by_token_and_the_binding_question() {
    let reviewer = cluster();
    let guard = guard_of(&reviewer, 1024);
    let judge = |headers: HeaderMap| {
        let guard = &guard;
        async move { guard.judge(None, &headers).await.unwrap() }
    };
    assert_eq!(judge(HeaderMap::new()).await, Decision::Unauthenticated);
    assert_eq!(
        reviewer.token_reviews.load(Ordering::SeqCst),
        0,
        "nothing to review"
    );
    assert_eq!(judge(with_token("forged")).await, Decision::Unauthenticated);
    assert_eq!(
        judge(with_token("tenant-token")).await,
        Decision::Forbidden(user("tenant-admin"))
    );
    assert_eq!(
        judge(with_token("scheduler-token")).await,
        Decision::Allowed(user("system:kube-scheduler"))
    );
    // A client certificate that chains to no CA counts for nothing; the token still does.
    let stranger = [CertificateDer::from(vec![0x30, 0x00])];
    assert_eq!(
        guard
            .judge(Some(&stranger), &with_token("scheduler-token"))
            .await
            .unwrap(),
        Decision::Allowed(user("system:kube-scheduler"))
    );
    assert_eq!(
        guard
            .judge(Some(&stranger), &HeaderMap::new())
            .await
            .unwrap(),
        Decision::Unauthenticated
    );
    // Answers are cached: asking again reviews nothing.
    let (tokens, accesses) = (
        reviewer.token_reviews.load(Ordering::SeqCst),
        reviewer.access_reviews.load(Ordering::SeqCst),
    );
    assert_eq!(
        judge(with_token("tenant-token")).await,
        Decision::Forbidden(user("tenant-admin"))
    );
    assert_eq!(reviewer.token_reviews.load(Ordering::SeqCst), tokens);
    assert_eq!(reviewer.access_reviews.load(Ordering::SeqCst), accesses);
}

/// A route behind the guard that counts the calls reaching it.
fn guarded(guard: CallerGuard, reached: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/resourcepolicy/bind",
            post(move || {
                reached.fetch_add(1, Ordering::SeqCst);
                async { "bound" }
            }),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::new(guard),
            super::guard,
        ))
}

async fn call(router: &Router, token: Option<&str>, body: Vec<u8>) -> StatusCode {
    let mut request = axum::http::Request::post("/resourcepolicy/bind")
        .header(header::CONTENT_LENGTH, body.len());
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    router
        .clone()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn the_middleware_answers_401_403_413_and_lets_the_scheduler_through() {
    let reviewer = cluster();
    let reached = Arc::new(AtomicUsize::new(0));
    let router = guarded(guard_of(&reviewer, 64), Arc::clone(&reached));
    assert_eq!(
        call(&router, None, b"{}".to_vec()).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&router, Some("tenant-token"), b"{}".to_vec()).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "refused calls reach nothing"
    );
    let reviews = reviewer.token_reviews.load(Ordering::SeqCst);
    assert_eq!(
        call(&router, None, vec![b' '; 65]).await,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(
        reviewer.token_reviews.load(Ordering::SeqCst),
        reviews,
        "an oversized body is refused before any review"
    );
    assert_eq!(
        call(&router, Some("scheduler-token"), b"{}".to_vec()).await,
        StatusCode::OK
    );
    assert_eq!(reached.load(Ordering::SeqCst), 1);
}
