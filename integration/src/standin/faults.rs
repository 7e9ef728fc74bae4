//! Fault controls for tests: failing or slow requests, closed watches, expired watches.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// Requests whose path starts with this (e.g. `/api/v1/namespaces/default/pods`).
    pub path_prefix: String,
    /// Only this method (`GET`, `PATCH`, …); all when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// Answer with this status (429, 500, 503, …) instead of serving.
    #[serde(default)]
    pub status: Option<u16>,
    /// Delay before answering (or serving).
    #[serde(default)]
    pub latency_ms: u64,
    /// For this many requests (all when absent).
    #[serde(default)]
    pub count: Option<u32>,
    /// For this long from now (forever when absent).
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

#[derive(Debug)]
struct ActiveRule {
    rule: FaultRule,
    remaining: Option<u32>,
    until: Option<Instant>,
}

/// What a fault rule decided for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injected {
    /// Wait this long first.
    pub latency: Duration,
    /// Then answer with this status, if set.
    pub status: Option<u16>,
}

/// The fault switches.
#[derive(Debug)]
pub struct Faults {
    rules: Mutex<Vec<ActiveRule>>,
    expire_next_watches: AtomicU32,
    close_watches: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rules: Mutex::new(Vec::new()),
            expire_next_watches: AtomicU32::new(0),
            close_watches: watch::channel(0).0,
        }
    }
}

impl Faults {
    /// Adds a rule.
    pub fn add(&self, rule: FaultRule) {
        let until = rule
            .duration_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let remaining = rule.count;
        self.lock().push(ActiveRule {
            rule,
            remaining,
            until,
        });
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock().clear();
        self.expire_next_watches.store(0, Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ActiveRule>> {
        self.rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fault for a request, consuming one use of the first matching rule.
    pub fn check(&self, method: &str, path: &str) -> Option<Injected> {
        let mut rules = self.lock();
        let now = Instant::now();
        rules.retain(|active| {
            active.until.is_none_or(|until| until > now) && active.remaining != Some(0)
        });
        let active = rules.iter_mut().find(|active| {
            path.starts_with(&active.rule.path_prefix)
                && active
                    .rule
                    .method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(method))
        })?;
        if let Some(remaining) = active.remaining.as_mut() {
            *remaining -= 1;
        }
        Some(Injected {
            latency: Duration::from_millis(active.rule.latency_ms),
            status: active.rule.status,
        })
    }

    /// The next `count` watches are answered with 410 Gone.
    pub fn expire_next_watches(&self, count: u32) {
        self.expire_next_watches.fetch_add(count, Ordering::SeqCst);
    }

    /// Whether this watch must be answered with 410 (consumes one).
    pub fn take_expired_watch(&self) -> bool {
        self.expire_next_watches
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Ends every open watch.
    pub fn close_watches(&self) {
        self.close_watches
            .send_modify(|generation| *generation += 1);
    }

    /// Notified when watches must close.
    pub fn watch_closer(&self) -> watch::Receiver<u64> {
        self.close_watches.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_by_prefix_and_method_and_run_out() {
        let faults = Faults::default();
        faults.add(FaultRule {
            path_prefix: "/api/v1/nodes".into(),
            method: Some("PATCH".into()),
            status: Some(500),
            latency_ms: 0,
            count: Some(2),
            duration_ms: None,
        });
        assert_eq!(faults.check("GET", "/api/v1/nodes/n1"), None);
        assert_eq!(
            faults.check("PATCH", "/api/v1/nodes/n1").unwrap().status,
            Some(500)
        );
        assert!(faults.check("patch", "/api/v1/nodes/n1/status").is_some());
        assert_eq!(faults.check("PATCH", "/api/v1/nodes/n1"), None);
        faults.expire_next_watches(1);
        assert!(faults.take_expired_watch());
        assert!(!faults.take_expired_watch());
    }
}
