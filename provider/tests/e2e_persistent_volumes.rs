//! End to end on the real control plane (kube-controller-manager binds the claims) with
//! mock-eci's OpenAPI front: a pod whose PersistentVolumeClaim is bound to a cloud-disk
//! PersistentVolume (`diskplugin.csi.alibabacloud.com`) gets a group with that disk as its
//! `DiskVolume` — what mock-eci recorded (`/admin/groups/{id}/request`) holds the disk id, file
//! system, size and the mount's sub-path. A second pod on the same disk waits Pending
//! (`FailedAttachVolume`) until the first's group is deleted, then runs. A pod whose claim does
//! not exist waits Pending (`FailedMount`, naming the claim, no group) and runs once the claim
//! exists and is bound. A PersistentVolume of a driver ECI cannot mount fails its pod with the
//! driver's name, and no group is made.
//!
//! A StatefulSet's volumeClaimTemplate claims a pre-created disk PersistentVolume (of a
//! StorageClass without a provisioner behind it); its pod, deleted and recreated by the
//! StatefulSet controller, gets a new group with the same disk. Deleted by force while its
//! old group cannot be deleted yet (ECI refuses the deletes for a while), the recreated pod
//! waits Pending (`FailedAttachVolume`, no group of its own) and runs once the old group is
//! gone: one group per pod, none left behind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::time::Duration;

use integration::harness::mock_admin::{created_with, groups, tag};
use integration::harness::{EciApi, Harness, HarnessError};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
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
    names: (&str, &str),
    driver: (&str, &str),
) -> Result<(), HarnessError> {
    bound_pair_with(h, namespace, names, driver, None).await
}

/// As [`bound_pair`], the volume's node affinity requiring `zone` when given.
async fn bound_pair_with(
    h: &Harness,
    namespace: &str,
    (name, claim): (&str, &str),
    (driver, handle): (&str, &str),
    zone: Option<&str>,
) -> Result<(), HarnessError> {
    let volumes: Api<PersistentVolume> = Api::all(h.client());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client(), namespace);
    let mut pv: PersistentVolume = serde_json::from_value(json!({
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
    if let (Some(zone), Some(spec)) = (zone, pv.spec.as_mut()) {
        spec.node_affinity = Some(
            serde_json::from_value(json!({"required": {"nodeSelectorTerms": [{
                "matchExpressions": [{"key": "topology.diskplugin.csi.alibabacloud.com/zone",
                    "operator": "In", "values": [zone]}]}]}}))
            .unwrap(),
        );
    }
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
        .filter(|g| tag(g, "k8s.aliyun.com/pod-uid") == uid)
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
            ("ECI_ZONE", "cn-hangzhou-a"),
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

    // A disk of another zone than the node's: it waits, both zones named; nothing is created.
    bound_pair_with(
        h,
        &ns,
        (&format!("{ns}-far"), "far"),
        ("diskplugin.csi.alibabacloud.com", &format!("d-{ns}-far")),
        Some("cn-hangzhou-b"),
    )
    .await?;
    pods.create(&create, &pod("far", &node, "far")).await?;
    let far = h
        .wait_refused(
            (&ns, "far"),
            "Pending",
            "FailedMount",
            &["cn-hangzhou-b", "cn-hangzhou-a"],
            WAIT,
        )
        .await?;
    let far_uid = far["metadata"]["uid"].as_str().unwrap();
    assert_eq!(groups_of(&mock.admin, far_uid).await, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_sets_recreated_pod_finds_its_disk_again() {
    let mut h = Harness::start().await.expect("the harness starts");
    h.use_eci_api(EciApi::OpenApi);
    let result = stateful_set_scenario(&mut h).await;
    h.finish(result).await;
}

/// A StorageClass `class` (no provisioner runs for it) and a disk PersistentVolume of that
/// class reserved for the claim `claim` a volumeClaimTemplate makes.
async fn disk_for_template(
    h: &Harness,
    (namespace, claim): (&str, &str),
    (class, pv_name, disk_id): (&str, &str, &str),
) -> Result<(), HarnessError> {
    let class_object: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": class},
        "provisioner": "diskplugin.csi.alibabacloud.com",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }))
    .unwrap();
    Api::<StorageClass>::all(h.client())
        .create(&PostParams::default(), &class_object)
        .await?;
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "20Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": class,
            "claimRef": {"namespace": namespace, "name": claim},
            "csi": {"driver": "diskplugin.csi.alibabacloud.com", "volumeHandle": disk_id, "fsType": "xfs"},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(h.client())
        .create(&PostParams::default(), &pv)
        .await?;
    Ok(())
}

/// A StatefulSet `name` of one replica on `node`, its claim template `data` of `class`.
fn stateful_set(name: &str, node: &str, class: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": "registry.example.com/app:1",
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": {"requests": {"storage": "20Gi"}},
                },
            }],
        },
    }))
    .unwrap()
}

/// `ns/name` Running on a group, as a pod other than `not_uid`: its uid and group id.
async fn running_anew(
    h: &Harness,
    ns: &str,
    name: &str,
    not_uid: &str,
) -> Result<(String, String), HarnessError> {
    let pod = h
        .wait_pod(ns, name, "Running, recreated", WAIT, |p| {
            p["metadata"]["uid"].as_str() != Some(not_uid)
                && p["status"]["phase"] == "Running"
                && p["metadata"]["annotations"][INSTANCE_ID].is_string()
        })
        .await?;
    Ok((
        pod["metadata"]["uid"].as_str().unwrap().to_owned(),
        pod["metadata"]["annotations"][INSTANCE_ID]
            .as_str()
            .unwrap()
            .to_owned(),
    ))
}

/// The disk of volume `data` in what mock-eci received for group `id`.
async fn disk_of(admin: &str, id: &str) -> Value {
    let request = created_with(admin, id).await.expect("mock-eci answers");
    request["volume"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "data")
        .map(|v| v["disk_volume"].clone())
        .unwrap_or_else(|| panic!("no volume data in {request}"))
}

/// The groups mock-eci holds that mount `disk_id`.
async fn groups_mounting(admin: &str, disk_id: &str) -> Vec<String> {
    let mut holders = Vec::new();
    for group in groups(admin).await.expect("mock-eci answers") {
        let id = group["container_group_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if disk_of_opt(admin, &id)
            .await
            .is_some_and(|d| d["disk_id"] == disk_id)
        {
            holders.push(id);
        }
    }
    holders
}

async fn disk_of_opt(admin: &str, id: &str) -> Option<Value> {
    let request = created_with(admin, id).await.ok()?;
    request["volume"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == "data")
        .map(|v| v["disk_volume"].clone())
}

/// Every DeleteContainerGroup refused (`on`) or served again.
async fn refuse_deletes(admin: &str, on: bool) {
    let rate = if on { 1.0 } else { 0.0 };
    reqwest::Client::new()
        .patch(format!("{admin}/admin/controls"))
        .json(&json!({"faults": {"DeleteContainerGroup": {"error_rate": rate, "error_code": "ServiceUnavailable"}}}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

async fn stateful_set_scenario(h: &mut Harness) -> Result<(), HarnessError> {
    let ns = h.create_namespace("sts").await?;
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
    h.wait_node_ready(&node, WAIT).await?;
    let disk_id = format!("d-{ns}");
    let class = format!("{ns}-disk");
    let pv_name = format!("{ns}-web-0");
    disk_for_template(h, (&ns, "data-web-0"), (&class, &pv_name, &disk_id)).await?;
    Api::<StatefulSet>::namespaced(h.client(), &ns)
        .create(&PostParams::default(), &stateful_set("web", &node, &class))
        .await?;

    let (first_uid, first_id) = running_anew(h, &ns, "web-0", "").await?;
    let want = json!({"disk_id": disk_id, "fs_type": "xfs", "disk_size": 20});
    assert_eq!(disk_of(&mock.admin, &first_id).await, want);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client(), &ns);
    let claim = claims.get("data-web-0").await?;
    assert_eq!(
        claim.spec.and_then(|s| s.volume_name).as_deref(),
        Some(pv_name.as_str()),
        "the template's claim is bound to the pre-created disk"
    );

    // Deleted: the StatefulSet controller makes web-0 again once the old pod (and so, its
    // group) is gone; the new group mounts the same disk.
    let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
    pods.delete("web-0", &DeleteParams::default()).await?;
    let (second_uid, second_id) = running_anew(h, &ns, "web-0", &first_uid).await?;
    assert_ne!(second_id, first_id);
    assert_eq!(disk_of(&mock.admin, &second_id).await, want);
    assert_eq!(
        groups_mounting(&mock.admin, &disk_id).await,
        std::slice::from_ref(&second_id)
    );

    // Deleted by force while ECI refuses to delete its group: the recreated pod waits for the
    // disk, as a kubelet waits for a detach, and runs once the old group is gone.
    refuse_deletes(&mock.admin, true).await;
    pods.delete("web-0", &DeleteParams::default().grace_period(0))
        .await?;
    let waiting = h
        .wait_refused(
            (&ns, "web-0"),
            "Pending",
            "FailedAttachVolume",
            &[&disk_id, &second_id],
            WAIT,
        )
        .await?;
    let third_uid = waiting["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_ne!(third_uid, second_uid);
    assert_eq!(groups_of(&mock.admin, &third_uid).await, 0);
    refuse_deletes(&mock.admin, false).await;
    let (uid, third_id) = running_anew(h, &ns, "web-0", &second_uid).await?;
    assert_eq!(uid, third_uid, "the waiting pod itself runs");
    assert_eq!(disk_of(&mock.admin, &third_id).await, want);
    assert_eq!(groups_of(&mock.admin, &third_uid).await, 1);
    assert_eq!(groups_mounting(&mock.admin, &disk_id).await, [third_id]);
    Ok(())
}
