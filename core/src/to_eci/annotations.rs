//! Every pod annotation ack-virtual-node documents, and what this daemon does with it: one
//! table ([`TABLE`]) that the translation applies, the docs page is generated from, and the
//! tests hold to the service's parameter names. An annotation is mapped to CreateContainerGroup
//! parameters (a malformed value refuses the pod), reported as not driven or not yet honoured
//! (a Warning Event; the group is still created), or written back by the daemon. Nothing in
//! the table is silently ignored. Pure: no I/O.

use core::net::{IpAddr, Ipv4Addr};
use std::collections::BTreeMap;

use eci_proto::v20180808::{
    AcrRegistryInfo, ContainerGroup, CreateContainerGroupRequest, DnsConfig, DnsOption, HostAliase,
    Tag,
};
use k8s_openapi::api::core::v1::{HostAlias, PodDNSConfig};

use super::{Rejection, reject};
use crate::quantity;

/// Applies a mapped annotation's value to the request, or says why the value is malformed.
pub type Apply = fn(&str, &mut CreateContainerGroupRequest) -> Result<(), String>;

/// What happens to one annotation.
#[derive(Debug, Clone, Copy)]
pub enum Handling {
    /// Passed to CreateContainerGroup as these parameters (names as `names.tsv` writes them).
    Mapped {
        /// The parameters it sets.
        parameters: &'static [&'static str],
        /// How.
        apply: Apply,
    },
    /// Needs something this daemon does not drive (named): a Warning Event, the group is
    /// created without it.
    NotDriven(&'static str),
    /// Not a CreateContainerGroup parameter: the daemon itself acts on it (how).
    ByDaemon {
        /// What the daemon does with it.
        how: &'static str,
        /// Rejects a malformed value.
        check: fn(&str) -> Result<(), String>,
    },
    /// Written by the daemon on the pod (from what): a value the pod sets is replaced.
    WrittenBack(&'static str),
}

/// One documented annotation.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The full annotation name.
    pub key: &'static str,
    /// What happens to it.
    pub handling: Handling,
    /// The values accepted (docs and error messages).
    pub accepts: &'static str,
    /// A valid value (tests and docs).
    pub example: &'static str,
}

/// Pod annotation: `vCPU-memory` pairs and/or ECS instance types for the group.
pub const USE_SPECS: &str = "k8s.aliyun.com/eci-use-specs";
/// ClusterIP Service access from the group (see `super::ANNOTATION_KUBE_PROXY`).
pub const KUBE_PROXY: &str = "k8s.aliyun.com/eci-kube-proxy-enabled";
/// Written back: the group's id (the controller's `INSTANCE_ANNOTATION`).
pub const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";
/// Written back: the id of the request that created the group.
pub const REQUEST_ID: &str = "k8s.aliyun.com/eci-request-id";

/// Written back: the group's ECS instance type, or ACK's `<vCPU>-<GiB>Gi` form.
pub const INSTANCE_SPEC: &str = "k8s.aliyun.com/eci-instance-spec";
/// Written back: the group's elastic network interface.
pub const ENI_INSTANCE_ID: &str = "k8s.aliyun.com/eni-instance-id";
/// Written back: the VPC the group runs in.
pub const VPC: &str = "k8s.aliyun.com/eci-vpc";
/// Written back: the group's public (EIP) address, when it has one.
pub const EIP_ADDRESS: &str = "k8s.aliyun.com/allocated-eipAddress";

/// Written back: the image cache the group was created from, as ECI's
/// `SuccessfulHitImageCache` event names it.
pub const MATCHED_IMAGE_CACHE: &str = "k8s.aliyun.com/eci-matched-image-cache";

/// Written back when the create listed several vSwitches: the zone the group landed in (the
/// well-known topology key, so users and tools read it where they read a node's zone).
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// Every annotation the daemon writes back on a pod: its own, whatever a pod author wrote there.
pub const WRITTEN_BACK: [&str; 8] = [
    INSTANCE_ID,
    REQUEST_ID,
    INSTANCE_SPEC,
    ENI_INSTANCE_ID,
    VPC,
    EIP_ADDRESS,
    MATCHED_IMAGE_CACHE,
    ZONE,
];

/// Event reason: the pod carries annotations the group is created without.
pub const NOT_HONOURED: &str = "AnnotationNotHonoured";
/// Condition and Event reason: an annotation's value is malformed (the message names it).
pub const INVALID: &str = "InvalidAnnotation";

macro_rules! mapped {
    ($key:literal, [$($param:literal),+], $apply:expr, $accepts:literal, $example:literal) => {
        Entry {
            key: $key,
            handling: Handling::Mapped { parameters: &[$($param),+], apply: $apply },
            accepts: $accepts,
            example: $example,
        }
    };
}

const NO_FAMILY: &str = "choosing an instance family or generation (CreateContainerGroup has no parameter for it; list ECS types in eci-use-specs instead)";
const NO_PRIVATE_POOL: &str = "ECS private pools (CreateContainerGroup has no parameter for them)";
const NO_IMC_TUNING: &str = "tuning of image cache matching (CreateContainerGroup has no parameter for it; eci-auto-imc matches with the service's defaults)";
const ON_NO_STOCK: &str = "when no zone of the pod's vSwitches has stock (`OperationDenied.NoStock`): `fail-back` and `fail-over` (the default) keep the pod Pending (`ContainerInstanceCreated=False`, reason `NoStock`) and retry with back-off until eci-max-pending-minute has passed since the pod's creation; `fail-fast` fails the pod at once (`ProviderFailed`)";
const PENDING_BOUND: &str = "bounds how long a pod waits for stock (from its creation; default 240) before it fails (`ProviderFailed`, condition reason `NoStock`); unlike ECI's own limit it does not end an instance stuck Pending after creation (an image that cannot be pulled)";

/// Pod annotation: what to do when no zone has stock (see [`ON_NO_STOCK`]).
pub const FAIL_STRATEGY: &str = "k8s.aliyun.com/eci-fail-strategy";
/// Pod annotation: how many minutes a pod waits for stock.
pub const MAX_PENDING_MINUTE: &str = "k8s.aliyun.com/eci-max-pending-minute";

/// Every annotation ack-virtual-node documents, in the order they are applied.
pub const TABLE: &[Entry] = &[
    // Instance.
    mapped!(
        "k8s.aliyun.com/eci-use-specs",
        ["Cpu", "Memory", "InstanceType"],
        use_specs,
        "comma list of `vCPU-memory` pairs (`2-4Gi`) and/or ECS types (`ecs.c6.large`); the first pair sizes the group",
        "2-4Gi,ecs.c6.large"
    ),
    mapped!(
        "k8s.aliyun.com/eci-vswitch",
        ["VSwitchId"],
        vswitches,
        "comma list of 1 to 10 vSwitch ids (same VPC)",
        "vsw-a,vsw-b"
    ),
    mapped!(
        "k8s.aliyun.com/eci-schedule-strategy",
        ["ScheduleStrategy"],
        schedule_strategy,
        "`VSwitchOrdered` or `VSwitchRandom`",
        "VSwitchOrdered"
    ),
    mapped!(
        "k8s.aliyun.com/eci-security-group",
        ["SecurityGroupId"],
        |v, r| id(v).map(|v| r.security_group_id = v),
        "a security group id",
        "sg-2"
    ),
    Entry {
        key: "k8s.aliyun.com/eci-instance-family",
        handling: Handling::NotDriven(NO_FAMILY),
        accepts: "ECS instance families",
        example: "ecs.c6",
    },
    Entry {
        key: "k8s.aliyun.com/eci-instance-generation",
        handling: Handling::NotDriven(NO_FAMILY),
        accepts: "ECS instance generations",
        example: "ecs-6",
    },
    mapped!(
        "k8s.aliyun.com/eci-compute-category",
        ["ComputeCategory.N"],
        compute_category,
        "comma list of `economy`, `general`",
        "economy,general"
    ),
    mapped!(
        "k8s.aliyun.com/eci-gpu-driver-version",
        ["GpuDriverVersion"],
        |v, r| id(v).map(|v| r.gpu_driver_version = v),
        "a driver version the service offers, e.g. `tesla=525.85.12`",
        "tesla=525.85.12"
    ),
    mapped!(
        "k8s.aliyun.com/eci-spot-strategy",
        ["SpotStrategy"],
        spot_strategy,
        "`SpotAsPriceGo`, `SpotWithPriceLimit` (with eci-spot-price-limit) or `NoSpot`",
        "SpotWithPriceLimit"
    ),
    mapped!(
        "k8s.aliyun.com/eci-spot-price-limit",
        ["SpotPriceLimit"],
        |v, r| number::<f64>(v, "a price per hour")
            .and_then(non_negative)
            .map(|p| r.spot_price_limit = Some(p)),
        "a price per hour (0 or more)",
        "0.25"
    ),
    mapped!(
        "k8s.aliyun.com/eci-spot-duration",
        ["SpotDuration"],
        spot_duration,
        "protection hours: `0` or `1`",
        "1"
    ),
    mapped!(
        "k8s.aliyun.com/eci-spot-fallback",
        ["StrictSpot"],
        |v, r| boolean(v).map(|b| r.strict_spot = Some(!b)),
        "`true` (fall back to pay-as-you-go without spot stock) or `false`",
        "true"
    ),
    Entry {
        key: "k8s.aliyun.com/eci-privatepool-matchcriteria",
        handling: Handling::NotDriven(NO_PRIVATE_POOL),
        accepts: "`Open`, `Target`, `None`",
        example: "Open",
    },
    Entry {
        key: "k8s.aliyun.com/eci-privatepool-id",
        handling: Handling::NotDriven(NO_PRIVATE_POOL),
        accepts: "a private pool id",
        example: "eap-1",
    },
    Entry {
        key: "k8s.aliyun.com/eci-fail-strategy",
        handling: Handling::ByDaemon {
            how: ON_NO_STOCK,
            check: fail_strategy,
        },
        accepts: "`fail-back`, `fail-over` or `fail-fast`",
        example: "fail-fast",
    },
    Entry {
        key: "k8s.aliyun.com/eci-max-pending-minute",
        handling: Handling::ByDaemon {
            how: PENDING_BOUND,
            check: pending_minutes,
        },
        accepts: "minutes, 10 to 1440 (ACK's range)",
        example: "30",
    },
    mapped!(
        "k8s.aliyun.com/eci-custom-hosts",
        ["HostAliase.N.Ip", "HostAliase.N.Hostname.N"],
        custom_hosts,
        "a JSON list of host aliases as in `spec.hostAliases` (`[{\"ip\": …, \"hostnames\": […]}]`), added to the pod's",
        r#"[{"ip":"10.0.0.7","hostnames":["db.internal"]}]"#
    ),
    mapped!(
        "k8s.aliyun.com/eci-custom-tags",
        ["Tag.N.Key", "Tag.N.Value"],
        custom_tags,
        "comma list of up to 10 `key:value` pairs; keys under `k8s.aliyun.com/` or `aliyun` are reserved",
        "team:shop,env:prod"
    ),
    mapped!(
        "k8s.aliyun.com/eci-ram-role-name",
        ["RamRoleName"],
        |v, r| id(v).map(|v| r.ram_role_name = v),
        "a RAM role name",
        "reader"
    ),
    mapped!(
        "k8s.aliyun.com/eci-resource-group-id",
        ["ResourceGroupId"],
        |v, r| id(v).map(|v| r.resource_group_id = v),
        "a resource group id",
        "rg-1"
    ),
    // Images.
    mapped!(
        "k8s.aliyun.com/eci-auto-imc",
        ["AutoMatchImageCache"],
        |v, r| boolean(v).map(|b| r.auto_match_image_cache |= b),
        "`true` or `false`",
        "true"
    ),
    mapped!(
        "k8s.aliyun.com/eci-image-cache",
        ["AutoMatchImageCache"],
        |v, r| boolean(v).map(|b| r.auto_match_image_cache |= b),
        "`true` or `false` (older name of eci-auto-imc)",
        "true"
    ),
    Entry {
        key: "k8s.aliyun.com/imc-perfect-match",
        handling: Handling::NotDriven(NO_IMC_TUNING),
        accepts: "`true` or `false`",
        example: "true",
    },
    Entry {
        key: "k8s.aliyun.com/imc-match-count-request",
        handling: Handling::NotDriven(NO_IMC_TUNING),
        accepts: "`true` or `false`",
        example: "true",
    },
    mapped!(
        "k8s.aliyun.com/eci-imc-id",
        ["ImageSnapshotId"],
        |v, r| id(v).map(|v| r.image_snapshot_id = v),
        "an image cache id",
        "imc-1"
    ),
    mapped!(
        "k8s.aliyun.com/acr-instance-ids",
        ["AcrRegistryInfo.N.InstanceId", "AcrRegistryInfo.N.RegionId"],
        acr_instances,
        "comma list of ACR Enterprise instance ids, each optionally `region:` prefixed",
        "cri-1,cn-beijing:cri-2"
    ),
    mapped!(
        "k8s.aliyun.com/acr-service-arns",
        ["AcrRegistryInfo.N.ArnService"],
        |v, r| acr_arns(v, r, |a, arn| a.arn_service = arn),
        "one RAM role ARN for every instance of acr-instance-ids, or one per instance (comma list)",
        "acs:ram::1:role/acr"
    ),
    mapped!(
        "k8s.aliyun.com/acr-user-arns",
        ["AcrRegistryInfo.N.ArnUser"],
        |v, r| acr_arns(v, r, |a, arn| a.arn_user = arn),
        "as acr-service-arns",
        "acs:ram::2:role/acr-user"
    ),
    mapped!(
        "k8s.aliyun.com/plain-http-registry",
        ["PlainHttpRegistry"],
        |v, r| addresses(v).map(|v| r.plain_http_registry = v),
        "comma list of registry addresses (`host[:port]`)",
        "registry.local:5000"
    ),
    mapped!(
        "k8s.aliyun.com/insecure-registry",
        ["InsecureRegistry"],
        |v, r| addresses(v).map(|v| r.insecure_registry = v),
        "comma list of registry addresses (`host[:port]`)",
        "harbor.local"
    ),
    // Network, storage, operations.
    mapped!(
        "k8s.aliyun.com/eci-with-eip",
        ["AutoCreateEip"],
        |v, r| boolean(v).map(|b| r.auto_create_eip = b),
        "`true` or `false`",
        "true"
    ),
    mapped!(
        "k8s.aliyun.com/eci-eip-instanceid",
        ["EipInstanceId"],
        |v, r| id(v).map(|v| r.eip_instance_id = v),
        "an EIP id",
        "eip-1"
    ),
    mapped!(
        "k8s.aliyun.com/eip-bandwidth",
        ["EipBandwidth"],
        |v, r| number::<i32>(v, "Mbit/s")
            .and_then(|b| within(b, 1, 500))
            .map(|b| r.eip_bandwidth = Some(b)),
        "Mbit/s, 1 to 500",
        "5"
    ),
    mapped!(
        "k8s.aliyun.com/eip-common-bandwidth-package-id",
        ["EipCommonBandwidthPackage"],
        |v, r| id(v).map(|v| r.eip_common_bandwidth_package = v),
        "a shared bandwidth package id",
        "cbwp-1"
    ),
    mapped!(
        "k8s.aliyun.com/eip-isp",
        ["EipISP"],
        eip_isp,
        "`BGP` or `BGP_PRO`",
        "BGP_PRO"
    ),
    mapped!(
        "k8s.aliyun.com/eci-enable-ipv6",
        ["Ipv6AddressCount"],
        |v, r| boolean(v).map(|b| r.ipv6_address_count = b.then_some(1)),
        "`true` (one IPv6 address) or `false`",
        "true"
    ),
    mapped!(
        "k8s.aliyun.com/eci-private-ip-address",
        ["PrivateIpAddress"],
        |v, r| v
            .trim()
            .parse::<Ipv4Addr>()
            .map(|ip| r.private_ip_address = ip.to_string())
            .map_err(|_| format!("{v:?} is not an IPv4 address")),
        "an IPv4 address of the vSwitch",
        "192.168.0.20"
    ),
    mapped!(
        "k8s.aliyun.com/eci-fixed-ip",
        ["FixedIp"],
        |v, r| boolean(v).map(|b| r.fixed_ip = if b { "true".into() } else { String::new() }),
        "`true` or `false`",
        "true"
    ),
    mapped!(
        "k8s.aliyun.com/eci-custom-dnsconfig",
        [
            "DnsConfig.NameServer.N",
            "DnsConfig.Search.N",
            "DnsConfig.Option.N.Name",
            "DnsConfig.Option.N.Value"
        ],
        custom_dns,
        "a JSON object as `spec.dnsConfig` (`nameservers`, `searches`, `options`), merged into the pod's",
        r#"{"nameservers":["10.0.0.53"],"searches":["corp"],"options":[{"name":"ndots","value":"2"}]}"#
    ),
    mapped!(
        "k8s.aliyun.com/eci-extra-ephemeral-storage",
        ["EphemeralStorage"],
        ephemeral_storage,
        "whole GiB, e.g. `50Gi`",
        "50Gi"
    ),
    Entry {
        key: "k8s.aliyun.com/eci-eviction-enable",
        handling: Handling::NotDriven(
            "evicting pods that exceed their ephemeral storage (the daemon does not evict; ECI enforces limits in the group)",
        ),
        accepts: "`true` or `false`",
        example: "true",
    },
    mapped!(
        "k8s.aliyun.com/eci-ntp-server",
        ["NtpServer.N"],
        ntp_servers,
        "comma list of IP addresses",
        "100.100.3.1,100.100.3.2"
    ),
    mapped!(
        "k8s.aliyun.com/eci-core-pattern",
        ["CorePattern"],
        core_pattern,
        "an absolute directory for core files",
        "/pod/data/dump/core"
    ),
    mapped!(
        "k8s.aliyun.com/eci-kube-proxy-enabled",
        ["Tag.N.Key", "Tag.N.Value"],
        kube_proxy,
        "`true` or `false` (the group carries it as a tag of the same key)",
        "false"
    ),
    Entry {
        key: "k8s.aliyun.com/eci-sls-enable",
        handling: Handling::NotDriven(
            "SLS log collection (the daemon creates no log configuration)",
        ),
        accepts: "`true` or `false`",
        example: "false",
    },
    mapped!(
        "kubernetes.io/ingress-bandwidth",
        ["IngressBandwidth"],
        |v, r| bandwidth(v).map(|b| r.ingress_bandwidth = Some(b)),
        "bit/s as a quantity, e.g. `10M`",
        "10M"
    ),
    mapped!(
        "kubernetes.io/egress-bandwidth",
        ["EgressBandwidth"],
        |v, r| bandwidth(v).map(|b| r.egress_bandwidth = Some(b)),
        "bit/s as a quantity, e.g. `10M`",
        "20M"
    ),
    // Written back.
    Entry {
        key: INSTANCE_ID,
        handling: Handling::WrittenBack("CreateContainerGroup's ContainerGroupId"),
        accepts: "",
        example: "",
    },
    Entry {
        key: REQUEST_ID,
        handling: Handling::WrittenBack("CreateContainerGroup's RequestId"),
        accepts: "",
        example: "",
    },
    Entry {
        key: INSTANCE_SPEC,
        handling: Handling::WrittenBack(
            "DescribeContainerGroups' InstanceType, or `<Cpu>-<Memory>Gi` when it names none",
        ),
        accepts: "",
        example: "",
    },
    Entry {
        key: ENI_INSTANCE_ID,
        handling: Handling::WrittenBack("DescribeContainerGroups' EniInstanceId"),
        accepts: "",
        example: "",
    },
    Entry {
        key: VPC,
        handling: Handling::WrittenBack("DescribeContainerGroups' VpcId"),
        accepts: "",
        example: "",
    },
    Entry {
        key: EIP_ADDRESS,
        handling: Handling::WrittenBack(
            "DescribeContainerGroups' InternetIp, when the group has one (`eci-with-eip`, `eci-eip-instanceid`)",
        ),
        accepts: "",
        example: "",
    },
    Entry {
        key: MATCHED_IMAGE_CACHE,
        handling: Handling::WrittenBack(
            "the cache DescribeContainerGroups' `SuccessfulHitImageCache` event names, when the group was created from one (`eci-auto-imc`, `eci-imc-id`)",
        ),
        accepts: "",
        example: "",
    },
];

/// The table entry of an annotation.
pub fn entry(key: &str) -> Option<&'static Entry> {
    TABLE.iter().find(|e| e.key == key)
}

/// The field a rejection of `key` names.
fn field(key: &str) -> String {
    format!("metadata.annotations[{key}]")
}

/// The annotation a rejection is about, if it is about one.
pub fn rejected_annotation(rejection: &Rejection) -> Option<&str> {
    rejection
        .field
        .strip_prefix("metadata.annotations[")
        .and_then(|rest| rest.strip_suffix(']'))
}

/// Applies the pod's mapped annotations (table order) and checks the rest; a malformed value
/// refuses the pod, naming the annotation and what it accepts.
pub fn apply(
    annotations: &BTreeMap<String, String>,
    request: &mut CreateContainerGroupRequest,
) -> Result<(), Rejection> {
    for entry in TABLE {
        let Some(value) = annotations.get(entry.key).filter(|v| !v.is_empty()) else {
            continue;
        };
        let handling = match entry.handling {
            Handling::Mapped { apply, .. } => apply(value, request),
            Handling::ByDaemon { check, .. } => check(value),
            Handling::NotDriven(_) | Handling::WrittenBack(_) => Ok(()),
        };
        handling.map_err(|why| {
            reject(
                &field(entry.key),
                format!("{why} (accepted: {})", entry.accepts),
            )
        })?;
    }
    if request.spot_strategy == "SpotWithPriceLimit" && request.spot_price_limit.is_none() {
        return Err(reject(
            &field("k8s.aliyun.com/eci-spot-price-limit"),
            "SpotWithPriceLimit needs a price limit",
        ));
    }
    Ok(())
}

/// One line per annotation the pod carries that the group is created without (for one
/// Warning Event).
pub fn notices(annotations: &BTreeMap<String, String>) -> Vec<String> {
    TABLE
        .iter()
        .filter(|e| annotations.get(e.key).is_some_and(|v| !v.is_empty()))
        .filter_map(|e| match e.handling {
            Handling::NotDriven(what) => Some(format!("{}: not driven: {what}", e.key)),
            Handling::Mapped { .. } | Handling::ByDaemon { .. } | Handling::WrittenBack(_) => None,
        })
        .collect()
}

/// What the daemon writes on the pod once its group is created, from the creation's answer
/// (the rest comes from the group's description, see [`described`]).
pub fn written_back(group_id: &str, request_id: &str) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::from([(INSTANCE_ID, group_id.to_owned())]);
    if !request_id.is_empty() {
        out.insert(REQUEST_ID, request_id.to_owned());
    }
    out
}

/// What the daemon writes on the pod from its group's description, beside [`written_back`]
/// in the same write: only what the service filled in (an empty field is left out, never
/// written empty), and the zone only when the create left it to the service (`zone`: it
/// listed several vSwitches).
pub fn described(group: &ContainerGroup, zone: bool) -> BTreeMap<&'static str, String> {
    let spec = if !group.instance_type.is_empty() {
        group.instance_type.clone()
    } else if group.cpu > 0.0 && group.memory > 0.0 {
        // ACK's form for a group sized by vCPU and memory, as `eci-use-specs` takes it.
        format!("{}-{}Gi", group.cpu, group.memory)
    } else {
        String::new()
    };
    let mut out = BTreeMap::new();
    for (key, value) in [
        (INSTANCE_SPEC, spec),
        (ENI_INSTANCE_ID, group.eni_instance_id.clone()),
        (VPC, group.vpc_id.clone()),
        (EIP_ADDRESS, group.internet_ip.clone()),
        (MATCHED_IMAGE_CACHE, matched_image_cache(group)),
        (
            ZONE,
            if zone {
                group.zone_id.clone()
            } else {
                String::new()
            },
        ),
    ] {
        if !value.is_empty() {
            out.insert(key, value);
        }
    }
    out
}

/// The image cache ECI says the group was created from (empty when none): no answer field
/// names it, only the `SuccessfulHitImageCache` event, whose id is checked before it is written.
fn matched_image_cache(group: &ContainerGroup) -> String {
    group
        .events
        .iter()
        .filter(|event| event.reason == eci_proto::events::HIT_IMAGE_CACHE)
        .find_map(|event| eci_proto::events::hit_image_cache_id(&event.message))
        .unwrap_or_default()
        .to_owned()
}

fn boolean(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{other:?} is neither \"true\" nor \"false\"")),
    }
}

fn number<T: std::str::FromStr>(value: &str, what: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not {what}"))
}

fn non_negative(value: f64) -> Result<f64, String> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("{value} is negative"))
    }
}

fn within(value: i32, low: i32, high: i32) -> Result<i32, String> {
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} is not between {low} and {high}"))
    }
}

/// One of `allowed`, exactly.
fn one_of(value: &str, allowed: &[&str]) -> Result<String, String> {
    let value = value.trim();
    if allowed.contains(&value) {
        Ok(value.to_owned())
    } else {
        Err(format!("{value:?} is not one of {}", allowed.join(", ")))
    }
}

/// A cloud resource id or name: ASCII letters, digits and `-_.:=/@`, at most 256 characters.
fn id(value: &str) -> Result<String, String> {
    let value = value.trim();
    let fits = |c: char| c.is_ascii_alphanumeric() || "-_.:=/@".contains(c);
    if value.len() <= 256 && value.chars().all(fits) {
        Ok(value.to_owned())
    } else {
        Err(format!("{value:?} is not an id"))
    }
}

/// A comma list, trimmed, without empty entries.
fn list(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

fn vswitches(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let ids = list(value)
        .into_iter()
        .map(id)
        .collect::<Result<Vec<_>, _>>()?;
    if ids.is_empty() || ids.len() > 10 {
        return Err(format!("{} vSwitches given", ids.len()));
    }
    request.v_switch_id = ids.join(",");
    Ok(())
}

fn schedule_strategy(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    request.schedule_strategy = one_of(value, &["VSwitchOrdered", "VSwitchRandom"])?;
    Ok(())
}

fn compute_category(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    request.compute_category = list(value)
        .into_iter()
        .map(|c| one_of(c, &["economy", "general"]))
        .collect::<Result<_, _>>()?;
    Ok(())
}

fn spot_strategy(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    request.spot_strategy = one_of(value, &["SpotAsPriceGo", "SpotWithPriceLimit", "NoSpot"])?;
    Ok(())
}

fn spot_duration(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let hours = number::<i32>(value, "a number of hours").and_then(|h| within(h, 0, 1))?;
    request.spot_duration = Some(hours);
    Ok(())
}

fn fail_strategy(value: &str) -> Result<(), String> {
    one_of(value, &["fail-back", "fail-over", "fail-fast"]).map(drop)
}

fn pending_minutes(value: &str) -> Result<(), String> {
    number::<i32>(value, "a number of minutes")
        .and_then(|m| within(m, 10, 1440))
        .map(drop)
}

/// What to do when no zone has stock (`eci-fail-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailStrategy {
    /// `fail-back` (the default) or `fail-over` (ACK documents them as the same): wait and retry.
    Retry,
    /// `fail-fast`: fail the pod at once.
    FailFast,
}

/// The pod's fail strategy and how long it may wait for stock (its annotations were checked
/// when its request was translated; a value that slips through counts as absent).
pub fn on_no_stock(annotations: &BTreeMap<String, String>) -> (FailStrategy, std::time::Duration) {
    let strategy = match annotations.get(FAIL_STRATEGY).map(|v| v.trim()) {
        Some("fail-fast") => FailStrategy::FailFast,
        _ => FailStrategy::Retry,
    };
    let minutes = annotations
        .get(MAX_PENDING_MINUTE)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|m| (10..=1440).contains(m))
        .unwrap_or(DEFAULT_MAX_PENDING_MINUTES);
    (strategy, std::time::Duration::from_secs(minutes * 60))
}

/// ACK's default wait (4 hours).
pub const DEFAULT_MAX_PENDING_MINUTES: u64 = 240;

fn custom_hosts(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let aliases: Vec<HostAlias> =
        serde_json::from_str(value).map_err(|e| format!("not a JSON list of host aliases: {e}"))?;
    for alias in aliases {
        alias
            .ip
            .parse::<IpAddr>()
            .map_err(|_| format!("{:?} is not an IP address", alias.ip))?;
        let hostnames = alias.hostnames.unwrap_or_default();
        if hostnames.is_empty() {
            return Err(format!("{} has no hostnames", alias.ip));
        }
        request.host_aliase.push(HostAliase {
            ip: alias.ip,
            hostname: hostnames,
        });
    }
    Ok(())
}

/// Tag key prefixes the daemon's own tags use or the cloud reserves.
const RESERVED_TAG_PREFIXES: &[&str] = &["k8s.aliyun.com/", "aliyun"];

fn custom_tags(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let pairs = list(value);
    if pairs.len() > 10 {
        return Err(format!("{} tags given, at most 10", pairs.len()));
    }
    for pair in pairs {
        let (key, value) = pair
            .split_once(':')
            .ok_or_else(|| format!("{pair:?} is not key:value"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || key.len() > 128 || value.len() > 128 {
            return Err(format!(
                "{pair:?}: a key of 1-128 and a value of 0-128 characters"
            ));
        }
        if RESERVED_TAG_PREFIXES.iter().any(|p| key.starts_with(p)) {
            return Err(format!("tag key {key:?} is reserved"));
        }
        request.tag.push(Tag {
            key: key.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(())
}

fn acr_instances(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    for entry in list(value) {
        let (region, instance) = match entry.split_once(':') {
            Some((region, instance)) => (id(region)?, id(instance)?),
            None => (String::new(), id(entry)?),
        };
        request.acr_registry_info.push(AcrRegistryInfo {
            instance_id: instance,
            region_id: region,
            ..AcrRegistryInfo::default()
        });
    }
    Ok(())
}

/// One ARN for every ACR instance, or one per instance in order.
fn acr_arns(
    value: &str,
    request: &mut CreateContainerGroupRequest,
    set: fn(&mut AcrRegistryInfo, String),
) -> Result<(), String> {
    let arns = list(value)
        .into_iter()
        .map(id)
        .collect::<Result<Vec<_>, _>>()?;
    let instances = request.acr_registry_info.len();
    if instances == 0 {
        return Err("needs k8s.aliyun.com/acr-instance-ids".to_owned());
    }
    match arns.len() {
        1 => request
            .acr_registry_info
            .iter_mut()
            .for_each(|a| set(a, arns[0].clone())),
        n if n == instances => request
            .acr_registry_info
            .iter_mut()
            .zip(arns)
            .for_each(|(a, arn)| set(a, arn)),
        n => return Err(format!("{n} ARNs for {instances} ACR instances")),
    }
    Ok(())
}

/// `host[:port]` entries, joined as the service takes them.
fn addresses(value: &str) -> Result<String, String> {
    let entries = list(value);
    let fits = |c: char| c.is_ascii_alphanumeric() || "-.:[]".contains(c);
    match entries.iter().find(|e| !e.chars().all(fits)) {
        Some(bad) => Err(format!("{bad:?} is not a registry address")),
        None if entries.is_empty() => Err("no registry address".to_owned()),
        None => Ok(entries.join(",")),
    }
}

fn eip_isp(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    request.eip_isp = one_of(value, &["BGP", "BGP_PRO"])?;
    Ok(())
}

fn custom_dns(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let extra: PodDNSConfig =
        serde_json::from_str(value).map_err(|e| format!("not a JSON DNS config: {e}"))?;
    for server in extra.nameservers.iter().flatten() {
        server
            .parse::<IpAddr>()
            .map_err(|_| format!("nameserver {server:?} is not an IP address"))?;
    }
    let config = request.dns_config.get_or_insert_with(DnsConfig::default);
    config
        .name_server
        .extend(extra.nameservers.unwrap_or_default());
    config.search.extend(extra.searches.unwrap_or_default());
    for option in extra.options.unwrap_or_default() {
        let name = option.name.unwrap_or_default();
        config.option.retain(|o| o.name != name);
        config.option.push(DnsOption {
            name,
            value: option.value.unwrap_or_default(),
        });
    }
    Ok(())
}

fn ephemeral_storage(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let bytes = quantity::parse(value).map_err(|e| e.to_string())?;
    let gib = quantity::gib(bytes);
    if gib < 1.0 || gib.fract() != 0.0 || gib > f64::from(i32::MAX) {
        return Err(format!("{value:?} is not a whole number of GiB"));
    }
    // Checked above: a whole number within i32.
    #[allow(clippy::cast_possible_truncation)]
    let whole = gib as i32;
    request.ephemeral_storage = Some(whole);
    Ok(())
}

fn ntp_servers(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let servers = list(value);
    if let Some(bad) = servers.iter().find(|s| s.parse::<IpAddr>().is_err()) {
        return Err(format!("{bad:?} is not an IP address"));
    }
    request.ntp_server = servers.into_iter().map(str::to_owned).collect();
    Ok(())
}

fn core_pattern(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let value = value.trim();
    if !value.starts_with('/') || value.contains(char::is_whitespace) || value.contains("..") {
        return Err(format!("{value:?} is not an absolute directory"));
    }
    request.core_pattern = value.to_owned();
    Ok(())
}

/// The tag `translate` adds from the daemon's default, set to the pod's choice.
fn kube_proxy(value: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let enabled = boolean(value)?;
    request.tag.retain(|t| t.key != KUBE_PROXY);
    request.tag.push(Tag {
        key: KUBE_PROXY.to_owned(),
        value: enabled.to_string(),
    });
    Ok(())
}

/// Bit/s from a quantity (`10M`), as the bandwidth plugin reads it.
fn bandwidth(value: &str) -> Result<i64, String> {
    let bits = quantity::parse(value).map_err(|e| e.to_string())?;
    if !(1.0..=1e15).contains(&bits) {
        return Err(format!("{value:?} is not a bandwidth"));
    }
    // Bounded above.
    #[allow(clippy::cast_possible_truncation)]
    let whole = bits.round() as i64;
    Ok(whole)
}

/// `eci-use-specs`: the first `vCPU-memory` pair sets the group size (and must fit the
/// containers); ECS types are passed as `InstanceType` when no pair is given.
fn use_specs(specs: &str, request: &mut CreateContainerGroupRequest) -> Result<(), String> {
    let mut types = Vec::new();
    for entry in list(specs) {
        if entry.starts_with("ecs.") {
            types.push(entry.to_owned());
            continue;
        }
        let (cpu, memory) = entry.split_once('-').ok_or_else(|| {
            format!(
                "{entry:?} is neither a vCPU-memory pair (2-4Gi) nor an ECS type (ecs.c6.large)"
            )
        })?;
        let cpu: f64 = cpu
            .parse()
            .map_err(|_| format!("{entry:?}: {cpu:?} is not a number of vCPUs"))?;
        let memory = quantity::parse(memory).map_err(|e| e.to_string())?;
        let memory = if memory < 1024.0 {
            memory
        } else {
            quantity::gib(memory)
        };
        // "NaN", "inf" and "0" parse as numbers; no instance has such a size.
        if !(cpu.is_finite() && cpu > 0.0 && memory.is_finite() && memory > 0.0) {
            return Err(format!(
                "{entry:?}: vCPUs and memory must be positive numbers"
            ));
        }
        if request.cpu.is_none() {
            let need_cpu: f64 = request.container.iter().filter_map(|c| c.cpu).sum();
            let need_memory: f64 = request.container.iter().filter_map(|c| c.memory).sum();
            if need_cpu > cpu + 1e-9 || need_memory > memory + 1e-9 {
                return Err(format!(
                    "{entry} is smaller than the containers need ({need_cpu} vCPU, {need_memory} GiB)"
                ));
            }
            request.cpu = Some(cpu);
            request.memory = Some(memory);
        }
    }
    if request.cpu.is_none() && !types.is_empty() {
        request.instance_type = types.join(",");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
