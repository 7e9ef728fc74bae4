//! Answers in the service's shapes (pure): the contract's response messages are encoded with
//! `PascalCase` names, then reshaped where the service's answer differs from the request's
//! names the contract keeps — names from the official SDK's response models (the name table in
//! `eci_proto::openapi::documented`, which the tests hold every answer to).
//!
//! DescribeContainerGroups: volume members flat (`NFSVolumeServer`,
//! `ConfigFileVolumeConfigFileToPaths`), env references under `ValueFrom`, plural lists
//! (`NameServers`, `Searches`, `Options`, `Hostnames`, `Execs`, `Adds`, `Sysctls`), the group's
//! security context as `EciSecurityContext`, and `Command` (not `Commands`) for init
//! containers, which also carry no probes, `Stdin`/`Tty` or sub-paths. Metrics: `CPU`.

use serde_json::{Map, Value};

use super::wire;

/// Volume kinds whose members the answer flattens, with the prefix it uses.
const VOLUME_KINDS: &[(&str, &str)] = &[
    ("NfsVolume", "NFSVolume"),
    ("EmptyDirVolume", "EmptyDirVolume"),
    ("DiskVolume", "DiskVolume"),
    ("FlexVolume", "FlexVolume"),
    ("ConfigFileVolume", "ConfigFileVolume"),
    // The answer has no host path members: dropped below.
    ("HostPathVolume", ""),
];

fn object(value: &mut Value) -> Option<&mut Map<String, Value>> {
    value.as_object_mut()
}

fn objects<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    parent
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn rename(parent: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(value) = parent.remove(from) {
        parent.insert(to.to_owned(), value);
    }
}

fn flatten_volume(volume: &mut Map<String, Value>) {
    for (nested, prefix) in VOLUME_KINDS {
        let Some(Value::Object(members)) = volume.remove(*nested) else {
            continue;
        };
        if prefix.is_empty() {
            continue;
        }
        for (member, value) in members {
            let member = match member.as_str() {
                "ConfigFileToPath" => "ConfigFileToPaths".to_owned(),
                // File modes and the disk size are create parameters the answer leaves out.
                "DefaultMode" | "DiskSize" => continue,
                _ => member,
            };
            if let Value::Array(files) = &value {
                let files: Vec<Value> = files
                    .iter()
                    .cloned()
                    .map(|mut file| {
                        if let Some(file) = file.as_object_mut() {
                            file.remove("Mode");
                        }
                        file
                    })
                    .collect();
                volume.insert(format!("{prefix}{member}"), Value::Array(files));
            } else {
                volume.insert(format!("{prefix}{member}"), value);
            }
        }
    }
}

fn probe(container: &mut Map<String, Value>, key: &str) {
    let Some(probe) = container.get_mut(key).and_then(object) else {
        return;
    };
    if let Some(Value::Object(mut exec)) = probe.remove("Exec") {
        if let Some(command) = exec.remove("Command") {
            probe.insert("Execs".to_owned(), command);
        }
    }
    if let Some(get) = probe.get_mut("HttpGet").and_then(object) {
        get.remove("Host");
        get.remove("HttpHeader");
    }
}

fn container(container: &mut Map<String, Value>, init: bool) {
    for env in objects(container, "EnvironmentVars") {
        if let Some(field_ref) = env.remove("FieldRef") {
            env.insert(
                "ValueFrom".to_owned(),
                serde_json::json!({ "FieldRef": field_ref }),
            );
        }
    }
    if let Some(capability) = container
        .get_mut("SecurityContext")
        .and_then(object)
        .and_then(|context| context.get_mut("Capability"))
        .and_then(object)
    {
        rename(capability, "Add", "Adds");
    }
    // Reported by DescribeContainerGroupStatus only.
    container.remove("Started");
    container.remove("ContainerId");
    if init {
        rename(container, "Commands", "Command");
        for key in [
            "ReadinessProbe",
            "LivenessProbe",
            "Stdin",
            "StdinOnce",
            "Tty",
        ] {
            container.remove(key);
        }
        for mount in objects(container, "VolumeMounts") {
            mount.remove("SubPath");
        }
    } else {
        probe(container, "ReadinessProbe");
        probe(container, "LivenessProbe");
    }
}

fn group(group: &mut Map<String, Value>) {
    for volume in objects(group, "Volumes") {
        flatten_volume(volume);
    }
    for entry in objects(group, "Containers") {
        container(entry, false);
    }
    for entry in objects(group, "InitContainers") {
        container(entry, true);
    }
    if let Some(dns) = group.get_mut("DnsConfig").and_then(object) {
        rename(dns, "NameServer", "NameServers");
        rename(dns, "Search", "Searches");
        rename(dns, "Option", "Options");
    }
    for alias in objects(group, "HostAliases") {
        rename(alias, "Hostname", "Hostnames");
    }
    if let Some(context) = group.get_mut("EciSecurityContext").and_then(object) {
        rename(context, "Sysctl", "Sysctls");
    }
}

/// DescribeContainerGroups as the service answers it.
pub fn describe_container_groups<T: serde::Serialize>(response: &T) -> Value {
    let mut body = wire::encode(response);
    if let Some(body) = body.as_object_mut() {
        for entry in objects(body, "ContainerGroups") {
            group(entry);
        }
    }
    body
}

/// `Cpu` → `CPU` in a metric record and its containers.
fn record(record: &mut Map<String, Value>) {
    rename(record, "Cpu", "CPU");
    for entry in objects(record, "Containers") {
        rename(entry, "Cpu", "CPU");
    }
}

/// DescribeContainerGroupMetric as the service answers it.
pub fn describe_container_group_metric<T: serde::Serialize>(response: &T) -> Value {
    let mut body = wire::encode(response);
    if let Some(body) = body.as_object_mut() {
        objects(body, "Records").for_each(record);
    }
    body
}

/// DescribeMultiContainerGroupMetric as the service answers it (its filesystem entries carry
/// no `Category`).
pub fn describe_multi_container_group_metric<T: serde::Serialize>(response: &T) -> Value {
    let mut body = wire::encode(response);
    if let Some(body) = body.as_object_mut() {
        for data in objects(body, "MonitorDatas") {
            for entry in objects(data, "Records") {
                record(entry);
                objects(entry, "Filesystem").for_each(|fs| {
                    fs.remove("Category");
                });
            }
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use eci_proto::openapi::documented;
    use eci_proto::v20180808::{
        Capability, ConfigFileToPath, ConfigFileVolume, Container, ContainerSecurityContext,
        CreateContainerGroupRequest, DescribeContainerGroupMetricRequest,
        DescribeContainerGroupsRequest, DescribeMultiContainerGroupMetricRequest, DnsConfig,
        DnsOption, EmptyDirVolume, EnvironmentVar, ExecAction, FieldRef, HostAliase, HttpGetAction,
        NfsVolume, PodSecurityContext, Port, Probe, Sysctl, Tag, TcpSocketAction, Volume,
        VolumeMount,
    };

    use super::*;
    use crate::engine::Engine;
    use crate::settings::Settings;

    /// Every path of `value` (list elements as `[]`), containers and leaves alike.
    fn paths(value: &Value, path: &str, out: &mut Vec<String>) {
        match value {
            Value::Object(members) => {
                for (key, member) in members {
                    let child = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    out.push(child.clone());
                    paths(member, &child, out);
                }
            }
            Value::Array(items) => {
                for item in items {
                    paths(item, &format!("{path}[]"), out);
                }
            }
            _ => {}
        }
    }

    fn undocumented(action: &str, body: &Value) -> Vec<String> {
        let mut all = Vec::new();
        paths(body, "", &mut all);
        all.sort();
        all.dedup();
        all.into_iter()
            .filter(|path| documented::response_field(action, path).is_none())
            .collect()
    }

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: "registry.example.com/app:1".into(),
            cpu: Some(0.5),
            memory: Some(1.0),
            command: vec!["/app".into()],
            arg: vec!["--v".into()],
            working_dir: "/srv".into(),
            image_pull_policy: "IfNotPresent".into(),
            environment_var: vec![
                EnvironmentVar {
                    key: "A".into(),
                    value: "1".into(),
                    field_ref: None,
                },
                EnvironmentVar {
                    key: "IP".into(),
                    value: String::new(),
                    field_ref: Some(FieldRef {
                        field_path: "status.podIP".into(),
                    }),
                },
            ],
            port: vec![Port {
                port: 8080,
                protocol: "TCP".into(),
            }],
            volume_mount: vec![VolumeMount {
                name: "cache".into(),
                mount_path: "/cache".into(),
                sub_path: "a".into(),
                read_only: true,
                mount_propagation: "None".into(),
            }],
            readiness_probe: Some(Probe {
                http_get: Some(HttpGetAction {
                    path: "/ready".into(),
                    port: 8080,
                    scheme: "HTTP".into(),
                    ..HttpGetAction::default()
                }),
                period_seconds: 5,
                ..Probe::default()
            }),
            liveness_probe: Some(Probe {
                exec: Some(ExecAction {
                    command: vec!["true".into()],
                }),
                ..Probe::default()
            }),
            security_context: Some(ContainerSecurityContext {
                capability: Some(Capability {
                    add: vec!["NET_ADMIN".into()],
                }),
                read_only_root_filesystem: true,
                run_as_user: Some(1000),
            }),
            stdin: true,
            tty: true,
            ..Container::default()
        }
    }

    /// A group using every part of the answer the fake fills in.
    fn rich_request() -> CreateContainerGroupRequest {
        let mut init = container("init");
        init.readiness_probe = None;
        init.liveness_probe = None;
        (init.stdin, init.tty) = (false, false);
        let mut tcp = container("tcp");
        tcp.readiness_probe = Some(Probe {
            tcp_socket: Some(TcpSocketAction {
                port: 8080,
                host: String::new(),
            }),
            ..Probe::default()
        });
        CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg-1".into(),
            v_switch_id: "vsw-1".into(),
            container_group_name: "shop-web-0".into(),
            tag: vec![Tag {
                key: "k".into(),
                value: "v".into(),
            }],
            container: vec![container("app"), tcp],
            init_container: vec![init],
            volume: vec![
                Volume {
                    name: "cache".into(),
                    r#type: "EmptyDirVolume".into(),
                    empty_dir_volume: Some(EmptyDirVolume {
                        medium: "Memory".into(),
                        size_limit: "1Gi".into(),
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: "nas".into(),
                    r#type: "NFSVolume".into(),
                    nfs_volume: Some(NfsVolume {
                        server: "nas.example".into(),
                        path: "/share".into(),
                        read_only: true,
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: "conf".into(),
                    r#type: "ConfigFileVolume".into(),
                    config_file_volume: Some(ConfigFileVolume {
                        config_file_to_path: vec![ConfigFileToPath {
                            path: "a.conf".into(),
                            content: "YQ==".into(),
                            mode: Some(0o600),
                        }],
                        default_mode: Some(0o644),
                    }),
                    ..Volume::default()
                },
            ],
            dns_config: Some(DnsConfig {
                name_server: vec!["10.96.0.10".into()],
                search: vec!["svc.cluster.local".into()],
                option: vec![DnsOption {
                    name: "ndots".into(),
                    value: "5".into(),
                }],
            }),
            dns_policy: "None".into(),
            host_name: "web-0".into(),
            host_aliase: vec![HostAliase {
                ip: "10.0.0.1".into(),
                hostname: vec!["db".into()],
            }],
            security_context: Some(PodSecurityContext {
                sysctl: vec![Sysctl {
                    name: "net.ipv4.tcp_syncookies".into(),
                    value: "1".into(),
                }],
            }),
            ephemeral_storage: Some(20),
            ..CreateContainerGroupRequest::default()
        }
    }

    #[test]
    fn every_answer_uses_the_services_names_only() {
        let mut engine = Engine::new(Settings::default());
        let id = engine.create(rich_request(), 0).unwrap();
        let later = 120_000;
        let groups = engine
            .describe_groups(
                &DescribeContainerGroupsRequest {
                    region_id: "cn-hangzhou".into(),
                    with_event: true,
                    ..DescribeContainerGroupsRequest::default()
                },
                later,
            )
            .unwrap();
        let body = describe_container_groups(&groups);
        assert_eq!(
            undocumented("DescribeContainerGroups", &body),
            Vec::<String>::new()
        );
        let group = &body["ContainerGroups"][0];
        assert_eq!(group["Status"], "Running", "{group}");
        assert_eq!(group["Volumes"][1]["NFSVolumeServer"], "nas.example");
        assert_eq!(
            group["Containers"][0]["EnvironmentVars"][1]["ValueFrom"]["FieldRef"]["FieldPath"],
            "status.podIP"
        );
        assert_eq!(group["Containers"][0]["LivenessProbe"]["Execs"][0], "true");
        assert_eq!(group["InitContainers"][0]["Command"][0], "/app");
        assert_eq!(group["DnsConfig"]["NameServers"][0], "10.96.0.10");
        assert_eq!(group["HostAliases"][0]["Hostnames"][0], "db");
        assert_eq!(
            group["EciSecurityContext"]["Sysctls"][0]["Name"],
            "net.ipv4.tcp_syncookies"
        );
        assert_eq!(
            group["Containers"][0]["SecurityContext"]["Capability"]["Adds"][0],
            "NET_ADMIN"
        );

        let metric = engine
            .metric(
                &DescribeContainerGroupMetricRequest {
                    region_id: "cn-hangzhou".into(),
                    container_group_id: id.clone(),
                    ..DescribeContainerGroupMetricRequest::default()
                },
                later,
            )
            .unwrap();
        let body = describe_container_group_metric(&metric);
        assert_eq!(
            undocumented("DescribeContainerGroupMetric", &body),
            Vec::<String>::new()
        );
        assert!(body["Records"][0]["CPU"].is_object(), "{body}");
        assert!(
            body["Records"][0]["Filesystem"][0]["Usage"].is_number(),
            "{body}"
        );

        let multi = engine
            .multi_metric(
                &DescribeMultiContainerGroupMetricRequest {
                    region_id: "cn-hangzhou".into(),
                    container_group_ids: vec![id],
                    metric_type: "all".into(),
                    ..DescribeMultiContainerGroupMetricRequest::default()
                },
                later,
            )
            .unwrap();
        let body = describe_multi_container_group_metric(&multi);
        assert_eq!(
            undocumented("DescribeMultiContainerGroupMetric", &body),
            Vec::<String>::new()
        );
        assert!(
            body["MonitorDatas"][0]["Records"][0]["Containers"][0]["CPU"].is_object(),
            "{body}"
        );
    }

    #[test]
    fn a_name_of_our_own_is_caught() {
        // What the fake answered before it followed the SDK: each is reported.
        let ours = serde_json::json!({"Records": [{"Cpu": {}, "Filesystem": [{"UsageBytes": 1}]}]});
        assert_eq!(
            undocumented("DescribeContainerGroupMetric", &ours),
            ["Records[].Cpu", "Records[].Filesystem[].UsageBytes"]
        );
    }
}
