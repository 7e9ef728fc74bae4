//! The pods this node serves, as the kubelet API finds them: a pod by namespace and name only
//! when it is bound to this node (else 404, as a kubelet that does not run it answers), the
//! container in its spec, and its ECI container group (the pod's instance-id annotation, else
//! looked up by the group's name and the pod's uid tag). Also `GET /pods`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use eci_proto::EciError;
use eci_proto::v20180808::{DescribeContainerGroupsRequest, Tag};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;
use tracing::warn;

use super::KubeletState;
use crate::k8s::access::{Access, Scope};
use crate::ops::chain::Chain;
use crate::pods::INSTANCE_ANNOTATION;
use crate::pods::to_eci::naming::{TAG_POD_UID, container_group_name};

/// The Kubernetes API accesses of pod lookups.
pub const KUBE_API: &[Access] = &[Access {
    scope: Scope::Cluster,
    group: "",
    resource: "pods",
    verbs: &["get", "list"],
    why: "the kubelet API serves only this node's pods (logs, exec, /pods)",
}];

/// A pod or its container group could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// No such pod on this node.
    #[error("pod \"{name}\" does not exist in namespace \"{namespace}\" on this node")]
    NoPod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The pod has no such container.
    #[error("container \"{container}\" not found in pod \"{pod}\"")]
    NoContainer {
        /// The container asked for.
        container: String,
        /// The pod.
        pod: String,
    },
    /// The pod has no container group yet (being created, or ECI refused it).
    #[error(
        "container \"{container}\" in pod \"{pod}\" is waiting to start: it has no ECI container group yet"
    )]
    NoGroup {
        /// The container.
        container: String,
        /// The pod.
        pod: String,
    },
    /// The pod could not be read.
    #[error("cannot read pod {namespace}/{name}")]
    Kube {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The pods of this node could not be listed.
    #[error("cannot list the pods of this node")]
    List(#[source] kube::Error),
    /// ECI could not say which group runs the pod.
    #[error("ECI cannot find the container group of pod {pod}")]
    Eci {
        /// `<namespace>/<name>`.
        pod: String,
        /// Why.
        #[source]
        source: EciError,
    },
}

impl IntoResponse for LookupError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::NoPod { .. } | Self::NoContainer { .. } => StatusCode::NOT_FOUND,
            // The apiserver shows a 400's body to kubectl as is.
            Self::NoGroup { .. } => StatusCode::BAD_REQUEST,
            Self::Kube { .. } | Self::List(_) | Self::Eci { .. } => {
                warn!(error = %Chain(&self), "kubelet API lookup failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (status, Chain(&self).to_string()).into_response()
    }
}

/// A container of a pod of this node, and the group that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid (a pod recreated under the same name is another pod).
    pub uid: String,
    /// The container's name.
    pub container: String,
    /// The ECI container group's id.
    pub group_id: String,
}

/// The status of `container` in `pod` (regular, init or ephemeral).
pub fn container_status<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|s| s.name == container)
}

/// Whether the pod's spec has a container of that name (regular, init or ephemeral).
fn has_container(pod: &Pod, container: &str) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
            || spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    })
}

impl KubeletState {
    /// The pod `namespace/name` if it is bound to this node (`None` otherwise or if gone).
    pub async fn pod_on_this_node(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Pod>, LookupError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = pods
            .get_opt(name)
            .await
            .map_err(|source| LookupError::Kube {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })?;
        Ok(pod.filter(|pod| {
            pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
                == Some(self.config.node_name.as_str())
        }))
    }

    /// The container `container` of the pod `namespace/name` of this node, with the pod.
    pub async fn locate(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
    ) -> Result<(Pod, Target), LookupError> {
        let pod = self
            .pod_on_this_node(namespace, name)
            .await?
            .ok_or_else(|| LookupError::NoPod {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        if !has_container(&pod, container) {
            return Err(LookupError::NoContainer {
                container: container.to_owned(),
                pod: name.to_owned(),
            });
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let annotated = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INSTANCE_ANNOTATION))
            .filter(|id| !id.is_empty())
            .cloned();
        let group_id = match annotated {
            Some(id) => id,
            // The annotation is written off the creation path: a group may exist before it.
            None => self
                .find_group(namespace, name, &uid)
                .await?
                .ok_or_else(|| LookupError::NoGroup {
                    container: container.to_owned(),
                    pod: name.to_owned(),
                })?,
        };
        let target = Target {
            namespace: namespace.to_owned(),
            pod: name.to_owned(),
            uid,
            container: container.to_owned(),
            group_id,
        };
        Ok((pod, target))
    }

    /// The id of the group running the pod with `uid`, asked of ECI by name and uid tag.
    async fn find_group(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<String>, LookupError> {
        let answer = self
            .eci
            .describe_container_groups(DescribeContainerGroupsRequest {
                region_id: self.config.region.clone(),
                container_group_name: container_group_name(namespace, name),
                tag: vec![Tag {
                    key: TAG_POD_UID.to_owned(),
                    value: uid.to_owned(),
                }],
                limit: Some(1),
                ..DescribeContainerGroupsRequest::default()
            })
            .await
            .map_err(|source| LookupError::Eci {
                pod: format!("{namespace}/{name}"),
                source,
            })?;
        Ok(answer
            .container_groups
            .into_iter()
            .next()
            .map(|group| group.container_group_id))
    }
}

/// `GET /pods`: the pods bound to this node, as a PodList.
pub async fn list(State(state): State<KubeletState>) -> Result<Response, LookupError> {
    let pods: Api<Pod> = Api::all(state.client.clone());
    let listed = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", state.config.node_name)))
        .await
        .map_err(LookupError::List)?;
    Ok(Json(json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": listed.items,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_of_every_kind_are_found_with_their_status() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "containers": [{"name": "app"}],
                "initContainers": [{"name": "setup"}],
                "ephemeralContainers": [{"name": "debugger"}],
            },
            "status": {
                "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 2}],
                "initContainerStatuses": [{"name": "setup", "image": "i", "imageID": "", "ready": false, "restartCount": 0}],
            },
        }))
        .unwrap();
        for name in ["app", "setup", "debugger"] {
            assert!(has_container(&pod, name), "{name}");
        }
        assert!(!has_container(&pod, "sidecar"));
        assert_eq!(container_status(&pod, "app").unwrap().restart_count, 2);
        assert!(container_status(&pod, "setup").is_some());
        assert!(container_status(&pod, "debugger").is_none());
    }

    #[test]
    fn not_found_answers_404_and_eci_failures_500_with_the_cause() {
        let missing = LookupError::NoPod {
            namespace: "ns".into(),
            name: "p".into(),
        };
        assert_eq!(missing.into_response().status(), StatusCode::NOT_FOUND);
        let eci = LookupError::Eci {
            pod: "ns/p".into(),
            source: EciError::new(
                "Throttling.User",
                "Request was denied due to user flow control.",
            ),
        };
        assert_eq!(
            Chain(&eci).to_string(),
            "ECI cannot find the container group of pod ns/p: ECI error Throttling.User: Request was denied due to user flow control. (RequestId: )"
        );
        assert_eq!(
            eci.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
