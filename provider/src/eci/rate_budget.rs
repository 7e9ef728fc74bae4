//! Client-side pacing: one token bucket per ECI action, shared by every call the daemon makes,
//! sized from the documented quotas — the daemon slows itself down instead of drawing
//! `Throttling.User` answers (which it still retries when other clients share the quota).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use eci_proto::EciError;
use eci_proto::v20180808::{
    CreateContainerGroupRequest, CreateContainerGroupResponse, DeleteContainerGroupRequest,
    DeleteContainerGroupResponse, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupStatusResponse, DescribeContainerGroupsRequest,
    DescribeContainerGroupsResponse, DescribeContainerLogRequest, DescribeContainerLogResponse,
    DescribeMultiContainerGroupMetricRequest, DescribeMultiContainerGroupMetricResponse,
    ExecContainerCommandRequest, ExecContainerCommandResponse, RestartContainerGroupRequest,
    RestartContainerGroupResponse, UpdateContainerGroupRequest, UpdateContainerGroupResponse,
};
use tokio::time::Instant;

use super::{Backend, EciBackend};

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    capacity: f64,
    per_second: f64,
    updated: Instant,
}

/// Token buckets by action name.
#[derive(Debug, Default)]
pub struct Pacer {
    buckets: Mutex<HashMap<&'static str, Bucket>>,
}

impl Pacer {
    /// Waits until `action` may be called.
    pub async fn acquire(&self, action: &'static str) {
        loop {
            let wait = {
                let mut buckets = self
                    .buckets
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let bucket = buckets.entry(action).or_insert_with(|| {
                    let per_minute = eci_proto::quota::per_minute(action).unwrap_or(500);
                    let capacity = f64::from(eci_proto::quota::burst(per_minute));
                    Bucket {
                        tokens: capacity,
                        capacity,
                        per_second: f64::from(per_minute) / 60.0,
                        updated: Instant::now(),
                    }
                });
                let now = Instant::now();
                bucket.tokens = (bucket.tokens
                    + now.duration_since(bucket.updated).as_secs_f64() * bucket.per_second)
                    .min(bucket.capacity);
                bucket.updated = now;
                if bucket.tokens >= 1.0 {
                    bucket.tokens -= 1.0;
                    return;
                }
                Duration::from_secs_f64((1.0 - bucket.tokens) / bucket.per_second)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// A backend whose calls are paced by a [`Pacer`] (unless pacing is off) and counted by
/// action and result.
pub struct Paced {
    inner: Backend,
    pacer: Option<Pacer>,
    telemetry: std::sync::Arc<crate::ops::metrics::Telemetry>,
}

impl std::fmt::Debug for Paced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paced")
            .field("pacer", &self.pacer)
            .finish_non_exhaustive()
    }
}

impl Paced {
    /// Paces (when `pace`) and meters `inner`.
    pub fn new(
        inner: Backend,
        pace: bool,
        telemetry: std::sync::Arc<crate::ops::metrics::Telemetry>,
    ) -> Self {
        Self {
            inner,
            pacer: pace.then(Pacer::default),
            telemetry,
        }
    }

    fn record<T>(&self, action: &'static str, result: &Result<T, EciError>) {
        let result = match result {
            Ok(_) => "ok".to_owned(),
            Err(error) => error.code.clone(),
        };
        self.telemetry
            .eci_calls
            .get_or_create(&crate::ops::metrics::EciLabels { action, result })
            .inc();
    }
}

macro_rules! paced {
    ($($method:ident($action:literal, $request:ty) -> $response:ty;)+) => {
        #[async_trait::async_trait]
        impl EciBackend for Paced {
            $(async fn $method(&self, request: $request) -> Result<$response, EciError> {
                if let Some(pacer) = &self.pacer {
                    pacer.acquire($action).await;
                }
                let result = self.inner.$method(request).await;
                self.record($action, &result);
                result
            })+
        }
    };
}

paced! {
    create_container_group("CreateContainerGroup", CreateContainerGroupRequest) -> CreateContainerGroupResponse;
    describe_container_groups("DescribeContainerGroups", DescribeContainerGroupsRequest) -> DescribeContainerGroupsResponse;
    describe_container_group_status("DescribeContainerGroupStatus", DescribeContainerGroupStatusRequest) -> DescribeContainerGroupStatusResponse;
    delete_container_group("DeleteContainerGroup", DeleteContainerGroupRequest) -> DeleteContainerGroupResponse;
    update_container_group("UpdateContainerGroup", UpdateContainerGroupRequest) -> UpdateContainerGroupResponse;
    restart_container_group("RestartContainerGroup", RestartContainerGroupRequest) -> RestartContainerGroupResponse;
    describe_container_log("DescribeContainerLog", DescribeContainerLogRequest) -> DescribeContainerLogResponse;
    exec_container_command("ExecContainerCommand", ExecContainerCommandRequest) -> ExecContainerCommandResponse;
    describe_container_group_metric("DescribeContainerGroupMetric", DescribeContainerGroupMetricRequest) -> DescribeContainerGroupMetricResponse;
    describe_multi_container_group_metric("DescribeMultiContainerGroupMetric", DescribeMultiContainerGroupMetricRequest) -> DescribeMultiContainerGroupMetricResponse;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_sustained_rate() {
        let pacer = Pacer::default();
        let start = Instant::now();
        // CreateContainerGroup: 1000 per minute, burst 100.
        for _ in 0..100 {
            pacer.acquire("CreateContainerGroup").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst passes at once");
        pacer.acquire("CreateContainerGroup").await;
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (0.059..0.061).contains(&elapsed),
            "then one call per 60 ms: {elapsed}"
        );
        // Another action has its own bucket.
        let before = Instant::now();
        pacer.acquire("DeleteContainerGroup").await;
        assert_eq!(before.elapsed(), Duration::ZERO);
    }
}
