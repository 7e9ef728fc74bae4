//! End to end on the real control plane: what ECI pods get to reach the cluster — the
//! apiserver's address and the service links a kubelet gives, `ECI_KUBE_PROXY` carried to the
//! group, and projected service-account tokens refreshed in the running group before they
//! expire. Assertions read the apiserver and mock-eci (its admin view of the groups).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::Duration;

use integration::harness::mock_admin::{groups, tag};
use integration::harness::{Harness, HarnessError, run_scenario};
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const KUBE_PROXY_TAG: &str = "k8s.aliyun.com/eci-kube-proxy-enabled";
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
];

/// A pod for kube-scheduler to place on `node` (it tolerates the virtual nodes' taint and
/// selects `node` by hostname).
fn pod_spec(name: &str, node: &str, annotations: &Value, spec: Value) -> Pod {
    let mut spec = spec;
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = json!([{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    serde_json::from_value(
        json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec}),
    )
    .unwrap()
}

async fn create_pod(h: &Harness, ns: &str, pod: &Pod) -> Result<(), HarnessError> {
    Api::<Pod>::namespaced(h.client(), ns)
        .create(&PostParams::default(), pod)
        .await?;
    Ok(())
}

async fn create_service(h: &Harness, ns: &str, service: Value) -> Result<Service, HarnessError> {
    let service: Service = serde_json::from_value(service).unwrap();
    Ok(Api::<Service>::namespaced(h.client(), ns)
        .create(&PostParams::default(), &service)
        .await?)
}

async fn pod(h: &Harness, ns: &str, name: &str) -> Option<Value> {
    Api::<Pod>::namespaced(h.client(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|p| serde_json::to_value(p).unwrap())
}

async fn wait_running(h: &Harness, ns: &str, name: &str) -> Result<Value, HarnessError> {
    h.wait_for(&format!("pod {ns}/{name} Running"), WAIT, |h| async move {
        pod(h, ns, name)
            .await
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await?;
    Ok(pod(h, ns, name).await.unwrap())
}

/// The group of pod `name` (mock-eci's view, as DescribeContainerGroups shows it).
async fn group_of(admin: &str, name: &str) -> Value {
    groups(admin)
        .await
        .unwrap()
        .into_iter()
        .find(|g| tag(g, "k8s.aliyun.com/pod-name") == name)
        .unwrap_or_else(|| panic!("no group for pod {name}"))
}

/// The environment the group's first container got, in order.
fn env_of(group: &Value) -> Vec<(String, String)> {
    group["containers"][0]["environment_vars"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                v["key"].as_str().unwrap_or_default().to_owned(),
                v["value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The decoded files of a group's `ConfigFileVolume`, by path.
fn files_of(group: &Value, volume: &str) -> BTreeMap<String, String> {
    use base64::Engine as _;
    let volume = group["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == volume)
        .unwrap_or_else(|| panic!("the group has no volume {volume}: {group}"));
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

/// The claims of a JSON Web Token (read only; the apiserver's TokenReview judges it).
fn jwt_claims(token: &str) -> Value {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).unwrap_or_default();
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap_or_else(|e| panic!("a JWT's payload: {e}"));
    serde_json::from_slice(&payload).unwrap()
}

/// The kubelet's variables for a Service with these ports (name, port), all TCP, in its order.
fn link_variables(prefix: &str, ip: &str, ports: &[(&str, i32)]) -> Vec<(String, String)> {
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.to_owned()),
        (format!("{prefix}_SERVICE_PORT"), ports[0].1.to_string()),
    ];
    for (name, port) in ports {
        if !name.is_empty() {
            out.push((
                format!("{prefix}_SERVICE_PORT_{}", name.to_uppercase()),
                port.to_string(),
            ));
        }
    }
    out.push((
        format!("{prefix}_PORT"),
        format!("tcp://{ip}:{}", ports[0].1),
    ));
    for (_, port) in ports {
        let at = format!("{prefix}_PORT_{port}_TCP");
        out.push((at.clone(), format!("tcp://{ip}:{port}")));
        out.push((format!("{at}_PROTO"), "tcp".into()));
        out.push((format!("{at}_PORT"), port.to_string()));
        out.push((format!("{at}_ADDR"), ip.to_owned()));
    }
    out
}

fn with_prefix(env: &[(String, String)], prefix: &str) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_see_the_apiserver_and_their_namespaces_services() {
    run_scenario(async |h| {
        let ns = h.create_namespace("access").await?;
        // Before the daemon starts, so its Service cache has them when the pods come.
        let backend = create_service(h, &ns, json!({"metadata": {"name": "backend"}, "spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "metrics", "port": 9090, "protocol": "TCP"}]}})).await?;
        create_service(h, &ns, json!({"metadata": {"name": "headless"}, "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}})).await?;
        create_service(h, &ns, json!({"metadata": {"name": "mail"}, "spec": {"type": "ExternalName", "externalName": "mail.example.com"}})).await?;
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        h.start_daemon(0, FAST_DAEMON)?;
        let node = h.node_name(0);
        let container = json!({"name": "app", "image": "registry.example.com/app:1",
            "env": [{"name": "FIRST", "value": "1"}, {"name": "BACKEND_SERVICE_PORT", "value": "mine"}]});
        create_pod(h, &ns, &pod_spec("linked", &node, &json!({}), json!({"containers": [container.clone()]}))).await?;
        create_pod(h, &ns, &pod_spec("unlinked", &node, &json!({}), json!({"enableServiceLinks": false, "containers": [container]}))).await?;
        wait_running(h, &ns, "linked").await?;
        wait_running(h, &ns, "unlinked").await?;

        // The apiserver's address as the kubelet gives it: the `default/kubernetes` Service.
        let apiserver = Api::<Service>::namespaced(h.client(), "default").get("kubernetes").await?;
        let apiserver_ip = apiserver.spec.as_ref().and_then(|s| s.cluster_ip.clone()).unwrap();
        let apiserver_port = apiserver.spec.as_ref().and_then(|s| s.ports.as_ref()).unwrap()[0].port;
        let expected_apiserver = link_variables("KUBERNETES", &apiserver_ip, &[("https", apiserver_port)]);
        let backend_ip = backend.spec.as_ref().and_then(|s| s.cluster_ip.clone()).unwrap();
        let mut expected_backend = link_variables("BACKEND", &backend_ip, &[("http", 80), ("metrics", 9090)]);
        // The container's own definition wins (and stays where the container put it).
        expected_backend.retain(|(k, _)| k != "BACKEND_SERVICE_PORT");

        let linked = group_of(&mock.admin, "linked").await;
        let env = env_of(&linked);
        assert_eq!(&env[..2], [("FIRST".into(), "1".into()), ("BACKEND_SERVICE_PORT".into(), "mine".into())], "the container's own variables first: {env:?}");
        assert_eq!(with_prefix(&env, "KUBERNETES_"), expected_apiserver, "{env:?}");
        assert_eq!(with_prefix(&env[2..], "BACKEND_"), expected_backend, "{env:?}");
        let first_link = env.iter().position(|(k, _)| k.starts_with("KUBERNETES_")).unwrap();
        assert!(env[first_link..].iter().all(|(k, _)| k.starts_with("KUBERNETES_") || k.starts_with("BACKEND_")), "then the Services', by name: {env:?}");
        assert!(env.iter().all(|(k, _)| !k.starts_with("HEADLESS_") && !k.starts_with("MAIL_")), "no cluster IP, no variables: {env:?}");
        assert_eq!(env.len(), 2 + expected_apiserver.len() + expected_backend.len());

        let unlinked = group_of(&mock.admin, "unlinked").await;
        let env = env_of(&unlinked);
        assert_eq!(with_prefix(&env, "KUBERNETES_"), expected_apiserver, "the apiserver's, always: {env:?}");
        assert_eq!(with_prefix(&env, "BACKEND_"), [("BACKEND_SERVICE_PORT".into(), "mine".into())], "no service links: {env:?}");

        // ECI_KUBE_PROXY's default reaches ECI.
        assert_eq!(tag(&linked, KUBE_PROXY_TAG), "true", "{linked}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_proxy_off_and_a_configured_apiserver_address_reach_eci() {
    run_scenario(async |h| {
        let ns = h.create_namespace("access-off").await?;
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        let mut env = FAST_DAEMON.to_vec();
        env.extend([
            ("ECI_KUBE_PROXY", "false"),
            (
                "ECI_KUBERNETES_SERVICE_HOST",
                "apiserver.vpc.example.internal",
            ),
            ("ECI_KUBERNETES_SERVICE_PORT", "6443"),
        ]);
        h.start_daemon(0, &env)?;
        let node = h.node_name(0);
        let spec = json!({"containers": [{"name": "app", "image": "registry.example.com/app:1"}]});
        create_pod(h, &ns, &pod_spec("plain", &node, &json!({}), spec.clone())).await?;
        create_pod(
            h,
            &ns,
            &pod_spec("wants-proxy", &node, &json!({KUBE_PROXY_TAG: "true"}), spec),
        )
        .await?;
        wait_running(h, &ns, "plain").await?;
        wait_running(h, &ns, "wants-proxy").await?;

        let plain = group_of(&mock.admin, "plain").await;
        assert_eq!(
            tag(&plain, KUBE_PROXY_TAG),
            "false",
            "ECI_KUBE_PROXY=false reaches ECI: {plain}"
        );
        let wants = group_of(&mock.admin, "wants-proxy").await;
        assert_eq!(
            tag(&wants, KUBE_PROXY_TAG),
            "true",
            "the pod's annotation wins: {wants}"
        );
        let env = env_of(&plain);
        assert_eq!(
            with_prefix(&env, "KUBERNETES_"),
            link_variables(
                "KUBERNETES",
                "apiserver.vpc.example.internal",
                &[("https", 6443)]
            ),
            "the configured address, the whole family: {env:?}"
        );
        Ok(())
    })
    .await;
}

/// TokenReview of `token` for `audiences` (none: the apiserver's own): the status.
async fn review(h: &Harness, token: &str, audiences: &[&str]) -> Value {
    let review: TokenReview =
        serde_json::from_value(json!({"spec": {"token": token, "audiences": audiences}})).unwrap();
    let answer = Api::<TokenReview>::all(h.client())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    serde_json::to_value(answer.status).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projected_token_is_refreshed_in_the_running_group_before_it_expires() {
    const AUDIENCE: &str = "vault.example.com";
    run_scenario(async |h| {
        let ns = h.create_namespace("tokens").await?;
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        h.start_daemon(0, FAST_DAEMON)?;
        let node = h.node_name(0);
        create_pod(h, &ns, &pod_spec("vault-client", &node, &json!({}), json!({
            "containers": [{"name": "app", "image": "registry.example.com/app:1",
                "volumeMounts": [{"name": "vault", "mountPath": "/var/run/secrets/vault"}]}],
            "volumes": [{"name": "vault", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "audience": AUDIENCE, "expirationSeconds": 600}}]}}],
        }))).await?;
        let running = wait_running(h, &ns, "vault-client").await?;
        let uid = running["metadata"]["uid"].as_str().unwrap().to_owned();
        let first_group = group_of(&mock.admin, "vault-client").await;
        let first = files_of(&first_group, "vault").remove("token").unwrap();
        let first_claims = jwt_claims(&first);
        let api_volume = running["spec"]["volumes"].as_array().unwrap().iter()
            .find_map(|v| v["name"].as_str().filter(|n| n.starts_with("kube-api-access-"))).unwrap().to_owned();
        let api_token = files_of(&first_group, &api_volume).remove("token").unwrap();

        // Issued as the source asks: its audience, 600 s, bound to the pod.
        assert_eq!(first_claims["aud"], json!([AUDIENCE]), "{first_claims}");
        assert_eq!(first_claims["exp"].as_i64().unwrap() - first_claims["iat"].as_i64().unwrap(), 600);
        assert_eq!(first_claims["kubernetes.io"]["pod"]["uid"], uid.as_str());

        // The refresh is due at 80 % of the lifetime (480 s, up to 10 s early); wait for it,
        // no longer than the token lives.
        let issued_at = first_claims["iat"].as_i64().unwrap();
        let expires_at = first_claims["exp"].as_i64().unwrap();
        let started = std::time::Instant::now();
        h.wait_for("the vault token to be refreshed in the group", Duration::from_secs(590), |_| {
            let (admin, first) = (mock.admin.clone(), first.clone());
            async move { files_of(&group_of(&admin, "vault-client").await, "vault").get("token") != Some(&first) }
        })
        .await?;
        let waited = started.elapsed();
        let group = group_of(&mock.admin, "vault-client").await;
        let refreshed = files_of(&group, "vault").remove("token").unwrap();
        let claims = jwt_claims(&refreshed);
        let refreshed_at = claims["iat"].as_i64().unwrap();
        eprintln!("refreshed {} s after issue (token lifetime 600 s); waited {waited:?}", refreshed_at - issued_at);
        assert!(refreshed_at < expires_at, "before the first token expired: {claims}");
        assert!((465..=490).contains(&(refreshed_at - issued_at)), "at 80 % of the lifetime (470–480 s): {}", refreshed_at - issued_at);
        assert_eq!(claims["aud"], json!([AUDIENCE]), "{claims}");
        assert_eq!(claims["exp"].as_i64().unwrap() - refreshed_at, 600);
        assert_eq!(claims["kubernetes.io"]["pod"]["uid"], uid.as_str(), "still bound to the pod");

        // The refreshed token authenticates, for its audience only.
        let accepted = review(h, &refreshed, &[AUDIENCE]).await;
        assert_eq!(accepted["authenticated"], true, "{accepted}");
        assert_eq!(accepted["user"]["username"], format!("system:serviceaccount:{ns}:default"));
        assert_eq!(accepted["audiences"], json!([AUDIENCE]), "{accepted}");
        let wrong_audience = review(h, &refreshed, &[]).await;
        assert_ne!(wrong_audience["authenticated"], true, "not for the apiserver's own audience: {wrong_audience}");

        // In place: no container restarted, the other token volume untouched (not due).
        assert_eq!(group["containers"][0]["restart_count"], 0, "{group}");
        assert_eq!(files_of(&group, &api_volume).remove("token").unwrap(), api_token);
        assert!(group["events"].as_array().unwrap().iter().any(|e| e["reason"] == "VolumesUpdated"), "{group}");
        let pod = pod(h, &ns, "vault-client").await.unwrap();
        assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);
        assert_eq!(pod["status"]["phase"], "Running");
        Ok(())
    })
    .await;
}

/// The kubelet keeps a running pod's `configMap`, `secret` and `projected` volumes current;
/// here the running group's files follow their ConfigMaps and Secrets, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_and_secret_changes_reach_the_running_groups_files() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Patch, PatchParams};
    run_scenario(async |h| {
        let ns = h.create_namespace("files").await?;
        let config_maps = Api::<ConfigMap>::namespaced(h.client(), &ns);
        let secrets = Api::<Secret>::namespaced(h.client(), &ns);
        let config_map: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": "app-config"}, "data": {"greeting": "hello"}}),
        )
        .unwrap();
        config_maps
            .create(&PostParams::default(), &config_map)
            .await?;
        let secret: Secret = serde_json::from_value(
            json!({"metadata": {"name": "app-secret"}, "stringData": {"password": "one"}}),
        )
        .unwrap();
        secrets.create(&PostParams::default(), &secret).await?;
        let mock = h.start_mock_eci(FAST_MOCK).await?;
        h.start_daemon(0, FAST_DAEMON)?;
        let node = h.node_name(0);
        let spec = json!({
            "containers": [{"name": "app", "image": "registry.example.com/app:1"}],
            "volumes": [
                {"name": "config", "configMap": {"name": "app-config"}},
                {"name": "mixed", "projected": {"sources": [
                    {"secret": {"name": "app-secret"}},
                    {"configMap": {"name": "later", "optional": true}}]}},
                {"name": "podinfo", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]});
        create_pod(h, &ns, &pod_spec("files", &node, &json!({}), spec)).await?;
        wait_running(h, &ns, "files").await?;
        let group = group_of(&mock.admin, "files").await;
        assert_eq!(
            files_of(&group, "config")
                .get("greeting")
                .map(String::as_str),
            Some("hello"),
            "{group}"
        );
        assert_eq!(
            files_of(&group, "mixed")
                .get("password")
                .map(String::as_str),
            Some("one"),
            "{group}"
        );
        assert!(!files_of(&group, "mixed").contains_key("note"), "{group}");

        let wait_file = async |volume: &'static str, path: &'static str, content: &'static str| {
            let admin = mock.admin.clone();
            h.wait_for(
                &format!("{volume}/{path} to read {content:?} in the running group"),
                WAIT,
                move |_| {
                    let admin = admin.clone();
                    async move {
                        files_of(&group_of(&admin, "files").await, volume)
                            .get(path)
                            .map(String::as_str)
                            == Some(content)
                    }
                },
            )
            .await
        };
        let params = PatchParams::default();
        config_maps
            .patch(
                "app-config",
                &params,
                &Patch::Merge(json!({"data": {"greeting": "bonjour"}})),
            )
            .await?;
        wait_file("config", "greeting", "bonjour").await?;
        secrets
            .patch(
                "app-secret",
                &params,
                &Patch::Merge(json!({"stringData": {"password": "two"}})),
            )
            .await?;
        wait_file("mixed", "password", "two").await?;
        // An optional source that did not exist appears once it does.
        let later: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "later"}, "data": {"note": "now"}}))
                .unwrap();
        config_maps.create(&PostParams::default(), &later).await?;
        wait_file("mixed", "note", "now").await?;
        // Labels shown by the downward API follow the pod.
        Api::<Pod>::namespaced(h.client(), &ns)
            .patch(
                "files",
                &params,
                &Patch::Merge(json!({"metadata": {"labels": {"tier": "gold"}}})),
            )
            .await?;
        let admin = mock.admin.clone();
        h.wait_for(
            "the new label in the running group's downward API file",
            WAIT,
            move |_| {
                let admin = admin.clone();
                async move {
                    let files = files_of(&group_of(&admin, "files").await, "podinfo");
                    files
                        .get("labels")
                        .is_some_and(|labels| labels.lines().any(|l| l == "tier=\"gold\""))
                }
            },
        )
        .await?;

        // ECI shows the group `Updating` while it takes an update, then Running again.
        let admin = mock.admin.clone();
        h.wait_for(
            "the group Running again after the updates",
            WAIT,
            move |_| {
                let admin = admin.clone();
                async move { group_of(&admin, "files").await["status"] == "Running" }
            },
        )
        .await?;
        let group = group_of(&mock.admin, "files").await;
        assert_eq!(
            group["containers"][0]["restart_count"], 0,
            "files change in place: {group}"
        );
        let pod = pod(h, &ns, "files").await.unwrap();
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
        Ok(())
    })
    .await;
}
