//! Request validation, as strict as the real API: a provider bug must fail here, not in
//! production. Every rejection names the parameter and says what is allowed.

use std::collections::HashSet;

use eci_proto::EciError;
use eci_proto::error::codes;
use eci_proto::status::RestartPolicy;
use eci_proto::v20180808::{Container, CreateContainerGroupRequest, Tag, Volume};

use crate::clock::Millis;
use crate::engine::behaviour::{self, Behaviour};

/// Most tags on a group, and in a filter.
pub const MAX_TAGS: usize = 20;
/// Most ids in one describe call.
pub const MAX_IDS: usize = 20;
/// Default and maximum page size of DescribeContainerGroups.
pub const DESCRIBE_GROUPS_MAX_LIMIT: i32 = 20;
/// Default and maximum page size of DescribeContainerGroupStatus.
pub const DESCRIBE_STATUS_MAX_LIMIT: i32 = 200;
/// Grace period when the request names none (Kubernetes' default too).
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
/// Size of a group when nothing in the request decides it: 2 vCPU, 4 GiB.
pub const DEFAULT_SPEC: (f64, f64) = (2.0, 4.0);

/// The vCPU / GiB combinations mock-eci accepts for a group, smallest first.
pub const SUPPORTED_SPECS: &[(f64, &[f64])] = &[
    (0.25, &[0.5, 1.0]),
    (0.5, &[1.0, 2.0]),
    (1.0, &[2.0, 4.0, 8.0]),
    (2.0, &[2.0, 4.0, 8.0, 16.0]),
    (4.0, &[4.0, 8.0, 16.0, 32.0]),
    (8.0, &[8.0, 16.0, 32.0, 64.0]),
    (12.0, &[12.0, 24.0, 48.0, 96.0]),
    (16.0, &[16.0, 32.0, 64.0, 128.0]),
    (24.0, &[24.0, 48.0, 96.0, 192.0]),
    (32.0, &[32.0, 64.0, 128.0, 256.0]),
    (52.0, &[96.0, 192.0, 384.0]),
    (64.0, &[128.0, 256.0, 512.0]),
];

const VOLUME_TYPES: &[&str] = &[
    "EmptyDirVolume",
    "NFSVolume",
    "ConfigFileVolume",
    "DiskVolume",
    "FlexVolume",
    "HostPathVolume",
];

/// What a valid CreateContainerGroup request resolves to.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidCreate {
    /// The restart policy, defaulted.
    pub restart_policy: RestartPolicy,
    /// Group vCPU after spec matching.
    pub cpu: f64,
    /// Group GiB after spec matching.
    pub memory: f64,
    /// The termination grace period asked for, defaulted.
    pub grace_seconds: i64,
    /// Behaviour of each container, in order.
    pub behaviours: Vec<Behaviour>,
    /// Behaviour of each init container, in order.
    pub init_behaviours: Vec<Behaviour>,
}

/// `InvalidParameter.<param>` with a readable message.
pub fn invalid(param: &str, detail: impl std::fmt::Display) -> EciError {
    EciError::new(
        format!("{}.{param}", codes::INVALID_PARAMETER),
        format!("The specified parameter \"{param}\" is not valid: {detail}"),
    )
}

/// `MissingParameter` naming the parameter.
pub fn missing(param: &str) -> EciError {
    EciError::new(
        codes::MISSING_PARAMETER,
        format!(
            "The input parameter \"{param}\" that is mandatory for processing this request is not supplied."
        ),
    )
}

/// The request must address the served region.
pub fn region(requested: &str, served: &str) -> Result<(), EciError> {
    if requested.is_empty() {
        return Err(missing("RegionId"));
    }
    if requested != served {
        return Err(EciError::new(
            codes::INVALID_REGION_ID,
            format!(
                "The specified region {requested:?} does not exist; this endpoint serves {served:?}."
            ),
        ));
    }
    Ok(())
}

/// Validates a create request and resolves its defaults and size.
pub fn create(
    request: &CreateContainerGroupRequest,
    served_region: &str,
    init_duration: Millis,
) -> Result<ValidCreate, EciError> {
    region(&request.region_id, served_region)?;
    network(request)?;
    group_name(&request.container_group_name)?;
    client_token(&request.client_token)?;
    tags(&request.tag, "Tag")?;
    let restart_policy = restart_policy(&request.restart_policy)?;

    if request.container.is_empty() {
        return Err(missing("Container"));
    }
    let volumes = volumes(&request.volume)?;
    containers(request, &volumes)?;
    let grace_seconds = grace_seconds(request.termination_grace_period_seconds)?;
    active_deadline(request.active_deadline_seconds)?;
    spot(request)?;
    if request.container.len() + request.init_container.len() > 20 {
        return Err(invalid(
            "Container",
            "a group holds at most 20 containers and init containers",
        ));
    }
    let (cpu, memory) = spec(request)?;

    Ok(ValidCreate {
        restart_policy,
        cpu,
        memory,
        grace_seconds,
        behaviours: behaviours(&request.container, None)?,
        init_behaviours: behaviours(&request.init_container, Some(init_duration))?,
    })
}

/// `SecurityGroupId` and `VSwitchId`: both required, and 1 to 10 vSwitches.
fn network(request: &CreateContainerGroupRequest) -> Result<(), EciError> {
    if request.security_group_id.is_empty() {
        return Err(missing("SecurityGroupId"));
    }
    if request.v_switch_id.is_empty() {
        return Err(missing("VSwitchId"));
    }
    let vswitches = request.v_switch_id.split(',').count();
    if vswitches > 10
        || request
            .v_switch_id
            .split(',')
            .any(|id| id.trim().is_empty())
    {
        return Err(invalid(
            "VSwitchId",
            "give 1 to 10 non-empty vSwitch ids separated by commas",
        ));
    }
    Ok(())
}

/// `RestartPolicy`, defaulted when empty.
fn restart_policy(policy: &str) -> Result<RestartPolicy, EciError> {
    RestartPolicy::from_request(policy).map_err(|_| {
        invalid(
            "RestartPolicy",
            format!("{policy:?}; use Always, OnFailure or Never"),
        )
    })
}

/// Every init container then container is valid, and no two share a name.
fn containers(
    request: &CreateContainerGroupRequest,
    volumes: &HashSet<&str>,
) -> Result<(), EciError> {
    let mut names = HashSet::new();
    for (kind, list) in [
        ("InitContainer", &request.init_container),
        ("Container", &request.container),
    ] {
        for (index, container) in list.iter().enumerate() {
            self::container(container, &format!("{kind}.{}", index + 1), volumes)?;
            if !names.insert(container.name.as_str()) {
                return Err(invalid(
                    &format!("{kind}.{}.Name", index + 1),
                    format!(
                        "container name {:?} is used twice in the group",
                        container.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `TerminationGracePeriodSeconds`: [`DEFAULT_GRACE_SECONDS`] when unset, never negative.
fn grace_seconds(requested: Option<i64>) -> Result<i64, EciError> {
    match requested {
        None => Ok(DEFAULT_GRACE_SECONDS),
        Some(seconds) if seconds >= 0 => Ok(seconds),
        Some(seconds) => Err(invalid(
            "TerminationGracePeriodSeconds",
            format!("{seconds} is negative"),
        )),
    }
}

/// `ActiveDeadlineSeconds`, when set, is positive.
fn active_deadline(requested: Option<i64>) -> Result<(), EciError> {
    if let Some(seconds) = requested.filter(|seconds| *seconds <= 0) {
        return Err(invalid(
            "ActiveDeadlineSeconds",
            format!("{seconds} must be positive"),
        ));
    }
    Ok(())
}

/// `SpotStrategy` is a known one, and a price-limited strategy names its limit.
fn spot(request: &CreateContainerGroupRequest) -> Result<(), EciError> {
    if !matches!(
        request.spot_strategy.as_str(),
        "" | "NoSpot" | "SpotWithPriceLimit" | "SpotAsPriceGo"
    ) {
        return Err(invalid(
            "SpotStrategy",
            format!(
                "{:?}; use NoSpot, SpotWithPriceLimit or SpotAsPriceGo",
                request.spot_strategy
            ),
        ));
    }
    if request.spot_strategy == "SpotWithPriceLimit" && request.spot_price_limit.is_none() {
        return Err(missing("SpotPriceLimit"));
    }
    Ok(())
}

/// The scripted behaviour of each container, from its environment.
fn behaviours(
    containers: &[Container],
    default_exit: Option<Millis>,
) -> Result<Vec<Behaviour>, EciError> {
    containers
        .iter()
        .map(|container| {
            behaviour::parse(container, default_exit)
                .map_err(|error| invalid("EnvironmentVar", error))
        })
        .collect()
}

/// `ContainerGroupName`: 2–128 characters of `[a-z0-9-]`, not starting or ending with `-`.
pub fn group_name(name: &str) -> Result<(), EciError> {
    if name.is_empty() {
        return Err(missing("ContainerGroupName"));
    }
    let valid = (2..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(EciError::new(
            codes::INVALID_CONTAINER_GROUP_NAME,
            format!(
                "The specified parameter \"ContainerGroupName\" is not valid: {name:?} must be 2-128 characters of lowercase letters, digits and '-', and must not start or end with '-'."
            ),
        ))
    }
}

/// `ClientToken`: at most 64 ASCII characters.
pub fn client_token(token: &str) -> Result<(), EciError> {
    if token.len() > 64 || !token.is_ascii() {
        return Err(invalid("ClientToken", "use at most 64 ASCII characters"));
    }
    Ok(())
}

/// `Tag.N`: at most 20, keys 1–64 characters not starting with `acs:` or `aliyun`, values at
/// most 128 characters, no key twice.
pub fn tags(tags: &[Tag], param: &str) -> Result<(), EciError> {
    if tags.len() > MAX_TAGS {
        return Err(invalid(
            param,
            format!("{} tags given, at most {MAX_TAGS} are allowed", tags.len()),
        ));
    }
    let mut keys = HashSet::new();
    for (index, tag) in tags.iter().enumerate() {
        let param = format!("{param}.{}.Key", index + 1);
        if tag.key.is_empty() {
            return Err(missing(&param));
        }
        if tag.key.chars().count() > 64 {
            return Err(invalid(&param, "tag keys are at most 64 characters"));
        }
        if tag.key.starts_with("acs:") || tag.key.starts_with("aliyun") {
            return Err(invalid(
                &param,
                format!(
                    "{:?}: keys starting with acs: or aliyun are reserved",
                    tag.key
                ),
            ));
        }
        if tag.value.chars().count() > 128 {
            return Err(invalid(
                &param.replace(".Key", ".Value"),
                "tag values are at most 128 characters",
            ));
        }
        if !keys.insert(tag.key.as_str()) {
            return Err(invalid(
                &param,
                format!("tag key {:?} is given twice", tag.key),
            ));
        }
    }
    Ok(())
}

/// At most [`MAX_IDS`] ids.
pub fn ids(ids: &[String]) -> Result<(), EciError> {
    if ids.len() > MAX_IDS {
        return Err(invalid(
            "ContainerGroupIds",
            format!("{} ids given, at most {MAX_IDS} are allowed", ids.len()),
        ));
    }
    Ok(())
}

/// The page size of a list call: `default_and_max` when unset, 1..=`default_and_max` otherwise.
pub fn limit(limit: Option<i32>, default_and_max: i32) -> Result<usize, EciError> {
    match limit {
        None => Ok(usize::try_from(default_and_max).unwrap_or(1)),
        Some(value) if (1..=default_and_max).contains(&value) => {
            Ok(usize::try_from(value).unwrap_or(1))
        }
        Some(value) => Err(invalid(
            "Limit",
            format!("{value} is out of range; use 1 to {default_and_max}"),
        )),
    }
}

/// `NextToken` must be one this service handed out.
pub fn next_token(token: &str) -> Result<Option<&str>, EciError> {
    if token.is_empty() {
        Ok(None)
    } else if token.starts_with("eci-") && token.len() <= 64 {
        Ok(Some(token))
    } else {
        Err(invalid(
            "NextToken",
            format!("{token:?} was not returned by a previous call"),
        ))
    }
}

/// Validates one container; `param` is its request prefix, `volumes` the group's volume names.
fn container(container: &Container, param: &str, volumes: &HashSet<&str>) -> Result<(), EciError> {
    container_name(&container.name, param)?;
    image(container, param)?;
    resources(container, param)?;
    environment(container, param)?;
    ports(container, param)?;
    volume_mounts(container, param, volumes)?;
    probes(container, param)
}

/// `Name`: at most 63 characters of `[a-z0-9-]`, not starting or ending with `-`.
fn container_name(name: &str, param: &str) -> Result<(), EciError> {
    if name.is_empty() {
        return Err(missing(&format!("{param}.Name")));
    }
    let name_ok = name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !name_ok {
        return Err(invalid(
            &format!("{param}.Name"),
            format!(
                "{name:?} must be at most 63 lowercase letters, digits and '-', not starting or ending with '-'"
            ),
        ));
    }
    Ok(())
}

/// `Image` is set and `ImagePullPolicy` is a known one.
fn image(container: &Container, param: &str) -> Result<(), EciError> {
    if container.image.trim().is_empty() {
        return Err(missing(&format!("{param}.Image")));
    }
    if !matches!(
        container.image_pull_policy.as_str(),
        "" | "Always" | "IfNotPresent" | "Never"
    ) {
        return Err(invalid(
            &format!("{param}.ImagePullPolicy"),
            format!(
                "{:?}; use Always, IfNotPresent or Never",
                container.image_pull_policy
            ),
        ));
    }
    Ok(())
}

/// `Cpu` and `Memory`, when set, are positive; `Gpu` is not negative.
fn resources(container: &Container, param: &str) -> Result<(), EciError> {
    if container.cpu.is_some_and(|cpu| cpu.is_nan() || cpu <= 0.0) {
        return Err(invalid(&format!("{param}.Cpu"), "must be positive"));
    }
    if container
        .memory
        .is_some_and(|memory| memory.is_nan() || memory <= 0.0)
    {
        return Err(invalid(&format!("{param}.Memory"), "must be positive"));
    }
    if container.gpu.is_some_and(|gpu| gpu < 0) {
        return Err(invalid(&format!("{param}.Gpu"), "must not be negative"));
    }
    Ok(())
}

/// `EnvironmentVar.N`: every variable has a key, and field references name a supported path.
fn environment(container: &Container, param: &str) -> Result<(), EciError> {
    for (index, var) in container.environment_var.iter().enumerate() {
        if var.key.is_empty() {
            return Err(missing(&format!(
                "{param}.EnvironmentVar.{}.Key",
                index + 1
            )));
        }
        if let Some(field_ref) = &var.field_ref {
            if !is_supported_field_path(&field_ref.field_path) {
                return Err(invalid(
                    &format!("{param}.EnvironmentVar.{}.FieldRef.FieldPath", index + 1),
                    format!(
                        "{:?}; supported: status.podIP, status.hostIP, metadata.name, spec.nodeName",
                        field_ref.field_path
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `Port.N`: a port number in range and a TCP or UDP protocol.
fn ports(container: &Container, param: &str) -> Result<(), EciError> {
    for (index, port) in container.port.iter().enumerate() {
        if !(1..=65_535).contains(&port.port) {
            return Err(invalid(
                &format!("{param}.Port.{}.Port", index + 1),
                format!("{} is not in 1-65535", port.port),
            ));
        }
        if !matches!(port.protocol.as_str(), "" | "TCP" | "UDP") {
            return Err(invalid(
                &format!("{param}.Port.{}.Protocol", index + 1),
                format!("{:?}; use TCP or UDP", port.protocol),
            ));
        }
    }
    Ok(())
}

/// `VolumeMount.N`: mounts a volume of the group at an absolute path.
fn volume_mounts(
    container: &Container,
    param: &str,
    volumes: &HashSet<&str>,
) -> Result<(), EciError> {
    for (index, mount) in container.volume_mount.iter().enumerate() {
        if !volumes.contains(mount.name.as_str()) {
            return Err(invalid(
                &format!("{param}.VolumeMount.{}.Name", index + 1),
                format!("no volume is named {:?}", mount.name),
            ));
        }
        if !mount.mount_path.starts_with('/') {
            return Err(invalid(
                &format!("{param}.VolumeMount.{}.MountPath", index + 1),
                format!("{:?} must be an absolute path", mount.mount_path),
            ));
        }
    }
    Ok(())
}

/// `ReadinessProbe` and `LivenessProbe`, when set, have exactly one action.
fn probes(container: &Container, param: &str) -> Result<(), EciError> {
    for (name, probe) in [
        ("ReadinessProbe", &container.readiness_probe),
        ("LivenessProbe", &container.liveness_probe),
    ] {
        if let Some(probe) = probe {
            let actions = usize::from(probe.exec.is_some())
                + usize::from(probe.http_get.is_some())
                + usize::from(probe.tcp_socket.is_some());
            if actions != 1 {
                return Err(invalid(
                    &format!("{param}.{name}"),
                    "set exactly one of Exec, HttpGet and TcpSocket",
                ));
            }
        }
    }
    Ok(())
}

fn is_supported_field_path(path: &str) -> bool {
    matches!(
        path,
        "status.podIP" | "status.hostIP" | "metadata.name" | "spec.nodeName"
    )
}

fn volumes(volumes: &[Volume]) -> Result<HashSet<&str>, EciError> {
    let mut names = HashSet::new();
    for (index, volume) in volumes.iter().enumerate() {
        let param = format!("Volume.{}", index + 1);
        if volume.name.is_empty() {
            return Err(missing(&format!("{param}.Name")));
        }
        if !VOLUME_TYPES.contains(&volume.r#type.as_str()) {
            return Err(invalid(
                &format!("{param}.Type"),
                format!(
                    "{:?}; use one of {}",
                    volume.r#type,
                    VOLUME_TYPES.join(", ")
                ),
            ));
        }
        let configured = match volume.r#type.as_str() {
            "EmptyDirVolume" => true,
            "NFSVolume" => volume
                .nfs_volume
                .as_ref()
                .is_some_and(|nfs| !nfs.server.is_empty() && !nfs.path.is_empty()),
            "ConfigFileVolume" => volume.config_file_volume.as_ref().is_some_and(|config| {
                config
                    .config_file_to_path
                    .iter()
                    .all(|file| !file.path.is_empty() && !file.path.starts_with('/'))
            }),
            "DiskVolume" => volume
                .disk_volume
                .as_ref()
                .is_some_and(|disk| !disk.disk_id.is_empty()),
            "FlexVolume" => volume
                .flex_volume
                .as_ref()
                .is_some_and(|flex| !flex.driver.is_empty()),
            _ => volume
                .host_path_volume
                .as_ref()
                .is_some_and(|host| !host.path.is_empty()),
        };
        if !configured {
            return Err(invalid(
                &format!("{param}.{}", volume.r#type),
                "the volume's settings are missing or incomplete (NFS needs Server and Path, config files relative Paths, disks a DiskId, flex volumes a Driver, host paths a Path)",
            ));
        }
        if let Some(flex) = volume
            .flex_volume
            .as_ref()
            .filter(|_| volume.r#type == "FlexVolume")
            && !flex.options.is_empty()
            && serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&flex.options)
                .is_err()
        {
            return Err(invalid(
                &format!("{param}.FlexVolume.Options"),
                "must be a JSON object of the driver's options",
            ));
        }
        if !names.insert(volume.name.as_str()) {
            return Err(invalid(
                &format!("{param}.Name"),
                format!("volume name {:?} is used twice", volume.name),
            ));
        }
    }
    Ok(names)
}

/// The group size: explicit `Cpu`/`Memory`, else the instance type, else the containers' sum
/// rounded up to the smallest supported spec, else [`DEFAULT_SPEC`].
pub fn spec(request: &CreateContainerGroupRequest) -> Result<(f64, f64), EciError> {
    let all = request.container.iter().chain(&request.init_container);
    let sum_cpu: f64 = request.container.iter().filter_map(|c| c.cpu).sum();
    let sum_memory: f64 = request.container.iter().filter_map(|c| c.memory).sum();
    let max_init_cpu = request
        .init_container
        .iter()
        .filter_map(|c| c.cpu)
        .fold(0.0, f64::max);
    let max_init_memory = request
        .init_container
        .iter()
        .filter_map(|c| c.memory)
        .fold(0.0, f64::max);
    // Init containers run one at a time, before the others: the group must fit the largest.
    let need_cpu = sum_cpu.max(max_init_cpu);
    let need_memory = sum_memory.max(max_init_memory);
    let any_sized = all.clone().any(|c| c.cpu.is_some() || c.memory.is_some());

    let (cpu, memory) = match (request.cpu, request.memory) {
        (Some(cpu), Some(memory)) => {
            if !is_supported(cpu, memory) {
                return Err(spec_error(format!(
                    "Cpu {cpu} with Memory {memory} GiB is not a supported specification; supported: {}",
                    supported_list()
                )));
            }
            (cpu, memory)
        }
        (Some(_), None) => return Err(missing("Memory")),
        (None, Some(_)) => return Err(missing("Cpu")),
        (None, None) if !request.instance_type.is_empty() => {
            instance_type_spec(&request.instance_type).ok_or_else(|| {
                invalid(
                    "InstanceType",
                    format!("{:?} names no known ECS type (expected e.g. ecs.c6.xlarge)", request.instance_type),
                )
            })?
        }
        (None, None) if any_sized => round_up(need_cpu, need_memory).ok_or_else(|| {
            spec_error(format!(
                "the containers need {need_cpu} vCPU and {need_memory} GiB, more than the largest supported specification"
            ))
        })?,
        (None, None) => DEFAULT_SPEC,
    };
    if need_cpu > cpu + 1e-9 || need_memory > memory + 1e-9 {
        return Err(spec_error(format!(
            "the containers need {need_cpu} vCPU and {need_memory} GiB but the group has {cpu} vCPU and {memory} GiB"
        )));
    }
    Ok((cpu, memory))
}

fn spec_error(detail: String) -> EciError {
    invalid("CpuMemory", detail)
}

fn is_supported(cpu: f64, memory: f64) -> bool {
    SUPPORTED_SPECS.iter().any(|(c, memories)| {
        (c - cpu).abs() < 1e-9 && memories.iter().any(|m| (m - memory).abs() < 1e-9)
    })
}

fn round_up(cpu: f64, memory: f64) -> Option<(f64, f64)> {
    SUPPORTED_SPECS.iter().find_map(|(c, memories)| {
        if *c + 1e-9 < cpu {
            return None;
        }
        memories
            .iter()
            .find(|m| **m + 1e-9 >= memory)
            .map(|m| (*c, *m))
    })
}

fn supported_list() -> String {
    SUPPORTED_SPECS
        .iter()
        .map(|(cpu, memories)| {
            let memories: Vec<String> = memories.iter().map(ToString::to_string).collect();
            format!("{cpu} vCPU: {} GiB", memories.join("/"))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Size of the first recognisable ECS type in a comma-separated list, from its name:
/// `large` = 2 vCPU, `xlarge` = 4, `<n>xlarge` = 4n; memory per vCPU by family letter
/// (`c` 2 GiB, `g` 4, `r` 8, others 4).
pub fn instance_type_spec(types: &str) -> Option<(f64, f64)> {
    types.split(',').map(str::trim).find_map(|name| {
        let mut parts = name.split('.');
        if parts.next()? != "ecs" {
            return None;
        }
        let family = parts.next()?;
        let size = parts.next()?;
        let cpu: f64 = match size {
            "large" => 2.0,
            "xlarge" => 4.0,
            other => other
                .strip_suffix("xlarge")?
                .parse::<u32>()
                .ok()
                .map(|n| 4.0 * f64::from(n))?,
        };
        let per_cpu = match family.chars().next()? {
            'c' => 2.0,
            'r' => 8.0,
            _ => 4.0,
        };
        Some((cpu, cpu * per_cpu))
    })
}

#[cfg(test)]
mod tests {
    use eci_proto::v20180808::{ConfigFileVolume, VolumeMount};

    use super::*;

    fn mk_container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: "nginx:1.27".into(),
            ..Container::default()
        }
    }

    fn mk_request() -> CreateContainerGroupRequest {
        CreateContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            security_group_id: "sg-1".into(),
            v_switch_id: "vsw-1".into(),
            container_group_name: "default-web-0".into(),
            container: vec![mk_container("web")],
            ..CreateContainerGroupRequest::default()
        }
    }

    fn check(request: &CreateContainerGroupRequest) -> Result<ValidCreate, EciError> {
        create(request, "cn-hangzhou", 1_000)
    }

    #[test]
    fn persistent_volume_types_need_their_settings() {
        use eci_proto::v20180808::{DiskVolume, FlexVolume, NfsVolume};
        let with = |volume: Volume| {
            let mut request = mk_request();
            request.volume = vec![Volume {
                name: "data".into(),
                ..volume
            }];
            check(&request).map(|_| ()).map_err(|e| e.message)
        };
        let disk = |disk_id: &str| Volume {
            r#type: "DiskVolume".into(),
            disk_volume: Some(DiskVolume {
                disk_id: disk_id.into(),
                ..DiskVolume::default()
            }),
            ..Volume::default()
        };
        let flex = |driver: &str, options: &str| Volume {
            r#type: "FlexVolume".into(),
            flex_volume: Some(FlexVolume {
                driver: driver.into(),
                fs_type: String::new(),
                options: options.into(),
            }),
            ..Volume::default()
        };
        let nfs = |server: &str| Volume {
            r#type: "NFSVolume".into(),
            nfs_volume: Some(NfsVolume {
                server: server.into(),
                path: "/".into(),
                read_only: true,
            }),
            ..Volume::default()
        };
        assert_eq!(with(disk("d-1")), Ok(()));
        assert!(with(disk("")).unwrap_err().contains("DiskId"));
        assert_eq!(with(flex("alicloud/oss", r#"{"bucket":"b"}"#)), Ok(()));
        assert_eq!(with(flex("alicloud/oss", "")), Ok(()));
        assert!(with(flex("", "")).unwrap_err().contains("Driver"));
        let options = with(flex("alicloud/oss", "bucket=b")).unwrap_err();
        assert!(options.contains("Volume.1.FlexVolume.Options"), "{options}");
        assert_eq!(with(nfs("nas.example.com")), Ok(()));
        assert!(with(nfs("")).unwrap_err().contains("Server"));
    }

    #[test]
    fn minimal_request_gets_defaults() {
        let valid = check(&mk_request()).unwrap();
        assert_eq!(valid.restart_policy, RestartPolicy::Always);
        assert_eq!((valid.cpu, valid.memory), DEFAULT_SPEC);
        assert_eq!(valid.grace_seconds, 30);
    }

    #[test]
    fn group_name_rules() {
        for good in ["ab", "a-b", "default-nginx-7d9f", &"a".repeat(128)] {
            assert!(group_name(good).is_ok(), "{good}");
        }
        for bad in [
            "a",
            "-ab",
            "ab-",
            "Upper",
            "under_score",
            &"a".repeat(129),
            "dot.ted",
        ] {
            let error = group_name(bad).unwrap_err();
            assert_eq!(error.code, "InvalidParameter.ContainerGroupName", "{bad}");
        }
        assert_eq!(group_name("").unwrap_err().code, "MissingParameter");
    }

    #[test]
    fn required_fields() {
        let mut request = mk_request();
        request.security_group_id.clear();
        assert!(
            check(&request)
                .unwrap_err()
                .message
                .contains("SecurityGroupId")
        );
        let mut request = mk_request();
        request.container.clear();
        assert_eq!(check(&request).unwrap_err().code, "MissingParameter");
        let mut request = mk_request();
        request.region_id = "cn-beijing".into();
        assert_eq!(
            check(&request).unwrap_err().code,
            "InvalidRegionId.NotFound"
        );
    }

    #[test]
    fn tag_rules() {
        let tag = |key: &str, value: &str| Tag {
            key: key.into(),
            value: value.into(),
        };
        let many: Vec<Tag> = (0..21).map(|i| tag(&format!("k{i}"), "v")).collect();
        assert!(
            tags(&many, "Tag")
                .unwrap_err()
                .message
                .contains("at most 20")
        );
        assert!(tags(&many[..20], "Tag").is_ok());
        assert!(tags(&[tag("acs:x", "v")], "Tag").is_err());
        assert!(tags(&[tag("aliyun-x", "v")], "Tag").is_err());
        assert!(tags(&[tag("k", "v"), tag("k", "w")], "Tag").is_err());
        assert!(tags(&[tag(&"k".repeat(65), "v")], "Tag").is_err());
        assert!(tags(&[tag("k", &"v".repeat(129))], "Tag").is_err());
    }

    #[test]
    fn client_token_rules() {
        assert!(client_token(&"t".repeat(64)).is_ok());
        assert!(client_token(&"t".repeat(65)).is_err());
        assert!(client_token("ütf").is_err());
    }

    #[test]
    fn containers_are_checked() {
        let mut request = mk_request();
        request.container.push(mk_container("web"));
        assert!(check(&request).unwrap_err().message.contains("used twice"));

        let mut request = mk_request();
        request.container[0].image.clear();
        assert!(
            check(&request)
                .unwrap_err()
                .message
                .contains("Container.1.Image")
        );

        let mut request = mk_request();
        request.container[0].volume_mount.push(VolumeMount {
            name: "config".into(),
            mount_path: "/etc/app".into(),
            ..VolumeMount::default()
        });
        assert!(
            check(&request)
                .unwrap_err()
                .message
                .contains("no volume is named")
        );
        request.volume.push(Volume {
            name: "config".into(),
            r#type: "ConfigFileVolume".into(),
            config_file_volume: Some(ConfigFileVolume::default()),
            ..Volume::default()
        });
        assert!(check(&request).is_ok());

        let mut request = mk_request();
        request.restart_policy = "Sometimes".into();
        assert_eq!(
            check(&request).unwrap_err().code,
            "InvalidParameter.RestartPolicy"
        );

        let mut request = mk_request();
        request.container[0]
            .environment_var
            .push(eci_proto::v20180808::EnvironmentVar {
                key: "MOCK_ECI_EXIT_CODE".into(),
                value: "nope".into(),
                field_ref: None,
            });
        assert_eq!(
            check(&request).unwrap_err().code,
            "InvalidParameter.EnvironmentVar"
        );
    }

    #[test]
    fn spec_matching() {
        let mut request = mk_request();
        request.container[0].cpu = Some(0.3);
        request.container[0].memory = Some(0.6);
        assert_eq!(spec(&request).unwrap(), (0.5, 1.0));

        request.cpu = Some(1.0);
        request.memory = Some(3.0);
        assert_eq!(
            spec(&request).unwrap_err().code,
            "InvalidParameter.CpuMemory"
        );
        request.memory = Some(2.0);
        assert_eq!(spec(&request).unwrap(), (1.0, 2.0));

        request.container[0].cpu = Some(1.5);
        assert!(
            spec(&request)
                .unwrap_err()
                .message
                .contains("need 1.5 vCPU")
        );

        let mut request = mk_request();
        request.cpu = Some(2.0);
        assert_eq!(spec(&request).unwrap_err().code, "MissingParameter");

        let mut request = mk_request();
        request.instance_type = "ecs.c6.2xlarge".into();
        assert_eq!(spec(&request).unwrap(), (8.0, 16.0));
        request.instance_type = "m5.large".into();
        assert_eq!(
            spec(&request).unwrap_err().code,
            "InvalidParameter.InstanceType"
        );

        let mut request = mk_request();
        request.container[0].cpu = Some(100.0);
        assert!(spec(&request).is_err());
    }

    #[test]
    fn limits_and_tokens() {
        assert_eq!(limit(None, 20).unwrap(), 20);
        assert_eq!(limit(Some(5), 20).unwrap(), 5);
        assert_eq!(
            limit(Some(21), 20).unwrap_err().code,
            "InvalidParameter.Limit"
        );
        assert!(limit(Some(0), 20).is_err());
        assert!(next_token("garbage").is_err());
        assert_eq!(next_token("").unwrap(), None);
        let many: Vec<String> = (0..21).map(|i| i.to_string()).collect();
        assert!(ids(&many).is_err());
    }
}
