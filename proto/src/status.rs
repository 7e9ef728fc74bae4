//! The string vocabularies of the API: group statuses, container states, restart policies.
//!
//! The contract keeps them as strings (as the OpenAPI does); these enums give Rust code a typed
//! view with exact spellings.

use std::fmt;
use std::str::FromStr;

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The API spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err(UnknownValue {
                        kind: stringify!($name),
                        value: other.to_owned(),
                    }),
                }
            }
        }
    };
}

/// A string that is not one of a vocabulary's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid {kind}")]
pub struct UnknownValue {
    /// The vocabulary, e.g. `GroupStatus`.
    pub kind: &'static str,
    /// The rejected text.
    pub value: String,
}

string_enum! {
    /// `Status` of a container group.
    GroupStatus {
        /// Accepted, waiting for scheduling; also while init containers run.
        Pending = "Pending",
        /// Looking for capacity.
        Scheduling = "Scheduling",
        /// The containers were started.
        Running = "Running",
        /// Every container ended with exit code 0 and none will restart.
        Succeeded = "Succeeded",
        /// A container ended in failure and none will restart, or a deadline passed.
        Failed = "Failed",
        /// No capacity (stock, IP addresses, quota); final.
        ScheduleFailed = "ScheduleFailed",
        /// RestartContainerGroup is in progress.
        Restarting = "Restarting",
        /// UpdateContainerGroup is in progress.
        Updating = "Updating",
        /// Being deleted, within the termination grace period.
        Terminating = "Terminating",
        /// A spot instance was reclaimed; final.
        Expired = "Expired",
    }
}

impl GroupStatus {
    /// A final status: nothing runs and nothing will.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            GroupStatus::Succeeded
                | GroupStatus::Failed
                | GroupStatus::ScheduleFailed
                | GroupStatus::Expired
        )
    }
}

string_enum! {
    /// `State` of a container.
    ContainerStateKind {
        /// Not started yet, or waiting to restart.
        Waiting = "Waiting",
        /// Started.
        Running = "Running",
        /// Ended.
        Terminated = "Terminated",
    }
}

string_enum! {
    /// `RestartPolicy` of a container group.
    RestartPolicy {
        /// Restart every container that ends (the default).
        Always = "Always",
        /// Restart containers that end with a non-zero exit code.
        OnFailure = "OnFailure",
        /// Never restart.
        Never = "Never",
    }
}

impl RestartPolicy {
    /// Parses the request value, where empty means the default, `Always`.
    pub fn from_request(text: &str) -> Result<Self, UnknownValue> {
        if text.is_empty() {
            Ok(RestartPolicy::Always)
        } else {
            text.parse()
        }
    }

    /// Whether a container that ended with `exit_code` is restarted.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_spelling() {
        for status in GroupStatus::ALL {
            assert_eq!(status.as_str().parse::<GroupStatus>(), Ok(*status));
        }
        assert!("running".parse::<GroupStatus>().is_err());
    }

    #[test]
    fn restart_policy_rules() {
        assert_eq!(RestartPolicy::from_request(""), Ok(RestartPolicy::Always));
        assert!(RestartPolicy::Always.restarts(0));
        assert!(!RestartPolicy::OnFailure.restarts(0));
        assert!(RestartPolicy::OnFailure.restarts(2));
        assert!(!RestartPolicy::Never.restarts(1));
        let error = RestartPolicy::from_request("Sometimes").unwrap_err();
        assert_eq!(
            error.to_string(),
            "\"Sometimes\" is not a valid RestartPolicy"
        );
    }
}
