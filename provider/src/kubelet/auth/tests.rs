use std::sync::atomic::Ordering;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

use axum::http::header;
use rustls::pki_types::UnixTime;

use super::*;
use crate::k8s::callers::fake_reviewer::{FakeReviewer, with_token};

#[test]
fn paths_map_to_subresources_as_the_kubelet_maps_them() {
    let table: &[(&str, &[&str])] = &[
        ("/containerLogs/ns/pod/c", &["proxy"]),
        ("/exec/ns/pod/c", &["proxy"]),
        ("/attach/ns/pod/uid/c", &["proxy"]),
        ("/portForward/ns/pod", &["proxy"]),
        ("/run/ns/pod/c", &["proxy"]),
        ("/spec/", &["proxy"]),
        ("/", &["proxy"]),
        ("/stats/summary", &["stats"]),
        ("/stats", &["stats"]),
        ("/statsfoo", &["proxy"]),
        ("/metrics", &["metrics"]),
        ("/metrics/resource", &["metrics"]),
        ("/metrics/cadvisor", &["metrics"]),
        ("/metricsx", &["proxy"]),
        ("/logs/", &["log"]),
        ("/logs/messages", &["log"]),
        ("/checkpoint/ns/pod/c", &["checkpoint"]),
        ("/statusz", &["statusz"]),
        ("/flagz", &["configz"]),
        ("/pods", &["pods", "proxy"]),
        ("/pods/", &["pods", "proxy"]),
        ("/podsx", &["proxy"]),
        ("/runningpods/", &["pods", "proxy"]),
        ("/allocatedPods", &["pods", "proxy"]),
        ("/healthz", &["healthz", "proxy"]),
        ("/healthz/ping", &["healthz", "proxy"]),
        ("/configz", &["configz", "proxy"]),
    ];
    for (path, expected) in table {
        assert_eq!(subresources(path), *expected, "{path}");
    }
}

#[test]
fn methods_map_to_verbs_as_the_kubelet_maps_them() {
    for (method, expected) in [
        (Method::GET, "get"),
        (Method::POST, "create"),
        (Method::PUT, "update"),
        (Method::PATCH, "patch"),
        (Method::DELETE, "delete"),
        (Method::HEAD, ""),
        (Method::OPTIONS, ""),
    ] {
        assert_eq!(verb(&method), expected, "{method}");
    }
}

#[test]
fn bearer_tokens_are_read_from_the_authorization_header() {
    let headers = |value: &str| {
        let mut map = HeaderMap::new();
        map.insert(header::AUTHORIZATION, value.parse().unwrap());
        map
    };
    assert_eq!(bearer(&headers("Bearer abc")), Some("abc"));
    assert_eq!(bearer(&headers("bearer  abc ")), Some("abc"));
    assert_eq!(bearer(&headers("Basic abc")), None);
    assert_eq!(bearer(&headers("Bearer ")), None);
    assert_eq!(bearer(&HeaderMap::new()), None);
}

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    fn client(
        &self,
        cn: &str,
        groups: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![usage];
        params.signed_by(&key, &self.issuer).unwrap().der().clone()
    }
}

#[test]
fn client_certificates_name_their_user_only_when_they_chain_to_the_client_ca() {
    let (ca, other) = (Ca::new("cluster CA"), Ca::new("someone else"));
    let trusted = ClientCa::default();
    let apiserver = ca.client(
        "kube-apiserver-kubelet-client",
        // (rcgen writes one O at most; each O would be a group.)
        &["system:masters"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    assert_eq!(
        trusted.user(std::slice::from_ref(&apiserver), UnixTime::now()),
        None,
        "no CA loaded yet: nobody by certificate"
    );
    assert!(trusted.set_pem(ca.pem.as_bytes()).unwrap());
    assert!(
        !trusted.set_pem(ca.pem.as_bytes()).unwrap(),
        "the same CA again is no change"
    );
    assert_eq!(
        trusted.user(std::slice::from_ref(&apiserver), UnixTime::now()),
        Some(UserInfo {
            name: "kube-apiserver-kubelet-client".into(),
            groups: vec!["system:masters".into()],
            ..UserInfo::default()
        })
    );
    let stranger = other.client("mallory", &[], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(trusted.user(&[stranger], UnixTime::now()), None);
    let server_only = ca.client("server", &[], ExtendedKeyUsagePurpose::ServerAuth);
    assert_eq!(
        trusted.user(&[server_only], UnixTime::now()),
        None,
        "a server certificate is no client credential"
    );
    let nameless = ca.client("", &["g"], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(trusted.user(&[nameless], UnixTime::now()), None);
    // A rotation: the new CA's clients get in, the old one's no longer.
    assert!(trusted.set_pem(other.pem.as_bytes()).unwrap());
    assert_eq!(trusted.user(&[apiserver], UnixTime::now()), None);
    assert!(matches!(
        trusted.set_pem(b"not pem"),
        Err(AuthError::EmptyClientCa)
    ));
}

fn guard_with(reviewer: FakeReviewer) -> (Guard, Arc<FakeReviewer>) {
    let reviewer = Arc::new(reviewer);
    let guard = Guard::new(
        "vn-0".into(),
        Arc::clone(&reviewer) as Arc<dyn Reviewer>,
        Arc::new(ClientCa::default()),
    );
    (guard, reviewer)
}

#[tokio::test]
async fn no_credentials_a_refused_token_and_a_forbidden_user() {
    let (guard, reviewer) = guard_with(FakeReviewer {
        tokens: vec![("reader-token", "reader")],
        grants: vec![("reader", ResourceQuestion::node("get", "stats", "vn-0"))],
        ..FakeReviewer::default()
    });
    let judge = |headers: HeaderMap, path: &'static str| {
        let guard = &guard;
        async move {
            guard
                .judge(None, &headers, &Method::GET, path)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        judge(HeaderMap::new(), "/healthz").await,
        Authorization::Unauthenticated
    );
    assert_eq!(
        reviewer.token_reviews.load(Ordering::SeqCst),
        0,
        "nothing to review"
    );
    assert_eq!(
        judge(with_token("forged"), "/healthz").await,
        Authorization::Unauthenticated
    );
    assert!(matches!(
        judge(with_token("reader-token"), "/stats/summary").await,
        Authorization::Allowed(user) if user.name == "reader"
    ));
    assert_eq!(
        judge(with_token("reader-token"), "/containerLogs/ns/p/c").await,
        Authorization::Forbidden {
            user: UserInfo {
                name: "reader".into(),
                ..UserInfo::default()
            },
            verb: "get",
            subresources: vec!["proxy"],
        }
    );
}

#[tokio::test]
async fn the_fine_grained_subresource_is_asked_first_and_proxy_still_grants() {
    let (guard, reviewer) = guard_with(FakeReviewer {
        tokens: vec![("admin-token", "admin"), ("pods-token", "lister")],
        grants: vec![
            ("admin", ResourceQuestion::node("get", "proxy", "vn-0")),
            ("lister", ResourceQuestion::node("get", "pods", "vn-0")),
        ],
        ..FakeReviewer::default()
    });
    let allowed = |token: &'static str| {
        let guard = &guard;
        async move {
            matches!(
                guard
                    .judge(None, &with_token(token), &Method::GET, "/pods")
                    .await
                    .unwrap(),
                Authorization::Allowed(_)
            )
        }
    };
    assert!(allowed("admin-token").await, "nodes/proxy covers /pods");
    assert_eq!(
        reviewer.access_reviews.load(Ordering::SeqCst),
        2,
        "pods (denied), then proxy"
    );
    assert!(
        allowed("pods-token").await,
        "nodes/pods is enough for /pods"
    );
    assert_eq!(reviewer.access_reviews.load(Ordering::SeqCst), 3);
    assert!(
        !matches!(
            guard
                .judge(
                    None,
                    &with_token("pods-token"),
                    &Method::GET,
                    "/exec/ns/p/c"
                )
                .await
                .unwrap(),
            Authorization::Allowed(_)
        ),
        "but not for exec"
    );
}

#[tokio::test]
async fn answers_are_cached_briefly() {
    let (guard, reviewer) = guard_with(FakeReviewer {
        tokens: vec![("admin-token", "admin")],
        grants: vec![("admin", ResourceQuestion::node("get", "proxy", "vn-0"))],
        ..FakeReviewer::default()
    });
    for _ in 0..5 {
        let verdict = guard
            .judge(
                None,
                &with_token("admin-token"),
                &Method::GET,
                "/containerLogs/a/b/c",
            )
            .await
            .unwrap();
        assert!(matches!(verdict, Authorization::Allowed(_)));
        let refused = guard
            .judge(None, &with_token("forged"), &Method::GET, "/healthz")
            .await
            .unwrap();
        assert_eq!(refused, Authorization::Unauthenticated);
        let forbidden = guard
            .judge(
                None,
                &with_token("admin-token"),
                &Method::POST,
                "/exec/a/b/c",
            )
            .await
            .unwrap();
        assert!(matches!(
            forbidden,
            Authorization::Forbidden { verb: "create", .. }
        ));
    }
    assert_eq!(
        reviewer.token_reviews.load(Ordering::SeqCst),
        2,
        "one review per token"
    );
    assert_eq!(
        reviewer.access_reviews.load(Ordering::SeqCst),
        2,
        "one review per (user, verb, subresource)"
    );
}
