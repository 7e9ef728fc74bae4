//! End to end on the real control plane: several vSwitches in three zones (mock-eci's
//! `--vswitch-zone`), stock switched off per zone through its admin API. The daemon lists all
//! three (`ECI_VSWITCH`); a pod lands in the zone with stock and shows it
//! (`topology.kubernetes.io/zone`); `VSwitchOrdered` honours the order; with no stock anywhere
//! a `fail-fast` pod fails at once with a readable reason and no group, and a pod with the
//! default strategy waits Pending (`ContainerInstanceCreated=False`, reason `NoStock`) and
//! runs once stock returns. A spot reclaim mock-eci announces shows on the running pod
//! (`ContainerInstanceCreated` reason `SpotToBeReleased`, a Warning Event) before the release,
//! and after the release (the group `Expired`) the pod is Failed, reason `Expired`, its
//! containers terminated.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::Duration;

use integration::harness::mock_admin;
use integration::harness::{Harness, HarnessError};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use vne_core::to_eci::annotations::{FAIL_STRATEGY, INSTANCE_ID, ZONE};

const WAIT: Duration = Duration::from_secs(120);

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

async fn no_stock_in(admin: &str, zones: &[&str]) {
    reqwest::Client::new()
        .patch(format!("{admin}/admin/controls"))
        .json(&json!({"no_stock_zones": zones}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

async fn group_count(admin: &str) -> usize {
    mock_admin::groups(admin).await.unwrap().len()
}

fn condition<'a>(pod: &'a Value, kind: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn running_in(pod: &Value, zone: &str) -> bool {
    pod["status"]["phase"] == "Running" && pod["metadata"]["annotations"][ZONE] == zone
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_land_in_a_zone_with_stock_or_wait_or_fail_as_they_ask() {
    let mut h = Harness::start().await.expect("the harness starts");
    let result = scenario(&mut h).await;
    if result.is_err() {
        eprintln!("{}", h.dump().await);
    }
    h.shutdown(Duration::from_secs(10)).await;
    result.unwrap();
}

async fn scenario(h: &mut Harness) -> Result<(), HarnessError> {
    let ns = h.create_namespace("zones").await?;
    let mock = h
        .start_mock_eci(&[
            "--provisioning-delay",
            "300ms",
            "--scheduling-delay",
            "50ms",
            "--vswitch-zone",
            "vsw-a=zone-a",
            "--vswitch-zone",
            "vsw-b=zone-b",
            "--vswitch-zone",
            "vsw-c=zone-c",
            "--no-stock-zone",
            "zone-a",
            "--no-stock-zone",
            "zone-b",
        ])
        .await?;
    h.start_daemon(
        0,
        &[
            ("ECI_VSWITCH", "vsw-a,vsw-b,vsw-c"),
            ("POD_STATUS_POLL_INTERVAL", "250ms"),
            ("POD_RESYNC_INTERVAL", "2s"),
        ],
    )?;
    let node = h.node_name(0);
    let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
    let create = PostParams::default();

    // Stock only in c: whatever order ECI draws, the pod runs there and says so.
    pods.create(&create, &pod("lands-in-c", &node, &BTreeMap::new()))
        .await?;
    h.wait_pod(&ns, "lands-in-c", "Running in zone-c", WAIT, |p| {
        running_in(p, "zone-c")
    })
    .await?;

    // Stock in b and c: in the order given, b comes first.
    no_stock_in(&mock.admin, &["zone-a"]).await;
    let ordered = BTreeMap::from([("k8s.aliyun.com/eci-schedule-strategy", "VSwitchOrdered")]);
    pods.create(&create, &pod("ordered", &node, &ordered))
        .await?;
    h.wait_pod(&ns, "ordered", "Running in zone-b", WAIT, |p| {
        running_in(p, "zone-b")
    })
    .await?;

    // No stock anywhere, fail-fast: Failed at once, readable, nothing created.
    no_stock_in(&mock.admin, &["zone-a", "zone-b", "zone-c"]).await;
    let groups_before = group_count(&mock.admin).await;
    let fast = BTreeMap::from([(FAIL_STRATEGY, "fail-fast")]);
    pods.create(&create, &pod("fail-fast", &node, &fast))
        .await?;
    let failed = h
        .wait_pod(&ns, "fail-fast", "Failed for lack of stock", WAIT, |p| {
            p["status"]["phase"] == "Failed"
                && condition(p, "ContainerInstanceCreated")
                    .is_some_and(|c| c["status"] == "False" && c["reason"] == "NoStock")
        })
        .await?;
    let message = failed["status"]["message"].as_str().unwrap_or_default();
    assert_eq!(failed["status"]["reason"], "ProviderFailed", "{failed}");
    for part in ["stock", "fail-fast", "zone-a", "zone-c"] {
        assert!(message.contains(part), "{part:?} in {message:?}");
    }
    assert!(failed["metadata"]["annotations"][INSTANCE_ID].is_null());

    // No stock anywhere, the default strategy: Pending with NoStock, then Running once stock
    // returns.
    pods.create(&create, &pod("waits", &node, &BTreeMap::new()))
        .await?;
    let waiting = h
        .wait_pod(&ns, "waits", "Pending with NoStock", WAIT, |p| {
            p["status"]["phase"] == "Pending"
                && condition(p, "ContainerInstanceCreated")
                    .is_some_and(|c| c["status"] == "False" && c["reason"] == "NoStock")
        })
        .await?;
    let message = condition(&waiting, "ContainerInstanceCreated").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("retried"), "{message}");
    assert_eq!(
        group_count(&mock.admin).await,
        groups_before,
        "no group for a pod refused for stock"
    );
    no_stock_in(&mock.admin, &["zone-a", "zone-b"]).await;
    h.wait_pod(
        &ns,
        "waits",
        "Running in zone-c once stock returned",
        WAIT,
        |p| {
            running_in(p, "zone-c")
                && condition(p, "ContainerInstanceCreated").is_none_or(|c| c["status"] != "False")
        },
    )
    .await?;

    // A spot reclaim announced ahead: the condition and a Warning Event, the pod still runs.
    let running = h.pod_json(&ns, "lands-in-c").await.unwrap();
    let id = running["metadata"]["annotations"][INSTANCE_ID]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        condition(&running, "ContainerInstanceCreated").is_some_and(|c| c["status"] == "True"),
        "{running}"
    );
    reqwest::Client::new()
        .post(format!("{}/admin/groups/{id}/announce-reclaim", mock.admin))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    h.wait_pod(
        &ns,
        "lands-in-c",
        "the reclaim announced on its condition",
        WAIT,
        |p| {
            p["status"]["phase"] == "Running"
                && condition(p, "ContainerInstanceCreated")
                    .is_some_and(|c| c["status"] == "True" && c["reason"] == "SpotToBeReleased")
        },
    )
    .await?;
    let events: Api<Event> = Api::namespaced(h.client(), &ns);
    h.wait_for("a Warning Event SpotToBeReleased on the pod", WAIT, |_| {
        let events = events.clone();
        async move {
            events.list(&Default::default()).await.is_ok_and(|list| {
                list.items.iter().any(|e| {
                    e.involved_object.name.as_deref() == Some("lands-in-c")
                        && e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some("SpotToBeReleased")
                })
            })
        }
    })
    .await?;

    // The release that follows (mock-eci's `expire`, as the service ends the group
    // `Expired`): the pod fails saying the spot instance was reclaimed, its containers
    // terminated, and it keeps its written-back annotations.
    reqwest::Client::new()
        .post(format!("{}/admin/groups/{id}/expire", mock.admin))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let released = h
        .wait_pod(&ns, "lands-in-c", "Failed, reason Expired", WAIT, |p| {
            p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Expired"
        })
        .await?;
    let message = released["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("reclaimed"), "{released}");
    let statuses = released["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !statuses.is_empty()
            && statuses
                .iter()
                .all(|c| c["state"]["terminated"].is_object()),
        "every container terminated: {released}"
    );
    assert_eq!(
        released["metadata"]["annotations"][INSTANCE_ID],
        id.as_str()
    );
    assert_eq!(released["metadata"]["annotations"][ZONE], "zone-c");
    Ok(())
}
