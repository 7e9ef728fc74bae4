//! Groups as the API shows them: [`Group`] → `ContainerGroup` / `ContainerGroupStatus`.

use std::net::Ipv4Addr;

use eci_proto::v20180808::{
    ContainerGroup, ContainerGroupStatus, ContainerInfo, ContainerState, Event, Tag,
};

use crate::clock::{Millis, rfc3339, rfc3339_millis};
use crate::engine::group::{ContainerRun, Group, GroupEvent, RunState, Which};
use crate::rng;
use crate::settings::Settings;

fn time(at: Option<Millis>) -> String {
    at.map(rfc3339).unwrap_or_default()
}

/// The full view DescribeContainerGroups returns.
pub fn container_group(group: &Group, settings: &Settings, with_events: bool) -> ContainerGroup {
    let request = &group.request;
    ContainerGroup {
        container_group_id: group.id.clone(),
        container_group_name: request.container_group_name.clone(),
        region_id: request.region_id.clone(),
        zone_id: group.zone(settings).to_owned(),
        v_switch_id: group.vswitch().to_owned(),
        security_group_id: request.security_group_id.clone(),
        status: group.status.as_str().to_owned(),
        intranet_ip: ip(group),
        internet_ip: public_ip(group),
        creation_time: rfc3339(group.created_at),
        succeeded_time: time(group.succeeded_at),
        failed_time: time(group.failed_at),
        expired_time: time(group.expired_at),
        restart_policy: group.restart_policy.as_str().to_owned(),
        instance_type: request
            .instance_type
            .split(',')
            .next()
            .unwrap_or_default()
            .to_owned(),
        cpu: group.cpu,
        memory: group.memory,
        tags: request.tag.clone(),
        events: if with_events {
            events(group)
        } else {
            Vec::new()
        },
        containers: containers(group, Which::Regular, View::Full),
        init_containers: containers(group, Which::Init, View::Full),
        volumes: request.volume.clone(),
        dns_config: request.dns_config.clone(),
        host_aliases: request.host_aliase.clone(),
        spot_strategy: if request.spot_strategy.is_empty() {
            "NoSpot".into()
        } else {
            request.spot_strategy.clone()
        },
        ram_role_name: request.ram_role_name.clone(),
        resource_group_id: request.resource_group_id.clone(),
        eci_security_context: request.security_context.clone(),
        // Stable per group, in the service's id formats.
        eni_instance_id: format!("eni-{:016x}", rng::stable_hash(group.id.as_bytes())),
        vpc_id: format!("vpc-{}", settings.region),
        ephemeral_storage: request.ephemeral_storage,
    }
}

/// The status view DescribeContainerGroupStatus returns.
pub fn container_group_status(group: &Group) -> ContainerGroupStatus {
    ContainerGroupStatus {
        container_group_id: group.id.clone(),
        container_group_name: group.request.container_group_name.clone(),
        status: group.status.as_str().to_owned(),
        intranet_ip: ip(group),
        creation_time: rfc3339(group.created_at),
        succeeded_time: time(group.succeeded_at),
        failed_time: time(group.failed_at),
        tags: group.request.tag.clone(),
        containers: containers(group, Which::Regular, View::StateOnly),
        init_containers: containers(group, Which::Init, View::StateOnly),
        events: events(group),
        status_change_time: rfc3339_millis(group.changed_at),
    }
}

/// The EIP address of a group created with one (`AutoCreateEip`, or an `EipInstanceId` to
/// bind): the service allocates or binds it with the group, so it shows from creation on.
/// Stable per group, in a public range.
fn public_ip(group: &Group) -> String {
    let request = &group.request;
    if !request.auto_create_eip && request.eip_instance_id.is_empty() {
        return String::new();
    }
    let [.., a, b, c] = rng::stable_hash(group.id.as_bytes()).to_be_bytes();
    Ipv4Addr::new(47, a, b, c.max(1)).to_string()
}

fn ip(group: &Group) -> String {
    group.ip.map(|ip| ip.to_string()).unwrap_or_default()
}

fn events(group: &Group) -> Vec<Event> {
    let name = format!("pod.{}", group.request.container_group_name);
    group
        .events
        .iter()
        .map(|event| render_event(event, &name))
        .collect()
}

fn render_event(event: &GroupEvent, name: &str) -> Event {
    Event {
        count: event.count,
        r#type: event.kind.clone(),
        name: name.to_owned(),
        reason: event.reason.clone(),
        message: event.message.clone(),
        first_timestamp: rfc3339(event.first),
        last_timestamp: rfc3339(event.last),
    }
}

/// How much of a container to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// Spec and state (DescribeContainerGroups).
    Full,
    /// State only (DescribeContainerGroupStatus, the hot polling path).
    StateOnly,
}

fn containers(group: &Group, which: Which, view: View) -> Vec<ContainerInfo> {
    group
        .specs(which)
        .iter()
        .zip(group.runs(which))
        .map(|(spec, run)| {
            let mut info = ContainerInfo {
                name: spec.name.clone(),
                image: spec.image.clone(),
                cpu: spec.cpu.unwrap_or(0.0),
                memory: spec.memory.unwrap_or(0.0),
                gpu: spec.gpu.unwrap_or(0),
                ready: run.ready,
                restart_count: i32::try_from(run.restart_count).unwrap_or(i32::MAX),
                current_state: Some(state(&run.state)),
                previous_state: run.previous.as_ref().map(state),
                started: run.started && run.state.is_running(),
                container_id: container_id(group, &spec.name, run),
                ..ContainerInfo::default()
            };
            if view == View::Full {
                info.commands.clone_from(&spec.command);
                info.args.clone_from(&spec.arg);
                info.working_dir.clone_from(&spec.working_dir);
                info.image_pull_policy.clone_from(&spec.image_pull_policy);
                info.environment_vars.clone_from(&spec.environment_var);
                info.ports.clone_from(&spec.port);
                info.volume_mounts.clone_from(&spec.volume_mount);
                info.readiness_probe.clone_from(&spec.readiness_probe);
                info.liveness_probe.clone_from(&spec.liveness_probe);
                info.security_context.clone_from(&spec.security_context);
                info.stdin = spec.stdin;
                info.stdin_once = spec.stdin_once;
                info.tty = spec.tty;
            }
            info
        })
        .collect()
}

/// A stable 64-hex runtime id per container run, empty before the first start.
fn container_id(group: &Group, name: &str, run: &ContainerRun) -> String {
    if run.state.started_at().is_none() && run.previous.is_none() {
        return String::new();
    }
    let key = format!("{}/{name}/{}", group.id, run.restart_count);
    let mut out = String::with_capacity(64);
    let mut value = rng::stable_hash(key.as_bytes());
    for _ in 0..4 {
        out.push_str(&format!("{value:016x}"));
        value = rng::mix(value);
    }
    out
}

/// A run state as the API shows it.
pub fn state(state: &RunState) -> ContainerState {
    match state {
        RunState::Waiting { reason, message } => ContainerState {
            state: "Waiting".into(),
            detail_status: reason.clone(),
            reason: reason.clone(),
            message: message.clone(),
            ..ContainerState::default()
        },
        RunState::Running { started_at } => ContainerState {
            state: "Running".into(),
            detail_status: "Running".into(),
            start_time: rfc3339(*started_at),
            ..ContainerState::default()
        },
        RunState::Terminated {
            exit_code,
            reason,
            message,
            signal,
            started_at,
            finished_at,
        } => ContainerState {
            state: "Terminated".into(),
            detail_status: reason.clone(),
            exit_code: Some(*exit_code),
            reason: reason.clone(),
            message: message.clone(),
            signal: *signal,
            start_time: rfc3339(*started_at),
            finish_time: rfc3339(*finished_at),
        },
    }
}

/// Whether every tag in `filter` is on the group with the same value.
pub fn has_tags(group_tags: &[Tag], filter: &[Tag]) -> bool {
    filter.iter().all(|wanted| {
        group_tags
            .iter()
            .any(|tag| tag.key == wanted.key && tag.value == wanted.value)
    })
}
