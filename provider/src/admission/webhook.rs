//! The embedded Selector admission webhook: HTTPS server, certificate, registration, caches,
//! and the normalNodePrefer spill watcher. Off unless `--webhook` (WEBHOOK_ENABLED).

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use vne_core::selector::engine::{Scope, Vnode};

use crate::ops::supervisor::Supervisor;
use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Reporter};
use tls_serve::{CertificateFiles, ClientAuth, Limits, ReloadableCertificate, TlsServer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::AdmissionMetrics;
use super::cache::Caches;
use super::register::Registration;
use super::review::Admission;
use super::webhook_callers::WebhookCallers;
use super::{cache, register, spill};
use crate::config::{AdmissionArgs, SelectorScope, WithSite};
use crate::k8s::serving_cert as webhook_cert;
use crate::k8s::shared_watch::ClusterWatches;
use crate::ops::chain::Chain;
use crate::ops::events::EventPublisher;
use crate::ops::metrics::{MetricSet as _, ResultLabels, Telemetry};

/// How often the certificate files are checked for a renewal.
const CERT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// The largest AdmissionReview read: the API server takes request bodies up to 3 MiB and the
/// webhook is called for pod CREATEs (one object, no old one) and ResourcePolicies (small). A
/// larger declared body is answered 413 before a byte of it is read (`tls_serve::Limits`).
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// What any caller may hold on the webhook's port: the port answers before it knows who calls,
/// so bodies are bounded in size, time and total bytes in flight.
fn limits() -> Limits {
    Limits {
        body_bytes: BODY_LIMIT as u64,
        ..Limits::default()
    }
}

struct Served {
    admission: Admission,
    metrics: AdmissionMetrics,
    events: mpsc::Sender<(ObjectReference, String)>,
}

async fn review(State(served): State<Arc<Served>>, body: Bytes) -> Response {
    let started = std::time::Instant::now();
    if let Some(placement) = &served.admission.placement {
        // A policy's listing under way (its first seconds): its counts would miss pods.
        placement
            .settle(crate::placement::ADMISSION_LISTING_WAIT)
            .await;
    }
    let (result, response) = match served.admission.review(&body) {
        Ok((review, outcome)) => {
            if let Some(event) = outcome.event {
                // Best effort and never on the request's path.
                let _ = served.events.try_send(event);
            }
            (
                if outcome.patched {
                    "patched"
                } else {
                    "allowed"
                },
                axum::Json(review).into_response(),
            )
        }
        Err(error) => {
            // The cause (where the JSON broke) is what the caller needs to see.
            let error = Chain(&error).to_string();
            debug!(%error, "refused a malformed admission request");
            ("invalid", (StatusCode::BAD_REQUEST, error).into_response())
        }
    };
    served
        .metrics
        .admission_seconds
        .observe(started.elapsed().as_secs_f64());
    served
        .metrics
        .admission_reviews
        .get_or_create(&ResultLabels {
            result: result.into(),
        })
        .inc();
    response
}

/// The router serving admission reviews at `path`.
fn router(served: Arc<Served>, path: &str, callers: Option<Arc<WebhookCallers>>) -> Router {
    let router = Router::new()
        .route(path, axum::routing::post(review))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(served);
    match callers {
        Some(callers) => router.layer(axum::middleware::from_fn_with_state(
            callers,
            super::webhook_callers::guard,
        )),
        None => router,
    }
}

/// The callers the operator named (none: any caller), their client CA loaded before the first
/// call and kept current on `tasks`.
async fn webhook_callers(
    config: &WithSite<AdmissionArgs>,
    client: &kube::Client,
    tasks: &mut Supervisor,
    stop: &CancellationToken,
) -> Option<Arc<WebhookCallers>> {
    use crate::k8s::callers::{ApiReviewer, Authenticator, ClientCa, ClientCaSource};
    let named = config.args.callers();
    if named.is_empty() {
        return None;
    }
    let client_ca = Arc::new(ClientCa::default());
    let source = ClientCaSource::Cluster(client.clone());
    source.load_into(&client_ca).await;
    let keep = source.keep_current(Arc::clone(&client_ca), stop.clone());
    tasks.spawn_critical("webhook callers' client CA", async move {
        keep.await;
        Ok(())
    });
    let reviewer = Arc::new(ApiReviewer::new(client.clone()));
    Some(Arc::new(WebhookCallers::new(
        named,
        Authenticator::new(reviewer, client_ca),
    )))
}

fn vnode(config: &WithSite<AdmissionArgs>) -> Vnode {
    Vnode {
        taint_key: config.site.taint_key.clone(),
        taint_value: config.site.taint_value.clone(),
        taint_effect: config.site.taint_effect.as_str().to_owned(),
        ..Vnode::default()
    }
}

async fn publish_warnings(
    recorder: EventPublisher,
    mut warnings: mpsc::Receiver<(ObjectReference, String)>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let (reference, note) = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            next = warnings.recv() => match next {
                Some(next) => next,
                None => return Ok(()),
            },
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "SelectorBudgetExceeded".into(),
            note: Some(note),
            action: "Admit".into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &reference).await {
            debug!(%error, "could not publish an event");
        }
    }
}

async fn keep_registered(
    client: kube::Client,
    registration: Registration,
    mut ca: watch::Receiver<Option<String>>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut ticks = tokio::time::interval(Duration::from_secs(60));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let pem = ca.borrow_and_update().clone();
        if let Err(error) = register::reconcile(client.clone(), &registration, pem.as_deref()).await
        {
            warn!(%error, configuration = %registration.name, "could not register the webhook; retrying");
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
            changed = ca.changed() => changed?,
        }
    }
}

/// Follows certificate renewals with the caBundle: when the served certificate was reloaded
/// from `dir`, the CA next to it is what the API server must trust from now on.
async fn follow_ca(
    dir: std::path::PathBuf,
    mut renewals: watch::Receiver<u64>,
    ca: watch::Sender<Option<String>>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            changed = renewals.changed() => changed?,
        }
        let fresh = std::fs::read_to_string(dir.join("ca.crt")).ok();
        ca.send_if_modified(|current| {
            let changed = *current != fresh;
            current.clone_from(&fresh);
            changed
        });
    }
}

/// The webhook's serving certificate, from its directory or the shared Secret: retried until
/// it can be had (the webhook is optional to the node, failurePolicy Ignore, so a certificate
/// that cannot be had yet is no reason to stop serving the node); `None` on a stop first.
async fn load_certificate(
    client: &kube::Client,
    config: &WithSite<AdmissionArgs>,
    stop: &CancellationToken,
) -> anyhow::Result<Option<webhook_cert::Material>> {
    let namespace = &config.site.pod_namespace;
    // One certificate for the webhook's Service and the scheduler extender's.
    let names = crate::placement::certificate_names(&config.site.webhook_service, namespace);
    let attempt = || async {
        match &config.args.webhook_cert_dir {
            Some(dir) => webhook_cert::from_dir(dir),
            None => {
                let secret = &config.site.webhook_secret;
                webhook_cert::from_secret(client.clone(), namespace, secret, &names).await
            }
        }
    };
    let loaded = attempt
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_secs(1))
                .with_max_delay(Duration::from_secs(60))
                .without_max_times(),
        )
        .notify(|error, wait| {
            warn!(error = %Chain(error), retry_in = ?wait, "no webhook certificate yet; pods are admitted without the webhook meanwhile");
        });
    tokio::select! {
        () = stop.cancelled() => Ok(None),
        loaded = loaded => Ok(Some(loaded?)),
    }
}

/// The TLS server and its listener. Client certificates are asked for only when callers are
/// named; the chain is judged per request against the CA in force then
/// (`super::webhook_callers`).
async fn listen(
    config: &WithSite<AdmissionArgs>,
    certificate: Arc<ReloadableCertificate>,
) -> anyhow::Result<(TlsServer, TcpListener)> {
    let client_auth = if config.args.callers().is_empty() {
        ClientAuth::None
    } else {
        ClientAuth::Verify(Arc::new(
            crate::k8s::callers::RequestClientCertificate::default(),
        ))
    };
    let server = TlsServer::new(certificate, client_auth)?.with_limits(limits());
    let listener = TcpListener::bind(config.args.webhook_addr)
        .await
        .with_context(|| {
            format!(
                "--webhook-addr (WEBHOOK_ADDR): cannot listen on {}",
                config.args.webhook_addr
            )
        })?;
    info!(address = %listener.local_addr()?, path = %config.args.webhook_path, "serving the Selector admission webhook");
    Ok((server, listener))
}

/// The MutatingWebhookConfiguration this replica keeps registered.
fn registration(config: &WithSite<AdmissionArgs>) -> Registration {
    Registration {
        name: config.args.webhook_configuration.clone(),
        service: config.site.webhook_service.clone(),
        namespace: config.site.pod_namespace.clone(),
        port: config.args.webhook_service_port,
        path: config.args.webhook_path.clone(),
        timeout_seconds: config.args.webhook_timeout_seconds,
        skip_namespaces: config
            .args
            .webhook_skip_namespaces
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect(),
        taint_key: config.site.taint_key.clone(),
    }
}

/// What a review reads, shared by every request; and the receiving end of its Warnings.
fn served(
    config: &WithSite<AdmissionArgs>,
    caches: &Arc<Caches>,
    placement: Option<Arc<crate::placement::Shared>>,
    telemetry: &Arc<Telemetry>,
) -> (Arc<Served>, mpsc::Receiver<(ObjectReference, String)>) {
    let (warnings, warnings_out) = mpsc::channel(256);
    let scope = match config.args.selector_scope {
        SelectorScope::Namespace => Scope::Namespaced {
            home: config.site.pod_namespace.clone(),
        },
        SelectorScope::Cluster => Scope::Cluster,
    };
    let served = Arc::new(Served {
        admission: Admission {
            caches: Arc::clone(caches),
            vnode: vnode(config),
            scope,
            placement,
        },
        metrics: AdmissionMetrics::of(telemetry),
        events: warnings,
    });
    (served, warnings_out)
}

/// The caches' feeds: Selectors, namespaces, the seal key, the eci-profile, the capacity view
/// (from the replica's shared pod and node `watches`) and the spill watch.
fn spawn_feeds(
    tasks: &mut Supervisor,
    client: &kube::Client,
    config: &WithSite<AdmissionArgs>,
    caches: &Arc<Caches>,
    recorder: &EventPublisher,
    watches: ClusterWatches,
    telemetry: &Arc<Telemetry>,
) {
    let stop = tasks.stop().clone();
    let (profile_namespace, profile_name) = config
        .args
        .eci_profile_configmap
        .split_once('/')
        .map(|(n, m)| (n.to_owned(), m.to_owned()))
        .unwrap_or_else(|| {
            (
                "kube-system".into(),
                config.args.eci_profile_configmap.clone(),
            )
        });
    let vnode = vnode(config);
    let (client, caches, recorder) = (client.clone(), Arc::clone(caches), recorder.clone());
    tasks.spawn_critical(
        "Selector watch",
        cache::watch_selectors(
            client.clone(),
            Arc::clone(&caches),
            recorder.clone(),
            stop.clone(),
        ),
    );
    tasks.spawn_critical(
        "namespace watch",
        cache::watch_namespaces(client.clone(), Arc::clone(&caches), stop.clone()),
    );
    tasks.spawn_critical(
        "Selector seal key",
        cache::load_seal(
            client.clone(),
            Arc::clone(&caches),
            config.site.pod_namespace.clone(),
            stop.clone(),
        ),
    );
    tasks.spawn_critical(
        "eci-profile watch",
        cache::watch_profile(
            client.clone(),
            Arc::clone(&caches),
            profile_namespace,
            profile_name,
            recorder.clone(),
            stop.clone(),
        ),
    );
    tasks.spawn_critical(
        "capacity view",
        cache::watch_capacity(
            watches,
            caches,
            (vnode.label_key.clone(), vnode.label_value.clone()),
            stop.clone(),
        ),
    );
    tasks.spawn_critical(
        "spill watch",
        spill::run(client, vnode, recorder, Arc::clone(telemetry), stop),
    );
}

/// With the certificate from a directory: its reload (cert-manager, or whoever writes the
/// files, renews them; a changed ca.crt alone, a CA rotation announced before the leaf
/// changes, counts as a renewal too) and the caBundle that follows it.
fn spawn_certificate_reload(
    tasks: &mut Supervisor,
    dir: std::path::PathBuf,
    certificate: &Arc<ReloadableCertificate>,
    ca: watch::Sender<Option<String>>,
) {
    let stop = tasks.stop().clone();
    let files = CertificateFiles {
        companions: vec![dir.join("ca.crt")],
        ..CertificateFiles::in_dir(&dir)
    };
    let renewals = certificate.subscribe();
    let (certificate, watch_stop) = (Arc::clone(certificate), stop.clone());
    tasks.spawn_critical("certificate reload", async move {
        files
            .watch(certificate, CERT_RELOAD_INTERVAL, watch_stop)
            .await;
        Ok(())
    });
    tasks.spawn_critical("caBundle", follow_ca(dir, renewals, ca, stop));
}

/// Serves, registers and feeds the webhook until cancelled; a failed part fails it. The
/// capacity view reads the replica's shared pod and node `watches`.
pub async fn run(
    client: kube::Client,
    config: WithSite<AdmissionArgs>,
    placement: Option<Arc<crate::placement::Shared>>,
    watches: ClusterWatches,
    telemetry: Arc<Telemetry>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let Some(material) = load_certificate(&client, &config, &stop).await? else {
        return Ok(());
    };
    let certificate = Arc::new(ReloadableCertificate::new(material.certified_key()?));
    let (server, listener) = listen(&config, Arc::clone(&certificate)).await?;
    let recorder = EventPublisher::new(
        client.clone(),
        Reporter {
            controller: "virtual-node-eci".into(),
            instance: Some(config.site.node_name.clone()),
        },
        Arc::clone(&telemetry),
    );
    let caches = Arc::new(Caches::new(!config.args.no_default_selectors));
    let (served, warnings_out) = served(&config, &caches, placement, &telemetry);
    let (ca_sender, ca_receiver) = watch::channel(material.ca_pem.clone());

    let mut tasks = Supervisor::new(&stop);
    let stop = tasks.stop().clone();
    spawn_feeds(
        &mut tasks, &client, &config, &caches, &recorder, watches, &telemetry,
    );
    tasks.spawn_critical(
        "admission events",
        publish_warnings(recorder, warnings_out, stop.clone()),
    );
    tasks.spawn_critical(
        "webhook registration",
        keep_registered(
            client.clone(),
            registration(&config),
            ca_receiver,
            stop.clone(),
        ),
    );
    if let Some(dir) = config.args.webhook_cert_dir.clone() {
        spawn_certificate_reload(&mut tasks, dir, &certificate, ca_sender);
    }
    let callers = webhook_callers(&config, &client, &mut tasks, &stop).await;
    let router = router(served, &config.args.webhook_path, callers);
    tasks.spawn_critical("webhook server", async move {
        server.serve(listener, router, stop).await;
        Ok(())
    });
    Ok(tasks.join().await?)
}

/// The API accesses of the webhook (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "eci.aliyun.com",
        resource: "selectors",
        verbs: &["list", "watch"],
        why: "the Selector cache",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "namespaces",
        verbs: &["list", "watch"],
        why: "namespace labels for namespaceLabels",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::OwnNamespace,
        group: "",
        resource: "configmaps",
        verbs: &["list", "watch"],
        why: "the legacy eci-profile ConfigMap (expected in the daemon's namespace)",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        why: "the capacity view for normalNodePrefer ratios",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "pods",
        verbs: &["list", "watch", "patch"],
        why: "the capacity view, and the toleration for unschedulable normalNodePrefer pods",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::OwnNamespace,
        group: "",
        resource: "secrets",
        verbs: &["get", "create"],
        why: "the shared webhook certificate",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "admissionregistration.k8s.io",
        resource: "mutatingwebhookconfigurations",
        verbs: &["get", "create", "update"],
        why: "register the webhook and keep its caBundle current",
    },
];

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt as _;

    use super::*;

    fn served() -> Arc<Served> {
        Arc::new(Served {
            admission: Admission {
                caches: Arc::new(Caches::new(true)),
                vnode: Vnode::default(),
                scope: Scope::Cluster,
                placement: None,
            },
            metrics: AdmissionMetrics::of(&Telemetry::new()),
            events: mpsc::channel(1).0,
        })
    }

    async fn post(body: Vec<u8>) -> (StatusCode, String) {
        let answer = router(served(), "/mutate-pods", None)
            .oneshot(
                Request::post("/mutate-pods")
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = answer.status();
        let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn malformed_and_oversize_reviews_get_a_clear_refusal() {
        let (status, text) = post(b"{\"kind\": 1".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with("malformed AdmissionReview"), "{text}");

        // Padding inside a valid document: only the size is wrong.
        let mut big = b"{\"pad\": \"".to_vec();
        big.resize(BODY_LIMIT + 1, b'x');
        big.extend_from_slice(b"\"}");
        let (status, text) = post(big).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(text.contains("length limit exceeded"), "{text}");

        // Just within the limit is read (and refused only for what it says).
        let mut fits = b"{\"pad\": \"".to_vec();
        fits.resize(BODY_LIMIT - 2, b'x');
        fits.extend_from_slice(b"\"}");
        let (status, text) = post(fits).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with("malformed AdmissionReview"), "{text}");
    }
}
