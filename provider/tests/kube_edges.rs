//! The daemon's Kubernetes edges against a real control plane of their own (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler): a write racing the registration,
//! takeovers, and Leases changed or deleted behind the holder's back — each produced for real,
//! the apiserver answering as it does in a cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use clap::Parser;
use futures::future::BoxFuture;
use hyper::{Method, Request, Response};
use integration::cluster::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::client::{Body, ClientBuilder};
use serde_json::json;
use tower::{BoxError, Service, ServiceExt as _};
use virtual_node_eci::config::{Config, Settings};
use virtual_node_eci::node::lease::{
    INSTANCE_ANNOTATION, LeaseError, LeaseIdentity, NodeLease, RELEASED_ANNOTATION,
};
use virtual_node_eci::node::registration::register;
use virtual_node_eci::ops::metrics::Telemetry;

/// A control plane of the test's own, in a scratch directory that outlives it.
struct Plane {
    plane: Option<ControlPlane>,
    // Dropped after the plane (fields drop in order): the components go before their files.
    _dir: tempfile::TempDir,
}

impl Plane {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plane = ControlPlane::start(ControlPlaneOptions::new(dir.path()))
            .await
            .expect("the control plane starts");
        Self {
            plane: Some(plane),
            _dir: dir,
        }
    }

    fn get(&self) -> &ControlPlane {
        self.plane.as_ref().unwrap()
    }

    async fn client(&self) -> kube::Client {
        self.get().client().await.unwrap()
    }

    async fn stop(mut self) {
        if let Some(plane) = self.plane.take() {
            plane.stop(Duration::from_secs(10)).await;
        }
    }
}

fn settings() -> Settings {
    Config::parse_from([
        "virtual-node-eci",
        "--node-name=vn-0",
        "--eci=embedded",
        "--vswitch=vsw-test",
        "--security-group=sg-test",
        "--cluster-name=c",
    ])
    .settings()
    .unwrap()
}

fn identity(instance: &str, uid: &str) -> LeaseIdentity {
    LeaseIdentity {
        node: "vn-0".into(),
        node_uid: uid.into(),
        instance: instance.into(),
        duration_seconds: 10,
        renew_interval: Duration::from_millis(200),
    }
}

fn count(telemetry: &Telemetry, operation: &str) -> u64 {
    telemetry
        .render()
        .lines()
        .find(|line| {
            line.starts_with(&format!(
                "virtual_node_eci_kube_requests_total{{operation=\"{operation}\"}}"
            ))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A client middleware that runs a write of someone else's (`race`) right before the first
/// `PATCH` of `path` goes out, and records what the apiserver answered to that PATCH: the
/// request carries what its sender read before the write, exactly as when two writers race.
struct RaceFirstPatch<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    path: String,
    race: Arc<Mutex<Option<BoxFuture<'static, ()>>>>,
    answers: Arc<Mutex<Vec<u16>>>,
}

impl<S, B> Service<Request<Body>> for RaceFirstPatch<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError> + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is awaited on the shared inner service in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let watched = request.method() == Method::PATCH && request.uri().path() == self.path;
        let race = watched.then(|| self.race.lock().unwrap().take()).flatten();
        let (inner, answers) = (Arc::clone(&self.inner), Arc::clone(&self.answers));
        Box::pin(async move {
            if let Some(race) = race {
                race.await;
            }
            let mut service = inner.lock_owned().await;
            let response = service.ready().await?.call(request).await?;
            if watched {
                answers.lock().unwrap().push(response.status().as_u16());
            }
            Ok(response)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_adopts_a_node_and_retries_a_conflicting_write() {
    let plane = Plane::start().await;
    let admin = plane.client().await;
    let admin_nodes: Api<Node> = Api::all(admin);
    let existing: Node = serde_json::from_value(json!({"metadata": {"name": "vn-0", "labels": {"team": "payments"}}, "spec": {"unschedulable": true}})).unwrap();
    let created = admin_nodes
        .create(&PostParams::default(), &existing)
        .await
        .unwrap();

    // Someone labels the Node between the daemon's read and its adoption patch.
    let race: BoxFuture<'static, ()> = {
        let admin_nodes = admin_nodes.clone();
        Box::pin(async move {
            admin_nodes
                .patch(
                    "vn-0",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"owner": "ops"}}})),
                )
                .await
                .expect("the racing write");
        })
    };
    let answers = Arc::new(Mutex::new(Vec::new()));
    let race = Arc::new(Mutex::new(Some(race)));
    let layer = {
        let (race, answers) = (Arc::clone(&race), Arc::clone(&answers));
        tower::layer::layer_fn(move |inner| RaceFirstPatch {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            path: "/api/v1/nodes/vn-0".into(),
            race: Arc::clone(&race),
            answers: Arc::clone(&answers),
        })
    };
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(plane.get().kubeconfig()).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let daemon_client = ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build();
    let nodes: Api<Node> = Api::all(daemon_client);

    let telemetry = Telemetry::new();
    let settings = settings();
    let node = register(
        &nodes,
        &settings.with_site(&settings.config.node),
        &telemetry,
    )
    .await
    .unwrap();
    assert!(race.lock().unwrap().is_none(), "the racing write ran");
    // The apiserver refused the stale patch, then took one made from a fresh read. Another
    // writer of the control plane (the TTL controller annotates new nodes) may race a retry too:
    // each conflict is met with a fresh read and another patch, until one is taken.
    let answers = answers.lock().unwrap().clone();
    assert_eq!(
        answers.first(),
        Some(&409),
        "the stale patch was refused: {answers:?}"
    );
    assert_eq!(
        answers.last(),
        Some(&200),
        "a patch was taken at last: {answers:?}"
    );
    assert!(
        answers[..answers.len() - 1].iter().all(|code| *code == 409),
        "only conflicts before it: {answers:?}"
    );
    assert_eq!(
        count(&telemetry, "node_patch"),
        u64::try_from(answers.len()).unwrap_or(u64::MAX),
        "every conflict was retried: {answers:?}"
    );
    assert_eq!(node.uid(), created.uid(), "adopted, not recreated");
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["team"], "payments");
    assert_eq!(labels["owner"], "ops", "the racing write is not lost");
    assert_eq!(labels["k8s.aliyun.com/vnode"], "true");
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    let stored = admin_nodes.get("vn-0").await.unwrap();
    assert_eq!(stored.labels()["owner"], "ops");
    assert_eq!(stored.labels()["k8s.aliyun.com/vnode"], "true");
    plane.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_takeovers_losses_and_deletions() {
    let plane = Plane::start().await;
    let client = plane.client().await;
    let telemetry = Telemetry::new();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    // The Lease is owned by its Node: a real one, or the garbage collector removes the Lease.
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "vn-0"}})).unwrap();
    let node = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let uid = node.uid().unwrap();

    // A holder that stops renewing (a crash) is taken over after 1.5 of its intervals.
    let crashed = NodeLease::acquire(client.clone(), identity("crashed", &uid), &telemetry)
        .await
        .unwrap();
    drop(crashed);
    let started = tokio::time::Instant::now();
    let mut successor = NodeLease::acquire(client.clone(), identity("successor", &uid), &telemetry)
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let lease = leases.get("vn-0").await.unwrap();
    assert_eq!(lease.annotations()[INSTANCE_ANNOTATION], "successor");
    assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(1));
    assert_eq!(lease.owner_references()[0].uid, uid);

    // Someone else writes to it without taking it (a label): the renewal's stale write is
    // refused, it reads the Lease again, still holds it and renews — keeping the label.
    leases
        .patch(
            "vn-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"audited": "yes"}}})),
        )
        .await
        .unwrap();
    let (renewals_before, gets_before) = (
        count(&telemetry, "lease_renew"),
        count(&telemetry, "lease_get"),
    );
    let before = leases.get("vn-0").await.unwrap().spec.unwrap().renew_time;
    successor.renew(&telemetry).await.unwrap();
    assert_eq!(
        count(&telemetry, "lease_renew") - renewals_before,
        2,
        "the refused renewal was made again"
    );
    assert_eq!(count(&telemetry, "lease_get") - gets_before, 1);
    let renewed = leases.get("vn-0").await.unwrap();
    assert_eq!(renewed.labels()["audited"], "yes");
    assert_eq!(renewed.annotations()[INSTANCE_ANNOTATION], "successor");
    assert_ne!(renewed.spec.unwrap().renew_time, before);

    // Someone else takes it: the next renewal reports the loss.
    leases
        .patch(
            "vn-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {INSTANCE_ANNOTATION: "usurper"}}})),
        )
        .await
        .unwrap();
    match successor.renew(&telemetry).await {
        Err(LeaseError::Lost { instance, .. }) => assert_eq!(instance, "usurper"),
        other => panic!("expected the Lease to be lost, got {other:?}"),
    }

    // A released Lease is taken over at once; a deleted one is created again on renewal.
    leases
        .patch(
            "vn-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {RELEASED_ANNOTATION: "true"}}})),
        )
        .await
        .unwrap();
    let (gets_before, takeovers_before) = (
        count(&telemetry, "lease_get"),
        count(&telemetry, "lease_take_over"),
    );
    let mut third = NodeLease::acquire(client.clone(), identity("third", &uid), &telemetry)
        .await
        .unwrap();
    assert_eq!(
        (
            count(&telemetry, "lease_get") - gets_before,
            count(&telemetry, "lease_take_over") - takeovers_before
        ),
        (1, 1),
        "a released Lease is taken over from the first read, without watching its holder"
    );
    let deleted_uid = leases.get("vn-0").await.unwrap().uid();
    leases.delete("vn-0", &Default::default()).await.unwrap();
    third.renew(&telemetry).await.unwrap();
    let recreated = leases.get("vn-0").await.unwrap();
    assert_ne!(recreated.uid(), deleted_uid, "a new Lease object");
    assert_eq!(recreated.annotations()[INSTANCE_ANNOTATION], "third");
    assert_eq!(recreated.owner_references()[0].uid, uid);
    third.renew(&telemetry).await.unwrap();
    plane.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_form_series_and_background_events_arrive() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as KubeEvent;
    use kube::runtime::events::{Event, EventType, Reporter};
    use virtual_node_eci::ops::events::EventPublisher;

    let plane = Plane::start().await;
    let client = plane.client().await;
    // A namespace of the test's own: nothing else reports there.
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "edges"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let telemetry = Arc::new(Telemetry::new());
    let publisher = EventPublisher::new(
        client.clone(),
        Reporter {
            controller: "virtual-node-eci".into(),
            instance: Some("vn-0".into()),
        },
        Arc::clone(&telemetry),
    );
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some("edges".into()),
        name: Some("web".into()),
        uid: Some("uid-web".into()),
        ..ObjectReference::default()
    };
    let pulling = |image: &str| Event {
        type_: EventType::Normal,
        reason: "Pulling".into(),
        note: Some(format!("Pulling image {image}")),
        action: "Reconcile".into(),
        secondary: None,
    };
    let events: Api<KubeEvent> = Api::namespaced(client, "edges");
    let listed = async || {
        let mut items: Vec<KubeEvent> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("virtual-node-eci"))
            .collect();
        items.sort_by_key(|e| e.metadata.name.clone());
        items
    };

    publisher.publish(&pulling("a"), &pod).await.unwrap();
    let first = listed().await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].reporting_instance.as_deref(), Some("vn-0"));
    assert_eq!(
        first[0].regarding.as_ref().unwrap().uid.as_deref(),
        Some("uid-web")
    );
    assert!(first[0].series.is_none());

    // The same event again: one event, a series of 2. Another note: another event.
    publisher.publish(&pulling("a"), &pod).await.unwrap();
    publisher.publish(&pulling("b"), &pod).await.unwrap();
    let after = listed().await;
    assert_eq!(after.len(), 2);
    let series_a = after
        .iter()
        .find(|e| e.note.as_deref() == Some("Pulling image a"))
        .unwrap();
    assert_eq!(series_a.metadata.name, first[0].metadata.name);
    assert_eq!(series_a.series.as_ref().unwrap().count, 2);
    assert_eq!(count(&telemetry, "event_create"), 2);
    assert_eq!(count(&telemetry, "event_patch"), 1);

    // The first event deleted (expired, say): the repeat starts a new one.
    events
        .delete(
            first[0].metadata.name.as_deref().unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
    publisher.publish(&pulling("a"), &pod).await.unwrap();
    let renewed = listed().await;
    assert_eq!(renewed.len(), 2);
    assert!(renewed.iter().all(|e| e.series.is_none()));

    // Background events arrive without anyone waiting for them.
    for i in 0..20 {
        publisher.publish_later(pulling(&format!("c{i}")), pod.clone());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while listed().await.len() < 22 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "background events did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(listed().await.len(), 22);
    plane.stop().await;
}
