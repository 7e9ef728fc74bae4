//! The translation table: pod specs in, ECI requests (or rejections) out. Every accepted
//! request is also checked against mock-eci's validation, which mirrors what ECI refuses.

#![allow(clippy::needless_pass_by_value)] // the builders take `json!(..)` literals

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::{Value, json};

use super::*;

struct Fixture {
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    claims: BTreeMap<String, k8s_openapi::api::core::v1::PersistentVolume>,
    dns: Vec<String>,
    tokens: BTreeMap<TokenSource, Token>,
    apiserver: Option<k8s_openapi::api::core::v1::Service>,
    services: Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>>,
    kube_proxy: bool,
}

impl Fixture {
    fn new() -> Self {
        let config_map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "app-config"}, "data": {"mode": "prod", "level": "debug", "bad=key": "x"}})).unwrap();
        let mut secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": "db"}})).unwrap();
        secret.data = Some([("password".to_owned(), ByteString(b"s3cret".to_vec()))].into());
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:pa55");
        let docker =
            json!({"auths": {"https://registry.example.com/": {"auth": auth}}}).to_string();
        let mut pull: Secret = serde_json::from_value(
            json!({"metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson"}),
        )
        .unwrap();
        pull.data = Some(
            [(
                ".dockerconfigjson".to_owned(),
                ByteString(docker.into_bytes()),
            )]
            .into(),
        );
        Self {
            config_maps: [("app-config".to_owned(), config_map)].into(),
            secrets: [("db".to_owned(), secret), ("pull".to_owned(), pull)].into(),
            claims: BTreeMap::new(),
            dns: vec!["10.96.0.10".to_owned()],
            tokens: BTreeMap::new(),
            apiserver: None,
            services: Vec::new(),
            kube_proxy: true,
        }
    }

    fn cx(&self) -> Context<'_> {
        Context {
            region: "cn-hangzhou",
            vswitch: "vsw-default",
            security_group: "sg-default",
            cluster_name: "c1",
            node_name: "virtual-node-eci-0",
            cluster_dns: &self.dns,
            cluster_domain: "cluster.local",
            config_maps: &self.config_maps,
            secrets: &self.secrets,
            claims: &self.claims,
            service_account_tokens: &self.tokens,
            default_spec: (2.0, 4.0),
            apiserver: self.apiserver.as_ref(),
            services: &self.services,
            kube_proxy: self.kube_proxy,
        }
    }
}

fn mk_pod(spec: Value) -> Pod {
    mk_pod_with(json!({}), spec)
}

fn mk_pod_with(metadata: Value, spec: Value) -> Pod {
    let mut meta = json!({"name": "web-0", "namespace": "default", "uid": "8c3c5f5e-0000-4000-8000-000000000001", "labels": {"app": "web"}, "annotations": {"team": "a"}});
    for (k, v) in metadata.as_object().unwrap() {
        meta[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
}

fn one(container: Value) -> Value {
    json!({"containers": [container]})
}

fn translate_ok(pod: &Pod, fixture: &Fixture) -> CreateContainerGroupRequest {
    let request = translate(pod, &fixture.cx()).unwrap_or_else(|e| panic!("rejected: {e}"));
    if let Err(error) = mock_eci::validate::create(&request, "cn-hangzhou", 1_000) {
        panic!("ECI would refuse the request: {error}");
    }
    request
}

fn rejection(pod: &Pod, fixture: &Fixture) -> Rejection {
    translate(pod, &fixture.cx()).expect_err("the pod must be rejected")
}

fn env_of(request: &CreateContainerGroupRequest) -> BTreeMap<String, (String, Option<String>)> {
    request.container[0]
        .environment_var
        .iter()
        .map(|v| {
            (
                v.key.clone(),
                (
                    v.value.clone(),
                    v.field_ref.as_ref().map(|f| f.field_path.clone()),
                ),
            )
        })
        .collect()
}

#[test]
fn a_minimal_pod() {
    let fixture = Fixture::new();
    let request = translate_ok(
        &mk_pod(one(json!({"name": "app", "image": "nginx:1.27"}))),
        &fixture,
    );
    assert_eq!(request.container_group_name, "default-web-0");
    assert_eq!(request.client_token, "8c3c5f5e-0000-4000-8000-000000000001");
    assert_eq!(request.restart_policy, "Always");
    assert_eq!(request.termination_grace_period_seconds, Some(30));
    assert_eq!(
        (
            request.v_switch_id.as_str(),
            request.security_group_id.as_str()
        ),
        ("vsw-default", "sg-default")
    );
    let tags: BTreeMap<_, _> = request
        .tag
        .iter()
        .map(|t| (t.key.as_str(), t.value.as_str()))
        .collect();
    assert_eq!(tags[naming::TAG_CLUSTER], "c1");
    assert_eq!(tags[naming::TAG_NODE], "virtual-node-eci-0");
    assert_eq!(tags[naming::TAG_POD_NAME], "web-0");
    let dns = request.dns_config.unwrap();
    assert_eq!(dns.name_server, vec!["10.96.0.10"]);
    assert_eq!(
        dns.search,
        vec![
            "default.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local"
        ]
    );
    assert_eq!(
        request.container[0].cpu, None,
        "no resources: the group size decides"
    );
}

#[test]
fn resources_take_the_limit_else_the_request() {
    let fixture = Fixture::new();
    let pod = mk_pod(json!({"containers": [
        {"name": "a", "image": "a", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}},
        {"name": "b", "image": "b", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}
    ]}));
    let request = translate(&pod, &fixture.cx()).unwrap();
    assert_eq!(
        (
            request.container[0].cpu,
            request.container[0].memory,
            request.container[0].gpu
        ),
        (Some(1.0), Some(1.0), Some(1))
    );
    assert_eq!(
        (request.container[1].cpu, request.container[1].memory),
        (Some(0.5), Some(0.5))
    );
}

#[test]
fn env_from_prefixes_may_hold_digits_and_symbols() {
    let fixture = Fixture::new();
    let pod = mk_pod_with(
        json!({}),
        json!({"containers": [{"name": "app", "image": "app", "envFrom": [
            {"configMapRef": {"name": "app-config"}},
            {"configMapRef": {"name": "app-config"}, "prefix": "1-"},
            {"configMapRef": {"name": "app-config"}, "prefix": "$_-"},
            {"configMapRef": {"name": "app-config"}, "prefix": "ABC_"},
            {"configMapRef": {"name": "app-config"}, "prefix": "#@!"}]}]}),
    );
    let env = env_of(&translate_ok(&pod, &fixture));
    for name in [
        "mode", "1-mode", "$_-mode", "ABC_mode", "#@!mode", "1-level",
    ] {
        assert!(env.contains_key(name), "{name} in {env:?}");
    }
}

#[test]
fn environment_from_every_source() {
    let fixture = Fixture::new();
    let pod = mk_pod_with(
        json!({}),
        json!({"serviceAccountName": "builder", "containers": [{"name": "app", "image": "app", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}},
        "envFrom": [{"configMapRef": {"name": "app-config"}, "prefix": "CFG_"}],
        "env": [
            {"name": "LITERAL", "value": "x"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
            {"name": "OPTIONAL", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}},
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
            {"name": "CFG_mode", "value": "overridden"}
        ]}]}),
    );
    let request = translate_ok(&pod, &fixture);
    let env = env_of(&request);
    let value = |k: &str| env[k].0.clone();
    assert_eq!(value("LITERAL"), "x");
    assert_eq!(value("POD_NAME"), "web-0");
    assert_eq!(value("POD_NAMESPACE"), "default");
    assert_eq!(value("POD_UID"), "8c3c5f5e-0000-4000-8000-000000000001");
    assert_eq!(value("APP"), "web");
    assert_eq!(value("TEAM"), "a");
    assert_eq!(value("NODE"), "virtual-node-eci-0");
    assert_eq!(value("SA"), "builder");
    assert_eq!(
        env["POD_IP"],
        (String::new(), Some("status.podIP".to_owned())),
        "ECI fills in status.podIP"
    );
    assert_eq!(value("CPUS"), "2", "limits.cpu rounds up to whole cores");
    assert_eq!(value("MEM_MI"), "1024");
    assert_eq!(value("MODE"), "prod");
    assert!(
        !env.contains_key("OPTIONAL"),
        "a missing optional key is skipped"
    );
    assert_eq!(value("DB_PASSWORD"), "s3cret");
    assert_eq!(value("CFG_level"), "debug");
    assert_eq!(value("CFG_mode"), "overridden", "env overrides envFrom");
    assert!(
        !env.keys().any(|k| k.contains("bad")),
        "a name that would split NAME=value is skipped"
    );
    assert_eq!(
        request.container[0]
            .environment_var
            .iter()
            .filter(|v| v.key == "CFG_mode")
            .count(),
        1
    );
}

#[test]
fn missing_references_are_retryable_rejections() {
    let fixture = Fixture::new();
    let pod = mk_pod(one(
        json!({"name": "app", "image": "app", "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]}),
    ));
    let error = rejection(&pod, &fixture);
    assert!(error.retryable);
    assert_eq!(
        error.to_string(),
        "spec.containers[0] (app).env[0]: ConfigMap \"absent\" does not exist (mark the reference optional if that is expected)"
    );
    let pod = mk_pod(one(
        json!({"name": "app", "image": "app", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "nope"}}}]}),
    ));
    assert!(
        rejection(&pod, &fixture)
            .reason
            .contains("key in Secret \"db/nope\"")
    );
    let pod = mk_pod(one(
        json!({"name": "app", "image": "app", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.schedulerName"}}}]}),
    ));
    let error = rejection(&pod, &fixture);
    assert!(!error.retryable && error.reason.contains("not supported"));
}

#[test]
fn volumes_that_ecis_config_files_carry() {
    let mut fixture = Fixture::new();
    fixture.tokens.insert(
        TokenSource {
            audience: String::new(),
            expiration_seconds: 3607,
        },
        Token::new("token-abc".into()),
    );
    fixture.tokens.insert(
        TokenSource {
            audience: "vault".into(),
            expiration_seconds: 600,
        },
        Token::new("token-vault".into()),
    );
    let pod = mk_pod(json!({
        "containers": [{"name": "app", "image": "app", "volumeMounts": [
            {"name": "scratch", "mountPath": "/tmp"}, {"name": "config", "mountPath": "/etc/app", "readOnly": true},
            {"name": "creds", "mountPath": "/etc/creds"}, {"name": "info", "mountPath": "/etc/info"},
            {"name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}, {"name": "share", "mountPath": "/share", "subPath": "web"}
        ]}],
        "volumes": [
            {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "config", "configMap": {"name": "app-config", "items": [{"key": "mode", "path": "mode.txt", "mode": 0o400}], "defaultMode": 0o644}},
            {"name": "creds", "secret": {"secretName": "db"}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            {"name": "api", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "app-config", "items": [{"key": "level", "path": "level"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
            ]}},
            {"name": "vault", "projected": {"sources": [
                {"serviceAccountToken": {"path": "vault-token", "audience": "vault", "expirationSeconds": 600}}
            ]}},
            {"name": "share", "nfs": {"server": "nas.example.com", "path": "/exports", "readOnly": false}}
        ]
    }));
    let request = translate_ok(&pod, &fixture);
    let volume = |name: &str| {
        request
            .volume
            .iter()
            .find(|v| v.name == name)
            .unwrap()
            .clone()
    };
    assert_eq!(volume("scratch").empty_dir_volume.unwrap().medium, "Memory");
    let decode = |content: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(content)
                .unwrap(),
        )
        .unwrap()
    };
    let config = volume("config").config_file_volume.unwrap();
    assert_eq!(
        (
            config.config_file_to_path[0].path.as_str(),
            config.config_file_to_path[0].mode,
            config.default_mode
        ),
        ("mode.txt", Some(0o400), Some(0o644))
    );
    assert_eq!(decode(&config.config_file_to_path[0].content), "prod");
    assert_eq!(
        decode(
            &volume("creds")
                .config_file_volume
                .unwrap()
                .config_file_to_path[0]
                .content
        ),
        "s3cret"
    );
    assert_eq!(
        decode(
            &volume("info")
                .config_file_volume
                .unwrap()
                .config_file_to_path[0]
                .content
        ),
        "app=\"web\""
    );
    let api: Vec<(String, String)> = volume("api")
        .config_file_volume
        .unwrap()
        .config_file_to_path
        .iter()
        .map(|f| (f.path.clone(), decode(&f.content)))
        .collect();
    assert_eq!(
        api,
        vec![
            ("token".into(), "token-abc".into()),
            ("level".into(), "debug".into()),
            ("namespace".into(), "default".into())
        ]
    );
    assert_eq!(
        volume("share").nfs_volume.unwrap().server,
        "nas.example.com"
    );
    assert_eq!(request.container[0].volume_mount[5].sub_path, "web");
    // Each source gets the token issued for its audience and validity.
    let vault = volume("vault")
        .config_file_volume
        .unwrap()
        .config_file_to_path;
    assert_eq!(
        (vault[0].path.as_str(), decode(&vault[0].content).as_str()),
        ("vault-token", "token-vault")
    );
    // A refresh sends just the token volumes, built the same way.
    let refreshed = token_volumes(&pod, &fixture.cx()).unwrap();
    assert_eq!(refreshed, vec![volume("api"), volume("vault")]);
}

#[test]
fn volumes_ecs_cannot_carry_are_rejected_by_name() {
    let fixture = Fixture::new();
    for (volume, kind) in [
        (
            json!({"name": "host", "hostPath": {"path": "/var/log"}}),
            "hostPath",
        ),
        (
            json!({"name": "data", "iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}}),
            "iscsi",
        ),
    ] {
        let pod =
            mk_pod(json!({"containers": [{"name": "app", "image": "app"}], "volumes": [volume]}));
        let error = rejection(&pod, &fixture);
        assert!(
            error
                .reason
                .starts_with(&format!("{kind} volumes cannot run on ECI")),
            "{error}"
        );
        assert!(!error.retryable);
    }
    let pod = mk_pod(
        json!({"containers": [{"name": "app", "image": "app"}], "volumes": [{"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}),
    );
    assert!(
        rejection(&pod, &fixture).retryable,
        "the token may be issued later"
    );
}

#[test]
fn probes_hooks_and_security() {
    let fixture = Fixture::new();
    let pod = mk_pod(one(
        json!({"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": 8080}, "initialDelaySeconds": 3},
        "startupProbe": {"httpGet": {"path": "/started", "port": 8080}, "initialDelaySeconds": 10, "periodSeconds": 5, "failureThreshold": 6},
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}, "runAsUser": 1000, "readOnlyRootFilesystem": true}}),
    ));
    let request = translate_ok(&pod, &fixture);
    let container = &request.container[0];
    let readiness = container.readiness_probe.clone().unwrap();
    assert_eq!(
        (readiness.http_get.unwrap().port, readiness.period_seconds),
        (8080, 5),
        "named port resolved"
    );
    assert_eq!(
        container
            .liveness_probe
            .clone()
            .unwrap()
            .initial_delay_seconds,
        3 + 10 + 5 * 6,
        "the startup window delays liveness"
    );
    assert_eq!(
        container
            .lifecycle_pre_stop_handler
            .clone()
            .unwrap()
            .exec
            .unwrap()
            .command,
        vec!["sleep", "5"]
    );
    let security = container.security_context.clone().unwrap();
    assert_eq!(
        (
            security.capability.unwrap().add,
            security.run_as_user,
            security.read_only_root_filesystem
        ),
        (vec!["NET_ADMIN".to_owned()], Some(1000), true)
    );

    for (container, field) in [
        (
            json!({"name": "app", "image": "app", "securityContext": {"runAsNonRoot": true, "runAsUser": 0}}),
            "securityContext",
        ),
        (
            json!({"name": "app", "image": "app", "livenessProbe": {"grpc": {"port": 9000}}}),
            "livenessProbe",
        ),
        (
            json!({"name": "app", "image": "app", "ports": [{"containerPort": 80, "protocol": "SCTP"}]}),
            "ports",
        ),
        (
            json!({"name": "app", "image": "app", "readinessProbe": {"httpGet": {"port": "metrics"}}}),
            "readinessProbe",
        ),
    ] {
        let error = rejection(&mk_pod(one(container)), &fixture);
        assert!(error.field.ends_with(field), "{error}");
    }
}

#[test]
fn pod_level_settings() {
    let fixture = Fixture::new();
    let pod = mk_pod_with(
        json!({"annotations": {
            "k8s.aliyun.com/eci-spot-strategy": "SpotWithPriceLimit", "k8s.aliyun.com/eci-spot-price-limit": "0.25",
            "k8s.aliyun.com/eci-vswitch": "vsw-a,vsw-b", "k8s.aliyun.com/eci-auto-imc": "true",
            "k8s.aliyun.com/eci-ram-role-name": "reader", "k8s.aliyun.com/eci-use-specs": "2-4Gi,ecs.c6.large"
        }}),
        json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 45, "activeDeadlineSeconds": 600,
            "dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["corp"], "options": [{"name": "ndots", "value": "2"}]},
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db.local"]}], "imagePullSecrets": [{"name": "pull"}, {"name": "absent"}],
            "containers": [{"name": "app", "image": "registry.example.com/app:1", "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}]}),
    );
    let request = translate_ok(&pod, &fixture);
    assert_eq!(request.restart_policy, "Never");
    assert_eq!(
        (
            request.termination_grace_period_seconds,
            request.active_deadline_seconds
        ),
        (Some(45), Some(600))
    );
    let dns = request.dns_config.clone().unwrap();
    assert_eq!(
        (dns.name_server, dns.search, dns.option[0].value.as_str()),
        (vec!["1.1.1.1".to_owned()], vec!["corp".to_owned()], "2")
    );
    assert_eq!(request.host_aliase[0].hostname, vec!["db.local"]);
    assert_eq!(
        request.image_registry_credential.len(),
        1,
        "an absent pull secret is skipped"
    );
    let credential = &request.image_registry_credential[0];
    assert_eq!(
        (
            credential.server.as_str(),
            credential.user_name.as_str(),
            credential.password.as_str()
        ),
        ("registry.example.com", "robot", "pa55")
    );
    assert_eq!(
        (request.spot_strategy.as_str(), request.spot_price_limit),
        ("SpotWithPriceLimit", Some(0.25))
    );
    assert_eq!(request.v_switch_id, "vsw-a,vsw-b");
    assert!(request.auto_match_image_cache);
    assert_eq!(request.ram_role_name, "reader");
    assert_eq!(
        (request.cpu, request.memory),
        (Some(2.0), Some(4.0)),
        "the first vCPU-memory pair sizes the group"
    );

    let too_small = mk_pod_with(
        json!({"annotations": {"k8s.aliyun.com/eci-use-specs": "1-2Gi"}}),
        json!({"containers": [{"name": "app", "image": "app", "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}]}),
    );
    assert!(
        rejection(&too_small, &fixture)
            .reason
            .contains("smaller than the containers need")
    );
    let typed = mk_pod_with(
        json!({"annotations": {"k8s.aliyun.com/eci-use-specs": "ecs.c6.xlarge"}}),
        one(json!({"name": "app", "image": "app"})),
    );
    assert_eq!(
        translate_ok(&typed, &fixture).instance_type,
        "ecs.c6.xlarge"
    );
    let host =
        mk_pod(json!({"hostNetwork": true, "containers": [{"name": "app", "image": "app"}]}));
    assert_eq!(rejection(&host, &fixture).field, "spec.hostNetwork");
}

fn service(
    namespace: &str,
    name: &str,
    ip: &str,
    port: i32,
) -> k8s_openapi::api::core::v1::Service {
    serde_json::from_value(json!({"metadata": {"namespace": namespace, "name": name},
        "spec": {"clusterIP": ip, "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}))
    .unwrap()
}

#[test]
fn containers_get_the_service_variables_after_their_own() {
    let mut fixture = Fixture::new();
    fixture.apiserver = Some(service("default", "kubernetes", "10.96.0.1", 443));
    fixture.services = vec![
        std::sync::Arc::new(service("default", "web", "10.96.0.20", 80)),
        std::sync::Arc::new(service("other", "elsewhere", "10.96.0.30", 80)),
    ];
    let spec = |links: Option<bool>| {
        let mut spec = json!({
            "initContainers": [{"name": "init", "image": "init"}],
            "containers": [{"name": "app", "image": "app", "env": [
                {"name": "FIRST", "value": "1"}, {"name": "WEB_SERVICE_PORT", "value": "mine"}]}],
        });
        if let Some(links) = links {
            spec["enableServiceLinks"] = json!(links);
        }
        mk_pod(spec)
    };
    let request = translate_ok(&spec(None), &fixture);
    let keys: Vec<&str> = request.container[0]
        .environment_var
        .iter()
        .map(|v| v.key.as_str())
        .collect();
    // The container's own first, then the kubelet's, `kubernetes` before `web`.
    assert_eq!(
        &keys[..4],
        [
            "FIRST",
            "WEB_SERVICE_PORT",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT"
        ]
    );
    let env = env_of(&request);
    assert_eq!(
        env["WEB_SERVICE_PORT"].0, "mine",
        "the container's own definition wins"
    );
    assert_eq!(env["WEB_SERVICE_HOST"].0, "10.96.0.20");
    assert_eq!(env["KUBERNETES_PORT_443_TCP_ADDR"].0, "10.96.0.1");
    assert!(
        !env.contains_key("ELSEWHERE_SERVICE_HOST"),
        "only the pod's namespace"
    );
    assert_eq!(keys.iter().filter(|k| **k == "WEB_SERVICE_PORT").count(), 1);
    let init: Vec<&str> = request.init_container[0]
        .environment_var
        .iter()
        .map(|v| v.key.as_str())
        .collect();
    assert!(init.contains(&"KUBERNETES_SERVICE_HOST") && init.contains(&"WEB_SERVICE_HOST"));

    let unlinked = env_of(&translate_ok(&spec(Some(false)), &fixture));
    assert_eq!(unlinked["KUBERNETES_SERVICE_HOST"].0, "10.96.0.1");
    assert!(!unlinked.contains_key("WEB_SERVICE_HOST"));
    assert_eq!(unlinked["WEB_SERVICE_PORT"].0, "mine");

    fixture.apiserver = None;
    let none = env_of(&translate_ok(&spec(Some(false)), &fixture));
    assert!(
        none.keys().all(|k| !k.starts_with("KUBERNETES_")),
        "{none:?}"
    );
}

#[test]
fn kube_proxy_travels_as_a_tag() {
    let tag = |request: &CreateContainerGroupRequest| {
        request
            .tag
            .iter()
            .find(|t| t.key == ANNOTATION_KUBE_PROXY)
            .map(|t| t.value.clone())
    };
    let mut fixture = Fixture::new();
    let plain = mk_pod(one(json!({"name": "app", "image": "app"})));
    let with = |value: &str| {
        mk_pod_with(
            json!({"annotations": {ANNOTATION_KUBE_PROXY: value}}),
            one(json!({"name": "app", "image": "app"})),
        )
    };
    assert_eq!(
        tag(&translate_ok(&plain, &fixture)).as_deref(),
        Some("true")
    );
    assert_eq!(
        tag(&translate_ok(&with("false"), &fixture)).as_deref(),
        Some("false")
    );
    fixture.kube_proxy = false;
    assert_eq!(
        tag(&translate_ok(&plain, &fixture)).as_deref(),
        Some("false")
    );
    assert_eq!(
        tag(&translate_ok(&with("true"), &fixture)).as_deref(),
        Some("true")
    );
    let error = rejection(&with("yes"), &fixture);
    assert!(
        !error.retryable && error.field.contains(ANNOTATION_KUBE_PROXY),
        "{error}"
    );
}

#[test]
fn dollar_references_are_expanded_as_the_kubelet_does() {
    let mut fixture = Fixture::new();
    fixture.apiserver = Some(service("default", "kubernetes", "10.96.0.1", 443));
    let pod = mk_pod(one(json!({
        "name": "app", "image": "app",
        "command": ["/bin/server", "--api=https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"],
        "args": ["--greeting=$(GREETING)", "--literal=$$(GREETING)", "--unknown=$(NOPE)", "--ip=$(MY_IP)"],
        "env": [
            {"name": "NAME", "value": "world"},
            {"name": "GREETING", "value": "hello $(NAME)"},
            // Defined later: not visible to GREETING, as in Kubernetes.
            {"name": "EARLY", "value": "$(LATER)"},
            {"name": "LATER", "value": "late"},
            {"name": "API", "value": "$(KUBERNETES_SERVICE_HOST)"},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "IP_URL", "value": "http://$(MY_IP)/"},
        ],
    })));
    let request = translate_ok(&pod, &fixture);
    let env = env_of(&request);
    assert_eq!(env["GREETING"].0, "hello world");
    assert_eq!(env["EARLY"].0, "$(LATER)");
    assert_eq!(env["API"].0, "10.96.0.1");
    // Only ECI knows the pod IP when the group starts: the reference stays as written.
    assert_eq!(env["IP_URL"].0, "http://$(MY_IP)/");
    let container = &request.container[0];
    assert_eq!(
        container.command,
        ["/bin/server", "--api=https://10.96.0.1:443"]
    );
    assert_eq!(
        container.arg,
        [
            "--greeting=hello world",
            "--literal=$(GREETING)",
            "--unknown=$(NOPE)",
            "--ip=$(MY_IP)"
        ]
    );
}

#[test]
fn hostname_is_the_kubelets() {
    let fixture = Fixture::new();
    let app = json!([{"name": "app", "image": "app"}]);
    let cases = [
        (json!({"containers": app}), "web-0"),
        (
            json!({"containers": app, "hostname": "db-1", "subdomain": "db"}),
            "db-1",
        ),
        (
            json!({"containers": app, "hostname": "db-1", "subdomain": "db", "setHostnameAsFQDN": true}),
            "db-1.db.default.svc.cluster.local",
        ),
    ];
    for (spec, expected) in cases {
        assert_eq!(translate_ok(&mk_pod(spec), &fixture).host_name, expected);
    }
    // A pod name longer than a hostname may be is cut as the kubelet cuts it.
    let long = format!("{}-x", "a".repeat(62));
    let pod = mk_pod_with(json!({"name": long}), json!({"containers": app}));
    assert_eq!(
        translate(&pod, &fixture.cx()).unwrap().host_name,
        "a".repeat(62)
    );
}

#[test]
fn dns_policy_says_whose_resolver() {
    let mut fixture = Fixture::new();
    let app = json!([{"name": "app", "image": "app"}]);
    let policy = |spec: Value, fixture: &Fixture| translate_ok(&mk_pod(spec), fixture).dns_policy;
    assert_eq!(
        policy(json!({"containers": app}), &fixture),
        "None",
        "cluster DNS given"
    );
    assert_eq!(
        policy(json!({"containers": app, "dnsPolicy": "Default"}), &fixture),
        "Default"
    );
    assert_eq!(
        policy(
            json!({"containers": app, "dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"]}}),
            &fixture
        ),
        "None"
    );
    fixture.dns.clear();
    assert_eq!(
        policy(json!({"containers": app}), &fixture),
        "Default",
        "no cluster DNS known"
    );
    // As the kubelet: ClusterFirst without a cluster DNS falls back to Default, and the pod's
    // dnsConfig is merged into the VPC's resolvers, not left alone without a nameserver.
    assert_eq!(
        policy(
            json!({"containers": app, "dnsConfig": {"searches": ["corp.example"]}}),
            &fixture
        ),
        "Default",
        "no cluster DNS known, a dnsConfig"
    );
    assert_eq!(
        policy(
            json!({"containers": app, "dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"]}}),
            &fixture
        ),
        "None",
        "the pod's own resolvers only"
    );
}

#[test]
fn security_settings_reach_the_group() {
    let fixture = Fixture::new();
    let pod = mk_pod(json!({
        "shareProcessNamespace": true,
        "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "runAsNonRoot": true,
            "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "net/ipv4/ip_local_port_range", "value": "1024 65000"}]},
        "initContainers": [{"name": "init", "image": "busybox"}],
        "containers": [
            {"name": "app", "image": "app", "securityContext": {"runAsGroup": 4000}},
            {"name": "priv", "image": "app", "securityContext": {"privileged": true, "runAsUser": 0, "runAsNonRoot": false}}
        ]
    }));
    let request = translate_ok(&pod, &fixture);
    assert!(request.share_process_namespace);
    let sysctls: Vec<(&str, &str)> = request
        .security_context
        .as_ref()
        .unwrap()
        .sysctl
        .iter()
        .map(|s| (s.name.as_str(), s.value.as_str()))
        .collect();
    assert_eq!(
        sysctls,
        [
            ("net.ipv4.tcp_syncookies", "1"),
            ("net.ipv4.ip_local_port_range", "1024 65000")
        ]
    );
    let app = &request.container[0];
    assert_eq!(
        (
            app.security_context.as_ref().and_then(|s| s.run_as_user),
            app.security_context_run_as_group,
            app.security_context_run_as_non_root,
            app.security_context_privileged,
        ),
        (Some(1000), Some(4000), Some(true), None),
        "the container's setting over the pod's"
    );
    let privileged = &request.container[1];
    assert_eq!(
        (
            privileged.security_context_privileged,
            privileged.security_context_run_as_non_root,
            privileged
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user),
        ),
        (Some(true), None, Some(0))
    );
    let init = &request.init_container[0];
    assert_eq!(
        (
            init.security_context_run_as_group,
            init.security_context_run_as_non_root
        ),
        (None, None),
        "InitContainer.N has no such parameters"
    );
    let limits = limits(&pod);
    assert!(
        limits
            .iter()
            .any(|l| l.contains("initContainers[0] (init): runAsGroup")),
        "{limits:?}"
    );

    let unsafe_sysctl = mk_pod(
        json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
        "containers": [{"name": "app", "image": "app"}]}),
    );
    let error = rejection(&unsafe_sysctl, &fixture);
    assert!(
        error.field.starts_with("spec.securityContext.sysctls[0]"),
        "{error}"
    );
    assert!(error.reason.contains("SysctlForbidden"), "{error}");
    let privileged_init = mk_pod(
        json!({"initContainers": [{"name": "init", "image": "b", "securityContext": {"privileged": true}}],
        "containers": [{"name": "app", "image": "app"}]}),
    );
    assert!(
        rejection(&privileged_init, &fixture)
            .field
            .ends_with("securityContext.privileged")
    );
}

#[test]
fn probes_ecis_cannot_express_are_named() {
    let fixture = Fixture::new();
    let pod = mk_pod(one(
        json!({"name": "app", "image": "app", "ports": [{"containerPort": 80}],
        "livenessProbe": {"httpGet": {"port": 80, "host": "10.0.0.9", "httpHeaders": [{"name": "X-Probe", "value": "1"}]}},
        "readinessProbe": {"tcpSocket": {"port": 80, "host": "localhost"}}}),
    ));
    let request = translate_ok(&pod, &fixture);
    assert!(
        request.container[0].liveness_probe.is_some(),
        "the probe still runs"
    );
    let limits = limits(&pod);
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert!(
        limits[0].contains("livenessProbe.httpGet.httpHeaders (X-Probe)"),
        "{limits:?}"
    );
    assert!(
        limits[1].contains("livenessProbe.httpGet.host (10.0.0.9)"),
        "{limits:?}"
    );
    let plain = mk_pod(one(
        json!({"name": "app", "image": "app", "readinessProbe": {"httpGet": {"port": 80}}}),
    ));
    assert!(super::limits(&plain).is_empty());
}

#[test]
fn native_sidecars_become_containers_ordered_by_ecis_priorities() {
    let fixture = Fixture::new();
    let pod = mk_pod(json!({
        "initContainers": [
            {"name": "setup", "image": "busybox:1.36", "command": ["true"]},
            {"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always",
                "readinessProbe": {"tcpSocket": {"port": 15021}}},
            {"name": "logs", "image": "fluent-bit:3", "restartPolicy": "Always",
                "env": [{"name": "ECI_CONTAINER_EXIT_PRIORITY", "value": "-500"}]}],
        "containers": [{"name": "app", "image": "nginx:1.27"}]
    }));
    let request = translate_ok(&pod, &fixture);
    let names = |list: &[eci_proto::v20180808::Container]| -> Vec<String> {
        list.iter().map(|c| c.name.clone()).collect()
    };
    assert_eq!(names(&request.init_container), ["setup"]);
    assert_eq!(names(&request.container), ["proxy", "logs", "app"]);
    let env = |name: &str| -> BTreeMap<String, String> {
        request
            .container
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .environment_var
            .iter()
            .filter(|v| v.key.starts_with("ECI_CONTAINER_"))
            .map(|v| (v.key.clone(), v.value.clone()))
            .collect()
    };
    let expected = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // The proxy starts first and stops last; the log shipper keeps the exit priority it set.
    assert_eq!(
        env("proxy"),
        expected(&[
            ("ECI_CONTAINER_LAUNCH_PRIORITY", "2"),
            ("ECI_CONTAINER_EXIT_PRIORITY", "-2"),
            ("ECI_CONTAINER_TYPE", "sidecar"),
            ("ECI_CONTAINER_IGNORE_EXIT_CODE", "true"),
        ])
    );
    assert_eq!(
        env("logs"),
        expected(&[
            ("ECI_CONTAINER_LAUNCH_PRIORITY", "1"),
            ("ECI_CONTAINER_EXIT_PRIORITY", "-500"),
            ("ECI_CONTAINER_TYPE", "sidecar"),
            ("ECI_CONTAINER_IGNORE_EXIT_CODE", "true"),
        ])
    );
    assert!(env("app").is_empty(), "the app keeps ECI's defaults");
    // The proxy's readiness probe travels: ECI holds the app until it is Ready.
    let proxy = request
        .container
        .iter()
        .find(|c| c.name == "proxy")
        .unwrap();
    let probe = proxy
        .readiness_probe
        .clone()
        .expect("the readiness probe travels");
    assert_eq!(probe.tcp_socket.map(|t| t.port), Some(15021));

    // A regular init container after a sidecar cannot be ordered on ECI.
    let late = mk_pod(json!({
        "initContainers": [
            {"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always"},
            {"name": "migrate", "image": "busybox:1.36"}],
        "containers": [{"name": "app", "image": "nginx:1.27"}]
    }));
    let refused = rejection(&late, &fixture);
    assert_eq!(refused.field, "spec.initContainers[1] (migrate)");
    assert!(!refused.retryable);
}

#[test]
fn security_settings_ecis_api_cannot_carry_are_named_not_silently_dropped() {
    let fixture = Fixture::new();
    let pod = mk_pod(json!({
        "securityContext": {"fsGroup": 2000, "supplementalGroups": [3000], "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "app", "image": "app", "securityContext": {
            "runAsUser": 1000, "allowPrivilegeEscalation": false,
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}]
    }));
    // The pod runs: what ECI can carry travels.
    let request = translate_ok(&pod, &fixture);
    let security = request.container[0].security_context.clone().unwrap();
    assert_eq!(security.run_as_user, Some(1000));
    let limits = limits(&pod);
    let named = |needle: &str| limits.iter().any(|l| l.contains(needle));
    for needle in [
        "spec.securityContext.fsGroup: ECI has no such parameter; volume files keep ECI's ownership",
        "spec.securityContext.supplementalGroups",
        "spec.securityContext.seccompProfile",
        "spec.containers[0] (app).securityContext.capabilities.drop (ALL)",
        "spec.containers[0] (app).securityContext.allowPrivilegeEscalation",
    ] {
        assert!(named(needle), "{needle} in {limits:?}");
    }
    assert_eq!(limits.len(), 5, "{limits:?}");
    // Settings ECI carries raise nothing.
    let carried = mk_pod(one(
        json!({"name": "app", "image": "app", "securityContext": {
        "runAsUser": 1000, "runAsNonRoot": true, "readOnlyRootFilesystem": true, "capabilities": {"add": ["NET_ADMIN"]}}}),
    ));
    assert!(super::limits(&carried).is_empty());
}

/// A PersistentVolume named `name` with `spec` (capacity, csi or nfs …).
fn persistent_volume(name: &str, spec: Value) -> k8s_openapi::api::core::v1::PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// A pod mounting the claim `data` at `/data` (sub-path `app`), `read_only` at the volume.
fn pod_with_claim(read_only: bool) -> Pod {
    mk_pod(json!({
        "containers": [{"name": "app", "image": "app", "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "app"}]}],
        "initContainers": [{"name": "init", "image": "init", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0", "readOnly": read_only}}]
    }))
}

#[test]
fn persistent_volume_claims_become_the_eci_volume_of_their_driver() {
    use eci_proto::v20180808::{DiskVolume, FlexVolume, NfsVolume};
    let disk = |spec: Value| persistent_volume("pv-disk", spec);
    // (what, the bound PersistentVolume, the volume's readOnly, the ECI volume expected,
    // mounts read-only)
    let cases: Vec<(&str, _, bool, Volume, bool)> = vec![
        (
            "a disk with its capacity and file system",
            disk(json!({"capacity": {"storage": "20Gi"}, "csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": "d-bp1abc", "fsType": "xfs"}})),
            false,
            Volume {
                name: "data".into(),
                r#type: "DiskVolume".into(),
                disk_volume: Some(DiskVolume { disk_id: "d-bp1abc".into(), fs_type: "xfs".into(), disk_size: 20 }),
                ..Volume::default()
            },
            false,
        ),
        (
            "a disk without fsType gets ext4; a size in other units is rounded up to whole GiB",
            disk(json!({"capacity": {"storage": "1500Mi"}, "csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": "d-bp1abc"}})),
            false,
            Volume {
                name: "data".into(),
                r#type: "DiskVolume".into(),
                disk_volume: Some(DiskVolume { disk_id: "d-bp1abc".into(), fs_type: "ext4".into(), disk_size: 2 }),
                ..Volume::default()
            },
            false,
        ),
        (
            "a disk mounted read-only by the pod's volume",
            disk(json!({"csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": "d-bp1abc"}})),
            true,
            Volume {
                name: "data".into(),
                r#type: "DiskVolume".into(),
                disk_volume: Some(DiskVolume { disk_id: "d-bp1abc".into(), fs_type: "ext4".into(), disk_size: 0 }),
                ..Volume::default()
            },
            true,
        ),
        (
            "NAS: server and path from volumeAttributes, read-only from the PersistentVolume",
            persistent_volume("pv-nas", json!({"csi": {"driver": "nasplugin.csi.alibabacloud.com", "volumeHandle": "pv-nas", "readOnly": true,
                "volumeAttributes": {"server": "0cd8b4a576-g.cn-hangzhou.nas.aliyuncs.com", "path": "/share"}}})),
            false,
            Volume {
                name: "data".into(),
                r#type: "NFSVolume".into(),
                nfs_volume: Some(NfsVolume { server: "0cd8b4a576-g.cn-hangzhou.nas.aliyuncs.com".into(), path: "/share".into(), read_only: true }),
                ..Volume::default()
            },
            false,
        ),
        (
            "NAS without a path mounts the export's root",
            persistent_volume("pv-nas", json!({"csi": {"driver": "nasplugin.csi.alibabacloud.com", "volumeHandle": "pv-nas",
                "volumeAttributes": {"server": "nas.example.com"}}})),
            false,
            Volume {
                name: "data".into(),
                r#type: "NFSVolume".into(),
                nfs_volume: Some(NfsVolume { server: "nas.example.com".into(), path: "/".into(), read_only: false }),
                ..Volume::default()
            },
            false,
        ),
        (
            "an nfs PersistentVolume",
            persistent_volume("pv-nfs", json!({"nfs": {"server": "10.0.0.5", "path": "/exports"}})),
            true,
            Volume {
                name: "data".into(),
                r#type: "NFSVolume".into(),
                nfs_volume: Some(NfsVolume { server: "10.0.0.5".into(), path: "/exports".into(), read_only: true }),
                ..Volume::default()
            },
            true,
        ),
        (
            "OSS: the OSS FlexVolume with the volumeAttributes as its options",
            persistent_volume("pv-oss", json!({"csi": {"driver": "ossplugin.csi.alibabacloud.com", "volumeHandle": "pv-oss",
                "volumeAttributes": {"bucket": "logs", "url": "oss-cn-hangzhou-internal.aliyuncs.com", "path": "/app", "otherOpts": "-o max_stat_cache_size=0 -o allow_other"}}})),
            false,
            Volume {
                name: "data".into(),
                r#type: "FlexVolume".into(),
                flex_volume: Some(FlexVolume {
                    driver: "alicloud/oss".into(),
                    fs_type: String::new(),
                    options: json!({"bucket": "logs", "otherOpts": "-o max_stat_cache_size=0 -o allow_other", "path": "/app", "url": "oss-cn-hangzhou-internal.aliyuncs.com"}).to_string(),
                }),
                ..Volume::default()
            },
            false,
        ),
    ];
    for (what, pv, read_only, expected, mounts_read_only) in cases {
        let mut fixture = Fixture::new();
        fixture.claims.insert("data-web-0".into(), pv);
        let request = translate_ok(&pod_with_claim(read_only), &fixture);
        assert_eq!(request.volume, vec![expected], "{what}");
        let app = &request.container[0].volume_mount[0];
        assert_eq!(
            (app.name.as_str(), app.sub_path.as_str()),
            ("data", "app"),
            "{what}: subPath kept"
        );
        let mounts: Vec<bool> = request
            .container
            .iter()
            .chain(&request.init_container)
            .flat_map(|c| c.volume_mount.iter().map(|m| m.read_only))
            .collect();
        assert_eq!(mounts, [mounts_read_only; 2], "{what}: read-only mounts");
    }
}

#[test]
fn persistent_volumes_ecs_cannot_mount_are_rejected_with_their_driver() {
    // (the bound PersistentVolume, said in the rejection, retryable)
    let cases = [
        (
            Some(persistent_volume(
                "pv-ebs",
                json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}),
            )),
            "\"ebs.csi.aws.com\"",
            false,
        ),
        (
            Some(persistent_volume(
                "pv-local",
                json!({"hostPath": {"path": "/mnt/data"}}),
            )),
            "neither a CSI nor an nfs volume",
            false,
        ),
        (
            Some(persistent_volume(
                "pv-disk",
                json!({"csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": ""}}),
            )),
            "no csi.volumeHandle",
            false,
        ),
        (
            Some(persistent_volume(
                "pv-nas",
                json!({"csi": {"driver": "nasplugin.csi.alibabacloud.com", "volumeHandle": "x", "volumeAttributes": {"path": "/"}}}),
            )),
            "no volumeAttributes.server",
            false,
        ),
        (
            Some(persistent_volume(
                "pv-oss",
                json!({"csi": {"driver": "ossplugin.csi.alibabacloud.com", "volumeHandle": "x",
                "volumeAttributes": {"bucket": "b", "url": "u"}, "nodePublishSecretRef": {"name": "oss-secret", "namespace": "default"}}}),
            )),
            "nodePublishSecretRef",
            false,
        ),
        (
            Some(persistent_volume(
                "pv-oss",
                json!({"csi": {"driver": "ossplugin.csi.alibabacloud.com", "volumeHandle": "x", "volumeAttributes": {"url": "u"}}}),
            )),
            "no volumeAttributes.bucket",
            false,
        ),
        (
            Some(persistent_volume(
                "pv-block",
                json!({"volumeMode": "Block", "csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": "d-1"}}),
            )),
            "volumeMode Block",
            false,
        ),
        // Not bound (the caller passes only verified bindings): it may be bound later.
        (None, "not bound to a PersistentVolume yet", true),
    ];
    for (pv, said, retryable) in cases {
        let mut fixture = Fixture::new();
        if let Some(pv) = pv {
            fixture.claims.insert("data-web-0".into(), pv);
        }
        let rejection = rejection(&pod_with_claim(false), &fixture);
        assert_eq!(rejection.field, "spec.volumes[0] (data)");
        assert!(
            rejection.reason.contains(said),
            "{said} in {}",
            rejection.reason
        );
        assert_eq!(rejection.retryable, retryable, "{rejection}");
    }
}

#[test]
fn a_sub_path_expression_expands_as_the_kubelet_expands_it_or_waits_as_a_config_error() {
    let fixture = Fixture::new();
    let pod = |pod_name: &str, annotations: Value, expression: &str| {
        mk_pod_with(
            json!({"annotations": annotations}),
            json!({"containers": [{"name": "app", "image": "app",
                "env": [
                    {"name": "POD_NAME", "value": pod_name},
                    {"name": "ANNOTATION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['mysubpath']"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "volumeMounts": [{"name": "work", "mountPath": "/sub", "subPathExpr": expression}]}],
                "volumes": [{"name": "work", "emptyDir": {}}]}),
        )
    };
    /// The sub-path, or the rejection's words and whether it is the container's config error.
    type Expected = Result<&'static str, (&'static str, bool)>;
    let with_path = json!({"mysubpath": "mypath"});
    // (POD_NAME, annotations, expression, expected)
    let cases: [(&str, Value, &str, Expected); 7] = [
        ("foo", json!({}), "$(POD_NAME)", Ok("foo")),
        (
            "foo",
            with_path,
            "$(ANNOTATION)/$(POD_NAME)",
            Ok("mypath/foo"),
        ),
        (
            "foo",
            json!({}),
            "$(ANNOTATION)/$(POD_NAME)",
            Err(("missing value for ANNOTATION", true)),
        ),
        (
            "foo",
            json!({}),
            "$(NOT_DEFINED)",
            Err(("missing value for NOT_DEFINED", true)),
        ),
        (
            "..",
            json!({}),
            "$(POD_NAME)",
            Err(("must not contain '..'", true)),
        ),
        (
            "/tmp",
            json!({}),
            "$(POD_NAME)",
            Err(("must not be an absolute path", true)),
        ),
        (
            "foo",
            json!({}),
            "$(IP)",
            Err(("sets only once the group exists", false)),
        ),
    ];
    for (pod_name, annotations, expression, expected) in cases {
        let pod = pod(pod_name, annotations, expression);
        match expected {
            Ok(sub_path) => {
                let request = translate_ok(&pod, &fixture);
                assert_eq!(
                    request.container[0].volume_mount[0].sub_path, sub_path,
                    "{expression}"
                );
            }
            Err((words, config_error)) => {
                let rejection = rejection(&pod, &fixture);
                assert!(
                    rejection.reason.contains(words),
                    "{expression}: {rejection}"
                );
                assert_eq!(rejection.retryable, config_error, "{expression}");
                assert_eq!(
                    rejection.config_error_in.as_deref(),
                    config_error.then_some("app"),
                    "{expression}"
                );
                assert_eq!(rejection.field, "spec.containers[0] (app).volumeMounts[0]");
            }
        }
    }
}
