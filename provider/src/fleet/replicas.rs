//! How many replicas are alive, for dividing ECI's per-account quotas among them: the
//! virtual nodes of this region (every replica registers one) whose node lifecycle controller
//! has not marked them `Ready=Unknown` (their replica stopped renewing its Lease). A
//! replica counts itself even before its own node shows up, so the count is never zero.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::FleetMetrics;
use crate::node::shape::VNODE_LABEL;
use crate::ops::metrics::{MetricSet as _, Telemetry};

/// Whether `node`'s replica is alive (pure): not being deleted, and not marked `Unknown` by
/// the node lifecycle controller. `Ready=False` is written by a live replica (ECI is down),
/// which still makes calls.
pub fn is_live(node: &Node) -> bool {
    if node.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    ready.is_none_or(|condition| condition.status != "Unknown")
}

/// The live replicas among `nodes`, at least one (this replica) (pure).
pub fn live_count<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> u32 {
    let live = nodes.into_iter().filter(|node| is_live(node)).count();
    u32::try_from(live).unwrap_or(u32::MAX).max(1)
}

/// The label selector of the virtual nodes that share this region's quotas.
pub fn selector(region: &str) -> String {
    format!("{VNODE_LABEL}=true,topology.kubernetes.io/region={region}")
}

/// Watches the virtual nodes of `region` and keeps `count` (and the metric) at the number of
/// live replicas, until `stop`.
pub async fn run(
    client: kube::Client,
    region: String,
    count: watch::Sender<u32>,
    telemetry: Arc<Telemetry>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = FleetMetrics::of(&telemetry);
    let nodes: Api<Node> = Api::all(client);
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels(&selector(&region));
    let mut events = reflector(writer, watcher(nodes, config).default_backoff()).boxed();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            event = events.next() => event,
        };
        match event {
            None => anyhow::bail!("the watch of the virtual nodes ended"),
            Some(Err(error)) => warn!(%error, "virtual node watch error; it recovers by itself"),
            // The store is filled at the end of a list: counting before would say "1" (the
            // floor), and the start-up wait for the count would end on it.
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Ok(_)) => {
                let live = live_count(store.state().iter().map(AsRef::as_ref));
                metrics.eci_quota_replicas.set(i64::from(live));
                count.send_if_modified(|current| {
                    let changed = *current != live;
                    if changed {
                        info!(
                            replicas = live,
                            was = *current,
                            "live replicas changed: each one's share of the ECI quotas follows"
                        );
                        *current = live;
                    }
                    changed
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn node(ready: Option<&str>, deleting: bool) -> Node {
        let mut node = Node::default();
        if deleting {
            node.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        }
        node.status = ready.map(|status| NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: status.into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        node
    }

    #[test]
    fn which_nodes_count_as_live_replicas() {
        for (ready, deleting, live) in [
            (Some("True"), false, true),
            (Some("False"), false, true),
            (None, false, true),
            (Some("Unknown"), false, false),
            (Some("True"), true, false),
        ] {
            assert_eq!(
                is_live(&node(ready, deleting)),
                live,
                "{ready:?} {deleting}"
            );
        }
    }

    #[test]
    fn the_count_is_never_zero() {
        assert_eq!(live_count([]), 1);
        assert_eq!(live_count(&[node(Some("Unknown"), false)]), 1);
        let ten: Vec<Node> = (0..10).map(|_| node(Some("True"), false)).collect();
        assert_eq!(live_count(&ten), 10);
        let mut mixed = ten;
        mixed.push(node(Some("Unknown"), false));
        mixed.push(node(Some("True"), true));
        assert_eq!(live_count(&mixed), 10);
    }

    #[test]
    fn the_selector_names_our_label_and_region() {
        assert_eq!(
            selector("cn-hangzhou"),
            "k8s.aliyun.com/vnode=true,topology.kubernetes.io/region=cn-hangzhou"
        );
    }
}
