//! The OpenAPI wire format, as the fake reads and writes it (pure).
//!
//! Requests: flat `Container.1.EnvironmentVar.2.Key` parameters become the contract's request
//! messages through a generic path translation (`container[1][environment_var][2][key]`) and
//! `serde_qs`, so the fake shares no mapping code with the daemon's client: a parameter the
//! client names wrongly is reported back as unknown. Responses: the contract's messages with
//! `PascalCase` names, except DescribeContainerGroupStatus, which answers in the service's
//! Kubernetes-style shape.

use eci_proto::openapi::naming::{rename_keys, to_pascal, to_snake};
use eci_proto::v20180808::{ContainerGroupStatus, DescribeContainerGroupStatusResponse};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Parameters every request carries; they are not part of an action's message.
pub const COMMON: &[&str] = &[
    "Action",
    "Version",
    "Format",
    "AccessKeyId",
    "SignatureMethod",
    "SignatureVersion",
    "SignatureNonce",
    "Timestamp",
    "Signature",
    "SecurityToken",
    // The official SDKs send it on every call (the Go SDK empty, the generated ones
    // `SignatureType` unset or empty).
    "SignatureType",
];

/// Parameters holding a JSON array of strings.
const JSON_ARRAYS: &[&str] = &["ContainerGroupIds", "Command"];

/// Lifecycle handler members the API runs together with their handler name.
const HANDLERS: &[(&str, &str)] = &[
    ("LifecyclePostStartHandler", "lifecycle_post_start_handler"),
    ("LifecyclePreStopHandler", "lifecycle_pre_stop_handler"),
];

/// `HttpGetPath` → `[http_get][path]`; `Exec` → `[exec][command]`.
fn handler_member(rest: &str) -> Option<String> {
    if rest == "Exec" {
        return Some("[exec][command]".to_owned());
    }
    for (prefix, member) in [("HttpGet", "http_get"), ("TcpSocket", "tcp_socket")] {
        if let Some(field) = rest.strip_prefix(prefix).filter(|f| !f.is_empty()) {
            return Some(format!("[{member}][{}]", to_snake(field)));
        }
    }
    None
}

/// One flat parameter name as a `serde_qs` path, or why it cannot be one.
fn qs_path(name: &str) -> Result<String, String> {
    let mut path = String::new();
    for (index, segment) in name.split('.').enumerate() {
        if segment.is_empty() {
            return Err(format!("{name}: empty segment"));
        }
        let piece = if segment.bytes().all(|b| b.is_ascii_digit()) {
            let n: usize = segment.parse().map_err(|_| format!("{name}: bad index"))?;
            if n == 0 {
                return Err(format!("{name}: lists are numbered from 1"));
            }
            n.to_string()
        } else if let Some((handler, member)) = HANDLERS
            .iter()
            .find_map(|(prefix, member)| segment.strip_prefix(prefix).map(|rest| (member, rest)))
        {
            let inner = handler_member(member)
                .ok_or_else(|| format!("{name}: unknown lifecycle handler member"))?;
            let head = if index == 0 {
                (*handler).to_owned()
            } else {
                format!("[{handler}]")
            };
            path.push_str(&head);
            path.push_str(&inner);
            continue;
        } else {
            to_snake(segment)
        };
        if index == 0 {
            path.push_str(&piece);
        } else {
            path.push('[');
            path.push_str(&piece);
            path.push(']');
        }
    }
    Ok(path)
}

/// Decodes an action's parameters (the common ones are skipped) into its request message,
/// listing those it has no member for.
pub fn decode_lenient<T: DeserializeOwned>(
    params: &[(String, String)],
) -> Result<Decoded<T>, String> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in params {
        if COMMON.contains(&name.as_str()) {
            continue;
        }
        let path = qs_path(name)?;
        if JSON_ARRAYS.contains(&name.as_str()) {
            let items: Vec<String> = serde_json::from_str(value)
                .map_err(|e| format!("{name}: not a JSON array of strings: {e}"))?;
            for (index, item) in items.iter().enumerate() {
                query.append_pair(&format!("{path}[{}]", index + 1), item);
            }
        } else {
            query.append_pair(&path, value);
        }
    }
    let query = query.finish();
    let config = serde_qs::Config::new(12, false);
    let deserializer = serde_qs::Deserializer::with_config(&config, query.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut unknown = Vec::new();
    let decoded: T = serde_ignored::deserialize(deserializer, |path| {
        unknown.push(path.to_string());
    })
    .map_err(|e| e.to_string())?;
    Ok(Decoded {
        request: decoded,
        unmodelled: unknown,
    })
}

/// A decoded request, and the parameters the contract has no member for.
#[derive(Debug)]
pub struct Decoded<T> {
    /// The request message.
    pub request: T,
    /// Parameters the contract does not carry (`owner_id`, `container.1.environment_var_hide`):
    /// the front lets through only documented ones, which the fake then ignores.
    pub unmodelled: Vec<String>,
}

/// [`decode_lenient`], refusing parameters the contract does not carry.
pub fn decode<T: DeserializeOwned>(params: &[(String, String)]) -> Result<T, String> {
    let decoded = decode_lenient(params)?;
    if decoded.unmodelled.is_empty() {
        Ok(decoded.request)
    } else {
        Err(format!(
            "unknown parameter(s): {}",
            decoded.unmodelled.join(", ")
        ))
    }
}

/// A response message as the service's JSON.
pub fn encode<T: serde::Serialize>(response: &T) -> Value {
    rename_keys(
        serde_json::to_value(response).unwrap_or_default(),
        &to_pascal,
    )
}

fn phase(status: &str) -> &'static str {
    match status {
        "Running" | "Restarting" | "Updating" | "Terminating" => "Running",
        "Succeeded" => "Succeeded",
        "Failed" | "Expired" | "ScheduleFailed" => "Failed",
        _ => "Pending",
    }
}

fn container_status(info: &eci_proto::v20180808::ContainerInfo) -> Value {
    let state = |state: Option<&eci_proto::v20180808::ContainerState>| match state {
        // The service's member name, as its SDK reads it.
        Some(s) if s.state == "Running" => json!({"Running": {"StartedAtstartedAt": s.start_time}}),
        Some(s) if s.state == "Terminated" => json!({"Terminated": {
            "ExitCode": s.exit_code, "Signal": s.signal, "Reason": s.reason, "Message": s.message,
            "StartedAt": s.start_time, "FinishedAt": s.finish_time, "ContainerID": info.container_id
        }}),
        Some(s) => json!({"Waiting": {"Reason": s.reason, "Message": s.message}}),
        None => json!({}),
    };
    json!({
        "Name": info.name,
        "Image": info.image,
        "Ready": info.ready,
        "Started": info.started,
        "RestartCount": info.restart_count,
        "State": state(info.current_state.as_ref()),
        "LastState": state(info.previous_state.as_ref()),
    })
}

fn status_entry(group: &ContainerGroupStatus) -> Value {
    let namespace = group
        .tags
        .iter()
        .find(|t| t.key.ends_with("namespace"))
        .map(|t| t.value.clone())
        .unwrap_or_default();
    json!({
        "ContainerGroupId": group.container_group_id,
        "Name": group.container_group_name,
        "Namespace": namespace,
        "Status": group.status,
        "PodStatus": {
            "Phase": phase(&group.status),
            "PodIp": group.intranet_ip,
            "PodIps": if group.intranet_ip.is_empty() { json!([]) } else { json!([{"Ip": group.intranet_ip}]) },
            "HostIp": group.intranet_ip,
            "StartTime": group.creation_time,
            "ContainerStatuses": group.containers.iter().map(container_status).collect::<Vec<_>>(),
        }
    })
}

/// DescribeContainerGroupStatus in the service's own shape: a Kubernetes-style status per
/// group, without tags or events.
pub fn encode_status(response: &DescribeContainerGroupStatusResponse) -> Value {
    json!({
        "RequestId": response.request_id,
        "NextToken": response.next_token,
        "TotalCount": response.total_count,
        "Data": response.data.iter().map(status_entry).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{
        CreateContainerGroupRequest, DescribeContainerGroupsRequest, ExecContainerCommandRequest,
    };

    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn flat_parameters_become_the_request() {
        let request: CreateContainerGroupRequest = decode(&params(&[
            ("Action", "CreateContainerGroup"),
            ("RegionId", "cn-hangzhou"),
            ("VSwitchId", "vsw-1"),
            ("Cpu", "2"),
            ("Tag.1.Key", "a"),
            ("Tag.1.Value", "123"),
            ("Container.1.Name", "app"),
            ("Container.1.EnvironmentVar.10.Key", "TEN"),
            ("Container.1.EnvironmentVar.2.Key", "TWO"),
            (
                "Container.1.EnvironmentVar.2.FieldRef.FieldPath",
                "status.podIP",
            ),
            ("Container.1.SecurityContext.RunAsUser", "0"),
            ("Container.1.LifecyclePreStopHandlerExec.1", "sleep"),
            ("Container.1.LifecyclePostStartHandlerHttpGetPort", "8080"),
            ("Container.1.Tty", "true"),
            ("Volume.1.NFSVolume.Server", "nas"),
            ("Volume.2.DiskVolume.DiskId", "d-1"),
            ("Volume.2.DiskVolume.FsType", "xfs"),
            ("Volume.2.DiskVolume.DiskSize", "20"),
            ("Volume.3.FlexVolume.Driver", "alicloud/oss"),
            ("Volume.3.FlexVolume.Options", r#"{"bucket":"b"}"#),
            ("HostAliase.1.Hostname.1", "db"),
            ("TerminationGracePeriodSeconds", "0"),
        ]))
        .unwrap();
        assert_eq!(request.region_id, "cn-hangzhou");
        assert_eq!(request.v_switch_id, "vsw-1");
        assert_eq!(request.cpu, Some(2.0));
        assert_eq!(request.tag[0].value, "123");
        let app = &request.container[0];
        let keys: Vec<&str> = app.environment_var.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["TWO", "TEN"]);
        assert_eq!(
            app.environment_var[0]
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "status.podIP"
        );
        assert_eq!(app.security_context.as_ref().unwrap().run_as_user, Some(0));
        let pre_stop = app.lifecycle_pre_stop_handler.as_ref().unwrap();
        assert_eq!(pre_stop.exec.as_ref().unwrap().command, ["sleep"]);
        let post_start = app.lifecycle_post_start_handler.as_ref().unwrap();
        assert_eq!(post_start.http_get.as_ref().unwrap().port, 8080);
        assert!(app.tty);
        assert_eq!(request.volume[0].nfs_volume.as_ref().unwrap().server, "nas");
        let disk = request.volume[1].disk_volume.as_ref().unwrap();
        assert_eq!(
            (disk.disk_id.as_str(), disk.fs_type.as_str(), disk.disk_size),
            ("d-1", "xfs", 20)
        );
        let flex = request.volume[2].flex_volume.as_ref().unwrap();
        assert_eq!(
            (flex.driver.as_str(), flex.options.as_str()),
            ("alicloud/oss", r#"{"bucket":"b"}"#)
        );
        assert_eq!(request.host_aliase[0].hostname, ["db"]);
        assert_eq!(request.termination_grace_period_seconds, Some(0));
    }

    /// A value of `kind` a client could send.
    fn sample(kind: eci_proto::openapi::documented::Kind) -> &'static str {
        use eci_proto::openapi::documented::Kind;
        match kind {
            Kind::Float => "1.5",
            Kind::Bool => "true",
            Kind::JsonArray => r#"["eci-1"]"#,
            Kind::Json => "{}",
            // Digits for text too: the SDK types some numbers as text (`Period`), which the
            // contract reads as numbers.
            Kind::Int | Kind::String | Kind::Object | Kind::List => "1",
        }
    }

    /// Every documented parameter of `action` decoded at once (indexes `1`); the ones the
    /// contract has no member for.
    fn unmodelled<T: DeserializeOwned>(action: &str) -> Vec<String> {
        let params: Vec<(String, String)> =
            eci_proto::openapi::documented::request_parameters(action)
                .into_iter()
                .map(|(name, kind)| {
                    let first: Vec<&str> = name
                        .split('.')
                        .map(|segment| if segment == "N" { "1" } else { segment })
                        .collect();
                    (first.join("."), sample(kind).to_owned())
                })
                .collect();
        let refused: Vec<String> = params
            .iter()
            .filter_map(|param| {
                decode_lenient::<T>(std::slice::from_ref(param))
                    .err()
                    .map(|e| format!("{}={}: {e}", param.0, param.1))
            })
            .collect();
        assert_eq!(
            refused,
            Vec::<String>::new(),
            "{action}: documented parameters that do not decode"
        );
        let decoded = decode_lenient::<T>(&params).unwrap_or_else(|e| {
            panic!("{action}: the documented parameters together do not decode: {e}")
        });
        let mut names = decoded.unmodelled;
        names.sort();
        names
    }

    #[test]
    fn every_documented_parameter_decodes_and_the_ignored_ones_are_known() {
        use eci_proto::v20180808::{
            DeleteContainerGroupRequest, DescribeContainerGroupMetricRequest,
            DescribeContainerGroupStatusRequest, DescribeContainerLogRequest,
            DescribeMultiContainerGroupMetricRequest, RestartContainerGroupRequest,
            UpdateContainerGroupRequest,
        };
        let report = [
            (
                "CreateContainerGroup",
                unmodelled::<CreateContainerGroupRequest>("CreateContainerGroup"),
            ),
            (
                "DescribeContainerGroups",
                unmodelled::<DescribeContainerGroupsRequest>("DescribeContainerGroups"),
            ),
            (
                "DescribeContainerGroupStatus",
                unmodelled::<DescribeContainerGroupStatusRequest>("DescribeContainerGroupStatus"),
            ),
            (
                "DeleteContainerGroup",
                unmodelled::<DeleteContainerGroupRequest>("DeleteContainerGroup"),
            ),
            (
                "UpdateContainerGroup",
                unmodelled::<UpdateContainerGroupRequest>("UpdateContainerGroup"),
            ),
            (
                "RestartContainerGroup",
                unmodelled::<RestartContainerGroupRequest>("RestartContainerGroup"),
            ),
            (
                "DescribeContainerLog",
                unmodelled::<DescribeContainerLogRequest>("DescribeContainerLog"),
            ),
            (
                "ExecContainerCommand",
                unmodelled::<ExecContainerCommandRequest>("ExecContainerCommand"),
            ),
            (
                "DescribeContainerGroupMetric",
                unmodelled::<DescribeContainerGroupMetricRequest>("DescribeContainerGroupMetric"),
            ),
            (
                "DescribeMultiContainerGroupMetric",
                unmodelled::<DescribeMultiContainerGroupMetricRequest>(
                    "DescribeMultiContainerGroupMetric",
                ),
            ),
        ];
        // What the fake accepts and does not model: account routing, and features it has no
        // behaviour for (EIP bandwidth, IPv6, data caches, …). A parameter it does model
        // showing up here would mean its name and the contract's member disagree.
        const ACCOUNT: [&str; 4] = [
            "owner_account",
            "owner_id",
            "resource_owner_account",
            "resource_owner_id",
        ];
        let create_only = [
            "container.0.environment_var_hide",
            "container_resource_view",
            "cpu_architecture",
            "cpu_options_core",
            "cpu_options_numa",
            "cpu_options_threads_per_core",
            "data_cache_bucket",
            "data_cache_bursting_enabled",
            "data_cache_pl",
            "data_cache_provisioned_iops",
            "fixed_ip_retain_hour",
            "host_security_context",
            "image_accelerate_mode",
            "ipv6_gateway_bandwidth",
            "ipv6_gateway_bandwidth_enable",
            "os_type",
            "overhead_reservation_option",
        ];
        let with_account = |extra: &[&str]| {
            let mut names: Vec<String> = ACCOUNT
                .iter()
                .chain(extra)
                .map(|n| (*n).to_owned())
                .collect();
            names.sort();
            names
        };
        for (action, names) in report {
            let expected = match action {
                "CreateContainerGroup" => with_account(&create_only),
                "DescribeContainerGroups" => with_account(&["compute_category"]),
                "DescribeContainerGroupStatus" => vec!["v_switch_id".to_owned()],
                "UpdateContainerGroup" => with_account(&[
                    "acr_registry_info",
                    // The service's plural spelling for this action only.
                    "container.0.lifecycle_post_start_handler.?.http_get.?.http_headers",
                    "resource_group_id",
                ]),
                _ => with_account(&[]),
            };
            assert_eq!(
                names, expected,
                "{action}: documented parameters the fake ignores"
            );
        }
    }

    #[test]
    fn json_arrays_and_unknown_parameters() {
        let request: DescribeContainerGroupsRequest = decode(&params(&[
            ("ContainerGroupIds", r#"["eci-1","eci-2"]"#),
            ("WithEvent", "true"),
        ]))
        .unwrap();
        assert_eq!(request.container_group_ids, ["eci-1", "eci-2"]);
        assert!(request.with_event);
        let exec: ExecContainerCommandRequest = decode(&params(&[
            ("Command", r#"["sh","-c","echo hi"]"#),
            ("TTY", "true"),
        ]))
        .unwrap();
        assert_eq!(exec.command, ["sh", "-c", "echo hi"]);
        assert!(exec.tty);
        let error =
            decode::<CreateContainerGroupRequest>(&params(&[("Container.1.EnvVar.1.Key", "x")]))
                .unwrap_err();
        assert!(error.contains("env_var"), "{error}");
        let error =
            decode::<CreateContainerGroupRequest>(&params(&[("Tag.0.Key", "x")])).unwrap_err();
        assert!(error.contains("numbered from 1"), "{error}");
    }
}
