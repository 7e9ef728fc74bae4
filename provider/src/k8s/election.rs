//! Holding a `coordination.k8s.io/v1` Lease: the node Lease (`node::lease`) and the orphan
//! collector's election (`fleet::orphans`) both go through here.
//!
//! Every write carries a precondition — a create fails if the Lease exists, a replace fails if
//! its `resourceVersion` moved — so two contenders that judged the same Lease free never both
//! win: the second write is refused with a conflict. What may be done about a Lease as it is
//! (ours, free to take, or someone else's and alive) is decided by pure functions.
//!
//! `holderIdentity` says who holds the Lease (a node name). Several processes can share one
//! identity (two processes started for the same node), so a holder may also record its
//! *instance* in an annotation, and the renew interval it keeps, so a contender can tell a
//! crashed holder from a live one well before the Lease expires. A holder that stops cleanly
//! marks the Lease released so a successor takes it at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, PostParams};

/// Annotation: the process instance holding the Lease.
pub const INSTANCE_ANNOTATION: &str = "virtual-node-eci.aliyun.com/holder-instance";
/// Annotation: the holder's renew interval in milliseconds.
pub const RENEW_INTERVAL_ANNOTATION: &str = "virtual-node-eci.aliyun.com/renew-interval-ms";
/// Annotation: the holder stopped cleanly and released the Lease.
pub const RELEASED_ANNOTATION: &str = "virtual-node-eci.aliyun.com/released";

/// Who wants to hold a Lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `spec.holderIdentity`.
    pub holder: String,
    /// This process, recorded in [`INSTANCE_ANNOTATION`], when the holder identity alone does
    /// not tell processes apart. With `None`, whoever has `holder` as its identity is us.
    pub instance: Option<String>,
    /// `spec.leaseDurationSeconds`; also how long a Lease that does not say is valid.
    pub duration: Duration,
    /// How often the holder renews, recorded in [`RENEW_INTERVAL_ANNOTATION`].
    pub renew_interval: Duration,
    /// The object the Lease belongs to (deleted with it), if any.
    pub owner: Option<OwnerReference>,
}

/// How long the Lease of a role one replica holds for the fleet (placement, image caches)
/// lasts unrenewed: a holder that stops renewing hands the role on within this.
pub const ROLE_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often a role's holder renews, and a contender tries again: five tries per Lease
/// duration, so one slow request does not lose the role.
pub const ROLE_RENEW_INTERVAL: Duration = Duration::from_secs(3);

impl Candidate {
    /// This process contending for a fleet-wide role under its node name. Two processes can
    /// share a node name for a moment (a replica restarting), so a fresh instance id tells
    /// them apart.
    pub fn for_role(node_name: &str) -> Self {
        Self {
            holder: node_name.to_owned(),
            instance: Some(uuid::Uuid::new_v4().to_string()),
            duration: ROLE_LEASE_DURATION,
            renew_interval: ROLE_RENEW_INTERVAL,
            owner: None,
        }
    }
}

/// Who holds a Lease.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    /// `spec.holderIdentity` (empty: nobody).
    pub identity: String,
    /// [`INSTANCE_ANNOTATION`], when recorded.
    pub instance: Option<String>,
}

/// A Lease someone else holds and renews (as far as its renewTime says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBy {
    /// The holder.
    pub holder: Holder,
    /// Its last renewal.
    pub renewed: SystemTime,
    /// When it expires unless renewed.
    pub expires: SystemTime,
    /// When a holder renewing at its recorded interval would have renewed again: silence
    /// until then says it is gone (one and a half intervals and a second, at most the expiry).
    pub silent_after: SystemTime,
}

/// What a candidate may do about a Lease as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It holds it: renew.
    Ours,
    /// Nobody holds it (no holder, released, never renewed, or expired): take it.
    Free,
    /// Someone else holds it and it has not expired.
    Held(HeldBy),
}

/// What a second look at a Lease held by someone else shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecondLook {
    /// Its holder renewed it since: alive.
    Renewed {
        /// The new renewal.
        at: SystemTime,
    },
    /// The same holder, silent (or it released the Lease): take it.
    Silent,
    /// Deleted, or held by yet another: judge it again.
    Changed,
}

/// What a refused renewal means, from the Lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another holder has it now.
    Lost {
        /// The new holder.
        holder: Holder,
    },
    /// The Lease no longer exists: create it again.
    Deleted,
    /// Still ours, changed by someone else (a label, an annotation): renew what is stored.
    StillOurs,
}

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Who holds `lease` (pure).
pub fn holder_of(lease: &Lease) -> Holder {
    Holder {
        identity: lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default(),
        instance: annotation(lease, INSTANCE_ANNOTATION).map(str::to_owned),
    }
}

impl Candidate {
    /// Whether `holder` is this candidate.
    pub fn is(&self, holder: &Holder) -> bool {
        holder.identity == self.holder
            && self
                .instance
                .as_ref()
                .is_none_or(|mine| holder.instance.as_ref() == Some(mine))
    }
}

fn renew_time(lease: &Lease) -> Option<SystemTime> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| SystemTime::from(t.0))
}

fn is_released(lease: &Lease) -> bool {
    annotation(lease, RELEASED_ANNOTATION) == Some("true")
}

/// Decides about a Lease as it is at `now` (pure).
pub fn judge(lease: &Lease, me: &Candidate, now: SystemTime) -> Claim {
    let holder = holder_of(lease);
    if me.is(&holder) {
        return Claim::Ours;
    }
    if holder.identity.is_empty() || is_released(lease) {
        return Claim::Free;
    }
    let Some(renewed) = renew_time(lease) else {
        return Claim::Free;
    };
    let duration = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(me.duration, Duration::from_secs);
    let expires = renewed + duration;
    if expires <= now {
        return Claim::Free;
    }
    let interval = annotation(lease, RENEW_INTERVAL_ANNOTATION)
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(duration / 4, Duration::from_millis);
    let silent_after = (renewed + interval.mul_f64(1.5) + Duration::from_secs(1)).min(expires);
    Claim::Held(HeldBy {
        holder,
        renewed,
        expires,
        silent_after,
    })
}

/// Compares a Lease read again (`again`; None: deleted) with the first look (pure).
pub fn second_look(first: &HeldBy, again: Option<&Lease>) -> SecondLook {
    let Some(again) = again else {
        return SecondLook::Changed;
    };
    if holder_of(again) != first.holder {
        return SecondLook::Changed;
    }
    match renew_time(again) {
        _ if is_released(again) => SecondLook::Silent,
        Some(at) if at != first.renewed => SecondLook::Renewed { at },
        _ => SecondLook::Silent,
    }
}

/// Decides about a refused renewal from the Lease as it is now (pure).
pub fn after_refusal(fresh: Option<&Lease>, me: &Candidate) -> Refusal {
    let Some(fresh) = fresh else {
        return Refusal::Deleted;
    };
    let holder = holder_of(fresh);
    if me.is(&holder) {
        Refusal::StillOurs
    } else {
        Refusal::Lost { holder }
    }
}

fn micro_time(at: SystemTime) -> Option<MicroTime> {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .ok()
        .map(MicroTime)
}

/// The Lease as `me` holds it from `now`, taken from `previous` (None: created). Others'
/// labels and annotations on `previous` are kept; its `resourceVersion` is the write's
/// precondition.
pub fn claimed(
    name: &str,
    namespace: &str,
    me: &Candidate,
    previous: Option<&Lease>,
    now: SystemTime,
) -> Lease {
    let was_ours = previous.is_some_and(|p| me.is(&holder_of(p)));
    let previous_spec = previous.and_then(|p| p.spec.clone()).unwrap_or_default();
    let mut metadata = previous.map(|p| p.metadata.clone()).unwrap_or_default();
    metadata.name = Some(name.to_owned());
    metadata.namespace = Some(namespace.to_owned());
    // The apiserver tracks field ownership itself; sending the old record back would claim it.
    metadata.managed_fields = None;
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(RELEASED_ANNOTATION);
    match &me.instance {
        Some(instance) => annotations.insert(INSTANCE_ANNOTATION.to_owned(), instance.clone()),
        None => annotations.remove(INSTANCE_ANNOTATION),
    };
    annotations.insert(
        RENEW_INTERVAL_ANNOTATION.to_owned(),
        me.renew_interval.as_millis().to_string(),
    );
    if let Some(owner) = &me.owner {
        metadata.owner_references = Some(vec![owner.clone()]);
    }
    let transitions =
        previous_spec.lease_transitions.unwrap_or(0) + i32::from(previous.is_some() && !was_ours);
    Lease {
        metadata,
        spec: Some(LeaseSpec {
            holder_identity: Some(me.holder.clone()),
            lease_duration_seconds: Some(i32::try_from(me.duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: if was_ours {
                previous_spec.acquire_time.or_else(|| micro_time(now))
            } else {
                micro_time(now)
            },
            renew_time: micro_time(now),
            lease_transitions: Some(transitions),
            ..previous_spec
        }),
    }
}

/// `held` renewed at `now`, owned by `me`'s owner (pure).
pub fn renewed(held: &Lease, me: &Candidate, now: SystemTime) -> Lease {
    let mut next = held.clone();
    next.spec.get_or_insert_with(LeaseSpec::default).renew_time = micro_time(now);
    if let Some(owner) = &me.owner {
        next.metadata.owner_references = Some(vec![owner.clone()]);
    }
    next
}

/// `held` marked released at `now`, still fresh, so a successor takes it without waiting
/// (pure).
pub fn released(held: &Lease, me: &Candidate, now: SystemTime) -> Lease {
    let mut next = renewed(held, me, now);
    next.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(RELEASED_ANNOTATION.to_owned(), "true".to_owned());
    next
}

/// One request to the API, for the caller's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A read.
    Get,
    /// A create.
    Create,
    /// A replace taking the Lease from someone else (or from nobody).
    TakeOver,
    /// A replace renewing our Lease.
    Renew,
    /// A replace marking it released.
    Release,
}

/// Counts requests for the caller's metrics (shared with the futures that make them, hence
/// `Sync`).
pub type Count<'a> = dyn Fn(Request) + Sync + 'a;

/// What one pass of [`LeaseLock::try_acquire`] got.
#[derive(Debug, Clone)]
pub enum Acquire {
    /// The Lease is ours (created, taken over, or renewed).
    Acquired(Box<Lease>),
    /// Someone else holds it.
    Held(HeldBy),
    /// Someone else wrote it between our read and our write.
    Contended,
}

/// Where a contender for a role stands after one round of [`LeaseLock::contend`].
#[derive(Debug, Clone)]
pub enum Standing {
    /// We hold the role: hold this Lease from now on.
    Leading(Box<Lease>),
    /// Someone else holds it (when known), or it was lost or contended this round.
    Following(Option<HeldBy>),
}

/// What [`LeaseLock::renew`] got.
#[derive(Debug, Clone)]
pub enum Renewal {
    /// Renewed: hold this from now on.
    Renewed(Lease),
    /// Our write was refused and the Lease is still ours, changed by someone else: renew this.
    Changed(Lease),
    /// Another holder has it.
    Lost(Holder),
    /// The Lease was deleted.
    Deleted,
}

fn code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The wall clock Lease times are read against.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// One Lease and the candidate for it.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    /// Who we are; `owner` may change while holding (the Node registered again).
    pub candidate: Candidate,
    clock: Clock,
}

impl std::fmt::Debug for LeaseLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLock")
            .field("lease", &format_args!("{}/{}", self.namespace, self.name))
            .field("candidate", &self.candidate)
            .finish_non_exhaustive()
    }
}

impl LeaseLock {
    /// `namespace/name`, wanted by `candidate`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, candidate: Candidate) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            candidate,
            clock: Arc::new(SystemTime::now),
        }
    }

    /// The same lock reading time from `clock` (tests: a clock that follows paused tokio time).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Now, by the lock's clock.
    pub fn now(&self) -> SystemTime {
        (self.clock)()
    }

    /// The Lease as it is (None: it does not exist).
    pub async fn observe(&self, count: &Count<'_>) -> Result<Option<Lease>, kube::Error> {
        count(Request::Get);
        self.api.get_opt(&self.name).await
    }

    /// Takes the Lease: creates it when `previous` is None, else replaces `previous` on
    /// condition that it is still what is stored. A conflict means someone else wrote first.
    pub async fn take(
        &self,
        previous: Option<&Lease>,
        count: &Count<'_>,
    ) -> Result<Lease, kube::Error> {
        let lease = claimed(
            &self.name,
            &self.namespace,
            &self.candidate,
            previous,
            self.now(),
        );
        match previous {
            None => {
                count(Request::Create);
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(previous) => {
                count(if self.candidate.is(&holder_of(previous)) {
                    Request::Renew
                } else {
                    Request::TakeOver
                });
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        }
    }

    /// One pass: read, then take the Lease if it is ours or free.
    pub async fn try_acquire(&self, count: &Count<'_>) -> Result<Acquire, kube::Error> {
        let current = self.observe(count).await?;
        if let Some(current) = &current
            && let Claim::Held(held) = judge(current, &self.candidate, self.now())
        {
            return Ok(Acquire::Held(held));
        }
        match self.take(current.as_ref(), count).await {
            Ok(lease) => Ok(Acquire::Acquired(Box::new(lease))),
            Err(error) if code(&error) == Some(409) => Ok(Acquire::Contended),
            Err(error) => Err(error),
        }
    }

    /// Renews `held`. A refused write (409: the stored Lease moved on; it is also what the
    /// apiserver answers for a Lease deleted and created again) reads the Lease again to tell
    /// a loss from a deletion from someone else's harmless change.
    pub async fn renew(&self, held: &Lease, count: &Count<'_>) -> Result<Renewal, kube::Error> {
        count(Request::Renew);
        let next = renewed(held, &self.candidate, self.now());
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(lease) => Ok(Renewal::Renewed(lease)),
            Err(error) if code(&error) == Some(404) => Ok(Renewal::Deleted),
            Err(error) if code(&error) == Some(409) => {
                let fresh = self.observe(count).await?;
                Ok(match after_refusal(fresh.as_ref(), &self.candidate) {
                    Refusal::Lost { holder } => Renewal::Lost(holder),
                    Refusal::Deleted => Renewal::Deleted,
                    Refusal::StillOurs => Renewal::Changed(fresh.unwrap_or_default()),
                })
            }
            Err(error) => Err(error),
        }
    }

    /// One round for a role: renews `held` while we lead, otherwise tries to take the Lease.
    pub async fn contend(
        &self,
        held: Option<&Lease>,
        count: &Count<'_>,
    ) -> Result<Standing, kube::Error> {
        let Some(held) = held else {
            return Ok(match self.try_acquire(count).await? {
                Acquire::Acquired(lease) => Standing::Leading(lease),
                Acquire::Held(other) => Standing::Following(Some(other)),
                Acquire::Contended => Standing::Following(None),
            });
        };
        Ok(match self.renew(held, count).await? {
            Renewal::Renewed(lease) | Renewal::Changed(lease) => Standing::Leading(Box::new(lease)),
            Renewal::Lost(_) | Renewal::Deleted => Standing::Following(None),
        })
    }

    /// Marks `held` released so a successor takes it without waiting for it to expire.
    pub async fn release(&self, held: &Lease, count: &Count<'_>) -> Result<Lease, kube::Error> {
        count(Request::Release);
        let next = released(held, &self.candidate, self.now());
        self.api
            .replace(&self.name, &PostParams::default(), &next)
            .await
    }
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
