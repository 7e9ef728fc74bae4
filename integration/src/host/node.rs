//! The host's Node: registered (created, or adopted with its labels and taint ensured), its
//! status posted (capacity, addresses, node info, Ready and the pressure conditions, merged by
//! type), its Lease `kube-node-lease/<node>` renewed every 10 s so the node lifecycle
//! controller keeps it Ready, and the Ready heartbeat refreshed every minute.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use vne_core::time::rfc3339;

use super::{FIELD_MANAGER, HOST_IP, HOST_LABEL, HOST_TAINT_KEY, HostConfig};

/// Registering or heart-beating the Node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API call failed.
    #[error("node {node}: {action}: {source}")]
    Api {
        /// The node.
        node: String,
        /// What was done.
        action: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// Namespace of node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Lease duration (as the kubelet's default).
const LEASE_SECONDS: i32 = 40;
/// Lease renewal period.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Node status heartbeat period.
const STATUS_EVERY: Duration = Duration::from_secs(60);
/// The version the node reports.
pub(crate) const KUBELET_VERSION: &str = "v1.37.2-host-agent";

/// The Node's labels.
pub(crate) fn labels(node: &str) -> BTreeMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), node.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), arch.to_owned()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), arch.to_owned()),
        (HOST_LABEL.0.to_owned(), HOST_LABEL.1.to_owned()),
    ])
}

fn our_taint() -> Value {
    json!({ "key": HOST_TAINT_KEY, "value": "true", "effect": "NoSchedule" })
}

/// `taints` with ours present exactly once (others' kept in order).
pub(crate) fn with_our_taint(taints: &[Value]) -> Vec<Value> {
    let ours = our_taint();
    let mut out: Vec<Value> = taints
        .iter()
        .filter(|t| !(t.get("key") == ours.get("key") && t.get("effect") == ours.get("effect")))
        .cloned()
        .collect();
    out.push(ours);
    out
}

fn api_error<'a>(
    node: &'a str,
    action: &'static str,
) -> impl FnOnce(kube::Error) -> NodeError + 'a {
    move |source| NodeError::Api {
        node: node.to_owned(),
        action,
        source,
    }
}

/// Creates or adopts the Node and posts its status; returns its UID.
pub(crate) async fn register(
    client: &kube::Client,
    config: &HostConfig,
) -> Result<String, NodeError> {
    let node = config.node_name.as_str();
    let nodes: Api<Node> = Api::all(client.clone());
    let uid = loop {
        match nodes.get_opt(node).await.map_err(api_error(node, "read"))? {
            None => {
                let object: Node = serde_json::from_value(json!({
                    "metadata": { "name": node, "labels": labels(node) },
                    "spec": { "taints": [our_taint()] },
                }))
                .unwrap_or_default();
                match nodes.create(&PostParams::default(), &object).await {
                    Ok(created) => {
                        info!(node, "node registered");
                        break created.metadata.uid.unwrap_or_default();
                    }
                    Err(kube::Error::Api(response)) if response.code == 409 => continue,
                    Err(error) => return Err(api_error(node, "create")(error)),
                }
            }
            Some(existing) => {
                let taints: Vec<Value> = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .map(|t| {
                        t.iter()
                            .filter_map(|t| serde_json::to_value(t).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                let patch = json!({
                    "metadata": {
                        "labels": labels(node),
                        "resourceVersion": existing.metadata.resource_version,
                    },
                    "spec": { "taints": with_our_taint(&taints), "unschedulable": false },
                });
                match nodes.patch(node, &params(), &Patch::Merge(&patch)).await {
                    Ok(adopted) => {
                        info!(node, "node adopted");
                        break adopted.metadata.uid.unwrap_or_default();
                    }
                    Err(kube::Error::Api(response)) if response.code == 409 => continue,
                    Err(error) => return Err(api_error(node, "adopt")(error)),
                }
            }
        }
    };
    post_status(&nodes, node).await?;
    Ok(uid)
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// The Node status the agent owns: everything but conditions of other owners.
pub(crate) fn status_patch(
    node: &str,
    now: SystemTime,
    ready_since: Option<&str>,
    kernel: &str,
) -> Value {
    let now_text = rfc3339(now);
    let since = ready_since.map_or_else(|| now_text.clone(), str::to_owned);
    let condition = |type_: &str, status: &str, reason: &str, message: &str, since: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now_text, "lastTransitionTime": since,
        })
    };
    let resources =
        json!({ "cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi" });
    json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                { "type": "InternalIP", "address": HOST_IP },
                { "type": "Hostname", "address": node },
            ],
            "conditions": [
                condition("Ready", "True", "KubeletReady", "host agent is posting ready status", &since),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "host agent has sufficient memory available", &since),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "host agent has no disk pressure", &since),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "host agent has sufficient PID available", &since),
            ],
            "nodeInfo": {
                "machineID": "host-agent",
                "systemUUID": "host-agent",
                "bootID": "host-agent",
                "kernelVersion": kernel,
                "osImage": "host agent (processes on the test machine)",
                "containerRuntimeVersion": "host://1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": std::env::consts::ARCH,
            },
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 0 } },
        }
    })
}

async fn post_status(nodes: &Api<Node>, node: &str) -> Result<(), NodeError> {
    let current = nodes
        .get_status(node)
        .await
        .map_err(api_error(node, "read status"))?;
    let ready_since = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let patch = status_patch(
        node,
        SystemTime::now(),
        ready_since.as_deref(),
        kernel.trim(),
    );
    nodes
        .patch_status(node, &params(), &Patch::Strategic(patch))
        .await
        .map_err(api_error(node, "post status"))?;
    Ok(())
}

/// The Lease object (holder = node, owned by the Node).
fn lease(node: &str, node_uid: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
            }],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": humantime::format_rfc3339_micros(SystemTime::now()).to_string(),
        },
    })
}

async fn renew_lease(client: &kube::Client, node: &str, node_uid: &str) -> Result<(), NodeError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let renew = json!({
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": humantime::format_rfc3339_micros(SystemTime::now()).to_string(),
        }
    });
    match leases.patch(node, &params(), &Patch::Merge(&renew)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(response)) if response.code == 404 => {
            let object: Lease = serde_json::from_value(lease(node, node_uid)).unwrap_or_default();
            match leases.create(&PostParams::default(), &object).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(response)) if response.code == 409 => Ok(()),
                Err(error) => Err(api_error(node, "create Lease")(error)),
            }
        }
        Err(error) => Err(api_error(node, "renew Lease")(error)),
    }
}

/// Renews the Lease and posts the status until `cancel`; registers the Node again if it was
/// deleted.
pub(crate) async fn heartbeat(
    client: kube::Client,
    config: HostConfig,
    mut node_uid: String,
    cancel: CancellationToken,
) {
    let node = config.node_name.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    let mut lease_tick = tokio::time::interval(RENEW_EVERY);
    let mut status_tick = tokio::time::interval(STATUS_EVERY);
    lease_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = lease_tick.tick() => {
                match renew_lease(&client, &node, &node_uid).await {
                    Ok(()) => debug!(node, "lease renewed"),
                    Err(error) => warn!(error = %error, "lease not renewed"),
                }
            }
            _ = status_tick.tick() => {
                match nodes.get_opt(&node).await {
                    Ok(Some(_)) => {
                        if let Err(error) = post_status(&nodes, &node).await {
                            warn!(error = %error, "node status not posted");
                        }
                    }
                    Ok(None) => match register(&client, &config).await {
                        Ok(uid) => {
                            info!(node, "node registered again after it was deleted");
                            node_uid = uid;
                        }
                        Err(error) => warn!(error = %error, "node not registered again"),
                    },
                    Err(error) => warn!(error = %error, "node not read"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taint_added_once_others_kept() {
        let other = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let ours = our_taint();
        let cases = [
            (vec![], vec![ours.clone()]),
            (vec![other.clone()], vec![other.clone(), ours.clone()]),
            (vec![ours.clone(), other.clone()], vec![other, ours]),
        ];
        for (input, want) in cases {
            assert_eq!(with_our_taint(&input), want);
        }
    }

    #[test]
    fn status_has_capacity_addresses_and_ready() {
        let patch = status_patch(
            "host-0",
            SystemTime::UNIX_EPOCH,
            Some("1969-01-01T00:00:00Z"),
            "6.1",
        );
        let status = &patch["status"];
        assert_eq!(status["allocatable"]["pods"], "110");
        assert_eq!(status["capacity"]["memory"], "16Gi");
        assert_eq!(status["addresses"][0]["address"], "127.0.0.1");
        let ready = &status["conditions"][0];
        assert_eq!(
            (ready["type"].as_str(), ready["status"].as_str()),
            (Some("Ready"), Some("True"))
        );
        assert_eq!(ready["lastTransitionTime"], "1969-01-01T00:00:00Z");
        assert_eq!(ready["lastHeartbeatTime"], "1970-01-01T00:00:00Z");
        assert_eq!(status["nodeInfo"]["kubeletVersion"], KUBELET_VERSION);
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "status": status})).unwrap();
        assert!(node.status.unwrap().node_info.is_some());
        assert_eq!(labels("host-0")[HOST_LABEL.0], "true");
    }
}
