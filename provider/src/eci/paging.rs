//! Calls that change nothing (pages of ECI listings, logs, exec sessions, metrics): each
//! attempt is one call of its own action, drawn from that action's budget, and an attempt the
//! service throttles is made again after a back-off rather than failing (a poll of hundreds of
//! groups is many pages, and one `Throttling.*` answer among them must not throw the others'
//! work away; a user's `kubectl logs` should wait a moment, not fail).

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use eci_proto::EciError;
use tracing::debug;

use super::rate_budget::Pacer;

/// Pages of one listing fetched at the same time: enough to hide a round trip, few enough
/// that one listing cannot empty the action's budget for everything else.
pub const PAGE_CONCURRENCY: usize = 4;

/// Whether ECI refused the call for its rate (`Throttling`, `Throttling.User`,
/// `Throttling.Api`, …): the call did nothing and may be made again.
pub fn is_throttled(error: &EciError) -> bool {
    error.code == "Throttling" || error.code.starts_with("Throttling.")
}

/// How a throttled page is retried: a few times, backing off with jitter so replicas that
/// were throttled together do not come back together.
pub fn page_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(5)
        .with_jitter()
}

/// Makes one page call of `action`, each attempt paced by `pacer` (when pacing is on) and
/// retried while the service answers `Throttling*`; other errors end it at once.
pub async fn page<T, F, Fut>(
    pacer: Option<&Pacer>,
    action: &'static str,
    call: F,
) -> Result<T, EciError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EciError>>,
{
    let mut call = call;
    let attempt = || {
        let next = call();
        async move {
            if let Some(pacer) = pacer {
                pacer.acquire(action).await;
            }
            next.await
        }
    };
    attempt
        .retry(page_backoff())
        .sleep(tokio::time::sleep)
        .when(is_throttled)
        .notify(|error, after| {
            debug!(action, code = %error.code, retry_in = ?after, "page throttled; fetching it again");
        })
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn which_answers_are_throttling() {
        for (code, throttled) in [
            ("Throttling", true),
            ("Throttling.User", true),
            ("Throttling.Api", true),
            ("ThrottlingX", false),
            ("ServiceUnavailable", false),
            ("InvalidContainerGroup.NotFound", false),
        ] {
            assert_eq!(is_throttled(&EciError::new(code, "")), throttled, "{code}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_page_is_fetched_again() {
        let calls = AtomicU32::new(0);
        let result = page(None, "DescribeContainerGroups", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(EciError::new("Throttling.User", "slow down")),
                _ => Ok("page"),
            }
        })
        .await;
        assert_eq!(result.ok(), Some("page"));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_end_at_once_and_throttling_gives_up_eventually() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = page(None, "DescribeContainerGroups", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(EciError::new("InvalidParameter", "no"))
        })
        .await;
        assert_eq!(
            result.map_err(|e| e.code).err().as_deref(),
            Some("InvalidParameter")
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        calls.store(0, Ordering::SeqCst);
        let result: Result<(), _> = page(None, "DescribeContainerGroups", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(EciError::new("Throttling.User", "slow down"))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            6,
            "the first try and five retries"
        );
    }
}
