//! Timestamps as the Kubernetes API writes them.

use std::time::SystemTime;

/// RFC 3339 at second precision in UTC, as the API writes `Time` fields
/// (`2026-11-29T01:02:03Z`).
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn seconds_in_utc() {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_378_123_999);
        assert_eq!(super::rfc3339(at), "2025-11-29T01:02:03Z");
    }
}
