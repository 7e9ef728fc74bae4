//! The pods this node serves, as the kubelet API finds them: a pod by namespace and name only
//! when it is bound to this node (else 404, as a kubelet that does not run it answers), the
//! container in its spec, and its ECI container group — found by what this daemon owns: the
//! pod controller's record of the group it created or adopted for the pod's UID, else ECI
//! asked for the group tagged with this cluster and that UID. Never by the pod's
//! `eci-instance-id` annotation: whoever may edit the pod writes that, and an id of another
//! namespace's group there would open that group to them. Also `GET /pods` and
//! `GET /runningpods/`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use eci_proto::EciError;
use eci_proto::v20180808::{DescribeContainerGroupsRequest, Tag};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use serde_json::json;
use tracing::warn;

use super::KubeletState;
use crate::eci::Lane;
use crate::k8s::access::{Access, Scope};
use crate::ops::chain::Chain;
use vne_core::to_eci::naming::{TAG_CLUSTER, TAG_POD_UID, container_group_name};

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

impl Target {
    /// The lane this pod's ECI calls wait in when a budget is short: its namespace, as the
    /// pod was found (see [`crate::eci::Lane`]).
    pub fn lane(&self) -> Lane {
        Lane::namespace(&self.namespace)
    }
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
                == Some(self.config.site.node_name.as_str())
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
        let group_id = match self.groups.group_of(&uid) {
            Some(id) => id,
            // The controller records a group once ECI accepted it, and adopts them at start:
            // in between (a restart's first seconds) ECI is asked by the group's own tags.
            None => Lane::namespace(namespace)
                .run(self.find_group(namespace, name, &uid))
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

    /// The id of the group running the pod with `uid`, asked of ECI by its name and its
    /// cluster and pod-UID tags — and only a group that carries both tags is taken.
    async fn find_group(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<String>, LookupError> {
        let answer = self
            .eci
            .describe_container_groups(DescribeContainerGroupsRequest {
                region_id: self.config.site.region.clone(),
                container_group_name: container_group_name(namespace, name),
                tag: self.owned_tags(uid),
                ..DescribeContainerGroupsRequest::default()
            })
            .await
            .map_err(|source| LookupError::Eci {
                pod: format!("{namespace}/{name}"),
                source,
            })?;
        let wanted = self.owned_tags(uid);
        Ok(answer
            .container_groups
            .into_iter()
            .find(|group| wanted.iter().all(|tag| group.tags.contains(tag)))
            .map(|group| group.container_group_id))
    }

    /// The tags of the group this daemon creates for the pod with `uid`.
    fn owned_tags(&self, uid: &str) -> Vec<Tag> {
        vec![
            Tag {
                key: TAG_CLUSTER.to_owned(),
                value: self.config.site.cluster_name.clone(),
            },
            Tag {
                key: TAG_POD_UID.to_owned(),
                value: uid.to_owned(),
            },
        ]
    }
}

/// `GET /pods`: the pods bound to this node, as a PodList.
pub async fn list(State(state): State<KubeletState>) -> Result<Response, LookupError> {
    let pods = state.node_pods_listed().await?;
    Ok(pod_list(&pods))
}

/// `GET /runningpods/`: what runs for this node, as the kubelet's container runtime reports
/// it — a PodList whose items carry only the pod's namespace, name and UID and its running
/// containers' names and images. Our runtime is ECI: a pod runs while the pod controller holds
/// a container group for it and the pod has not finished (see [`running_pod`]).
pub async fn running(State(state): State<KubeletState>) -> Result<Response, LookupError> {
    let pods = state.node_pods_listed().await?;
    let running: Vec<Pod> = pods
        .iter()
        .filter_map(|pod| {
            let uid = pod.metadata.uid.as_deref()?;
            running_pod(pod, state.groups.group_of(uid).is_some())
        })
        .collect();
    Ok(pod_list(&running))
}

/// `pod` as the kubelet's runtime reports it (its `ToAPIPod`) when it runs: a container group
/// holds it (`has_group`) and it is not Succeeded or Failed (the kubelet stops a finished
/// pod's sandbox; ECI keeps a finished group until it is deleted). Its containers are those
/// whose status says running, with the image the status names.
pub fn running_pod(pod: &Pod, has_group: bool) -> Option<Pod> {
    let status = pod.status.as_ref();
    let finished = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if !has_group || finished {
        return None;
    }
    let containers = status
        .into_iter()
        .flat_map(|s| {
            [
                &s.init_container_statuses,
                &s.container_statuses,
                &s.ephemeral_container_statuses,
            ]
        })
        .flatten()
        .flatten()
        .filter(|c| {
            c.state
                .as_ref()
                .is_some_and(|state| state.running.is_some())
        })
        .map(|c| Container {
            name: c.name.clone(),
            image: Some(c.image.clone()),
            ..Container::default()
        })
        .collect();
    Some(Pod {
        metadata: ObjectMeta {
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers,
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// `items` as the kubelet encodes a pod list.
fn pod_list(items: &[Pod]) -> Response {
    Json(json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    }))
    .into_response()
}

impl KubeletState {
    /// The pods bound to this node, listed from the Kubernetes API.
    async fn node_pods_listed(&self) -> Result<Vec<Pod>, LookupError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let selector = format!("spec.nodeName={}", self.config.site.node_name);
        let listed = pods
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(LookupError::List)?;
        Ok(listed.items)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use clap::Parser as _;
    use eci_proto::v20180808::{Container, CreateContainerGroupRequest};

    use super::*;
    use crate::config::{Config, KubeletArgs, WithSite};
    use crate::eci::{Backend, GrpcBackend};
    use crate::kubelet::auth;
    use crate::ops::metrics::Telemetry;
    use crate::pods::GroupDirectory;

    const NODE: &str = "vn-0";

    /// A Kubernetes API answering every request with the pod `ns/box` (uid `uid-1`) on this
    /// node, whose instance-id annotation its author set to `annotated`.
    fn kube_client(annotated: &str) -> kube::Client {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "box", "namespace": "ns", "uid": "uid-1",
                "annotations": {"k8s.aliyun.com/eci-instance-id": annotated}},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "app:1"}]},
        })
        .to_string();
        let service =
            tower::service_fn(move |_request: axum::http::Request<kube::client::Body>| {
                let pod = pod.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        axum::http::Response::builder()
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(pod.into_bytes()))
                            .expect("response"),
                    )
                }
            });
        kube::Client::new(service, "default")
    }

    async fn mock() -> (mock_eci::MockServer, Backend) {
        let config = mock_eci::MockConfig::parse_from([
            "mock-eci",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--no-rate-limits",
        ]);
        let mock = mock_eci::MockServer::start(config).await.expect("mock-eci");
        let eci: Backend = Arc::new(GrpcBackend::connect_lazy(&mock.endpoint()).expect("endpoint"));
        (mock, eci)
    }

    /// A group named `name` with the given tags; its id.
    async fn group(eci: &Backend, name: &str, tags: &[(&str, &str)]) -> String {
        eci.create_container_group(CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg-1".into(),
            v_switch_id: "vsw-1".into(),
            container_group_name: name.into(),
            container: vec![Container {
                name: "app".into(),
                image: "app:1".into(),
                ..Container::default()
            }],
            tag: tags
                .iter()
                .map(|(key, value)| Tag {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
            ..CreateContainerGroupRequest::default()
        })
        .await
        .expect("group")
        .container_group_id
    }

    /// The kubelet API of node `vn-0` of cluster `c` in cn-hangzhou, on 127.0.0.1 (any port),
    /// polling logs every 100ms, its exec streams allowed in plaintext.
    pub(crate) fn test_config() -> Arc<WithSite<KubeletArgs>> {
        let settings = Config::parse_from([
            "virtual-node-eci",
            "--node-name=vn-0",
            "--pod-ip=127.0.0.1",
            "--kubelet-port=0",
            "--kubelet-log-poll-interval=100ms",
            "--region=cn-hangzhou",
            "--cluster-name=c",
            "--eci=grpc://127.0.0.1:9",
            "--eci-allow-insecure-endpoint",
            "--vswitch=vsw-1",
            "--security-group=sg-1",
        ])
        .settings()
        .expect("settings");
        Arc::new(settings.with_site(&settings.config.kubelet))
    }

    fn state(client: kube::Client, eci: Backend, groups: GroupDirectory) -> KubeletState {
        KubeletState {
            config: test_config(),
            client: client.clone(),
            eci,
            groups,
            node_pods: crate::k8s::shared_watch::SharedWatch::new("test pod"),
            telemetry: Arc::new(Telemetry::new()),
            guard: Arc::new(auth::Guard::new(
                NODE.into(),
                Arc::new(auth::ApiReviewer::new(client)),
                Arc::new(auth::ClientCa::default()),
            )),
            stop: tokio_util::sync::CancellationToken::new(),
        }
    }

    #[tokio::test]
    async fn a_pods_group_is_the_one_the_controller_records_not_the_one_its_annotation_names() {
        let (_mock, eci) = mock().await;
        // Another namespace's group, whose id the attacker wrote on their own pod.
        let victim = group(
            &eci,
            "victim-db",
            &[(TAG_CLUSTER, "c"), (TAG_POD_UID, "uid-victim")],
        )
        .await;
        let own = group(
            &eci,
            "ns-box",
            &[(TAG_CLUSTER, "c"), (TAG_POD_UID, "uid-1")],
        )
        .await;
        let kubelet = state(
            kube_client(&victim),
            Arc::clone(&eci),
            GroupDirectory::fixed([("uid-1".to_owned(), own.clone())]),
        );
        let (_, target) = kubelet.locate("ns", "box", "app").await.expect("located");
        assert_eq!(target.group_id, own);

        // Before the controller recorded it (a restart's first seconds): ECI is asked by the
        // group's own tags, and the annotation still counts for nothing.
        let kubelet = state(kube_client(&victim), eci, GroupDirectory::default());
        let (_, target) = kubelet.locate("ns", "box", "app").await.expect("located");
        assert_eq!(target.group_id, own);
    }

    #[tokio::test]
    async fn a_group_of_another_cluster_is_never_a_pods_group() {
        let (_mock, eci) = mock().await;
        // Another cluster on the same account has a pod of the same namespace, name and uid.
        let foreign = group(
            &eci,
            "ns-box",
            &[(TAG_CLUSTER, "other"), (TAG_POD_UID, "uid-1")],
        )
        .await;
        let kubelet = state(kube_client(&foreign), eci, GroupDirectory::default());
        let error = kubelet.locate("ns", "box", "app").await.unwrap_err();
        assert!(matches!(error, LookupError::NoGroup { .. }), "{error:?}");
    }

    /// A Kubernetes API answering every request with a PodList of `items`.
    fn kube_list_client(items: &[serde_json::Value]) -> kube::Client {
        let list = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
            .to_string();
        let service =
            tower::service_fn(move |_request: axum::http::Request<kube::client::Body>| {
                let list = list.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        axum::http::Response::builder()
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(list.into_bytes()))
                            .expect("response"),
                    )
                }
            });
        kube::Client::new(service, "default")
    }

    /// A pod of this node in `phase` whose container `app` is `state` (`running`,
    /// `waiting` or `terminated`), with a sidecar that has ended.
    fn node_pod(name: &str, phase: &str, state: &str) -> serde_json::Value {
        let app_state = match state {
            "running" => json!({"running": {"startedAt": "2026-11-29T00:00:00Z"}}),
            "terminated" => json!({"terminated": {"exitCode": 0}}),
            _ => json!({"waiting": {"reason": "ContainerCreating"}}),
        };
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "labels": {"app": "web"}, "annotations": {"note": "not reported"}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "app", "image": "app:1"}, {"name": "sidecar", "image": "side:1"}]},
            "status": {"phase": phase, "podIP": "192.168.0.9", "containerStatuses": [
                {"name": "app", "image": "registry.example.com/app:1", "imageID": "",
                    "ready": state == "running", "restartCount": 0, "state": app_state},
                {"name": "sidecar", "image": "side:1", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 0}}},
            ]},
        })
    }

    /// The kubelet API of a node whose pods are `items` and groups `groups`, behind a guard
    /// that knows each (token, user) of `users` and lets that user `get` the `nodes`
    /// subresource named beside it.
    fn guarded(
        items: &[serde_json::Value],
        groups: GroupDirectory,
        users: &[(&'static str, &'static str, &'static str)],
    ) -> KubeletState {
        let eci: Backend =
            Arc::new(GrpcBackend::connect_lazy("http://127.0.0.1:9").expect("endpoint"));
        let reviewer = crate::k8s::callers::fake_reviewer::FakeReviewer {
            tokens: users
                .iter()
                .map(|(token, user, _)| (*token, *user))
                .collect(),
            grants: users
                .iter()
                .map(|(_, user, subresource)| {
                    (
                        *user,
                        auth::ResourceQuestion::node("get", subresource, NODE),
                    )
                })
                .collect(),
            ..Default::default()
        };
        KubeletState {
            guard: Arc::new(auth::Guard::new(
                NODE.into(),
                Arc::new(reviewer),
                Arc::new(auth::ClientCa::default()),
            )),
            ..state(kube_list_client(items), eci, groups)
        }
    }

    /// `GET path` with `token` as its bearer token.
    fn bearer(path: &str, token: &str) -> axum::http::Request<axum::body::Body> {
        axum::http::Request::get(path)
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .expect("request")
    }

    #[tokio::test]
    async fn runningpods_lists_the_pods_that_have_a_group_and_have_not_finished() {
        use tower::ServiceExt as _;

        let items = vec![
            node_pod("web", "Running", "running"),
            node_pod("pulling", "Pending", "waiting"),
            node_pod("no-group", "Pending", "waiting"),
            node_pod("done", "Succeeded", "terminated"),
        ];
        let groups = GroupDirectory::fixed(
            ["web", "pulling", "done"].map(|name| (format!("uid-{name}"), format!("eci-{name}"))),
        );
        let kubelet = guarded(&items, groups, &[("lister-token", "lister", "pods")]);
        let request = bearer;
        let router = crate::kubelet::router(kubelet);
        // With its slash as the kubelet registers it, and without as client-go sends it.
        for path in ["/runningpods/", "/runningpods"] {
            let response = router
                .clone()
                .oneshot(request(path, "lister-token"))
                .await
                .expect("answered");
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("body");
            let list: serde_json::Value = serde_json::from_slice(&body).expect("json");
            // The kubelet's runtime view: namespace, name, uid and the running containers only.
            assert_eq!(
                list,
                json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
                    {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web"},
                        "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1"}]}},
                    {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "pulling", "namespace": "ns", "uid": "uid-pulling"},
                        "spec": {"containers": []}},
                ]}),
                "{path}"
            );
        }
        // Authorized as the kubelet authorizes it: nodes/pods (or nodes/proxy), nothing less.
        let response = router
            .oneshot(request("/runningpods/", "forged"))
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn the_daemons_own_metrics_are_served_at_metrics_to_who_may_read_node_metrics() {
        use tower::ServiceExt as _;

        let kubelet = guarded(
            &[],
            GroupDirectory::default(),
            &[
                ("scraper-token", "scraper", "metrics"),
                ("lister-token", "lister", "pods"),
            ],
        );
        kubelet.telemetry.kube_request("pod_get");
        let request = |token: &str| bearer("/metrics", token);
        let router = crate::kubelet::router(kubelet);
        let response = router
            .clone()
            .oneshot(request("scraper-token"))
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8(body.to_vec()).expect("text");
        assert!(
            text.contains("operation=\"pod_get\"") && text.ends_with("# EOF\n"),
            "{text}"
        );
        // Authorized as the kubelet authorizes it: nodes/metrics (or nodes/proxy).
        let response = router
            .oneshot(request("lister-token"))
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn a_pod_runs_while_it_has_a_group_and_has_not_finished() {
        let cases = [
            // (phase, app's state, group recorded, listed, containers listed)
            ("Running", "running", true, true, 1),
            ("Running", "running", false, false, 0),
            ("Pending", "waiting", true, true, 0),
            ("Pending", "waiting", false, false, 0),
            ("Succeeded", "terminated", true, false, 0),
            ("Failed", "terminated", true, false, 0),
            // Deleting: the group is still there, so it still runs.
            ("Running", "terminated", true, true, 0),
        ];
        for (phase, state, has_group, listed, containers) in cases {
            let pod: Pod = serde_json::from_value(node_pod("p", phase, state)).expect("pod");
            let running = running_pod(&pod, has_group);
            assert_eq!(running.is_some(), listed, "{phase} {state} {has_group}");
            if let Some(running) = running {
                let spec = running.spec.expect("spec");
                assert_eq!(spec.containers.len(), containers, "{phase} {state}");
                assert_eq!(running.metadata.uid.as_deref(), Some("uid-p"));
                assert!(running.metadata.labels.is_none() && running.status.is_none());
            }
        }
    }

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
