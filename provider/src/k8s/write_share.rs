//! A replica's share of the apiserver writes the daemons make together.
//!
//! Every replica writes its own pods' statuses, removals and Events, and all of them write to
//! the same apiserver — as they call the same ECI account, whose quotas `fleet::replicas`
//! already divides among the live replicas. Writes in flight are divided the same way: a
//! budget for the whole fleet, [`share_of`] it per replica, so ten replicas put no more writes
//! in the apiserver's flight than one did.
//!
//! Why: replicas that each keep a whole budget in flight multiply the apiserver's mutating
//! requests in flight by their count; past its in-flight limit it queues the rest, and every
//! request costs it more CPU the more it holds at once. The same pods then start later over
//! ten replicas than over one, and a share of one budget keeps the fleet's pressure that of a
//! single replica (measured: docs/performance.md).
//!
//! Rules:
//! - A share is at least its floor, however many replicas: a replica always makes progress.
//! - It is the budget divided among the live replicas, rounded up: the fleet together may
//!   exceed the budget by less than one write per replica.
//! - It follows the count: a grown share admits more writes at once; a shrunk one takes its
//!   permits back as writes in flight finish (none is cut off).
//!
//! A `tokio` semaphore holds the permits; no maintained crate resizes one, hence this file.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// A replica's share of `budget` when `replicas` are alive (pure): rounded up, at least
/// `floor`.
pub fn share_of(budget: usize, floor: usize, replicas: u32) -> usize {
    let replicas = usize::try_from(replicas.max(1)).unwrap_or(usize::MAX);
    budget.div_ceil(replicas).max(floor)
}

/// Writes in flight this replica may have of one kind (see the module's rules).
#[derive(Debug)]
pub struct WriteShare {
    name: &'static str,
    budget: usize,
    floor: usize,
    permits: Arc<Semaphore>,
    /// The share now: what the permits are being brought to.
    size: AtomicUsize,
    /// The live replicas the share was last sized for (at least one).
    replicas: AtomicU32,
}

impl WriteShare {
    /// A share of `budget`, as the only replica until [`Self::follow`] learns the count.
    pub fn new(name: &'static str, budget: usize, floor: usize) -> Arc<Self> {
        let size = share_of(budget, floor, 1);
        Arc::new(Self {
            name,
            budget,
            floor,
            permits: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
            replicas: AtomicU32::new(1),
        })
    }

    /// How many replicas share the budget now (at least one).
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed)
    }

    /// The share now.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// The semaphore whose permits are the share (for a work queue to take one per worker).
    pub fn permits(&self) -> Arc<Semaphore> {
        Arc::clone(&self.permits)
    }

    /// Waits for a permit: one write may go.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        match Arc::clone(&self.permits).acquire_owned().await {
            Ok(permit) => permit,
            // The semaphore is never closed: this type owns it and closes nothing.
            Err(_) => unreachable!("a write share's semaphore is never closed"),
        }
    }

    /// Whether every permit is taken (writes of this kind wait, or would).
    pub fn all_taken(&self) -> bool {
        self.permits.available_permits() == 0
    }

    /// Keeps the share at this replica's part of the budget as `replicas` changes, until
    /// `stop` (or until the count's sender is gone: the share then stays as it is).
    pub async fn follow(&self, mut replicas: watch::Receiver<u32>, stop: CancellationToken) {
        loop {
            let count = *replicas.borrow_and_update();
            self.replicas.store(count.max(1), Ordering::Relaxed);
            let wanted = share_of(self.budget, self.floor, count);
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.resize(wanted) => {}
            }
            tokio::select! {
                () = stop.cancelled() => return,
                changed = replicas.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Brings the permits to `wanted`: added at once, or taken back as they are released.
    async fn resize(&self, wanted: usize) {
        let was = self.size.swap(wanted, Ordering::Relaxed);
        if wanted == was {
            return;
        }
        debug!(
            share = self.name,
            was,
            now = wanted,
            "apiserver write share resized"
        );
        if wanted > was {
            self.permits.add_permits(wanted - was);
            return;
        }
        let surplus = u32::try_from(was - wanted).unwrap_or(u32::MAX);
        if let Ok(taken) = Arc::clone(&self.permits).acquire_many_owned(surplus).await {
            taken.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_share_is_the_budget_divided_rounded_up_and_never_below_its_floor() {
        for (budget, floor, replicas, share) in [
            (32, 2, 1, 32),
            (32, 2, 0, 32), // not counted yet: as the only replica
            (32, 2, 2, 16),
            (32, 2, 10, 4), // 3.2, rounded up
            (64, 1, 10, 7),
            (32, 2, 30, 2), // the floor
            (32, 2, u32::MAX, 2),
        ] {
            assert_eq!(
                share_of(budget, floor, replicas),
                share,
                "{budget} over {replicas}, floor {floor}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_share_follows_the_replica_count_and_shrinks_as_writes_finish() {
        let share = WriteShare::new("statuses", 32, 2);
        let (count, replicas) = watch::channel(1);
        let stop = CancellationToken::new();
        let following = {
            let (share, stop) = (Arc::clone(&share), stop.clone());
            tokio::spawn(async move { share.follow(replicas, stop).await })
        };
        let mut in_flight = Vec::new();
        for _ in 0..10 {
            in_flight.push(share.acquire().await);
        }

        count.send_replace(10);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(share.size(), 4);
        assert_eq!(share.replicas(), 10);
        assert!(
            share.all_taken(),
            "ten writes in flight are over the new share of four: no eleventh goes"
        );
        assert_eq!(in_flight.len(), 10, "none in flight is cut off");
        in_flight.truncate(3);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            share.permits.available_permits(),
            1,
            "seven finished: the six over the share are taken back, one is free"
        );

        count.send_replace(2);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(share.size(), 16);
        assert_eq!(share.permits.available_permits(), 13);

        stop.cancel();
        following.await.unwrap();
    }
}
