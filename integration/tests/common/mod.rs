//! Helpers for the stand-in's own tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration::standin::{StandIn, StandInConfig};
use serde_json::{Value, json};

pub async fn start() -> (StandIn, kube::Client) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let stand_in = StandIn::start(StandInConfig {
        bookmark_interval: Duration::from_millis(200),
        ..StandInConfig::default()
    })
    .await
    .expect("stand-in starts");
    let client = stand_in.client().await.expect("client");
    (stand_in, client)
}

/// Waits for `condition` with a generous timeout (no fixed sleeps: returns as soon as it holds).
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[allow(clippy::needless_pass_by_value)] // callers pass `json!(..)` literals
pub fn pod(name: &str, node: Option<&str>, labels: Value) -> k8s_openapi::api::core::v1::Pod {
    let mut spec = json!({"containers": [{"name": "app", "image": "nginx:1.27"}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec}))
        .unwrap()
}

/// A tiny HTTPS admission webhook for tests: answers every review with `patch` (a JSON patch),
/// or denies when `patch` is `None`. Returns its URL and the CA bundle (PEM).
pub async fn webhook_server(patch: Option<Value>) -> (String, String) {
    use std::sync::Arc;

    use axum::routing::post;
    use base64::Engine as _;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/mutate",
        post(move |axum::Json(review): axum::Json<Value>| {
            let patch = patch.clone();
            async move {
                let uid = review["request"]["uid"].clone();
                let response = match patch {
                    Some(patch) => json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                        "patch": base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&patch).unwrap())}),
                    None => json!({"uid": uid, "allowed": false, "status": {"code": 403, "message": "pods here need a label"}}),
                };
                axum::Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
            }
        }),
    );
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let app = app.clone();
                        async move {
                            tower::ServiceExt::oneshot(app, request.map(axum::body::Body::new))
                                .await
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    (format!("https://{addr}/mutate"), ca.pem())
}
