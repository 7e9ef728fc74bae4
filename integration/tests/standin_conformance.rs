//! The stand-in's conformance to the API conventions, exercised through kube-rs over HTTPS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use base64::Engine as _;
use common::{eventually, pod, start, webhook_server};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

#[allow(clippy::needless_pass_by_value)] // callers pass `json!(..)` literals
fn configmap(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

fn api_status(error: &kube::Error) -> u16 {
    match error {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_delivers_ordered_events_and_bookmarks() {
    let (stand_in, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let start_rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=w"), &start_rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &configmap("a", json!({"app": "w"})))
        .await
        .unwrap();
    api.create(&PostParams::default(), &configmap("b", json!({"app": "w"})))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &configmap("ignored", json!({"app": "other"})),
    )
    .await
    .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v2"}})),
    )
    .await
    .unwrap();
    // Relabelling `b` out of the selector is a DELETED for this watch.
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "gone"}}})),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();

    let mut seen = Vec::new();
    let mut last_rv = 0u64;
    let mut bookmarks = 0;
    while seen.len() < 5 || bookmarks == 0 {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("events arrive")
            .unwrap()
            .unwrap();
        let (kind, object) = match event {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Bookmark(b) => {
                let rv: u64 = b.metadata.resource_version.parse().unwrap();
                assert!(rv >= last_rv, "a bookmark never goes back");
                bookmarks += 1;
                continue;
            }
            WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
        };
        let rv: u64 = object
            .metadata
            .resource_version
            .clone()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rv > last_rv, "events are ordered by resourceVersion");
        last_rv = rv;
        seen.push(format!("{kind} {}", object.metadata.name.unwrap()));
    }
    assert_eq!(
        seen,
        vec!["ADDED a", "ADDED b", "MODIFIED a", "DELETED b", "DELETED a"]
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn too_old_resource_version_is_gone_and_reflectors_relist() {
    let (stand_in, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let old_rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(
        &PostParams::default(),
        &configmap("before", json!({"test": "relist"})),
    )
    .await
    .unwrap();
    stand_in.compact();
    let mut stream = api
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Error(error) => assert_eq!(error.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }

    // kube-rs' reflector, unmodified, survives closed watches and a 410 by relisting.
    let (reader, writer) = reflector::store();
    let events = reflector(
        writer,
        watcher(
            api.clone(),
            watcher::Config::default().labels("test=relist"),
        )
        .default_backoff(),
    )
    .applied_objects()
    .boxed();
    // Errors (the 410) are part of the stream; the watcher recovers from them by itself.
    let driver = tokio::spawn(events.for_each(|_| async {}));
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 1);
    stand_in.compact();
    stand_in.faults().close_watches();
    stand_in.faults().expire_next_watches(1);
    api.create(
        &PostParams::default(),
        &configmap("after", json!({"test": "relist"})),
    )
    .await
    .unwrap();
    eventually("the reflector to see the new object", || {
        let reader = reader.clone();
        async move { reader.state().len() == 2 }
    })
    .await;
    driver.abort();
    stand_in.stop().await;
}

#[tokio::test]
async fn optimistic_concurrency_and_no_op_updates() {
    let (stand_in, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let created = api
        .create(&PostParams::default(), &configmap("occ", json!({})))
        .await
        .unwrap();
    let mut first = created.clone();
    first.data = Some([("k".to_owned(), "one".to_owned())].into());
    let updated = api
        .replace("occ", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    let mut stale = created.clone();
    stale.data = Some([("k".to_owned(), "two".to_owned())].into());
    let error = api
        .replace("occ", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 409);
    // Writing the same object again changes nothing, not even the resourceVersion.
    let again = api
        .replace("occ", &PostParams::default(), &updated)
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        updated.metadata.resource_version
    );
    assert_eq!(
        api_status(
            &api.create(&PostParams::default(), &configmap("occ", json!({})))
                .await
                .unwrap_err()
        ),
        409
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn every_patch_type() {
    let (stand_in, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(
        &PostParams::default(),
        &pod("patched", None, json!({"a": "1"})),
    )
    .await
    .unwrap();
    let params = PatchParams::default();
    pods.patch(
        "patched",
        &params,
        &Patch::Merge(json!({"metadata": {"labels": {"a": null, "b": "2"}}})),
    )
    .await
    .unwrap();
    let json_patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}}
    ]))
    .unwrap();
    pods.patch("patched", &params, &Patch::<()>::Json(json_patch))
        .await
        .unwrap();
    pods.patch(
        "patched",
        &params,
        &Patch::Strategic(json!({"spec": {"containers": [{"name": "app", "image": "nginx:1.28"}, {"name": "sidecar", "image": "envoy"}]}})),
    )
    .await
    .unwrap();
    let current = pods.get("patched").await.unwrap();
    assert_eq!(
        current.metadata.labels.unwrap(),
        [("b".to_owned(), "2".to_owned())].into()
    );
    let tolerations = current.spec.as_ref().unwrap().tolerations.clone().unwrap();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("k8s.aliyun.com/vnode"))
    );
    let containers = current.spec.unwrap().containers;
    assert_eq!(
        containers.len(),
        2,
        "strategic merge merges containers by name"
    );
    assert_eq!(containers[0].image.as_deref(), Some("nginx:1.28"));
    let error = pods
        .patch(
            "patched",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod"})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 415);
    stand_in.stop().await;
}

#[tokio::test]
async fn status_subresource_is_separate_from_spec() {
    let (stand_in, client) = start().await;
    let nodes: Api<Node> = Api::all(client);
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": "vn-0"}, "spec": {"podCIDR": "10.0.0.0/24"}}),
    )
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    // Status through the main resource is ignored...
    nodes
        .patch(
            "vn-0",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    let current = nodes.get("vn-0").await.unwrap();
    assert!(
        current
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .is_none()
    );
    assert_eq!(current.metadata.labels.unwrap()["x"], "y");
    // ...and spec through /status is ignored.
    nodes
        .patch_status(
            "vn-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}, "spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let current = nodes.get("vn-0").await.unwrap();
    assert_eq!(current.status.unwrap().phase.as_deref(), Some("Running"));
    assert!(current.spec.unwrap().unschedulable.is_none());
    stand_in.stop().await;
}

#[tokio::test]
async fn pods_bound_to_a_node_are_deleted_gracefully() {
    let (stand_in, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(
        &PostParams::default(),
        &pod("bound", Some("vn-0"), json!({})),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod("unbound", None, json!({})))
        .await
        .unwrap();

    pods.delete("unbound", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_status(&pods.get("unbound").await.unwrap_err()),
        404,
        "an unbound pod goes at once"
    );

    pods.delete("bound", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = pods.get("bound").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete(
        "bound",
        &DeleteParams {
            grace_period_seconds: Some(5),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        pods.get("bound")
            .await
            .unwrap()
            .metadata
            .deletion_grace_period_seconds,
        Some(5),
        "a shorter grace period wins"
    );

    let wrong_uid = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_status(&pods.delete("bound", &wrong_uid).await.unwrap_err()),
        409
    );
    let right_uid = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: terminating.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete("bound", &right_uid).await.unwrap();
    assert_eq!(api_status(&pods.get("bound").await.unwrap_err()), 404);
    stand_in.stop().await;
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (stand_in, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut held = configmap("held", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    assert!(
        api.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_status(&api.get("held").await.unwrap_err()), 404);
    stand_in.stop().await;
}

#[tokio::test]
async fn eviction_honours_pod_disruption_budgets() {
    let (stand_in, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["web-0", "web-1"] {
        pods.create(
            &PostParams::default(),
            &pod(name, Some("vn-0"), json!({"app": "web"})),
        )
        .await
        .unwrap();
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})))
            .await
            .unwrap();
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client, "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})).unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let error = pods
        .evict("web-0", &EvictParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 429);
    assert!(error.to_string().contains("disruption budget"), "{error}");

    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
    )
    .await
    .unwrap();
    pods.evict("web-0", &EvictParams::default()).await.unwrap();
    assert!(
        pods.get("web-0")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "eviction deletes gracefully"
    );
    let error = pods
        .evict("web-1", &EvictParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 429, "web-0 no longer counts as healthy");
    stand_in.stop().await;
}

async fn create_webhook(
    client: &kube::Client,
    name: &str,
    url: &str,
    ca: &str,
    failure_policy: &str,
    namespace_selector: serde_json::Value,
) {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
        )),
    );
    let config: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.example.com"),
            "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": namespace_selector,
            "failurePolicy": failure_policy, "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 2
        }]
    }))
    .unwrap();
    api.create(&PostParams::default(), &config).await.unwrap();
}

#[tokio::test]
async fn admission_webhooks_mutate_pods_and_honour_failure_policy() {
    let (stand_in, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for (name, labels) in [
        ("eci", json!({"alibabacloud.com/eci": "true"})),
        ("plain", json!({})),
    ] {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    let (url, ca) = webhook_server(Some(json!([
        {"op": "add", "path": "/spec/nodeSelector", "value": {"k8s.aliyun.com/vnode": "true"}},
        {"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}
    ])))
    .await;
    create_webhook(
        &client,
        "vnode",
        &url,
        &ca,
        "Fail",
        json!({"matchLabels": {"alibabacloud.com/eci": "true"}}),
    )
    .await;

    let in_eci: Api<Pod> = Api::namespaced(client.clone(), "eci");
    let created = in_eci
        .create(
            &PostParams::default(),
            &pod("steered", None, json!({"app": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(
        created.spec.unwrap().node_selector.unwrap()["k8s.aliyun.com/vnode"],
        "true"
    );
    assert_eq!(created.metadata.labels.unwrap()["mutated"], "yes");
    let plain: Api<Pod> = Api::namespaced(client.clone(), "plain");
    let untouched = plain
        .create(
            &PostParams::default(),
            &pod("untouched", None, json!({"app": "x"})),
        )
        .await
        .unwrap();
    assert!(
        untouched.spec.unwrap().node_selector.is_none(),
        "the namespace selector excludes it"
    );

    // A webhook that cannot be reached: Ignore lets the pod through, Fail rejects it.
    create_webhook(
        &client,
        "down-ignore",
        "https://127.0.0.1:1/mutate",
        &ca,
        "Ignore",
        json!({}),
    )
    .await;
    plain
        .create(
            &PostParams::default(),
            &pod("despite-outage", None, json!({})),
        )
        .await
        .unwrap();
    create_webhook(
        &client,
        "down-fail",
        "https://127.0.0.1:1/mutate",
        &ca,
        "Fail",
        json!({}),
    )
    .await;
    let error = plain
        .create(&PostParams::default(), &pod("blocked", None, json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 500);
    assert!(
        error
            .to_string()
            .contains("failed calling webhook \"down-fail/down-fail.example.com\""),
        "{error}"
    );

    let log = stand_in.admission_log();
    assert!(
        log.iter()
            .any(|r| r.webhook == "vnode/vnode.example.com" && r.outcome == "patched")
    );
    assert!(
        log.iter()
            .any(|r| r.webhook == "down-ignore/down-ignore.example.com"
                && r.outcome.starts_with("ignored"))
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn denying_webhook_rejects_the_pod() {
    let (stand_in, client) = start().await;
    let (url, ca) = webhook_server(None).await;
    create_webhook(&client, "deny", &url, &ca, "Fail", json!({})).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let error = pods
        .create(&PostParams::default(), &pod("denied", None, json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 403);
    assert!(
        error.to_string().contains("pods here need a label"),
        "{error}"
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn label_and_field_selectors_and_pagination() {
    let (stand_in, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let node = if i % 2 == 0 {
            Some("vn-0")
        } else {
            Some("vn-1")
        };
        pods.create(
            &PostParams::default(),
            &pod(
                &format!("p{i}"),
                node,
                json!({"idx": i.to_string(), "tier": if i < 3 { "front" } else { "back" }}),
            ),
        )
        .await
        .unwrap();
    }
    let names = |list: kube::api::ObjectList<Pod>| {
        list.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<BTreeSet<_>>()
    };
    let on_node = pods
        .list(&ListParams::default().fields("spec.nodeName=vn-0"))
        .await
        .unwrap();
    assert_eq!(
        names(on_node),
        ["p0", "p2", "p4", "p6"].map(String::from).into()
    );
    let front = pods
        .list(&ListParams::default().labels("tier in (front),idx!=1"))
        .await
        .unwrap();
    assert_eq!(names(front), ["p0", "p2"].map(String::from).into());
    let all_namespaces: Api<Pod> = Api::all(client);
    let across = all_namespaces
        .list(&ListParams::default().fields("spec.nodeName=vn-1,metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(across.items.len(), 3);
    assert_eq!(
        api_status(
            &pods
                .list(&ListParams::default().fields("spec.containers=x"))
                .await
                .unwrap_err()
        ),
        400
    );

    let mut seen = BTreeSet::new();
    let mut params = ListParams::default().limit(3);
    loop {
        let page = pods.list(&params).await.unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.into_iter().map(|p| p.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(seen.len(), 7);
    stand_in.stop().await;
}

#[tokio::test]
async fn crds_are_served_in_every_version() {
    let (stand_in, client) = start().await;
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
        )),
    );
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "selectors.eci.aliyun.com"},
        "spec": {"group": "eci.aliyun.com", "scope": "Namespaced",
            "names": {"plural": "selectors", "singular": "selector", "kind": "Selector"},
            "versions": [
                {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}
            ]}
    }))
    .unwrap();
    let created = crds.create(&PostParams::default(), &crd).await.unwrap();
    let conditions = created.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True")
    );

    let resource = |version: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("eci.aliyun.com", version, "Selector"),
            "selectors",
        )
    };
    let beta: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &resource("v1beta1"));
    let v1: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource("v1"));
    let selector: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "eci.aliyun.com/v1beta1", "kind": "Selector", "metadata": {"name": "test-fair"},
        "spec": {"objectLabels": {"matchLabels": {"app": "nginx"}}, "policy": {"fair": {}}, "priority": 1}
    }))
    .unwrap();
    beta.create(&PostParams::default(), &selector)
        .await
        .unwrap();
    let read = v1.get("test-fair").await.unwrap();
    assert_eq!(read.types.unwrap().api_version, "eci.aliyun.com/v1");
    assert_eq!(read.data["spec"]["priority"], 1);
    assert_eq!(
        beta.list(&ListParams::default()).await.unwrap().items[0]
            .types
            .clone()
            .unwrap()
            .api_version,
        "eci.aliyun.com/v1beta1"
    );
    let discovery = kube::discovery::Discovery::new(client).run().await.unwrap();
    let group = discovery
        .get("eci.aliyun.com")
        .expect("the CRD's group is discoverable");
    assert_eq!(group.preferred_version_or_latest(), "v1");
    assert_eq!(group.versions().collect::<Vec<_>>(), vec!["v1", "v1beta1"]);
    stand_in.stop().await;
}

#[tokio::test]
async fn scale_binding_reviews_and_injected_faults() {
    let (stand_in, client) = start().await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), "kube-system");
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "virtual-node-eci"},
        "spec": {"replicas": 1, "serviceName": "virtual-node-eci", "selector": {"matchLabels": {"app": "vn"}},
            "template": {"metadata": {"labels": {"app": "vn"}}, "spec": {"containers": [{"name": "vk", "image": "vk:1"}]}}}
    }))
    .unwrap();
    sts.create(&PostParams::default(), &set).await.unwrap();
    sts.patch_scale(
        "virtual-node-eci",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    assert_eq!(
        sts.get_scale("virtual-node-eci")
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(3)
    );
    assert_eq!(
        sts.get("virtual-node-eci")
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(3)
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("to-bind", None, json!({})))
        .await
        .unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "to-bind"}, "target": {"kind": "Node", "name": "vn-2"}});
    let request = http::Request::post("/api/v1/namespaces/default/pods/to-bind/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding).unwrap())
        .unwrap();
    client.request_text(request).await.unwrap();
    assert_eq!(
        pods.get("to-bind")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("vn-2")
    );

    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {"user": "mallory", "resourceAttributes": {"verb": "get", "resource": "pods"}}})).unwrap();
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    assert!(!answer.status.unwrap().allowed);

    stand_in.faults().add(integration::standin::FaultRule {
        path_prefix: "/api/v1/namespaces/default/configmaps".into(),
        method: Some("GET".into()),
        status: Some(500),
        latency_ms: 0,
        count: Some(1),
        duration_ms: None,
    });
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    assert_eq!(
        api_status(&cms.list(&ListParams::default()).await.unwrap_err()),
        500
    );
    cms.list(&ListParams::default()).await.unwrap();
    stand_in.stop().await;
}

#[tokio::test]
async fn service_accounts_are_mounted_and_tokens_issued_like_a_real_cluster() {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::core::v1::ServiceAccount;

    let (stand_in, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    let created = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    assert_eq!(
        created.metadata.labels.unwrap()["kubernetes.io/metadata.name"],
        "team-a"
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "team-a");
    assert!(
        maps.get("kube-root-ca.crt").await.unwrap().data.unwrap()["ca.crt"]
            .contains("BEGIN CERTIFICATE")
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let created = pods
        .create(&PostParams::default(), &pod("with-token", None, json!({})))
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    let volume = spec
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("the token volume is injected");
    let sources = volume.projected.unwrap().sources.unwrap();
    assert_eq!(
        sources[0].service_account_token.as_ref().unwrap().path,
        "token"
    );
    let mounts = spec.containers[0].volume_mounts.clone().unwrap();
    assert!(mounts.iter().any(
        |m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount"
            && m.read_only == Some(true)
    ));

    let mut opted_out = pod("no-token", None, json!({}));
    opted_out
        .spec
        .as_mut()
        .unwrap()
        .automount_service_account_token = Some(false);
    assert!(
        pods.create(&PostParams::default(), &opted_out)
            .await
            .unwrap()
            .spec
            .unwrap()
            .volumes
            .is_none()
    );
    let mut unknown = pod("unknown-account", None, json!({}));
    unknown.spec.as_mut().unwrap().service_account_name = Some("builder".into());
    let error = pods
        .create(&PostParams::default(), &unknown)
        .await
        .unwrap_err();
    assert_eq!(api_status(&error), 403);

    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "team-a");
    let token = accounts
        .create_token_request(
            "default",
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3607}}))
                .unwrap(),
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let reviews: Api<TokenReview> = Api::all(client);
    let review = reviews
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"token": token}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        review.status.unwrap().user.unwrap().username.as_deref(),
        Some("system:serviceaccount:team-a:default")
    );
    stand_in.stop().await;
}

#[tokio::test]
async fn deleting_an_owner_collects_its_dependents() {
    let (stand_in, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let owner = api
        .create(&PostParams::default(), &configmap("owner", json!({})))
        .await
        .unwrap();
    let mut dependent = configmap("dependent", json!({}));
    dependent.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.metadata.uid.clone().unwrap(),
            ..Default::default()
        },
    ]);
    api.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_status(&api.get("dependent").await.unwrap_err()), 404);
    stand_in.stop().await;
}
