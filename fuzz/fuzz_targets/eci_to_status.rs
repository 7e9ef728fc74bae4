//! ECI answers → pod status: a pod (JSON), a NUL byte, then what ECI answered — an OpenAPI JSON
//! body (`DescribeContainerGroups` or `DescribeContainerGroupStatus`, read by the OpenAPI
//! client's parser) or a protobuf `DescribeContainerGroupStatusResponse` (the gRPC backend's).
//! Each group's status becomes the pod's (`from_eci::pod_status`), and the pod showing it is
//! refreshed and lost (`refresh`, `lost`). No answer panics; the status written is a Kubernetes
//! PodStatus made of only the fields this daemon owns, and its fingerprint does not depend on
//! the time it was computed at.

#![no_main]

use std::time::{Duration, SystemTime};

use eci_proto::v20180808::{
    ContainerGroupStatus, DescribeContainerGroupStatusResponse, DescribeContainerGroupsResponse,
};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use serde_json::Value;
use virtual_node_eci::eci::openapi::response::{self, StatusPage};
use vne_core::from_eci;

/// 2026-11-21T08:00:00Z: fixed, so a crash reproduces.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_248_000)
}

fn statuses(answer: &[u8]) -> Vec<ContainerGroupStatus> {
    match serde_json::from_slice::<Value>(answer) {
        Ok(body @ Value::Object(_)) => {
            let mut out: Vec<ContainerGroupStatus> = response::parse::<
                DescribeContainerGroupsResponse,
            >(
                "DescribeContainerGroups", body.clone()
            )
            .map(|page| {
                page.container_groups
                    .into_iter()
                    .map(response::group_status)
                    .collect()
            })
            .unwrap_or_default();
            if let Ok(page) = StatusPage::parse(body) {
                out.extend(page.data.into_iter().map(|entry| entry.into_status()));
            }
            out
        }
        Ok(_) => Vec::new(),
        Err(_) => DescribeContainerGroupStatusResponse::decode(answer)
            .map(|page| page.data)
            .unwrap_or_default(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&b| b == 0) else {
        return;
    };
    let Ok(pod) = serde_json::from_slice::<Pod>(&data[..split]) else {
        return;
    };
    for group in statuses(&data[split + 1..]) {
        let status = from_eci::pod_status(&pod, &group, now());
        assert_eq!(
            from_eci::owned(&status),
            status,
            "the status carries only fields this daemon owns"
        );
        let later = from_eci::pod_status(&pod, &group, now() + Duration::from_secs(3600));
        assert_eq!(
            from_eci::fingerprint(&later),
            from_eci::fingerprint(&status),
            "the fingerprint depends on the time"
        );
        if let Some(ip) = status.get("podIP") {
            let ip = ip.as_str().expect("the pod IP is text");
            assert!(
                ip.parse::<std::net::IpAddr>().is_ok(),
                "the API server refuses a pod IP of {ip:?}"
            );
        }
        let typed: PodStatus = serde_json::from_value(status.clone())
            .unwrap_or_else(|error| panic!("not a PodStatus: {error}: {status}"));
        let mut shown = pod.clone();
        shown.status = Some(typed);
        let _ = from_eci::refresh(&shown, now());
        let lost = from_eci::lost(&shown, "ProviderFailed", "the group is gone", now());
        let _: PodStatus = serde_json::from_value(lost.clone()).unwrap_or_else(|error| {
            panic!("a lost pod's status is not a PodStatus: {error}: {lost}")
        });
    }
});
