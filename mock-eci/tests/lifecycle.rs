//! Group and container lifecycle over real gRPC on loopback, with paused time.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use eci_proto::REQUEST_ID_METADATA_KEY;
use eci_proto::v20180808::{Container, ContainerGroup, DescribeContainerGroupsRequest};

fn container<'a>(group: &'a ContainerGroup, name: &str) -> &'a eci_proto::v20180808::ContainerInfo {
    group
        .containers
        .iter()
        .chain(&group.init_containers)
        .find(|c| c.name == name)
        .expect("container exists")
}

fn state(group: &ContainerGroup, name: &str) -> (String, String) {
    let current = container(group, name)
        .current_state
        .clone()
        .unwrap_or_default();
    (current.state, current.reason)
}

#[tokio::test(start_paused = true)]
async fn new_group_goes_pending_scheduling_running() {
    let mut h = start(&[]).await;
    let response = h
        .client
        .create_container_group(mk_request("web-0"))
        .await
        .unwrap();
    let request_id = response
        .metadata()
        .get(REQUEST_ID_METADATA_KEY)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let body = response.into_inner();
    assert_eq!(body.request_id, request_id);
    assert!(
        body.container_group_id.starts_with("eci-"),
        "{}",
        body.container_group_id
    );
    let id = body.container_group_id;

    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Pending");
    assert_eq!(group.intranet_ip, "");
    assert_eq!(state(&group, "app").0, "Waiting");

    sleep(0.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Scheduling");
    assert_eq!(group.intranet_ip, "192.168.0.2");

    sleep(2.0).await;
    assert_eq!(
        h.status(&id).await,
        "Scheduling",
        "still provisioning before 3 s"
    );

    sleep(0.6).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Running");
    assert_eq!((group.cpu, group.memory), (2.0, 4.0), "default spec");
    let app = container(&group, "app");
    assert!(app.ready && app.started);
    assert_eq!(app.current_state.as_ref().unwrap().state, "Running");
    assert_eq!(app.container_id.len(), 64);
    assert!(group.events.iter().any(|e| e.reason == "Scheduled"));
    assert!(
        group
            .events
            .iter()
            .any(|e| e.reason == "Started" && e.message.contains("app"))
    );
    assert_eq!(group.zone_id, "cn-hangzhou-k");
    assert_eq!(group.tags, vec![tag("cluster", "c1")]);
}

#[tokio::test(start_paused = true)]
async fn readiness_follows_the_probe_delay_or_never() {
    let mut h = start(&[]).await;
    let mut request = mk_request("ready");
    request.container = vec![
        mk_container("slow", vec![env("MOCK_ECI_READY_AFTER", "5s")]),
        mk_container("broken", vec![env("MOCK_ECI_READINESS", "fail")]),
    ];
    let id = h.create(request).await;
    sleep(3.1).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Running");
    assert!(!container(&group, "slow").ready);
    sleep(5.0).await;
    let group = h.get(&id).await.unwrap();
    assert!(container(&group, "slow").ready);
    assert!(!container(&group, "broken").ready);
}

fn exiting(code: &str, after: &str) -> Vec<Container> {
    vec![mk_container(
        "job",
        vec![
            env("MOCK_ECI_EXIT_CODE", code),
            env("MOCK_ECI_EXIT_AFTER", after),
        ],
    )]
}

#[tokio::test(start_paused = true)]
async fn restart_policy_never_ends_the_group() {
    let mut h = start(&[]).await;
    let mut ok = mk_request("never-ok");
    ok.restart_policy = "Never".into();
    ok.container = exiting("0", "2s");
    let ok = h.create(ok).await;
    let mut failing = mk_request("never-fail");
    failing.restart_policy = "Never".into();
    failing.container = exiting("3", "2s");
    let failing = h.create(failing).await;

    sleep(4.0).await;
    assert_eq!(h.status(&ok).await, "Running");
    sleep(1.1).await;
    let group = h.get(&ok).await.unwrap();
    assert_eq!(group.status, "Succeeded");
    assert!(!group.succeeded_time.is_empty());
    let job = container(&group, "job").current_state.clone().unwrap();
    assert_eq!(
        (job.state.as_str(), job.exit_code, job.reason.as_str()),
        ("Terminated", Some(0), "Completed")
    );

    let group = h.get(&failing).await.unwrap();
    assert_eq!(group.status, "Failed");
    assert!(!group.failed_time.is_empty());
    let job = container(&group, "job").current_state.clone().unwrap();
    assert_eq!((job.exit_code, job.reason.as_str()), (Some(3), "Error"));
    assert_eq!(container(&group, "job").restart_count, 0);
}

#[tokio::test(start_paused = true)]
async fn a_declared_sidecar_does_not_hold_a_job_and_its_exit_code_can_be_ignored() {
    let mut h = start(&[]).await;
    let sidecar = |ignore: bool| {
        let mut vars = vec![env("ECI_CONTAINER_TYPE", "sidecar")];
        if ignore {
            vars.push(env("ECI_CONTAINER_IGNORE_EXIT_CODE", "true"));
        }
        mk_container("logs", vars)
    };
    let mut ignored = mk_request("job-with-sidecar");
    ignored.restart_policy = "Never".into();
    ignored.container = exiting("0", "2s");
    ignored.container.push(sidecar(true));
    let ignored = h.create(ignored).await;
    let mut counted = mk_request("job-with-counted-sidecar");
    counted.restart_policy = "Never".into();
    counted.container = exiting("0", "2s");
    counted.container.push(sidecar(false));
    let counted = h.create(counted).await;

    sleep(4.0).await;
    assert_eq!(
        h.status(&ignored).await,
        "Running",
        "the sidecar runs beside the job"
    );
    sleep(1.1).await;
    // The job ended: ECI stops the sidecar, and its exit code is ignored.
    let group = h.get(&ignored).await.unwrap();
    assert_eq!(group.status, "Succeeded");
    let logs = container(&group, "logs").current_state.clone().unwrap();
    assert_eq!(
        (logs.state.as_str(), logs.exit_code, logs.reason.as_str()),
        ("Terminated", Some(0), "Completed")
    );
    assert!(
        group
            .events
            .iter()
            .any(|e| e.reason == "Killing" && e.message.contains("sidecar container logs"))
    );
    // Without ECI_CONTAINER_IGNORE_EXIT_CODE the stopped sidecar's 137 fails the group.
    let group = h.get(&counted).await.unwrap();
    assert_eq!(group.status, "Failed");
    let logs = container(&group, "logs").current_state.clone().unwrap();
    assert_eq!((logs.exit_code, logs.reason.as_str()), (Some(137), "Error"));
}

#[tokio::test(start_paused = true)]
async fn restart_policy_on_failure_restarts_only_failures() {
    let mut h = start(&["--restart-backoff", "10s"]).await;
    let mut ok = mk_request("onfailure-ok");
    ok.restart_policy = "OnFailure".into();
    ok.container = exiting("0", "1s");
    let ok = h.create(ok).await;
    let mut failing = mk_request("onfailure-fail");
    failing.restart_policy = "OnFailure".into();
    failing.container = exiting("1", "1s");
    let failing = h.create(failing).await;

    sleep(4.5).await; // running at 3 s, exited at 4 s
    assert_eq!(h.status(&ok).await, "Succeeded");
    let group = h.get(&failing).await.unwrap();
    assert_eq!(group.status, "Running");
    let job = container(&group, "job");
    assert_eq!(
        state(&group, "job"),
        ("Waiting".into(), "CrashLoopBackOff".into())
    );
    assert_eq!(job.previous_state.as_ref().unwrap().exit_code, Some(1));
    assert_eq!(job.restart_count, 0);
    assert!(group.events.iter().any(|e| e.reason == "BackOff"));

    sleep(10.0).await; // back-off of 10 s ends at 14 s
    let group = h.get(&failing).await.unwrap();
    assert_eq!(state(&group, "job").0, "Running");
    assert_eq!(container(&group, "job").restart_count, 1);

    sleep(1.0).await; // second run exits at 15 s, back-off doubles to 20 s
    let group = h.get(&failing).await.unwrap();
    assert_eq!(state(&group, "job").1, "CrashLoopBackOff");
    sleep(19.0).await;
    assert_eq!(
        state(&h.get(&failing).await.unwrap(), "job").1,
        "CrashLoopBackOff"
    );
    sleep(1.5).await;
    assert_eq!(
        container(&h.get(&failing).await.unwrap(), "job").restart_count,
        2
    );
}

#[tokio::test(start_paused = true)]
async fn restart_policy_always_restarts_even_success_and_exit_runs_limits_it() {
    let mut h = start(&["--restart-backoff", "2s"]).await;
    let mut request = mk_request("always");
    request.container = vec![mk_container(
        "job",
        vec![
            env("MOCK_ECI_EXIT_CODE", "0"),
            env("MOCK_ECI_EXIT_AFTER", "1s"),
            env("MOCK_ECI_EXIT_RUNS", "1"),
        ],
    )];
    let id = h.create(request).await;
    sleep(4.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Running");
    assert_eq!(state(&group, "job").1, "CrashLoopBackOff");
    sleep(2.0).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(state(&group, "job").0, "Running");
    assert_eq!(container(&group, "job").restart_count, 1);
    let previous = container(&group, "job").previous_state.clone().unwrap();
    assert_eq!(
        (previous.state.as_str(), previous.exit_code),
        ("Terminated", Some(0))
    );
    sleep(60.0).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(
        state(&group, "job").0,
        "Running",
        "only the first run exits"
    );
    assert_eq!(container(&group, "job").restart_count, 1);
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_first_in_order() {
    let mut h = start(&["--init-container-duration", "2s"]).await;
    let mut request = mk_request("with-init");
    request.init_container = vec![
        mk_container("init-a", Vec::new()),
        mk_container("init-b", Vec::new()),
    ];
    let id = h.create(request).await;

    sleep(3.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Pending", "Pending while init containers run");
    assert_eq!(state(&group, "init-a").0, "Running");
    assert_eq!(state(&group, "init-b").0, "Waiting");
    assert_eq!(state(&group, "app").0, "Waiting");

    sleep(2.0).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(
        state(&group, "init-a"),
        ("Terminated".into(), "Completed".into())
    );
    assert_eq!(state(&group, "init-b").0, "Running");

    sleep(2.0).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Running");
    assert_eq!(state(&group, "init-b").0, "Terminated");
    assert_eq!(state(&group, "app").0, "Running");
    let init_a_end = container(&group, "init-a")
        .current_state
        .clone()
        .unwrap()
        .finish_time;
    let init_b_start = container(&group, "init-b")
        .current_state
        .clone()
        .unwrap()
        .start_time;
    assert_eq!(init_a_end, init_b_start);
}

#[tokio::test(start_paused = true)]
async fn failed_init_container_fails_the_group_under_never() {
    let mut h = start(&[]).await;
    let mut request = mk_request("init-fails");
    request.restart_policy = "Never".into();
    request.init_container = vec![mk_container(
        "migrate",
        vec![env("MOCK_ECI_EXIT_CODE", "2")],
    )];
    let id = h.create(request).await;
    // Init containers run --init-container-duration (1 s) unless told otherwise.
    sleep(3.5).await;
    assert_eq!(h.status(&id).await, "Pending");
    sleep(1.0).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Failed");
    assert_eq!(
        state(&group, "migrate"),
        ("Terminated".into(), "Error".into())
    );
    assert_eq!(state(&group, "app").0, "Waiting", "containers never start");
}

#[tokio::test(start_paused = true)]
async fn image_pull_failure_keeps_the_group_pending() {
    let mut h = start(&[]).await;
    let mut request = mk_request("pull");
    request.container[0].image = "pull-fail.mock-eci.invalid/app:1".into();
    let id = h.create(request).await;
    sleep(3.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Pending");
    assert_eq!(
        state(&group, "app"),
        ("Waiting".into(), "ErrImagePull".into())
    );
    sleep(5.0).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(state(&group, "app").1, "ImagePullBackOff");
    assert!(
        group
            .events
            .iter()
            .any(|e| e.r#type == "Warning" && e.reason == "Failed")
    );
}

#[tokio::test(start_paused = true)]
async fn active_deadline_fails_the_group() {
    let mut h = start(&[]).await;
    let mut request = mk_request("deadline");
    request.active_deadline_seconds = Some(10);
    let id = h.create(request).await;
    sleep(9.0).await;
    assert_eq!(h.status(&id).await, "Running");
    sleep(1.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Failed");
    assert!(group.events.iter().any(|e| e.reason == "DeadlineExceeded"));
}

#[tokio::test(start_paused = true)]
async fn ip_exhaustion_and_no_stock_end_in_schedule_failed() {
    // A /29 has 5 usable addresses (network, gateway and broadcast excluded).
    let mut h = start(&["--ip-cidr", "10.1.0.0/29"]).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(h.create(mk_request(&format!("ip-{i}"))).await);
    }
    sleep(3.5).await;
    for id in &ids[..5] {
        assert_eq!(h.status(id).await, "Running");
    }
    let failed = h.get(&ids[5]).await.unwrap();
    assert_eq!(failed.status, "ScheduleFailed");
    assert_eq!(failed.intranet_ip, "");
    let event = failed
        .events
        .iter()
        .find(|e| e.r#type == "Warning")
        .unwrap();
    assert_eq!(event.reason, "VSwitchIpNotEnough");
    assert!(
        event.message.contains("no free IP address"),
        "{}",
        event.message
    );

    // Deleting a group frees its address for the next one.
    h.client
        .delete_container_group(eci_proto::v20180808::DeleteContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: ids[0].clone(),
            force: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let next = h.create(mk_request("ip-next")).await;
    sleep(3.5).await;
    assert_eq!(h.status(&next).await, "Running");

    h.server
        .mock()
        .patch_controls(&serde_json::from_str(r#"{"no_stock": true}"#).unwrap())
        .unwrap();
    let starved = h.create(mk_request("no-stock")).await;
    sleep(1.0).await;
    let group = h.get(&starved).await.unwrap();
    assert_eq!(group.status, "ScheduleFailed");
    assert!(group.events.iter().any(|e| e.reason == "NoStock"));
}

#[tokio::test(start_paused = true)]
async fn max_groups_caps_capacity() {
    let mut h = start(&["--max-groups", "2"]).await;
    let a = h.create(mk_request("cap-a")).await;
    let b = h.create(mk_request("cap-b")).await;
    let c = h.create(mk_request("cap-c")).await;
    sleep(3.5).await;
    assert_eq!(h.status(&a).await, "Running");
    assert_eq!(h.status(&b).await, "Running");
    let group = h.get(&c).await.unwrap();
    assert_eq!(group.status, "ScheduleFailed");
    assert!(group.events.iter().any(|e| e.reason == "QuotaExceeded"));
}

#[tokio::test(start_paused = true)]
async fn group_spec_is_matched_from_containers() {
    let mut h = start(&[]).await;
    let mut request = mk_request("sized");
    request.container[0].cpu = Some(0.6);
    request.container[0].memory = Some(1.5);
    let id = h.create(request).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(
        (group.cpu, group.memory),
        (1.0, 2.0),
        "rounded up to the smallest spec that fits"
    );
    assert_eq!(group.containers[0].cpu, 0.6);
}

#[tokio::test(start_paused = true)]
async fn restart_and_update_actions() {
    let mut h = start(&[]).await;
    let id = h.create(mk_request("restartable")).await;
    let error = h
        .client
        .restart_container_group(eci_proto::v20180808::RestartContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        eci_proto::EciError::from_status(&error).code,
        "IncorrectStatus"
    );

    sleep(3.5).await;
    h.client
        .restart_container_group(eci_proto::v20180808::RestartContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(h.status(&id).await, "Restarting");
    sleep(1.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Running");
    assert_eq!(container(&group, "app").restart_count, 1);

    let mut updated = mk_container("app", Vec::new());
    updated.image = "registry.example.com/app:2".into();
    h.client
        .update_container_group(eci_proto::v20180808::UpdateContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: id.clone(),
            tag: vec![tag("cluster", "c1"), tag("version", "2")],
            container: vec![updated],
            update_type: "IncrementalUpdate".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(h.status(&id).await, "Updating");
    sleep(1.5).await;
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Running");
    assert_eq!(group.containers[0].image, "registry.example.com/app:2");
    assert_eq!(group.tags.len(), 2);
    assert_eq!(container(&group, "app").restart_count, 2);
}

/// A `ConfigFileVolume` with one file (`content` base64-encoded as the API wants it).
fn config_file_volume(name: &str, path: &str, content: &str) -> eci_proto::v20180808::Volume {
    use base64::Engine as _;
    eci_proto::v20180808::Volume {
        name: name.into(),
        r#type: "ConfigFileVolume".into(),
        config_file_volume: Some(eci_proto::v20180808::ConfigFileVolume {
            config_file_to_path: vec![eci_proto::v20180808::ConfigFileToPath {
                path: path.into(),
                content: base64::engine::general_purpose::STANDARD.encode(content),
                mode: None,
            }],
            default_mode: None,
        }),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn updating_config_file_contents_rewrites_them_in_place() {
    let mut h = start(&[]).await;
    let mut request = mk_request("tokens");
    request.volume = vec![
        config_file_volume("token", "token", "first"),
        config_file_volume("config", "app.yaml", "debug: false"),
    ];
    let id = h.create(request).await;
    sleep(3.5).await;
    let before = h.get(&id).await.unwrap();
    assert_eq!(before.status, "Running");
    let started = container(&before, "app")
        .current_state
        .clone()
        .unwrap()
        .start_time;
    let update = |volume: Vec<eci_proto::v20180808::Volume>, update_type: &str| {
        eci_proto::v20180808::UpdateContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: id.clone(),
            volume,
            update_type: update_type.into(),
            ..Default::default()
        }
    };

    // IncrementalUpdate matches volumes by name; an unknown one is refused.
    let error = h
        .client
        .update_container_group(update(
            vec![config_file_volume("nope", "token", "x")],
            "IncrementalUpdate",
        ))
        .await
        .unwrap_err();
    assert_eq!(
        eci_proto::EciError::from_status(&error).code,
        "InvalidParameter.Volume.Name"
    );

    h.client
        .update_container_group(update(
            vec![config_file_volume("token", "token", "second")],
            "IncrementalUpdate",
        ))
        .await
        .unwrap();
    let during = h.get(&id).await.unwrap();
    assert_eq!(
        during.status, "Updating",
        "the API says an update turns the group Updating"
    );
    assert_eq!(during.volumes.len(), 2, "the other volume is kept");
    assert_eq!(
        during.volumes[0],
        config_file_volume("token", "token", "second")
    );
    assert_eq!(
        during.volumes[1],
        config_file_volume("config", "app.yaml", "debug: false")
    );
    assert!(during.events.iter().any(|e| e.reason == "VolumesUpdated"));
    sleep(1.5).await;
    let after = h.get(&id).await.unwrap();
    assert_eq!(after.status, "Running");
    let app = container(&after, "app");
    assert_eq!(
        app.restart_count, 0,
        "no container was restarted for new files"
    );
    assert!(app.ready);
    assert_eq!(app.current_state.clone().unwrap().start_time, started);

    // Anything else about the volumes (here: a type) replaces the containers, as before.
    let mut empty = config_file_volume("config", "", "");
    empty.r#type = "EmptyDirVolume".into();
    empty.config_file_volume = None;
    empty.empty_dir_volume = Some(eci_proto::v20180808::EmptyDirVolume::default());
    h.client
        .update_container_group(update(vec![empty], "IncrementalUpdate"))
        .await
        .unwrap();
    sleep(1.5).await;
    let replaced = h.get(&id).await.unwrap();
    assert_eq!(replaced.status, "Running");
    assert_eq!(container(&replaced, "app").restart_count, 1);
}

#[tokio::test(start_paused = true)]
async fn describe_filters_by_status_name_and_tags() {
    let mut h = start(&[]).await;
    let mut other = mk_request("other-node");
    other.tag = vec![tag("cluster", "c1"), tag("node", "vn-1")];
    h.create(other).await;
    let mut mine = mk_request("this-node");
    mine.tag = vec![tag("cluster", "c1"), tag("node", "vn-0")];
    let mine = h.create(mine).await;
    let list = |request: DescribeContainerGroupsRequest| {
        let mut client = h.client.clone();
        async move {
            client
                .describe_container_groups(request)
                .await
                .unwrap()
                .into_inner()
        }
    };
    let by_tag = list(DescribeContainerGroupsRequest {
        region_id: REGION.into(),
        tag: vec![tag("node", "vn-0")],
        ..Default::default()
    })
    .await;
    assert_eq!(by_tag.total_count, 1);
    assert_eq!(by_tag.container_groups[0].container_group_id, mine);
    let by_name = list(DescribeContainerGroupsRequest {
        region_id: REGION.into(),
        container_group_name: "other-node".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_name.total_count, 1);
    let running = list(DescribeContainerGroupsRequest {
        region_id: REGION.into(),
        status: "Running".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(running.total_count, 0);
    assert!(
        by_tag.container_groups[0].events.is_empty(),
        "events only WithEvent"
    );
}
