//! End to end on the real control plane: the `ImageCache` CRD as deploy/ ships it, one daemon
//! (elected for image caches by its Lease) and mock-eci building caches in a few hundred
//! milliseconds. An ImageCache created with kubectl reaches Ready with the id of the cache
//! mock-eci holds (DescribeImageCaches), with the images asked for and the daemon's tags; once
//! deleted, the cache is deleted in ECI before the object goes. Refusals: an image mock-eci
//! cannot pull leaves the resource Failed with ECI's reason in its status and a Warning Event;
//! a pull secret that does not exist is refused with a Warning Event naming it, and no cache
//! is created for it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::Path;
use std::time::Duration;

use eci_proto::v20180808::DescribeImageCachesRequest;
use integration::harness::mock_admin::created_with;
use integration::harness::{Harness, HarnessError};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use virtual_node_eci::eci::{GrpcBackend, ImageCacheBackend as _};
use virtual_node_eci::imagecache::reconciler::{
    FINALIZER, REASON_FAILED, REASON_SYNC_FAILED, TAG_UID,
};
use virtual_node_eci::imagecache::resource::{CRD_FILE, ImageCache};

const WAIT: Duration = Duration::from_secs(120);
const CRD_NAME: &str = "imagecaches.eci.alibabacloud.com";
const REGION: &str = "cn-hangzhou";
/// The group's id and the matched cache, as the daemon writes them back on a pod.
const MATCHED_ANNOTATIONS: [&str; 2] = [
    "k8s.aliyun.com/eci-instance-id",
    "k8s.aliyun.com/eci-matched-image-cache",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_cache_is_built_named_in_status_and_deleted_with_its_resource() {
    let mut h = Harness::start().await.expect("the harness starts");
    let result = scenario(&mut h).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    h.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}

async fn kubectl(h: &Harness, args: &[&str], input: Option<&str>) -> Result<String, HarnessError> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).await.unwrap();
    }
    drop(stdin);
    let output = child.wait_with_output().await.expect("kubectl runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(HarnessError::Setup(format!(
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// The CRD as deploy/ ships it, served.
async fn install_crd(h: &Harness) -> Result<(), HarnessError> {
    let crd = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(CRD_FILE);
    h.apply_crd(&crd, CRD_NAME, WAIT).await
}

fn manifest(name: &str, images: &[&str], pull_secrets: &[&str]) -> String {
    let images: Vec<String> = images.iter().map(|i| format!("  - {i}\n")).collect();
    let secrets = if pull_secrets.is_empty() {
        String::new()
    } else {
        let entries: Vec<String> = pull_secrets.iter().map(|s| format!("  - {s}\n")).collect();
        format!("  imagePullSecrets:\n{}", entries.concat())
    };
    format!(
        "apiVersion: eci.alibabacloud.com/v1\nkind: ImageCache\nmetadata:\n  name: {name}\nspec:\n  images:\n{}{secrets}  retentionDays: 7\n",
        images.concat()
    )
}

async fn wait_cache(
    h: &Harness,
    name: &str,
    what: &str,
    condition: impl Fn(&Value) -> bool + Clone,
) -> Result<Value, HarnessError> {
    let api: Api<ImageCache> = Api::all(h.client());
    let what = format!("ImageCache {name}: {what}");
    h.wait_for(&what, WAIT, |_| {
        let (api, condition) = (api.clone(), condition.clone());
        async move {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .map(|c| serde_json::to_value(c).unwrap())
                .is_some_and(|c| condition(&c))
        }
    })
    .await?;
    Ok(serde_json::to_value(api.get(name).await?).unwrap())
}

/// Waits for a Warning Event of `reason` on ImageCache `name` (cluster-scoped: its Events are
/// in `default`) whose note says each of `naming`.
async fn wait_event(
    h: &Harness,
    name: &str,
    reason: &str,
    naming: &[&str],
) -> Result<(), HarnessError> {
    let events: Api<Event> = Api::namespaced(h.client(), "default");
    let what = format!("a Warning Event {reason} on ImageCache {name} naming {naming:?}");
    h.wait_for(&what, WAIT, |_| {
        let events = events.clone();
        async move {
            events.list(&ListParams::default()).await.is_ok_and(|list| {
                list.items.iter().any(|e| {
                    e.involved_object.kind.as_deref() == Some("ImageCache")
                        && e.involved_object.name.as_deref() == Some(name)
                        && e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some(reason)
                        && e.message
                            .as_deref()
                            .is_some_and(|m| naming.iter().all(|n| m.contains(n)))
                })
            })
        }
    })
    .await
}

async fn eci_caches(eci: &GrpcBackend, uid: &str) -> Vec<eci_proto::v20180808::ImageCache> {
    eci.describe_image_caches(DescribeImageCachesRequest {
        region_id: REGION.into(),
        tag: vec![eci_proto::v20180808::Tag {
            key: TAG_UID.into(),
            value: uid.into(),
        }],
        ..DescribeImageCachesRequest::default()
    })
    .await
    .expect("mock-eci describes its caches")
    .image_caches
}

/// A pod asking for automatic matching (`eci-auto-imc`) is created with
/// `AutoMatchImageCache`, starts from cache `cache` without the pull, sooner than a pod that
/// pulls the same image, and shows the cache as `eci-matched-image-cache`; the other pod does
/// not.
async fn pods_start_from_the_cache(
    h: &Harness,
    ns: &str,
    admin: &str,
    cache: &str,
) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    for (name, annotations) in [
        ("cached", json!({"k8s.aliyun.com/eci-auto-imc": "true"})),
        ("pulled", json!({})),
    ] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": h.node_name(0)},
                "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                "containers": [{"name": "web", "image": "nginx:1.25"}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await?;
    }
    let mut started = Vec::new();
    for name in ["cached", "pulled"] {
        let pod = h
            .wait_pod(
                ns,
                name,
                "running, its group's id written back",
                WAIT,
                |p| {
                    p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].is_string()
                        && p["metadata"]["annotations"][MATCHED_ANNOTATIONS[0]].is_string()
                },
            )
            .await?;
        let at = |v: &Value| {
            v.as_str()
                .unwrap_or_default()
                .parse::<jiff::Timestamp>()
                .map_err(|e| HarnessError::Setup(format!("{name}: a time: {e}")))
        };
        let took = at(&pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])?
            .duration_since(at(&pod["metadata"]["creationTimestamp"])?);
        let annotations = &pod["metadata"]["annotations"];
        let request =
            created_with(admin, annotations[MATCHED_ANNOTATIONS[0]].as_str().unwrap()).await?;
        started.push((name, took.as_millis(), annotations.clone(), request));
    }
    let [
        (_, cached_ms, cached, cached_request),
        (_, pulled_ms, pulled, pulled_request),
    ] = &started[..]
    else {
        unreachable!("two pods");
    };
    eprintln!("creation to running: from the cache {cached_ms} ms, pulled {pulled_ms} ms");
    assert_eq!(
        cached_request["auto_match_image_cache"], true,
        "{cached_request}"
    );
    assert_ne!(
        pulled_request["auto_match_image_cache"], true,
        "{pulled_request}"
    );
    assert_eq!(cached[MATCHED_ANNOTATIONS[1]], cache, "{cached:#}");
    assert!(pulled[MATCHED_ANNOTATIONS[1]].is_null(), "{pulled:#}");
    // Seconds apart in mock-eci (4 s against 300 ms); the pods' times are whole seconds.
    assert!(
        cached_ms < pulled_ms,
        "the pod from the cache started first: {cached_ms} ms against {pulled_ms} ms"
    );
    Ok(())
}

async fn scenario(h: &mut Harness) -> Result<(), HarnessError> {
    // A namespace only for a name unique to this run (the resources are cluster-scoped).
    let run = h.create_namespace("imc").await?;
    let mock = h
        .start_mock_eci(&[
            "--image-cache-creation-delay",
            "300ms",
            // A pull takes 4 s; a group from a cache holding its images, 300 ms.
            "--provisioning-delay",
            "4s",
            "--cached-provisioning-delay",
            "300ms",
            "--scheduling-delay",
            "100ms",
        ])
        .await?;
    install_crd(h).await?;
    h.start_daemon(0, &[])?;
    let eci = GrpcBackend::connect_lazy(&mock.grpc).expect("mock-eci's gRPC endpoint");
    let api: Api<ImageCache> = Api::all(h.client());

    // Built: Ready, the id in status is the cache ECI holds, with the images asked for.
    let name = format!("{run}-web");
    kubectl(
        h,
        &["apply", "-f", "-"],
        Some(&manifest(&name, &["nginx:1.25", "busybox:1.36"], &[])),
    )
    .await?;
    let ready = wait_cache(h, &name, "Ready with a cache id", |c| {
        c["status"]["phase"] == "Ready" && c["status"]["imageCacheId"].is_string()
    })
    .await?;
    let id = ready["status"]["imageCacheId"].as_str().unwrap().to_owned();
    let uid = ready["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(
        ready["metadata"]["finalizers"],
        serde_json::json!([FINALIZER])
    );
    assert_eq!(ready["status"]["progress"], "100%", "{ready:#}");
    assert_eq!(
        ready["status"]["observedGeneration"], ready["metadata"]["generation"],
        "{ready:#}"
    );
    let held = eci_caches(&eci, &uid).await;
    assert_eq!(held.len(), 1, "one cache for the resource: {held:?}");
    assert_eq!(held[0].image_cache_id, id);
    assert_eq!(held[0].status, "Ready");
    let mut images = held[0].images.clone();
    images.sort();
    assert_eq!(images, ["busybox:1.36", "nginx:1.25"]);
    assert!(
        held[0]
            .tags
            .iter()
            .any(|t| t.key == "k8s.aliyun.com/cluster")
    );

    pods_start_from_the_cache(h, &run, &mock.admin, &id).await?;

    // Deleted: the ECI cache goes first, then the object.
    api.delete(&name, &DeleteParams::default()).await?;
    h.wait_for(&format!("ImageCache {name} gone"), WAIT, |_| {
        let api = api.clone();
        let name = name.clone();
        async move { api.get_opt(&name).await.is_ok_and(|c| c.is_none()) }
    })
    .await?;
    let left = eci_caches(&eci, &uid).await;
    assert!(left.is_empty(), "the ECI cache was deleted: {left:?}");

    // Refused by ECI: an image that cannot be pulled.
    let bad = format!("{run}-unpullable");
    kubectl(
        h,
        &["apply", "-f", "-"],
        Some(&manifest(&bad, &["pull-fail.mock-eci.invalid/app:1"], &[])),
    )
    .await?;
    let failed = wait_cache(h, &bad, "Failed", |c| c["status"]["phase"] == "Failed").await?;
    let events = failed["status"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        events.iter().any(|e| e["type"] == "Warning"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("pull-fail.mock-eci.invalid/app:1"))),
        "ECI's reason in the status: {failed:#}"
    );
    wait_event(
        h,
        &bad,
        REASON_FAILED,
        &["pull-fail.mock-eci.invalid/app:1"],
    )
    .await?;

    // Refused by the daemon: a pull secret that does not exist; nothing is built.
    let secretless = format!("{run}-secretless");
    kubectl(
        h,
        &["apply", "-f", "-"],
        Some(&manifest(
            &secretless,
            &["nginx:1.25"],
            &[&format!("{run}:absent")],
        )),
    )
    .await?;
    wait_event(
        h,
        &secretless,
        REASON_SYNC_FAILED,
        &[&format!("{run}:absent"), "does not exist"],
    )
    .await?;
    let refused = api.get(&secretless).await?;
    let refused_uid = refused.metadata.uid.clone().unwrap_or_default();
    assert!(
        refused
            .status
            .as_ref()
            .is_none_or(|s| s.image_cache_id.is_none()),
        "no cache recorded: {:?}",
        refused.status
    );
    assert!(eci_caches(&eci, &refused_uid).await.is_empty());
    // Deleting it releases it at once (no cache to delete).
    for gone in [&bad, &secretless] {
        api.delete(gone, &DeleteParams::default()).await?;
    }
    h.wait_for("the refused ImageCaches gone", WAIT, |_| {
        let api = api.clone();
        let (bad, secretless) = (bad.clone(), secretless.clone());
        async move {
            api.get_opt(&bad).await.is_ok_and(|c| c.is_none())
                && api.get_opt(&secretless).await.is_ok_and(|c| c.is_none())
        }
    })
    .await?;
    Ok(())
}
