//! Service account tokens for projected volumes, handled as the kubelet handles them.
//!
//! - **Issue**: one TokenRequest (`serviceaccounts/token`) per distinct `serviceAccountToken`
//!   source of a pod, with the source's audience (none: the apiserver's own) and
//!   `expirationSeconds` (default 3600), bound to the pod (`boundObjectRef` kind Pod, name, uid),
//!   as the pod's service account.
//! - **Refresh**: at 80 % of a token's lifetime or once it is 24 h old, whichever comes first, up
//!   to 10 s early (the kubelet's rule and jitter, decided in [`vne_core::tokens`]), the tokens
//!   that are due are issued again — the others are read back from the group and kept, as the
//!   kubelet's token cache keeps them — and the pod's token volumes are handed to the running group with
//!   `UpdateContainerGroup` (`IncrementalUpdate`, the volumes by name as `ConfigFileVolume`s):
//!   the files change in place, no container is restarted.
//! - **One timer queue** for all pods (a pod waiting for its refresh is a few hundred bytes of
//!   data, not a task), drained by a few workers; a failed attempt is retried with back-off.
//! - **After a restart** the groups adopted from the previous process are described in batches
//!   of 20 and each token found in them (a JWT bound to the group's pod) is scheduled from its
//!   own claims; a group whose token cannot be read is refreshed soon, to be safe.
//!
//! - **Pushes**: the same queue hands a running group its file volumes again when a ConfigMap or
//!   Secret they show changed ([`crate::pods::sources`] says which pods and when), rebuilt from
//!   the objects as they are then, with the tokens the group holds.
//!
//! Tokens are secrets: they are never logged, and [`Token`] hides them from `Debug`.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eci_proto::EciError;
use eci_proto::error::codes;
use eci_proto::v20180808::{DescribeContainerGroupsRequest, UpdateContainerGroupRequest};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{PodsArgs, WithSite};
use crate::eci::{Backend, Lane};
use crate::ops::chain::Chain;
use crate::ops::metrics::{MetricSet as _, Telemetry};
use crate::pods::PodMetrics;
use crate::pods::sources::{Dependents, FileInputs, Seen, Source};
use vne_core::refs::{self, Token, TokenSource};
use vne_core::to_eci::{self, Context, Rejection};
use vne_core::tokens::{self, MAX_JITTER_SECONDS, Unplaced};

/// Refreshes (or batches of inspections) in flight at once.
const IN_FLIGHT: usize = 4;
/// Groups described per call when inspecting adopted groups (the API's maximum).
const INSPECT_BATCH: usize = 20;
/// The longest wait between attempts of a failing refresh: a 600 s token refreshed at 480 s
/// still has two minutes, room for several attempts.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
/// An adopted group whose tokens cannot be read is refreshed within this spread (a restart
/// with thousands of such groups does not refresh them all at once).
const UNREADABLE_SPREAD_SECONDS: u64 = 60;

/// A TokenRequest failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The apiserver refused or could not be reached.
    #[error("cannot issue a token for service account {namespace}/{account}")]
    Request {
        /// The pod's namespace.
        namespace: String,
        /// The service account.
        account: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The answer carried no token.
    #[error(
        "the TokenRequest for service account {namespace}/{account} was answered without a token"
    )]
    Empty {
        /// The pod's namespace.
        namespace: String,
        /// The service account.
        account: String,
    },
}

/// A refresh (or an inspection) failed.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// The pod could not be read.
    #[error("cannot read the pod")]
    ReadPod(#[source] kube::Error),
    /// A ConfigMap or Secret a token volume projects could not be read.
    #[error("cannot read {kind} {name}")]
    Reference {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A token could not be issued.
    #[error("cannot issue the pod's tokens")]
    Token(#[source] TokenError),
    /// The token volumes could not be built (a projected ConfigMap went missing).
    #[error("cannot build the token volumes")]
    Volumes(#[source] Rejection),
    /// ECI refused the update.
    #[error("UpdateContainerGroup failed")]
    Update(#[source] EciError),
    /// ECI could not describe the adopted groups.
    #[error("DescribeContainerGroups failed")]
    Describe(#[source] EciError),
}

impl RefreshError {
    /// Whether another attempt may succeed.
    fn is_retryable(&self) -> bool {
        match self {
            Self::Volumes(rejection) => rejection.retryable,
            // A group `Updating` or `Restarting` takes updates again in a moment; one that
            // finished is noticed through its pod's phase on the next attempt.
            Self::Update(error) => error.is_retryable() || error.code == codes::INCORRECT_STATUS,
            _ => true,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The clock and the dice (the kubelet's rule itself is vne-core's)
// ---------------------------------------------------------------------------------------------

/// A random delay below `limit_seconds` whole seconds.
fn random_seconds(limit_seconds: u64) -> Duration {
    tokens::whole_seconds_below(uuid::Uuid::new_v4().as_u128(), limit_seconds)
}

/// Seconds since the epoch (the clock JWT times are in).
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The wait before attempt `attempt + 1` of a failing refresh: 1 s, doubling, at most 30 s.
fn retry_delay(attempt: u32) -> Duration {
    crate::ops::retry::nth(
        crate::ops::retry::doubling(Duration::from_secs(1), MAX_RETRY_DELAY),
        attempt,
    )
}

// ---------------------------------------------------------------------------------------------
// Issuing
// ---------------------------------------------------------------------------------------------

/// The tokens issued for a pod, and when they are due for a refresh.
#[derive(Debug, Default)]
pub struct Issued {
    /// One per source.
    pub tokens: BTreeMap<TokenSource, Token>,
    /// When the first of them is due (`None` without tokens).
    pub refresh_in: Option<Duration>,
    /// When each is due.
    pub due: BTreeMap<TokenSource, Duration>,
}

/// Issues one token per source for `pod`, as its service account, bound to it.
pub async fn issue(
    client: &kube::Client,
    telemetry: &Telemetry,
    pod: &Pod,
    sources: &BTreeSet<TokenSource>,
) -> Result<Issued, TokenError> {
    let namespace = pod.namespace().unwrap_or_default();
    let account = vne_core::refs::service_account(pod);
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let jitter = random_seconds(MAX_JITTER_SECONDS);
    let mut issued = Issued::default();
    for source in sources {
        let request = source.request_for(pod);
        telemetry.kube_request("token_request");
        let answer = api
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|source| TokenError::Request {
                namespace: namespace.clone(),
                account: account.clone(),
                source,
            })?;
        // The apiserver may shorten the validity (--service-account-max-token-expiration);
        // its answer says what was granted.
        let lifetime = answer
            .spec
            .expiration_seconds
            .unwrap_or(source.expiration_seconds);
        let token = answer
            .status
            .map(|status| status.token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| TokenError::Empty {
                namespace: namespace.clone(),
                account: account.clone(),
            })?;
        issued.tokens.insert(source.clone(), Token::new(token));
        let due = tokens::refresh_delay(Duration::ZERO, lifetime, jitter);
        issued.due.insert(source.clone(), due);
    }
    issued.refresh_in = issued.due.values().min().copied();
    Ok(issued)
}

// ---------------------------------------------------------------------------------------------
// The timer queue (pure data)
// ---------------------------------------------------------------------------------------------

/// A pod whose tokens are kept fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The pod's uid.
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its container group.
    pub group: String,
    /// What is due.
    pub duty: Duty,
    /// Failed attempts so far.
    pub attempt: u32,
}

/// What is due for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    /// Its tokens are due for a refresh.
    Refresh,
    /// Adopted: the tokens in the group were issued by an earlier process, and are read before
    /// anything is scheduled.
    Inspect,
    /// A ConfigMap or Secret it shows as files changed: its file volumes are pushed as they
    /// are now (with any tokens due).
    Push,
}

/// Work due now: one pod's refresh, or up to [`INSPECT_BATCH`] adopted groups to inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    /// Refresh one pod's tokens.
    Refresh(Entry),
    /// Read the tokens of adopted groups.
    Inspect(Vec<Entry>),
}

impl Task {
    fn entries(&self) -> &[Entry] {
        match self {
            Task::Refresh(entry) => std::slice::from_ref(entry),
            Task::Inspect(entries) => entries,
        }
    }
}

/// What became of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Refresh it again after this long.
    After(Duration),
    /// The attempt failed: try again after a back-off.
    Retry,
    /// Nothing more to do (the pod or its group is gone, or it has no tokens).
    Done,
}

/// Every pod's next refresh, ordered by time; one entry per pod. Not the crate's
/// [`crate::pods::workqueue::WorkQueue`] nor a bare `DelayQueue`: a push is merged with what
/// its pod had scheduled (the earlier time, the push's duty) where they let the latest value
/// win — a retry timer firing would replace a waiting push — and inspections due together are
/// taken as one batch (one describe call for up to 20 groups) where they hand out one key.
#[derive(Debug, Default)]
pub struct Schedule {
    due: BTreeMap<(Instant, u64), Entry>,
    by_uid: HashMap<String, (Instant, u64)>,
    seq: u64,
}

impl Schedule {
    /// Schedules `entry` at `at`, replacing what its pod had scheduled — except a push, which
    /// nothing postpones or drops: it keeps the earlier time, and its duty.
    pub fn insert(&mut self, mut at: Instant, mut entry: Entry) {
        if let Some(key) = self.by_uid.remove(&entry.uid)
            && let Some(replaced) = self.due.remove(&key)
            && replaced.duty == Duty::Push
        {
            at = at.min(key.0);
            entry.duty = Duty::Push;
        }
        self.seq += 1;
        let key = (at, self.seq);
        self.by_uid.insert(entry.uid.clone(), key);
        self.due.insert(key, entry);
    }

    /// Drops what pod `uid` had scheduled, if anything.
    pub fn remove(&mut self, uid: &str) {
        if let Some(key) = self.by_uid.remove(uid) {
            self.due.remove(&key);
        }
    }

    /// When the next entry is due.
    pub fn next(&self) -> Option<Instant> {
        self.due.keys().next().map(|(at, _)| *at)
    }

    /// Pods scheduled.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    fn pop_if_due(&mut self, now: Instant, inspect: bool) -> Option<Entry> {
        let (&key, entry) = self.due.iter().next()?;
        if key.0 > now || (entry.duty == Duty::Inspect) != inspect {
            return None;
        }
        let entry = self.due.remove(&key)?;
        self.by_uid.remove(&entry.uid);
        Some(entry)
    }

    /// The work due by `now`: the first due entry, with the inspections due right after it
    /// when it is one (up to a batch).
    pub fn pop(&mut self, now: Instant) -> Option<Task> {
        if let Some(entry) = self.pop_if_due(now, false) {
            return Some(Task::Refresh(entry));
        }
        let mut batch = Vec::new();
        while batch.len() < INSPECT_BATCH {
            match self.pop_if_due(now, true) {
                Some(entry) => batch.push(entry),
                None => break,
            }
        }
        (!batch.is_empty()).then_some(Task::Inspect(batch))
    }
}

// ---------------------------------------------------------------------------------------------
// The refresher
// ---------------------------------------------------------------------------------------------

/// What the refresher does with due work (the real one talks to the apiserver and ECI).
#[async_trait::async_trait]
pub trait Work: Send + Sync + 'static {
    /// Performs a task; one [`Next`] per entry, in order.
    async fn perform(&self, task: &Task) -> Vec<Next>;
}

struct Shared<W> {
    work: W,
    schedule: Mutex<Schedule>,
    wake: Notify,
    unplaced: Mutex<Unplaced<Instant>>,
    /// Which pods show which ConfigMaps and Secrets (shared with the work, which registers
    /// adopted pods when it reads them).
    dependents: Arc<Mutex<Dependents>>,
}

/// Keeps the pods' tokens fresh: one timer queue, drained by [`Refresher::run`].
pub struct Refresher<W> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for Refresher<W> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<W> std::fmt::Debug for Refresher<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refresher")
            .field("scheduled", &self.schedule().len())
            .finish_non_exhaustive()
    }
}

/// The daemon's refresher.
pub type TokenRefresher = Refresher<Renewal>;

impl<W> Refresher<W> {
    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.shared.schedule.lock()
    }

    fn unplaced(&self) -> MutexGuard<'_, Unplaced<Instant>> {
        self.shared.unplaced.lock()
    }

    /// The tokens for creating `pod`'s group: those issued at an earlier attempt for this
    /// pod and still before their refresh point, and new ones for the rest (see [`tokens::Unplaced`]).
    pub async fn issue_for_create(
        &self,
        client: &kube::Client,
        telemetry: &Telemetry,
        pod: &Pod,
        sources: &BTreeSet<TokenSource>,
    ) -> Result<Issued, TokenError> {
        let uid = pod.uid().unwrap_or_default();
        let (reused, missing) = {
            let mut unplaced = self.unplaced();
            let now = Instant::now();
            unplaced.prune(now);
            unplaced.reusable(&uid, sources, now)
        };
        let mut issued = if missing.is_empty() {
            Issued::default()
        } else {
            issue(client, telemetry, pod, &missing).await?
        };
        {
            let mut unplaced = self.unplaced();
            let now = Instant::now();
            for (source, token) in &issued.tokens {
                let due = issued.due.get(source).copied().unwrap_or_default();
                unplaced.keep(&uid, source.clone(), token.clone(), now + due);
            }
        }
        for (source, (token, left)) in reused {
            issued.due.insert(source.clone(), left);
            issued.tokens.insert(source, token);
        }
        issued.refresh_in = issued.due.values().min().copied();
        Ok(issued)
    }
}

impl<W: Work> Refresher<W> {
    /// A refresher doing `work`.
    pub fn with_work(work: W) -> Self {
        Self::with_dependents(work, Arc::default())
    }

    fn with_dependents(work: W, dependents: Arc<Mutex<Dependents>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                work,
                schedule: Mutex::new(Schedule::default()),
                wake: Notify::new(),
                unplaced: Mutex::new(Unplaced::default()),
                dependents,
            }),
        }
    }

    fn insert(&self, at: Instant, entry: Entry) {
        self.schedule().insert(at, entry);
        // A permit is kept when the loop is busy: it looks at the queue again afterwards.
        self.shared.wake.notify_one();
    }

    /// A pod whose group was just created: the objects it shows as files are watched for
    /// changes, and its tokens (when it has any) are refreshed `refresh_in` from now.
    pub fn track(&self, pod: &Pod, group: &str, refresh_in: Option<Duration>) {
        let Some(uid) = pod.uid() else { return };
        self.unplaced().forget(&uid);
        let entry = Entry {
            uid,
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            group: group.to_owned(),
            duty: Duty::Refresh,
            attempt: 0,
        };
        self.shared
            .dependents
            .lock()
            .register(entry.clone(), FileInputs::of(pod));
        if let Some(refresh_in) = refresh_in {
            self.insert(Instant::now() + refresh_in, entry);
        }
    }

    /// The watch of ConfigMaps and Secrets saw `source`: the pods that show it get their file
    /// volumes pushed now.
    pub fn source_observed(&self, source: &Source, version: Option<&str>, seen: Seen) {
        let concerned = self
            .shared
            .dependents
            .lock()
            .observed(source, version, seen);
        if concerned.is_empty() {
            return;
        }
        debug!(kind = ?source.kind, namespace = %source.namespace, name = %source.name, pods = concerned.len(), "volume source changed; pushing the files to the running groups");
        self.push(concerned);
    }

    /// The pod watch saw a running `pod`: when its downward API files show labels or
    /// annotations and those changed, its file volumes are pushed now.
    pub fn pod_observed(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        // Most pods show no labels: no lock taken for them on every delivery.
        let Some(metadata) = vne_core::to_eci::downward_metadata(pod) else {
            return;
        };
        let changed = self
            .shared
            .dependents
            .lock()
            .metadata_seen(uid, Some(metadata));
        if let Some(entry) = changed {
            debug!(pod = %format!("{}/{}", entry.namespace, entry.name), pod_uid = %entry.uid, "labels or annotations its downward API files show changed; pushing the files");
            self.push(vec![entry]);
        }
    }

    fn push(&self, entries: Vec<Entry>) {
        let now = Instant::now();
        let mut schedule = self.schedule();
        for entry in entries {
            schedule.insert(
                now,
                Entry {
                    duty: Duty::Push,
                    attempt: 0,
                    ..entry
                },
            );
        }
        drop(schedule);
        self.shared.wake.notify_one();
    }

    /// Groups adopted from an earlier process (pod uid, group id, namespace, name): their tokens
    /// are read from the groups before their refreshes are scheduled.
    pub fn adopt(&self, groups: impl IntoIterator<Item = (String, String, String, String)>) {
        let now = Instant::now();
        let mut adopted = 0usize;
        {
            let mut schedule = self.schedule();
            for (uid, group, namespace, name) in groups {
                adopted += 1;
                schedule.insert(
                    now,
                    Entry {
                        uid,
                        namespace,
                        name,
                        group,
                        duty: Duty::Inspect,
                        attempt: 0,
                    },
                );
            }
        }
        if adopted > 0 {
            info!(
                groups = adopted,
                "reading the service account tokens of the adopted groups to schedule their refreshes"
            );
            self.shared.wake.notify_one();
        }
    }

    /// A pod that is gone: its refresh is dropped now rather than kept until it falls due
    /// (up to 24 hours away) only to find the pod gone — under churn those entries would pile
    /// up with the token lifetime. A refresh in progress finishes and finds the pod gone.
    pub fn forget(&self, uid: &str) {
        self.unplaced().forget(uid);
        self.schedule().remove(uid);
        self.shared.dependents.lock().forget(uid);
    }

    /// Pods waiting for a refresh (or an inspection), not counting those in progress.
    pub fn scheduled(&self) -> usize {
        self.schedule().len()
    }

    /// Drains the queue until `stop`: due work goes to at most [`IN_FLIGHT`] attempts at once;
    /// attempts in progress when `stop` comes are let finish (each is one bounded chain of
    /// calls), their results dropped — a successor inspects the groups again.
    pub async fn run(&self, stop: CancellationToken) {
        let mut in_flight: JoinSet<(Task, Vec<Next>)> = JoinSet::new();
        loop {
            while in_flight.len() < IN_FLIGHT {
                let Some(task) = self.schedule().pop(Instant::now()) else {
                    break;
                };
                let shared = Arc::clone(&self.shared);
                in_flight.spawn(async move {
                    let next = shared.work.perform(&task).await;
                    (task, next)
                });
            }
            let next_due = if in_flight.len() < IN_FLIGHT {
                self.schedule().next()
            } else {
                None
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.shared.wake.notified() => {}
                () = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {}
                Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => match joined {
                    Ok((task, next)) => self.settle(&task, &next),
                    Err(failure) => error!(error = %failure, "a token refresh task failed; its pods are no longer refreshed"),
                },
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    fn settle(&self, task: &Task, next: &[Next]) {
        let now = Instant::now();
        let mut schedule = self.schedule();
        for (entry, next) in task.entries().iter().zip(next) {
            match next {
                Next::After(delay) => schedule.insert(
                    now + *delay,
                    Entry {
                        duty: Duty::Refresh,
                        attempt: 0,
                        ..entry.clone()
                    },
                ),
                Next::Retry => schedule.insert(
                    now + retry_delay(entry.attempt),
                    Entry {
                        attempt: entry.attempt + 1,
                        ..entry.clone()
                    },
                ),
                Next::Done => {}
            }
        }
    }
}

impl TokenRefresher {
    /// The daemon's refresher: tokens from the apiserver, groups updated in ECI.
    pub fn new(
        client: kube::Client,
        backend: Backend,
        config: WithSite<PodsArgs>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let dependents = Arc::<Mutex<Dependents>>::default();
        let work = Renewal {
            client,
            backend,
            config,
            metrics: PodMetrics::of(&telemetry),
            telemetry,
            dependents: Arc::clone(&dependents),
        };
        Self::with_dependents(work, dependents)
    }
}

/// The real work: read the pod, issue new tokens, update the group.
pub struct Renewal {
    client: kube::Client,
    backend: Backend,
    config: WithSite<PodsArgs>,
    telemetry: Arc<Telemetry>,
    metrics: PodMetrics,
    dependents: Arc<Mutex<Dependents>>,
}

/// The tokens due, when the others are due, and the tokens the group holds.
type HeldAndDue = (
    BTreeSet<TokenSource>,
    Option<Duration>,
    BTreeMap<TokenSource, (Token, Duration)>,
);

/// What file volumes are built from.
struct Sources<'a> {
    config_maps: &'a BTreeMap<String, ConfigMap>,
    secrets: &'a BTreeMap<String, Secret>,
    tokens: &'a BTreeMap<TokenSource, Token>,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal")
            .field("node", &self.config.site.node_name)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Work for Renewal {
    async fn perform(&self, task: &Task) -> Vec<Next> {
        match task {
            Task::Refresh(entry) => vec![self.refresh(entry).await],
            Task::Inspect(entries) => self.inspect(entries).await,
        }
    }
}

impl Renewal {
    async fn refresh(&self, entry: &Entry) -> Next {
        let pod = format!("{}/{}", entry.namespace, entry.name);
        // The pod's ECI calls wait in its namespace's lane: a namespace whose pods churn
        // tokens cannot hold another's refreshes behind its own.
        let outcome = Lane::namespace(&entry.namespace)
            .run(self.try_refresh(entry))
            .await;
        let result = match &outcome {
            Ok(_) => "ok",
            Err(failure) if failure.is_retryable() => "retry",
            Err(_) => "failed",
        };
        Telemetry::count(&self.metrics.token_refreshes, result);
        match outcome {
            Ok(Some(delay)) => {
                debug!(%pod, pod_uid = %entry.uid, eci_id = %entry.group, next_in = ?delay, "next token refresh scheduled");
                Next::After(delay)
            }
            Ok(None) => Next::Done,
            Err(failure) if failure.is_retryable() => {
                warn!(%pod, pod_uid = %entry.uid, eci_id = %entry.group, attempt = entry.attempt, error = %Chain(&failure), "could not refresh the service account tokens; retrying");
                Next::Retry
            }
            Err(failure) => {
                error!(%pod, pod_uid = %entry.uid, eci_id = %entry.group, error = %Chain(&failure), "cannot refresh the service account tokens; they will expire in the container group");
                Next::Done
            }
        }
    }

    /// One refresh or push: `None` when there is nothing (left) to refresh.
    async fn try_refresh(&self, entry: &Entry) -> Result<Option<Duration>, RefreshError> {
        let Some(pod) = self.running_pod(entry).await? else {
            return Ok(None);
        };
        // Adopted pods are registered here, the first time their pod is read.
        self.dependents.lock().register(
            Entry {
                duty: Duty::Refresh,
                attempt: 0,
                ..entry.clone()
            },
            FileInputs::of(&pod),
        );
        let push = entry.duty == Duty::Push;
        let refs = if push {
            refs::file_volume_references(&pod)
        } else {
            refs::token_volume_references(&pod)
        };
        if refs.tokens.is_empty() && !push {
            return Ok(None);
        }
        let Some((due, kept, held)) = self.held_tokens(entry, &pod, &refs.tokens).await? else {
            return Ok(None);
        };
        if due.is_empty() && !push {
            // Woken before anything is due (an adopted group's schedule is approximate).
            return Ok(kept);
        }
        let config_maps = self
            .fetch::<ConfigMap>(&entry.namespace, &refs.config_maps, "ConfigMap")
            .await?;
        let secrets = self
            .fetch::<Secret>(&entry.namespace, &refs.secrets, "Secret")
            .await?;
        let issued = if due.is_empty() {
            Issued::default()
        } else {
            issue(&self.client, &self.telemetry, &pod, &due)
                .await
                .map_err(RefreshError::Token)?
        };
        let mut tokens = issued.tokens;
        for (source, (token, _)) in held {
            tokens.entry(source).or_insert(token);
        }
        let next = issued.refresh_in.into_iter().chain(kept).min();
        let sources = Sources {
            config_maps: &config_maps,
            secrets: &secrets,
            tokens: &tokens,
        };
        let volumes = self.volumes(&pod, push, &sources)?;
        let pushed = self.update(entry, volumes).await?;
        if pushed {
            debug!(pod = %format!("{}/{}", entry.namespace, entry.name), pod_uid = %entry.uid, eci_id = %entry.group, tokens = due.len(), push, "updated the running group's volumes");
            Ok(next)
        } else {
            Ok(None)
        }
    }

    /// The pod of `entry`, unless it is gone, replaced, being deleted or finished.
    async fn running_pod(&self, entry: &Entry) -> Result<Option<Pod>, RefreshError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &entry.namespace);
        self.telemetry.kube_request("pod_get");
        let pod = match api.get_opt(&entry.name).await {
            Ok(Some(pod)) if pod.uid().as_deref() == Some(entry.uid.as_str()) => pod,
            // Gone, or a new pod of the same name: its own group has its own tokens.
            Ok(_) => return Ok(None),
            Err(failure) => return Err(RefreshError::ReadPod(failure)),
        };
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        Ok((pod.metadata.deletion_timestamp.is_none() && !finished).then_some(pod))
    }

    /// The tokens the group holds and which of `sources` are due. Like the kubelet, only the
    /// tokens that are due are issued again; the others are read back from the group and kept.
    /// `None` when the group is gone.
    async fn held_tokens(
        &self,
        entry: &Entry,
        pod: &Pod,
        sources: &BTreeSet<TokenSource>,
    ) -> Result<Option<HeldAndDue>, RefreshError> {
        if sources.is_empty() {
            return Ok(Some((BTreeSet::new(), None, BTreeMap::new())));
        }
        let request = DescribeContainerGroupsRequest {
            region_id: self.config.site.region.clone(),
            container_group_ids: vec![entry.group.clone()],
            ..DescribeContainerGroupsRequest::default()
        };
        let answer = self
            .backend
            .describe_container_groups(request)
            .await
            .map_err(RefreshError::Describe)?;
        let Some(group) = answer
            .container_groups
            .iter()
            .find(|g| g.container_group_id == entry.group)
        else {
            return Ok(None);
        };
        let held = tokens::held_tokens(pod, group, unix_now());
        let (due, kept) = tokens::plan(sources, &held);
        let jitter = random_seconds(MAX_JITTER_SECONDS);
        Ok(Some((due, kept.map(|k| k.saturating_sub(jitter)), held)))
    }

    /// The volumes to hand to the group: every file volume for a push, else those with tokens.
    fn volumes(
        &self,
        pod: &Pod,
        push: bool,
        sources: &Sources<'_>,
    ) -> Result<Vec<eci_proto::v20180808::Volume>, RefreshError> {
        // Only the volume fields matter here: file volumes are never claims, and volumes read
        // neither Services nor DNS.
        let cx = Context {
            config_maps: sources.config_maps,
            secrets: sources.secrets,
            service_account_tokens: sources.tokens,
            ..super::site_context(&self.config)
        };
        let built = if push {
            to_eci::file_volumes(pod, &cx)
        } else {
            to_eci::token_volumes(pod, &cx)
        };
        built.map_err(RefreshError::Volumes)
    }

    /// Hands `volumes` to the running group (`IncrementalUpdate`): false when it is gone.
    async fn update(
        &self,
        entry: &Entry,
        volumes: Vec<eci_proto::v20180808::Volume>,
    ) -> Result<bool, RefreshError> {
        if volumes.is_empty() {
            return Ok(true);
        }
        let request = UpdateContainerGroupRequest {
            region_id: self.config.site.region.clone(),
            container_group_id: entry.group.clone(),
            volume: volumes,
            update_type: "IncrementalUpdate".into(),
            ..UpdateContainerGroupRequest::default()
        };
        match self.backend.update_container_group(request).await {
            Ok(_) => Ok(true),
            Err(failure) if failure.is_not_found() => Ok(false),
            Err(failure) => Err(RefreshError::Update(failure)),
        }
    }

    async fn fetch<K>(
        &self,
        namespace: &str,
        names: &BTreeSet<String>,
        kind: &'static str,
    ) -> Result<BTreeMap<String, K>, RefreshError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        let mut found = BTreeMap::new();
        for name in names {
            self.telemetry.kube_request("pod_reference_get");
            match api.get_opt(name).await {
                Ok(Some(object)) => {
                    found.insert(name.clone(), object);
                }
                // Missing: the translation decides (an optional source, or a retryable rejection).
                Ok(None) => {}
                Err(source) => {
                    return Err(RefreshError::Reference {
                        kind,
                        name: name.clone(),
                        source,
                    });
                }
            }
        }
        Ok(found)
    }

    /// Reads the tokens in adopted groups and schedules their refreshes from their claims.
    async fn inspect(&self, entries: &[Entry]) -> Vec<Next> {
        let request = DescribeContainerGroupsRequest {
            region_id: self.config.site.region.clone(),
            container_group_ids: entries.iter().map(|e| e.group.clone()).collect(),
            limit: Some(i32::try_from(INSPECT_BATCH).unwrap_or(20)),
            ..DescribeContainerGroupsRequest::default()
        };
        let groups = match self.backend.describe_container_groups(request).await {
            Ok(answer) => answer.container_groups,
            Err(failure) => {
                let failure = RefreshError::Describe(failure);
                warn!(groups = entries.len(), attempt = entries.first().map_or(0, |e| e.attempt), error = %Chain(&failure), "could not read the adopted groups' tokens; retrying");
                return vec![Next::Retry; entries.len()];
            }
        };
        let by_id: HashMap<&str, &eci_proto::v20180808::ContainerGroup> = groups
            .iter()
            .map(|g| (g.container_group_id.as_str(), g))
            .collect();
        let now_unix = unix_now();
        entries
            .iter()
            .map(|entry| match by_id.get(entry.group.as_str()) {
                None => Next::Done,
                Some(group) => match tokens::group_refresh_delay(
                    group,
                    &entry.uid,
                    now_unix,
                    random_seconds(MAX_JITTER_SECONDS),
                ) {
                    Some(delay) => Next::After(delay),
                    // No readable token (or none at all): the refresh reads the pod and
                    // finds out; refreshing early is harmless, late is not.
                    None => Next::After(random_seconds(UNREADABLE_SPREAD_SECONDS)),
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use serde_json::json;

    use super::*;

    fn entry(uid: &str, inspect: bool) -> Entry {
        Entry {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            group: format!("eci-{uid}"),
            duty: if inspect {
                Duty::Inspect
            } else {
                Duty::Refresh
            },
            attempt: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_push_is_neither_postponed_nor_dropped() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut schedule = Schedule::default();
        let push = Entry {
            duty: Duty::Push,
            ..entry("a", false)
        };
        schedule.insert(t0, push.clone());
        // A refresh settled afterwards (it was in flight) keeps the push, and its time.
        schedule.insert(t0 + s(600), entry("a", false));
        assert_eq!(schedule.len(), 1);
        assert_eq!(schedule.pop(t0), Some(Task::Refresh(push)));
        // A push over a later refresh comes at once.
        schedule.insert(t0 + s(600), entry("b", false));
        schedule.insert(
            t0,
            Entry {
                duty: Duty::Push,
                ..entry("b", false)
            },
        );
        assert_eq!(
            schedule.pop(t0),
            Some(Task::Refresh(Entry {
                duty: Duty::Push,
                ..entry("b", false)
            }))
        );
        assert!(schedule.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_schedule_orders_replaces_and_batches() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut schedule = Schedule::default();
        schedule.insert(t0 + s(30), entry("a", false));
        schedule.insert(t0 + s(10), entry("b", false));
        // A pod has one entry: scheduling it again replaces the earlier one.
        schedule.insert(t0 + s(20), entry("a", false));
        assert_eq!(schedule.len(), 2);
        assert_eq!(schedule.next(), Some(t0 + s(10)));
        assert_eq!(schedule.pop(t0 + s(5)), None, "nothing due yet");
        assert_eq!(
            schedule.pop(t0 + s(25)),
            Some(Task::Refresh(entry("b", false)))
        );
        assert_eq!(
            schedule.pop(t0 + s(25)),
            Some(Task::Refresh(entry("a", false)))
        );
        assert!(schedule.is_empty());

        // Inspections due together go in batches of at most 20; a refresh in between ends one.
        for i in 0..25 {
            schedule.insert(t0, entry(&format!("i{i:02}"), true));
        }
        schedule.insert(t0 + s(1), entry("r", false));
        schedule.insert(t0 + s(2), entry("late", true));
        let Some(Task::Inspect(first)) = schedule.pop(t0 + s(5)) else {
            panic!("a batch")
        };
        assert_eq!(first.len(), 20);
        let Some(Task::Inspect(second)) = schedule.pop(t0 + s(5)) else {
            panic!("a batch")
        };
        assert_eq!(second.len(), 5);
        assert_eq!(
            schedule.pop(t0 + s(5)),
            Some(Task::Refresh(entry("r", false)))
        );
        assert_eq!(
            schedule.pop(t0 + s(5)),
            Some(Task::Inspect(vec![entry("late", true)]))
        );
    }

    /// Records when each task ran and answers from a script.
    struct Scripted {
        start: Instant,
        ran: Mutex<Vec<(Duration, String)>>,
        failures_left: AtomicU32,
    }

    #[async_trait::async_trait]
    impl Work for Scripted {
        async fn perform(&self, task: &Task) -> Vec<Next> {
            let at = Instant::now() - self.start;
            match task {
                Task::Refresh(entry) => {
                    self.ran
                        .lock()
                        .push((at, format!("refresh {}#{}", entry.uid, entry.attempt)));
                    let failing = self
                        .failures_left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    vec![if failing {
                        Next::Retry
                    } else if entry.uid == "once" {
                        Next::Done
                    } else {
                        Next::After(Duration::from_secs(480))
                    }]
                }
                Task::Inspect(entries) => {
                    self.ran
                        .lock()
                        .push((at, format!("inspect {}", entries.len())));
                    entries
                        .iter()
                        .map(|_| Next::After(Duration::from_secs(100)))
                        .collect()
                }
            }
        }
    }

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": uid, "uid": uid}}))
            .unwrap()
    }

    /// A scripted refresher (its clock starting now) running until the token is cancelled.
    fn running_refresher() -> (
        Refresher<Scripted>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let refresher = Refresher::with_work(Scripted {
            start: Instant::now(),
            ran: Mutex::new(Vec::new()),
            failures_left: AtomicU32::new(0),
        });
        let stop = CancellationToken::new();
        let running = tokio::spawn({
            let (refresher, stop) = (refresher.clone(), stop.clone());
            async move { refresher.run(stop).await }
        });
        (refresher, stop, running)
    }

    #[tokio::test(start_paused = true)]
    async fn one_queue_refreshes_on_time_retries_with_back_off_and_stops() {
        let (refresher, stop, running) = running_refresher();
        let s = Duration::from_secs;
        refresher.track(&pod("p"), "eci-p", Some(s(480)));
        refresher.track(&pod("once"), "eci-once", Some(s(600)));
        refresher.adopt((0..21).map(|i| {
            (
                format!("a{i}"),
                format!("eci-a{i}"),
                "ns".into(),
                format!("a{i}"),
            )
        }));
        tokio::time::sleep(s(1000)).await;
        {
            let ran = refresher.shared.work.ran.lock();
            let ran: Vec<(u64, &str)> = ran
                .iter()
                .map(|(at, what)| (at.as_secs(), what.as_str()))
                .collect();
            assert_eq!(
                &ran[..4],
                [
                    (0, "inspect 20"),
                    (0, "inspect 1"),
                    (100, "refresh a0#0"),
                    (100, "refresh a1#0")
                ],
                "adopted groups are inspected at once, in batches, then refreshed when their tokens say"
            );
            let of = |name: &str| -> Vec<u64> {
                ran.iter()
                    .filter(|(_, w)| w.starts_with(name))
                    .map(|(at, _)| *at)
                    .collect()
            };
            assert_eq!(of("refresh p#"), [480, 960], "every 480 s, on the dot");
            assert_eq!(of("refresh once#"), [600], "done means done");
            assert_eq!(of("refresh a20#"), [100, 580]);
        }
        // Failures: retried after 1, 2, 4 s, then back on the normal rhythm.
        refresher
            .shared
            .work
            .failures_left
            .store(3, Ordering::SeqCst);
        refresher.track(&pod("f"), "eci-f", Some(s(10)));
        tokio::time::sleep(s(20)).await;
        {
            let ran = refresher.shared.work.ran.lock();
            let f: Vec<(u64, &str)> = ran
                .iter()
                .filter(|(_, w)| w.starts_with("refresh f#"))
                .map(|(at, w)| (at.as_secs(), w.as_str()))
                .collect();
            assert_eq!(
                f,
                [
                    (1010, "refresh f#0"),
                    (1011, "refresh f#1"),
                    (1013, "refresh f#2"),
                    (1017, "refresh f#3")
                ]
            );
        }
        assert!(refresher.scheduled() > 0);
        stop.cancel();
        tokio::time::timeout(s(1), running)
            .await
            .expect("stops at once")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_pod_is_neither_kept_nor_refreshed() {
        let (refresher, stop, running) = running_refresher();
        let s = Duration::from_secs;
        for name in ["kept", "gone-1", "gone-2"] {
            refresher.track(&pod(name), &format!("eci-{name}"), Some(s(60)));
        }
        assert_eq!(refresher.scheduled(), 3);
        refresher.forget("gone-1");
        refresher.forget("gone-2");
        refresher.forget("never-tracked");
        assert_eq!(
            refresher.scheduled(),
            1,
            "only the live pod's refresh is kept"
        );
        tokio::time::sleep(s(70)).await;
        let ran: Vec<String> = refresher
            .shared
            .work
            .ran
            .lock()
            .iter()
            .map(|(_, w)| w.clone())
            .collect();
        assert_eq!(ran, ["refresh kept#0"]);
        stop.cancel();
        tokio::time::timeout(s(1), running)
            .await
            .expect("stops at once")
            .unwrap();
    }

    #[test]
    fn retry_back_off_is_capped() {
        let delays: Vec<u64> = (0..8).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn errors_say_their_part_once_and_chain_the_cause() {
        let failure = RefreshError::Update(EciError::new("IncorrectStatus", "busy"));
        assert_eq!(
            Chain(&failure).to_string(),
            "UpdateContainerGroup failed: ECI error IncorrectStatus: busy (RequestId: )"
        );
        assert!(failure.is_retryable());
        assert!(!RefreshError::Update(EciError::new("InvalidParameter", "no")).is_retryable());
        assert_eq!(
            format!("{:?}", Token::new("secret-value".into())),
            "Token(<redacted>)"
        );
    }

    /// A client whose apiserver answers every TokenRequest with a new token (`t1`, `t2`, …)
    /// valid for the seconds asked, counting them.
    fn token_server() -> (kube::Client, Arc<AtomicU32>) {
        let issued = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&issued);
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(
                request.uri().path().ends_with("/token"),
                "{}",
                request.uri()
            );
            async move {
                let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "metadata": {}, "spec": {"audiences": [], "expirationSeconds": 600},
                    "status": {"token": format!("t{n}"), "expirationTimestamp": "2030-01-01T00:00:00Z"}});
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .status(201)
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        (kube::Client::new(service, "default"), issued)
    }

    #[tokio::test(start_paused = true)]
    async fn a_retried_create_reuses_its_tokens_until_their_refresh_point() {
        let (client, issued) = token_server();
        let telemetry = Telemetry::new();
        let (refresher, _stop, _running) = running_refresher();
        let short = TokenSource {
            audience: String::new(),
            expiration_seconds: 600,
        };
        let vault = TokenSource {
            audience: "vault".into(),
            expiration_seconds: 600,
        };
        let both = BTreeSet::from([short.clone(), vault.clone()]);
        let stuck = pod("stuck");
        let first = refresher
            .issue_for_create(&client, &telemetry, &stuck, &both)
            .await
            .unwrap();
        assert_eq!(issued.load(Ordering::SeqCst), 2, "one per source");
        // The create failed (a Secret is missing) and is retried, again and again.
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(30)).await;
            let again = refresher
                .issue_for_create(&client, &telemetry, &stuck, &both)
                .await
                .unwrap();
            assert_eq!(again.tokens, first.tokens, "the same tokens");
            let left = again.refresh_in.unwrap();
            assert!(
                left < first.refresh_in.unwrap(),
                "their time runs on: {left:?}"
            );
        }
        assert_eq!(issued.load(Ordering::SeqCst), 2, "no new TokenRequest");
        // Another audience, or another pod (a new UID), is another token.
        let other = TokenSource {
            audience: "other".into(),
            expiration_seconds: 600,
        };
        refresher
            .issue_for_create(&client, &telemetry, &stuck, &BTreeSet::from([other]))
            .await
            .unwrap();
        refresher
            .issue_for_create(&client, &telemetry, &pod("recreated"), &both)
            .await
            .unwrap();
        assert_eq!(issued.load(Ordering::SeqCst), 5);
        // Past the refresh point (80 % of 600 s, up to 10 s early), new ones.
        tokio::time::advance(Duration::from_secs(480)).await;
        let late = refresher
            .issue_for_create(&client, &telemetry, &stuck, &both)
            .await
            .unwrap();
        assert_eq!(issued.load(Ordering::SeqCst), 7);
        assert_ne!(late.tokens, first.tokens);
        // Once the group exists the refresher owns the tokens: the next pod of that UID
        // (none should come) would get new ones.
        refresher.track(&stuck, "eci-stuck", late.refresh_in);
        refresher.forget("recreated");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(refresher.unplaced().is_empty());
    }
}
