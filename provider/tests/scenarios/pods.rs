//! The pod lifecycle scenarios, run by `e2e_pods.rs` over the gRPC contract and by
//! `e2e_pods_openapi.rs` over the OpenAPI: the same scenarios prove the backends interchangeable.
//!
//! They run on a real control plane: each scenario's pods live in a namespace of its own and
//! kube-scheduler places them on the scenario's virtual node (they tolerate its taint and select
//! it by hostname), so admission (the `kube-api-access-*` volume), binding, graceful deletion and
//! the node lifecycle controller are the real ones.

use std::time::Duration;

use integration::harness::mock_admin::{created_with, groups, tag};
use integration::harness::{EciApi, Harness, HarnessError};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
    "--restart-backoff",
    "1s",
    "--init-container-duration",
    "300ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
];

async fn with_harness<F>(api: EciApi, scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let mut h = Harness::start().await.expect("the harness starts");
    h.use_eci_api(api);
    let mut result = scenario(&mut h).await;
    if result.is_ok() {
        // Prove which API carried the scenario: the daemon says so when it starts.
        let output = h.process_output(&h.node_name(0)).unwrap_or_default();
        let expected = match api {
            EciApi::Grpc => "using a mock-eci over gRPC",
            EciApi::OpenApi => "using the Alibaba Cloud ECI OpenAPI",
        };
        if !output.contains(expected) {
            result = Err(HarnessError::Setup(format!(
                "the daemon never logged {expected:?}"
            )));
        }
    }
    h.finish(result).await;
}

/// What a scenario works with: its virtual node, mock-eci's admin endpoint and its namespace.
struct Scene {
    node: String,
    admin: String,
    ns: String,
}

async fn start(h: &mut Harness) -> Result<Scene, HarnessError> {
    let ns = h.create_namespace("pods").await?;
    let mock = h.start_mock_eci(FAST_MOCK).await?;
    h.start_daemon(0, FAST_DAEMON)?;
    let node = h.node_name(0);
    Ok(Scene {
        node,
        admin: mock.admin,
        ns,
    })
}

/// A pod for kube-scheduler to place on `node`: it tolerates the virtual nodes' taint and
/// selects `node` by hostname, as a workload aimed at one virtual node would.
fn pod_spec(name: &str, node: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = json!([{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// A pod bound to `node` directly (`spec.nodeName`), bypassing the scheduler: only for
/// scenarios about something else that the scheduler would (rightly) prevent.
fn pod_bound_to(name: &str, node: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn container(env: &[(&str, &str)]) -> Value {
    json!({"name": "app", "image": "registry.example.com/app:1", "env": env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>()})
}

async fn create(h: &Harness, ns: &str, pod: &Pod) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    pods.create(&PostParams::default(), pod).await?;
    Ok(())
}

async fn get(h: &Harness, ns: &str, name: &str) -> Option<Value> {
    h.pod_json(ns, name).await
}

async fn wait_pod(
    h: &Harness,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value, HarnessError> {
    h.wait_pod(ns, name, what, WAIT, check).await
}

/// Changes mock-eci's fault controls (outage, stock, …).
async fn set_controls(admin: &str, controls: Value) {
    reqwest::Client::new()
        .patch(format!("{admin}/admin/controls"))
        .json(&controls)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

/// Whether the daemon recorded the pod's group on it (the id rides on a status apply, which
/// may come after the one showing the phase a test waits for).
fn annotated(pod: &Value) -> bool {
    pod["metadata"]["annotations"][INSTANCE_ID].is_string()
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

fn condition(pod: &Value, kind: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// The files of an ECI `ConfigFileVolume`, by path, decoded.
fn files_of(volume: &Value) -> std::collections::BTreeMap<String, String> {
    use base64::Engine as _;
    volume["config_file_volume"]["config_file_to_path"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|file| {
            let content = base64::engine::general_purpose::STANDARD
                .decode(file["content"].as_str().unwrap_or_default())
                .unwrap();
            (
                file["path"].as_str().unwrap_or_default().to_owned(),
                String::from_utf8(content).unwrap(),
            )
        })
        .collect()
}

/// The claims of a JSON Web Token (not verified: the apiserver issued it).
fn jwt_claims(token: &str) -> Value {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).unwrap_or_default();
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap_or_else(|e| panic!("a JWT's payload ({token:?}): {e}"));
    serde_json::from_slice(&payload).unwrap()
}

pub(crate) async fn a_pod_runs_with_its_ip_conditions_and_references(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        let maps: Api<ConfigMap> = Api::namespaced(h.client(), &ns);
        maps.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "app-config"}, "data": {"mode": "prod", "app.yaml": "debug: false"}})).unwrap()).await?;
        let secrets: Api<Secret> = Api::namespaced(h.client(), &ns);
        secrets.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "db"}, "stringData": {"password": "s3cret"}})).unwrap()).await?;
        let pod = pod_spec("web", &node, json!({
            "containers": [{"name": "app", "image": "nginx:1.27",
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
                    {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
                ],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]}],
            "volumes": [{"name": "config", "configMap": {"name": "app-config"}}]
        }));
        create(h, &ns, &pod).await?;
        let running = wait_pod(h, &ns, "web", "Running and Ready", |p| phase(p) == "Running" && condition(p, "Ready") == "True" && annotated(p)).await?;
        assert_eq!(running["spec"]["nodeName"], node.as_str(), "kube-scheduler bound the pod to the virtual node");
        let ip = running["status"]["podIP"].as_str().unwrap_or_default().to_owned();
        assert!(ip.starts_with("192.168."), "{running}");
        for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert_eq!(condition(&running, kind), "True", "{kind}");
        }
        let status = &running["status"]["containerStatuses"][0];
        assert!(status["containerID"].as_str().unwrap().starts_with("eci://"));
        assert!(status["state"]["running"]["startedAt"].is_string());
        let instance = running["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap_or_default().to_owned();
        // ServiceAccount admission gave the pod its token volume.
        let token_volume = running["spec"]["volumes"].as_array().unwrap().iter().find_map(|v| v["name"].as_str().filter(|n| n.starts_with("kube-api-access-"))).map(str::to_owned);
        let token_volume = token_volume.expect("ServiceAccount admission adds the kube-api-access volume");

        let groups = groups(&admin).await.unwrap();
        assert_eq!(groups.len(), 1);
        let group = &groups[0];
        assert_eq!(group["container_group_id"], instance.as_str());
        let env = group["containers"][0]["environment_vars"].as_array().unwrap();
        let var = |key: &str| env.iter().find(|v| v["key"] == key).cloned().unwrap_or_default();
        assert_eq!(var("POD_IP")["field_ref"]["field_path"], "status.podIP", "status.podIP reaches ECI as a field reference");
        assert_eq!(var("MODE")["value"], "prod");
        assert_eq!(var("DB_PASSWORD")["value"], "s3cret");
        let volume = group["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "config").cloned().unwrap();
        assert_eq!(volume["type"], "ConfigFileVolume");
        assert_eq!(volume["config_file_volume"]["config_file_to_path"].as_array().unwrap().len(), 2);
        // The token volume travels too, filled from the real API: a token the daemon obtained
        // through TokenRequest (as its ServiceAccount), bound to this pod, the cluster's root CA
        // from the namespace's kube-root-ca.crt ConfigMap, and the namespace.
        let volume = group["volumes"].as_array().unwrap().iter().find(|v| v["name"] == token_volume.as_str()).cloned();
        let volume = volume.unwrap_or_else(|| panic!("the service account token volume travels too: {group}"));
        let files = files_of(&volume);
        assert_eq!(files.get("namespace").map(String::as_str), Some(ns.as_str()), "{files:?}");
        let root_ca = maps.get("kube-root-ca.crt").await?.data.unwrap_or_default().remove("ca.crt").unwrap_or_default();
        assert!(root_ca.contains("BEGIN CERTIFICATE"), "{root_ca}");
        assert_eq!(files.get("ca.crt"), Some(&root_ca));
        let claims = jwt_claims(files.get("token").map_or("", String::as_str));
        assert_eq!(claims["sub"], format!("system:serviceaccount:{ns}:default"), "{claims}");
        assert_eq!(claims["kubernetes.io"]["pod"]["name"], "web", "{claims}");
        assert_eq!(claims["kubernetes.io"]["pod"]["uid"], running["metadata"]["uid"], "{claims}");
        Ok(())
    })
    .await;
}

pub(crate) async fn exit_codes_under_each_restart_policy_and_init_containers(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, ns, admin } = start(h).await?;
        let mut never_ok = json!({"restartPolicy": "Never", "containers": [container(&[("MOCK_ECI_EXIT_CODE", "0"), ("MOCK_ECI_EXIT_AFTER", "300ms")])]});
        never_ok["initContainers"] = json!([{"name": "migrate", "image": "registry.example.com/migrate:1"}]);
        create(h, &ns, &pod_spec("never-ok", &node, never_ok)).await?;
        create(h, &ns, &pod_spec("never-fail", &node, json!({"restartPolicy": "Never", "containers": [container(&[("MOCK_ECI_EXIT_CODE", "3"), ("MOCK_ECI_EXIT_AFTER", "300ms")])]}))).await?;
        create(h, &ns, &pod_spec("on-failure", &node, json!({"restartPolicy": "OnFailure", "containers": [container(&[("MOCK_ECI_EXIT_CODE", "1"), ("MOCK_ECI_EXIT_AFTER", "300ms"), ("MOCK_ECI_EXIT_RUNS", "1")])]}))).await?;
        // A Job-like pod with a native sidecar: it runs beside the job and does not hold it.
        let mut with_sidecar = json!({"restartPolicy": "Never", "containers": [container(&[("MOCK_ECI_EXIT_CODE", "0"), ("MOCK_ECI_EXIT_AFTER", "1s")])]});
        with_sidecar["initContainers"] = json!([{"name": "logs", "image": "registry.example.com/logs:1", "restartPolicy": "Always"}]);
        create(h, &ns, &pod_spec("with-sidecar", &node, with_sidecar)).await?;
        // An active deadline given at creation is ECI's to enforce: the group ends, and stays
        // (its logs with it).
        create(h, &ns, &pod_spec("deadline-at-create", &node, json!({"restartPolicy": "Never", "activeDeadlineSeconds": 2, "containers": [container(&[])]}))).await?;
        // One lowered on a running pod reaches no ECI parameter: the daemon stops the pod.
        create(h, &ns, &pod_spec("deadline-lowered", &node, json!({"restartPolicy": "Never", "activeDeadlineSeconds": 3600, "terminationGracePeriodSeconds": 1, "containers": [container(&[])]}))).await?;

        let ok = wait_pod(h, &ns, "never-ok", "Succeeded", |p| phase(p) == "Succeeded").await?;
        assert_eq!(ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0);
        let init = &ok["status"]["initContainerStatuses"][0];
        assert_eq!((init["name"].as_str(), init["state"]["terminated"]["reason"].as_str()), (Some("migrate"), Some("Completed")));
        assert_eq!(condition(&ok, "Initialized"), "True");

        let failed = wait_pod(h, &ns, "never-fail", "Failed", |p| phase(p) == "Failed").await?;
        let terminated = &failed["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!((terminated["exitCode"].as_i64(), terminated["reason"].as_str()), (Some(3), Some("Error")));

        let restarted = wait_pod(h, &ns, "on-failure", "restarted once and running", |p| {
            phase(p) == "Running" && p["status"]["containerStatuses"][0]["restartCount"] == 1 && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
        .await?;
        assert_eq!(restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"], 1);

        let done = wait_pod(h, &ns, "with-sidecar", "Succeeded with its sidecar stopped", |p| phase(p) == "Succeeded" && annotated(p)).await?;
        let sidecar = &done["status"]["initContainerStatuses"][0];
        assert_eq!((sidecar["name"].as_str(), sidecar["state"]["terminated"]["exitCode"].as_i64()), (Some("logs"), Some(0)), "{done}");
        let instance = done["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap_or_default().to_owned();
        let request = created_with(&admin, &instance).await.unwrap();
        let names: Vec<&str> = request["container"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["logs", "app"], "the sidecar is a container of the group: {request}");
        assert!(request["init_container"].as_array().is_none_or(Vec::is_empty), "{request}");
        let declared = request["container"][0]["environment_var"].as_array().unwrap();
        assert!(declared.iter().any(|v| v["key"] == "ECI_CONTAINER_TYPE" && v["value"] == "sidecar"), "{request}");

        let exceeded = |p: &Value| phase(p) == "Failed" && p["status"]["reason"] == "DeadlineExceeded" && annotated(p);
        let ended = wait_pod(h, &ns, "deadline-at-create", "Failed, DeadlineExceeded", exceeded).await?;
        assert_eq!(ended["status"]["message"], "Pod was active on the node longer than the specified deadline");
        let instance = ended["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap_or_default().to_owned();
        assert_eq!(created_with(&admin, &instance).await.unwrap()["active_deadline_seconds"], 2);
        let kept = groups(&admin).await.unwrap().into_iter().find(|g| g["container_group_id"] == instance.as_str());
        assert_eq!(kept.map(|g| g["status"].clone()), Some(json!("Failed")), "ECI's own ending keeps the group");

        let running = wait_pod(h, &ns, "deadline-lowered", "Running", |p| phase(p) == "Running" && annotated(p)).await?;
        let instance = running["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap_or_default().to_owned();
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        pods.patch("deadline-lowered", &PatchParams::default(), &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 1}}))).await?;
        let stopped = wait_pod(h, &ns, "deadline-lowered", "Failed, DeadlineExceeded", exceeded).await?;
        let terminated = &stopped["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!((terminated["exitCode"].as_i64(), terminated["reason"].as_str()), (Some(137), Some("Error")), "{stopped}");
        assert_eq!(condition(&stopped, "Ready"), "False");
        h.wait_event((&ns, "deadline-lowered"), "Normal", "DeadlineExceeded", &["longer than the specified deadline"], WAIT).await?;
        h.wait_for("the stopped pod's group to be deleted", WAIT, |_| {
            let (admin, instance) = (admin.clone(), instance.clone());
            async move { groups(&admin).await.unwrap().iter().all(|g| g["container_group_id"] != instance.as_str()) }
        })
        .await?;
        let still = get(h, &ns, "deadline-lowered").await.unwrap_or_default();
        assert_eq!((phase(&still), still["status"]["reason"].as_str()), ("Failed", Some("DeadlineExceeded")), "the pod stays, failed: {still}");
        Ok(())
    })
    .await;
}

pub(crate) async fn graceful_deletion_waits_for_the_group_then_removes_the_pod(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        create(
            h,
            &ns,
            &pod_spec(
                "graceful",
                &node,
                json!({"terminationGracePeriodSeconds": 3, "containers": [container(&[])]}),
            ),
        )
        .await?;
        wait_pod(h, &ns, "graceful", "Running", |p| phase(p) == "Running").await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        pods.delete("graceful", &DeleteParams::default()).await?;
        h.wait_for("the group to be Terminating", WAIT, |_| {
            let admin = admin.clone();
            async move {
                groups(&admin)
                    .await
                    .unwrap()
                    .iter()
                    .any(|g| g["status"] == "Terminating")
            }
        })
        .await?;
        let terminating = get(h, &ns, "graceful").await;
        assert!(
            terminating.is_some(),
            "the pod stays while its group honours the grace period"
        );
        let terminating = terminating.unwrap_or_default();
        assert!(
            terminating["metadata"]["deletionTimestamp"].is_string(),
            "the apiserver marked the pod for graceful deletion: {terminating}"
        );
        assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 3);
        h.wait_for("the pod to be gone", WAIT, |h| {
            let ns = ns.clone();
            async move { get(h, &ns, "graceful").await.is_none() }
        })
        .await?;
        assert!(
            groups(&admin).await.unwrap().is_empty(),
            "the group is gone too"
        );
        Ok(())
    })
    .await;
}

pub(crate) async fn failures_are_visible_on_the_pod(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        // A pod ECI can never run.
        create(h, &ns, &pod_spec("host-path", &node, json!({"containers": [container(&[])], "volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]}))).await?;
        let failed = wait_pod(h, &ns, "host-path", "ProviderFailed", |p| p["status"]["reason"] == "ProviderFailed").await?;
        assert_eq!(phase(&failed), "Failed");
        assert!(failed["status"]["message"].as_str().unwrap().contains("hostPath volumes cannot run on ECI"), "{failed}");

        // No stock: the group ends ScheduleFailed and the pod says why.
        set_controls(&admin, json!({"no_stock": true})).await;
        create(h, &ns, &pod_spec("starved", &node, json!({"containers": [container(&[])]}))).await?;
        let starved = wait_pod(h, &ns, "starved", "ScheduleFailed", |p| p["status"]["reason"] == "ScheduleFailed").await?;
        assert!(starved["status"]["message"].as_str().unwrap().starts_with("NoStock"), "{starved}");
        set_controls(&admin, json!({"no_stock": false})).await;

        // A group that vanishes out of band fails its pod with NotFound.
        create(h, &ns, &pod_spec("vanishing", &node, json!({"containers": [container(&[])]}))).await?;
        let running = wait_pod(h, &ns, "vanishing", "Running", |p| phase(p) == "Running" && annotated(p)).await?;
        let id = running["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap().to_owned();
        reqwest::Client::new().post(format!("{admin}/admin/groups/{id}/vanish")).send().await.unwrap();
        wait_pod(h, &ns, "vanishing", "NotFound", |p| phase(p) == "Failed" && p["status"]["reason"] == "NotFound").await?;

        // A Secret the pod needs does not exist yet: it waits without a group, says so with the
        // reasons ack-virtual-node (a virtual kubelet) reports, and runs once the Secret exists.
        // An optional ConfigMap that never comes is left out, with an Event.
        create(h, &ns, &pod_spec("needs-secret", &node, json!({"containers": [{"name": "app", "image": "registry.example.com/app:1", "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "nowhere", "key": "mode", "optional": true}}}]}]}))).await?;
        let waiting = h.wait_refused((&ns, "needs-secret"), "Pending", "MandatorySecretNotFound", &["secret \"later\" not found"], WAIT).await?;
        assert_eq!(waiting["status"]["reason"], "CreateContainerConfigError", "{waiting}");
        assert!(groups(&admin).await.unwrap().iter().all(|g| g["container_group_name"].as_str().is_none_or(|n| !n.contains("needs-secret"))), "no group before the Secret exists");
        let secrets: Api<Secret> = Api::namespaced(h.client(), &ns);
        secrets.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "later"}, "stringData": {"token": "t0"}})).unwrap()).await?;
        wait_pod(h, &ns, "needs-secret", "Running once its Secret exists", |p| phase(p) == "Running").await?;
        h.wait_warning_event(&ns, "needs-secret", "OptionalConfigMapNotFound", &["configmap \"nowhere\" not found"], WAIT).await?;

        // A subPathExpr naming an annotation the pod does not have yet: its container waits as
        // the kubelet shows it, without a group; once the annotation is there, the group mounts
        // the expanded sub-path.
        create(h, &ns, &pod_spec("sub-path", &node, json!({"containers": [{"name": "app", "image": "registry.example.com/app:1",
            "env": [{"name": "POD_NAME", "value": "foo"}, {"name": "ANNOTATION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['mysubpath']"}}}],
            "volumeMounts": [{"name": "work", "mountPath": "/sub", "subPathExpr": "$(ANNOTATION)/$(POD_NAME)"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}]}))).await?;
        let waiting = wait_pod(h, &ns, "sub-path", "its container waiting with CreateContainerConfigError", |p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
        .await?;
        let shown = &waiting["status"]["containerStatuses"][0]["state"]["waiting"]["message"];
        assert!(shown.as_str().unwrap_or_default().contains("missing value for ANNOTATION"), "{waiting}");
        assert_eq!(phase(&waiting), "Pending");
        assert!(groups(&admin).await.unwrap().iter().all(|g| g["container_group_name"].as_str().is_none_or(|n| !n.contains("sub-path"))), "no group while the sub-path cannot be expanded");
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        pods.patch("sub-path", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"mysubpath": "mypath"}}}))).await?;
        let running = wait_pod(h, &ns, "sub-path", "Running once annotated", |p| phase(p) == "Running" && annotated(p)).await?;
        let id = running["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap_or_default().to_owned();
        let request = created_with(&admin, &id).await?;
        assert_eq!(request["container"][0]["volume_mount"][0]["sub_path"], "mypath/foo", "{request}");
        Ok(())
    })
    .await;
}

pub(crate) async fn outages_and_restarts_leave_one_group_per_pod_and_no_orphans(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        // The daemon is up (its node Ready) before the outage starts.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.client());
        h.wait_for("the node to be Ready", WAIT, |_| {
            let (nodes, node) = (nodes.clone(), node.clone());
            async move {
                nodes
                    .get_opt(&node)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|n| n.status)
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            }
        })
        .await?;
        // Creation during an ECI outage: pods wait and run once it ends. These pods are bound
        // directly (`spec.nodeName`), as pods bound just before the outage began would be: an
        // outage longer than ECI_UNREACHABLE_THRESHOLD (1 s here) turns the node NotReady (its
        // ECI probe fails too), the node lifecycle controller taints it not-ready, and
        // kube-scheduler rightly places nothing there — on a loaded machine, possibly before it
        // got to these pods. The scenario is about the daemon's creation retries, not placement.
        set_controls(&admin, json!({"outage": true})).await;
        for i in 0..6 {
            create(
                h,
                &ns,
                &pod_bound_to(
                    &format!("p{i}"),
                    &node,
                    json!({"containers": [container(&[])]}),
                ),
            )
            .await?;
        }
        h.wait_for("the daemon to hit the outage", WAIT, |_| {
            let admin = admin.clone();
            async move {
                let metrics = reqwest::get(format!("{admin}/metrics"))
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                metrics.contains(r#"action="CreateContainerGroup",result="ServiceUnavailable""#)
            }
        })
        .await?;
        set_controls(&admin, json!({"outage": false})).await;
        for i in 0..6 {
            wait_pod(h, &ns, &format!("p{i}"), "Running", |p| {
                phase(p) == "Running"
            })
            .await?;
        }
        assert_eq!(groups(&admin).await.unwrap().len(), 6);

        // Crash the daemon; two pods are force-deleted meanwhile; the restarted daemon adopts the
        // rest and deletes exactly the two orphans.
        let name = h.node_name(0);
        h.process(&name).unwrap().kill().await;
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        for victim in ["p0", "p1"] {
            pods.delete(victim, &DeleteParams::default().grace_period(0))
                .await?;
        }
        // As if the process had died between creating p2's group and recording its id.
        pods.patch_metadata(
            "p2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {INSTANCE_ID: null}}})),
        )
        .await?;
        h.start_daemon(0, FAST_DAEMON)?;
        h.wait_for("the orphans to be deleted", WAIT, |_| {
            let admin = admin.clone();
            async move { groups(&admin).await.unwrap().len() == 4 }
        })
        .await?;
        let groups = groups(&admin).await.unwrap();
        assert_eq!(
            pod_names_of(&groups),
            vec!["p2", "p3", "p4", "p5"],
            "one group per remaining pod"
        );
        for i in 2..6 {
            assert_eq!(
                phase(&get(h, &ns, &format!("p{i}")).await.unwrap()),
                "Running"
            );
        }
        h.wait_for("p2's instance id to be recorded again", WAIT, |_| async {
            get(h, &ns, "p2")
                .await
                .is_some_and(|p| p["metadata"]["annotations"][INSTANCE_ID].as_str().is_some())
        })
        .await?;
        for group in &groups {
            let pod = pod_name_of(group);
            let recorded =
                get(h, &ns, pod).await.unwrap()["metadata"]["annotations"][INSTANCE_ID].clone();
            assert_eq!(
                recorded, group["container_group_id"],
                "{pod} names its group"
            );
        }
        Ok(())
    })
    .await;
}

async fn wait_all_running(h: &Harness, ns: &str, count: usize) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    h.wait_for(
        &format!("all {count} pods of {ns} to run"),
        Duration::from_secs(240),
        |_| {
            let pods = pods.clone();
            async move {
                pods.list(&Default::default()).await.is_ok_and(|l| {
                    l.items.len() == count
                        && l.items.iter().all(|p| {
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        })
                })
            }
        },
    )
    .await
}

/// The pod a group was created for, from its tag.
fn pod_name_of(group: &Value) -> &str {
    tag(group, "k8s.aliyun.com/pod-name")
}

fn pod_names_of(groups: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = groups.iter().map(|g| pod_name_of(g).to_owned()).collect();
    names.sort();
    names
}

async fn create_many(h: &Harness, ns: &str, node: &str, count: usize) {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    let creations = (0..count).map(|i| {
        let (pods, pod) = (
            pods.clone(),
            pod_spec(
                &format!("burst-{i:03}"),
                node,
                json!({"containers": [container(&[])]}),
            ),
        );
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    });
    futures::future::join_all(creations).await;
}

async fn created_count(admin: &str) -> u64 {
    let metrics = reqwest::get(format!("{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    metrics
        .lines()
        .find(|l| {
            l.starts_with(r#"mock_eci_calls_total{action="CreateContainerGroup",result="ok"}"#)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(crate) async fn a_crash_in_the_middle_of_a_200_pod_burst_leaves_exactly_one_group_per_pod(
    api: EciApi,
) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        create_many(h, &ns, &node, 200).await;
        h.wait_for("the daemon to be in the middle of the burst", WAIT, |_| {
            let admin = admin.clone();
            async move { created_count(&admin).await >= 40 }
        })
        .await?;
        let name = h.node_name(0);
        h.process(&name).unwrap().kill().await;
        h.start_daemon(0, FAST_DAEMON)?;
        wait_all_running(h, &ns, 200).await?;
        let groups = groups(&admin).await.unwrap();
        let names = pod_names_of(&groups);
        let expected: Vec<String> = (0..200).map(|i| format!("burst-{i:03}")).collect();
        assert_eq!(names, expected, "exactly one group per pod, no orphans");
        Ok(())
    })
    .await;
}

pub(crate) async fn a_throttling_storm_ends_with_every_pod_running_and_nothing_leaked(api: EciApi) {
    with_harness(api, async |h| {
        let ns = h.create_namespace("pods").await?;
        // ECI allows 2 creates a second; the daemon, unpaced, runs into the limit and retries.
        let mock = h
            .start_mock_eci(&[FAST_MOCK, &["--rate-limit", "CreateContainerGroup=120/2"]].concat())
            .await?;
        let mut env = FAST_DAEMON.to_vec();
        env.push(("NO_ECI_CLIENT_RATE_LIMITS", "true"));
        h.start_daemon(0, &env)?;
        let node = h.node_name(0);
        create_many(h, &ns, &node, 20).await;
        wait_all_running(h, &ns, 20).await?;
        let metrics = reqwest::get(format!("{}/metrics", mock.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains(r#"action="CreateContainerGroup",result="Throttling.User""#),
            "the storm happened"
        );
        assert_eq!(
            pod_names_of(&groups(&mock.admin).await.unwrap()).len(),
            20,
            "one group per pod"
        );
        Ok(())
    })
    .await;
}

/// Kubernetes' promises a group must keep: a StatefulSet pod's hostname, the DNS policy, sysctls
/// and security settings reach ECI by the service's own parameters (on the OpenAPI backend, the
/// front refuses any name the service does not define); a probe ECI cannot express is named in
/// a Warning Event, the pod still running.
pub(crate) async fn a_pods_identity_and_security_reach_eci(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        let app = json!({"name": "app", "image": "registry.example.com/db:1",
            "ports": [{"containerPort": 5432}],
            "securityContext": {"runAsGroup": 70, "capabilities": {"add": ["NET_ADMIN"]}},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 5432, "httpHeaders": [{"name": "X-Probe", "value": "1"}]}}});
        let pod = pod_spec("db-0", &node, json!({
            "hostname": "db-0", "subdomain": "db", "shareProcessNamespace": true,
            "dnsPolicy": "None", "dnsConfig": {"nameservers": ["10.0.0.53"]},
            "securityContext": {"runAsUser": 70, "runAsNonRoot": true, "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "600"}]},
            "containers": [app]
        }));
        create(h, &ns, &pod).await?;
        let running = wait_pod(h, &ns, "db-0", "Running", |p| phase(p) == "Running" && annotated(p)).await?;
        let id = running["metadata"]["annotations"][INSTANCE_ID].as_str().unwrap().to_owned();
        let request = created_with(&admin, &id).await.unwrap();
        assert_eq!(request["host_name"], "db-0", "the pod's hostname, not <namespace>-<name>");
        assert_eq!(request["dns_policy"], "None", "the pod's resolvers are the group's only ones");
        assert_eq!(request["dns_config"]["name_server"], json!(["10.0.0.53"]));
        assert_eq!(request["share_process_namespace"], true);
        assert_eq!(request["security_context"]["sysctl"], json!([{"name": "net.ipv4.tcp_keepalive_time", "value": "600"}]));
        let container = &request["container"][0];
        assert_eq!(
            (&container["security_context_run_as_group"], &container["security_context_run_as_non_root"], &container["security_context"]["run_as_user"]),
            (&json!(70), &json!(true), &json!(70)),
            "{container}"
        );
        let probe = &container["liveness_probe"]["http_get"];
        assert_eq!(probe["path"], "/healthz");
        if matches!(api, EciApi::OpenApi) {
            assert_eq!(probe["http_header"], json!([]), "ECI's probes take no headers: none travel");
        }
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(h.client(), &ns);
        h.wait_for("a Warning Event naming the probe's headers", WAIT, |_| {
            let events = events.clone();
            async move {
                events.list(&Default::default()).await.is_ok_and(|list| {
                    list.items.iter().any(|e| {
                        e.reason.as_deref() == Some("NotFullySupportedOnECI")
                            && e.message.as_deref().is_some_and(|m| m.contains("httpHeaders (X-Probe)"))
                    })
                })
            }
        })
        .await?;
        Ok(())
    })
    .await;
}

/// The ECI calls one pod's life costs, as mock-eci counted them (every result, errors too):
/// `(CreateContainerGroup, DeleteContainerGroup)`.
async fn lifecycle_calls(h: &Harness) -> (f64, f64) {
    let text = h.mock_metrics().await.unwrap_or_default();
    let all = |action: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("mock_eci_calls_total{"))
            .filter(|l| l.contains(&format!("action=\"{action}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (all("CreateContainerGroup"), all("DeleteContainerGroup"))
}

pub(crate) async fn each_pod_costs_one_create_and_one_delete(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        // Grace periods as users write them: none (removed at once), short ones that ECI
        // honours to the end, and the default 30 s (the app stops at SIGTERM before that).
        let graces = [Some(0), Some(1), Some(2), Some(3), None];
        let mut names = Vec::new();
        for (i, grace) in graces.iter().cycle().take(20).enumerate() {
            let name = format!("life-{i}");
            let spec = match grace {
                Some(grace) => {
                    json!({"terminationGracePeriodSeconds": grace, "containers": [container(&[])]})
                }
                None => json!({"containers": [container(&[("MOCK_ECI_STOP_AFTER", "500ms")])]}),
            };
            create(h, &ns, &pod_spec(&name, &node, spec)).await?;
            names.push(name);
        }
        for name in &names {
            wait_pod(h, &ns, name, "Running", |p| phase(p) == "Running").await?;
        }
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        for name in &names {
            pods.delete(name, &DeleteParams::default()).await?;
        }
        h.wait_for("every pod and group gone", WAIT, |h| {
            let (ns, admin) = (ns.clone(), admin.clone());
            async move {
                let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
                let left = pods.list(&Default::default()).await.map(|l| l.items.len());
                left.ok() == Some(0) && groups(&admin).await.unwrap().is_empty()
            }
        })
        .await?;
        let (creates, deletes) = lifecycle_calls(h).await;
        let counted: Vec<String> = h
            .mock_metrics()
            .await
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("mock_eci_calls_total{") && l.contains("ContainerGroup\""))
            .map(str::to_owned)
            .collect();
        if (creates, deletes) != (20.0, 20.0) {
            // An error, not a panic: the harness then prints the daemon's log.
            return Err(HarnessError::Setup(format!(
                "one CreateContainerGroup and one DeleteContainerGroup per pod (errors included) expected, mock-eci counted {creates} and {deletes}: {counted:#?}"
            )));
        }
        Ok(())
    })
    .await;
}

/// How many Event objects say `reason` about pod `name` (core/v1 view of every Event).
async fn events_about(h: &Harness, ns: &str, name: &str, reason: &str) -> usize {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(h.client(), ns);
    events
        .list(&Default::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .filter(|e| {
                    e.involved_object.name.as_deref() == Some(name)
                        && e.reason.as_deref() == Some(reason)
                })
                .count()
        })
        .unwrap_or(0)
}

pub(crate) async fn a_restart_publishes_no_eci_event_twice(api: EciApi) {
    with_harness(api, async |h| {
        let Scene { node, ns, .. } = start(h).await?;
        let names = ["ev-0", "ev-1", "ev-2"];
        for name in names {
            let spec = json!({"containers": [container(&[])]});
            create(h, &ns, &pod_spec(name, &node, spec)).await?;
        }
        for name in names {
            wait_pod(h, &ns, name, "Running", |p| phase(p) == "Running").await?;
            h.wait_for(&format!("{name}'s Started Event"), WAIT, |h| {
                let ns = ns.clone();
                async move { events_about(h, &ns, name, "Started").await == 1 }
            })
            .await?;
        }
        // A restart: the successor adopts the groups, whose answers list the same events.
        let daemon = h.node_name(0);
        let status = h
            .process(&daemon)
            .ok_or_else(|| HarnessError::Setup("the daemon is not running".into()))?
            .terminate(Duration::from_secs(20))
            .await;
        if !status.is_some_and(|s| s.success()) {
            return Err(HarnessError::Setup(format!("the daemon did not stop cleanly: {status:?}")));
        }
        h.start_daemon(0, FAST_DAEMON)?;
        // The successor is at work once a new pod runs (it polled every group meanwhile).
        create(h, &ns, &pod_spec("after", &node, json!({"containers": [container(&[])]}))).await?;
        wait_pod(h, &ns, "after", "Running", |p| phase(p) == "Running").await?;
        h.wait_for("the new pod's Started Event", WAIT, |h| {
            let ns = ns.clone();
            async move { events_about(h, &ns, "after", "Started").await == 1 }
        })
        .await?;
        for name in names {
            let started = events_about(h, &ns, name, "Started").await;
            if started != 1 {
                return Err(HarnessError::Setup(format!(
                    "{name}: {started} Started Events after the restart, expected the one from before"
                )));
            }
        }
        Ok(())
    })
    .await;
}

/// mock-eci's count of `action` calls that ended in `result` (e.g. `AnswerLost`).
async fn calls_ending(h: &Harness, action: &str, result: &str) -> f64 {
    let text = h.mock_metrics().await.unwrap_or_default();
    let labels = format!(r#"action="{action}",result="{result}""#);
    integration::harness::invariants::sample(&text, "mock_eci_calls_total", &labels)
}

/// A create whose answer is lost made the group all the same. Pods mount their service
/// account token (the real admission adds the projected volume): the pod must end up running
/// on the one group made, not Failed beside a group nobody tracks. Then a pod deleted while
/// every create answer is lost leaves no group behind (it did: the group made by an unanswered
/// attempt was tracked by nobody once its pod went, until the next restart's adoption).
pub(crate) async fn lost_create_answers_on_token_mounting_pods_cost_no_pod_and_no_group(
    api: EciApi,
) {
    with_harness(api, async |h| {
        let Scene { node, admin, ns } = start(h).await?;
        let lose_creates =
            |rate: f64| json!({"faults": {"CreateContainerGroup": {"lost_answer_rate": rate}}});
        set_controls(&admin, lose_creates(1.0)).await;
        create(
            h,
            &ns,
            &pod_spec("lost-0", &node, json!({"containers": [container(&[])]})),
        )
        .await?;
        h.wait_for("a create answer to be lost", WAIT, |h| async move {
            calls_ending(h, "CreateContainerGroup", "AnswerLost").await >= 1.0
        })
        .await?;
        set_controls(&admin, lose_creates(0.0)).await;
        let running = wait_pod(h, &ns, "lost-0", "Running (not Failed)", |p| {
            matches!(phase(p), "Running" | "Failed")
        })
        .await?;
        if phase(&running) != "Running" {
            return Err(HarnessError::Setup(format!(
                "the pod failed after a lost create answer: {}",
                running["status"]
            )));
        }
        let mounted = running["spec"]["volumes"].to_string();
        assert!(
            mounted.contains("kube-api-access"),
            "the pod mounts its token: {mounted}"
        );
        let live = groups(&admin).await.unwrap();
        assert_eq!(live.len(), 1, "one group for the pod: {live:#?}");

        // Deleted while every create answer is lost: the group made meanwhile must go too.
        set_controls(&admin, lose_creates(1.0)).await;
        let before = calls_ending(h, "CreateContainerGroup", "AnswerLost").await;
        create(
            h,
            &ns,
            &pod_spec("lost-1", &node, json!({"containers": [container(&[])]})),
        )
        .await?;
        h.wait_for("lost-1's create answer to be lost", WAIT, |h| async move {
            calls_ending(h, "CreateContainerGroup", "AnswerLost").await > before
        })
        .await?;
        // The unanswered attempt made lost-1's group: the sweep has something to delete.
        h.wait_for("lost-1's group made", WAIT, |_| {
            let admin = admin.clone();
            async move { groups(&admin).await.unwrap().len() == 2 }
        })
        .await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        pods.delete("lost-1", &DeleteParams::default()).await?;
        h.wait_for("lost-1 and its group gone, lost-0's kept", WAIT, |h| {
            let (ns, admin) = (ns.clone(), admin.clone());
            async move {
                let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
                let gone = matches!(pods.get_opt("lost-1").await, Ok(None));
                gone && groups(&admin).await.unwrap().len() == 1
            }
        })
        .await?;
        set_controls(&admin, lose_creates(0.0)).await;
        Ok(())
    })
    .await;
}
