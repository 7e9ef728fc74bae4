//! The API actions and their documented default quotas.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One ECI OpenAPI action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Action {
    /// CreateContainerGroup.
    CreateContainerGroup,
    /// DescribeContainerGroups.
    DescribeContainerGroups,
    /// DescribeContainerGroupStatus.
    DescribeContainerGroupStatus,
    /// DeleteContainerGroup.
    DeleteContainerGroup,
    /// UpdateContainerGroup.
    UpdateContainerGroup,
    /// RestartContainerGroup.
    RestartContainerGroup,
    /// DescribeContainerLog.
    DescribeContainerLog,
    /// ExecContainerCommand.
    ExecContainerCommand,
    /// DescribeContainerGroupMetric.
    DescribeContainerGroupMetric,
    /// DescribeMultiContainerGroupMetric.
    DescribeMultiContainerGroupMetric,
    /// CreateImageCache.
    CreateImageCache,
    /// DescribeImageCaches.
    DescribeImageCaches,
    /// UpdateImageCache.
    UpdateImageCache,
    /// DeleteImageCache.
    DeleteImageCache,
}

impl Action {
    /// Every action.
    pub const ALL: [Action; 14] = [
        Action::CreateContainerGroup,
        Action::DescribeContainerGroups,
        Action::DescribeContainerGroupStatus,
        Action::DeleteContainerGroup,
        Action::UpdateContainerGroup,
        Action::RestartContainerGroup,
        Action::DescribeContainerLog,
        Action::ExecContainerCommand,
        Action::DescribeContainerGroupMetric,
        Action::DescribeMultiContainerGroupMetric,
        Action::CreateImageCache,
        Action::DescribeImageCaches,
        Action::UpdateImageCache,
        Action::DeleteImageCache,
    ];

    /// The action's name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Action::CreateContainerGroup => "CreateContainerGroup",
            Action::DescribeContainerGroups => "DescribeContainerGroups",
            Action::DescribeContainerGroupStatus => "DescribeContainerGroupStatus",
            Action::DeleteContainerGroup => "DeleteContainerGroup",
            Action::UpdateContainerGroup => "UpdateContainerGroup",
            Action::RestartContainerGroup => "RestartContainerGroup",
            Action::DescribeContainerLog => "DescribeContainerLog",
            Action::ExecContainerCommand => "ExecContainerCommand",
            Action::DescribeContainerGroupMetric => "DescribeContainerGroupMetric",
            Action::DescribeMultiContainerGroupMetric => "DescribeMultiContainerGroupMetric",
            Action::CreateImageCache => "CreateImageCache",
            Action::DescribeImageCaches => "DescribeImageCaches",
            Action::UpdateImageCache => "UpdateImageCache",
            Action::DeleteImageCache => "DeleteImageCache",
        }
    }

    /// Calls per minute per account and region, from the published quotas.
    pub fn default_per_minute(self) -> u32 {
        eci_proto::quota::per_minute(self.name()).unwrap_or(500)
    }

    /// Whether the action changes state (and so the state file).
    pub fn mutates(self) -> bool {
        matches!(
            self,
            Action::CreateContainerGroup
                | Action::DeleteContainerGroup
                | Action::UpdateContainerGroup
                | Action::RestartContainerGroup
                | Action::CreateImageCache
                | Action::UpdateImageCache
                | Action::DeleteImageCache
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Action {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Action::ALL
            .into_iter()
            .find(|action| action.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
                format!("unknown action {text:?}; use one of {}", names.join(", "))
            })
    }
}
