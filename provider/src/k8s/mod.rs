//! The Kubernetes edge shared by every area: the access declarations RBAC is generated from,
//! Lease holding (node Lease, elections), quantities and a pod's requests (`vne_core`'s) and
//! the serving certificate shared through a Secret (webhook, scheduler extender), and who is
//! calling a listener (`callers`: client certificates, TokenReview, SubjectAccessReview), and
//! the one pod and node watch per replica the areas share (`shared_watch`), and a replica's
//! share of the apiserver writes the fleet makes together (`write_share`).
//! A leaf: it calls no area.

pub mod access;
pub mod callers;
pub mod election;
pub mod serving_cert;
pub mod shared_watch;
pub mod write_share;

use std::time::SystemTime;

/// The daemon's name where the apiserver records who wrote: the field manager of its
/// server-side applies (the fields it owns) and the reporting controller of its Events.
pub const FIELD_MANAGER: &str = "virtual-node-eci";

pub use vne_core::time::rfc3339;
pub use vne_core::{quantity, requests};

/// RFC 3339 with microseconds, for logs and messages. Unlike humantime's formatter, which
/// panics on times before 1970, any time a Lease may carry is written (or shown as is).
pub fn rfc3339_micros(at: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .map(|t| format!("{t:.6}"))
        .unwrap_or_else(|_| format!("{at:?}"))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_before_1970_are_written_not_a_panic() {
        assert_eq!(
            super::rfc3339_micros(UNIX_EPOCH + Duration::from_micros(1_500_000)),
            "1970-01-01T00:00:01.500000Z"
        );
        let before = UNIX_EPOCH - Duration::from_secs(86_400);
        assert_eq!(super::rfc3339_micros(before), "1969-12-31T00:00:00.000000Z");
    }
}
