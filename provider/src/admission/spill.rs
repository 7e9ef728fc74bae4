//! normalNodePrefer, second half: a pod the scheduler marks `PodScheduled=False,
//! reason=Unschedulable` gets the vnode toleration appended (tolerations may be added to a live
//! pod), so its next scheduling attempt may use a virtual node. Every replica watches only
//! unscheduled pods; the patch carries the resourceVersion it was decided on, so exactly one
//! replica's patch lands and the others get a conflict.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use vne_core::selector::engine::{POLICY_ANNOTATION, Vnode, tolerates, vnode_toleration};

use crate::ops::events::EventPublisher;
use crate::ops::metrics::Telemetry;

/// Whether the pod is a normalNodePrefer pod the scheduler could not place and that does not
/// tolerate virtual nodes yet (pure).
pub fn should_spill(pod: &Pod, vnode: &Vnode) -> bool {
    let prefer =
        pod.annotations().get(POLICY_ANNOTATION).map(String::as_str) == Some("normalNodePrefer");
    let unschedulable = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
    let unbound = pod
        .spec
        .as_ref()
        .is_none_or(|s| s.node_name.as_deref().unwrap_or_default().is_empty());
    prefer
        && unschedulable
        && unbound
        && pod.metadata.deletion_timestamp.is_none()
        && !tolerates(pod, vnode)
}

/// The merge patch that appends the toleration, pinned to the pod's resourceVersion.
pub fn spill_patch(pod: &Pod, vnode: &Vnode) -> serde_json::Value {
    let mut tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    tolerations.push(vnode_toleration(vnode));
    json!({
        "metadata": {"resourceVersion": pod.resource_version()},
        "spec": {"tolerations": tolerations},
    })
}

/// Watches unscheduled pods until cancelled.
pub async fn run(
    client: kube::Client,
    vnode: Vnode,
    recorder: EventPublisher,
    telemetry: Arc<Telemetry>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields("spec.nodeName=");
    let mut events = watcher(api, config).default_backoff().boxed();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        let pod = match event {
            None => anyhow::bail!("the unscheduled-pod watch ended"),
            Some(Err(error)) => {
                debug!(%error, "unscheduled-pod watch error; it recovers by itself");
                continue;
            }
            Some(Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod))) => pod,
            Some(Ok(_)) => continue,
        };
        if !should_spill(&pod, &vnode) {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        telemetry.kube_request("pod_patch");
        match pods
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(spill_patch(&pod, &vnode)),
            )
            .await
        {
            Ok(patched) => {
                info!(pod = %format!("{namespace}/{}", pod.name_any()), "normal nodes cannot take the pod: it may now use virtual nodes");
                let event = Event {
                    type_: EventType::Normal,
                    reason: "SpillToVirtualNodes".into(),
                    note: Some("normalNodePrefer: no normal node can take the pod; the virtual-node toleration was added".into()),
                    action: "Schedule".into(),
                    secondary: None,
                };
                if let Err(error) = recorder.publish(&event, &patched.object_ref(&())).await {
                    debug!(%error, "could not publish an event");
                }
            }
            // Another replica patched first, or the pod changed: the watch shows the new state.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
            Err(error) => {
                warn!(%error, pod = %format!("{namespace}/{}", pod.name_any()), "could not add the virtual-node toleration");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[allow(clippy::needless_pass_by_value)] // json! borrows
    fn mk_pod(annotations: Value, reason: &str, tolerations: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "resourceVersion": "7", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "i"}], "tolerations": tolerations},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason}]},
        }))
        .unwrap()
    }

    #[test]
    fn only_unschedulable_prefer_pods_without_the_toleration_spill() {
        let vnode = Vnode::default();
        let prefer = json!({POLICY_ANNOTATION: "normalNodePrefer"});
        assert!(should_spill(
            &mk_pod(prefer.clone(), "Unschedulable", json!([])),
            &vnode
        ));
        assert!(!should_spill(
            &mk_pod(json!({}), "Unschedulable", json!([])),
            &vnode
        ));
        assert!(!should_spill(
            &mk_pod(prefer.clone(), "SchedulerError", json!([])),
            &vnode
        ));
        assert!(!should_spill(
            &mk_pod(
                prefer,
                "Unschedulable",
                json!([{"key": "k8s.aliyun.com/vnode", "operator": "Exists"}])
            ),
            &vnode
        ));
    }

    #[test]
    fn the_patch_appends_and_pins_the_resource_version() {
        let vnode = Vnode::default();
        let pod = mk_pod(
            json!({}),
            "Unschedulable",
            json!([{"key": "other", "operator": "Exists"}]),
        );
        let patch = spill_patch(&pod, &vnode);
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let tolerations = patch["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tolerations.len(), 2);
        assert_eq!(tolerations[1]["key"], "k8s.aliyun.com/vnode");
    }
}
