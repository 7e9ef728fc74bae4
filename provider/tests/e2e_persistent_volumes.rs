//! End to end on the real control plane (kube-controller-manager binds the claims) with
//! mock-eci's OpenAPI front: a pod whose PersistentVolumeClaim is bound to a cloud-disk
//! PersistentVolume (`diskplugin.csi.alibabacloud.com`) gets a group with that disk as its
//! `DiskVolume` — what mock-eci recorded (`/admin/groups/{id}/request`) holds the disk id, file
//! system, size and the mount's sub-path. A second pod on the same disk waits Pending
//! (`FailedAttachVolume`) until the first's group is deleted, then runs. A pod whose claim does
//! not exist waits Pending (`FailedMount`, naming the claim, no group) and runs once the claim
//! exists and is bound. A PersistentVolume of a driver ECI cannot mount fails its pod with the
//! driver's name, and no group is made.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use integration::harness::mock_admin::{created_with, groups};
use integration::harness::{EciApi, Harness, HarnessError};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";

/// A pod bound straight to `node` (the scheduler's volume checks are not what is tested)
/// mounting the claim `claim` at `/data`, sub-path `app`.
fn pod(name: &str, node: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "containers": [{"name": "app", "image": "registry.example.com/app:1",
                "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "app"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap()
}

/// A PersistentVolume `name` of CSI driver `driver` with `handle`, pre-bound to
/// `namespace/claim`, and that claim naming it: kube-controller-manager binds the pair.
async fn bound_pair(
    h: &Harness,
    namespace: &str,
    (name, claim): (&str, &str),
    (driver, handle): (&str, &str),
) -> Result<(), HarnessError> {
    let volumes: Api<PersistentVolume> = Api::all(h.client());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client(), namespace);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "20Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": claim},
            "csi": {"driver": driver, "volumeHandle": handle},
        },
    }))
    .unwrap();
    volumes.create(&PostParams::default(), &pv).await?;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": {"storage": "20Gi"}},
        },
    }))
    .unwrap();
    claims.create(&PostParams::default(), &pvc).await?;
    h.wait_for(&format!("claim {namespace}/{claim} Bound"), WAIT, |_| {
        let claims = claims.clone();
        async move {
            claims
                .get_opt(claim)
                .await
                .ok()
                .flatten()
                .is_some_and(|c| c.status.and_then(|s| s.phase).as_deref() == Some("Bound"))
        }
    })
    .await
}

/// mock-eci's groups carrying `uid` as their pod-UID tag.
async fn groups_of(admin: &str, uid: &str) -> usize {
    groups(admin)
        .await
        .unwrap()
        .iter()
        .filter(|g| {
            g["tags"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["key"] == "k8s.aliyun.com/pod-uid" && t["value"].as_str() == Some(uid))
        })
        .count()
}

async fn running(h: &Harness, ns: &str, name: &str) -> Result<Value, HarnessError> {
    h.wait_pod(ns, name, "Running", WAIT, |p| {
        p["status"]["phase"] == "Running" && p["metadata"]["annotations"][INSTANCE_ID].is_string()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_bound_to_alibaba_volumes_mount_and_the_rest_wait_or_fail_with_a_reason() {
    let mut h = Harness::start().await.expect("the harness starts");
    h.use_eci_api(EciApi::OpenApi);
    let result = scenario(&mut h).await;
    h.finish(result).await;
}

async fn scenario(h: &mut Harness) -> Result<(), HarnessError> {
    let ns = h.create_namespace("pvc").await?;
    let mock = h
        .start_mock_eci(&[
            "--provisioning-delay",
            "300ms",
            "--scheduling-delay",
            "50ms",
        ])
        .await?;
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
    let disk_id = format!("d-{ns}");
    let disk_pv = format!("{ns}-disk");
    bound_pair(
        h,
        &ns,
        (&disk_pv, "data"),
        ("diskplugin.csi.alibabacloud.com", &disk_id),
    )
    .await?;

    // The disk reaches ECI as the group's DiskVolume.
    pods.create(&create, &pod("first", &node, "data")).await?;
    let first = running(h, &ns, "first").await?;
    let id = first["metadata"]["annotations"][INSTANCE_ID]
        .as_str()
        .unwrap()
        .to_owned();
    let request = created_with(&mock.admin, &id).await.unwrap();
    let volumes = request["volume"].as_array().cloned().unwrap_or_default();
    let data = volumes
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap_or_else(|| panic!("no volume data in {request}"));
    assert_eq!(data["type"], "DiskVolume", "{data}");
    assert_eq!(
        data["disk_volume"],
        json!({"disk_id": disk_id, "fs_type": "ext4", "disk_size": 20}),
        "{data}"
    );
    let mount = &request["container"][0]["volume_mount"][0];
    assert_eq!(
        (&mount["name"], &mount["sub_path"], &mount["mount_path"]),
        (&json!("data"), &json!("app"), &json!("/data")),
        "{mount}"
    );

    // A second pod on the same disk waits for the first's group to go.
    pods.create(&create, &pod("second", &node, "data")).await?;
    let second = h
        .wait_refused(
            (&ns, "second"),
            "Pending",
            "FailedAttachVolume",
            &[&disk_id, &id],
            WAIT,
        )
        .await?;
    let second_uid = second["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(groups_of(&mock.admin, &second_uid).await, 0);
    pods.delete("first", &DeleteParams::default()).await?;
    running(h, &ns, "second").await?;
    assert_eq!(groups_of(&mock.admin, &second_uid).await, 1);

    // A claim that does not exist yet: Pending, named, no group; it runs once the claim is
    // there and bound.
    pods.create(&create, &pod("waiting", &node, "later"))
        .await?;
    let waiting = h
        .wait_refused(
            (&ns, "waiting"),
            "Pending",
            "FailedMount",
            &["persistentvolumeclaim \"later\" not found"],
            WAIT,
        )
        .await?;
    let waiting_uid = waiting["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(groups_of(&mock.admin, &waiting_uid).await, 0);
    bound_pair(
        h,
        &ns,
        (&format!("{ns}-later"), "later"),
        ("diskplugin.csi.alibabacloud.com", &format!("d-{ns}-later")),
    )
    .await?;
    running(h, &ns, "waiting").await?;

    // A driver ECI cannot mount: the pod fails with the driver's name; nothing is created.
    bound_pair(
        h,
        &ns,
        (&format!("{ns}-ebs"), "foreign"),
        ("ebs.csi.aws.com", "vol-0123"),
    )
    .await?;
    pods.create(&create, &pod("foreign", &node, "foreign"))
        .await?;
    let foreign = h
        .wait_pod(&ns, "foreign", "Failed, naming the driver", WAIT, |p| {
            p["status"]["phase"] == "Failed"
                && p["status"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("ebs.csi.aws.com"))
        })
        .await?;
    h.wait_warning_event(&ns, "foreign", "ProviderFailed", &["ebs.csi.aws.com"], WAIT)
        .await?;
    let foreign_uid = foreign["metadata"]["uid"].as_str().unwrap();
    assert_eq!(groups_of(&mock.admin, foreign_uid).await, 0);
    Ok(())
}
