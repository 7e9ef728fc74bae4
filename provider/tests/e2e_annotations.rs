//! End to end on the real control plane with mock-eci's OpenAPI front (which decodes the
//! signed flat parameters on its own and refuses names the service does not define): every
//! mapped annotation of the table (`vne_core::to_eci::annotations::TABLE`), one pod each with its
//! example value, reaches mock-eci as the parameters the table names — what mock-eci recorded
//! (`/admin/groups/{id}/request`) holds what the annotation adds to the request. The pod gets
//! the creation's answer (`eci-instance-id`, `eci-request-id`) and the group's description
//! (`eci-instance-spec`, `eni-instance-id`, `eci-vpc`, `allocated-eipAddress` for the EIP
//! annotations' pods) written back in its one annotation write, each value the one mock-eci
//! reports for the group (`/admin/groups`). A malformed value fails the pod (condition `ContainerInstanceCreated`
//! False, reason `InvalidAnnotation`, Warning Event, no group); an annotation the daemon does
//! not drive is named in a Warning Event and the group is still created.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::Duration;

use integration::harness::mock_admin::{created_with, groups};
use integration::harness::{EciApi, Harness, HarnessError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use vne_core::to_eci::annotations::{
    EIP_ADDRESS, ENI_INSTANCE_ID, Handling, INSTANCE_ID, INSTANCE_SPEC, REQUEST_ID, TABLE, VPC,
};
use vne_core::to_eci::{self, Context};

const WAIT: Duration = Duration::from_secs(120);

/// What an annotation needs beside it to mean anything (as in `tests/annotations.rs`).
fn companions(key: &str) -> BTreeMap<&'static str, &'static str> {
    match key {
        "k8s.aliyun.com/acr-service-arns" | "k8s.aliyun.com/acr-user-arns" => {
            BTreeMap::from([("k8s.aliyun.com/acr-instance-ids", "cri-1")])
        }
        "k8s.aliyun.com/eci-spot-price-limit" | "k8s.aliyun.com/eci-spot-duration" => {
            BTreeMap::from([("k8s.aliyun.com/eci-spot-strategy", "SpotAsPriceGo")])
        }
        "k8s.aliyun.com/eci-spot-strategy" => {
            BTreeMap::from([("k8s.aliyun.com/eci-spot-price-limit", "0.5")])
        }
        _ => BTreeMap::new(),
    }
}

fn pod(name: &str, node: &str, annotations: &BTreeMap<&str, &str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "containers": [{"name": "app", "image": "registry.example.com/app:1",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}],
        },
    }))
    .unwrap()
}

/// The request the daemon's translation makes of `pod`, locally (only the difference two
/// such requests make is compared with what mock-eci recorded).
fn translated(pod: &Pod) -> Value {
    let mut pod = pod.clone();
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.uid = Some("u-1".into());
    let dns = vec!["10.96.0.10".to_owned()];
    let (cms, secrets, tokens) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let cx = Context {
        region: "cn-hangzhou",
        vswitch: "vsw-default",
        security_group: "sg-default",
        cluster_name: "c1",
        node_name: "n",
        cluster_dns: &dns,
        cluster_domain: "cluster.local",
        config_maps: &cms,
        secrets: &secrets,
        claims: &BTreeMap::new(),
        service_account_tokens: &tokens,
        default_spec: (2.0, 4.0),
        apiserver: None,
        services: &[],
        kube_proxy: true,
    };
    serde_json::to_value(to_eci::translate(&pod, &cx).unwrap()).unwrap()
}

/// Checks that `received` holds what `with` adds to `without`: changed scalars equal, added
/// list elements present, objects member by member.
fn holds(with: &Value, without: &Value, received: &Value, at: &str) -> Result<(), String> {
    match (with, without) {
        (Value::Object(w), _) => {
            for (key, value) in w {
                let before = without.get(key).unwrap_or(&Value::Null);
                if value != before {
                    let got = received.get(key).unwrap_or(&Value::Null);
                    holds(value, before, got, &format!("{at}.{key}"))?;
                }
            }
            Ok(())
        }
        (Value::Array(w), _) => {
            let before = without.as_array().cloned().unwrap_or_default();
            let got = received.as_array().cloned().unwrap_or_default();
            match w.iter().find(|e| !before.contains(e) && !got.contains(e)) {
                Some(missing) => Err(format!("{at}: {missing} not in {received}")),
                None => Ok(()),
            }
        }
        _ if with == received => Ok(()),
        _ => Err(format!("{at}: sent {with}, mock-eci recorded {received}")),
    }
}

async fn group_count(admin: &str) -> usize {
    groups(admin).await.unwrap().len()
}

/// What the pod should show of its group `id`, from what mock-eci reports of it (a field
/// mock-eci leaves empty is not written).
async fn reported_by_mock(admin: &str, id: &str) -> BTreeMap<&'static str, String> {
    let all = groups(admin).await.unwrap();
    let group = all
        .iter()
        .find(|g| g["container_group_id"] == id)
        .unwrap_or_else(|| panic!("mock-eci reports no group {id}"));
    let text = |field: &str| group[field].as_str().unwrap_or_default().to_owned();
    let spec = match text("instance_type") {
        named if !named.is_empty() => named,
        _ => format!(
            "{}-{}Gi",
            group["cpu"].as_f64().unwrap(),
            group["memory"].as_f64().unwrap()
        ),
    };
    [
        (INSTANCE_SPEC, spec),
        (ENI_INSTANCE_ID, text("eni_instance_id")),
        (VPC, text("vpc_id")),
        (EIP_ADDRESS, text("internet_ip")),
    ]
    .into_iter()
    .filter(|(_, value)| !value.is_empty())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mapped_annotation_reaches_eci_and_the_others_are_reported() {
    let mut h = Harness::start().await.expect("the harness starts");
    h.use_eci_api(EciApi::OpenApi);
    let result = scenario(&mut h).await;
    h.finish(result).await;
}

/// An image cache made in mock-eci through its gRPC API, once it is Ready: its id.
async fn ready_image_cache(grpc: &str) -> Result<String, HarnessError> {
    use eci_proto::v20180808::eci_client::EciClient;
    use eci_proto::v20180808::{CreateImageCacheRequest, DescribeImageCachesRequest};
    let setup =
        |what: &str, error: &dyn std::fmt::Display| HarnessError::Setup(format!("{what}: {error}"));
    let mut client = EciClient::connect(grpc.to_owned())
        .await
        .map_err(|e| setup("mock-eci's gRPC API", &e))?;
    let id = client
        .create_image_cache(CreateImageCacheRequest {
            region_id: "cn-hangzhou".into(),
            image_cache_name: "app".into(),
            image: vec!["registry.example.com/app:1".into()],
            ..Default::default()
        })
        .await
        .map_err(|e| setup("CreateImageCache", &e))?
        .into_inner()
        .image_cache_id;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let listed = client
            .describe_image_caches(DescribeImageCachesRequest {
                region_id: "cn-hangzhou".into(),
                image_cache_id: id.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| setup("DescribeImageCaches", &e))?
            .into_inner();
        if listed.image_caches.iter().any(|c| c.status == "Ready") {
            return Ok(id);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(setup(
                "image cache",
                &format!("{id} not Ready within {WAIT:?}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn scenario(h: &mut Harness) -> Result<(), HarnessError> {
    let ns = h.create_namespace("annotations").await?;
    let mock = h
        .start_mock_eci(&[
            "--provisioning-delay",
            "300ms",
            "--scheduling-delay",
            "50ms",
            "--image-cache-creation-delay",
            "200ms",
        ])
        .await?;
    // ECI refuses a group naming an image cache it does not have: the annotation that names
    // one names a cache made first.
    let cache = ready_image_cache(&mock.grpc).await?;
    h.start_daemon(
        0,
        &[
            ("POD_STATUS_POLL_INTERVAL", "250ms"),
            ("POD_RESYNC_INTERVAL", "2s"),
        ],
    )?;
    let node = h.node_name(0);
    let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
    let create = PostParams::default();
    let mut cases = Vec::new();
    for (index, entry) in TABLE.iter().enumerate() {
        if !matches!(entry.handling, Handling::Mapped { .. }) {
            continue;
        }
        let without = companions(entry.key);
        let mut with = without.clone();
        let example = if entry.key == "k8s.aliyun.com/eci-imc-id" {
            cache.as_str()
        } else {
            entry.example
        };
        with.insert(entry.key, example);
        let name = format!("mapped-{index}");
        pods.create(&create, &pod(&name, &node, &with)).await?;
        cases.push((
            name,
            entry.key,
            translated(&pod("x", &node, &with)),
            translated(&pod("x", &node, &without)),
        ));
    }
    let malformed = BTreeMap::from([("k8s.aliyun.com/eci-spot-strategy", "Spot")]);
    pods.create(&create, &pod("malformed", &node, &malformed))
        .await?;
    let undriven = BTreeMap::from([("k8s.aliyun.com/eci-instance-family", "ecs.c6")]);
    pods.create(&create, &pod("undriven", &node, &undriven))
        .await?;

    let mut with_eip = Vec::new();
    for (name, key, with, without) in &cases {
        let pod = h
            .wait_pod(
                &ns,
                name,
                "its group's id and request id written back",
                WAIT,
                |p| {
                    p["metadata"]["annotations"][INSTANCE_ID].is_string()
                        && p["metadata"]["annotations"][REQUEST_ID].is_string()
                },
            )
            .await?;
        let id = pod["metadata"]["annotations"][INSTANCE_ID]
            .as_str()
            .unwrap();
        let received = created_with(&mock.admin, id).await.unwrap();
        if let Err(problem) = holds(with, without, &received, "request") {
            return Err(HarnessError::Setup(format!("{key} on {name}: {problem}")));
        }
        let reported = reported_by_mock(&mock.admin, id).await;
        for required in [INSTANCE_SPEC, ENI_INSTANCE_ID, VPC] {
            assert!(
                reported.contains_key(required),
                "mock-eci reports {required}: {reported:?}"
            );
        }
        for written in [INSTANCE_SPEC, ENI_INSTANCE_ID, VPC, EIP_ADDRESS] {
            assert_eq!(
                pod["metadata"]["annotations"][written].as_str(),
                reported.get(written).map(String::as_str),
                "{name} ({key}): {written} as mock-eci reports it"
            );
        }
        if reported.contains_key(EIP_ADDRESS) {
            with_eip.push(*key);
        }
    }
    // The EIP annotations' pods, and only they, have a public address written back.
    with_eip.sort_unstable();
    assert_eq!(
        with_eip,
        [
            "k8s.aliyun.com/eci-eip-instanceid",
            "k8s.aliyun.com/eci-with-eip"
        ]
    );

    let failed = h
        .wait_refused(
            (&ns, "malformed"),
            "Failed",
            "InvalidAnnotation",
            &["eci-spot-strategy"],
            WAIT,
        )
        .await?;
    assert!(
        failed["metadata"]["annotations"][INSTANCE_ID].is_null(),
        "no group for {failed}"
    );

    h.wait_pod(&ns, "undriven", "Running", WAIT, |p| {
        p["status"]["phase"] == "Running"
    })
    .await?;
    h.wait_warning_event(
        &ns,
        "undriven",
        "AnnotationNotHonoured",
        &["eci-instance-family"],
        WAIT,
    )
    .await?;

    // One group per created pod: the mapped ones and the undriven one, none for the malformed.
    assert_eq!(group_count(&mock.admin).await, cases.len() + 1);
    Ok(())
}
