//! Retry delays read by how many times the work failed, for work that is queued again rather
//! than retried in a loop (a work queue's value, a controller's requeue, a refusal remembered
//! per key): backon's exponential back-off, so that every retry in the daemon is backon's.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};

/// Most doublings read: past them every delay is the cap (and `1 << n` cannot overflow).
const MOST_DOUBLINGS: usize = 16;

/// The delay `delays` gives before retry `attempt` (from 0), or its cap once the delays run
/// out.
pub fn nth(delays: ExponentialBuilder, attempt: u32) -> Duration {
    let attempt = usize::try_from(attempt)
        .unwrap_or(usize::MAX)
        .min(MOST_DOUBLINGS);
    let mut each = delays.build();
    let mut last = None;
    for _ in 0..=attempt {
        match each.next() {
            Some(delay) => last = Some(delay),
            None => break,
        }
    }
    last.unwrap_or_default()
}

/// Doubling from `first` up to `cap`, without jitter or a limit on tries.
pub fn doubling(first: Duration, cap: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(cap)
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_doubles_the_delay_up_to_the_cap() {
        let delays = doubling(Duration::from_secs(2), Duration::from_secs(30));
        let read: Vec<u64> = (0..8).map(|n| nth(delays, n).as_secs()).collect();
        assert_eq!(read, [2, 4, 8, 16, 30, 30, 30, 30]);
        assert_eq!(nth(delays, u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn delays_that_run_out_repeat_their_last() {
        let three = doubling(Duration::from_secs(1), Duration::from_secs(60)).with_max_times(3);
        assert_eq!(nth(three, 10), Duration::from_secs(4));
    }
}
