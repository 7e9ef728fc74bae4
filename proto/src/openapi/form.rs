//! Requests → the OpenAPI's flat form parameters (pure): one encoder for every action, walking
//! the request as serde serialises it.
//!
//! Object members become `PascalCase` names ([`naming::to_pascal`], with the respellings in
//! [`SPELLINGS`]), nested objects are joined with dots (`Container.1.ReadinessProbe.HttpGet.Path`)
//! and lists are numbered from 1 (`Container.1.EnvironmentVar.2.Key`). Lifecycle handlers use the
//! API's run-together names (`Container.1.LifecyclePreStopHandlerExec.1`), and a list the SDK
//! types as a JSON array travels as one JSON-array string (`ContainerGroupIds=["eci-1"]`).
//! A plain member at its default (`""`, `0`, `false`) and an unset optional one are left out,
//! as the service reads absence as the default; an optional member that is set is sent, zero and
//! `false` included (`SinceSecond=0`, `Stdin=false`). Members an action takes no parameter for
//! are left out by [`LEFT_OUT`].
//!
//! Only the daemon's client encodes with this. mock-eci's OpenAPI front decodes with a path
//! translation of its own on purpose: sharing this code would read a wrongly named parameter
//! back by the same mistake, where an independent decoder reports it as unknown.

use std::fmt::Display;

use serde::Serialize;
use serde::ser::{self, Impossible};
use serde_json::Value;

use super::documented::{self, Kind, LifecyclePhase};
use super::naming;
use crate::v20180808 as eci;

/// The request message of one OpenAPI action.
pub trait Request: Serialize {
    /// The action's name, which also selects its rows of [`LEFT_OUT`] and [`SPELLINGS`].
    const ACTION: &'static str;
}

macro_rules! requests {
    ($($request:ident = $action:literal;)+) => {
        $(impl Request for eci::$request {
            const ACTION: &'static str = $action;
        })+
    };
}

requests! {
    CreateContainerGroupRequest = "CreateContainerGroup";
    DescribeContainerGroupsRequest = "DescribeContainerGroups";
    DescribeContainerGroupStatusRequest = "DescribeContainerGroupStatus";
    DeleteContainerGroupRequest = "DeleteContainerGroup";
    UpdateContainerGroupRequest = "UpdateContainerGroup";
    RestartContainerGroupRequest = "RestartContainerGroup";
    DescribeContainerLogRequest = "DescribeContainerLog";
    ExecContainerCommandRequest = "ExecContainerCommand";
    DescribeContainerGroupMetricRequest = "DescribeContainerGroupMetric";
    DescribeMultiContainerGroupMetricRequest = "DescribeMultiContainerGroupMetric";
    CreateImageCacheRequest = "CreateImageCache";
    DescribeImageCachesRequest = "DescribeImageCaches";
    UpdateImageCacheRequest = "UpdateImageCache";
    DeleteImageCacheRequest = "DeleteImageCache";
}

/// Members a request may hold that its action's parameters leave out: (action, `*` for every
/// action; the member's path in the contract, list items written `N`, a `*` within a segment
/// matching any run of characters).
const LEFT_OUT: &[(&str, &str)] = &[
    // ECI's probes take `Path`, `Port` and `Scheme` over HTTP and a `Port` over TCP: host and
    // headers are the lifecycle handlers' (the translation reports a pod that asks for them).
    ("*", "container.N.*_probe.http_get.host"),
    ("*", "container.N.*_probe.http_get.http_header"),
    ("*", "container.N.*_probe.tcp_socket.host"),
    // The service has no probes, lifecycle handlers, `Stdin`/`StdinOnce`/`Tty` or flat
    // `SecurityContext…` members for init containers.
    ("*", "init_container.N.*_probe"),
    ("*", "init_container.N.lifecycle_*"),
    ("*", "init_container.N.stdin*"),
    ("*", "init_container.N.tty"),
    ("*", "init_container.N.security_context_*"),
    // The gRPC fake's extension: the service's DeleteContainerGroup has no `Force`.
    ("DeleteContainerGroup", "force"),
    // The daemon updates volumes and tags only: containers would need this action's own
    // spellings (`…HttpGetHttpHeaders`), and the client refuses such a request before encoding.
    ("UpdateContainerGroup", "container"),
    ("UpdateContainerGroup", "init_container"),
    // UpdateContainerGroup takes no file modes.
    (
        "UpdateContainerGroup",
        "volume.N.config_file_volume.config_file_to_path.N.mode",
    ),
    (
        "UpdateContainerGroup",
        "volume.N.config_file_volume.default_mode",
    ),
    // Nor disk members: a disk is attached when the group is created and stays.
    ("UpdateContainerGroup", "volume.N.disk_volume"),
    // UpdateImageCache takes no ARNs.
    ("UpdateImageCache", "acr_registry_info.N.arn_*"),
];

/// Names the API spells otherwise than the member's `PascalCase`: (action or `*`, the member's
/// path as in [`LEFT_OUT`], the name on the wire).
const SPELLINGS: &[(&str, &str, &str)] = &[
    ("*", "volume.N.nfs_volume", "NFSVolume"),
    ("CreateContainerGroup", "eip_isp", "EipISP"),
    // Capitals here only: a container's member is `Tty`.
    ("ExecContainerCommand", "tty", "TTY"),
    // A handler's exec is one list named after the action alone (`…HandlerExec.N`).
    ("*", "container.N.lifecycle_*.exec.command", ""),
];

/// A request that has no form encoding.
#[derive(Debug, thiserror::Error)]
pub enum FormError {
    /// A shape the contract's messages never take (a map, an enum, bytes).
    #[error("{0} has no form encoding")]
    Unsupported(&'static str),
    /// The message's own serialisation failed.
    #[error("{0}")]
    Serialize(String),
}

impl ser::Error for FormError {
    fn custom<T: Display>(message: T) -> Self {
        Self::Serialize(message.to_string())
    }
}

/// `request` as its action's `Name=value` parameters (the common and signature ones are the
/// caller's).
pub fn encode<R: Request>(request: &R) -> Result<Vec<(String, String)>, FormError> {
    let Node::Object(members) = request.serialize(Capture)? else {
        return Err(FormError::Unsupported("a request that is not a message"));
    };
    let mut flatten = Flatten {
        action: R::ACTION,
        path: Vec::new(),
        params: Vec::new(),
    };
    flatten.members("", &members, false);
    Ok(flatten.params)
}

/// A request as serde presents it, before it is named and flattened.
#[derive(Debug)]
enum Node {
    /// An optional member left unset.
    Unset,
    /// A scalar's text; `set` is false for a plain member at its default, which is left out.
    Scalar {
        text: String,
        set: bool,
    },
    List(Vec<Node>),
    Object(Vec<(&'static str, Node)>),
}

/// Turns a value into a [`Node`].
struct Capture;

macro_rules! scalars {
    ($($method:ident($ty:ty),)+) => {
        $(fn $method(self, value: $ty) -> Result<Node, FormError> {
            Ok(Node::Scalar {
                text: value.to_string(),
                set: value != <$ty>::default(),
            })
        })+
    };
}

macro_rules! unsupported {
    ($($method:ident($($arg:ty),*) -> $out:ty = $what:literal;)+) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$out, FormError> {
            Err(FormError::Unsupported($what))
        })+
    };
}

impl ser::Serializer for Capture {
    type Ok = Node;
    type Error = FormError;
    type SerializeSeq = Items;
    type SerializeTuple = Impossible<Node, FormError>;
    type SerializeTupleStruct = Impossible<Node, FormError>;
    type SerializeTupleVariant = Impossible<Node, FormError>;
    type SerializeMap = Impossible<Node, FormError>;
    type SerializeStruct = Members;
    type SerializeStructVariant = Impossible<Node, FormError>;

    scalars! {
        serialize_bool(bool), serialize_char(char),
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64),
        serialize_f32(f32), serialize_f64(f64),
    }

    unsupported! {
        serialize_bytes(&[u8]) -> Node = "bytes";
        serialize_unit_variant(&'static str, u32, &'static str) -> Node = "an enum";
        serialize_tuple(usize) -> Self::SerializeTuple = "a tuple";
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct = "a tuple";
        serialize_tuple_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeTupleVariant = "an enum";
        serialize_map(Option<usize>) -> Self::SerializeMap = "a map";
        serialize_struct_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeStructVariant = "an enum";
    }

    fn serialize_str(self, value: &str) -> Result<Node, FormError> {
        Ok(Node::Scalar {
            text: value.to_owned(),
            set: !value.is_empty(),
        })
    }

    fn serialize_none(self) -> Result<Node, FormError> {
        Ok(Node::Unset)
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<Node, FormError> {
        // A set optional value is sent even at its zero: the service's default may differ.
        Ok(match value.serialize(self)? {
            Node::Scalar { text, .. } => Node::Scalar { text, set: true },
            other => other,
        })
    }

    fn serialize_unit(self) -> Result<Node, FormError> {
        Ok(Node::Unset)
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<Node, FormError> {
        Ok(Node::Unset)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Node, FormError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Node, FormError> {
        Err(FormError::Unsupported("an enum"))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Items, FormError> {
        Ok(Items(Vec::with_capacity(len.unwrap_or_default())))
    }

    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Members, FormError> {
        Ok(Members(Vec::with_capacity(len)))
    }
}

/// A list's items, as captured.
struct Items(Vec<Node>);

impl ser::SerializeSeq for Items {
    type Ok = Node;
    type Error = FormError;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), FormError> {
        self.0.push(value.serialize(Capture)?);
        Ok(())
    }

    fn end(self) -> Result<Node, FormError> {
        Ok(Node::List(self.0))
    }
}

/// A message's members, as captured.
struct Members(Vec<(&'static str, Node)>);

impl ser::SerializeStruct for Members {
    type Ok = Node;
    type Error = FormError;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), FormError> {
        self.0.push((name, value.serialize(Capture)?));
        Ok(())
    }

    fn end(self) -> Result<Node, FormError> {
        Ok(Node::Object(self.0))
    }
}

/// Writes a captured request as parameters.
struct Flatten {
    action: &'static str,
    /// The contract path of the member being written, list items as `N`.
    path: Vec<&'static str>,
    params: Vec<(String, String)>,
}

impl Flatten {
    /// `node` under the wire name `key`; `run_together`: inside a lifecycle handler, where
    /// member names are appended without a dot.
    fn node(&mut self, key: &str, node: &Node, run_together: bool) {
        match node {
            Node::Unset | Node::Scalar { set: false, .. } => {}
            Node::Scalar { text, set: true } => self.params.push((key.to_owned(), text.clone())),
            Node::List(items) => self.list(key, items),
            Node::Object(members) => self.members(key, members, run_together),
        }
    }

    fn members(&mut self, key: &str, members: &[(&'static str, Node)], run_together: bool) {
        for (field, member) in members {
            self.path.push(field);
            if !self.left_out() {
                let name = self
                    .spelling()
                    .map_or_else(|| naming::to_pascal(field), str::to_owned);
                let child = if run_together || key.is_empty() || name.is_empty() {
                    format!("{key}{name}")
                } else {
                    format!("{key}.{name}")
                };
                let handler = [LifecyclePhase::PostStart, LifecyclePhase::PreStop]
                    .iter()
                    .any(|phase| phase.prefix() == name);
                self.node(&child, member, run_together || handler);
            }
            self.path.pop();
        }
    }

    fn list(&mut self, key: &str, items: &[Node]) {
        if items.is_empty() {
            return;
        }
        if documented::request_parameter(self.action, key) == Some(Kind::JsonArray) {
            let texts = items.iter().filter_map(|item| match item {
                Node::Scalar { text, .. } => Some(Value::String(text.clone())),
                _ => None,
            });
            let array = Value::Array(texts.collect()).to_string();
            self.params.push((key.to_owned(), array));
            return;
        }
        self.path.push("N");
        for (index, item) in items.iter().enumerate() {
            let child = format!("{key}.{}", index + 1);
            match item {
                // An item is sent as it is, empty included: its position is its meaning.
                Node::Scalar { text, .. } => self.params.push((child, text.clone())),
                other => self.node(&child, other, false),
            }
        }
        self.path.pop();
    }

    fn left_out(&self) -> bool {
        LEFT_OUT
            .iter()
            .any(|(action, pattern)| self.is_current(action, pattern))
    }

    fn spelling(&self) -> Option<&'static str> {
        SPELLINGS
            .iter()
            .find(|(action, pattern, _)| self.is_current(action, pattern))
            .map(|(_, _, name)| *name)
    }

    fn is_current(&self, action: &str, pattern: &str) -> bool {
        (action == "*" || action == self.action)
            && pattern.split('.').count() == self.path.len()
            && pattern
                .split('.')
                .zip(&self.path)
                .all(|(wanted, segment)| segment_matches(wanted, segment))
    }
}

/// `wanted` is a segment or a pattern with one `*` (`*_probe`, `lifecycle_*`).
fn segment_matches(wanted: &str, segment: &str) -> bool {
    match wanted.split_once('*') {
        None => wanted == segment,
        Some((head, tail)) => {
            segment.len() >= head.len() + tail.len()
                && segment.starts_with(head)
                && segment.ends_with(tail)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::v20180808::{
        Capability, ConfigFileToPath, ConfigFileVolume, Container, ContainerSecurityContext,
        CreateContainerGroupRequest, DeleteContainerGroupRequest,
        DescribeContainerGroupStatusRequest, DescribeContainerGroupsRequest, DnsConfig,
        EnvironmentVar, ExecAction, ExecContainerCommandRequest, FieldRef, HostAliase,
        HttpGetAction, LifecycleHandler, NfsVolume, Port, Probe, Tag, TcpSocketAction,
        UpdateContainerGroupRequest, Volume, VolumeMount,
    };

    use super::*;

    fn map(params: Result<Vec<(String, String)>, FormError>) -> BTreeMap<String, String> {
        params.expect("every request encodes").into_iter().collect()
    }

    fn mk_container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: "nginx:1.27".into(),
            ..Container::default()
        }
    }

    #[test]
    fn create_flattens_every_level() {
        let mut app = mk_container("app");
        app.cpu = Some(0.5);
        app.command = vec!["sh".into(), "-c".into()];
        app.arg = vec!["echo hi".into()];
        app.environment_var = vec![
            EnvironmentVar {
                key: "A".into(),
                value: "1".into(),
                field_ref: None,
            },
            EnvironmentVar {
                key: "POD_IP".into(),
                value: String::new(),
                field_ref: Some(FieldRef {
                    field_path: "status.podIP".into(),
                }),
            },
        ];
        app.port = vec![Port {
            port: 80,
            protocol: "TCP".into(),
        }];
        app.volume_mount = vec![VolumeMount {
            name: "config".into(),
            mount_path: "/etc/app".into(),
            read_only: true,
            ..VolumeMount::default()
        }];
        app.readiness_probe = Some(Probe {
            tcp_socket: Some(TcpSocketAction {
                port: 80,
                host: String::new(),
            }),
            period_seconds: 5,
            ..Probe::default()
        });
        app.security_context = Some(ContainerSecurityContext {
            capability: Some(Capability {
                add: vec!["NET_ADMIN".into()],
            }),
            read_only_root_filesystem: true,
            run_as_user: Some(0),
        });
        app.lifecycle_pre_stop_handler = Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: vec!["sleep".into(), "5".into()],
            }),
            ..LifecycleHandler::default()
        });
        let request = CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg-1".into(),
            v_switch_id: "vsw-1,vsw-2".into(),
            container_group_name: "default-web-0".into(),
            restart_policy: "Always".into(),
            cpu: Some(2.0),
            memory: Some(4.0),
            tag: vec![Tag {
                key: "k8s.aliyun.com/pod-uid".into(),
                value: "u-1".into(),
            }],
            container: vec![app, mk_container("sidecar")],
            init_container: vec![mk_container("init")],
            volume: vec![
                Volume {
                    name: "config".into(),
                    r#type: "ConfigFileVolume".into(),
                    config_file_volume: Some(ConfigFileVolume {
                        config_file_to_path: vec![ConfigFileToPath {
                            path: "app.conf".into(),
                            content: "YQ==".into(),
                            mode: Some(0o644),
                        }],
                        default_mode: None,
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: "shared".into(),
                    r#type: "NFSVolume".into(),
                    nfs_volume: Some(NfsVolume {
                        server: "nas.example".into(),
                        path: "/share".into(),
                        read_only: false,
                    }),
                    ..Volume::default()
                },
            ],
            dns_config: Some(DnsConfig {
                name_server: vec!["10.0.0.10".into()],
                search: vec!["default.svc.cluster.local".into()],
                option: vec![],
            }),
            host_aliase: vec![HostAliase {
                ip: "10.1.1.1".into(),
                hostname: vec!["db".into(), "db.local".into()],
            }],
            client_token: "u-1".into(),
            termination_grace_period_seconds: Some(0),
            ..CreateContainerGroupRequest::default()
        };
        let params = map(encode(&request));
        let expected = [
            ("RegionId", "cn-hangzhou"),
            ("SecurityGroupId", "sg-1"),
            ("VSwitchId", "vsw-1,vsw-2"),
            ("ContainerGroupName", "default-web-0"),
            ("RestartPolicy", "Always"),
            ("Cpu", "2"),
            ("Memory", "4"),
            ("Tag.1.Key", "k8s.aliyun.com/pod-uid"),
            ("Tag.1.Value", "u-1"),
            ("Container.1.Name", "app"),
            ("Container.1.Image", "nginx:1.27"),
            ("Container.1.Cpu", "0.5"),
            ("Container.1.Command.1", "sh"),
            ("Container.1.Command.2", "-c"),
            ("Container.1.Arg.1", "echo hi"),
            ("Container.1.EnvironmentVar.1.Key", "A"),
            ("Container.1.EnvironmentVar.1.Value", "1"),
            ("Container.1.EnvironmentVar.2.Key", "POD_IP"),
            (
                "Container.1.EnvironmentVar.2.FieldRef.FieldPath",
                "status.podIP",
            ),
            ("Container.1.Port.1.Port", "80"),
            ("Container.1.Port.1.Protocol", "TCP"),
            ("Container.1.VolumeMount.1.Name", "config"),
            ("Container.1.VolumeMount.1.MountPath", "/etc/app"),
            ("Container.1.VolumeMount.1.ReadOnly", "true"),
            ("Container.1.ReadinessProbe.TcpSocket.Port", "80"),
            ("Container.1.ReadinessProbe.PeriodSeconds", "5"),
            ("Container.1.SecurityContext.Capability.Add.1", "NET_ADMIN"),
            ("Container.1.SecurityContext.ReadOnlyRootFilesystem", "true"),
            ("Container.1.SecurityContext.RunAsUser", "0"),
            ("Container.1.LifecyclePreStopHandlerExec.1", "sleep"),
            ("Container.1.LifecyclePreStopHandlerExec.2", "5"),
            ("Container.2.Name", "sidecar"),
            ("Container.2.Image", "nginx:1.27"),
            ("InitContainer.1.Name", "init"),
            ("InitContainer.1.Image", "nginx:1.27"),
            ("Volume.1.Name", "config"),
            ("Volume.1.Type", "ConfigFileVolume"),
            (
                "Volume.1.ConfigFileVolume.ConfigFileToPath.1.Path",
                "app.conf",
            ),
            (
                "Volume.1.ConfigFileVolume.ConfigFileToPath.1.Content",
                "YQ==",
            ),
            ("Volume.1.ConfigFileVolume.ConfigFileToPath.1.Mode", "420"),
            ("Volume.2.Name", "shared"),
            ("Volume.2.Type", "NFSVolume"),
            ("Volume.2.NFSVolume.Server", "nas.example"),
            ("Volume.2.NFSVolume.Path", "/share"),
            ("DnsConfig.NameServer.1", "10.0.0.10"),
            ("DnsConfig.Search.1", "default.svc.cluster.local"),
            ("HostAliase.1.Ip", "10.1.1.1"),
            ("HostAliase.1.Hostname.1", "db"),
            ("HostAliase.1.Hostname.2", "db.local"),
            ("ClientToken", "u-1"),
            ("TerminationGracePeriodSeconds", "0"),
        ];
        let expected: BTreeMap<String, String> = expected
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(params, expected);
    }

    #[test]
    fn id_lists_are_json_arrays_and_unset_values_are_left_out() {
        let params = map(encode(&DescribeContainerGroupsRequest {
            region_id: "cn-hangzhou".into(),
            container_group_ids: vec!["eci-1".into(), "eci-2".into()],
            limit: Some(20),
            with_event: true,
            ..DescribeContainerGroupsRequest::default()
        }));
        assert_eq!(params["ContainerGroupIds"], r#"["eci-1","eci-2"]"#);
        assert_eq!(params["Limit"], "20");
        assert_eq!(params["WithEvent"], "true");
        assert!(!params.contains_key("NextToken"));
        assert!(!params.contains_key("Status"));

        let params = map(encode(&ExecContainerCommandRequest {
            command: vec!["sh".into(), "-c".into(), "echo \"hi\"".into()],
            stdin: Some(false),
            sync: true,
            ..ExecContainerCommandRequest::default()
        }));
        assert_eq!(params["Command"], r#"["sh","-c","echo \"hi\""]"#);
        assert_eq!(params["Stdin"], "false");
        assert_eq!(params["Sync"], "true");
        assert!(!params.contains_key("TTY"));

        let params = map(encode(&DescribeContainerGroupStatusRequest {
            since_second: Some(0),
            ..DescribeContainerGroupStatusRequest::default()
        }));
        assert_eq!(params["SinceSecond"], "0");
    }

    #[test]
    fn delete_never_sends_force() {
        // The service's DeleteContainerGroup has no `Force`: the gRPC fake's extension stays
        // off the wire.
        let forced = DeleteContainerGroupRequest {
            region_id: "r".into(),
            container_group_id: "eci-1".into(),
            client_token: "t".into(),
            force: true,
        };
        let params = map(encode(&forced));
        assert_eq!(
            params.keys().map(String::as_str).collect::<Vec<_>>(),
            ["ClientToken", "ContainerGroupId", "RegionId"]
        );
    }

    #[test]
    fn probes_carry_no_host_or_headers_and_init_containers_no_probe_members() {
        let action = HttpGetAction {
            path: "/healthz".into(),
            port: 8080,
            scheme: "HTTP".into(),
            host: "10.0.0.9".into(),
            http_header: vec![crate::v20180808::HttpHeader {
                name: "X-Probe".into(),
                value: "1".into(),
            }],
        };
        let mut app = mk_container("app");
        app.liveness_probe = Some(Probe {
            http_get: Some(action.clone()),
            ..Probe::default()
        });
        app.readiness_probe = Some(Probe {
            tcp_socket: Some(TcpSocketAction {
                port: 80,
                host: "10.0.0.9".into(),
            }),
            ..Probe::default()
        });
        app.lifecycle_post_start_handler = Some(LifecycleHandler {
            http_get: Some(action),
            ..LifecycleHandler::default()
        });
        let mut init = mk_container("init");
        init.stdin = true;
        init.tty = true;
        init.security_context_run_as_group = Some(3000);
        let params = map(encode(&CreateContainerGroupRequest {
            container: vec![app],
            init_container: vec![init],
            ..CreateContainerGroupRequest::default()
        }));
        let keys: Vec<&str> = params.keys().map(String::as_str).collect();
        assert!(keys.contains(&"Container.1.LivenessProbe.HttpGet.Path"));
        assert!(keys.contains(&"Container.1.ReadinessProbe.TcpSocket.Port"));
        for absent in [
            "Container.1.LivenessProbe.HttpGet.Host",
            "Container.1.LivenessProbe.HttpGet.HttpHeader.1.Name",
            "Container.1.ReadinessProbe.TcpSocket.Host",
            "InitContainer.1.Stdin",
            "InitContainer.1.Tty",
            "InitContainer.1.SecurityContextRunAsGroup",
        ] {
            assert!(
                !keys.contains(&absent),
                "{absent} is not a parameter of the service"
            );
        }
        // Lifecycle handlers do take a host and headers.
        assert_eq!(
            params["Container.1.LifecyclePostStartHandlerHttpGetHost"],
            "10.0.0.9"
        );
        assert_eq!(
            params["Container.1.LifecyclePostStartHandlerHttpGetHttpHeader.1.Name"],
            "X-Probe"
        );
    }

    #[test]
    fn an_update_sends_no_file_modes() {
        let files = ConfigFileVolume {
            config_file_to_path: vec![ConfigFileToPath {
                path: "token".into(),
                content: "dA==".into(),
                mode: Some(0o600),
            }],
            default_mode: Some(0o644),
        };
        let params = map(encode(&UpdateContainerGroupRequest {
            container_group_id: "eci-1".into(),
            volume: vec![Volume {
                name: "token".into(),
                r#type: "ConfigFileVolume".into(),
                config_file_volume: Some(files),
                ..Volume::default()
            }],
            ..UpdateContainerGroupRequest::default()
        }));
        let keys: Vec<&str> = params.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "ContainerGroupId",
                "Volume.1.ConfigFileVolume.ConfigFileToPath.1.Content",
                "Volume.1.ConfigFileVolume.ConfigFileToPath.1.Path",
                "Volume.1.Name",
                "Volume.1.Type",
            ]
        );
    }

    #[test]
    fn respellings_name_the_member_they_replace() {
        for (_, path, wire) in SPELLINGS.iter().filter(|(_, _, wire)| !wire.is_empty()) {
            let member = path.rsplit('.').next().unwrap_or_default();
            assert_eq!(naming::to_snake(wire), member, "{path}");
        }
    }

    #[test]
    fn run_together_and_capitalised_names_are_the_services() {
        let mut app = mk_container("app");
        app.tty = true;
        app.lifecycle_pre_stop_handler = Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: vec!["sleep".into()],
            }),
            tcp_socket: Some(TcpSocketAction {
                port: 80,
                host: "10.0.0.9".into(),
            }),
            ..LifecycleHandler::default()
        });
        let create = CreateContainerGroupRequest {
            container: vec![app],
            eip_isp: "BGP".into(),
            volume: vec![Volume {
                nfs_volume: Some(NfsVolume {
                    server: "nas".into(),
                    ..NfsVolume::default()
                }),
                ..Volume::default()
            }],
            ..CreateContainerGroupRequest::default()
        };
        let params = map(encode(&create));
        for key in [
            "Container.1.Tty",
            "Container.1.LifecyclePreStopHandlerExec.1",
            "Container.1.LifecyclePreStopHandlerTcpSocketPort",
            "Container.1.LifecyclePreStopHandlerTcpSocketHost",
            "EipISP",
            "Volume.1.NFSVolume.Server",
        ] {
            assert!(params.contains_key(key), "{key} missing from {params:?}");
        }
        for key in params.keys() {
            assert!(
                documented::accepts_parameter("CreateContainerGroup", key),
                "{key}"
            );
            if let Some(segment) = key.split('.').find(|s| s.starts_with("Lifecycle")) {
                assert!(documented::split_lifecycle(segment).is_some(), "{key}");
            }
        }
        let exec = map(encode(&ExecContainerCommandRequest {
            tty: true,
            ..ExecContainerCommandRequest::default()
        }));
        assert_eq!(exec.keys().collect::<Vec<_>>(), ["TTY"]);
    }
}
