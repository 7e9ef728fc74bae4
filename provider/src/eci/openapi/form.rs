//! Requests → the OpenAPI's flat form parameters (pure).
//!
//! Lists are numbered from 1 (`Container.1.EnvironmentVar.2.Key`), nested objects are joined
//! with dots (`Container.1.ReadinessProbe.HttpGet.Path`), the lifecycle handlers use the API's
//! run-together names (`Container.1.LifecyclePreStopHandlerExec.1`), and id lists travel as a
//! JSON-array string (`ContainerGroupIds=["eci-1","eci-2"]`). Empty strings, `false` and unset
//! optional values are left out, as the service treats absence as the default.

use std::fmt::Display;

use eci_proto::v20180808::{
    AcrRegistryInfo, CreateImageCacheRequest, DeleteImageCacheRequest, DescribeImageCachesRequest,
    UpdateImageCacheRequest,
};
use eci_proto::v20180808::{
    Container, ContainerSecurityContext, CreateContainerGroupRequest, DeleteContainerGroupRequest,
    DescribeContainerGroupMetricRequest, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupsRequest, DescribeContainerLogRequest,
    DescribeMultiContainerGroupMetricRequest, DnsConfig, ExecContainerCommandRequest,
    ImageRegistryCredential, LifecycleHandler, Probe, RestartContainerGroupRequest, Tag,
    UpdateContainerGroupRequest, Volume,
};

/// Flat `Name=value` parameters under construction.
#[derive(Debug, Default)]
pub struct Form {
    params: Vec<(String, String)>,
    prefix: String,
}

impl Form {
    /// The parameters, in the order they were added.
    pub fn into_params(self) -> Vec<(String, String)> {
        self.params
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn raw(&mut self, name: &str, value: String) {
        let key = self.key(name);
        self.params.push((key, value));
    }

    /// A string, left out when empty.
    pub fn text(&mut self, name: &str, value: &str) {
        if !value.is_empty() {
            self.raw(name, value.to_owned());
        }
    }

    /// `true`, or nothing.
    pub fn flag(&mut self, name: &str, value: bool) {
        if value {
            self.raw(name, "true".to_owned());
        }
    }

    /// A number that is unset at its zero value.
    pub fn number<T: Display + Default + PartialEq + Copy>(&mut self, name: &str, value: T) {
        if value != T::default() {
            self.raw(name, value.to_string());
        }
    }

    /// An optional value, sent whenever set (zero included).
    pub fn optional<T: Display>(&mut self, name: &str, value: Option<T>) {
        if let Some(value) = value {
            self.raw(name, value.to_string());
        }
    }

    /// `Name.1=a&Name.2=b`.
    pub fn strings(&mut self, name: &str, values: &[String]) {
        for (index, value) in values.iter().enumerate() {
            self.raw(&format!("{name}.{}", index + 1), value.clone());
        }
    }

    /// `Name=["a","b"]`, left out when empty.
    pub fn json_array(&mut self, name: &str, values: &[String]) {
        if !values.is_empty() {
            self.raw(
                name,
                serde_json::to_string(values).unwrap_or_else(|_| "[]".to_owned()),
            );
        }
    }

    /// `Name.*` members written by `fill`.
    pub fn nested(&mut self, name: &str, fill: impl FnOnce(&mut Self)) {
        let saved = self.prefix.len();
        self.prefix.push_str(name);
        self.prefix.push('.');
        fill(self);
        self.prefix.truncate(saved);
    }

    /// `Name.N.*` for each item.
    pub fn list<T>(&mut self, name: &str, items: &[T], mut fill: impl FnMut(&mut Self, &T)) {
        for (index, item) in items.iter().enumerate() {
            self.nested(&format!("{name}.{}", index + 1), |form| fill(form, item));
        }
    }

    fn tags(&mut self, tags: &[Tag]) {
        self.list("Tag", tags, |form, tag| {
            form.text("Key", &tag.key);
            form.text("Value", &tag.value);
        });
    }
}

/// A probe: ECI's `HttpGet` has `Path`, `Port` and `Scheme` only and its `TcpSocket` a `Port`
/// (no host, no headers; the translation reports a pod that asks for them).
fn probe(form: &mut Form, probe: &Probe) {
    if let Some(exec) = &probe.exec {
        form.nested("Exec", |form| form.strings("Command", &exec.command));
    }
    if let Some(action) = &probe.http_get {
        form.nested("HttpGet", |form| {
            form.text("Path", &action.path);
            form.number("Port", action.port);
            form.text("Scheme", &action.scheme);
        });
    }
    if let Some(socket) = &probe.tcp_socket {
        form.nested("TcpSocket", |form| form.number("Port", socket.port));
    }
    form.number("InitialDelaySeconds", probe.initial_delay_seconds);
    form.number("PeriodSeconds", probe.period_seconds);
    form.number("TimeoutSeconds", probe.timeout_seconds);
    form.number("SuccessThreshold", probe.success_threshold);
    form.number("FailureThreshold", probe.failure_threshold);
}

/// The API names handler members by running them together: `LifecyclePreStopHandlerExec.N`,
/// `LifecyclePreStopHandlerHttpGetPath`, `LifecyclePreStopHandlerTcpSocketPort`.
fn lifecycle(form: &mut Form, name: &str, handler: &LifecycleHandler) {
    if let Some(exec) = &handler.exec {
        form.strings(&format!("{name}Exec"), &exec.command);
    }
    if let Some(action) = &handler.http_get {
        form.text(&format!("{name}HttpGetPath"), &action.path);
        form.number(&format!("{name}HttpGetPort"), action.port);
        form.text(&format!("{name}HttpGetScheme"), &action.scheme);
        form.text(&format!("{name}HttpGetHost"), &action.host);
        form.list(
            &format!("{name}HttpGetHttpHeader"),
            &action.http_header,
            |form, header| {
                form.text("Name", &header.name);
                form.text("Value", &header.value);
            },
        );
    }
    if let Some(socket) = &handler.tcp_socket {
        form.number(&format!("{name}TcpSocketPort"), socket.port);
        form.text(&format!("{name}TcpSocketHost"), &socket.host);
    }
}

fn security_context(form: &mut Form, context: &ContainerSecurityContext) {
    if let Some(capability) = &context.capability {
        form.nested("Capability", |form| form.strings("Add", &capability.add));
    }
    form.flag("ReadOnlyRootFilesystem", context.read_only_root_filesystem);
    form.optional("RunAsUser", context.run_as_user);
}

/// What `Container.N` and `InitContainer.N` share.
fn container_common(form: &mut Form, c: &Container) {
    form.text("Name", &c.name);
    form.text("Image", &c.image);
    form.optional("Cpu", c.cpu);
    form.optional("Memory", c.memory);
    form.optional("Gpu", c.gpu);
    form.strings("Command", &c.command);
    form.strings("Arg", &c.arg);
    form.text("WorkingDir", &c.working_dir);
    form.text("ImagePullPolicy", &c.image_pull_policy);
    form.list("EnvironmentVar", &c.environment_var, |form, env| {
        form.text("Key", &env.key);
        form.text("Value", &env.value);
        if let Some(field_ref) = &env.field_ref {
            form.nested("FieldRef", |form| {
                form.text("FieldPath", &field_ref.field_path);
            });
        }
    });
    form.list("Port", &c.port, |form, port| {
        form.number("Port", port.port);
        form.text("Protocol", &port.protocol);
    });
    form.list("VolumeMount", &c.volume_mount, |form, mount| {
        form.text("Name", &mount.name);
        form.text("MountPath", &mount.mount_path);
        form.text("SubPath", &mount.sub_path);
        form.flag("ReadOnly", mount.read_only);
        form.text("MountPropagation", &mount.mount_propagation);
    });
    if let Some(context) = &c.security_context {
        form.nested("SecurityContext", |form| security_context(form, context));
    }
    form.text("TerminationMessagePath", &c.termination_message_path);
    form.text("TerminationMessagePolicy", &c.termination_message_policy);
}

/// `InitContainer.N`: no probes, lifecycle handlers, `Stdin`/`StdinOnce`/`Tty` or flat
/// `SecurityContext…` members (the service has no such parameters for init containers).
fn init_container(form: &mut Form, c: &Container) {
    container_common(form, c);
}

/// `Container.N`.
fn container(form: &mut Form, c: &Container) {
    container_common(form, c);
    if let Some(p) = &c.readiness_probe {
        form.nested("ReadinessProbe", |form| probe(form, p));
    }
    if let Some(p) = &c.liveness_probe {
        form.nested("LivenessProbe", |form| probe(form, p));
    }
    form.optional("SecurityContextPrivileged", c.security_context_privileged);
    form.optional("SecurityContextRunAsGroup", c.security_context_run_as_group);
    form.optional(
        "SecurityContextRunAsNonRoot",
        c.security_context_run_as_non_root,
    );
    if let Some(handler) = &c.lifecycle_post_start_handler {
        lifecycle(form, "LifecyclePostStartHandler", handler);
    }
    if let Some(handler) = &c.lifecycle_pre_stop_handler {
        lifecycle(form, "LifecyclePreStopHandler", handler);
    }
    form.flag("Stdin", c.stdin);
    form.flag("StdinOnce", c.stdin_once);
    form.flag("Tty", c.tty);
}

/// Which action a volume is encoded for: UpdateContainerGroup takes no file modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VolumeFor {
    Create,
    Update,
}

fn volume(form: &mut Form, v: &Volume, purpose: VolumeFor) {
    form.text("Name", &v.name);
    form.text("Type", &v.r#type);
    if let Some(dir) = &v.empty_dir_volume {
        form.nested("EmptyDirVolume", |form| {
            form.text("Medium", &dir.medium);
            form.text("SizeLimit", &dir.size_limit);
        });
    }
    if let Some(nfs) = &v.nfs_volume {
        form.nested("NFSVolume", |form| {
            form.text("Server", &nfs.server);
            form.text("Path", &nfs.path);
            form.flag("ReadOnly", nfs.read_only);
        });
    }
    if let Some(files) = &v.config_file_volume {
        form.nested("ConfigFileVolume", |form| {
            form.list(
                "ConfigFileToPath",
                &files.config_file_to_path,
                |form, file| {
                    form.text("Path", &file.path);
                    form.text("Content", &file.content);
                    if purpose == VolumeFor::Create {
                        form.optional("Mode", file.mode);
                    }
                },
            );
            if purpose == VolumeFor::Create {
                form.optional("DefaultMode", files.default_mode);
            }
        });
    }
    // UpdateContainerGroup has no DiskVolume members (the SDK's table): a disk is attached
    // when the group is created and stays; updates carry token volumes only.
    if let Some(disk) = v
        .disk_volume
        .as_ref()
        .filter(|_| purpose == VolumeFor::Create)
    {
        form.nested("DiskVolume", |form| {
            form.text("DiskId", &disk.disk_id);
            form.text("FsType", &disk.fs_type);
            form.number("DiskSize", disk.disk_size);
        });
    }
    if let Some(flex) = &v.flex_volume {
        form.nested("FlexVolume", |form| {
            form.text("Driver", &flex.driver);
            form.text("FsType", &flex.fs_type);
            form.text("Options", &flex.options);
        });
    }
    if let Some(host) = &v.host_path_volume {
        form.nested("HostPathVolume", |form| {
            form.text("Type", &host.r#type);
            form.text("Path", &host.path);
        });
    }
}

fn dns_config(form: &mut Form, dns: &DnsConfig) {
    form.strings("NameServer", &dns.name_server);
    form.strings("Search", &dns.search);
    form.list("Option", &dns.option, |form, option| {
        form.text("Name", &option.name);
        form.text("Value", &option.value);
    });
}

fn registry_credentials(form: &mut Form, credentials: &[ImageRegistryCredential]) {
    form.list("ImageRegistryCredential", credentials, |form, c| {
        form.text("Server", &c.server);
        form.text("UserName", &c.user_name);
        form.text("Password", &c.password);
    });
}

/// CreateContainerGroup.
pub fn create_container_group(r: &CreateContainerGroupRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ZoneId", &r.zone_id);
    form.text("SecurityGroupId", &r.security_group_id);
    form.text("VSwitchId", &r.v_switch_id);
    form.text("ContainerGroupName", &r.container_group_name);
    form.text("RestartPolicy", &r.restart_policy);
    form.optional("Cpu", r.cpu);
    form.optional("Memory", r.memory);
    form.text("InstanceType", &r.instance_type);
    form.tags(&r.tag);
    form.list("Container", &r.container, container);
    form.list("InitContainer", &r.init_container, init_container);
    form.list("Volume", &r.volume, |form, v| {
        volume(form, v, VolumeFor::Create);
    });
    if let Some(dns) = &r.dns_config {
        form.nested("DnsConfig", |form| dns_config(form, dns));
    }
    form.text("DnsPolicy", &r.dns_policy);
    form.text("HostName", &r.host_name);
    if let Some(context) = &r.security_context {
        form.nested("SecurityContext", |form| {
            form.list("Sysctl", &context.sysctl, |form, sysctl| {
                form.text("Name", &sysctl.name);
                form.text("Value", &sysctl.value);
            });
        });
    }
    form.flag("ShareProcessNamespace", r.share_process_namespace);
    form.list("HostAliase", &r.host_aliase, |form, alias| {
        form.text("Ip", &alias.ip);
        form.strings("Hostname", &alias.hostname);
    });
    registry_credentials(&mut form, &r.image_registry_credential);
    form.text("ClientToken", &r.client_token);
    form.optional("ActiveDeadlineSeconds", r.active_deadline_seconds);
    form.optional(
        "TerminationGracePeriodSeconds",
        r.termination_grace_period_seconds,
    );
    form.text("SpotStrategy", &r.spot_strategy);
    form.optional("SpotPriceLimit", r.spot_price_limit);
    form.optional("SpotDuration", r.spot_duration);
    form.flag("AutoMatchImageCache", r.auto_match_image_cache);
    form.text("ImageSnapshotId", &r.image_snapshot_id);
    form.text("RamRoleName", &r.ram_role_name);
    form.text("ResourceGroupId", &r.resource_group_id);
    form.text("EipInstanceId", &r.eip_instance_id);
    form.flag("AutoCreateEip", r.auto_create_eip);
    form.flag("DryRun", r.dry_run);
    form.optional("EphemeralStorage", r.ephemeral_storage);
    form.text("ScheduleStrategy", &r.schedule_strategy);
    form.strings("ComputeCategory", &r.compute_category);
    form.text("GpuDriverVersion", &r.gpu_driver_version);
    form.optional("StrictSpot", r.strict_spot);
    form.optional("EipBandwidth", r.eip_bandwidth);
    form.text("EipCommonBandwidthPackage", &r.eip_common_bandwidth_package);
    form.text("EipISP", &r.eip_isp);
    form.optional("Ipv6AddressCount", r.ipv6_address_count);
    form.text("PrivateIpAddress", &r.private_ip_address);
    form.text("FixedIp", &r.fixed_ip);
    form.strings("NtpServer", &r.ntp_server);
    form.text("CorePattern", &r.core_pattern);
    form.optional("IngressBandwidth", r.ingress_bandwidth);
    form.optional("EgressBandwidth", r.egress_bandwidth);
    form.list("AcrRegistryInfo", &r.acr_registry_info, |form, acr| {
        form.text("InstanceId", &acr.instance_id);
        form.text("InstanceName", &acr.instance_name);
        form.text("RegionId", &acr.region_id);
        form.strings("Domain", &acr.domain);
        form.text("ArnService", &acr.arn_service);
        form.text("ArnUser", &acr.arn_user);
    });
    form.text("PlainHttpRegistry", &r.plain_http_registry);
    form.text("InsecureRegistry", &r.insecure_registry);
    form
}

/// DescribeContainerGroups.
pub fn describe_container_groups(r: &DescribeContainerGroupsRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ZoneId", &r.zone_id);
    form.json_array("ContainerGroupIds", &r.container_group_ids);
    form.optional("Limit", r.limit);
    form.text("NextToken", &r.next_token);
    form.text("Status", &r.status);
    form.tags(&r.tag);
    form.text("ContainerGroupName", &r.container_group_name);
    form.text("VSwitchId", &r.v_switch_id);
    form.text("SecurityGroupId", &r.security_group_id);
    form.text("ResourceGroupId", &r.resource_group_id);
    form.flag("WithEvent", r.with_event);
    form
}

/// DescribeContainerGroupStatus.
pub fn describe_container_group_status(r: &DescribeContainerGroupStatusRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ZoneId", &r.zone_id);
    form.json_array("ContainerGroupIds", &r.container_group_ids);
    form.optional("Limit", r.limit);
    form.text("NextToken", &r.next_token);
    form.optional("SinceSecond", r.since_second);
    form.tags(&r.tag);
    form.text("ResourceGroupId", &r.resource_group_id);
    form
}

/// DeleteContainerGroup.
pub fn delete_container_group(r: &DeleteContainerGroupRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ContainerGroupId", &r.container_group_id);
    form.text("ClientToken", &r.client_token);
    // `force` is the gRPC fake's extension: the service has no such parameter.
    form
}

/// UpdateContainerGroup without containers: the daemon updates volumes (token refreshes) and
/// tags only, and the service spells some container members differently for this action
/// (`LifecyclePostStartHandlerHttpGetHttpHeaders`); the client refuses a request with
/// containers before it gets here. Files carry no `Mode`: the action has no such parameter.
pub fn update_container_group(r: &UpdateContainerGroupRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ContainerGroupId", &r.container_group_id);
    form.text("RestartPolicy", &r.restart_policy);
    form.tags(&r.tag);
    form.list("Volume", &r.volume, |form, v| {
        volume(form, v, VolumeFor::Update);
    });
    if let Some(dns) = &r.dns_config {
        form.nested("DnsConfig", |form| dns_config(form, dns));
    }
    registry_credentials(&mut form, &r.image_registry_credential);
    form.optional("Cpu", r.cpu);
    form.optional("Memory", r.memory);
    form.text("ClientToken", &r.client_token);
    form.text("UpdateType", &r.update_type);
    form
}

/// RestartContainerGroup.
pub fn restart_container_group(r: &RestartContainerGroupRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ContainerGroupId", &r.container_group_id);
    form.text("ClientToken", &r.client_token);
    form
}

/// DescribeContainerLog.
pub fn describe_container_log(r: &DescribeContainerLogRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ContainerGroupId", &r.container_group_id);
    form.text("ContainerName", &r.container_name);
    form.text("StartTime", &r.start_time);
    form.optional("Tail", r.tail);
    form.flag("LastTime", r.last_time);
    form.optional("SinceSeconds", r.since_seconds);
    form.optional("LimitBytes", r.limit_bytes);
    form.flag("Timestamps", r.timestamps);
    form
}

/// ExecContainerCommand. `Stdin` defaults to true at the service, so an explicit `false` is
/// sent.
pub fn exec_container_command(r: &ExecContainerCommandRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ContainerGroupId", &r.container_group_id);
    form.text("ContainerName", &r.container_name);
    form.json_array("Command", &r.command);
    form.flag("TTY", r.tty);
    form.optional("Stdin", r.stdin);
    form.flag("Sync", r.sync);
    form
}

/// DescribeContainerGroupMetric.
pub fn describe_container_group_metric(r: &DescribeContainerGroupMetricRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ContainerGroupId", &r.container_group_id);
    form.text("StartTime", &r.start_time);
    form.text("EndTime", &r.end_time);
    form.optional("Period", r.period);
    form
}

/// DescribeMultiContainerGroupMetric.
pub fn describe_multi_container_group_metric(r: &DescribeMultiContainerGroupMetricRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.json_array("ContainerGroupIds", &r.container_group_ids);
    form.text("MetricType", &r.metric_type);
    form.text("ResourceGroupId", &r.resource_group_id);
    form
}

/// `AcrRegistryInfo.N.*` of the image-cache actions (no ARNs in UpdateImageCache: `arns`
/// false leaves them out).
fn acr_registry_info(form: &mut Form, infos: &[AcrRegistryInfo], arns: bool) {
    form.list("AcrRegistryInfo", infos, |form, acr| {
        form.text("InstanceId", &acr.instance_id);
        form.text("InstanceName", &acr.instance_name);
        form.text("RegionId", &acr.region_id);
        form.strings("Domain", &acr.domain);
        if arns {
            form.text("ArnService", &acr.arn_service);
            form.text("ArnUser", &acr.arn_user);
        }
    });
}

/// CreateImageCache.
pub fn create_image_cache(r: &CreateImageCacheRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ZoneId", &r.zone_id);
    form.text("SecurityGroupId", &r.security_group_id);
    form.text("VSwitchId", &r.v_switch_id);
    form.text("ImageCacheName", &r.image_cache_name);
    form.strings("Image", &r.image);
    registry_credentials(&mut form, &r.image_registry_credential);
    form.optional("ImageCacheSize", r.image_cache_size);
    form.optional("RetentionDays", r.retention_days);
    form.tags(&r.tag);
    form.text("ClientToken", &r.client_token);
    form.text("ResourceGroupId", &r.resource_group_id);
    form.text("EipInstanceId", &r.eip_instance_id);
    form.text("EliminationStrategy", &r.elimination_strategy);
    acr_registry_info(&mut form, &r.acr_registry_info, true);
    form.flag("AutoMatchImageCache", r.auto_match_image_cache);
    form.flag("Flash", r.flash);
    form.optional("FlashCopyCount", r.flash_copy_count);
    form.optional("StandardCopyCount", r.standard_copy_count);
    form.text("PlainHttpRegistry", &r.plain_http_registry);
    form.text("InsecureRegistry", &r.insecure_registry);
    form.text("Annotations", &r.annotations);
    form
}

/// DescribeImageCaches.
pub fn describe_image_caches(r: &DescribeImageCachesRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ImageCacheId", &r.image_cache_id);
    form.text("ImageCacheName", &r.image_cache_name);
    form.text("SnapshotId", &r.snapshot_id);
    form.text("Image", &r.image);
    form.strings("MatchImage", &r.match_image);
    form.optional("ImageMatchCountRequest", r.image_match_count_request);
    form.flag("ImageFullMatch", r.image_full_match);
    form.optional("Limit", r.limit);
    form.text("NextToken", &r.next_token);
    form.tags(&r.tag);
    form.text("ResourceGroupId", &r.resource_group_id);
    form
}

/// UpdateImageCache.
pub fn update_image_cache(r: &UpdateImageCacheRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ImageCacheId", &r.image_cache_id);
    form.text("ImageCacheName", &r.image_cache_name);
    form.strings("Image", &r.image);
    registry_credentials(&mut form, &r.image_registry_credential);
    form.optional("ImageCacheSize", r.image_cache_size);
    form.optional("RetentionDays", r.retention_days);
    form.tags(&r.tag);
    form.text("ClientToken", &r.client_token);
    form.text("ResourceGroupId", &r.resource_group_id);
    form.text("SecurityGroupId", &r.security_group_id);
    form.text("VSwitchId", &r.v_switch_id);
    form.text("EipInstanceId", &r.eip_instance_id);
    form.text("EliminationStrategy", &r.elimination_strategy);
    acr_registry_info(&mut form, &r.acr_registry_info, false);
    form.flag("AutoMatchImageCache", r.auto_match_image_cache);
    form.flag("Flash", r.flash);
    form.optional("FlashCopyCount", r.flash_copy_count);
    form.optional("StandardCopyCount", r.standard_copy_count);
    form
}

/// DeleteImageCache.
pub fn delete_image_cache(r: &DeleteImageCacheRequest) -> Form {
    let mut form = Form::default();
    form.text("RegionId", &r.region_id);
    form.text("ImageCacheId", &r.image_cache_id);
    form.text("ClientToken", &r.client_token);
    form
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use eci_proto::v20180808::{
        Capability, ConfigFileToPath, ConfigFileVolume, EnvironmentVar, ExecAction, FieldRef,
        HostAliase, HttpGetAction, NfsVolume, Port, TcpSocketAction, VolumeMount,
    };

    use super::*;

    fn map(form: Form) -> BTreeMap<String, String> {
        form.into_params().into_iter().collect()
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
        let params = map(create_container_group(&request));
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
        let params = map(describe_container_groups(&DescribeContainerGroupsRequest {
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

        let params = map(exec_container_command(&ExecContainerCommandRequest {
            command: vec!["sh".into(), "-c".into(), "echo \"hi\"".into()],
            stdin: Some(false),
            sync: true,
            ..ExecContainerCommandRequest::default()
        }));
        assert_eq!(params["Command"], r#"["sh","-c","echo \"hi\""]"#);
        assert_eq!(params["Stdin"], "false");
        assert_eq!(params["Sync"], "true");
        assert!(!params.contains_key("TTY"));

        let params = map(describe_container_group_status(
            &DescribeContainerGroupStatusRequest {
                since_second: Some(0),
                ..DescribeContainerGroupStatusRequest::default()
            },
        ));
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
        let params = map(delete_container_group(&forced));
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
            http_header: vec![eci_proto::v20180808::HttpHeader {
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
        let params = map(create_container_group(&CreateContainerGroupRequest {
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
        let params = map(update_container_group(&UpdateContainerGroupRequest {
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
}
