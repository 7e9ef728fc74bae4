//! Which ECI answers say "this daemon is misconfigured" rather than "this pod cannot run" or
//! "try again": a refused AccessKey, a missing RAM permission, a skewed clock, an account in
//! arrears, or an answer from something that is not ECI (a proxy's error page). Those are the
//! node's problem: every pod would meet them, so failing pods one by one only churns them.
//! Except a permission refusal of a create carrying parameters a pod chose (a RAM role, a
//! security group, …): that one is the pod's, and its creator never records it here
//! (`pods::controller::misconfigured`), so no tenant can taint the node.
//!
//! [`classify`] is the pure decision; [`Monitor`] remembers the latest such answer per action
//! until a call succeeds again, and lets the node status and the pod creators follow it.

use parking_lot::Mutex;
use std::collections::BTreeMap;

use eci_proto::EciError;
use tokio::sync::watch;

/// Code of an answer that is not the service's (no ECI error body: a proxy, a captive portal,
/// a wrong endpoint). Client-side, so it starts with `SDK.` like the client's other codes.
pub use eci_proto::error::codes::FOREIGN_RESPONSE;

/// What kind of misconfiguration an answer reveals; each has its own fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// The AccessKey id is unknown or disabled, the secret does not match, or the STS token is
    /// bad.
    Credentials,
    /// The RAM user or role may not call the action.
    Permission,
    /// The signing host's clock is more than the service's window off.
    ClockSkew,
    /// The account cannot buy resources (overdue payment, no balance).
    Account,
    /// Whatever answered is not the ECI API.
    NotEci,
}

impl Problem {
    /// The reason of the node condition and pod status (CamelCase, as Kubernetes reasons are).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Credentials => "EciCredentialsRefused",
            Self::Permission => "EciPermissionDenied",
            Self::ClockSkew => "EciClockSkew",
            Self::Account => "EciAccountSuspended",
            Self::NotEci => "EciEndpointNotEci",
        }
    }

    /// What an operator does about it.
    pub fn fix(self) -> &'static str {
        match self {
            Self::Credentials => {
                "fix the AccessKey (ECI_ACCESS_KEY/ECI_SECRET_KEY, the ECI_CREDENTIALS_PATH Secret, or the RAM role); a mounted Secret is re-read without a restart"
            }
            Self::Permission => {
                "grant the RAM user or role the eci:* actions this daemon calls (the AliyunECIFullAccess policy covers them)"
            }
            Self::ClockSkew => {
                "fix the time synchronisation (NTP) of the host running virtual-node-eci; requests more than 15 minutes off are refused"
            }
            Self::Account => {
                "settle the Alibaba Cloud account's overdue payment or top up its balance"
            }
            Self::NotEci => {
                "check ECI_ENDPOINT and any HTTP(S) proxy between the daemon and ECI: something else answered"
            }
        }
    }

    /// Whether a success of any action proves it fixed. A RAM policy may allow one action and
    /// refuse another, so a permission problem is fixed only by a success of the action that
    /// was refused; the others concern every call alike.
    fn cleared_by_any_success(self) -> bool {
        self != Self::Permission
    }
}

/// A misconfiguration as the service reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misconfiguration {
    /// Its kind.
    pub problem: Problem,
    /// The action that was refused.
    pub action: String,
    /// The service's code (`Forbidden.RAM`, …).
    pub code: String,
    /// The service's message (secrets already left out by the client).
    pub message: String,
    /// The request id, to quote to support.
    pub request_id: String,
}

impl Misconfiguration {
    /// One line for a condition, a pod's status or an Event: code, what happened, the fix.
    /// Without the request id, which changes on every call: the line stays the same while the
    /// problem does, so nothing is rewritten for it (logs carry the id).
    pub fn describe(&self) -> String {
        format!(
            "ECI refused {} with {}: {}. Fix: {}",
            self.action,
            self.code,
            self.message.trim_end_matches('.'),
            self.problem.fix()
        )
    }

    /// The same problem, reported again (by another call)?
    fn same_as(&self, other: &Self) -> bool {
        (self.problem, &self.action, &self.code, &self.message)
            == (other.problem, &other.action, &other.code, &other.message)
    }
}

/// How an ECI error should be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The daemon's configuration is wrong: the node's problem, not the pod's.
    Configuration(Problem),
    /// Worth retrying as it is (throttling, outages, server errors).
    Transient,
    /// About this request: retrying it unchanged will not help.
    Request,
}

/// The misconfiguration a code reveals, if any. Codes from Alibaba Cloud's common error table
/// and the ECI API reference; the prefixes cover their documented suffixes (`.NotFound`,
/// `.Inactive`, `.Expired`, `.Mismatch`, …).
fn problem_of(code: &str) -> Option<Problem> {
    let family = code.split('.').next().unwrap_or(code);
    match family {
        "InvalidAccessKeyId"
        | "SignatureDoesNotMatch"
        | "IncompleteSignature"
        | "InvalidSecurityToken" => Some(Problem::Credentials),
        "InvalidTimeStamp" | "IllegalTimestamp" => match code {
            // A malformed or missing timestamp is this client's bug, not the clock.
            "InvalidTimeStamp.Format" | "IllegalTimestamp" => None,
            _ => Some(Problem::ClockSkew),
        },
        // `Forbidden.InstanceNotFound` and the like name a resource, not a permission.
        "Forbidden" if code.ends_with("NotFound") => None,
        "Forbidden" | "Forbedden" | "NoPermission" | "ActionUnauthorized" => {
            Some(Problem::Permission)
        }
        "Account" | "InsufficientBalance" => Some(Problem::Account),
        _ if code == FOREIGN_RESPONSE => Some(Problem::NotEci),
        _ => None,
    }
}

/// How to handle `error`.
pub fn classify(error: &EciError) -> ErrorClass {
    if let Some(problem) = problem_of(&error.code) {
        ErrorClass::Configuration(problem)
    } else if error.is_retryable() {
        ErrorClass::Transient
    } else {
        ErrorClass::Request
    }
}

/// The misconfiguration `error` (an answer to `action`) reveals, if any.
pub fn misconfiguration(action: &str, error: &EciError) -> Option<Misconfiguration> {
    match classify(error) {
        ErrorClass::Configuration(problem) => Some(Misconfiguration {
            problem,
            action: action.to_owned(),
            code: error.code.clone(),
            message: error.message.clone(),
            request_id: error.request_id.clone(),
        }),
        ErrorClass::Transient | ErrorClass::Request => None,
    }
}

/// The misconfigurations in force, by refused action, and what follows from an outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals(BTreeMap<String, Misconfiguration>);

impl Refusals {
    /// Takes in the outcome of one call of `action`: a misconfiguration is remembered, a
    /// success clears what it proves fixed, anything else changes nothing (an outage says
    /// nothing about the credentials).
    pub fn record(&mut self, action: &str, outcome: Result<(), &EciError>) {
        match outcome {
            Ok(()) => self.0.retain(|refused, misconfiguration| {
                refused != action && !misconfiguration.problem.cleared_by_any_success()
            }),
            Err(error) => {
                if let Some(found) = misconfiguration(action, error) {
                    self.0.insert(action.to_owned(), found);
                }
            }
        }
    }

    /// The one to show: the most fundamental kind first (credentials before permissions, …),
    /// then by action name, so the choice is stable.
    pub fn current(&self) -> Option<&Misconfiguration> {
        self.0
            .values()
            .min_by_key(|m| (m.problem, m.action.clone()))
    }
}

/// [`Refusals`] shared by every caller, with a watch for those who wait for a change.
#[derive(Debug)]
pub struct Monitor {
    refusals: Mutex<Refusals>,
    current: watch::Sender<Option<Misconfiguration>>,
}

impl Default for Monitor {
    fn default() -> Self {
        Self {
            refusals: Mutex::new(Refusals::default()),
            current: watch::Sender::new(None),
        }
    }
}

impl Monitor {
    /// Takes in the outcome of one call of `action`.
    pub fn record(&self, action: &str, outcome: Result<(), &EciError>) {
        let current = {
            let mut refusals = self.refusals.lock();
            refusals.record(action, outcome);
            refusals.current().cloned()
        };
        self.current.send_if_modified(|shown| {
            let same = match (shown.as_ref(), current.as_ref()) {
                (Some(a), Some(b)) => a.same_as(b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                *shown = current;
            }
            !same
        });
    }

    /// The misconfiguration in force, if any.
    pub fn current(&self) -> Option<Misconfiguration> {
        self.current.borrow().clone()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<Option<Misconfiguration>> {
        self.current.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified_as_the_service_means_them() {
        use ErrorClass::{Configuration, Request, Transient};
        use Problem::{Account, ClockSkew, Credentials, NotEci, Permission};
        let cases = [
            ("InvalidAccessKeyId.NotFound", Configuration(Credentials)),
            ("InvalidAccessKeyId.Inactive", Configuration(Credentials)),
            ("SignatureDoesNotMatch", Configuration(Credentials)),
            ("IncompleteSignature", Configuration(Credentials)),
            ("InvalidSecurityToken.Expired", Configuration(Credentials)),
            ("InvalidSecurityToken.Mismatch", Configuration(Credentials)),
            ("Forbidden.RAM", Configuration(Permission)),
            ("Forbidden.NoPermission", Configuration(Permission)),
            ("Forbidden", Configuration(Permission)),
            ("Forbedden.NotSupportRAM", Configuration(Permission)),
            ("Forbidden.RiskControl", Configuration(Permission)),
            ("NoPermission", Configuration(Permission)),
            ("ActionUnauthorized", Configuration(Permission)),
            ("InvalidTimeStamp.Expired", Configuration(ClockSkew)),
            ("Account.Arrearage", Configuration(Account)),
            ("InsufficientBalance", Configuration(Account)),
            ("SDK.ForeignResponse", Configuration(NotEci)),
            // Not the node's problem.
            ("Forbidden.InstanceNotFound", Request),
            ("InvalidTimeStamp.Format", Request),
            ("IllegalTimestamp", Request),
            ("InvalidParameter", Request),
            ("InvalidParameter.ContainerGroupName", Request),
            ("InvalidContainerGroup.NotFound", Request),
            ("SDK.InvalidResponse", Request),
            ("Throttling.User", Transient),
            ("ServiceUnavailable", Transient),
            ("ServiceUnavailable.Credentials", Transient),
            ("InternalError", Transient),
        ];
        for (code, expected) in cases {
            assert_eq!(classify(&EciError::new(code, "m")), expected, "{code}");
        }
    }

    fn refused(code: &str) -> EciError {
        EciError::new(code, "refused").with_request_id("R-1")
    }

    #[test]
    fn a_success_clears_what_it_proves_fixed() {
        let create = "CreateContainerGroup";
        let status = "DescribeContainerGroupStatus";
        let mut refusals = Refusals::default();
        refusals.record(create, Err(&refused("Forbidden.RAM")));
        assert_eq!(refusals.current().unwrap().code, "Forbidden.RAM");
        // The policy allows reading: that says nothing about creating.
        refusals.record(status, Ok(()));
        assert_eq!(refusals.current().unwrap().action, create);
        // An outage says nothing either.
        refusals.record(create, Err(&refused("ServiceUnavailable")));
        assert!(refusals.current().is_some());
        refusals.record(create, Ok(()));
        assert_eq!(refusals.current(), None);

        // Credentials concern every call: any success clears them.
        refusals.record(status, Err(&refused("InvalidAccessKeyId.NotFound")));
        refusals.record(create, Err(&refused("Forbidden.RAM")));
        assert_eq!(
            refusals.current().unwrap().problem,
            Problem::Credentials,
            "the more fundamental one is shown"
        );
        refusals.record("DeleteContainerGroup", Ok(()));
        assert_eq!(refusals.current().unwrap().problem, Problem::Permission);
    }

    #[test]
    fn the_description_names_code_request_and_fix() {
        let found = misconfiguration("CreateContainerGroup", &refused("Account.Arrearage"))
            .expect("a misconfiguration");
        let text = found.describe();
        for part in ["CreateContainerGroup", "Account.Arrearage", "overdue"] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[tokio::test]
    async fn the_monitor_announces_changes_only() {
        let monitor = Monitor::default();
        let mut changes = monitor.subscribe();
        monitor.record("A", Ok(()));
        assert!(!changes.has_changed().unwrap());
        monitor.record("A", Err(&refused("SignatureDoesNotMatch")));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        monitor.record(
            "A",
            Err(&EciError::new("SignatureDoesNotMatch", "refused").with_request_id("R-2")),
        );
        assert!(
            !changes.has_changed().unwrap(),
            "the same refusal again, another request"
        );
        monitor.record("B", Ok(()));
        assert!(changes.has_changed().unwrap());
        assert_eq!(monitor.current(), None);
    }
}
