//! The OpenAPI client's reading of answers: a body as the service (or a proxy in its place)
//! sends it, read as the client does (JSON, then each action's documented shape,
//! `response::parse`; `DescribeContainerGroupStatus` through `StatusPage::parse`). What parses
//! goes on where the daemon takes it: groups become status records (`group_status`,
//! `into_status`), metric records become the kubelet's `/metrics/resource` and
//! `/stats/summary` (`pod_sample`, `NodeCounters`, `resource_metrics`, `summary`), log pages
//! become lines. No body panics.

#![no_main]

use eci_proto::v20180808::{
    CreateContainerGroupResponse, DeleteContainerGroupResponse,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupsResponse,
    DescribeContainerLogResponse, DescribeMultiContainerGroupMetricResponse,
    ExecContainerCommandResponse, MetricRecord, RestartContainerGroupResponse,
    UpdateContainerGroupResponse,
};
use jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::Value;
use virtual_node_eci::eci::openapi::response::{self, StatusPage};
use virtual_node_eci::kubelet::logs;
use vne_core::kubelet_metrics::{
    NodeCounters, PodEntry, PodSample, pod_sample, resource_metrics, summary,
};

fn parse<T: DeserializeOwned>(action: &str, body: &Value) -> Option<T> {
    match response::parse::<T>(action, body.clone()) {
        Ok(parsed) => Some(parsed),
        Err(error) => {
            // The error names the request, as the body does.
            assert_eq!(error.request_id, response::request_id(body));
            None
        }
    }
}

/// A running pod of this node whose containers started at a fixed time.
fn pod() -> PodEntry {
    let at: Timestamp = "2026-11-21T08:00:00Z".parse().expect("a time");
    PodEntry {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: "u-1".into(),
        running: true,
        start_time: Some(at),
        containers: vec![("app".into(), at), ("sidecar".into(), at)],
    }
}

fn metrics(records: &[&[MetricRecord]]) {
    let entry = pod();
    let samples: Vec<PodSample> = records
        .iter()
        .filter_map(|records| pod_sample(&entry, records))
        .collect();
    let mut counters = NodeCounters::default();
    // Two scrapes: the second sees the same samples again (a counter that did not move).
    for _ in 0..2 {
        let node = counters.update(&samples, |_| true);
        let _ = resource_metrics(&node, &samples, false);
        let started: Timestamp = "2026-11-21T07:00:00Z".parse().expect("a time");
        let summary = summary("virtual-node-eci-0", started, &node, &samples, false);
        let _ = serde_json::to_vec(&summary).expect("the summary serializes");
    }
}

fuzz_target!(|data: &[u8]| {
    // As the client reads an answer: JSON, and an object, else it is an error.
    let Ok(body @ Value::Object(_)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = parse::<CreateContainerGroupResponse>("CreateContainerGroup", &body);
    if let Some(page) = parse::<DescribeContainerGroupsResponse>("DescribeContainerGroups", &body) {
        for group in page.container_groups {
            let _ = response::group_status(group);
        }
    }
    let _ = parse::<DeleteContainerGroupResponse>("DeleteContainerGroup", &body);
    let _ = parse::<UpdateContainerGroupResponse>("UpdateContainerGroup", &body);
    let _ = parse::<RestartContainerGroupResponse>("RestartContainerGroup", &body);
    if let Some(log) = parse::<DescribeContainerLogResponse>("DescribeContainerLog", &body) {
        let _ = logs::parse_page(&log.content);
    }
    let _ = parse::<ExecContainerCommandResponse>("ExecContainerCommand", &body);
    if let Some(one) =
        parse::<DescribeContainerGroupMetricResponse>("DescribeContainerGroupMetric", &body)
    {
        metrics(&[&one.records]);
    }
    if let Some(many) = parse::<DescribeMultiContainerGroupMetricResponse>(
        "DescribeMultiContainerGroupMetric",
        &body,
    ) {
        let records: Vec<&[MetricRecord]> = many
            .monitor_datas
            .iter()
            .map(|data| data.records.as_slice())
            .collect();
        metrics(&records);
    }
    if let Ok(page) = StatusPage::parse(body) {
        for entry in page.data {
            let _ = entry.into_status();
        }
    }
});
