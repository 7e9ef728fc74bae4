//! A keyed work queue: the latest value per key wins, and a key is worked on by one worker at
//! a time (a value pushed while its key is being worked on waits for that work to finish).
//!
//! The pod status pipeline uses it between the ECI poll and the status writers: a poll never
//! waits for writes, a pod that changed twice before its turn is written once with the latest
//! state, and two writes of one pod never race each other.
//!
//! [`WorkQueue::serve`] runs each worker as a task of its own, so workers run in parallel and
//! none waits on another's slow poll; `serve` owns them and returns only once all have ended.
//! A held key is released however its work ends, a panic included: a bug in one pod's work
//! never leaves that pod stuck, and the panic is reported, not lost.
//!
//! A value can also be given for later ([`WorkQueue::push_after`], client-go's `AddAfter`): a
//! retry waiting out its back-off, or a wait for a grace period, is then a value in one timer
//! queue (tokio-util's `DelayQueue`) rather than a task of its own, however many keys wait.
//! The timers run while the queue is served. A value pushed now supersedes one waiting for its
//! time; [`WorkQueue::push_by`] keeps the earliest time asked for a key.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::poll_fn;
use std::hash::Hash;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::error;

/// The longest a value waits for its time: the timer queue refuses (panics on) times more than
/// about two years ahead.
const LONGEST_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

#[derive(Debug)]
struct State<K, V> {
    /// Keys with a pending value, oldest first (each at most once).
    order: VecDeque<K>,
    pending: HashMap<K, V>,
    /// Keys a worker holds.
    working: HashSet<K>,
    /// Values given for later, each with its timer.
    delayed: HashMap<K, (delay_queue::Key, V)>,
    timers: DelayQueue<K>,
}

/// The queue (share it behind an `Arc`).
#[derive(Debug)]
pub struct WorkQueue<K, V> {
    state: Mutex<State<K, V>>,
    ready: Notify,
    /// Notified whenever a value is given for later (its timer may be the next due).
    delayed: Notify,
}

impl<K: Eq + Hash + Clone, V> Default for WorkQueue<K, V> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                order: VecDeque::new(),
                pending: HashMap::new(),
                working: HashSet::new(),
                delayed: HashMap::new(),
                timers: DelayQueue::new(),
            }),
            ready: Notify::new(),
            delayed: Notify::new(),
        }
    }
}

impl<K: Eq + Hash + Clone, V> WorkQueue<K, V> {
    fn state(&self) -> MutexGuard<'_, State<K, V>> {
        self.state.lock()
    }

    /// Queues `value` for `key`, replacing a value still waiting for it (for its turn or for
    /// its time).
    pub fn push(&self, key: K, value: V) {
        let mut state = self.state();
        if let Some((timer, _)) = state.delayed.remove(&key) {
            state.timers.remove(&timer);
        }
        let waiting = state.pending.insert(key.clone(), value).is_some();
        if !waiting && !state.working.contains(&key) {
            state.order.push_back(key);
            drop(state);
            self.ready.notify_one();
        }
    }

    /// Queues `value` for `key` once `delay` has passed (at most a day), replacing a value
    /// given for later before; a value waiting for its turn meanwhile keeps its place. The
    /// timers run while the queue is served ([`WorkQueue::serve`]).
    pub fn push_after(&self, key: K, value: V, delay: Duration) {
        let mut state = self.state();
        let State {
            delayed, timers, ..
        } = &mut *state;
        let delay = delay.min(LONGEST_DELAY);
        match delayed.get_mut(&key) {
            Some((timer, held)) => {
                timers.reset(timer, delay);
                *held = value;
            }
            None => {
                let timer = timers.insert(key.clone(), delay);
                delayed.insert(key, (timer, value));
            }
        }
        drop(state);
        self.delayed.notify_one();
    }

    /// Queues `value` for `key` once `delay` has passed or sooner: a value already given for
    /// an earlier time keeps that time (and takes `value`). For work that reads what is when it
    /// runs (a level-triggered sync): several times asked for one key, the earliest wins, as in
    /// kube-runtime's scheduler.
    pub fn push_by(&self, key: K, value: V, delay: Duration) {
        let mut state = self.state();
        let State {
            delayed, timers, ..
        } = &mut *state;
        let at = tokio::time::Instant::now() + delay.min(LONGEST_DELAY);
        if let Some((timer, held)) = delayed.get_mut(&key)
            && timers.deadline(timer) <= at
        {
            *held = value;
            return;
        }
        drop(state);
        self.push_after(key, value, delay);
    }

    /// Queues now each value given for later that `pick` picks (what it waited for came
    /// sooner).
    pub fn release_now(&self, pick: impl Fn(&V) -> bool) {
        let picked: Vec<(K, V)> = {
            let mut state = self.state();
            let State {
                delayed, timers, ..
            } = &mut *state;
            let keys: Vec<K> = delayed
                .iter()
                .filter(|(_, (_, value))| pick(value))
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter()
                .filter_map(|key| {
                    let (timer, value) = delayed.remove(&key)?;
                    timers.remove(&timer);
                    Some((key, value))
                })
                .collect()
        };
        for (key, value) in picked {
            self.push(key, value);
        }
    }

    /// Drops the value waiting for `key`, for its turn or for its time (work on it already
    /// under way goes on).
    pub fn forget(&self, key: &K) {
        let mut state = self.state();
        state.pending.remove(key);
        if let Some((timer, _)) = state.delayed.remove(key) {
            state.timers.remove(&timer);
        }
    }

    /// Keys with a value given for later.
    pub fn delayed_len(&self) -> usize {
        self.state().delayed.len()
    }

    /// Queues each value given for later as its time comes, until `stop`.
    async fn release_delayed(&self, stop: &CancellationToken) {
        loop {
            // Registered before polling, so a value given between the poll and the wait is
            // not missed.
            let given = self.delayed.notified();
            tokio::pin!(given);
            given.as_mut().enable();
            let due = poll_fn(|cx| {
                let mut state = self.state();
                match state.timers.poll_expired(cx) {
                    Poll::Ready(Some(expired)) => {
                        let key = expired.into_inner();
                        Poll::Ready(state.delayed.remove(&key).map(|(_, value)| (key, value)))
                    }
                    // An empty queue ends its stream; a new timer notifies `delayed`.
                    Poll::Ready(None) | Poll::Pending => Poll::Pending,
                }
            });
            tokio::select! {
                () = stop.cancelled() => return,
                () = given => {}
                due = due => if let Some((key, value)) = due { self.push(key, value) },
            }
        }
    }

    /// Takes the oldest waiting key whose key no worker holds, if any. The caller holds the key
    /// until it calls [`WorkQueue::done`].
    pub fn try_next(&self) -> Option<(K, V)> {
        let mut state = self.state();
        while let Some(key) = state.order.pop_front() {
            if let Some(value) = state.pending.remove(&key) {
                state.working.insert(key.clone());
                return Some((key, value));
            }
        }
        None
    }

    /// Waits for the next key (see [`WorkQueue::try_next`]).
    pub async fn next(&self) -> (K, V) {
        loop {
            // Registered before looking, so a push between the look and the wait is not missed.
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(next) = self.try_next() {
                return next;
            }
            notified.await;
        }
    }

    /// Releases `key`; a value pushed for it meanwhile becomes ready.
    pub fn done(&self, key: &K) {
        let mut state = self.state();
        state.working.remove(key);
        let ready = state.pending.contains_key(key);
        if ready {
            state.order.push_back(key.clone());
        }
        drop(state);
        if ready {
            self.ready.notify_one();
        }
    }

    /// Runs `workers` workers until `stop` and returns once every one has returned: each takes
    /// the next key, awaits `work` on it (boxed, so an idle worker holds a pointer rather than
    /// the state of a request in flight) and releases the key. Each worker is a task of its own,
    /// owned by this call: on a multi-thread runtime they run in parallel, and one slow poll
    /// delays no other worker. A work that panics still releases its key (the value it held is
    /// dropped; the next push for the key brings it back): the panic is logged, and until
    /// `stop` a new worker takes the lost one's place.
    pub async fn serve<F, Fut>(self: &Arc<Self>, workers: usize, stop: &CancellationToken, work: F)
    where
        K: Send + 'static,
        V: Send + 'static,
        F: Fn(K, V) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // As many permits as workers: a gate that never holds one back.
        let gate = Arc::new(Semaphore::new(workers.max(1)));
        self.serve_within(workers, gate, stop, work).await;
    }

    /// As [`WorkQueue::serve`], with each worker taking a permit of `gate` before it takes a
    /// key and releasing it when the key's work ends: as many keys are worked on at once as
    /// the gate has permits (at most `workers`), however their number changes meanwhile. A
    /// worker waits for work before it takes a permit, so idle workers hold none (queues may
    /// share a gate), and takes the key only once it has one, so no worker holds a key's value
    /// while it waits: a newer value pushed meanwhile replaces it instead of following it.
    pub async fn serve_within<F, Fut>(
        self: &Arc<Self>,
        workers: usize,
        gate: Arc<Semaphore>,
        stop: &CancellationToken,
        work: F,
    ) where
        K: Send + 'static,
        V: Send + 'static,
        F: Fn(K, V) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut running = JoinSet::new();
        let worker = |running: &mut JoinSet<()>| {
            running.spawn(Arc::clone(self).work_until(
                stop.clone(),
                Arc::clone(&gate),
                work.clone(),
            ));
        };
        for _ in 0..workers.max(1) {
            worker(&mut running);
        }
        let supervise = async {
            while let Some(ended) = running.join_next().await {
                let Err(error) = ended else { continue };
                if stop.is_cancelled() {
                    error!(%error, "a work queue worker failed while stopping");
                } else {
                    error!(%error, "a work queue worker panicked; its key is released and a new worker takes its place");
                    worker(&mut running);
                }
            }
        };
        tokio::join!(supervise, self.release_delayed(stop));
    }

    /// One worker of [`WorkQueue::serve`].
    async fn work_until<F, Fut>(
        self: Arc<Self>,
        stop: CancellationToken,
        gate: Arc<Semaphore>,
        work: F,
    ) where
        F: Fn(K, V) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            // Work first, then the permit, then the key: an idle worker holds no permit of a
            // gate other queues may share, and none holds a value while it waits for one.
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.ready_work() => {}
            }
            // A closed gate no longer limits anything.
            let permit = tokio::select! {
                () = stop.cancelled() => return,
                permit = Arc::clone(&gate).acquire_owned() => permit.ok(),
            };
            // Another worker may have taken the key meanwhile: then wait again.
            let Some((key, value)) = self.try_next() else {
                continue;
            };
            let held = Held { queue: &self, key };
            Box::pin(work(held.key.clone(), value)).await;
            drop((held, permit));
        }
    }

    /// Waits until a key may be ready to take (it may be gone by the time it is taken).
    async fn ready_work(&self) {
        loop {
            // Registered before looking, so a push between the look and the wait is not missed.
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.state().order.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Whether `key` has a value waiting (for its turn or its time) or is worked on (or held).
    pub fn is_busy(&self, key: &K) -> bool {
        let state = self.state();
        state.pending.contains_key(key)
            || state.working.contains(key)
            || state.delayed.contains_key(key)
    }

    /// Keys waiting (not counting those being worked on).
    pub fn len(&self) -> usize {
        self.state().pending.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A key a worker holds: released when dropped, so also when its work
/// panics or is aborted.
#[derive(Debug)]
pub struct Held<'a, K: Eq + Hash + Clone, V> {
    queue: &'a WorkQueue<K, V>,
    key: K,
}

impl<K: Eq + Hash + Clone, V> Drop for Held<'_, K, V> {
    fn drop(&mut self) {
        self.queue.done(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_latest_value_wins_and_order_is_first_pushed_first() {
        let queue = WorkQueue::default();
        queue.push("a", 1);
        queue.push("b", 1);
        queue.push("a", 2);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.try_next(), Some(("a", 2)));
        assert_eq!(queue.try_next(), Some(("b", 1)));
        assert_eq!(queue.try_next(), None);
    }

    #[test]
    fn a_key_is_busy_from_its_push_until_its_work_is_done() {
        let queue = WorkQueue::default();
        assert!(!queue.is_busy(&"a"));
        queue.push("a", 1);
        assert!(queue.is_busy(&"a"), "waiting");
        let (key, _) = queue.try_next().unwrap();
        assert!(queue.is_busy(&"a"), "worked on");
        queue.done(&key);
        assert!(!queue.is_busy(&"a"), "done");
    }

    #[test]
    fn a_key_being_worked_on_is_not_handed_out_again_until_done() {
        let queue = WorkQueue::default();
        queue.push("a", 1);
        assert_eq!(queue.try_next(), Some(("a", 1)));
        queue.push("a", 2);
        queue.push("a", 3);
        queue.push("b", 1);
        // "a" is held: only "b" is available.
        assert_eq!(queue.try_next(), Some(("b", 1)));
        assert_eq!(queue.try_next(), None);
        queue.done(&"a");
        assert_eq!(queue.try_next(), Some(("a", 3)));
        queue.done(&"a");
        queue.done(&"b");
        assert!(queue.is_empty());
        assert_eq!(queue.try_next(), None);
    }

    #[tokio::test]
    async fn served_workers_take_every_key_once_and_stop_when_told() {
        let queue = Arc::new(WorkQueue::default());
        for key in 0..50 {
            queue.push(key, key);
        }
        let stop = CancellationToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let serving = {
            let (queue, stop, seen) = (Arc::clone(&queue), stop.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                queue
                    .serve(4, &stop, move |key, value| {
                        let seen = Arc::clone(&seen);
                        async move {
                            assert_eq!(key, value);
                            seen.lock().push(key);
                            tokio::task::yield_now().await;
                        }
                    })
                    .await;
            })
        };
        while seen.lock().len() < 50 {
            tokio::task::yield_now().await;
        }
        stop.cancel();
        serving.await.unwrap();
        let mut keys = seen.lock().clone();
        keys.sort_unstable();
        assert_eq!(keys, (0..50).collect::<Vec<_>>());
        assert!(queue.is_empty());
    }

    /// Workers are tasks of their own: on a runtime with two threads, two works that each hold
    /// their thread until the other has started both run. Polled by one task, the first would
    /// wait out its bound alone and the second start only after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_run_in_parallel_on_a_multi_thread_runtime() {
        let queue = Arc::new(WorkQueue::default());
        queue.push("a", ());
        queue.push("b", ());
        let started = Arc::new((Mutex::new(0_usize), parking_lot::Condvar::new()));
        let met = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let serving = {
            let (queue, stop) = (Arc::clone(&queue), stop.clone());
            let (started, met) = (Arc::clone(&started), Arc::clone(&met));
            tokio::spawn(async move {
                queue
                    .serve(2, &stop, move |key, ()| {
                        let (started, met) = (Arc::clone(&started), Arc::clone(&met));
                        async move {
                            let (count, changed) = &*started;
                            let mut count = count.lock();
                            *count += 1;
                            changed.notify_all();
                            // Blocks this thread on purpose: only another thread can wake it.
                            let waited = changed.wait_while_for(
                                &mut count,
                                |n| *n < 2,
                                Duration::from_secs(10),
                            );
                            drop(count);
                            met.lock().push((key, !waited.timed_out()));
                        }
                    })
                    .await;
            })
        };
        while met.lock().len() < 2 {
            tokio::task::yield_now().await;
        }
        stop.cancel();
        serving.await.unwrap();
        let mut met = met.lock().clone();
        met.sort_unstable();
        assert_eq!(
            met,
            vec![("a", true), ("b", true)],
            "each work saw the other start"
        );
    }

    #[tokio::test]
    async fn a_panicking_work_releases_its_key_and_a_new_worker_takes_over() {
        let queue = Arc::new(WorkQueue::default());
        queue.push("a", 1);
        let stop = CancellationToken::new();
        let (panicking, mut panicked) = tokio::sync::mpsc::unbounded_channel();
        let (done, mut worked) = tokio::sync::mpsc::unbounded_channel();
        let serving = {
            let (queue, stop) = (Arc::clone(&queue), stop.clone());
            tokio::spawn(async move {
                queue
                    .serve(1, &stop, move |key, value| {
                        let (panicking, done) = (panicking.clone(), done.clone());
                        async move {
                            if value == 1 {
                                panicking.send(()).unwrap();
                                panic!("the work for value 1 fails");
                            }
                            done.send((key, value)).unwrap();
                        }
                    })
                    .await;
            })
        };
        panicked.recv().await.unwrap();
        // Waits for "a" to be released, and for a worker to take it: the only one panicked.
        queue.push("a", 2);
        let next = tokio::time::timeout(Duration::from_secs(10), worked.recv()).await;
        assert_eq!(next.expect("a new worker took the key"), Some(("a", 2)));
        stop.cancel();
        serving.await.unwrap();
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_bounds_the_keys_worked_on_at_once_and_no_worker_holds_a_stale_value() {
        let queue = Arc::new(WorkQueue::default());
        let gate = Arc::new(Semaphore::new(2));
        let stop = CancellationToken::new();
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let serving = {
            let (queue, gate, stop, release) = (
                Arc::clone(&queue),
                Arc::clone(&gate),
                stop.clone(),
                Arc::clone(&release),
            );
            tokio::spawn(async move {
                queue
                    .serve_within(8, gate, &stop, move |key, value| {
                        let (started, release) = (started.clone(), Arc::clone(&release));
                        async move {
                            started.send((key, value)).unwrap();
                            release.notified().await;
                        }
                    })
                    .await;
            })
        };
        for key in 0..4 {
            queue.push(key, 0);
        }
        let mut first = vec![starts.recv().await.unwrap(), starts.recv().await.unwrap()];
        first.sort_unstable();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            starts.try_recv().is_err(),
            "eight workers, two permits: two keys at once"
        );
        // Keys 2 and 3 wait in the queue, not in a worker: their newer values replace them.
        queue.push(2, 1);
        queue.push(3, 1);
        gate.add_permits(2);
        let mut next = vec![starts.recv().await.unwrap(), starts.recv().await.unwrap()];
        next.sort_unstable();
        assert_eq!(first, vec![(0, 0), (1, 0)]);
        assert_eq!(
            next,
            vec![(2, 1), (3, 1)],
            "each key worked on once, with its latest value"
        );
        stop.cancel();
        release.notify_waiters();
        serving.await.unwrap();
    }

    /// Queues sharing a gate: the idle workers of one hold none of its permits, so the other's
    /// work goes on.
    #[tokio::test(start_paused = true)]
    async fn idle_workers_hold_no_permit_of_a_gate_other_queues_share() {
        let gate = Arc::new(Semaphore::new(1));
        let stop = CancellationToken::new();
        let idle: Arc<WorkQueue<u32, u32>> = Arc::new(WorkQueue::default());
        let busy: Arc<WorkQueue<u32, u32>> = Arc::new(WorkQueue::default());
        let (done, mut worked) = tokio::sync::mpsc::unbounded_channel();
        let serving = {
            let (idle, busy, gate, stop) = (
                Arc::clone(&idle),
                Arc::clone(&busy),
                Arc::clone(&gate),
                stop.clone(),
            );
            tokio::spawn(async move {
                let nothing = idle.serve_within(4, Arc::clone(&gate), &stop, |_, _| async {});
                let reporting = busy.serve_within(4, gate, &stop, move |key, value| {
                    let done = done.clone();
                    async move { done.send((key, value)).unwrap() }
                });
                tokio::join!(nothing, reporting);
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        for key in 0..3 {
            busy.push(key, key);
        }
        let mut seen = Vec::new();
        for _ in 0..3 {
            let next = tokio::time::timeout(Duration::from_secs(10), worked.recv()).await;
            seen.push(next.expect("the shared permit is free").unwrap());
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, 0), (1, 1), (2, 2)]);
        assert_eq!(gate.available_permits(), 1, "every permit back once idle");
        stop.cancel();
        serving.await.unwrap();
    }

    /// Serves `queue` with one worker that reports each (key, value) it takes, until `stop`.
    fn report_work(
        queue: &Arc<WorkQueue<&'static str, u32>>,
        stop: &CancellationToken,
    ) -> (
        tokio::task::JoinHandle<()>,
        tokio::sync::mpsc::UnboundedReceiver<(&'static str, u32)>,
    ) {
        let (done, worked) = tokio::sync::mpsc::unbounded_channel();
        let (queue, stop) = (Arc::clone(queue), stop.clone());
        let serving = tokio::spawn(async move {
            queue
                .serve(1, &stop, move |key, value| {
                    let done = done.clone();
                    async move { done.send((key, value)).unwrap() }
                })
                .await;
        });
        (serving, worked)
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_given_for_later_is_worked_on_when_its_time_comes_and_not_before() {
        let queue = Arc::new(WorkQueue::default());
        let stop = CancellationToken::new();
        let (serving, mut worked) = report_work(&queue, &stop);
        let given = tokio::time::Instant::now();
        queue.push_after("a", 1, Duration::from_secs(30));
        queue.push_after("b", 1, Duration::from_secs(10));
        assert!(
            queue.is_busy(&"a") && queue.is_empty(),
            "waiting for its time"
        );
        assert_eq!(worked.recv().await, Some(("b", 1)));
        assert_eq!(given.elapsed(), Duration::from_secs(10));
        assert_eq!(worked.recv().await, Some(("a", 1)));
        assert_eq!(given.elapsed(), Duration::from_secs(30));
        assert_eq!(queue.delayed_len(), 0);
        stop.cancel();
        serving.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_pushed_now_supersedes_one_waiting_for_its_time_and_a_later_one_moves_it() {
        let queue = Arc::new(WorkQueue::default());
        let stop = CancellationToken::new();
        let (serving, mut worked) = report_work(&queue, &stop);
        let given = tokio::time::Instant::now();
        queue.push_after("a", 1, Duration::from_secs(5));
        queue.push("a", 2);
        assert_eq!(worked.recv().await, Some(("a", 2)));
        queue.push_after("b", 1, Duration::from_secs(5));
        queue.push_after("b", 2, Duration::from_secs(20));
        assert_eq!(
            worked.recv().await,
            Some(("b", 2)),
            "the later value, at its time"
        );
        assert_eq!(given.elapsed(), Duration::from_secs(20));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(worked.try_recv().is_err(), "each value worked on once");
        stop.cancel();
        serving.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_pushed_by_a_time_keeps_an_earlier_one() {
        let queue = Arc::new(WorkQueue::default());
        let stop = CancellationToken::new();
        let (serving, mut worked) = report_work(&queue, &stop);
        let given = tokio::time::Instant::now();
        queue.push_by("a", 1, Duration::from_secs(5));
        queue.push_by("a", 2, Duration::from_secs(20));
        assert_eq!(worked.recv().await, Some(("a", 2)), "the latest value");
        assert_eq!(
            given.elapsed(),
            Duration::from_secs(5),
            "at the earlier time"
        );
        queue.push_by("b", 1, Duration::from_secs(20));
        queue.push_by("b", 2, Duration::from_secs(5));
        assert_eq!(worked.recv().await, Some(("b", 2)));
        assert_eq!(given.elapsed(), Duration::from_secs(10), "moved sooner");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(worked.try_recv().is_err(), "each key worked on once");
        stop.cancel();
        serving.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn values_released_now_are_worked_on_at_once_and_the_others_wait() {
        let queue = Arc::new(WorkQueue::default());
        let stop = CancellationToken::new();
        let (serving, mut worked) = report_work(&queue, &stop);
        let given = tokio::time::Instant::now();
        queue.push_after("a", 1, Duration::from_secs(30));
        queue.push_after("b", 2, Duration::from_secs(30));
        queue.release_now(|value| *value == 2);
        assert_eq!(worked.recv().await, Some(("b", 2)));
        assert_eq!(given.elapsed(), Duration::ZERO);
        assert_eq!(worked.recv().await, Some(("a", 1)));
        assert_eq!(given.elapsed(), Duration::from_secs(30));
        stop.cancel();
        serving.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_key_is_not_worked_on_whether_it_waited_for_its_turn_or_its_time() {
        let queue = Arc::new(WorkQueue::default());
        queue.push("now", 1);
        queue.push_after("later", 2, Duration::from_secs(5));
        queue.push("kept", 3);
        queue.forget(&"now");
        queue.forget(&"later");
        assert!(!queue.is_busy(&"now") && !queue.is_busy(&"later"));
        assert_eq!(queue.delayed_len(), 0);
        let stop = CancellationToken::new();
        let (serving, mut worked) = report_work(&queue, &stop);
        assert_eq!(worked.recv().await, Some(("kept", 3)));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            worked.try_recv().is_err(),
            "nothing forgotten was worked on"
        );
        stop.cancel();
        serving.await.unwrap();
    }

    /// The timer queue refuses times more than about two years ahead: a longer delay waits a
    /// day rather than stop the process.
    #[tokio::test(start_paused = true)]
    async fn a_delay_of_years_waits_a_day() {
        let queue = Arc::new(WorkQueue::default());
        let stop = CancellationToken::new();
        let (serving, mut worked) = report_work(&queue, &stop);
        let given = tokio::time::Instant::now();
        queue.push_after("a", 1, Duration::from_secs(u64::MAX / 2));
        assert_eq!(worked.recv().await, Some(("a", 1)));
        assert_eq!(given.elapsed(), LONGEST_DELAY);
        stop.cancel();
        serving.await.unwrap();
    }

    #[tokio::test]
    async fn waiting_workers_wake_for_each_push() {
        let queue = Arc::new(WorkQueue::default());
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let queue = Arc::clone(&queue);
                tokio::spawn(async move {
                    let (key, value) = queue.next().await;
                    queue.done(&key);
                    (key, value)
                })
            })
            .collect();
        tokio::task::yield_now().await;
        for key in 0..4 {
            queue.push(key, key * 10);
        }
        let mut seen = Vec::new();
        for worker in workers {
            seen.push(worker.await.unwrap());
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, 0), (1, 10), (2, 20), (3, 30)]);
        assert!(queue.is_empty());
    }
}
