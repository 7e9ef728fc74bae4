//! Client-side pacing: one token bucket per ECI action, shared by every call this replica
//! makes, sized to this replica's share of the documented quotas — the daemon slows itself
//! down instead of drawing `Throttling.User` answers (which it still retries when other
//! clients share the quota).
//!
//! ECI's quotas belong to the account and region, not to a process: N replicas of the
//! StatefulSet together may make what one may. So each bucket holds `1/N` of the action's
//! burst and refills at `1/N` of its rate, N being the live replicas the app wiring reports
//! through a [`ReplicaCount`] (this edge does not look at the fleet itself).
//!
//! Why a bucket of our own rather than the `governor` crate: when N changes, the bucket is
//! rescaled in place, keeping how full it is. A limiter rebuilt for the new share starts
//! full, so every membership change (a rollout restarts replicas one by one) would hand each
//! replica a fresh burst and the fleet together would overshoot the account's burst. Waiting
//! also sleeps on tokio's clock, which the tests control.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Backend, EciBackend};

/// The quota assumed for an action the quota table does not know.
const UNKNOWN_ACTION_PER_MINUTE: u32 = 500;

/// How many live replicas share the account's quotas (at least 1), kept current by the app
/// wiring from the fleet's membership.
pub type ReplicaCount = watch::Receiver<u32>;

/// A count for a daemon that shares its quotas with nobody (tests, benchmarks).
pub fn alone() -> ReplicaCount {
    watch::channel(1).1
}

/// One replica's part of one action's quota.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Calls it may make in a burst. Never below one call, or it could make none: with more
    /// replicas than the burst has calls, the fleet's burst exceeds the account's by up to
    /// one call per replica (the rate is still divided exactly).
    pub burst: f64,
    /// Calls per second it may make after the burst.
    pub per_second: f64,
}

/// `replicas`' equal shares of a quota of `per_minute` calls with a burst of `burst` (pure).
pub fn share(per_minute: u32, burst: u32, replicas: u32) -> Share {
    let replicas = f64::from(replicas.max(1));
    Share {
        burst: (f64::from(burst) / replicas).max(1.0),
        per_second: f64::from(per_minute) / 60.0 / replicas,
    }
}

/// The share of `action`'s documented quota for one of `replicas` (pure).
pub fn share_of(action: &str, replicas: u32) -> Share {
    let per_minute = eci_proto::quota::per_minute(action).unwrap_or(UNKNOWN_ACTION_PER_MINUTE);
    share(per_minute, eci_proto::quota::burst(per_minute), replicas)
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    replicas: u32,
    share: Share,
    updated: Instant,
}

impl Bucket {
    fn new(action: &str, replicas: u32, now: Instant) -> Self {
        let share = share_of(action, replicas);
        Self {
            tokens: share.burst,
            replicas,
            share,
            updated: now,
        }
    }

    /// Takes one token, or says how long until one is there.
    fn take(&mut self, action: &str, replicas: u32, now: Instant) -> Option<Duration> {
        self.tokens = (self.tokens
            + now.duration_since(self.updated).as_secs_f64() * self.share.per_second)
            .min(self.share.burst);
        self.updated = now;
        if replicas != self.replicas {
            // Keep how full the bucket is: a joining replica shrinks the others' saved burst
            // at once, a leaving one hands its part back.
            let share = share_of(action, replicas);
            self.tokens *= share.burst / self.share.burst;
            self.share = share;
            self.replicas = replicas;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return None;
        }
        Some(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.share.per_second,
        ))
    }
}

/// Token buckets by action name, sized to this replica's share.
#[derive(Debug)]
pub struct Pacer {
    replicas: ReplicaCount,
    buckets: Mutex<HashMap<&'static str, Bucket>>,
}

impl Default for Pacer {
    fn default() -> Self {
        Self::new(alone())
    }
}

impl Pacer {
    /// A pacer whose shares follow `replicas`.
    pub fn new(replicas: ReplicaCount) -> Self {
        Self {
            replicas,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The replicas the shares are divided among now.
    pub fn replicas(&self) -> u32 {
        (*self.replicas.borrow()).max(1)
    }

    /// Waits until `action` may be called.
    pub async fn acquire(&self, action: &'static str) {
        loop {
            let replicas = self.replicas();
            let wait = {
                let mut buckets = self
                    .buckets
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = Instant::now();
                buckets
                    .entry(action)
                    .or_insert_with(|| Bucket::new(action, replicas, now))
                    .take(action, replicas, now)
            };
            match wait {
                None => return,
                Some(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

/// A backend whose calls are paced by a [`Pacer`] (unless pacing is off) and counted by
/// action and result. Listing pages (`DescribeContainerGroups`,
/// `DescribeContainerGroupStatus`) are retried when throttled (see [`super::paging`]).
pub struct Paced {
    inner: Backend,
    pacer: Option<Arc<Pacer>>,
    telemetry: Arc<crate::ops::metrics::Telemetry>,
}

impl std::fmt::Debug for Paced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paced")
            .field("pacer", &self.pacer)
            .finish_non_exhaustive()
    }
}

impl Paced {
    /// Paces (with `pacer`, when given) and meters `inner`.
    pub fn new(
        inner: Backend,
        pacer: Option<Arc<Pacer>>,
        telemetry: Arc<crate::ops::metrics::Telemetry>,
    ) -> Self {
        Self {
            inner,
            pacer,
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
    (
        calls { $($method:ident($action:literal, $request:ty) -> $response:ty;)+ }
        pages { $($page:ident($page_action:literal, $page_request:ty) -> $page_response:ty;)+ }
    ) => {
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
            $(async fn $page(&self, request: $page_request) -> Result<$page_response, EciError> {
                super::paging::page(self.pacer.as_deref(), $page_action, || async {
                    let result = self.inner.$page(request.clone()).await;
                    self.record($page_action, &result);
                    result
                })
                .await
            })+
        }
    };
}

paced! {
    calls {
    create_container_group("CreateContainerGroup", CreateContainerGroupRequest) -> CreateContainerGroupResponse;
    delete_container_group("DeleteContainerGroup", DeleteContainerGroupRequest) -> DeleteContainerGroupResponse;
    update_container_group("UpdateContainerGroup", UpdateContainerGroupRequest) -> UpdateContainerGroupResponse;
    restart_container_group("RestartContainerGroup", RestartContainerGroupRequest) -> RestartContainerGroupResponse;
    describe_container_log("DescribeContainerLog", DescribeContainerLogRequest) -> DescribeContainerLogResponse;
    exec_container_command("ExecContainerCommand", ExecContainerCommandRequest) -> ExecContainerCommandResponse;
    describe_container_group_metric("DescribeContainerGroupMetric", DescribeContainerGroupMetricRequest) -> DescribeContainerGroupMetricResponse;
    describe_multi_container_group_metric("DescribeMultiContainerGroupMetric", DescribeMultiContainerGroupMetricRequest) -> DescribeMultiContainerGroupMetricResponse;
    }
    pages {
    describe_container_groups("DescribeContainerGroups", DescribeContainerGroupsRequest) -> DescribeContainerGroupsResponse;
    describe_container_group_status("DescribeContainerGroupStatus", DescribeContainerGroupStatusRequest) -> DescribeContainerGroupStatusResponse;
    }
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

    #[test]
    fn each_replica_gets_an_equal_share_burst_included() {
        // (per minute, burst, replicas) → (burst, calls per second)
        for (per_minute, burst, replicas, want_burst, want_per_second) in [
            (1_000, 100, 1, 100.0, 1_000.0 / 60.0),
            (1_000, 100, 0, 100.0, 1_000.0 / 60.0), // unknown yet: counted as alone
            (1_000, 100, 2, 50.0, 500.0 / 60.0),
            (1_000, 100, 10, 10.0, 100.0 / 60.0),
            (2_000, 200, 10, 20.0, 200.0 / 60.0),
            (10_000, 1_000, 3, 1_000.0 / 3.0, 10_000.0 / 180.0),
            (500, 50, 10, 5.0, 50.0 / 60.0),
            (500, 50, 100, 1.0, 5.0 / 60.0), // never below one call
        ] {
            let got = share(per_minute, burst, replicas);
            assert!(
                (got.burst - want_burst).abs() < 1e-9
                    && (got.per_second - want_per_second).abs() < 1e-9,
                "{per_minute}/min burst {burst} over {replicas}: {got:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ten_replicas_each_take_a_tenth() {
        let (_set, replicas) = watch::channel(10);
        let pacer = Pacer::new(replicas);
        let start = Instant::now();
        // CreateContainerGroup: 1000 per minute and a burst of 100 for the account.
        for _ in 0..10 {
            pacer.acquire("CreateContainerGroup").await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a tenth of the burst at once"
        );
        pacer.acquire("CreateContainerGroup").await;
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (0.599..0.601).contains(&elapsed),
            "then a tenth of the rate, one call per 600 ms: {elapsed}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_share_follows_the_membership_without_a_fresh_burst() {
        let (set, replicas) = watch::channel(1);
        let pacer = Pacer::new(replicas);
        for _ in 0..50 {
            pacer.acquire("CreateContainerGroup").await;
        }
        // Half the burst is left; a second replica joins: half of this replica's (now
        // halved) bucket is left, 25 calls, not a new burst of 50.
        set.send_replace(2);
        let start = Instant::now();
        for _ in 0..25 {
            pacer.acquire("CreateContainerGroup").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        pacer.acquire("CreateContainerGroup").await;
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (0.119..0.121).contains(&elapsed),
            "then half the rate, one call per 120 ms: {elapsed}"
        );
        // The other replica leaves: the whole rate again.
        set.send_replace(1);
        let before = Instant::now();
        pacer.acquire("CreateContainerGroup").await;
        let elapsed = before.elapsed().as_secs_f64();
        assert!((0.059..0.061).contains(&elapsed), "{elapsed}");
    }
}
