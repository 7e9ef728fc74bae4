//! The daemon's Kubernetes edges against the API stand-in in-process: conflicts, takeovers,
//! lost and deleted Leases.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use clap::Parser;
use integration::standin::{FaultRule, StandIn, StandInConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use virtual_node_eci::config::{Config, Settings};
use virtual_node_eci::lease::{
    INSTANCE_ANNOTATION, LeaseError, LeaseIdentity, NodeLease, RELEASED_ANNOTATION,
};
use virtual_node_eci::registration::register;
use virtual_node_eci::telemetry::Telemetry;

fn settings() -> Settings {
    Config::parse_from(["virtual-node-eci", "--node-name", "vn-0"])
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

#[tokio::test]
async fn registration_adopts_a_node_and_retries_a_conflict() {
    let stand_in = StandIn::start(StandInConfig::default()).await.unwrap();
    let client = stand_in.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let existing: Node = serde_json::from_value(json!({"metadata": {"name": "vn-0", "labels": {"team": "payments"}}, "spec": {"unschedulable": true}})).unwrap();
    let created = nodes
        .create(&PostParams::default(), &existing)
        .await
        .unwrap();
    stand_in.faults().add(FaultRule {
        path_prefix: "/api/v1/nodes/vn-0".into(),
        method: Some("PATCH".into()),
        status: Some(409),
        latency_ms: 0,
        count: Some(1),
        duration_ms: None,
    });

    let telemetry = Telemetry::new();
    let node = register(&nodes, &settings(), &telemetry).await.unwrap();
    assert_eq!(
        node.metadata.uid, created.metadata.uid,
        "adopted, not recreated"
    );
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["team"], "payments");
    assert_eq!(labels["k8s.aliyun.com/vnode"], "true");
    assert_eq!(node.spec.unwrap().unschedulable, Some(true));
    assert_eq!(
        count(&telemetry, "node_patch"),
        2,
        "the conflict was retried once"
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn lease_takeovers_losses_and_deletions() {
    let stand_in = StandIn::start(StandInConfig::default()).await.unwrap();
    let client = stand_in.client().await.unwrap();
    let telemetry = Telemetry::new();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");

    // A holder that stops renewing (a crash) is taken over after 1.5 of its intervals.
    let crashed = NodeLease::acquire(client.clone(), identity("crashed", "uid-1"), &telemetry)
        .await
        .unwrap();
    drop(crashed);
    let started = tokio::time::Instant::now();
    let mut successor =
        NodeLease::acquire(client.clone(), identity("successor", "uid-1"), &telemetry)
            .await
            .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let lease = leases.get("vn-0").await.unwrap();
    assert_eq!(
        lease.metadata.annotations.unwrap()[INSTANCE_ANNOTATION],
        "successor"
    );
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));

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
    let mut third = NodeLease::acquire(client.clone(), identity("third", "uid-1"), &telemetry)
        .await
        .unwrap();
    leases.delete("vn-0", &Default::default()).await.unwrap();
    third.renew(&telemetry).await.unwrap();
    assert_eq!(
        leases
            .get("vn-0")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap()[INSTANCE_ANNOTATION],
        "third"
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn events_form_series_and_background_events_arrive() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as KubeEvent;
    use kube::runtime::events::{Event, EventType, Reporter};
    use virtual_node_eci::events::EventPublisher;

    let stand_in = StandIn::start(StandInConfig::default()).await.unwrap();
    let client = stand_in.client().await.unwrap();
    let telemetry = std::sync::Arc::new(Telemetry::new());
    let publisher = EventPublisher::new(
        client.clone(),
        Reporter {
            controller: "virtual-node-eci".into(),
            instance: Some("vn-0".into()),
        },
        std::sync::Arc::clone(&telemetry),
    );
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some("default".into()),
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
    let events: Api<KubeEvent> = Api::namespaced(client, "default");
    let listed = async || {
        let mut items = events.list(&Default::default()).await.unwrap().items;
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while listed().await.len() < 22 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "background events did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listed().await.len(), 22);
    stand_in.stop().await;
}
