//! Registering the Node: create it when absent, otherwise adopt it without stripping what
//! others put there.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::info;

use super::shape;
use crate::config::{NodeArgs, WithSite};
use crate::ops::metrics::Telemetry;

/// Registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The API refused or failed.
    #[error("could not register node {node}")]
    Api {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Others kept changing the Node while we tried.
    #[error("could not register node {node}: it changed under us {attempts} times in a row")]
    Contended {
        /// The node.
        node: String,
        /// Attempts made.
        attempts: u32,
    },
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Creates or adopts the Node and returns it as stored.
pub async fn register(
    nodes: &Api<Node>,
    config: &WithSite<NodeArgs>,
    telemetry: &Telemetry,
) -> Result<Node, RegistrationError> {
    const ATTEMPTS: u32 = 8;
    let name = &config.site.node_name;
    let api_error = |source| RegistrationError::Api {
        node: name.clone(),
        source,
    };
    for _ in 0..ATTEMPTS {
        telemetry.kube_request("node_get");
        let existing = nodes.get_opt(name).await.map_err(api_error)?;
        let result = match existing {
            None => {
                let fresh: Node = serde_json::from_value(shape::new_node(config))
                    .map_err(|e| api_error(kube::Error::SerdeError(e)))?;
                telemetry.kube_request("node_create");
                nodes
                    .create(&PostParams::default(), &fresh)
                    .await
                    .inspect(|_| info!(node = %name, "created the node"))
            }
            Some(existing) => match shape::adoption_patch(&existing, config) {
                None => {
                    info!(node = %name, uid = ?existing.metadata.uid, "adopted the existing node unchanged");
                    return Ok(existing);
                }
                Some(patch) => {
                    telemetry.kube_request("node_patch");
                    nodes
                        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .inspect(|_| info!(node = %name, "adopted the existing node and restored our labels and taint"))
                }
            },
        };
        match result {
            Ok(node) => return Ok(node),
            Err(error) if is_conflict(&error) => continue,
            Err(error) => return Err(api_error(error)),
        }
    }
    Err(RegistrationError::Contended {
        node: name.clone(),
        attempts: ATTEMPTS,
    })
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[crate::k8s::access::Access {
    scope: crate::k8s::access::Scope::Cluster,
    group: "",
    resource: "nodes",
    verbs: &["get", "create", "patch"],
    why: "register the virtual node, or adopt an existing one",
}];
