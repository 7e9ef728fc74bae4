//! A keyed work queue: the latest value per key wins, and a key is worked on by one worker at
//! a time (a value pushed while its key is being worked on waits for that work to finish).
//!
//! The pod status pipeline uses it between the ECI poll and the status writers: a poll never
//! waits for writes, a pod that changed twice before its turn is written once with the latest
//! state, and two writes of one pod never race each other.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct State<K, V> {
    /// Keys with a pending value, oldest first (each at most once).
    order: VecDeque<K>,
    pending: HashMap<K, V>,
    /// Keys a worker holds.
    working: HashSet<K>,
}

/// The queue (share it behind an `Arc`).
#[derive(Debug)]
pub struct WorkQueue<K, V> {
    state: Mutex<State<K, V>>,
    ready: Notify,
}

impl<K: Eq + Hash + Clone, V> Default for WorkQueue<K, V> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                order: VecDeque::new(),
                pending: HashMap::new(),
                working: HashSet::new(),
            }),
            ready: Notify::new(),
        }
    }
}

impl<K: Eq + Hash + Clone, V> WorkQueue<K, V> {
    fn state(&self) -> MutexGuard<'_, State<K, V>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `value` for `key`, replacing a value still waiting for it.
    pub fn push(&self, key: K, value: V) {
        let mut state = self.state();
        let waiting = state.pending.insert(key.clone(), value).is_some();
        if !waiting && !state.working.contains(&key) {
            state.order.push_back(key);
            drop(state);
            self.ready.notify_one();
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
        if state.pending.contains_key(key) {
            state.order.push_back(key.clone());
            drop(state);
            self.ready.notify_one();
        }
    }

    /// Runs `workers` workers until `stop`: each takes the next key, awaits `work` on it (boxed,
    /// so an idle worker holds a pointer rather than the state of a request in flight) and
    /// releases the key.
    pub async fn serve<F, Fut>(&self, workers: usize, stop: &CancellationToken, work: F)
    where
        F: Fn(K, V) -> Fut,
        Fut: Future<Output = ()>,
    {
        let worker = || async {
            loop {
                let (key, value) = tokio::select! {
                    () = stop.cancelled() => return,
                    next = self.next() => next,
                };
                Box::pin(work(key.clone(), value)).await;
                self.done(&key);
            }
        };
        futures::future::join_all((0..workers.max(1)).map(|_| worker())).await;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

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
                    .serve(4, &stop, |key, value| {
                        let seen = Arc::clone(&seen);
                        async move {
                            assert_eq!(key, value);
                            seen.lock().unwrap().push(key);
                            tokio::task::yield_now().await;
                        }
                    })
                    .await;
            })
        };
        while seen.lock().unwrap().len() < 50 {
            tokio::task::yield_now().await;
        }
        stop.cancel();
        serving.await.unwrap();
        let mut keys = seen.lock().unwrap().clone();
        keys.sort_unstable();
        assert_eq!(keys, (0..50).collect::<Vec<_>>());
        assert!(queue.is_empty());
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
