//! Run-time switches: per-action rate limits, injected errors and latency, outages.
//!
//! Set at start-up from flags and changed at run time through the admin endpoint, so an
//! end-to-end test can start and stop an outage or a throttling storm.

use std::collections::{BTreeMap, BTreeSet};

use eci_proto::EciError;
use eci_proto::error::codes;
use eci_proto::v20180808::CreateContainerGroupRequest;
use serde::{Deserialize, Serialize};

use crate::actions::Action;
use crate::clock::Millis;
use crate::rng::SplitMix;
use crate::service::denials::Denials;

/// A token bucket's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Sustained calls per minute.
    pub per_minute: u32,
    /// Calls allowed in a burst.
    pub burst: u32,
}

impl RateLimit {
    /// The default for `action`: its documented quota, with a burst of a tenth of a minute's calls.
    pub fn default_for(action: Action) -> Self {
        let per_minute = action.default_per_minute();
        Self {
            per_minute,
            burst: eci_proto::quota::burst(per_minute),
        }
    }
}

/// Injected trouble for one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fault {
    /// Share of calls, 0.0–1.0, answered with `error_code` instead of being served.
    pub error_rate: f64,
    /// The ECI code of injected errors.
    pub error_code: String,
    /// Added latency in milliseconds before a call is served.
    pub latency_ms: u64,
    /// Share of calls, 0.0–1.0, delayed by `slow_latency_ms` instead of `latency_ms`: a long
    /// tail (0.01 at 5000 ms makes the p99 5 s).
    pub slow_rate: f64,
    /// The latency of the slow share, in milliseconds.
    pub slow_latency_ms: u64,
    /// Share of served calls, 0.0–1.0, whose answer is lost on the way back: the call takes
    /// effect (a group is created, deleted, …) but the client sees a dropped connection (gRPC
    /// `Unavailable` without an ECI code, HTTP 503 on the OpenAPI front), as after a timeout.
    pub lost_answer_rate: f64,
}

impl Default for Fault {
    fn default() -> Self {
        Self {
            error_rate: 0.0,
            error_code: codes::SERVICE_UNAVAILABLE.into(),
            latency_ms: 0,
            slow_rate: 0.0,
            slow_latency_ms: 0,
            lost_answer_rate: 0.0,
        }
    }
}

impl Fault {
    /// Whether it changes nothing (and can be forgotten).
    fn is_noop(&self) -> bool {
        self.error_rate == 0.0
            && self.latency_ms == 0
            && (self.slow_rate == 0.0 || self.slow_latency_ms == 0)
            && self.lost_answer_rate == 0.0
    }
}

/// What the admin endpoint shows and accepts (every field optional in a PATCH).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ControlsView {
    /// Rate limiting on or off.
    pub rate_limits_enabled: bool,
    /// Limits per action name.
    pub rate_limits: BTreeMap<Action, RateLimit>,
    /// Faults per action name.
    pub faults: BTreeMap<Action, Fault>,
    /// Every call fails with `ServiceUnavailable`.
    pub outage: bool,
    /// New groups fail to schedule for lack of stock.
    pub no_stock: bool,
    /// Cap on groups holding capacity.
    pub max_groups: Option<usize>,
    /// Parameter values a create may not name (see [`Denials`]).
    pub denied: Denials,
    /// Zones without stock: a create lands in another zone it lists, or is refused
    /// `OperationDenied.NoStock`.
    #[serde(default)]
    pub no_stock_zones: BTreeSet<String>,
    /// The zone of each known vSwitch (others are in the default zone).
    #[serde(default)]
    pub vswitch_zones: BTreeMap<String, String>,
}

/// A partial update of the controls. A fault given for `"*"` applies to every action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ControlsPatch {
    /// Rate limiting on or off.
    pub rate_limits_enabled: Option<bool>,
    /// Limits to set, by action name.
    pub rate_limits: Option<BTreeMap<String, RateLimit>>,
    /// Faults to set, by action name or `*`; a fault that changes nothing clears it.
    pub faults: Option<BTreeMap<String, Fault>>,
    /// Outage on or off.
    pub outage: Option<bool>,
    /// No stock on or off.
    pub no_stock: Option<bool>,
    /// Cap on groups (`null` removes it; absent keeps it).
    #[serde(default, with = "double_option")]
    pub max_groups: Option<Option<usize>>,
    /// The denied values, replacing those in force (`{}` denies nothing).
    pub denied: Option<Denials>,
    /// The zones without stock, replacing those in force (`[]`: stock everywhere).
    pub no_stock_zones: Option<BTreeSet<String>>,
    /// vSwitch → zone entries to add or change.
    pub vswitch_zones: Option<BTreeMap<String, String>>,
}

mod double_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Option<usize>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<usize>>, D::Error> {
        Option::<usize>::deserialize(deserializer).map(Some)
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Millis,
}

/// The live switches and the token buckets.
#[derive(Debug)]
pub struct Controls {
    rate_limits_enabled: bool,
    rate_limits: BTreeMap<Action, RateLimit>,
    buckets: BTreeMap<Action, Bucket>,
    faults: BTreeMap<Action, Fault>,
    outage: bool,
    denied: Denials,
    rng: SplitMix,
}

/// What the controls decided about one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Serve it (after `latency_ms`).
    Serve {
        /// Injected latency.
        latency_ms: u64,
        /// Serve it, then lose the answer (the client sees a dropped connection).
        lose_answer: bool,
    },
    /// Answer with this error (after `latency_ms`).
    Fail {
        /// The error.
        error: EciError,
        /// Injected latency.
        latency_ms: u64,
    },
}

impl Controls {
    /// Controls with the given limits and faults.
    pub fn new(
        rate_limits_enabled: bool,
        overrides: &BTreeMap<Action, RateLimit>,
        faults: BTreeMap<Action, Fault>,
        seed: u64,
    ) -> Self {
        let mut rate_limits: BTreeMap<Action, RateLimit> = Action::ALL
            .into_iter()
            .map(|action| (action, RateLimit::default_for(action)))
            .collect();
        rate_limits.extend(overrides.iter().map(|(action, limit)| (*action, *limit)));
        Self {
            rate_limits_enabled,
            rate_limits,
            buckets: BTreeMap::new(),
            faults,
            outage: false,
            denied: Denials::default(),
            rng: SplitMix::new(seed ^ 0x5EED),
        }
    }

    /// The same controls, refusing creates that name `denied` values.
    #[must_use]
    pub fn with_denials(mut self, denied: Denials) -> Self {
        self.denied = denied;
        self
    }

    /// The refusal of a create naming a denied value, if it does.
    pub fn refusal(&self, request: &CreateContainerGroupRequest) -> Option<EciError> {
        self.denied.refusal(request)
    }

    /// Decides about one call of `action` at `now`.
    pub fn admit(&mut self, action: Action, now: Millis) -> Verdict {
        let fault = self.faults.get(&action).cloned().unwrap_or_default();
        let latency_ms = if fault.slow_rate > 0.0 && self.rng.next_f64() < fault.slow_rate {
            fault.slow_latency_ms
        } else {
            fault.latency_ms
        };
        if self.outage {
            return Verdict::Fail {
                error: EciError::new(
                    codes::SERVICE_UNAVAILABLE,
                    "The service is temporarily unavailable (simulated outage).",
                ),
                latency_ms,
            };
        }
        if fault.error_rate > 0.0 && self.rng.next_f64() < fault.error_rate {
            return Verdict::Fail {
                error: EciError::new(
                    fault.error_code,
                    format!("Injected failure of {action} (simulated)."),
                ),
                latency_ms,
            };
        }
        if self.rate_limits_enabled && !self.take_token(action, now) {
            return Verdict::Fail {
                error: EciError::new(
                    codes::THROTTLING_USER,
                    format!(
                        "Request was denied due to user flow control: {action} is limited to {} calls per minute.",
                        self.rate_limits[&action].per_minute
                    ),
                ),
                latency_ms,
            };
        }
        let lose_answer =
            fault.lost_answer_rate > 0.0 && self.rng.next_f64() < fault.lost_answer_rate;
        Verdict::Serve {
            latency_ms,
            lose_answer,
        }
    }

    fn take_token(&mut self, action: Action, now: Millis) -> bool {
        let limit = self
            .rate_limits
            .get(&action)
            .copied()
            .unwrap_or_else(|| RateLimit::default_for(action));
        let capacity = f64::from(limit.burst.max(1));
        let per_ms = f64::from(limit.per_minute) / 60_000.0;
        let bucket = self.buckets.entry(action).or_insert(Bucket {
            tokens: capacity,
            updated: now,
        });
        #[allow(clippy::cast_precision_loss)]
        let elapsed = (now - bucket.updated).max(0) as f64;
        bucket.tokens = (bucket.tokens + elapsed * per_ms).min(capacity);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The current switches (without `no_stock`, `max_groups` and the zones, which live in the
    /// engine).
    pub fn view(&self) -> ControlsView {
        ControlsView {
            rate_limits_enabled: self.rate_limits_enabled,
            rate_limits: self.rate_limits.clone(),
            faults: self.faults.clone(),
            outage: self.outage,
            no_stock: false,
            max_groups: None,
            denied: self.denied.clone(),
            no_stock_zones: BTreeSet::new(),
            vswitch_zones: BTreeMap::new(),
        }
    }

    /// Applies the parts of a patch that concern these controls.
    pub fn apply(&mut self, patch: &ControlsPatch) -> Result<(), String> {
        let resolve = |name: &str| -> Result<Vec<Action>, String> {
            if name == "*" {
                Ok(Action::ALL.to_vec())
            } else {
                name.parse::<Action>().map(|action| vec![action])
            }
        };
        // Validate everything before changing anything.
        let mut limits = Vec::new();
        for (name, limit) in patch.rate_limits.iter().flatten() {
            if limit.per_minute == 0 || limit.burst == 0 {
                return Err(format!(
                    "rate limit of {name}: per_minute and burst must be positive"
                ));
            }
            limits.extend(resolve(name)?.into_iter().map(|action| (action, *limit)));
        }
        let mut faults = Vec::new();
        for (name, fault) in patch.faults.iter().flatten() {
            for (field, rate) in [
                ("error_rate", fault.error_rate),
                ("slow_rate", fault.slow_rate),
                ("lost_answer_rate", fault.lost_answer_rate),
            ] {
                if !(0.0..=1.0).contains(&rate) {
                    return Err(format!("fault of {name}: {field} must be between 0 and 1"));
                }
            }
            faults.extend(
                resolve(name)?
                    .into_iter()
                    .map(|action| (action, fault.clone())),
            );
        }
        if let Some(enabled) = patch.rate_limits_enabled {
            self.rate_limits_enabled = enabled;
            self.buckets.clear();
        }
        for (action, limit) in limits {
            self.rate_limits.insert(action, limit);
            self.buckets.remove(&action);
        }
        for (action, fault) in faults {
            if fault.is_noop() {
                self.faults.remove(&action);
            } else {
                self.faults.insert(action, fault);
            }
        }
        if let Some(outage) = patch.outage {
            self.outage = outage;
        }
        if let Some(denied) = &patch.denied {
            self.denied = denied.clone();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls() -> Controls {
        let limits = BTreeMap::from([(
            Action::CreateContainerGroup,
            RateLimit {
                per_minute: 60,
                burst: 2,
            },
        )]);
        Controls::new(true, &limits, BTreeMap::new(), 1)
    }

    fn throttled(verdict: &Verdict) -> bool {
        matches!(verdict, Verdict::Fail { error, .. } if error.code == "Throttling.User")
    }

    #[test]
    fn token_bucket_allows_a_burst_then_refills() {
        let mut controls = controls();
        assert!(!throttled(&controls.admit(Action::CreateContainerGroup, 0)));
        assert!(!throttled(&controls.admit(Action::CreateContainerGroup, 0)));
        assert!(throttled(&controls.admit(Action::CreateContainerGroup, 0)));
        // 60 per minute: one token a second.
        assert!(throttled(
            &controls.admit(Action::CreateContainerGroup, 999)
        ));
        assert!(!throttled(
            &controls.admit(Action::CreateContainerGroup, 1_000)
        ));
        // Other actions have their own buckets.
        assert!(!throttled(
            &controls.admit(Action::DeleteContainerGroup, 1_000)
        ));
    }

    #[test]
    fn limits_can_be_switched_off() {
        let mut controls = controls();
        controls
            .apply(&ControlsPatch {
                rate_limits_enabled: Some(false),
                ..ControlsPatch::default()
            })
            .unwrap();
        for _ in 0..100 {
            assert_eq!(
                controls.admit(Action::CreateContainerGroup, 0),
                Verdict::Serve {
                    latency_ms: 0,
                    lose_answer: false
                }
            );
        }
    }

    #[test]
    fn faults_and_outage() {
        let mut controls = controls();
        let patch: ControlsPatch = serde_json::from_str(
            r#"{"faults": {"*": {"error_rate": 1.0, "error_code": "InternalError", "latency_ms": 5}}}"#,
        )
        .unwrap();
        controls.apply(&patch).unwrap();
        match controls.admit(Action::DescribeContainerGroups, 0) {
            Verdict::Fail { error, latency_ms } => {
                assert_eq!((error.code.as_str(), latency_ms), ("InternalError", 5));
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        controls
            .apply(
                &serde_json::from_str(r#"{"faults": {"*": {"error_rate": 0.0}}, "outage": true}"#)
                    .unwrap(),
            )
            .unwrap();
        match controls.admit(Action::DescribeContainerGroups, 0) {
            Verdict::Fail { error, .. } => assert_eq!(error.code, "ServiceUnavailable"),
            other => panic!("expected the outage, got {other:?}"),
        }
        assert!(controls.view().faults.is_empty());
    }

    #[test]
    fn a_slow_tail_and_lost_answers() {
        let mut controls = controls();
        let patch: ControlsPatch = serde_json::from_str(
            r#"{"rate_limits_enabled": false, "faults": {"*": {"latency_ms": 10, "slow_rate": 0.1, "slow_latency_ms": 5000, "lost_answer_rate": 0.25}}}"#,
        )
        .unwrap();
        controls.apply(&patch).unwrap();
        let (mut slow, mut lost) = (0, 0);
        for _ in 0..10_000 {
            match controls.admit(Action::CreateContainerGroup, 0) {
                Verdict::Serve {
                    latency_ms,
                    lose_answer,
                } => {
                    assert!(latency_ms == 10 || latency_ms == 5000, "{latency_ms}");
                    slow += usize::from(latency_ms == 5000);
                    lost += usize::from(lose_answer);
                }
                other => panic!("served, with trouble: {other:?}"),
            }
        }
        assert!((800..1200).contains(&slow), "about a tenth slow: {slow}");
        assert!((2200..2800).contains(&lost), "about a quarter lost: {lost}");
        let error = controls
            .apply(
                &serde_json::from_str(r#"{"faults": {"*": {"lost_answer_rate": 2.0}}}"#).unwrap(),
            )
            .unwrap_err();
        assert!(
            error.contains("lost_answer_rate must be between 0 and 1"),
            "{error}"
        );
        controls
            .apply(&serde_json::from_str(r#"{"faults": {"*": {}}}"#).unwrap())
            .unwrap();
        assert!(
            controls.view().faults.is_empty(),
            "an empty fault clears it"
        );
    }

    #[test]
    fn bad_patches_change_nothing() {
        let mut controls = controls();
        let error = controls
            .apply(
                &serde_json::from_str(
                    r#"{"outage": true, "faults": {"Nope": {"error_rate": 1.0}}}"#,
                )
                .unwrap(),
            )
            .unwrap_err();
        assert!(error.contains("unknown action \"Nope\""), "{error}");
        assert!(!controls.view().outage);
        assert!(serde_json::from_str::<ControlsPatch>(r#"{"outtage": true}"#).is_err());
    }
}
