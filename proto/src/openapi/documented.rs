//! The service's own names: every request parameter and response field of the actions the
//! product uses, as the official SDK (PyPI `alibabacloud-eci20180808`) defines them.
//!
//! The table is `proto/sdk/names.tsv`, generated from the SDK by `proto/sdk/extract_names.py`
//! (`--check` fails on drift) and compiled in here. Request names are flat wire parameters with
//! list indexes written `N` (`Container.N.EnvironmentVar.N.FieldRef.FieldPath`); response names
//! are JSON paths where `X[]` is an element of the list `X` (`ContainerGroups[].Containers[]
//! .CurrentState.State`). Lifecycle handlers are the one place where the service does not nest
//! members: it runs them together with the handler's name (`LifecyclePreStopHandlerHttpGetPath`,
//! `LifecyclePostStartHandlerExec.N`); [`lifecycle_parameter`] and [`split_lifecycle`] spell
//! and read that form.
//!
//! Pure: the table is parsed once, from the binary, on first use.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// `proto/sdk/names.tsv`, as generated.
pub const TABLE: &str = include_str!("../../sdk/names.tsv");

/// The action name of the rows every request carries (signature and routing parameters).
const COMMON_ACTION: &str = "*";

/// What a name holds, as the SDK types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Text.
    String,
    /// A whole number.
    Int,
    /// A number that may have a fraction (`Cpu`, `Memory`).
    Float,
    /// A boolean.
    Bool,
    /// One parameter holding a JSON array as text (`ContainerGroupIds=["eci-1"]`).
    JsonArray,
    /// One parameter holding other JSON as text.
    Json,
    /// A JSON object (responses only).
    Object,
    /// A JSON array (responses only); its elements are named `X[]`.
    List,
}

impl Kind {
    /// The kind's name in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Int => "int",
            Self::Float => "float",
            Self::Bool => "bool",
            Self::JsonArray => "json-array",
            Self::Json => "json",
            Self::Object => "object",
            Self::List => "list",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            Self::String,
            Self::Int,
            Self::Float,
            Self::Bool,
            Self::JsonArray,
            Self::Json,
            Self::Object,
            Self::List,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }

    /// Whether `value` is a request parameter value of this kind. Booleans are accepted in
    /// any letter case: the Python SDK sends `True`/`False`, the others `true`/`false`.
    pub fn accepts_wire_value(self, value: &str) -> bool {
        match self {
            Self::String => true,
            Self::Int => value.parse::<i64>().is_ok(),
            Self::Float => value.parse::<f64>().is_ok_and(f64::is_finite),
            Self::Bool => value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false"),
            Self::JsonArray => matches!(
                serde_json::from_str::<serde_json::Value>(value),
                Ok(serde_json::Value::Array(_))
            ),
            Self::Json => serde_json::from_str::<serde_json::Value>(value).is_ok(),
            Self::Object | Self::List => false,
        }
    }
}

/// Which side of a call a name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// A parameter the caller sends.
    Request,
    /// A field of the JSON answer.
    Response,
}

impl Direction {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "request" => Some(Self::Request),
            "response" => Some(Self::Response),
            _ => None,
        }
    }
}

type Key = (&'static str, Direction, &'static str);

#[derive(Debug)]
struct Table {
    sdk: &'static str,
    actions: Vec<&'static str>,
    names: BTreeMap<Key, Kind>,
    /// Lines that did not parse (a test keeps this empty).
    malformed: Vec<&'static str>,
}

fn parse(text: &'static str) -> Table {
    let mut table = Table {
        sdk: "",
        actions: Vec::new(),
        names: BTreeMap::new(),
        malformed: Vec::new(),
    };
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix('#') {
            if let Some((_, versions)) = comment.split_once("Python SDK: ") {
                table.sdk = versions.trim();
            }
            continue;
        }
        if line == "action\tdirection\tname\tkind" {
            continue;
        }
        let fields: Vec<&'static str> = line.split('\t').collect();
        let parsed = match fields[..] {
            [action, direction, name, kind] => Direction::parse(direction)
                .zip(Kind::parse(kind))
                .map(|(direction, kind)| (action, direction, name, kind)),
            _ => None,
        };
        let Some((action, direction, name, kind)) = parsed else {
            table.malformed.push(line);
            continue;
        };
        if action != COMMON_ACTION && !table.actions.contains(&action) {
            table.actions.push(action);
        }
        table.names.insert((action, direction, name), kind);
    }
    table
}

fn table() -> &'static Table {
    static TABLE_PARSED: OnceLock<Table> = OnceLock::new();
    TABLE_PARSED.get_or_init(|| parse(TABLE))
}

/// The SDK packages the table was extracted from (`alibabacloud-eci20180808==2.1.0, …`).
pub fn sdk_version() -> &'static str {
    table().sdk
}

/// The actions in the table, in the table's order.
pub fn actions() -> &'static [&'static str] {
    &table().actions
}

/// `Container.12.Port.1.Port` → `Container.N.Port.N.Port`. Only indexes the SDK can write are
/// replaced (`1`, `2`, …): `0` or `01` stay as they are and so match no documented name.
pub fn normalise_parameter(wire_key: &str) -> String {
    wire_key
        .split('.')
        .map(|segment| {
            let index = !segment.is_empty()
                && !segment.starts_with('0')
                && segment.bytes().all(|b| b.is_ascii_digit());
            if index { "N" } else { segment }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `ContainerGroups[3].Containers[0].Name` → `ContainerGroups[].Containers[].Name`.
pub fn normalise_path(path: &str) -> String {
    let mut normalised = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(open) = rest.find('[') {
        normalised.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close) if after[..close].bytes().all(|b| b.is_ascii_digit()) => {
                normalised.push(']');
                rest = &after[close + 1..];
            }
            _ => {
                rest = after;
            }
        }
    }
    normalised.push_str(rest);
    normalised
}

/// A parameter the SDK adds to every request of signature version 1.0 (`AccessKeyId`,
/// `SignatureNonce`, `SignatureType`, …).
pub fn common_parameter(name: &str) -> Option<Kind> {
    table()
        .names
        .get(&(COMMON_ACTION, Direction::Request, name))
        .copied()
}

/// `action`'s own parameter `wire_key` (indexes as sent, e.g. `Container.2.Name`); the common
/// ones are [`common_parameter`].
pub fn request_parameter(action: &str, wire_key: &str) -> Option<Kind> {
    let key = normalise_parameter(wire_key);
    lookup(action, Direction::Request, &key)
}

/// Whether `action` documents `wire_key`, as its own parameter or a common one.
pub fn accepts_parameter(action: &str, wire_key: &str) -> bool {
    request_parameter(action, wire_key).is_some() || common_parameter(wire_key).is_some()
}

/// The field at `path` of `action`'s answer (list elements as `[]` or `[i]`).
pub fn response_field(action: &str, path: &str) -> Option<Kind> {
    lookup(action, Direction::Response, &normalise_path(path))
}

fn lookup(action: &str, direction: Direction, name: &str) -> Option<Kind> {
    let table = table();
    let action = table.actions.iter().find(|known| **known == action)?;
    let name = table
        .names
        .range((*action, direction, "")..)
        .take_while(|((a, d, _), _)| a == action && *d == direction)
        .find(|((_, _, n), _)| *n == name)?;
    Some(*name.1)
}

/// Every parameter of `action` (sorted; indexes written `N`).
pub fn request_parameters(action: &str) -> Vec<(&'static str, Kind)> {
    names(action, Direction::Request)
}

/// Every response field of `action` (sorted).
pub fn response_fields(action: &str) -> Vec<(&'static str, Kind)> {
    names(action, Direction::Response)
}

fn names(action: &str, direction: Direction) -> Vec<(&'static str, Kind)> {
    table()
        .names
        .iter()
        .filter(|((a, d, _), _)| *a == action && *d == direction)
        .map(|((_, _, name), kind)| (*name, *kind))
        .collect()
}

/// The two container lifecycle handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecyclePhase {
    /// Runs after the container starts.
    PostStart,
    /// Runs before the container stops.
    PreStop,
}

impl LifecyclePhase {
    /// The run-together prefix of the phase's members.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::PostStart => "LifecyclePostStartHandler",
            Self::PreStop => "LifecyclePreStopHandler",
        }
    }
}

/// A handler member's parameter segment: (`PreStop`, `HttpGetPath`) →
/// `LifecyclePreStopHandlerHttpGetPath`. `member` is the member's name with its action run
/// together (`Exec`, `HttpGetPort`, `HttpGetHttpHeader`, `TcpSocketPort`).
pub fn lifecycle_parameter(phase: LifecyclePhase, member: &str) -> String {
    format!("{}{member}", phase.prefix())
}

/// The inverse of [`lifecycle_parameter`] for one segment of a parameter name:
/// `LifecyclePostStartHandlerTcpSocketPort` → (`PostStart`, `TcpSocketPort`). `None` for any
/// other segment.
pub fn split_lifecycle(segment: &str) -> Option<(LifecyclePhase, &str)> {
    [LifecyclePhase::PostStart, LifecyclePhase::PreStop]
        .into_iter()
        .find_map(|phase| {
            segment
                .strip_prefix(phase.prefix())
                .filter(|member| !member.is_empty())
                .map(|member| (phase, member))
        })
}

/// Every name of `action` and `direction`, for callers that check a whole set at once.
pub fn documented(action: &str, direction: Direction) -> BTreeSet<&'static str> {
    names(action, direction)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_table_parses() {
        let table = table();
        assert!(table.malformed.is_empty(), "{:?}", table.malformed);
        assert!(
            table.sdk.starts_with("alibabacloud-eci20180808=="),
            "{}",
            table.sdk
        );
        assert_eq!(
            actions(),
            [
                "CreateContainerGroup",
                "DescribeContainerGroups",
                "DescribeContainerGroupStatus",
                "DeleteContainerGroup",
                "UpdateContainerGroup",
                "RestartContainerGroup",
                "DescribeContainerLog",
                "ExecContainerCommand",
                "DescribeContainerGroupMetric",
                "DescribeMultiContainerGroupMetric",
                "CreateImageCache",
                "DescribeImageCaches",
                "UpdateImageCache",
                "DeleteImageCache",
            ]
        );
        for action in actions() {
            assert!(!request_parameters(action).is_empty(), "{action}");
            assert!(
                response_field(action, "RequestId") == Some(Kind::String),
                "{action}"
            );
        }
    }

    #[test]
    fn request_parameters_as_sent() {
        let create = "CreateContainerGroup";
        let cases: &[(&str, &str, Option<Kind>)] = &[
            (create, "VSwitchId", Some(Kind::String)),
            (create, "Cpu", Some(Kind::Float)),
            (create, "HostName", Some(Kind::String)),
            (create, "DnsPolicy", Some(Kind::String)),
            (create, "ShareProcessNamespace", Some(Kind::Bool)),
            (create, "SecurityContext.Sysctl.1.Name", Some(Kind::String)),
            (create, "Tag.20.Value", Some(Kind::String)),
            (
                create,
                "Container.3.EnvironmentVar.12.FieldRef.FieldPath",
                Some(Kind::String),
            ),
            (
                create,
                "Container.1.SecurityContextPrivileged",
                Some(Kind::Bool),
            ),
            // Run together, like the lifecycle handlers, not nested under SecurityContext.
            (
                create,
                "Container.1.SecurityContextRunAsGroup",
                Some(Kind::Int),
            ),
            (
                create,
                "Container.1.SecurityContextRunAsNonRoot",
                Some(Kind::Bool),
            ),
            (create, "Container.1.SecurityContext.RunAsGroup", None),
            (create, "InitContainer.1.SecurityContextPrivileged", None),
            (create, "InitContainer.1.Tty", None),
            (
                create,
                "Container.1.ReadinessProbe.HttpGet.Path",
                Some(Kind::String),
            ),
            (
                create,
                "Volume.2.ConfigFileVolume.ConfigFileToPath.1.Mode",
                Some(Kind::Int),
            ),
            (create, "Volume.1.NFSVolume.Server", Some(Kind::String)),
            // Not documented: probe hosts and headers, indexes the SDK never writes,
            // names spelled in another case.
            (create, "Container.1.ReadinessProbe.HttpGet.Host", None),
            (
                create,
                "Container.1.ReadinessProbe.HttpGet.HttpHeader.1.Name",
                None,
            ),
            (create, "Container.1.ReadinessProbe.TcpSocket.Host", None),
            (create, "Container.0.Name", None),
            (create, "Container.01.Name", None),
            (create, "Container.N.Name", Some(Kind::String)),
            (create, "vSwitchId", None),
            (create, "Container.1", None),
            (
                "UpdateContainerGroup",
                "Volume.1.ConfigFileVolume.ConfigFileToPath.1.Mode",
                None,
            ),
            (
                "UpdateContainerGroup",
                "Volume.1.ConfigFileVolume.DefaultMode",
                None,
            ),
            (
                "DescribeContainerGroups",
                "ContainerGroupIds",
                Some(Kind::JsonArray),
            ),
            (
                "DescribeContainerGroups",
                "SecurityGroupId",
                Some(Kind::String),
            ),
            (
                "DescribeContainerGroupStatus",
                "SinceSecond",
                Some(Kind::Int),
            ),
            ("ExecContainerCommand", "Command", Some(Kind::JsonArray)),
            ("ExecContainerCommand", "TTY", Some(Kind::Bool)),
            ("ExecContainerCommand", "Tty", None),
            ("NoSuchAction", "RegionId", None),
            // Common parameters are not an action's own.
            (create, "SignatureNonce", None),
        ];
        for (action, key, kind) in cases {
            assert_eq!(request_parameter(action, key), *kind, "{action} {key}");
        }
    }

    #[test]
    fn common_parameters_include_what_every_sdk_sends() {
        for name in [
            "Action",
            "Version",
            "Format",
            "AccessKeyId",
            "SignatureMethod",
            "SignatureVersion",
            "SignatureNonce",
            "SignatureType",
            "Timestamp",
            "Signature",
            "SecurityToken",
        ] {
            assert_eq!(common_parameter(name), Some(Kind::String), "{name}");
            assert!(accepts_parameter("DeleteContainerGroup", name), "{name}");
        }
        assert_eq!(common_parameter("RegionId"), None);
        assert!(accepts_parameter("DeleteContainerGroup", "RegionId"));
        assert!(!accepts_parameter(
            "DeleteContainerGroup",
            "Container.1.Name"
        ));
    }

    #[test]
    fn response_fields_by_path() {
        let describe = "DescribeContainerGroups";
        let metric = "DescribeContainerGroupMetric";
        let cases: &[(&str, &str, Option<Kind>)] = &[
            (describe, "ContainerGroups", Some(Kind::List)),
            (describe, "ContainerGroups[]", Some(Kind::Object)),
            (
                describe,
                "ContainerGroups[0].Containers[1].RestartCount",
                Some(Kind::Int),
            ),
            (
                describe,
                "ContainerGroups[].Containers[].CurrentState.State",
                Some(Kind::String),
            ),
            (
                describe,
                "ContainerGroups[].DnsConfig.NameServers[]",
                Some(Kind::String),
            ),
            (
                describe,
                "ContainerGroups[].HostAliases[].Hostnames",
                Some(Kind::List),
            ),
            (
                describe,
                "ContainerGroups[].Volumes[].NFSVolumeServer",
                Some(Kind::String),
            ),
            (
                describe,
                "ContainerGroups[].Containers[].EnvironmentVars[].ValueFrom.FieldRef.FieldPath",
                Some(Kind::String),
            ),
            (describe, "ContainerGroups[].Containers[].Started", None),
            (describe, "ContainerGroups[].Containers[].ContainerID", None),
            (describe, "ContainerGroups[].DnsConfig.NameServer", None),
            (describe, "ContainerGroups[].Volumes[].NfsVolume", None),
            (metric, "Records[].CPU.UsageNanoCores", Some(Kind::Int)),
            (metric, "Records[].Cpu", None),
            (metric, "Records[].Filesystem[].Usage", Some(Kind::Int)),
            (metric, "Records[].Filesystem[].UsageBytes", None),
        ];
        for (action, path, kind) in cases {
            assert_eq!(response_field(action, path), *kind, "{action} {path}");
        }
    }

    #[test]
    fn normalising() {
        let cases = [
            ("Container.1.Port.12.Port", "Container.N.Port.N.Port"),
            ("Tag.0.Key", "Tag.0.Key"),
            ("Tag.007.Key", "Tag.007.Key"),
            ("RegionId", "RegionId"),
            (
                "Container.1.LifecyclePreStopHandlerExec.2",
                "Container.N.LifecyclePreStopHandlerExec.N",
            ),
        ];
        for (key, normalised) in cases {
            assert_eq!(normalise_parameter(key), normalised, "{key}");
        }
        let paths = [
            ("A[0].B[12].C", "A[].B[].C"),
            ("A[].B", "A[].B"),
            ("A[x].B", "A[x].B"),
            ("A[1", "A[1"),
        ];
        for (path, normalised) in paths {
            assert_eq!(normalise_path(path), normalised, "{path}");
        }
    }

    #[test]
    fn lifecycle_members_are_run_together() {
        let create = "CreateContainerGroup";
        let members = [
            ("Exec.1", Kind::String),
            ("HttpGetPath", Kind::String),
            ("HttpGetPort", Kind::Int),
            ("HttpGetScheme", Kind::String),
            ("TcpSocketPort", Kind::Int),
        ];
        for phase in [LifecyclePhase::PostStart, LifecyclePhase::PreStop] {
            for (member, kind) in members {
                let segment = lifecycle_parameter(phase, member);
                let key = format!("Container.1.{segment}");
                assert_eq!(request_parameter(create, &key), Some(kind), "{key}");
                assert_eq!(split_lifecycle(&segment), Some((phase, member)));
            }
        }
        assert_eq!(split_lifecycle("LifecyclePreStopHandler"), None);
        assert_eq!(split_lifecycle("ReadinessProbe"), None);
        // Every lifecycle parameter in the table splits into a phase and a member.
        for (name, _) in request_parameters(create) {
            for segment in name.split('.') {
                if segment.starts_with("Lifecycle") {
                    assert!(split_lifecycle(segment).is_some(), "{name}");
                }
            }
        }
    }

    #[test]
    fn wire_values_by_kind() {
        let cases = [
            (Kind::Bool, "True", true),
            (Kind::Bool, "false", true),
            (Kind::Bool, "1", false),
            (Kind::Int, "-3", true),
            (Kind::Int, "1.5", false),
            (Kind::Float, "0.25", true),
            (Kind::Float, "NaN", false),
            (Kind::JsonArray, r#"["eci-1","eci-2"]"#, true),
            (Kind::JsonArray, "eci-1", false),
            (Kind::Json, r#"{"a":1}"#, true),
            (Kind::String, "", true),
            (Kind::Object, "{}", false),
        ];
        for (kind, value, accepted) in cases {
            assert_eq!(kind.accepts_wire_value(value), accepted, "{kind:?} {value}");
        }
    }

    #[test]
    fn whole_sets() {
        let delete = documented("DeleteContainerGroup", Direction::Request);
        assert!(delete.contains("ContainerGroupId"));
        assert!(delete.contains("ClientToken"));
        // The SDK's DeleteContainerGroup has no `Force`.
        assert!(!delete.contains("Force"));
        assert_eq!(
            documented("DeleteContainerGroup", Direction::Response),
            BTreeSet::from(["RequestId"])
        );
    }
}
