//! Which of a group's ECI events are new, so each becomes one Kubernetes Event.
//!
//! ECI answers every status poll with the group's recent events (reason, message, count, first
//! and last time, to the second). Rules:
//! - an event is new when its last time is after the newest one already published for the pod,
//!   or equal to it and not among the events published at that second (second-granular times
//!   put several events on one second, and a poll may see only some of them);
//! - a poll's events are taken oldest first, so one answer publishes all of its new events;
//! - an adopted pod (after a restart) starts at the adoption time: what happened before was
//!   published by the previous process, and publishing it again would be an Event storm on
//!   every rollout;
//! - an event whose time does not parse is new once (remembered by content among the last
//!   [`REMEMBERED`], until a newer event moves the watermark on).
//!
//! The state per pod is one time and a few hashes, however long the pod lives: a crash-looping
//! container's `BackOff` (its count and time rising forever) costs nothing more.

use std::hash::{Hash as _, Hasher as _};
use std::time::SystemTime;

use eci_proto::v20180808::Event;

/// Events of one second (or of unparsable times) remembered by content at most.
const REMEMBERED: usize = 32;

/// The newest ECI event published for one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct EventWatermark {
    /// The newest last time published (`None`: nothing yet).
    newest: Option<SystemTime>,
    /// Content hashes of what was published at `newest`, or without a readable time.
    at_newest: Vec<u64>,
}

impl EventWatermark {
    /// For a pod adopted at `now`: only what happens from now on is new.
    pub(super) fn since(now: SystemTime) -> Self {
        Self {
            newest: Some(now),
            at_newest: Vec::new(),
        }
    }

    /// Whether `event` would be published (without marking it).
    pub(super) fn is_new(&self, event: &Event) -> bool {
        let hash = content(event);
        match (last_time(event), self.newest) {
            (Some(time), Some(newest)) if time < newest => false,
            (Some(time), Some(newest)) if time == newest => !self.at_newest.contains(&hash),
            (Some(_), _) => true,
            (None, _) => !self.at_newest.contains(&hash),
        }
    }

    /// The new events among `events`, oldest first, marked as published.
    pub(super) fn take_new(&mut self, events: &[Event]) -> Vec<Event> {
        let mut ordered: Vec<&Event> = events.iter().collect();
        ordered.sort_by_key(|e| last_time(e));
        let mut new = Vec::new();
        for event in ordered {
            if !self.is_new(event) {
                continue;
            }
            match last_time(event) {
                Some(time) if self.newest != Some(time) => {
                    self.newest = Some(time);
                    self.at_newest.clear();
                }
                _ => {}
            }
            if self.at_newest.len() == REMEMBERED {
                self.at_newest.remove(0);
            }
            self.at_newest.push(content(event));
            new.push(event.clone());
        }
        new
    }
}

fn last_time(event: &Event) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(&event.last_timestamp)
        .or_else(|_| humantime::parse_rfc3339_weak(&event.first_timestamp))
        .ok()
}

fn content(event: &Event) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&event.r#type, &event.reason, &event.message, event.count).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use eci_proto::v20180808::Event;

    use super::{EventWatermark, REMEMBERED};

    fn event(reason: &str, count: i32, at: &str) -> Event {
        Event {
            count,
            r#type: "Normal".into(),
            reason: reason.into(),
            message: format!("{reason} #{count}"),
            last_timestamp: at.into(),
            ..Event::default()
        }
    }

    fn reasons(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{}#{}", e.reason, e.count))
            .collect()
    }

    #[test]
    fn each_event_once_oldest_first() {
        let mut seen = EventWatermark::default();
        let first = [
            event("Started", 1, "2026-11-25T10:00:02Z"),
            event("Pulled", 1, "2026-11-25T10:00:01Z"),
        ];
        assert_eq!(reasons(&seen.take_new(&first)), ["Pulled#1", "Started#1"]);
        assert!(seen.take_new(&first).is_empty(), "the same answer again");
        // A later poll sees another event of the same second, and a newer one.
        let second = [
            event("Pulled", 1, "2026-11-25T10:00:01Z"),
            event("Started", 1, "2026-11-25T10:00:02Z"),
            event("Created", 1, "2026-11-25T10:00:02Z"),
            event("Killing", 1, "2026-11-25T10:00:09Z"),
        ];
        assert_eq!(reasons(&seen.take_new(&second)), ["Created#1", "Killing#1"]);
    }

    #[test]
    fn a_crash_loop_is_published_per_count_and_costs_no_memory() {
        let mut seen = EventWatermark::default();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for count in 1..=10_000 {
            let at = humantime::format_rfc3339_seconds(
                start + Duration::from_secs(u64::try_from(count).unwrap() * 10),
            )
            .to_string();
            let backoff = event("BackOff", count, &at);
            assert_eq!(seen.take_new(&[backoff]).len(), 1, "count {count}");
        }
        assert_eq!(seen.at_newest.len(), 1, "one hash, however long the loop");
    }

    #[test]
    fn an_adopted_pod_publishes_nothing_from_before_its_adoption() {
        let adopted = humantime::parse_rfc3339("2026-11-25T10:00:05Z").unwrap();
        let mut seen = EventWatermark::since(adopted);
        let answer = [
            event("Pulled", 1, "2026-11-25T10:00:01Z"),
            event("Started", 1, "2026-11-25T10:00:02Z"),
            event("Killing", 1, "2026-11-25T10:00:07Z"),
        ];
        assert!(!seen.is_new(&answer[0]));
        assert!(seen.is_new(&answer[2]));
        assert_eq!(reasons(&seen.take_new(&answer)), ["Killing#1"]);
    }

    #[test]
    fn events_without_a_readable_time_are_new_once() {
        let mut seen = EventWatermark::default();
        let odd = event("Odd", 1, "yesterday");
        assert_eq!(seen.take_new(std::slice::from_ref(&odd)).len(), 1);
        assert!(seen.take_new(&[odd]).is_empty());
        for n in 0..100 {
            seen.take_new(&[event("Odd", n + 2, "")]);
        }
        assert_eq!(seen.at_newest.len(), REMEMBERED, "bounded");
    }
}
