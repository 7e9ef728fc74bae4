//! The OpenAPI client held to the service's names (the official SDK's table in
//! `eci_proto::openapi::documented`): every parameter it sends for a corpus of rich pods is
//! one the service defines for the action, and every answer field it reads is one the service
//! sends. mock-eci is held to the same table by its own tests, so the two sides can no longer
//! agree on a name the service does not know.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use eci_proto::openapi::documented::{self, Kind};
use eci_proto::openapi::form::{Request, encode};
use eci_proto::v20180808::{
    AcrRegistryInfo, CreateImageCacheRequest, CreateImageCacheResponse, DeleteImageCacheRequest,
    DescribeImageCachesRequest, DescribeImageCachesResponse, ImageRegistryCredential,
    UpdateImageCacheRequest,
};
use eci_proto::v20180808::{
    DeleteContainerGroupRequest, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupsRequest, DescribeContainerGroupsResponse, DescribeContainerLogRequest,
    DescribeContainerLogResponse, DescribeMultiContainerGroupMetricRequest,
    DescribeMultiContainerGroupMetricResponse, ExecContainerCommandRequest,
    ExecContainerCommandResponse, RestartContainerGroupRequest, Tag, UpdateContainerGroupRequest,
};
use serde_json::{Map, Value, json};

use virtual_node_eci::eci::openapi::response;
use vne_core::to_eci::{self, Context};

/// The parameters the client sends for one request.
type Params = Vec<(String, String)>;

/// What the client sends for `request`.
fn form<R: Request>(request: &R) -> Params {
    encode(request).expect("every request encodes")
}

/// The keys of `params` that `action` does not define.
fn undocumented(action: &str, params: Params) -> BTreeSet<String> {
    params
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| !documented::accepts_parameter(action, key))
        .collect()
}

/// Pods using every field the translation handles.
fn rich_pods() -> Vec<k8s_openapi::api::core::v1::Pod> {
    let container = json!({
        "name": "app", "image": "registry.example.com/app:1",
        "command": ["/app"], "args": ["--port", "$(PORT)"], "workingDir": "/srv",
        "imagePullPolicy": "IfNotPresent", "stdin": true, "stdinOnce": true, "tty": true,
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [{"name": "PORT", "value": "8080"}, {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 53, "protocol": "UDP"}],
        "resources": {"limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": "cache", "mountPath": "/cache", "subPath": "a", "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "nas", "mountPath": "/nas"}, {"name": "conf", "mountPath": "/etc/app"}, {"name": "token", "mountPath": "/var/run/token"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP", "host": "10.0.0.9", "httpHeaders": [{"name": "X-A", "value": "1"}]},
            "initialDelaySeconds": 1, "periodSeconds": 2, "timeoutSeconds": 3, "successThreshold": 1, "failureThreshold": 4},
        "livenessProbe": {"tcpSocket": {"port": 8080, "host": "10.0.0.9"}},
        "startupProbe": {"exec": {"command": ["true"]}},
        "lifecycle": {"postStart": {"httpGet": {"path": "/start", "port": 8080, "host": "10.0.0.9", "httpHeaders": [{"name": "X-B", "value": "2"}]}},
            "preStop": {"tcpSocket": {"port": 8080, "host": "10.0.0.9"}}},
        "securityContext": {"privileged": true, "runAsUser": 0, "runAsGroup": 10, "readOnlyRootFilesystem": true,
            "capabilities": {"add": ["NET_ADMIN"]}}
    });
    let mut exec_probes = container.clone();
    exec_probes["name"] = json!("exec");
    exec_probes["readinessProbe"] = json!({"exec": {"command": ["cat", "/ready"]}});
    exec_probes["livenessProbe"] = json!({"httpGet": {"path": "/", "port": 8080}});
    exec_probes["lifecycle"] = json!({"postStart": {"exec": {"command": ["touch", "/s"]}}, "preStop": {"sleep": {"seconds": 3}}});
    exec_probes["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 1000});
    let init = json!({"name": "init", "image": "busybox", "command": ["sh"], "args": ["-c", "true"],
        "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 9000}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache", "subPath": "b"}],
        "securityContext": {"runAsUser": 5, "readOnlyRootFilesystem": true, "capabilities": {"add": ["SYS_TIME"]}},
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}});
    let pod = json!({
        "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1",
            "annotations": {"k8s.aliyun.com/eci-spot-strategy": "SpotWithPriceLimit", "k8s.aliyun.com/eci-spot-price-limit": "0.5",
                "k8s.aliyun.com/eci-spot-duration": "1", "k8s.aliyun.com/eci-use-specs": "4-8Gi",
                "k8s.aliyun.com/eci-ram-role-name": "reader", "k8s.aliyun.com/eci-resource-group-id": "rg-1",
                "k8s.aliyun.com/eci-with-eip": "true", "k8s.aliyun.com/eci-auto-imc": "true", "k8s.aliyun.com/eci-imc-id": "imc-1",
                "k8s.aliyun.com/eci-vswitch": "vsw-a,vsw-b", "k8s.aliyun.com/eci-security-group": "sg-b"}},
        "spec": {
            "hostname": "web-0", "subdomain": "web", "shareProcessNamespace": true,
            "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 10, "activeDeadlineSeconds": 3600,
            "dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["corp"], "options": [{"name": "ndots", "value": "2"}]},
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db", "db.local"]}],
            "imagePullSecrets": [{"name": "pull"}],
            "securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]},
            "initContainers": [init],
            "containers": [container, exec_probes],
            "volumes": [
                {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "nas", "nfs": {"server": "nas.example", "path": "/share", "readOnly": true}},
                {"name": "conf", "configMap": {"name": "app", "defaultMode": 420, "items": [{"key": "a", "path": "a.conf", "mode": 256}]}},
                {"name": "token", "projected": {"sources": [{"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
                {"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}},
                {"name": "bucket", "persistentVolumeClaim": {"claimName": "bucket", "readOnly": true}}
            ]
        }
    });
    vec![serde_json::from_value(pod).expect("a valid pod")]
}

#[test]
fn every_parameter_the_client_sends_is_documented() {
    let config_map: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "app"}, "data": {"a": "x"}})).unwrap();
    let auth = json!({"auths": {"registry.example.com": {"username": "u", "password": "p"}}});
    let pull: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64_of(&auth.to_string())}
    }))
    .unwrap();
    let config_maps = [("app".to_owned(), config_map)].into();
    let secrets = [("pull".to_owned(), pull)].into();
    let tokens = std::collections::BTreeMap::new();
    let dns = vec!["10.96.0.10".to_owned()];
    // The PersistentVolumes the rich pod's claims are bound to: a disk and an OSS bucket.
    let claims = [
        (
            "disk",
            json!({"capacity": {"storage": "20Gi"}, "csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": "d-1", "fsType": "ext4"}}),
        ),
        (
            "bucket",
            json!({"csi": {"driver": "ossplugin.csi.alibabacloud.com", "volumeHandle": "b", "volumeAttributes": {"bucket": "b", "url": "oss.example"}}}),
        ),
    ]
    .map(|(name, spec)| {
        let pv: k8s_openapi::api::core::v1::PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        (name.to_owned(), pv)
    })
    .into();
    let cx = Context {
        region: "cn-hangzhou",
        vswitch: "vsw-default",
        security_group: "sg-default",
        cluster_name: "c1",
        node_name: "virtual-node-eci-0",
        cluster_dns: &dns,
        cluster_domain: "cluster.local",
        config_maps: &config_maps,
        secrets: &secrets,
        claims: &claims,
        service_account_tokens: &tokens,
        default_spec: (2.0, 4.0),
        apiserver: None,
        services: &[],
        kube_proxy: true,
    };
    for pod in rich_pods() {
        let request = to_eci::translate(&pod, &cx).unwrap_or_else(|e| panic!("rejected: {e}"));
        let sent: BTreeSet<String> = form(&request)
            .into_iter()
            .map(|(key, _)| documented::normalise_parameter(&key))
            .collect();
        // The corpus reaches the parts a wrong name would hide in.
        for wanted in [
            "Container.N.SecurityContextPrivileged",
            "Container.N.LifecyclePostStartHandlerHttpGetHttpHeader.N.Name",
            "InitContainer.N.SecurityContext.RunAsUser",
            "Volume.N.ConfigFileVolume.ConfigFileToPath.N.Mode",
            "Volume.N.DiskVolume.DiskId",
            "Volume.N.DiskVolume.DiskSize",
            "Volume.N.FlexVolume.Options",
            "SecurityContext.Sysctl.N.Name",
            "HostName",
            "DnsPolicy",
        ] {
            assert!(sent.contains(wanted), "the corpus no longer sends {wanted}");
        }
        let request_form = form(&request);
        assert_eq!(
            undocumented("CreateContainerGroup", request_form),
            BTreeSet::new(),
            "CreateContainerGroup parameters the service does not define"
        );
        let volumes = to_eci::token_volumes(&pod, &cx).unwrap_or_default();
        let update = UpdateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: "eci-1".into(),
            restart_policy: "Always".into(),
            tag: vec![tag()],
            volume: request.volume.iter().cloned().chain(volumes).collect(),
            client_token: "t".into(),
            update_type: "RenewUpdate".into(),
            ..UpdateContainerGroupRequest::default()
        };
        assert_eq!(
            undocumented("UpdateContainerGroup", form(&update)),
            BTreeSet::new()
        );
    }
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn tag() -> Tag {
    Tag {
        key: "k".into(),
        value: "v".into(),
    }
}

#[test]
fn every_other_action_sends_documented_parameters_only() {
    let ids = vec!["eci-1".to_owned(), "eci-2".to_owned()];
    let cases: Vec<(&str, Params)> = vec![
        (
            "DescribeContainerGroups",
            form(&DescribeContainerGroupsRequest {
                region_id: "r".into(),
                zone_id: "z".into(),
                container_group_ids: ids.clone(),
                limit: Some(20),
                next_token: "n".into(),
                status: "Running".into(),
                tag: vec![tag()],
                container_group_name: "g".into(),
                v_switch_id: "vsw".into(),
                security_group_id: "sg".into(),
                resource_group_id: "rg".into(),
                with_event: true,
            }),
        ),
        (
            "DescribeContainerGroupStatus",
            form(&DescribeContainerGroupStatusRequest {
                region_id: "r".into(),
                zone_id: "z".into(),
                container_group_ids: ids.clone(),
                limit: Some(200),
                next_token: "n".into(),
                since_second: Some(30),
                tag: vec![tag()],
                resource_group_id: "rg".into(),
            }),
        ),
        (
            "DeleteContainerGroup",
            form(&DeleteContainerGroupRequest {
                region_id: "r".into(),
                container_group_id: "eci-1".into(),
                client_token: "t".into(),
                force: true,
            }),
        ),
        (
            "RestartContainerGroup",
            form(&RestartContainerGroupRequest {
                region_id: "r".into(),
                container_group_id: "eci-1".into(),
                client_token: "t".into(),
            }),
        ),
        (
            "DescribeContainerLog",
            form(&DescribeContainerLogRequest {
                region_id: "r".into(),
                container_group_id: "eci-1".into(),
                container_name: "app".into(),
                start_time: "2026-11-25T00:00:00Z".into(),
                tail: Some(10),
                last_time: true,
                since_seconds: Some(60),
                limit_bytes: Some(1024),
                timestamps: true,
            }),
        ),
        (
            "ExecContainerCommand",
            form(&ExecContainerCommandRequest {
                region_id: "r".into(),
                container_group_id: "eci-1".into(),
                container_name: "app".into(),
                command: vec!["sh".into()],
                tty: true,
                stdin: Some(true),
                sync: true,
            }),
        ),
        (
            "DescribeContainerGroupMetric",
            form(&DescribeContainerGroupMetricRequest {
                region_id: "r".into(),
                container_group_id: "eci-1".into(),
                start_time: "2026-11-25T00:00:00Z".into(),
                end_time: "2026-11-25T00:05:00Z".into(),
                period: Some(15),
            }),
        ),
        (
            "DescribeMultiContainerGroupMetric",
            form(&DescribeMultiContainerGroupMetricRequest {
                region_id: "r".into(),
                container_group_ids: ids,
                metric_type: "all".into(),
                resource_group_id: "rg".into(),
            }),
        ),
    ];
    for (action, params) in cases {
        assert_eq!(undocumented(action, params), BTreeSet::new(), "{action}");
    }
}

/// Every parameter the service defines for the image-cache actions, each filled in.
fn full_image_cache_forms() -> Vec<(&'static str, Params)> {
    let credential = ImageRegistryCredential {
        server: "registry.example.com".into(),
        user_name: "u".into(),
        password: "p".into(),
    };
    let acr = AcrRegistryInfo {
        instance_id: "cri-1".into(),
        instance_name: "acr".into(),
        region_id: "r".into(),
        domain: vec!["acr.example.com".into()],
        arn_service: "arn:s".into(),
        arn_user: "arn:u".into(),
    };
    let images = vec!["nginx:1".to_owned(), "redis:7".to_owned()];
    vec![
        (
            "CreateImageCache",
            form(&CreateImageCacheRequest {
                region_id: "r".into(),
                zone_id: "z".into(),
                security_group_id: "sg".into(),
                v_switch_id: "vsw".into(),
                image_cache_name: "web".into(),
                image: images.clone(),
                image_registry_credential: vec![credential.clone()],
                image_cache_size: Some(40),
                retention_days: Some(7),
                tag: vec![tag()],
                client_token: "t".into(),
                resource_group_id: "rg".into(),
                eip_instance_id: "eip".into(),
                elimination_strategy: "LRU".into(),
                acr_registry_info: vec![acr.clone()],
                auto_match_image_cache: true,
                flash: true,
                flash_copy_count: Some(1),
                standard_copy_count: Some(2),
                plain_http_registry: "plain.example.com".into(),
                insecure_registry: "insecure.example.com".into(),
                annotations: "{}".into(),
            }),
        ),
        (
            "DescribeImageCaches",
            form(&DescribeImageCachesRequest {
                region_id: "r".into(),
                image_cache_id: "imc-1,imc-2".into(),
                image_cache_name: "web".into(),
                snapshot_id: "s-1".into(),
                image: "nginx:1".into(),
                match_image: images.clone(),
                image_match_count_request: Some(3),
                image_full_match: true,
                limit: Some(10),
                next_token: "imc-1".into(),
                tag: vec![tag()],
                resource_group_id: "rg".into(),
            }),
        ),
        (
            "UpdateImageCache",
            form(&UpdateImageCacheRequest {
                region_id: "r".into(),
                image_cache_id: "imc-1".into(),
                image_cache_name: "web".into(),
                image: images,
                image_registry_credential: vec![credential],
                image_cache_size: Some(40),
                retention_days: Some(7),
                tag: vec![tag()],
                client_token: "t".into(),
                resource_group_id: "rg".into(),
                security_group_id: "sg".into(),
                v_switch_id: "vsw".into(),
                eip_instance_id: "eip".into(),
                elimination_strategy: "LRU".into(),
                acr_registry_info: vec![acr],
                auto_match_image_cache: true,
                flash: true,
                flash_copy_count: Some(1),
                standard_copy_count: Some(2),
            }),
        ),
        (
            "DeleteImageCache",
            form(&DeleteImageCacheRequest {
                region_id: "r".into(),
                image_cache_id: "imc-1".into(),
                client_token: "t".into(),
            }),
        ),
    ]
}

#[test]
fn the_image_cache_actions_send_every_documented_parameter_and_no_other() {
    // Account parameters the SDK carries for every action and the daemon never sets.
    let account = [
        "OwnerAccount",
        "OwnerId",
        "ResourceOwnerAccount",
        "ResourceOwnerId",
    ];
    for (action, params) in full_image_cache_forms() {
        let sent: BTreeSet<String> = params
            .into_iter()
            .map(|(key, _)| documented::normalise_parameter(&key))
            .collect();
        let defined: BTreeSet<String> = documented::request_parameters(action)
            .into_iter()
            .map(|(name, _)| name.to_owned())
            .filter(|name| !account.contains(&name.as_str()))
            .collect();
        assert_eq!(
            sent.difference(&defined).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "{action}: parameters the service does not define"
        );
        assert_eq!(
            defined.difference(&sent).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "{action}: parameters the service defines that the client cannot send"
        );
    }
}

#[test]
fn every_field_the_client_reads_of_image_caches_is_documented() {
    let mut unexpected = unfed::<DescribeImageCachesResponse>("DescribeImageCaches");
    unexpected.extend(unfed::<CreateImageCacheResponse>("CreateImageCache"));
    assert_eq!(
        unexpected,
        Vec::<String>::new(),
        "contract members no documented answer field feeds"
    );
}

/// An answer of `action` with every field the service documents filled in (one element per
/// list), as the official SDK's models describe it.
fn full_answer(action: &str) -> Value {
    let mut body = Value::Object(Map::new());
    for (path, kind) in documented::response_fields(action) {
        let leaf = match kind {
            Kind::String | Kind::Json | Kind::JsonArray => json!(format!("{path}")),
            Kind::Int => json!(7),
            Kind::Float => json!(1.5),
            Kind::Bool => json!(true),
            Kind::Object => json!({}),
            Kind::List => json!([]),
        };
        insert(&mut body, path, leaf);
    }
    body
}

/// Puts `leaf` at `path` (`A[].B`), creating objects and one-element lists on the way, without
/// overwriting what is there.
fn insert(root: &mut Value, path: &str, leaf: Value) {
    let mut at = root;
    let segments: Vec<&str> = path.split('.').collect();
    for (index, segment) in segments.iter().enumerate() {
        let last = index + 1 == segments.len();
        let (name, list) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (*segment, false),
        };
        let Some(object) = at.as_object_mut() else {
            return;
        };
        if last && !list {
            object.entry(name.to_owned()).or_insert(leaf);
            return;
        }
        let slot = object
            .entry(name.to_owned())
            .or_insert_with(|| if list { json!([]) } else { json!({}) });
        if list {
            let Some(items) = slot.as_array_mut() else {
                return;
            };
            if items.is_empty() {
                items.push(if last { leaf.clone() } else { json!({}) });
            } else if last && !leaf.is_object() && !leaf.is_array() {
                items[0] = leaf.clone();
            }
            at = &mut items[0];
            if last {
                return;
            }
        } else {
            at = slot;
        }
    }
}

/// The paths of `value` (lists as `[]`) holding a default: nothing fed them.
fn defaults(value: &Value, path: &str, out: &mut Vec<String>) {
    let child = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(members) => {
            for (key, member) in members {
                defaults(member, &child(key), out);
            }
        }
        Value::Array(items) if items.is_empty() => out.push(path.to_owned()),
        Value::Array(items) => defaults(&items[0], &format!("{path}[]"), out),
        Value::Null | Value::Bool(false) => out.push(path.to_owned()),
        Value::String(s) if s.is_empty() => out.push(path.to_owned()),
        Value::Number(n) if n.as_f64() == Some(0.0) => out.push(path.to_owned()),
        _ => {}
    }
}

/// Contract members of `T` left at their default after reading the fullest answer the service
/// documents: members the client would read from a name the service never sends.
fn unfed<T: serde::de::DeserializeOwned + serde::Serialize>(action: &str) -> Vec<String> {
    let parsed: T = response::parse(action, full_answer(action))
        .unwrap_or_else(|e| panic!("{action}: the documented answer does not parse: {e}"));
    let mut out = Vec::new();
    defaults(&serde_json::to_value(parsed).unwrap(), "", &mut out);
    out
}

#[test]
fn every_field_the_client_reads_is_documented() {
    // Members the contract keeps for the gRPC fake and that no answer of the service carries:
    // the client derives or does without them.
    let describe_allowed = [
        // DescribeContainerGroupStatus reports these; DescribeContainerGroups does not
        // (from_eci derives them from the state).
        "container_groups[].containers[].started",
        "container_groups[].containers[].container_id",
        "container_groups[].init_containers[].started",
        "container_groups[].init_containers[].container_id",
        // Not in the answer for init containers.
        "container_groups[].init_containers[].readiness_probe",
        "container_groups[].init_containers[].liveness_probe",
        "container_groups[].init_containers[].stdin",
        "container_groups[].init_containers[].stdin_once",
        "container_groups[].init_containers[].tty",
        "container_groups[].init_containers[].volume_mounts[].sub_path",
        // The request's host path volume has no counterpart in the answer.
        "container_groups[].volumes[].host_path_volume",
        // Create parameters only.
        "container_groups[].volumes[].disk_volume.disk_size",
        "container_groups[].volumes[].config_file_volume.default_mode",
        "container_groups[].volumes[].config_file_volume.config_file_to_path[].mode",
        // Probe members of the request the answer lacks (and a TCP probe has no exec).
        "container_groups[].containers[].readiness_probe.http_get.host",
        "container_groups[].containers[].readiness_probe.http_get.http_header",
        "container_groups[].containers[].liveness_probe.http_get.host",
        "container_groups[].containers[].liveness_probe.http_get.http_header",
    ];
    let describe = unfed::<DescribeContainerGroupsResponse>("DescribeContainerGroups");
    for allowed in describe_allowed {
        assert!(
            describe.iter().any(|path| path == allowed),
            "{allowed} is fed now: take it off the list"
        );
    }
    let mut unexpected: Vec<String> = describe
        .into_iter()
        .filter(|path| !describe_allowed.contains(&path.as_str()))
        .collect();
    unexpected.extend(unfed::<DescribeContainerGroupMetricResponse>(
        "DescribeContainerGroupMetric",
    ));
    unexpected.extend(
        unfed::<DescribeMultiContainerGroupMetricResponse>("DescribeMultiContainerGroupMetric")
            .into_iter()
            .filter(|path| !path.ends_with("filesystem[].category")),
    );
    unexpected.extend(unfed::<DescribeContainerLogResponse>(
        "DescribeContainerLog",
    ));
    unexpected.extend(unfed::<ExecContainerCommandResponse>(
        "ExecContainerCommand",
    ));
    assert_eq!(
        unexpected,
        Vec::<String>::new(),
        "contract members no documented answer field feeds"
    );
}

#[test]
fn a_wrong_name_is_caught() {
    // The test above would catch a client reading `UsageBytes` for a filesystem: shown here
    // by feeding the documented answer to a contract reading other names.
    #[derive(serde::Deserialize, serde::Serialize, Default)]
    #[serde(default)]
    struct Filesystem {
        fs_name: String,
        usage_bytes: i64,
    }
    #[derive(serde::Deserialize, serde::Serialize, Default)]
    #[serde(default)]
    struct Record {
        filesystem: Vec<Filesystem>,
    }
    #[derive(serde::Deserialize, serde::Serialize, Default)]
    #[serde(default)]
    struct Answer {
        records: Vec<Record>,
    }
    let unfed = unfed::<Answer>("DescribeContainerGroupMetric");
    assert_eq!(unfed, ["records[].filesystem[].usage_bytes"]);
    // And a parameter the service does not define is caught on the way out.
    let params = vec![("Force".to_owned(), "true".to_owned())];
    assert_eq!(
        undocumented("DeleteContainerGroup", params),
        BTreeSet::from(["Force".to_owned()])
    );
}
