//! Parameter values the account may not use. The real service refuses a create that names a
//! resource the caller has no RAM permission on — a RAM role it may not pass to the instance
//! (`ram:PassRole`), another team's security group — with `Forbidden.RAM` and HTTP 403, for
//! that value only: the same caller's other creates go through. Set by flags
//! (`--deny-ram-role`, `--deny-security-group`) and by the admin endpoint (`"denied"`).

use std::collections::BTreeSet;

use eci_proto::EciError;
use eci_proto::v20180808::CreateContainerGroupRequest;
use serde::{Deserialize, Serialize};

/// The code the service answers a refused resource with (Alibaba Cloud's common RAM
/// refusal; it travels as gRPC `PermissionDenied` and HTTP 403).
pub const FORBIDDEN_RAM: &str = "Forbidden.RAM";

/// The values refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Denials {
    /// `RamRoleName` values the caller may not give a group.
    pub ram_roles: BTreeSet<String>,
    /// `SecurityGroupId` values the caller may not put a group in.
    pub security_groups: BTreeSet<String>,
}

impl Denials {
    /// The refusal of `request`, when it names a denied value.
    pub fn refusal(&self, request: &CreateContainerGroupRequest) -> Option<EciError> {
        let (parameter, value) = if self.ram_roles.contains(&request.ram_role_name) {
            ("RamRoleName", &request.ram_role_name)
        } else if self.security_groups.contains(&request.security_group_id) {
            ("SecurityGroupId", &request.security_group_id)
        } else {
            return None;
        };
        Some(EciError::new(
            FORBIDDEN_RAM,
            format!(
                "User not authorized to operate on the specified resource: {parameter} {value:?} (simulated)."
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_denied_values_are_refused() {
        let denials = Denials {
            ram_roles: BTreeSet::from(["AdminRole".to_owned()]),
            security_groups: BTreeSet::from(["sg-platform".to_owned()]),
        };
        let request = |role: &str, group: &str| CreateContainerGroupRequest {
            ram_role_name: role.into(),
            security_group_id: group.into(),
            ..CreateContainerGroupRequest::default()
        };
        let cases = [
            ("", "sg-1", None),
            ("AppRole", "sg-1", None),
            ("AdminRole", "sg-1", Some("RamRoleName \"AdminRole\"")),
            ("", "sg-platform", Some("SecurityGroupId \"sg-platform\"")),
        ];
        for (role, group, expected) in cases {
            let refusal = denials.refusal(&request(role, group));
            assert_eq!(
                refusal.as_ref().map(|e| e.code.as_str()),
                expected.map(|_| FORBIDDEN_RAM),
                "{role} {group}"
            );
            if let (Some(error), Some(part)) = (refusal, expected) {
                assert!(error.message.contains(part), "{}", error.message);
                assert_eq!(error.grpc_code(), tonic::Code::PermissionDenied);
            }
        }
        assert_eq!(Denials::default().refusal(&request("", "")), None);
    }
}
