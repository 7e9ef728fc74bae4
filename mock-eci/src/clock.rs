//! Wall-clock time derived from tokio's clock, so paused-time tests drive every timestamp.
//!
//! The engine works in milliseconds since the Unix epoch. Reading them from
//! [`tokio::time::Instant`] (offset by the wall time at start) keeps the whole mock
//! deterministic under `tokio::time::pause`, while a real run still reports real times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A wall clock that advances with tokio's (pausable) clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base_wall: Millis,
    base_instant: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the current wall time now.
    pub fn new() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| {
                Millis::try_from(elapsed.as_millis()).unwrap_or(Millis::MAX)
            });
        Self::starting_at(wall)
    }

    /// A clock that reads `wall` now (tests pin the epoch with it).
    pub fn starting_at(wall: Millis) -> Self {
        Self {
            base_wall: wall,
            base_instant: tokio::time::Instant::now(),
        }
    }

    /// The current time.
    pub fn now(&self) -> Millis {
        let elapsed = self.base_instant.elapsed().as_millis();
        self.base_wall + Millis::try_from(elapsed).unwrap_or(Millis::MAX / 2)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Formats as RFC 3339 with second precision (`2026-11-21T02:16:28Z`), as ECI reports times.
pub fn rfc3339(at: Millis) -> String {
    humantime::format_rfc3339_seconds(system_time(at)).to_string()
}

/// Formats as RFC 3339 with milliseconds (change times precise enough to measure latency).
pub fn rfc3339_millis(at: Millis) -> String {
    humantime::format_rfc3339_millis(system_time(at)).to_string()
}

/// Formats as RFC 3339 with nanoseconds, as log timestamps are written.
pub fn rfc3339_nanos(at: Millis) -> String {
    humantime::format_rfc3339_nanos(system_time(at)).to_string()
}

/// Parses an RFC 3339 timestamp.
pub fn parse_rfc3339(text: &str) -> Option<Millis> {
    let time = humantime::parse_rfc3339_weak(text).ok()?;
    let elapsed = time.duration_since(UNIX_EPOCH).ok()?;
    Millis::try_from(elapsed.as_millis()).ok()
}

/// Milliseconds in a duration, saturating.
pub fn millis(duration: Duration) -> Millis {
    Millis::try_from(duration.as_millis()).unwrap_or(Millis::MAX / 2)
}

fn system_time(at: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(at.max(0)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_rfc3339() {
        let at = 1_456_231_584_000; // 2016-02-23T12:46:24Z
        assert_eq!(rfc3339(at), "2016-02-23T12:46:24Z");
        assert_eq!(parse_rfc3339("2016-02-23T12:46:24Z"), Some(at));
        assert_eq!(rfc3339_nanos(at + 5), "2016-02-23T12:46:24.005000000Z");
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn follows_paused_time() {
        let clock = Clock::starting_at(1_000);
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert_eq!(clock.now(), 3_500);
    }
}
