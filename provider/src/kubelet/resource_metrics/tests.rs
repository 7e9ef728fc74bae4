use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use eci_proto::EciError;
use eci_proto::v20180808::{
    CreateContainerGroupRequest, CreateContainerGroupResponse, DeleteContainerGroupRequest,
    DeleteContainerGroupResponse, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupStatusResponse, DescribeContainerGroupsRequest,
    DescribeContainerGroupsResponse, DescribeContainerLogRequest, DescribeContainerLogResponse,
    DescribeMultiContainerGroupMetricRequest, DescribeMultiContainerGroupMetricResponse,
    ExecContainerCommandRequest, ExecContainerCommandResponse, MonitorData,
    RestartContainerGroupRequest, RestartContainerGroupResponse, UpdateContainerGroupRequest,
    UpdateContainerGroupResponse,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::json;
use vne_core::kubelet_metrics::BATCH;
use vne_core::kubelet_metrics::fixtures::{entry, record};

use super::*;
use crate::pods::INSTANCE_ANNOTATION;

fn pod(name: &str, uid: &str, phase: &str, group: Option<&str>) -> Pod {
    let mut annotations = serde_json::Map::new();
    if let Some(group) = group {
        annotations.insert(INSTANCE_ANNOTATION.into(), json!(group));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations},
        "spec": {"containers": [{"name": "app"}, {"name": "side"}]},
        "status": {
            "phase": phase,
            "startTime": "2023-11-14T22:13:20Z",
            "containerStatuses": [
                {"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2023-11-14T22:13:25Z"}}},
                {"name": "side", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ],
        },
    }))
    .expect("a pod")
}

#[test]
fn the_index_relists_whole() {
    let mut index = PodIndex::default();
    assert!(!index.listed());
    index.apply(&Event::Init);
    index.apply(&Event::InitApply(pod("a", "u-a", "Running", Some("eci-a"))));
    assert!(index.is_empty(), "a relist lands at its end");
    index.apply(&Event::InitApply(pod("b", "u-b", "Running", Some("eci-b"))));
    index.apply(&Event::InitDone);
    assert!(index.listed());
    assert_eq!(index.len(), 2);
    index.apply(&Event::Apply(pod("c", "u-c", "Running", Some("eci-c"))));
    index.apply(&Event::Delete(pod("a", "u-a", "Running", Some("eci-a"))));
    let mut uids: Vec<&str> = index.pods().map(|p| p.uid.as_str()).collect();
    uids.sort_unstable();
    assert_eq!(uids, ["u-b", "u-c"]);
    // A relist after a broken watch replaces everything: b was deleted meanwhile.
    index.apply(&Event::Init);
    index.apply(&Event::InitApply(pod("c", "u-c", "Running", Some("eci-c"))));
    index.apply(&Event::InitDone);
    assert!(index.contains("u-c") && !index.contains("u-b"));
}

#[test]
fn errors_say_their_own_part_once() {
    let errors: Vec<MetricsError> = vec![
        MetricsError::NotListed,
        MetricsError::Eci {
            groups: 20,
            source: EciError::new("Throttling.User", "slow down"),
        },
        MetricsError::Timeout {
            groups: 3,
            timeout: Duration::from_secs(8),
        },
    ];
    for error in &errors {
        assert!(crate::ops::chain::says_each_part_once(error), "{error}");
    }
}

/// An ECI that answers the metric call for groups `eci-<n>` (each with one container whose
/// counter is `n` seconds), counting calls, failing the groups listed in `failing`.
#[derive(Debug, Default)]
struct FakeEci {
    calls: AtomicUsize,
    /// Every group asked for.
    asked: std::sync::Mutex<Vec<String>>,
    failing: std::sync::Mutex<HashSet<String>>,
    latency: Duration,
}

#[async_trait::async_trait]
impl crate::eci::EciBackend for FakeEci {
    async fn create_container_group(
        &self,
        _: CreateContainerGroupRequest,
    ) -> Result<CreateContainerGroupResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn describe_container_groups(
        &self,
        _: DescribeContainerGroupsRequest,
    ) -> Result<DescribeContainerGroupsResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn describe_container_group_status(
        &self,
        _: DescribeContainerGroupStatusRequest,
    ) -> Result<DescribeContainerGroupStatusResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn delete_container_group(
        &self,
        _: DeleteContainerGroupRequest,
    ) -> Result<DeleteContainerGroupResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn update_container_group(
        &self,
        _: UpdateContainerGroupRequest,
    ) -> Result<UpdateContainerGroupResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn restart_container_group(
        &self,
        _: RestartContainerGroupRequest,
    ) -> Result<RestartContainerGroupResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn describe_container_log(
        &self,
        _: DescribeContainerLogRequest,
    ) -> Result<DescribeContainerLogResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn exec_container_command(
        &self,
        _: ExecContainerCommandRequest,
    ) -> Result<ExecContainerCommandResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn describe_container_group_metric(
        &self,
        _: DescribeContainerGroupMetricRequest,
    ) -> Result<DescribeContainerGroupMetricResponse, EciError> {
        Err(EciError::new("Unexpected", "not in this test"))
    }
    async fn describe_multi_container_group_metric(
        &self,
        request: DescribeMultiContainerGroupMetricRequest,
    ) -> Result<DescribeMultiContainerGroupMetricResponse, EciError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.asked
            .lock()
            .unwrap()
            .extend(request.container_group_ids.iter().cloned());
        assert!(request.container_group_ids.len() <= BATCH);
        assert_eq!(request.metric_type, "all");
        assert_eq!(request.region_id, "cn-test");
        tokio::time::sleep(self.latency).await;
        let failing = self.failing.lock().unwrap().clone();
        if request
            .container_group_ids
            .iter()
            .any(|id| failing.contains(id))
        {
            return Err(EciError::new("ServiceUnavailable", "try later"));
        }
        let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        Ok(DescribeMultiContainerGroupMetricResponse {
            request_id: "r".into(),
            monitor_datas: request
                .container_group_ids
                .iter()
                .map(|id| {
                    let n: i64 = id.trim_start_matches("eci-").parse().unwrap();
                    MonitorData {
                        container_group_id: id.clone(),
                        records: vec![record(&now, &[("app", 1, n * 1_000_000_000, 1_000)])],
                    }
                })
                .collect(),
        })
    }
}

fn scraper_of(pods: usize, eci: Arc<FakeEci>, ttl: Duration) -> (Scraper, Arc<SharedIndex>) {
    let index = Arc::new(SharedIndex::default());
    index.write(|index| {
        for n in 0..pods {
            index.upsert(entry("ns", &format!("p{n}"), true));
        }
        index.mark_listed();
    });
    let groups =
        GroupDirectory::fixed((0..pods).map(|n| (format!("uid-p{n}"), format!("eci-{n}"))));
    let scraper = Scraper::new(eci, "cn-test".into(), Arc::clone(&index), groups, ttl);
    (scraper, index)
}

#[tokio::test(start_paused = true)]
async fn a_pod_is_measured_by_the_group_the_controller_records_never_by_its_annotation() {
    let eci = Arc::new(FakeEci::default());
    let index = Arc::new(SharedIndex::default());
    // Its author pointed the annotation at another namespace's group, eci-9.
    index.write(|index| {
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("a", "u-a", "Running", Some("eci-9"))));
        index.apply(&Event::InitApply(pod("b", "u-b", "Running", Some("eci-8"))));
        index.apply(&Event::InitDone);
    });
    // The controller knows a's group (eci-3); b's it has not recorded yet.
    let groups = GroupDirectory::fixed([("u-a".to_owned(), "eci-3".to_owned())]);
    let scraper = Scraper::new(
        Arc::clone(&eci) as Backend,
        "cn-test".into(),
        index,
        groups,
        Duration::from_secs(5),
    );
    let snapshot = scraper.snapshot().await.unwrap();
    assert_eq!(*eci.asked.lock().unwrap(), ["eci-3"]);
    assert_eq!(snapshot.pods.len(), 1);
    assert_eq!(snapshot.pods[0].name, "a");
    assert_eq!(snapshot.node.core_nanos, 3_000_000_000, "eci-3's figures");
}

#[tokio::test(start_paused = true)]
async fn concurrent_scrapes_share_one_refresh_per_ttl() {
    let eci = Arc::new(FakeEci {
        latency: Duration::from_millis(200),
        ..FakeEci::default()
    });
    let (scraper, _index) = scraper_of(45, Arc::clone(&eci), Duration::from_secs(5));
    let scrapes: Vec<_> = (0..10)
        .map(|_| {
            let scraper = scraper.clone();
            tokio::spawn(async move { scraper.snapshot().await })
        })
        .collect();
    for scrape in scrapes {
        let snapshot = scrape.await.unwrap().unwrap();
        assert_eq!(snapshot.pods.len(), 45);
        assert_eq!(snapshot.calls, 3);
    }
    assert_eq!(
        eci.calls.load(Ordering::SeqCst),
        3,
        "ten scrapes, one refresh"
    );
    tokio::time::advance(Duration::from_secs(4)).await;
    scraper.snapshot().await.unwrap();
    assert_eq!(eci.calls.load(Ordering::SeqCst), 3, "still fresh");
    tokio::time::advance(Duration::from_secs(2)).await;
    let snapshot = scraper.snapshot().await.unwrap();
    assert_eq!(
        eci.calls.load(Ordering::SeqCst),
        6,
        "stale: one more refresh"
    );
    // Σ n for n in 0..45, in seconds.
    assert_eq!(snapshot.node.core_nanos, 990 * 1_000_000_000);
    assert!(!snapshot.scrape_error());
}

#[tokio::test(start_paused = true)]
async fn a_refresh_outlives_the_scrape_that_started_it() {
    let eci = Arc::new(FakeEci {
        latency: Duration::from_secs(1),
        ..FakeEci::default()
    });
    let (scraper, _index) = scraper_of(5, Arc::clone(&eci), Duration::from_secs(5));
    let first = tokio::spawn({
        let scraper = scraper.clone();
        async move { scraper.snapshot().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    let snapshot = scraper.snapshot().await.unwrap();
    assert_eq!(snapshot.pods.len(), 5);
    assert_eq!(
        eci.calls.load(Ordering::SeqCst),
        1,
        "the aborted scrape's refresh was shared"
    );
}

#[tokio::test(start_paused = true)]
async fn failed_calls_are_reported_and_their_pods_keep_their_figures() {
    let eci = Arc::new(FakeEci::default());
    let (scraper, index) = scraper_of(25, Arc::clone(&eci), Duration::from_secs(5));
    let first = scraper.snapshot().await.unwrap();
    assert_eq!(
        (first.calls, first.failed_calls, first.pods.len()),
        (2, 0, 25)
    );
    // The batch holding eci-7 fails (ids sort as strings: eci-0, eci-1, eci-10 …).
    eci.failing.lock().unwrap().insert("eci-7".into());
    tokio::time::advance(Duration::from_secs(6)).await;
    let second = scraper.snapshot().await.unwrap();
    assert_eq!((second.calls, second.failed_calls), (2, 1));
    assert!(second.scrape_error());
    assert!(second.error.as_deref().unwrap().contains("try later"));
    assert_eq!(
        second.pods.len(),
        25,
        "the failed batch's pods show their previous figures"
    );
    assert_eq!(second.node.core_nanos, first.node.core_nanos);
    let text = resource_metrics(&second.node, &second.pods, second.scrape_error());
    assert!(text.contains("\nresource_scrape_error 1\n"));
    // A pod that leaves while its call fails is dropped, and the node keeps its CPU.
    index.write(|index| index.remove("uid-p7"));
    tokio::time::advance(Duration::from_secs(6)).await;
    let third = scraper.snapshot().await.unwrap();
    assert_eq!(third.pods.len(), 24);
    assert!(third.node.core_nanos >= second.node.core_nanos);
}

#[tokio::test(start_paused = true)]
async fn a_scrape_before_the_first_list_waits_for_it_then_gives_up() {
    let eci = Arc::new(FakeEci::default());
    let index = Arc::new(SharedIndex::default());
    let scraper = Scraper::new(
        eci,
        "cn-test".into(),
        Arc::clone(&index),
        GroupDirectory::fixed([("uid-p1".to_owned(), "eci-1".to_owned())]),
        Duration::from_secs(5),
    );
    let late_list = tokio::spawn({
        let index = Arc::clone(&index);
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            index.write(|index| {
                index.upsert(entry("ns", "p1", true));
                index.mark_listed();
            });
        }
    });
    let snapshot = scraper.snapshot().await.unwrap();
    assert_eq!(snapshot.pods.len(), 1);
    late_list.await.unwrap();

    let unlisted = Scraper::new(
        Arc::new(FakeEci::default()),
        "cn-test".into(),
        Arc::new(SharedIndex::default()),
        GroupDirectory::default(),
        Duration::from_secs(5),
    );
    assert!(matches!(
        unlisted.snapshot().await,
        Err(MetricsError::NotListed)
    ));
}
