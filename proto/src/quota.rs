//! The documented per-account, per-region call quotas of the ECI API (calls per minute).
//! mock-eci enforces them; clients pace themselves by them.

/// Calls per minute allowed for `action`, or `None` for an action this table does not know.
pub fn per_minute(action: &str) -> Option<u32> {
    Some(match action {
        "CreateContainerGroup" | "DeleteContainerGroup" => 1_000,
        "DescribeContainerGroups"
        | "DescribeContainerGroupMetric"
        | "DescribeMultiContainerGroupMetric" => 2_000,
        "DescribeContainerGroupStatus" => 10_000,
        "UpdateContainerGroup"
        | "RestartContainerGroup"
        | "DescribeContainerLog"
        | "ExecContainerCommand" => 500,
        _ => return None,
    })
}

/// The burst a token bucket for `per_minute` allows: a tenth of a minute's calls.
pub fn burst(per_minute: u32) -> u32 {
    (per_minute / 10).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_quotas() {
        assert_eq!(per_minute("CreateContainerGroup"), Some(1_000));
        assert_eq!(per_minute("DescribeContainerGroupStatus"), Some(10_000));
        assert_eq!(per_minute("Unknown"), None);
        assert_eq!(burst(1_000), 100);
        assert_eq!(burst(5), 1);
    }
}
