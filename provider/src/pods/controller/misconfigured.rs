//! Whose problem a refused creation is.
//!
//! A refusal of the daemon's configuration (credentials, RAM permissions, clock, account, an
//! endpoint that is not ECI) is not the pod's fault: the pod stays Pending with the service's
//! code and the fix, the node learns of it through the shared
//! [`Monitor`](crate::eci::misconfig::Monitor) (condition and taint), and the pod is created
//! as soon as the configuration is accepted again.
//!
//! But a pod chooses many parameters itself (its own annotations, or a Selector's applied to
//! it): a RAM role, a security group, vSwitches, a resource group, an EIP, an image cache, and
//! also tags, instance types, spot, a GPU driver, a zone ([`pod_chosen`] lists them all). A
//! permission refusal of such a create says nothing about the daemon — any namespace admin could otherwise taint the node for every
//! tenant by naming a role the account may not pass. It is the pod's alone ([`judge`]): no
//! word to the monitor, the code and message on the pod, retries with a growing back-off.
//! Credentials, clock, account and endpoint refusals cannot be caused by a pod's parameter
//! and stay the node's whatever the pod carries.

use eci_proto::EciError;
use eci_proto::v20180808::{CreateContainerGroupRequest, CreateContainerGroupResponse};
use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::notice::Notice;
use super::{Failure, PodController};
use crate::eci::misconfig::{self, ErrorClass, Misconfiguration, Problem};
use vne_core::to_eci::{ANNOTATION_KUBE_PROXY, naming};

/// The action whose answers are judged here.
const CREATE: &str = "CreateContainerGroup";

/// The monitor's name for creates with parameters the pod chose. Their successes prove the
/// credentials, clock, account and endpoint (every entry cleared by any success), never that
/// the daemon's own creates are permitted: the `CREATE` entry is not theirs to clear.
const CREATE_WITH_POD_PARAMETERS: &str = "CreateContainerGroup with the pod's parameters";

/// The daemon's own choice of the parameters a pod can override.
#[derive(Debug, Clone, Copy)]
pub(super) struct OwnParameters<'a> {
    /// `--vswitch` as the create carries it.
    pub(super) vswitch: &'a str,
    /// `--security-group`.
    pub(super) security_group: &'a str,
}

/// The tag keys the daemon writes on every group itself (`to_eci::naming::tags` and the
/// kube-proxy switch); any other tag came from the pod's annotations or a Selector.
const OWN_TAG_KEYS: [&str; 6] = [
    naming::TAG_CLUSTER,
    naming::TAG_NODE,
    naming::TAG_NAMESPACE,
    naming::TAG_POD_NAME,
    naming::TAG_POD_UID,
    ANNOTATION_KUBE_PROXY,
];

/// The parameters of `request` that are not the daemon's own, as `Name "value"`: only the pod
/// (its annotations, or a Selector applied to it) can have put them there. Identity and
/// network (RAM role, security group, vSwitch, EIP, ACR), but also what a RAM policy or the
/// account may refuse on its own terms: tags, instance types, spot, GPU driver, zone, storage.
/// Each parameter is compared with what the daemon sends when the pod chooses nothing: the
/// field's empty value, or the daemon's `own` setting.
pub(super) fn pod_chosen(
    request: &CreateContainerGroupRequest,
    own: OwnParameters<'_>,
) -> Vec<String> {
    let texts = [
        (
            "SecurityGroupId",
            request.security_group_id.as_str(),
            own.security_group,
        ),
        ("VSwitchId", request.v_switch_id.as_str(), own.vswitch),
        ("ZoneId", request.zone_id.as_str(), ""),
        ("RamRoleName", request.ram_role_name.as_str(), ""),
        ("ResourceGroupId", request.resource_group_id.as_str(), ""),
        ("EipInstanceId", request.eip_instance_id.as_str(), ""),
        ("ImageSnapshotId", request.image_snapshot_id.as_str(), ""),
        (
            "EipCommonBandwidthPackage",
            request.eip_common_bandwidth_package.as_str(),
            "",
        ),
        ("EipISP", request.eip_isp.as_str(), ""),
        ("PrivateIpAddress", request.private_ip_address.as_str(), ""),
        ("FixedIp", request.fixed_ip.as_str(), ""),
        ("InstanceType", request.instance_type.as_str(), ""),
        ("SpotStrategy", request.spot_strategy.as_str(), ""),
        ("GpuDriverVersion", request.gpu_driver_version.as_str(), ""),
        ("ScheduleStrategy", request.schedule_strategy.as_str(), ""),
        ("CorePattern", request.core_pattern.as_str(), ""),
        (
            "PlainHttpRegistry",
            request.plain_http_registry.as_str(),
            "",
        ),
        ("InsecureRegistry", request.insecure_registry.as_str(), ""),
    ];
    let mut chosen: Vec<String> = texts
        .into_iter()
        .filter(|(_, value, daemons)| value != daemons)
        .map(|(name, value, _)| format!("{name} {value:?}"))
        .collect();
    chosen.extend(chosen_numbers_and_flags(request));
    chosen.extend(
        request
            .tag
            .iter()
            .filter(|tag| !OWN_TAG_KEYS.contains(&tag.key.as_str()))
            .map(|tag| format!("Tag {:?}={:?}", tag.key, tag.value)),
    );
    // ACR Enterprise instances and the RAM role ARNs to reach them are identities too: the
    // account may not be allowed to use them.
    for acr in &request.acr_registry_info {
        chosen.push(format!(
            "AcrRegistryInfo {:?} (ArnService {:?}, ArnUser {:?})",
            acr.instance_id, acr.arn_service, acr.arn_user
        ));
    }
    chosen
}

/// The numbers, switches and lists the pod set in `request` (see [`pod_chosen`]).
fn chosen_numbers_and_flags(request: &CreateContainerGroupRequest) -> Vec<String> {
    let numbers = [
        (
            "SpotPriceLimit",
            request.spot_price_limit.map(|v| v.to_string()),
        ),
        ("SpotDuration", request.spot_duration.map(|v| v.to_string())),
        ("StrictSpot", request.strict_spot.map(|v| v.to_string())),
        (
            "EphemeralStorage",
            request.ephemeral_storage.map(|v| v.to_string()),
        ),
        ("EipBandwidth", request.eip_bandwidth.map(|v| v.to_string())),
        (
            "Ipv6AddressCount",
            request.ipv6_address_count.map(|v| v.to_string()),
        ),
        (
            "IngressBandwidth",
            request.ingress_bandwidth.map(|v| v.to_string()),
        ),
        (
            "EgressBandwidth",
            request.egress_bandwidth.map(|v| v.to_string()),
        ),
    ];
    let mut chosen: Vec<String> = numbers
        .into_iter()
        .filter_map(|(name, value)| Some(format!("{name} {}", value?)))
        .collect();
    for (name, on) in [
        ("AutoCreateEip", request.auto_create_eip),
        ("AutoMatchImageCache", request.auto_match_image_cache),
    ] {
        if on {
            chosen.push(format!("{name} true"));
        }
    }
    for (name, list) in [
        ("ComputeCategory", &request.compute_category),
        ("NtpServer", &request.ntp_server),
    ] {
        if !list.is_empty() {
            chosen.push(format!("{name} {list:?}"));
        }
    }
    chosen
}

/// Whose problem a refused create is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blame {
    /// The daemon's configuration: the node shows it, the pod waits for the fix.
    Node(Problem),
    /// A parameter the pod chose, which this account may not use: the pod's alone.
    Pod,
    /// A moment's (throttling, an outage): retry as it is.
    Transient,
    /// The request itself: retrying it unchanged will not help.
    Request,
}

/// What one create answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Judgement {
    /// The monitor's name for the answer; `None`: it says nothing about the node.
    pub(super) record_as: Option<&'static str>,
    /// For a refusal, whose problem it is.
    pub(super) blame: Option<Blame>,
}

/// Judges a create's `outcome`; `pod_chose`: the request carries [`pod_chosen`] parameters.
/// Only the probe and creates with the daemon's own parameters speak for the node on
/// permissions.
pub(super) fn judge(outcome: Result<(), &EciError>, pod_chose: bool) -> Judgement {
    let Err(error) = outcome else {
        let record_as = if pod_chose {
            CREATE_WITH_POD_PARAMETERS
        } else {
            CREATE
        };
        return Judgement {
            record_as: Some(record_as),
            blame: None,
        };
    };
    let blame = match misconfig::classify(error) {
        ErrorClass::Configuration(Problem::Permission) if pod_chose => Blame::Pod,
        ErrorClass::Configuration(problem) => Blame::Node(problem),
        ErrorClass::Transient => Blame::Transient,
        ErrorClass::Request => Blame::Request,
    };
    Judgement {
        record_as: matches!(blame, Blame::Node(_)).then_some(CREATE),
        blame: Some(blame),
    }
}

/// A create refused for parameters the pod chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PodRefusal {
    /// The service's code (`Forbidden.RAM`, …): the pod's reason.
    pub(super) code: String,
    /// The service's message.
    pub(super) message: String,
    /// The request id, for the log.
    pub(super) request_id: String,
    /// What the pod chose ([`pod_chosen`]).
    pub(super) chosen: Vec<String>,
}

impl PodRefusal {
    /// One line for the pod's condition and Event (without the request id, so it stays the
    /// same while the refusal does).
    pub(super) fn describe(&self) -> String {
        format!(
            "ECI refused {CREATE} with {}: {}. This pod chooses {} (by its annotations or a Selector's), which this Alibaba Cloud account or the daemon's RAM policy does not allow: remove or change it, or have an administrator grant it; the daemon keeps retrying with a growing back-off",
            self.code,
            self.message.trim_end_matches('.'),
            self.chosen.join(", ")
        )
    }
}

impl PodController {
    /// What a CreateContainerGroup answer means: the group, or how the pod's creation failed.
    /// `chosen`: the request's [`pod_chosen`] parameters.
    pub(super) fn judge_creation(
        &self,
        outcome: Result<CreateContainerGroupResponse, EciError>,
        chosen: Vec<String>,
    ) -> Result<CreateContainerGroupResponse, Failure> {
        let judgement = judge(outcome.as_ref().map(|_| ()), !chosen.is_empty());
        if let Some(action) = judgement.record_as {
            self.inner
                .misconfig
                .record(action, outcome.as_ref().map(|_| ()));
        }
        let error = match outcome {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        if error.code == eci_proto::error::codes::NO_STOCK {
            // Capacity, not the request or the configuration: the pod's fail strategy decides.
            return Err(Failure::NoStock(error.message));
        }
        if error.code == eci_proto::error::codes::DISK_IN_USE {
            // A disk is one group's at a time: the pod waits for the other group to go, as a
            // kubelet waits for a volume to be detached from another node.
            return Err(Failure::DiskInUse(error.message));
        }
        Err(match judgement.blame {
            Some(Blame::Node(_)) => match misconfig::misconfiguration(CREATE, &error) {
                Some(found) => Failure::Misconfigured(found),
                None => Failure::Retry(error.to_string()),
            },
            // Pending and retried, not Failed: as ack-virtual-node (virtual-kubelet) keeps a
            // pod whose creation the provider fails Pending and retries it. A permission is
            // the account's to grant; once an administrator does, the pod runs as written.
            Some(Blame::Pod) => Failure::Refused(PodRefusal {
                code: error.code,
                message: error.message,
                request_id: error.request_id,
                chosen,
            }),
            Some(Blame::Transient) | None => Failure::Retry(error.to_string()),
            Some(Blame::Request) => Failure::Permanent(error.to_string()),
        })
    }

    /// Shows the misconfiguration on the pod (Pending, reason and message, an Event): once per
    /// wait, not at every retry.
    pub(super) fn explain_misconfiguration(&self, pod: &Pod, found: &Misconfiguration) {
        let reason = found.problem.reason();
        let message = format!(
            "{}; the pod stays Pending and is created once ECI accepts the configuration",
            found.describe()
        );
        warn!(code = %found.code, request_id = %found.request_id, "ECI refuses this daemon's configuration; the pod waits");
        self.show(pod, Notice::phase("Pending", reason, &message));
    }

    /// Shows a refusal of the pod's own parameters on the pod: Pending with the service's code
    /// as reason, the `ContainerInstanceCreated=False` condition, a Warning Event. Once per
    /// refusal, not at every retry.
    pub(super) fn explain_refusal(&self, pod: &Pod, refusal: &PodRefusal) {
        let reason = refusal.code.as_str();
        let message = refusal.describe();
        warn!(code = %refusal.code, request_id = %refusal.request_id, chosen = ?refusal.chosen, "ECI refuses a parameter the pod chose; the pod waits");
        self.show(
            pod,
            Notice::not_created("Pending", reason, reason, &message),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_daemons_own_parameters_speak_for_the_node() {
        use Blame::{Node, Pod, Request, Transient};
        use Problem::{Account, ClockSkew, Credentials, NotEci, Permission};
        let own = Some(CREATE);
        let cases: [(&str, bool, Option<&str>, Blame); 16] = [
            ("Forbidden.RAM", false, own, Node(Permission)),
            ("Forbidden.RAM", true, None, Pod),
            ("NoPermission", true, None, Pod),
            ("Forbidden.NoPermission", true, None, Pod),
            ("ActionUnauthorized", true, None, Pod),
            ("NoPermission", false, own, Node(Permission)),
            // Not a pod's parameter's doing, whatever the pod carries.
            ("InvalidAccessKeyId.NotFound", true, own, Node(Credentials)),
            ("SignatureDoesNotMatch", true, own, Node(Credentials)),
            ("InvalidTimeStamp.Expired", true, own, Node(ClockSkew)),
            ("Account.Arrearage", true, own, Node(Account)),
            ("SDK.ForeignResponse", true, own, Node(NotEci)),
            // Nothing about the node either way.
            ("Throttling.User", true, None, Transient),
            ("ServiceUnavailable", false, None, Transient),
            ("InvalidParameter", false, None, Request),
            ("InvalidSecurityGroupId.NotFound", true, None, Request),
            ("Forbidden.InstanceNotFound", true, None, Request),
        ];
        for (code, pod_chose, record_as, blame) in cases {
            let error = EciError::new(code, "m");
            assert_eq!(
                judge(Err(&error), pod_chose),
                Judgement {
                    record_as,
                    blame: Some(blame)
                },
                "{code}, pod chose: {pod_chose}"
            );
        }
        // A success with the pod's parameters clears credentials and the like, not the
        // daemon's own create permission.
        for (pod_chose, record_as) in [(false, CREATE), (true, CREATE_WITH_POD_PARAMETERS)] {
            assert_eq!(
                judge(Ok(()), pod_chose),
                Judgement {
                    record_as: Some(record_as),
                    blame: None
                }
            );
        }
    }

    #[test]
    fn a_success_with_pod_parameters_does_not_clear_the_daemons_permission_refusal() {
        let mut refusals = misconfig::Refusals::default();
        refusals.record(CREATE, Err(&EciError::new("Forbidden.RAM", "no")));
        refusals.record(CREATE_WITH_POD_PARAMETERS, Ok(()));
        assert_eq!(
            refusals.current().map(|m| m.problem),
            Some(Problem::Permission)
        );
        // Credentials concern every call: the pod's success proves them.
        let probe = "DescribeContainerGroupStatus";
        refusals.record(probe, Err(&EciError::new("SignatureDoesNotMatch", "no")));
        assert_eq!(
            refusals.current().map(|m| m.problem),
            Some(Problem::Credentials)
        );
        refusals.record(CREATE_WITH_POD_PARAMETERS, Ok(()));
        assert_eq!(
            refusals.current().map(|m| m.problem),
            Some(Problem::Permission)
        );
        refusals.record(CREATE, Ok(()));
        assert_eq!(refusals.current(), None);
    }

    #[test]
    fn the_pods_choices_are_what_differs_from_the_daemons_own() {
        let own = OwnParameters {
            vswitch: "vsw-a,vsw-b",
            security_group: "sg-own",
        };
        let daemons = CreateContainerGroupRequest {
            v_switch_id: "vsw-a,vsw-b".into(),
            security_group_id: "sg-own".into(),
            ..CreateContainerGroupRequest::default()
        };
        let with = |change: fn(&mut CreateContainerGroupRequest)| {
            let mut request = daemons.clone();
            change(&mut request);
            pod_chosen(&request, own)
        };
        type Change = fn(&mut CreateContainerGroupRequest);
        let cases: [(Change, &[&str]); 21] = [
            (|_| {}, &[]),
            (
                |r| r.ram_role_name = "Admin".into(),
                &["RamRoleName \"Admin\""],
            ),
            (
                |r| r.security_group_id = "sg-x".into(),
                &["SecurityGroupId \"sg-x\""],
            ),
            (|r| r.v_switch_id = "vsw-a".into(), &["VSwitchId \"vsw-a\""]),
            (
                |r| r.resource_group_id = "rg-1".into(),
                &["ResourceGroupId \"rg-1\""],
            ),
            (
                |r| r.eip_instance_id = "eip-1".into(),
                &["EipInstanceId \"eip-1\""],
            ),
            (|r| r.auto_create_eip = true, &["AutoCreateEip true"]),
            (
                |r| r.image_snapshot_id = "imc-1".into(),
                &["ImageSnapshotId \"imc-1\""],
            ),
            (
                |r| r.eip_common_bandwidth_package = "cbwp-1".into(),
                &["EipCommonBandwidthPackage \"cbwp-1\""],
            ),
            (
                |r| r.private_ip_address = "192.168.0.9".into(),
                &["PrivateIpAddress \"192.168.0.9\""],
            ),
            (|r| r.fixed_ip = "true".into(), &["FixedIp \"true\""]),
            (
                |r| {
                    r.acr_registry_info = vec![eci_proto::v20180808::AcrRegistryInfo {
                        instance_id: "cri-1".into(),
                        arn_service: "acs:ram::1:role/x".into(),
                        ..Default::default()
                    }];
                },
                &["AcrRegistryInfo \"cri-1\" (ArnService \"acs:ram::1:role/x\", ArnUser \"\")"],
            ),
            (
                |r| r.spot_strategy = "SpotAsPriceGo".into(),
                &["SpotStrategy \"SpotAsPriceGo\""],
            ),
            (
                |r| r.instance_type = "ecs.gn6i-c4g1.xlarge".into(),
                &["InstanceType \"ecs.gn6i-c4g1.xlarge\""],
            ),
            (
                |r| r.gpu_driver_version = "tesla=525.85.12".into(),
                &["GpuDriverVersion \"tesla=525.85.12\""],
            ),
            (|r| r.spot_price_limit = Some(0.5), &["SpotPriceLimit 0.5"]),
            (
                |r| r.ephemeral_storage = Some(100),
                &["EphemeralStorage 100"],
            ),
            (
                |r| r.auto_match_image_cache = true,
                &["AutoMatchImageCache true"],
            ),
            (
                |r| r.compute_category = vec!["economy".into()],
                &["ComputeCategory [\"economy\"]"],
            ),
            (
                |r| {
                    r.tag.push(eci_proto::v20180808::Tag {
                        key: "cost-centre".into(),
                        value: "team-b".into(),
                    });
                },
                &["Tag \"cost-centre\"=\"team-b\""],
            ),
            // The daemon's own tags, the kube-proxy switch among them, are not the pod's.
            (
                |r| {
                    r.tag = vne_core::to_eci::naming::tags("c", "n", "ns", "p", "u");
                    r.tag.push(eci_proto::v20180808::Tag {
                        key: ANNOTATION_KUBE_PROXY.into(),
                        value: "true".into(),
                    });
                },
                &[],
            ),
        ];
        for (change, expected) in cases {
            assert_eq!(with(change), expected);
        }
    }

    /// A `Forbidden` answer to a create that carries something the pod chose (a tag, an
    /// instance type, spot, a GPU driver, …) is the pod's: no taint for every tenant. The same
    /// answer to a create with only the daemon's own parameters is the node's.
    #[test]
    fn a_refusal_of_what_the_pod_chose_is_never_the_nodes() {
        let own = OwnParameters {
            vswitch: "vsw-a",
            security_group: "sg-own",
        };
        let daemons = CreateContainerGroupRequest {
            v_switch_id: "vsw-a".into(),
            security_group_id: "sg-own".into(),
            tag: vne_core::to_eci::naming::tags("c", "n", "ns", "p", "u"),
            ..CreateContainerGroupRequest::default()
        };
        type Change = fn(&mut CreateContainerGroupRequest);
        let cases: [(&str, Change, &str, Blame); 9] = [
            (
                "nothing",
                |_| {},
                "Forbidden.RAM",
                Blame::Node(Problem::Permission),
            ),
            (
                "a tag",
                |r| {
                    r.tag.push(eci_proto::v20180808::Tag {
                        key: "cost-centre".into(),
                        value: "finance".into(),
                    });
                },
                "Forbidden.TagPolicy",
                Blame::Pod,
            ),
            (
                "an instance type",
                |r| r.instance_type = "ecs.g7.16xlarge".into(),
                "Forbidden.InstanceType",
                Blame::Pod,
            ),
            (
                "spot",
                |r| r.spot_strategy = "SpotAsPriceGo".into(),
                "Forbidden.Spot",
                Blame::Pod,
            ),
            (
                "a GPU driver",
                |r| r.gpu_driver_version = "tesla=470.82.01".into(),
                "NoPermission",
                Blame::Pod,
            ),
            (
                "a zone",
                |r| r.zone_id = "cn-hangzhou-k".into(),
                "Forbidden",
                Blame::Pod,
            ),
            (
                "a RAM role",
                |r| r.ram_role_name = "Admin".into(),
                "Forbidden.RAM",
                Blame::Pod,
            ),
            // Credentials are never a parameter's doing.
            (
                "a tag, refused credentials",
                |r| {
                    r.tag.push(eci_proto::v20180808::Tag {
                        key: "k".into(),
                        value: "v".into(),
                    });
                },
                "InvalidAccessKeyId.NotFound",
                Blame::Node(Problem::Credentials),
            ),
            (
                "spot, throttled",
                |r| r.spot_strategy = "SpotAsPriceGo".into(),
                "Throttling.User",
                Blame::Transient,
            ),
        ];
        for (what, change, code, blame) in cases {
            let mut request = daemons.clone();
            change(&mut request);
            let chosen = pod_chosen(&request, own);
            let judgement = judge(Err(&EciError::new(code, "m")), !chosen.is_empty());
            assert_eq!(
                judgement.blame,
                Some(blame),
                "{what}: {code}, chosen {chosen:?}"
            );
            assert_eq!(
                judgement.record_as.is_some(),
                matches!(blame, Blame::Node(_)),
                "{what}: only the node's problems reach the monitor"
            );
        }
    }

    #[test]
    fn the_refusal_names_code_message_and_the_pods_choice() {
        let refusal = PodRefusal {
            code: "Forbidden.RAM".into(),
            message: "User not authorized.".into(),
            request_id: "R-1".into(),
            chosen: vec!["RamRoleName \"Admin\"".into()],
        };
        let text = refusal.describe();
        for part in [
            "Forbidden.RAM",
            "User not authorized",
            "RamRoleName \"Admin\"",
            "retrying",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        assert!(!text.contains("R-1"));
    }
}
