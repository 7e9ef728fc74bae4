//! Keeps the Node in existence while the replica serves it: when someone deletes it
//! (`kubectl delete node` under a live replica), it is registered again at once and an Event
//! says so. Pods the pod garbage collector removes meanwhile leave the pod watch, which deletes
//! their groups.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{NodeArgs, WithSite};
use crate::node::registration;
use crate::ops::events::EventPublisher;
use crate::ops::metrics::Telemetry;

/// Watches the Node until cancelled; `node_uid` publishes the uid of every registration.
pub async fn run(
    nodes: Api<Node>,
    client: kube::Client,
    config: WithSite<NodeArgs>,
    telemetry: Arc<Telemetry>,
    node_uid: watch::Sender<String>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let recorder = EventPublisher::new(
        client,
        Reporter {
            controller: crate::k8s::FIELD_MANAGER.into(),
            instance: Some(config.site.node_name.clone()),
        },
        Arc::clone(&telemetry),
    );
    let this_node =
        watcher::Config::default().fields(&format!("metadata.name={}", config.site.node_name));
    let mut events = watcher(nodes.clone(), this_node).default_backoff().boxed();
    let mut present_in_listing = false;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        let deleted = match event {
            None => anyhow::bail!("the node watch ended"),
            Some(Err(error)) => {
                warn!(%error, "node watch error; it recovers by itself");
                false
            }
            Some(Ok(watcher::Event::Init)) => {
                present_in_listing = false;
                false
            }
            Some(Ok(watcher::Event::InitApply(_))) => {
                present_in_listing = true;
                false
            }
            // Gone while the watch was re-listing.
            Some(Ok(watcher::Event::InitDone)) => !present_in_listing,
            Some(Ok(watcher::Event::Apply(_))) => false,
            Some(Ok(watcher::Event::Delete(_))) => true,
        };
        if !deleted {
            continue;
        }
        warn!(node = %config.site.node_name, "the Node was deleted while this replica serves it; registering it again");
        let node = registration::register(&nodes, &config, &telemetry).await?;
        present_in_listing = true;
        let uid = node.metadata.uid.clone().unwrap_or_default();
        info!(node = %config.site.node_name, %uid, "node registered again");
        node_uid.send_replace(uid);
        let event = Event {
            type_: EventType::Warning,
            reason: "NodeRecreated".into(),
            note: Some("the Node was deleted while virtual-node-eci served it and was registered again; to remove a virtual node, scale the StatefulSet in (the replica drains and deletes it)".into()),
            action: "Register".into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &node.object_ref(&())).await {
            warn!(%error, "could not publish the NodeRecreated event");
        }
    }
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[crate::k8s::access::Access {
    scope: crate::k8s::access::Scope::Cluster,
    group: "",
    resource: "nodes",
    verbs: &["list", "watch"],
    why: "notice the node being deleted under a live replica",
}];
