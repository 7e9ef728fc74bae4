//! OpenAPI JSON responses → the contract's types (pure).
//!
//! Most responses are the contract's messages with `PascalCase` names; they are renamed and
//! deserialised, ignoring members the contract does not carry. DescribeContainerGroups answers
//! in shapes of its own, brought to the contract's first ([`reshape_group`]); every member read
//! is one the service's SDK defines (tested in `provider/tests/openapi_names.rs`). `DescribeContainerGroupStatus`
//! is different: the service answers with a Kubernetes-style `PodStatus` per group and no tags
//! or events, so [`StatusPage`] keeps only what identifies a group and its phase, and the client
//! completes the groups with `DescribeContainerGroups`.

use eci_proto::EciError;
use eci_proto::openapi::naming::{rename_keys, to_snake};
use eci_proto::v20180808::{ContainerGroup, ContainerGroupStatus};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Code of a response the client cannot read (a proxy's page, a changed API).
pub const INVALID_RESPONSE: &str = "SDK.InvalidResponse";

/// A successful response body as the contract's `T`. DescribeContainerGroups answers in
/// shapes of its own (see [`reshape_group`]); they are brought to the contract's first.
pub fn parse<T: DeserializeOwned>(action: &str, mut body: Value) -> Result<T, EciError> {
    let request_id = request_id(&body);
    if action == "DescribeContainerGroups" {
        if let Some(groups) = body
            .get_mut("ContainerGroups")
            .and_then(Value::as_array_mut)
        {
            groups.iter_mut().for_each(reshape_group);
        }
    }
    serde_json::from_value(rename_keys(body, &to_snake)).map_err(|error| {
        EciError::new(
            INVALID_RESPONSE,
            format!("{action}: the response does not have the documented shape: {error}"),
        )
        .with_request_id(request_id)
    })
}

/// Moves member `from` of `object` to `to` (when present).
fn rename(object: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(value) = object.remove(from) {
        object.insert(to.to_owned(), value);
    }
}

/// The objects of array member `key`.
fn each<'a>(
    object: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    object
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Volume kinds whose members the answer flattens (`NFSVolumeServer`): each is the prefix of
/// its flat members and the name of the request's nested object (`NFSVolume.Server`).
const FLAT_VOLUME_MEMBERS: &[&str] = &[
    "NFSVolume",
    "EmptyDirVolume",
    "DiskVolume",
    "FlexVolume",
    "ConfigFileVolume",
];

fn reshape_volume(volume: &mut Map<String, Value>) {
    for prefix in FLAT_VOLUME_MEMBERS {
        let flat: Vec<String> = volume
            .keys()
            .filter(|k| k.len() > prefix.len() && k.starts_with(prefix))
            .cloned()
            .collect();
        for key in flat {
            let Some(value) = volume.remove(&key) else {
                continue;
            };
            let member = match &key[prefix.len()..] {
                // `ConfigFileVolumeConfigFileToPaths[]` → `ConfigFileToPath[]`.
                "ConfigFileToPaths" => "ConfigFileToPath",
                other => other,
            };
            let nested = volume
                .entry((*prefix).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(nested) = nested.as_object_mut() {
                nested.insert(member.to_owned(), value);
            }
        }
    }
}

/// A probe of an answer: `Execs[]` is the request's `Exec.Command[]`.
fn reshape_probe(probe: &mut Map<String, Value>) {
    if let Some(command) = probe.remove("Execs") {
        probe.insert("Exec".to_owned(), serde_json::json!({ "Command": command }));
    }
}

fn reshape_container(container: &mut Map<String, Value>) {
    // Init containers answer `Command[]`, containers `Commands[]`.
    rename(container, "Command", "Commands");
    for env in each(container, "EnvironmentVars") {
        if let Some(Value::Object(mut from)) = env.remove("ValueFrom") {
            if let Some(field_ref) = from.remove("FieldRef") {
                env.insert("FieldRef".to_owned(), field_ref);
            }
        }
    }
    for key in ["ReadinessProbe", "LivenessProbe"] {
        if let Some(probe) = container.get_mut(key).and_then(Value::as_object_mut) {
            reshape_probe(probe);
        }
    }
    if let Some(capability) = container
        .get_mut("SecurityContext")
        .and_then(Value::as_object_mut)
        .and_then(|c| c.get_mut("Capability"))
        .and_then(Value::as_object_mut)
    {
        rename(capability, "Adds", "Add");
    }
}

/// One `ContainerGroups[]` entry of DescribeContainerGroups in the contract's shape: the answer
/// flattens volume members (`NFSVolumeServer`), nests env references (`ValueFrom.FieldRef`),
/// pluralises lists (`NameServers`, `Hostnames`, `Execs`, `Adds`, `Sysctls`) and spells the init
/// containers' command `Command`; the contract keeps the request's names for all of them.
pub fn reshape_group(group: &mut Value) {
    let Some(group) = group.as_object_mut() else {
        return;
    };
    for volume in each(group, "Volumes") {
        reshape_volume(volume);
    }
    for key in ["Containers", "InitContainers"] {
        for container in each(group, key) {
            reshape_container(container);
        }
    }
    if let Some(dns) = group.get_mut("DnsConfig").and_then(Value::as_object_mut) {
        rename(dns, "NameServers", "NameServer");
        rename(dns, "Searches", "Search");
        rename(dns, "Options", "Option");
    }
    for alias in each(group, "HostAliases") {
        rename(alias, "Hostnames", "Hostname");
    }
    if let Some(context) = group
        .get_mut("EciSecurityContext")
        .and_then(Value::as_object_mut)
    {
        rename(context, "Sysctls", "Sysctl");
    }
}

/// The `RequestId` of any response body.
pub fn request_id(body: &Value) -> String {
    body.get("RequestId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// One page of the service's `DescribeContainerGroupStatus` answer.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct StatusPage {
    /// The request id.
    pub request_id: String,
    /// The groups whose status is reported.
    pub data: Vec<StatusEntry>,
    /// Empty on the last page.
    pub next_token: String,
    /// Groups matching the filter.
    pub total_count: i32,
}

/// One group in a [`StatusPage`].
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct StatusEntry {
    /// The ECI id.
    pub container_group_id: String,
    /// The group name.
    pub name: String,
    /// The group status (`Running`, `Succeeded`, ...).
    pub status: String,
    /// The Kubernetes-style status.
    pub pod_status: Option<PodStatusEntry>,
}

/// The part of a `PodStatus` the client keeps.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct PodStatusEntry {
    /// The group's IP.
    pub pod_ip: String,
    /// When the group started.
    pub start_time: String,
}

impl StatusPage {
    /// Reads a `DescribeContainerGroupStatus` body.
    pub fn parse(body: Value) -> Result<Self, EciError> {
        let request_id = request_id(&body);
        // Dropping nulls first: the service sends them for absent members.
        serde_json::from_value(rename_keys(body, &str::to_owned)).map_err(|error| {
            EciError::new(
                INVALID_RESPONSE,
                format!(
                    "DescribeContainerGroupStatus: the response does not have the documented shape: {error}"
                ),
            )
            .with_request_id(request_id)
        })
    }
}

impl StatusEntry {
    /// What is known of the group from this entry alone (no tags, containers or events).
    pub fn into_status(self) -> ContainerGroupStatus {
        let pod = self.pod_status.unwrap_or_default();
        ContainerGroupStatus {
            container_group_id: self.container_group_id,
            container_group_name: self.name,
            status: self.status,
            intranet_ip: pod.pod_ip,
            creation_time: pod.start_time,
            ..ContainerGroupStatus::default()
        }
    }
}

/// A full group as a status record.
pub fn group_status(group: ContainerGroup) -> ContainerGroupStatus {
    ContainerGroupStatus {
        container_group_id: group.container_group_id,
        container_group_name: group.container_group_name,
        status: group.status,
        intranet_ip: group.intranet_ip,
        creation_time: group.creation_time,
        succeeded_time: group.succeeded_time,
        failed_time: group.failed_time,
        tags: group.tags,
        containers: group.containers,
        init_containers: group.init_containers,
        events: group.events,
        status_change_time: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{CreateContainerGroupResponse, DescribeContainerGroupsResponse};
    use serde_json::json;

    use super::*;

    /// The shape the service documents for DescribeContainerGroups, members it has and the
    /// contract does not (and nulls) included.
    fn recorded_describe_groups() -> Value {
        json!({
            "RequestId": "89945DD3-9072-47D0-A318-353284CFC7B3",
            "NextToken": "",
            "TotalCount": 1,
            "ContainerGroups": [{
                "ContainerGroupId": "eci-bp1dvysdafbh00t7****",
                "ContainerGroupName": "default-web-0",
                "RegionId": "cn-hangzhou",
                "ZoneId": "cn-hangzhou-k",
                "VSwitchId": "vsw-bp1vzjkp2q1xgnind****",
                "SecurityGroupId": "sg-bp12ujq5zp12ykj8****",
                "Status": "Running",
                "IntranetIp": "172.16.0.1",
                "InternetIp": null,
                "CreationTime": "2026-11-21T08:00:00Z",
                "SucceededTime": "",
                "RestartPolicy": "Always",
                "InstanceType": "ecs.c6.large",
                "Cpu": 2.0,
                "Memory": 4.0,
                "ComputeCategory": "economy",
                "Discount": 1.0,
                "Tags": [{"Key": "k8s.aliyun.com/pod-uid", "Value": "u-1"}],
                "Events": [{
                    "Count": 1, "Type": "Normal", "Name": "pod.default-web-0",
                    "Reason": "Started", "Message": "Started container app",
                    "FirstTimestamp": "2026-11-21T08:00:03Z", "LastTimestamp": "2026-11-21T08:00:03Z"
                }],
                "Volumes": [{"Type": "NFSVolume", "Name": "shared", "NFSVolumeServer": "nas", "NFSVolumePath": "/"}],
                "DnsConfig": {"NameServers": ["10.0.0.10"], "Searches": [], "Options": []},
                "Containers": [{
                    "Name": "app",
                    "Image": "nginx:1.27",
                    "Cpu": 1.0,
                    "Memory": 2.0,
                    "Gpu": 0,
                    "Ready": true,
                    "RestartCount": 2,
                    "Commands": ["sh"],
                    "Args": [],
                    "EnvironmentVars": [{"Key": "A", "Value": "1", "ValueFrom": {"FieldRef": {"FieldPath": "status.podIP"}}}],
                    "CurrentState": {"State": "Running", "DetailStatus": "", "StartTime": "2026-11-21T08:00:03Z", "ExitCode": null},
                    "PreviousState": {"State": "Terminated", "Reason": "Error", "ExitCode": 137, "Signal": 9,
                        "StartTime": "2026-11-21T07:59:00Z", "FinishTime": "2026-11-21T07:59:30Z"}
                }],
                "InitContainers": []
            }]
        })
    }

    #[test]
    fn recorded_describe_groups_parses() {
        let page: DescribeContainerGroupsResponse =
            parse("DescribeContainerGroups", recorded_describe_groups()).unwrap();
        assert_eq!(page.request_id, "89945DD3-9072-47D0-A318-353284CFC7B3");
        assert_eq!(page.total_count, 1);
        let group = &page.container_groups[0];
        assert_eq!(group.container_group_id, "eci-bp1dvysdafbh00t7****");
        assert_eq!(group.v_switch_id, "vsw-bp1vzjkp2q1xgnind****");
        assert_eq!(group.intranet_ip, "172.16.0.1");
        assert_eq!(group.internet_ip, "");
        assert_eq!(group.tags[0].value, "u-1");
        assert_eq!(group.events[0].reason, "Started");
        let app = &group.containers[0];
        assert!(app.ready);
        assert_eq!(app.restart_count, 2);
        let current = app.current_state.as_ref().unwrap();
        assert_eq!(current.state, "Running");
        assert_eq!(current.exit_code, None);
        let previous = app.previous_state.as_ref().unwrap();
        assert_eq!(previous.exit_code, Some(137));
        assert_eq!(previous.signal, Some(9));
        assert_eq!(previous.finish_time, "2026-11-21T07:59:30Z");

        let status = group_status(page.container_groups[0].clone());
        assert_eq!(status.tags, group.tags);
        assert_eq!(status.containers, group.containers);
    }

    #[test]
    fn recorded_status_page_parses() {
        let body = json!({
            "RequestId": "1340C38D-6189-54D1-86F6-7D5ECF3E0088",
            "NextToken": "d78f2dd8-5979-42fe-****-b16db43be5bc",
            "TotalCount": 1,
            "Data": [{
                "ContainerGroupId": "eci-bp1jrgfqqy54kg5hc****",
                "Name": "nginx",
                "Namespace": "default",
                "uuid": "0f6fcc6b-1c10-4a86-b1a5-3d8c5d8b1d28",
                "Annotations": "{}",
                "Status": "Running",
                "PodStatus": {
                    "Phase": "Running",
                    "PodIp": "192.168.1.10",
                    "PodIps": [{"Ip": "192.168.1.10"}],
                    "HostIp": "192.168.1.10",
                    "QosClass": "Guaranteed",
                    "StartTime": "2026-11-21T08:00:00Z",
                    "Conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T08:00:05Z"}],
                    "ContainerStatuses": [{"Name": "nginx", "Ready": true, "RestartCount": 0,
                        "State": {"Running": {"StartedAtstartedAt": "2026-11-21T08:00:03Z"}}}]
                }
            }]
        });
        let page = StatusPage::parse(body).unwrap();
        assert_eq!(page.next_token, "d78f2dd8-5979-42fe-****-b16db43be5bc");
        let status = page.data.into_iter().next().unwrap().into_status();
        assert_eq!(status.container_group_id, "eci-bp1jrgfqqy54kg5hc****");
        assert_eq!(status.status, "Running");
        assert_eq!(status.intranet_ip, "192.168.1.10");
    }

    #[test]
    fn a_foreign_body_is_a_clear_error_with_the_request_id() {
        let error = parse::<CreateContainerGroupResponse>(
            "CreateContainerGroup",
            json!({"RequestId": "R-1", "ContainerGroupId": 42}),
        )
        .unwrap_err();
        assert_eq!(error.code, INVALID_RESPONSE);
        assert_eq!(error.request_id, "R-1");
        assert!(error.message.contains("CreateContainerGroup"), "{error}");
    }
}
