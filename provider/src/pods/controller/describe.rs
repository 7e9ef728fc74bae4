//! Reading single container groups by id: the one place the controller asks
//! DescribeContainerGroups about groups it already knows (what to write back on a new pod,
//! whether a deleted group is gone). Lookups made at the same time share calls: the
//! service takes up to [`IDS_PER_CALL`] ids per call, and a burst of created or deleted pods
//! must not cost one call each.
//!
//! One call is in flight at a time, and every lookup that arrives meanwhile joins the next
//! one, so a burst is answered in calls of up to [`IDS_PER_CALL`] ids. How soon a call goes
//! is the lookup's [`Pace`]: a lookup that something waits on (is a deleted group gone?) is
//! answered after one round trip; the lookups of new groups' descriptions, which only ride on
//! the pod's next status write, let ids gather for [`GATHER_WINDOW`] while fewer than a full
//! call's wait and no `Now` lookup waits among them (one joining cuts the gathering short).
//! Without that window a steady stream of creations costs about one call per group: each
//! lookup finds the previous call already answered. A throttled call is made again after a back-off
//! ([`crate::eci::paging::page`]), never dropped.
//!
//! Existence checks and write-back descriptions ([`Lookup`]) share calls only with their own
//! kind: the write-back needs the group's events, and asking for them on a mass scale-in's
//! existence checks would carry every deleted group's events for nothing.
//!
//! Owns the pending lookups; calls ECI only through the fetch it is handed.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;

use eci_proto::EciError;
use eci_proto::v20180808::{ContainerGroup, DescribeContainerGroupsRequest};
use tokio::sync::{Notify, oneshot};
use tracing::debug;

use super::PodController;

/// Ids per DescribeContainerGroups call: the most `ContainerGroupIds` may list.
pub(super) const IDS_PER_CALL: usize = 20;

/// How long the ids of [`Pace::Gathered`] lookups may gather before a call that is not full.
/// Well under the time ECI takes to start a group, so gathering delays no pod: the pod's next
/// status write, which carries what the lookup learns, waits for the group's start anyway.
pub(super) const GATHER_WINDOW: std::time::Duration = std::time::Duration::from_millis(200);

/// How soon a lookup's call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pace {
    /// Something waits on the answer: at once (after a yield, so lookups made in the same
    /// instant share the call).
    Now,
    /// Nothing waits on it: ids gather for up to [`GATHER_WINDOW`] into fuller calls.
    Gathered,
}

/// What a lookup is for, which decides how soon its call goes and what it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    /// Whether the group still exists: something waits on the answer, and the group's state
    /// is all it needs.
    Existence,
    /// What to write back on a new pod: nothing waits on it, and it needs the group's events
    /// (the image cache a group matched is named only there).
    WriteBack,
}

impl Lookup {
    fn pace(self) -> Pace {
        match self {
            Self::Existence => Pace::Now,
            Self::WriteBack => Pace::Gathered,
        }
    }

    /// The DescribeContainerGroups request for `ids` in `region`: events only where they
    /// are read (a mass scale-in's existence checks would otherwise carry every group's).
    fn request(self, region: &str, ids: Vec<String>) -> DescribeContainerGroupsRequest {
        DescribeContainerGroupsRequest {
            region_id: region.to_owned(),
            container_group_ids: ids,
            limit: Some(IDS_PER_CALL as i32),
            with_event: self == Self::WriteBack,
            ..DescribeContainerGroupsRequest::default()
        }
    }
}

/// One [`GroupReads`] per [`Lookup`]: a call asks for events for all its ids or none.
#[derive(Default)]
pub(super) struct ReadsByLookup {
    existence: Arc<GroupReads>,
    write_back: Arc<GroupReads>,
}

impl ReadsByLookup {
    fn of(&self, lookup: Lookup) -> &Arc<GroupReads> {
        match lookup {
            Lookup::Existence => &self.existence,
            Lookup::WriteBack => &self.write_back,
        }
    }
}

/// Why a group could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum ReadError {
    /// The service refused or failed the call (after the retries throttling gets).
    #[error("DescribeContainerGroups failed")]
    Service(#[source] EciError),
    /// The call was abandoned (the daemon is stopping).
    #[error("the read was abandoned")]
    Abandoned,
}

/// What a lookup learns of one group: its description, `None` when the service does not
/// know it (deleted, or never made).
pub(super) type Read = Result<Option<ContainerGroup>, ReadError>;

/// Lookups waiting for a call, and whether one is in flight.
#[derive(Default)]
struct Pending {
    /// Ids in arrival order, each once.
    order: VecDeque<String>,
    /// Who waits for each id.
    waiting: HashMap<String, Vec<oneshot::Sender<Read>>>,
    /// A driver is making calls: new lookups join its next call.
    driving: bool,
    /// A [`Pace::Now`] lookup waits for the next call: it goes without gathering.
    urgent: bool,
}

/// Shares DescribeContainerGroups calls between lookups made at the same time.
#[derive(Default)]
pub(super) struct GroupReads {
    pending: Mutex<Pending>,
    /// Wakes a gathering driver when a [`Pace::Now`] lookup joins.
    hurry: Notify,
}

/// The right and duty to make the calls while lookups wait: one exists at a time. Owned by
/// the future that runs it, so dropping that future at any point (a stop, even before it
/// first ran) hands the lookups it would have answered [`ReadError::Abandoned`] instead of
/// leaving them waiting forever.
pub(super) struct Driver {
    reads: Arc<GroupReads>,
    /// It ran to its end and gave the claim up itself (a later driver may hold one now,
    /// which is not this one's to clear).
    released: bool,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let mut pending = self.reads.lock();
        pending.driving = false;
        pending.urgent = false;
        pending.order.clear();
        for sender in pending.waiting.drain().flat_map(|(_, senders)| senders) {
            let _ = sender.send(Err(ReadError::Abandoned));
        }
    }
}

impl Driver {
    /// Makes calls (`fetch`, one batch of ids each, retried while throttled) until no lookup
    /// is left waiting.
    async fn run<F, Fut>(mut self, mut fetch: F)
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: Future<Output = Result<Vec<ContainerGroup>, EciError>>,
    {
        let mut first = true;
        loop {
            // Lookups made in the same instant as the one that started the driver join its
            // first call (a yield, not a wait); gathered ones wait for company unless a call
            // is full, a `Now` lookup waits, or nothing waits at all (the driver then lets go).
            // Registered before looking, so a `Now` lookup joining meanwhile is not missed.
            let hurried = self.reads.hurry.notified();
            tokio::pin!(hurried);
            hurried.as_mut().enable();
            if self.reads.gathers() {
                tokio::select! {
                    () = tokio::time::sleep(GATHER_WINDOW) => {}
                    () = hurried => {}
                }
            } else if first {
                tokio::task::yield_now().await;
            }
            first = false;
            let batch = self.reads.next_batch();
            if batch.is_empty() {
                break;
            }
            let outcome =
                crate::eci::paging::page(None, "DescribeContainerGroups", || fetch(batch.clone()))
                    .await
                    .map(|groups| {
                        groups
                            .into_iter()
                            .map(|group| (group.container_group_id.clone(), group))
                            .collect()
                    });
            if let Err(error) = &outcome {
                debug!(ids = batch.len(), code = %error.code, "cannot describe container groups");
            }
            self.reads.answer(&batch, &outcome);
        }
        // `next_batch` gave the claim up with the lock held.
        self.released = true;
    }
}

impl GroupReads {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// Queues lookups of `ids`; the answers to wait for, and the driver the caller must start
    /// ([`Driver::run`]) when none is in flight.
    fn join(
        self: &Arc<Self>,
        ids: &[String],
        pace: Pace,
    ) -> (Vec<(String, oneshot::Receiver<Read>)>, Option<Driver>) {
        let mut pending = self.lock();
        let mut answers = Vec::with_capacity(ids.len());
        for id in ids {
            let (sender, receiver) = oneshot::channel();
            let waiters = pending.waiting.entry(id.clone()).or_default();
            let first = waiters.is_empty();
            waiters.push(sender);
            if first {
                pending.order.push_back(id.clone());
            }
            answers.push((id.clone(), receiver));
        }
        if pace == Pace::Now && !ids.is_empty() {
            pending.urgent = true;
            self.hurry.notify_waiters();
        }
        let start = !pending.driving && !pending.order.is_empty();
        pending.driving |= start;
        let driver = start.then(|| Driver {
            reads: Arc::clone(self),
            released: false,
        });
        (answers, driver)
    }

    /// Whether the next call waits for more ids: some wait, fewer than a full call, and
    /// none of them for a [`Pace::Now`] lookup.
    fn gathers(&self) -> bool {
        let pending = self.lock();
        (1..IDS_PER_CALL).contains(&pending.order.len()) && !pending.urgent
    }

    /// Up to [`IDS_PER_CALL`] waiting ids, oldest first; none ends the driver's claim.
    fn next_batch(&self) -> Vec<String> {
        let mut pending = self.lock();
        let take = pending.order.len().min(IDS_PER_CALL);
        let batch: Vec<String> = pending.order.drain(..take).collect();
        // Every urgent id is in a call once none is left waiting (a full batch may leave
        // some: the next call does not gather either way while ids remain urgent).
        if pending.order.is_empty() {
            pending.urgent = false;
        }
        if batch.is_empty() {
            pending.driving = false;
        }
        batch
    }

    /// Hands every waiter of `batch` its answer from `outcome` (the groups found, by id).
    fn answer(
        &self,
        batch: &[String],
        outcome: &Result<HashMap<String, ContainerGroup>, EciError>,
    ) {
        let mut pending = self.lock();
        for id in batch {
            let read: Read = match outcome {
                Ok(found) => Ok(found.get(id).cloned()),
                Err(error) => Err(ReadError::Service(error.clone())),
            };
            for sender in pending.waiting.remove(id).into_iter().flatten() {
                let _ = sender.send(read.clone());
            }
        }
    }

    /// Looks `ids` up, sharing calls with other lookups; `start` is handed the driver when
    /// one is needed, to run ([`Driver::run`]) or drop.
    async fn lookup(
        self: &Arc<Self>,
        ids: &[String],
        pace: Pace,
        start: impl FnOnce(Driver),
    ) -> HashMap<String, Read> {
        let (answers, driver) = self.join(ids, pace);
        if let Some(driver) = driver {
            start(driver);
        }
        let mut reads = HashMap::with_capacity(answers.len());
        for (id, answer) in answers {
            let read = answer.await.unwrap_or(Err(ReadError::Abandoned));
            reads.insert(id, read);
        }
        reads
    }
}

impl PodController {
    /// The groups `ids` as DescribeContainerGroups describes them, each read shared with
    /// the lookups of the same kind made at the same time (see the module doc).
    pub(super) async fn describe_groups(
        &self,
        ids: &[String],
        lookup: Lookup,
    ) -> HashMap<String, Read> {
        let this = self.clone();
        self.inner
            .group_reads
            .of(lookup)
            .lookup(ids, lookup.pace(), move |driver| {
                let region = this.inner.config.site.region.clone();
                let backend = this.inner.backend.clone();
                this.spawn_pod_task(driver.run(move |batch| {
                    let backend = backend.clone();
                    let request = lookup.request(&region, batch);
                    async move {
                        backend
                            .describe_container_groups(request)
                            .await
                            .map(|answer| answer.container_groups)
                    }
                }));
            })
            .await
    }

    /// Group `id` as DescribeContainerGroups describes it (`None`: the service does not know
    /// it).
    pub(super) async fn describe_group(&self, id: &str, lookup: Lookup) -> Read {
        let id = id.to_owned();
        self.describe_groups(std::slice::from_ref(&id), lookup)
            .await
            .remove(&id)
            .unwrap_or(Err(ReadError::Abandoned))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_write_back_lookups_ask_for_events() {
        let ids = || vec!["eci-1".to_owned(), "eci-2".to_owned()];
        for (lookup, pace, with_event) in [
            (Lookup::Existence, Pace::Now, false),
            (Lookup::WriteBack, Pace::Gathered, true),
        ] {
            let request = lookup.request("cn-hangzhou", ids());
            assert_eq!(request.with_event, with_event, "{lookup:?}");
            assert_eq!(lookup.pace(), pace, "{lookup:?}");
            assert_eq!(request.container_group_ids, ids());
            assert_eq!(request.region_id, "cn-hangzhou");
            assert_eq!(request.limit, Some(20));
        }
        let reads = ReadsByLookup::default();
        assert!(!Arc::ptr_eq(
            reads.of(Lookup::Existence),
            reads.of(Lookup::WriteBack)
        ));
    }

    fn group(id: &str) -> ContainerGroup {
        ContainerGroup {
            container_group_id: id.to_owned(),
            zone_id: format!("zone-of-{id}"),
            ..ContainerGroup::default()
        }
    }

    /// A fake service: knows the ids not starting with `gone`, refuses more than
    /// [`IDS_PER_CALL`] ids, and throttles the first `throttle` calls.
    struct Service {
        calls: AtomicUsize,
        throttle: usize,
        sizes: Mutex<Vec<usize>>,
    }

    impl Service {
        fn new(throttle: usize) -> Arc<Self> {
            Arc::new(Self {
                calls: AtomicUsize::new(0),
                throttle,
                sizes: Mutex::new(Vec::new()),
            })
        }

        async fn describe(&self, ids: Vec<String>) -> Result<Vec<ContainerGroup>, EciError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            // A round trip, so lookups arriving meanwhile queue behind it.
            tokio::task::yield_now().await;
            if call < self.throttle {
                return Err(EciError::new("Throttling.User", "slow down"));
            }
            assert!(ids.len() <= IDS_PER_CALL, "{} ids in one call", ids.len());
            self.sizes.lock().push(ids.len());
            Ok(ids
                .iter()
                .filter(|id| !id.starts_with("gone"))
                .map(|id| group(id))
                .collect())
        }
    }

    /// `n` lookups at once through one [`GroupReads`], drivers spawned as the controller
    /// spawns them.
    async fn look_up(
        reads: &Arc<GroupReads>,
        service: &Arc<Service>,
        ids: Vec<String>,
    ) -> Vec<Read> {
        look_up_at(reads, service, ids, Pace::Now).await
    }

    /// As [`look_up`], at `pace`.
    async fn look_up_at(
        reads: &Arc<GroupReads>,
        service: &Arc<Service>,
        ids: Vec<String>,
        pace: Pace,
    ) -> Vec<Read> {
        let lookups = ids.into_iter().map(|id| {
            let (reads, service) = (Arc::clone(reads), Arc::clone(service));
            async move {
                let mut answer = reads
                    .lookup(std::slice::from_ref(&id), pace, move |driver| {
                        tokio::spawn(driver.run(move |batch| {
                            let service = Arc::clone(&service);
                            async move { service.describe(batch).await }
                        }));
                    })
                    .await;
                answer.remove(&id).unwrap()
            }
        });
        futures::future::join_all(lookups).await
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_share_calls_of_at_most_twenty_ids() {
        for n in [1_usize, 2, 19, 20, 21, 40, 45, 100] {
            let (reads, service) = (Arc::new(GroupReads::default()), Service::new(0));
            let ids: Vec<String> = (0..n).map(|i| format!("eci-{i}")).collect();
            let answers = look_up(&reads, &service, ids.clone()).await;
            for (id, answer) in ids.iter().zip(&answers) {
                let found = answer.as_ref().unwrap().as_ref().unwrap();
                assert_eq!(
                    &found.container_group_id, id,
                    "each lookup gets its own group"
                );
                assert_eq!(found.zone_id, format!("zone-of-{id}"));
            }
            let calls = service.calls.load(Ordering::SeqCst);
            assert!(
                calls <= n.div_ceil(IDS_PER_CALL),
                "{n} lookups took {calls} calls"
            );
            assert_eq!(service.sizes.lock().iter().sum::<usize>(), n);
            assert!(
                !reads.lock().driving,
                "the driver let go once all were answered"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_the_service_does_not_know_is_none_and_the_same_id_is_asked_once() {
        let (reads, service) = (Arc::new(GroupReads::default()), Service::new(0));
        let ids = vec!["eci-1".to_owned(), "gone-2".to_owned(), "eci-1".to_owned()];
        let answers = look_up(&reads, &service, ids).await;
        assert!(answers[0].as_ref().unwrap().is_some());
        assert!(answers[1].as_ref().unwrap().is_none(), "{:?}", answers[1]);
        assert!(
            answers[2].as_ref().unwrap().is_some(),
            "a second waiter for one id"
        );
        assert_eq!(*service.sizes.lock(), [2], "eci-1 asked once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_call_is_made_again_not_dropped() {
        let (reads, service) = (Arc::new(GroupReads::default()), Service::new(2));
        let ids: Vec<String> = (0..5).map(|i| format!("eci-{i}")).collect();
        let answers = look_up(&reads, &service, ids).await;
        assert!(
            answers.iter().all(|a| matches!(a, Ok(Some(_)))),
            "{answers:?}"
        );
        assert_eq!(
            service.calls.load(Ordering::SeqCst),
            3,
            "two throttled, then answered"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_arriving_during_a_call_join_the_next_one() {
        let (reads, service) = (Arc::new(GroupReads::default()), Service::new(0));
        let first = {
            let (reads, service) = (Arc::clone(&reads), Arc::clone(&service));
            tokio::spawn(async move { look_up(&reads, &service, vec!["eci-a".into()]).await })
        };
        // Let the first call start, then three more arrive while it is in flight.
        while service.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let later: Vec<String> = ["eci-b", "eci-c", "eci-d"].map(String::from).to_vec();
        let answers = look_up(&reads, &service, later).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(Some(_)))));
        assert!(matches!(first.await.unwrap()[0], Ok(Some(_))));
        assert_eq!(*service.sizes.lock(), [1, 3]);
    }

    /// New groups' lookups arriving one by one, 10 ms apart as a steady stream of creations
    /// brings them: at `Now` each finds the previous call answered and costs a call; gathered,
    /// they share one, answered within the window; a full call's worth does not wait.
    #[tokio::test(start_paused = true)]
    async fn gathered_lookups_of_a_steady_stream_share_calls_and_a_full_call_goes_at_once() {
        for (pace, calls) in [(Pace::Now, 10), (Pace::Gathered, 1)] {
            let (reads, service) = (Arc::new(GroupReads::default()), Service::new(0));
            let started = tokio::time::Instant::now();
            let lookups = (0..10).map(|i| {
                let (reads, service) = (Arc::clone(&reads), Arc::clone(&service));
                async move {
                    tokio::time::sleep(Duration::from_millis(10 * i)).await;
                    let id = format!("eci-{i}");
                    look_up_at(&reads, &service, vec![id], pace).await
                }
            });
            let answers = futures::future::join_all(lookups).await;
            assert!(answers.iter().flatten().all(|a| matches!(a, Ok(Some(_)))));
            assert_eq!(service.calls.load(Ordering::SeqCst), calls, "{pace:?}");
            assert!(
                started.elapsed() <= GATHER_WINDOW + Duration::from_millis(100),
                "{pace:?}"
            );
        }
        let (reads, service) = (Arc::new(GroupReads::default()), Service::new(0));
        let started = tokio::time::Instant::now();
        let ids: Vec<String> = (0..IDS_PER_CALL).map(|i| format!("eci-{i}")).collect();
        look_up_at(&reads, &service, ids, Pace::Gathered).await;
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a full call waits for nothing"
        );
    }

    /// A lookup something waits on, joining a gathering, cuts it short: both go in one call
    /// at once, not after the window.
    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_is_waited_on_cuts_a_gathering_short() {
        let (reads, service) = (Arc::new(GroupReads::default()), Service::new(0));
        let started = tokio::time::Instant::now();
        let gathered = look_up_at(&reads, &service, vec!["eci-new".into()], Pace::Gathered);
        let urgent = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            look_up_at(&reads, &service, vec!["eci-gone?".into()], Pace::Now).await
        };
        let (gathered, urgent) = tokio::join!(gathered, urgent);
        assert!(matches!(gathered[0], Ok(Some(_))) && matches!(urgent[0], Ok(Some(_))));
        assert_eq!(*service.sizes.lock(), [2], "one call for both");
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(10),
            "no wait past the join"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_driver_abandons_its_lookups_rather_than_leave_them_waiting() {
        let reads = Arc::new(GroupReads::default());
        // Dropped while it runs.
        let (answers, driver) = reads.join(&["eci-1".to_owned()], Pace::Now);
        let never = driver.unwrap().run(|_| futures::future::pending());
        tokio::select! {
            biased;
            () = tokio::task::yield_now() => {}
            () = never => panic!("the call never answers"),
        }
        for (_, answer) in answers {
            assert!(matches!(answer.await, Ok(Err(ReadError::Abandoned))));
        }
        // Dropped before it ever ran (a stop racing the spawn).
        let (answers, driver) = reads.join(&["eci-2".to_owned()], Pace::Now);
        drop(driver.unwrap().run(|_| futures::future::pending()));
        for (_, answer) in answers {
            assert!(matches!(answer.await, Ok(Err(ReadError::Abandoned))));
        }
        assert!(
            !reads.lock().urgent,
            "an abandoned urgent lookup leaves no urgency behind for the next gathering"
        );
        let (_, driver) = reads.join(&["eci-3".to_owned()], Pace::Now);
        assert!(driver.is_some(), "a new driver may start");
    }
}
