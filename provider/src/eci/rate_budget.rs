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
//!
//! When a bucket runs short, the calls waiting for it are served by [`Lane`], round robin:
//! each namespace (the namespace of the pod a call is for) is one lane and the daemon's own
//! work another, so a tenant that loops one action gets one turn in each round like everyone
//! else instead of the whole budget (first come, first served let a loop of `kubectl logs`
//! hold another namespace's logs for over a minute).

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
use eci_proto::v20180808::{
    CreateImageCacheRequest, CreateImageCacheResponse, DeleteImageCacheRequest,
    DeleteImageCacheResponse, DescribeImageCachesRequest, DescribeImageCachesResponse,
    UpdateImageCacheRequest, UpdateImageCacheResponse,
};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{Backend, EciBackend, ImageCacheBackend, ImageCaches};

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

tokio::task_local! {
    /// The lane of the calls made inside [`Lane::run`].
    static LANE: Lane;
}

/// Whose turn a call waits in when its action's budget is short. Waiting calls are served
/// one lane at a time, round robin, so a namespace that floods one action (a loop of
/// `kubectl logs`) waits behind its own calls, not in front of another namespace's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The daemon's own work (status polls, listings, the pod controller's creates and
    /// deletes): one more participant, served in turn with the namespaces. Calls outside
    /// any [`Lane::run`] are the daemon's.
    Daemon,
    /// Calls made for a pod of this namespace: the namespace of the pod the daemon resolved
    /// itself, never a field a caller wrote.
    Namespace(Arc<str>),
}

impl Lane {
    /// The lane of a pod in `namespace`.
    pub fn namespace(namespace: &str) -> Self {
        Self::Namespace(Arc::from(namespace))
    }

    /// Runs `calls` with their paced ECI calls waiting in this lane (pages the backend
    /// fetches inside one call included).
    pub async fn run<F: Future>(self, calls: F) -> F::Output {
        LANE.scope(self, calls).await
    }

    /// The lane of the calls being made now.
    fn current() -> Self {
        LANE.try_with(Clone::clone).unwrap_or(Self::Daemon)
    }
}

/// Waiters by lane, served in turn (pure): the lane at the front gives its oldest waiter,
/// then goes to the back if it has more; a lane that starts waiting joins at the back.
#[derive(Debug)]
struct Turns<T> {
    lanes: VecDeque<(Lane, VecDeque<T>)>,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Self {
            lanes: VecDeque::new(),
        }
    }
}

impl<T> Turns<T> {
    fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    fn push(&mut self, lane: Lane, waiter: T) {
        match self.lanes.iter_mut().find(|(queued, _)| *queued == lane) {
            Some((_, waiters)) => waiters.push_back(waiter),
            None => self.lanes.push_back((lane, VecDeque::from([waiter]))),
        }
    }

    /// The waiter served next.
    fn next(&self) -> Option<&T> {
        self.lanes.front().and_then(|(_, waiters)| waiters.front())
    }

    /// Serves the next waiter: its lane's turn passes to the following lane.
    fn serve(&mut self) -> Option<T> {
        let (lane, mut waiters) = self.lanes.pop_front()?;
        let served = waiters.pop_front();
        if !waiters.is_empty() {
            self.lanes.push_back((lane, waiters));
        }
        served
    }

    /// Takes out the first waiter `is_it` matches (one that stopped waiting), keeping
    /// every lane's place.
    fn remove(&mut self, is_it: impl Fn(&T) -> bool) -> Option<T> {
        let at = self
            .lanes
            .iter()
            .position(|(_, waiters)| waiters.iter().any(&is_it))?;
        let waiters = &mut self.lanes[at].1;
        let removed = waiters
            .iter()
            .position(&is_it)
            .and_then(|index| waiters.remove(index));
        if waiters.is_empty() {
            self.lanes.remove(at);
        }
        removed
    }
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

    /// Adds what has dripped in since the last look, rescaled to `replicas`' share.
    fn refill(&mut self, action: &str, replicas: u32, now: Instant) {
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
    }

    /// Takes one token, or says how long until one is there.
    fn take(&mut self) -> Option<Duration> {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return None;
        }
        Some(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.share.per_second,
        ))
    }
}

/// A call waiting for its action's budget: woken when its turn comes.
#[derive(Debug)]
struct Waiter {
    id: u64,
    wake: Arc<Notify>,
}

/// One action's bucket and the calls waiting for it.
#[derive(Debug)]
struct ActionBudget {
    bucket: Bucket,
    turns: Turns<Waiter>,
}

impl ActionBudget {
    /// Tells the waiter whose turn it now is (it may be asleep behind another's turn).
    fn wake_next(&self) {
        if let Some(next) = self.turns.next() {
            next.wake.notify_one();
        }
    }
}

/// Token buckets by action name, sized to this replica's share, each shared between lanes
/// in turn when short.
#[derive(Debug)]
pub struct Pacer {
    replicas: ReplicaCount,
    actions: Mutex<HashMap<&'static str, ActionBudget>>,
    next_waiter: AtomicU64,
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
            actions: Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(0),
        }
    }

    /// The replicas the shares are divided among now.
    pub fn replicas(&self) -> u32 {
        (*self.replicas.borrow()).max(1)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<&'static str, ActionBudget>> {
        self.actions.lock()
    }

    /// Waits until `action` may be called, in the turn of the current [`Lane`]: at once
    /// while the bucket has a token and nobody waits, else when the lane's turn comes and
    /// a token is there.
    pub async fn acquire(&self, action: &'static str) {
        let replicas = self.replicas();
        let waiter = {
            let mut actions = self.lock();
            let now = Instant::now();
            let budget = actions.entry(action).or_insert_with(|| ActionBudget {
                bucket: Bucket::new(action, replicas, now),
                turns: Turns::default(),
            });
            budget.bucket.refill(action, replicas, now);
            if budget.turns.is_empty() && budget.bucket.take().is_none() {
                return;
            }
            let waiter = Queued {
                pacer: self,
                action,
                id: self.next_waiter.fetch_add(1, Ordering::Relaxed),
                wake: Arc::new(Notify::new()),
                served: false,
            };
            budget.turns.push(
                Lane::current(),
                Waiter {
                    id: waiter.id,
                    wake: Arc::clone(&waiter.wake),
                },
            );
            waiter
        };
        waiter.wait().await;
    }
}

/// A queued call; dropping it before its turn (the caller went away) passes the turn on.
struct Queued<'a> {
    pacer: &'a Pacer,
    action: &'static str,
    id: u64,
    wake: Arc<Notify>,
    served: bool,
}

impl Queued<'_> {
    async fn wait(mut self) {
        loop {
            let sleep = {
                let mut actions = self.pacer.lock();
                let Some(budget) = actions.get_mut(self.action) else {
                    return;
                };
                if budget.turns.next().map(|next| next.id) == Some(self.id) {
                    let replicas = self.pacer.replicas();
                    budget.bucket.refill(self.action, replicas, Instant::now());
                    match budget.bucket.take() {
                        None => {
                            budget.turns.serve();
                            budget.wake_next();
                            self.served = true;
                            return;
                        }
                        Some(wait) => Some(wait),
                    }
                } else {
                    None
                }
            };
            match sleep {
                // Only the waiter whose turn it is watches the clock.
                Some(wait) => tokio::time::sleep(wait).await,
                None => self.wake.notified().await,
            }
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.served {
            return;
        }
        let mut actions = self.pacer.lock();
        if let Some(budget) = actions.get_mut(self.action) {
            let was_next = budget.turns.next().map(|next| next.id) == Some(self.id);
            budget.turns.remove(|waiter| waiter.id == self.id);
            if was_next {
                budget.wake_next();
            }
        }
    }
}

/// A backend whose calls are paced by a [`Pacer`] (unless pacing is off) and counted by
/// action and result. Calls that change nothing — listing pages, logs, exec sessions,
/// metrics — are retried when throttled (see [`super::paging`]): the account's quota is
/// shared with whatever else uses it, so a paced call can still be refused, and a user's
/// `kubectl logs` or `exec` should wait a moment rather than fail. Creates, deletes and
/// updates are retried by their controllers.
///
/// It wraps the pod paths' [`Backend`] and, as `Paced<ImageCaches>`, the image-cache
/// reconciler's backend: the image-cache actions have no documented quota, so they get
/// [`UNKNOWN_ACTION_PER_MINUTE`], undivided (a pacer of their own counting one replica: only
/// the elected replica calls them).
pub struct Paced<B = Backend> {
    inner: B,
    pacer: Option<Arc<Pacer>>,
    telemetry: Arc<crate::ops::metrics::Telemetry>,
}

impl<B> std::fmt::Debug for Paced<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paced")
            .field("pacer", &self.pacer)
            .finish_non_exhaustive()
    }
}

impl<B> Paced<B> {
    /// Paces (with `pacer`, when given) and meters `inner`.
    pub fn new(
        inner: B,
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
        $api:ident for $inner:ty;
        calls { $($method:ident($action:literal, $request:ty) -> $response:ty;)+ }
        retried { $($page:ident($page_action:literal, $page_request:ty) -> $page_response:ty;)+ }
    ) => {
        #[async_trait::async_trait]
        impl $api for Paced<$inner> {
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
    EciBackend for Backend;
    calls {
    create_container_group("CreateContainerGroup", CreateContainerGroupRequest) -> CreateContainerGroupResponse;
    delete_container_group("DeleteContainerGroup", DeleteContainerGroupRequest) -> DeleteContainerGroupResponse;
    update_container_group("UpdateContainerGroup", UpdateContainerGroupRequest) -> UpdateContainerGroupResponse;
    restart_container_group("RestartContainerGroup", RestartContainerGroupRequest) -> RestartContainerGroupResponse;
    }
    retried {
    describe_container_log("DescribeContainerLog", DescribeContainerLogRequest) -> DescribeContainerLogResponse;
    exec_container_command("ExecContainerCommand", ExecContainerCommandRequest) -> ExecContainerCommandResponse;
    describe_container_group_metric("DescribeContainerGroupMetric", DescribeContainerGroupMetricRequest) -> DescribeContainerGroupMetricResponse;
    describe_multi_container_group_metric("DescribeMultiContainerGroupMetric", DescribeMultiContainerGroupMetricRequest) -> DescribeMultiContainerGroupMetricResponse;
    describe_container_groups("DescribeContainerGroups", DescribeContainerGroupsRequest) -> DescribeContainerGroupsResponse;
    describe_container_group_status("DescribeContainerGroupStatus", DescribeContainerGroupStatusRequest) -> DescribeContainerGroupStatusResponse;
    }
}

paced! {
    ImageCacheBackend for ImageCaches;
    calls {
    create_image_cache("CreateImageCache", CreateImageCacheRequest) -> CreateImageCacheResponse;
    update_image_cache("UpdateImageCache", UpdateImageCacheRequest) -> UpdateImageCacheResponse;
    delete_image_cache("DeleteImageCache", DeleteImageCacheRequest) -> DeleteImageCacheResponse;
    }
    retried {
    describe_image_caches("DescribeImageCaches", DescribeImageCachesRequest) -> DescribeImageCachesResponse;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ECI that throttles the first call of each action it is asked, then answers.
    #[derive(Debug, Default)]
    struct ThrottlesOnce {
        asked: Mutex<HashMap<&'static str, u32>>,
    }

    impl ThrottlesOnce {
        fn answer<T: Default>(&self, action: &'static str) -> Result<T, EciError> {
            let mut asked = self.asked.lock();
            let count = asked.entry(action).or_default();
            *count += 1;
            if *count == 1 {
                Err(EciError::new(
                    "Throttling.User",
                    "another client spent the quota",
                ))
            } else {
                Ok(T::default())
            }
        }
    }

    macro_rules! throttles_once {
        ($($method:ident($action:literal, $request:ty) -> $response:ty;)+) => {
            #[async_trait::async_trait]
            impl EciBackend for ThrottlesOnce {
                $(async fn $method(&self, _: $request) -> Result<$response, EciError> {
                    self.answer($action)
                })+
            }
        };
    }

    throttles_once! {
        create_container_group("CreateContainerGroup", CreateContainerGroupRequest) -> CreateContainerGroupResponse;
        delete_container_group("DeleteContainerGroup", DeleteContainerGroupRequest) -> DeleteContainerGroupResponse;
        update_container_group("UpdateContainerGroup", UpdateContainerGroupRequest) -> UpdateContainerGroupResponse;
        restart_container_group("RestartContainerGroup", RestartContainerGroupRequest) -> RestartContainerGroupResponse;
        describe_container_log("DescribeContainerLog", DescribeContainerLogRequest) -> DescribeContainerLogResponse;
        exec_container_command("ExecContainerCommand", ExecContainerCommandRequest) -> ExecContainerCommandResponse;
        describe_container_group_metric("DescribeContainerGroupMetric", DescribeContainerGroupMetricRequest) -> DescribeContainerGroupMetricResponse;
        describe_multi_container_group_metric("DescribeMultiContainerGroupMetric", DescribeMultiContainerGroupMetricRequest) -> DescribeMultiContainerGroupMetricResponse;
        describe_container_groups("DescribeContainerGroups", DescribeContainerGroupsRequest) -> DescribeContainerGroupsResponse;
        describe_container_group_status("DescribeContainerGroupStatus", DescribeContainerGroupStatusRequest) -> DescribeContainerGroupStatusResponse;
    }

    #[tokio::test(start_paused = true)]
    async fn calls_that_change_nothing_wait_out_a_throttle_and_the_others_report_it() {
        let throttles_once: Backend = Arc::new(ThrottlesOnce::default());
        let paced = Paced::new(
            throttles_once,
            Some(Arc::new(Pacer::default())),
            Arc::new(crate::ops::metrics::Telemetry::new()),
        );
        // What a user waits on (logs, exec, metrics) and listings: retried.
        assert!(
            paced
                .describe_container_log(Default::default())
                .await
                .is_ok()
        );
        assert!(
            paced
                .exec_container_command(Default::default())
                .await
                .is_ok()
        );
        assert!(
            paced
                .describe_container_group_metric(Default::default())
                .await
                .is_ok()
        );
        assert!(
            paced
                .describe_multi_container_group_metric(Default::default())
                .await
                .is_ok()
        );
        assert!(
            paced
                .describe_container_groups(Default::default())
                .await
                .is_ok()
        );
        assert!(
            paced
                .describe_container_group_status(Default::default())
                .await
                .is_ok()
        );
        // Changes: their controllers retry them with what they know (tokens, deadlines).
        let refused = paced.create_container_group(Default::default()).await;
        assert_eq!(
            refused.map(|_| ()).map_err(|e| e.code),
            Err("Throttling.User".to_owned())
        );
        assert!(
            paced
                .delete_container_group(Default::default())
                .await
                .is_err()
        );
    }

    /// An image-cache backend that answers every call (and throttles nothing).
    struct Answers;

    #[async_trait::async_trait]
    impl ImageCacheBackend for Answers {
        async fn create_image_cache(
            &self,
            _: CreateImageCacheRequest,
        ) -> Result<CreateImageCacheResponse, EciError> {
            Ok(CreateImageCacheResponse::default())
        }
        async fn describe_image_caches(
            &self,
            _: DescribeImageCachesRequest,
        ) -> Result<DescribeImageCachesResponse, EciError> {
            Ok(DescribeImageCachesResponse::default())
        }
        async fn update_image_cache(
            &self,
            _: UpdateImageCacheRequest,
        ) -> Result<UpdateImageCacheResponse, EciError> {
            Ok(UpdateImageCacheResponse::default())
        }
        async fn delete_image_cache(
            &self,
            _: DeleteImageCacheRequest,
        ) -> Result<DeleteImageCacheResponse, EciError> {
            Ok(DeleteImageCacheResponse::default())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn image_cache_calls_draw_from_their_own_buckets() {
        let caches: ImageCaches = Arc::new(Answers);
        let paced = Paced::new(
            caches,
            Some(Arc::new(Pacer::default())),
            Arc::new(crate::ops::metrics::Telemetry::new()),
        );
        let start = Instant::now();
        // No documented quota: 500 per minute, burst 50.
        for _ in 0..50 {
            paced
                .describe_image_caches(Default::default())
                .await
                .unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst passes at once");
        paced
            .describe_image_caches(Default::default())
            .await
            .unwrap();
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (0.119..0.121).contains(&elapsed),
            "then one call per 120 ms: {elapsed}"
        );
        // Creating one is another action, with a full bucket.
        let before = Instant::now();
        paced.create_image_cache(Default::default()).await.unwrap();
        assert_eq!(before.elapsed(), Duration::ZERO);
    }

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

    #[test]
    fn waiting_lanes_are_served_in_turn() {
        // (lane, waiter) in the order they started waiting → the order they are served.
        for (pushed, served) in [
            (vec![("a", 1), ("a", 2), ("a", 3)], vec![1, 2, 3]),
            (
                vec![("a", 1), ("a", 2), ("a", 3), ("b", 4), ("d", 5)],
                vec![1, 4, 5, 2, 3],
            ),
            (
                vec![("a", 1), ("b", 2), ("a", 3), ("b", 4), ("c", 5)],
                vec![1, 2, 5, 3, 4],
            ),
            (vec![], vec![]),
        ] {
            let mut turns = Turns::default();
            for (lane, waiter) in &pushed {
                let lane = if *lane == "d" {
                    Lane::Daemon
                } else {
                    Lane::namespace(lane)
                };
                turns.push(lane, *waiter);
            }
            let mut order = Vec::new();
            while let Some(waiter) = turns.serve() {
                order.push(waiter);
            }
            assert_eq!(order, served, "{pushed:?}");
            assert!(turns.is_empty());
        }
    }

    #[test]
    fn a_lane_that_comes_back_joins_at_the_back() {
        let mut turns = Turns::default();
        turns.push(Lane::namespace("a"), 1);
        turns.push(Lane::namespace("b"), 2);
        assert_eq!(turns.serve(), Some(1));
        // `a` had nothing more waiting: its next call is behind `b`'s.
        turns.push(Lane::namespace("a"), 3);
        turns.push(Lane::namespace("b"), 4);
        assert_eq!(turns.next(), Some(&2));
        assert_eq!(turns.remove(|w| *w == 2), Some(2));
        // `b` keeps its place at the front with its next waiter.
        assert_eq!(turns.serve(), Some(4));
        assert_eq!(turns.serve(), Some(3));
        assert_eq!(turns.remove(|w| *w == 9), None);
        assert!(turns.is_empty());
    }

    /// Starts `calls` calls of `action` in `lane`, each reporting when it was let through.
    fn flood(
        pacer: &Arc<Pacer>,
        lane: &Lane,
        action: &'static str,
        calls: usize,
        done: &tokio::sync::mpsc::UnboundedSender<(Lane, Instant)>,
    ) -> tokio::task::JoinSet<()> {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..calls {
            let (pacer, lane, done) = (Arc::clone(pacer), lane.clone(), done.clone());
            tasks.spawn(async move {
                lane.clone().run(pacer.acquire(action)).await;
                let _ = done.send((lane, Instant::now()));
            });
        }
        tasks
    }

    #[tokio::test(start_paused = true)]
    async fn one_namespace_flooding_an_action_leaves_the_others_their_turn() {
        let pacer = Arc::new(Pacer::default());
        // DescribeContainerLog: 500 per minute, burst 50; the loop empties the burst and
        // queues 200 more.
        let (done, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _loop = flood(
            &pacer,
            &Lane::namespace("a"),
            "DescribeContainerLog",
            250,
            &done,
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        let start = Instant::now();
        let victim = Lane::namespace("b").run(pacer.acquire("DescribeContainerLog"));
        let daemon = pacer.acquire("DescribeContainerLog");
        tokio::join!(victim, daemon);
        let elapsed = start.elapsed().as_secs_f64();
        // One token every 120 ms: the loop's next call, then `b`'s, then the daemon's.
        assert!(
            elapsed < 0.361,
            "the other lanes wait one round, not 200 calls: {elapsed}"
        );
        drop(done);
        let mut loop_calls = 0;
        while let Some((lane, _)) = served.recv().await {
            assert_eq!(lane, Lane::namespace("a"));
            loop_calls += 1;
        }
        assert_eq!(loop_calls, 250, "the loop itself is served in full");
    }

    #[tokio::test(start_paused = true)]
    async fn lanes_share_a_short_budget_equally() {
        let pacer = Arc::new(Pacer::default());
        let (done, mut served) = tokio::sync::mpsc::unbounded_channel();
        let lanes = [Lane::namespace("a"), Lane::namespace("b"), Lane::Daemon];
        let mut tasks = Vec::new();
        // `a` floods; `b` and the daemon ask for a few each.
        for (lane, calls) in lanes.iter().zip([300, 30, 30]) {
            tasks.push(flood(&pacer, lane, "ExecContainerCommand", calls, &done));
        }
        drop(done);
        let mut order = Vec::new();
        while let Some((lane, _)) = served.recv().await {
            order.push(lane);
        }
        // After the burst (50 to whoever came first), the 90 calls that follow alternate.
        let after_burst = &order[50..140];
        for lane in &lanes[1..] {
            let share = after_burst.iter().filter(|l| *l == lane).count();
            assert!(
                (25..=30).contains(&share),
                "{lane:?}: {share} of 90 turns while all three waited"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_goes_away_passes_its_turn_on() {
        let pacer = Arc::new(Pacer::default());
        for _ in 0..50 {
            pacer.acquire("DescribeContainerLog").await;
        }
        // Whose turn it is gives up (a client disconnected) while waiting for the clock.
        let gone = {
            let pacer = Arc::clone(&pacer);
            tokio::spawn(async move {
                Lane::namespace("a")
                    .run(pacer.acquire("DescribeContainerLog"))
                    .await;
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let start = Instant::now();
        let next = Lane::namespace("b").run(pacer.acquire("DescribeContainerLog"));
        tokio::pin!(next);
        tokio::select! {
            () = &mut next => panic!("served before the token"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        gone.abort();
        next.await;
        let elapsed = start.elapsed().as_secs_f64();
        assert!((0.118..0.121).contains(&elapsed), "{elapsed}");
    }
}
