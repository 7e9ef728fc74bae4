//! API semantics over real gRPC on loopback: idempotency, validation, throttling, polling,
//! paging, deletion, retention, logs, exec, metrics, persistence, the admin endpoint.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use clap::Parser;
use common::*;
use eci_proto::v20180808::{
    DeleteContainerGroupRequest, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupStatusRequest, DescribeContainerGroupsRequest,
    DescribeContainerLogRequest, DescribeMultiContainerGroupMetricRequest,
    ExecContainerCommandRequest,
};
use eci_proto::{ERROR_CODE_METADATA_KEY, EciError, REQUEST_ID_METADATA_KEY};
use mock_eci::MockConfig;
use tonic::Code;

#[tokio::test(start_paused = true)]
async fn client_token_makes_create_idempotent() {
    let mut h = start(&[]).await;
    let mut request = mk_request("idem");
    request.client_token = "pod-uid-1".into();
    let first = h.create(request.clone()).await;
    let second = h.create(request.clone()).await;
    assert_eq!(first, second);
    assert_eq!(h.server.mock().group_count(), 1);

    request.container[0].image = "registry.example.com/app:2".into();
    let error = h.try_create(request).await.unwrap_err();
    assert_eq!(error.code, "IdempotentParameterMismatch");
    assert!(error.message.contains(&first), "{}", error.message);
    assert_eq!(h.server.mock().group_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn validation_errors_carry_code_message_and_request_id() {
    let mut h = start(&[]).await;
    let status = h
        .client
        .create_container_group(mk_request("Bad_Name"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status
            .metadata()
            .get(ERROR_CODE_METADATA_KEY)
            .unwrap()
            .to_str()
            .unwrap(),
        "InvalidParameter.ContainerGroupName"
    );
    assert!(
        !status
            .metadata()
            .get(REQUEST_ID_METADATA_KEY)
            .unwrap()
            .is_empty()
    );
    assert!(
        status.message().contains("\"Bad_Name\""),
        "{}",
        status.message()
    );

    let mut no_sg = mk_request("no-sg");
    no_sg.security_group_id.clear();
    let error = h.try_create(no_sg).await.unwrap_err();
    assert_eq!(error.code, "MissingParameter");
    assert!(error.message.contains("SecurityGroupId"));

    let mut many_tags = mk_request("tags");
    many_tags.tag = (0..21).map(|i| tag(&format!("k{i}"), "v")).collect();
    assert_eq!(
        h.try_create(many_tags).await.unwrap_err().code,
        "InvalidParameter.Tag"
    );

    let mut wrong_region = mk_request("region");
    wrong_region.region_id = "us-west-1".into();
    let status = h
        .client
        .create_container_group(wrong_region)
        .await
        .unwrap_err();
    assert_eq!(
        EciError::from_status(&status).code,
        "InvalidRegionId.NotFound"
    );
    assert_eq!(status.code(), Code::NotFound);

    let mut dry = mk_request("dry");
    dry.dry_run = true;
    assert_eq!(h.try_create(dry).await.unwrap_err().code, "DryRun.Success");
    assert_eq!(h.server.mock().group_count(), 0, "nothing was created");

    let error = h
        .client
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: REGION.into(),
            limit: Some(21),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(EciError::from_status(&error).code, "InvalidParameter.Limit");
    let error = h
        .client
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: REGION.into(),
            container_group_ids: (0..21).map(|i| format!("eci-{i}")).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        EciError::from_status(&error).code,
        "InvalidParameter.ContainerGroupIds"
    );
    let error = h
        .client
        .delete_container_group(DeleteContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: "eci-missing".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound);
    assert_eq!(
        EciError::from_status(&error).code,
        "InvalidContainerGroup.NotFound"
    );
}

#[tokio::test(start_paused = true)]
async fn throttling_per_action_with_refill() {
    let mut h = start_with(MockConfig::parse_from([
        "mock-eci",
        "--listen",
        "127.0.0.1:0",
        "--rate-limit",
        "CreateContainerGroup=60/2",
    ]))
    .await;
    h.create(mk_request("t-1")).await;
    h.create(mk_request("t-2")).await;
    let status = h
        .client
        .create_container_group(mk_request("t-3"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let error = EciError::from_status(&status);
    assert_eq!(error.code, "Throttling.User");
    assert!(error.is_retryable());
    // Other actions have their own budget.
    assert!(h.get("eci-none").await.is_none());
    sleep(1.0).await; // 60 per minute: one token per second
    h.create(mk_request("t-3")).await;
    assert_eq!(h.server.mock().group_count(), 3);
}

async fn status_page(
    h: &mut Harness,
    request: DescribeContainerGroupStatusRequest,
) -> eci_proto::v20180808::DescribeContainerGroupStatusResponse {
    h.client
        .describe_container_group_status(request)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(start_paused = true)]
async fn since_second_returns_only_recent_changes() {
    let mut h = start(&[]).await;
    let old = h.create(mk_request("old")).await;
    sleep(10.0).await; // `old` has been Running since 3 s
    let new = h.create(mk_request("new")).await;
    sleep(1.0).await; // `new` went Scheduling at 10.2 s

    let recent = status_page(
        &mut h,
        DescribeContainerGroupStatusRequest {
            region_id: REGION.into(),
            since_second: Some(5),
            ..Default::default()
        },
    )
    .await;
    let ids: Vec<&str> = recent
        .data
        .iter()
        .map(|s| s.container_group_id.as_str())
        .collect();
    assert_eq!(ids, vec![new.as_str()]);
    assert_eq!(recent.data[0].status, "Scheduling");
    assert!(!recent.data[0].status_change_time.is_empty());

    let all = status_page(
        &mut h,
        DescribeContainerGroupStatusRequest {
            region_id: REGION.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(all.total_count, 2);

    // A container exit without a group status change still counts as a change.
    let mut exiting = mk_request("exiting");
    exiting.container = vec![mk_container(
        "job",
        vec![
            env("MOCK_ECI_EXIT_CODE", "1"),
            env("MOCK_ECI_EXIT_AFTER", "10s"),
        ],
    )];
    let exiting = h.create(exiting).await;
    sleep(12.0).await;
    let quiet = status_page(
        &mut h,
        DescribeContainerGroupStatusRequest {
            region_id: REGION.into(),
            since_second: Some(2),
            ..Default::default()
        },
    )
    .await;
    assert!(quiet.data.is_empty(), "{:?}", quiet.data);
    sleep(2.0).await; // exit at 24 s + back-off event
    let changed = status_page(
        &mut h,
        DescribeContainerGroupStatusRequest {
            region_id: REGION.into(),
            since_second: Some(2),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(changed.data.len(), 1);
    assert_eq!(changed.data[0].container_group_id, exiting);
    assert_eq!(changed.data[0].status, "Running");
    assert_eq!(
        changed.data[0].containers[0]
            .current_state
            .as_ref()
            .unwrap()
            .reason,
        "CrashLoopBackOff"
    );
    let _ = old;
}

#[tokio::test(start_paused = true)]
async fn paging_covers_every_group_exactly_once() {
    let mut h = start(&[]).await;
    let mut created = BTreeSet::new();
    for i in 0..45 {
        let mut request = mk_request(&format!("page-{i}"));
        if i % 3 == 0 {
            request.tag.push(tag("node", "vn-0"));
        }
        created.insert(h.create(request).await);
    }
    let mut seen = BTreeSet::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = h
            .client
            .describe_container_groups(DescribeContainerGroupsRequest {
                region_id: REGION.into(),
                next_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.total_count, 45);
        assert!(page.container_groups.len() <= 20);
        for group in page.container_groups {
            assert!(
                seen.insert(group.container_group_id),
                "a group appeared twice"
            );
        }
        pages += 1;
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created);

    let mut tagged = 0;
    let mut token = String::new();
    loop {
        let page = status_page(
            &mut h,
            DescribeContainerGroupStatusRequest {
                region_id: REGION.into(),
                tag: vec![tag("node", "vn-0")],
                limit: Some(4),
                next_token: token.clone(),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(page.total_count, 15);
        tagged += page.data.len();
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(tagged, 15);
}

async fn delete(h: &mut Harness, id: &str, force: bool) {
    h.client
        .delete_container_group(DeleteContainerGroupRequest {
            region_id: REGION.into(),
            container_group_id: id.to_owned(),
            force,
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn containers_can_be_told_to_exit_at_sigterm_unless_they_say_otherwise() {
    let mut h = start(&["--stop-after-sigterm", "0s"]).await;
    let prompt = h.create(mk_request("prompt")).await;
    let mut held = mk_request("held");
    held.container = vec![mk_container("app", vec![env("MOCK_ECI_STOP_AFTER", "5s")])];
    let held = h.create(held).await;
    sleep(3.5).await;
    delete(&mut h, &prompt, false).await;
    delete(&mut h, &held, false).await;
    assert_eq!(h.status(&prompt).await, "<gone>", "it exited at SIGTERM");
    assert_eq!(h.status(&held).await, "Terminating", "its own setting wins");
    sleep(5.1).await;
    assert_eq!(h.status(&held).await, "<gone>");
}

#[tokio::test(start_paused = true)]
async fn graceful_delete_waits_for_the_grace_period_and_force_skips_it() {
    let mut h = start(&["--max-grace-period", "60s"]).await;
    let mut graceful = mk_request("graceful");
    graceful.termination_grace_period_seconds = Some(10);
    let graceful = h.create(graceful).await;
    let mut quick = mk_request("quick");
    quick.container = vec![mk_container("app", vec![env("MOCK_ECI_STOP_AFTER", "2s")])];
    let quick = h.create(quick).await;
    let forced = h.create(mk_request("forced")).await;
    let pending = h.create(mk_request("pending")).await;
    sleep(3.5).await;

    delete(&mut h, &graceful, false).await;
    delete(&mut h, &quick, false).await;
    delete(&mut h, &forced, true).await;
    assert_eq!(h.status(&graceful).await, "Terminating");
    assert!(
        h.get(&graceful)
            .await
            .unwrap()
            .events
            .iter()
            .any(|e| e.reason == "Killing")
    );
    assert_eq!(h.status(&forced).await, "<gone>");
    // Deleting again while terminating is accepted.
    delete(&mut h, &graceful, false).await;

    sleep(2.1).await;
    assert_eq!(
        h.status(&quick).await,
        "<gone>",
        "the container stopped after 2 s"
    );
    assert_eq!(h.status(&graceful).await, "Terminating");
    sleep(7.0).await; // 9.1 s after the delete
    assert_eq!(h.status(&graceful).await, "Terminating");
    sleep(1.0).await;
    assert_eq!(h.status(&graceful).await, "<gone>");

    // The grace period is capped by --max-grace-period.
    let mut long = mk_request("long-grace");
    long.termination_grace_period_seconds = Some(3_600);
    let long = h.create(long).await;
    sleep(3.5).await;
    delete(&mut h, &long, false).await;
    sleep(60.5).await;
    assert_eq!(h.status(&long).await, "<gone>");

    let _ = pending;
}

#[tokio::test(start_paused = true)]
async fn finished_groups_stay_visible_for_the_retention_window() {
    let mut h = start(&["--retention", "10m"]).await;
    let mut request = mk_request("done");
    request.restart_policy = "Never".into();
    request.container = vec![mk_container("job", vec![env("MOCK_ECI_EXIT_AFTER", "1s")])];
    let id = h.create(request).await;
    sleep(4.5).await; // succeeded at 4 s
    assert_eq!(h.status(&id).await, "Succeeded");
    sleep(599.0).await;
    assert_eq!(h.status(&id).await, "Succeeded");
    sleep(1.0).await;
    assert_eq!(h.status(&id).await, "<gone>");
}

async fn log(h: &mut Harness, request: DescribeContainerLogRequest) -> String {
    h.client
        .describe_container_log(request)
        .await
        .unwrap()
        .into_inner()
        .content
}

#[tokio::test(start_paused = true)]
async fn container_logs_honour_every_option() {
    let mut h = start(&["--restart-backoff", "1s"]).await;
    let mut request = mk_request("logs");
    request.container = vec![mk_container(
        "app",
        vec![
            env("MOCK_ECI_EXIT_CODE", "4"),
            env("MOCK_ECI_EXIT_AFTER", "5s"),
            env("MOCK_ECI_EXIT_RUNS", "1"),
        ],
    )];
    let id = h.create(request).await;
    let base = DescribeContainerLogRequest {
        region_id: REGION.into(),
        container_group_id: id.clone(),
        container_name: "app".into(),
        ..Default::default()
    };
    assert_eq!(
        log(&mut h, base.clone()).await,
        "",
        "no log before the container starts"
    );
    sleep(3.0 + 5.0 + 1.0 + 10.5).await; // first run 3–8 s, restarted at 9 s, now 19.5 s

    let all = log(&mut h, base.clone()).await;
    assert!(
        all.starts_with("[app] starting registry.example.com/app:1\n"),
        "{all}"
    );
    assert_eq!(all.lines().count(), 11, "{all}"); // start line + 10 heartbeats
    let tail = log(
        &mut h,
        DescribeContainerLogRequest {
            tail: Some(2),
            ..base.clone()
        },
    )
    .await;
    assert_eq!(tail, "[app] heartbeat 9\n[app] heartbeat 10\n");
    let since = log(
        &mut h,
        DescribeContainerLogRequest {
            since_seconds: Some(3),
            ..base.clone()
        },
    )
    .await;
    assert_eq!(since.lines().count(), 3, "{since}");
    let limited = log(
        &mut h,
        DescribeContainerLogRequest {
            limit_bytes: Some(12),
            ..base.clone()
        },
    )
    .await;
    assert_eq!(limited, "[app] starti");
    let stamped = log(
        &mut h,
        DescribeContainerLogRequest {
            tail: Some(1),
            timestamps: true,
            ..base.clone()
        },
    )
    .await;
    let (stamp, line) = stamped.trim_end().split_once(' ').unwrap();
    assert!(stamp.ends_with('Z') && stamp.contains('T'), "{stamp}");
    assert_eq!(line, "[app] heartbeat 10");
    let previous = log(
        &mut h,
        DescribeContainerLogRequest {
            last_time: true,
            ..base.clone()
        },
    )
    .await;
    assert!(
        previous.ends_with("[app] exited with code 4\n"),
        "{previous}"
    );
    assert_eq!(previous.lines().count(), 6, "{previous}");

    let error = h
        .client
        .describe_container_log(DescribeContainerLogRequest {
            tail: Some(2001),
            ..base.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(EciError::from_status(&error).code, "InvalidParameter.Tail");
    let error = h
        .client
        .describe_container_log(DescribeContainerLogRequest {
            container_name: "nope".into(),
            ..base
        })
        .await
        .unwrap_err();
    assert!(
        error.message().contains("has no container \"nope\""),
        "{}",
        error.message()
    );
}

#[tokio::test(start_paused = true)]
async fn sync_exec_runs_simple_commands() {
    let mut h = start(&[]).await;
    let mut request = mk_request("exec");
    request.container = vec![mk_container("app", vec![env("GREETING", "hello")])];
    let id = h.create(request).await;
    let exec = |command: &[&str]| ExecContainerCommandRequest {
        region_id: REGION.into(),
        container_group_id: id.clone(),
        container_name: "app".into(),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        sync: true,
        ..Default::default()
    };
    let error = h
        .client
        .exec_container_command(exec(&["hostname"]))
        .await
        .unwrap_err();
    assert_eq!(
        EciError::from_status(&error).code,
        "IncorrectStatus",
        "not running yet"
    );
    sleep(3.5).await;
    let out = h
        .client
        .exec_container_command(exec(&["hostname"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.sync_response, "exec\n");
    assert!(out.web_socket_uri.starts_with("wss://"));
    let out = h
        .client
        .exec_container_command(exec(&["sh", "-c", "printenv GREETING"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.sync_response, "hello\n");
    let out = h
        .client
        .exec_container_command(exec(&["ls", "/"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.sync_response, "sh: ls: not found\n");
    let too_long: Vec<&str> = vec!["x"; 21];
    let error = h
        .client
        .exec_container_command(exec(&too_long))
        .await
        .unwrap_err();
    assert_eq!(
        EciError::from_status(&error).code,
        "InvalidParameter.Command"
    );
}

#[tokio::test(start_paused = true)]
async fn metrics_are_plausible_and_deterministic() {
    let mut h = start(&[]).await;
    let id = h.create(mk_request("metrics")).await;
    sleep(3.0 + 600.0).await;
    let request = DescribeContainerGroupMetricRequest {
        region_id: REGION.into(),
        container_group_id: id.clone(),
        ..Default::default()
    };
    let first = h
        .client
        .describe_container_group_metric(request.clone())
        .await
        .unwrap()
        .into_inner();
    let second = h
        .client
        .describe_container_group_metric(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.records, second.records);
    assert!(
        (5..=6).contains(&first.records.len()),
        "{}",
        first.records.len()
    );
    let record = &first.records[0];
    let cpu = record.cpu.as_ref().unwrap();
    assert!(
        cpu.usage_nano_cores > 0 && cpu.usage_nano_cores < 2_000_000_000,
        "{cpu:?}"
    );
    let memory = record.memory.as_ref().unwrap();
    assert!(memory.working_set > 0 && memory.working_set < 4 * 1024 * 1024 * 1024);
    assert_eq!(record.containers.len(), 1);

    let multi = h
        .client
        .describe_multi_container_group_metric(DescribeMultiContainerGroupMetricRequest {
            region_id: REGION.into(),
            container_group_ids: vec![id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(multi.monitor_datas.len(), 1);
    assert_eq!(multi.monitor_datas[0].records.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn state_file_keeps_groups_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let state_arg = state.to_str().unwrap();
    let mut h = start(&["--state-file", state_arg]).await;
    let mut running = mk_request("survivor");
    running.client_token = "token-1".into();
    let running = h.create(running).await;
    let mut crashing = mk_request("crasher");
    crashing.container = vec![mk_container(
        "job",
        vec![
            env("MOCK_ECI_EXIT_CODE", "1"),
            env("MOCK_ECI_EXIT_AFTER", "1s"),
        ],
    )];
    let crashing = h.create(crashing).await;
    sleep(3.5).await;
    let before = h.get(&running).await.unwrap();
    assert_eq!(before.status, "Running");
    h.server.stop().await.unwrap();

    let mut h = start(&["--state-file", state_arg]).await;
    let after = h.get(&running).await.unwrap();
    assert_eq!(after.status, "Running");
    assert_eq!(after.intranet_ip, before.intranet_ip);
    assert_eq!(after.creation_time, before.creation_time);
    // The agenda survived too: the crashing container goes on crashing on schedule.
    sleep(1.0).await;
    let group = h.get(&crashing).await.unwrap();
    assert_eq!(
        group.containers[0].current_state.as_ref().unwrap().reason,
        "CrashLoopBackOff"
    );
    // ClientToken idempotency and unique ids survive.
    let mut again = mk_request("survivor");
    again.client_token = "token-1".into();
    assert_eq!(h.create(again).await, running);
    let fresh = h.create(mk_request("fresh")).await;
    assert!(fresh != running && fresh != crashing);
    sleep(3.5).await;
    assert_ne!(
        h.get(&fresh).await.unwrap().intranet_ip,
        after.intranet_ip,
        "no IP handed out twice"
    );
    h.server.stop().await.unwrap();

    std::fs::write(&state, b"not json").unwrap();
    let config = MockConfig::parse_from([
        "mock-eci",
        "--listen",
        "127.0.0.1:0",
        "--state-file",
        state_arg,
    ]);
    let error = mock_eci::MockServer::start(config).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("not a valid mock-eci state file"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn state_is_written_shortly_after_a_change_without_a_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let mut h = start(&[
        "--state-file",
        state.to_str().unwrap(),
        "--state-flush-interval",
        "100ms",
    ])
    .await;
    let id = h.create(mk_request("flushed")).await;
    sleep(0.2).await;
    // Give the blocking writer a moment of real time.
    for _ in 0..100 {
        if std::fs::read_to_string(&state).is_ok_and(|text| text.contains(&id)) {
            break;
        }
        tokio::task::yield_now().await;
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let snapshot = mock_eci::persist::load(&state)
        .unwrap()
        .expect("state written");
    assert_eq!(snapshot.groups.len(), 1);
    assert_eq!(snapshot.groups[0].id, id);
}

#[tokio::test]
async fn admin_endpoint_switches_outages_and_reports_metrics() {
    let mut h = start(&["--admin-listen", "127.0.0.1:0"]).await;
    let admin = format!("http://{}", h.server.admin_addr().unwrap());
    let http = reqwest::Client::new();
    let id = h.create(mk_request("admin")).await;

    let view: serde_json::Value = http
        .patch(format!("{admin}/admin/controls"))
        .json(&serde_json::json!({"outage": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["outage"], true);
    let status = h
        .client
        .create_container_group(mk_request("during-outage"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(EciError::from_status(&status).code, "ServiceUnavailable");
    http.patch(format!("{admin}/admin/controls"))
        .json(&serde_json::json!({"outage": false}))
        .send()
        .await
        .unwrap();
    h.create(mk_request("after-outage")).await;

    let bad = http
        .patch(format!("{admin}/admin/controls"))
        .json(&serde_json::json!({"faults": {"Nope": {"error_rate": 1.0}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("unknown action"));

    let groups: Vec<serde_json::Value> = http
        .get(format!("{admin}/admin/groups"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(groups.len(), 2);
    let vanish = http
        .post(format!("{admin}/admin/groups/{id}/vanish"))
        .send()
        .await
        .unwrap();
    assert_eq!(vanish.status(), 204);
    assert!(h.get(&id).await.is_none());
    let missing = http
        .post(format!("{admin}/admin/groups/{id}/vanish"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let metrics = http
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"mock_eci_calls_total{action="CreateContainerGroup",result="ServiceUnavailable"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"mock_eci_calls_total{action="CreateContainerGroup",result="ok"} 2"#)
    );
    assert!(metrics.contains("mock_eci_container_groups{status="));
    h.server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn expired_spot_groups_end_expired() {
    let mut h = start(&[]).await;
    let id = h.create(mk_request("spot")).await;
    sleep(3.5).await;
    h.server.mock().expire(&id).unwrap();
    let group = h.get(&id).await.unwrap();
    assert_eq!(group.status, "Expired");
    assert!(!group.expired_time.is_empty());
    assert_eq!(
        group.containers[0].current_state.as_ref().unwrap().state,
        "Terminated"
    );
}

#[tokio::test(start_paused = true)]
async fn injected_faults_fail_the_chosen_share_of_calls() {
    let mut h = start(&["--fault", "DescribeContainerGroups=1.0:InternalError"]).await;
    let error = h
        .client
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: REGION.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let error = EciError::from_status(&error);
    assert_eq!(error.code, "InternalError");
    assert!(error.is_retryable());
    h.create(mk_request("unaffected")).await;
}

#[tokio::test]
async fn tests_write_into_logs_and_end_containers_through_the_admin_endpoint() {
    let mut h = start_with(MockConfig::parse_from([
        "mock-eci",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--provisioning-delay",
        "300ms",
        "--restart-backoff",
        "500ms",
        "--no-rate-limits",
    ]))
    .await;
    let admin = format!("http://{}", h.server.admin_addr().unwrap());
    let http = reqwest::Client::new();
    let mut request = mk_request("appended");
    // One synthetic line (the start) per run: the rest is what the test writes.
    request.container = vec![mk_container(
        "app",
        vec![env("MOCK_ECI_LOG_INTERVAL", "1h")],
    )];
    let id = h.create(request).await;
    let base = DescribeContainerLogRequest {
        region_id: REGION.into(),
        container_group_id: id.clone(),
        container_name: "app".into(),
        timestamps: true,
        ..Default::default()
    };
    let post = |path: String, body: &'static str| {
        let http = http.clone();
        async move { http.post(path).body(body).send().await.unwrap().status() }
    };
    let log_path = format!("{admin}/admin/groups/{id}/containers/app/log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while post(log_path.clone(), "not yet\n").await != 204 {
        assert!(std::time::Instant::now() < deadline, "never running");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(post(log_path.clone(), "one\ntwo\n").await, 204);
    let current = log(&mut h, base.clone()).await;
    let lines: Vec<(&str, &str)> = current
        .lines()
        .map(|line| line.split_once(' ').unwrap())
        .collect();
    assert_eq!(
        lines.iter().map(|(_, text)| *text).collect::<Vec<_>>(),
        [
            "[app] starting registry.example.com/app:1",
            "not yet",
            "one",
            "two"
        ],
        "{current}"
    );
    assert_eq!(
        lines[2].0, lines[3].0,
        "lines written together share their time"
    );
    assert!(lines[1].0 <= lines[2].0);
    let tail = log(
        &mut h,
        DescribeContainerLogRequest {
            tail: Some(1),
            timestamps: false,
            ..base.clone()
        },
    )
    .await;
    assert_eq!(tail, "two\n");

    // The container exits; the policy (Always) restarts it after the back-off.
    let exit_path = format!("{admin}/admin/groups/{id}/containers/app/exit");
    assert_eq!(post(exit_path.clone(), r#"{"exit_code": 3}"#).await, 204);
    assert_eq!(
        post(exit_path.clone(), "").await,
        409,
        "not running any more"
    );
    assert_eq!(post(log_path.clone(), "ignored\n").await, 409);
    let previous = |h: &mut Harness| {
        let request = DescribeContainerLogRequest {
            last_time: true,
            timestamps: false,
            ..base.clone()
        };
        let mut client = h.client.clone();
        async move { client.describe_container_log(request).await }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while post(log_path.clone(), "second run\n").await != 204 {
        assert!(std::time::Instant::now() < deadline, "never restarted");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let old = previous(&mut h).await.unwrap().into_inner().content;
    assert_eq!(
        old,
        "[app] starting registry.example.com/app:1\nnot yet\none\ntwo\n[app] exited with code 3\n"
    );
    let new = log(
        &mut h,
        DescribeContainerLogRequest {
            timestamps: false,
            ..base
        },
    )
    .await;
    assert_eq!(
        new,
        "[app] starting registry.example.com/app:1\nsecond run\n"
    );

    assert_eq!(
        post(
            format!("{admin}/admin/groups/{id}/containers/nope/log"),
            "x"
        )
        .await,
        409
    );
    assert_eq!(
        post(
            format!("{admin}/admin/groups/eci-none/containers/app/exit"),
            ""
        )
        .await,
        404
    );
    assert_eq!(post(exit_path, "{\"code\": 1}").await, 400);
}

#[tokio::test]
async fn a_denied_ram_role_or_security_group_is_refused_for_that_value_only() {
    let mut h = start(&[
        "--admin-listen",
        "127.0.0.1:0",
        "--deny-ram-role",
        "AdminRole",
    ])
    .await;
    let admin = format!("http://{}", h.server.admin_addr().unwrap());
    let mut request = mk_request("denied-role");
    request.ram_role_name = "AdminRole".into();
    let status = h.client.create_container_group(request).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let error = EciError::from_status(&status);
    assert_eq!(error.code, "Forbidden.RAM");
    assert!(
        error.message.contains("RamRoleName \"AdminRole\""),
        "{error}"
    );
    assert!(
        !error.request_id.is_empty(),
        "the service's refusal has a request id"
    );
    assert_eq!(
        h.server.mock().group_count(),
        0,
        "a refused create leaves nothing"
    );

    let mut allowed = mk_request("other-role");
    allowed.ram_role_name = "AppRole".into();
    h.create(allowed).await;

    let view: serde_json::Value = reqwest::Client::new()
        .patch(format!("{admin}/admin/controls"))
        .json(&serde_json::json!({"denied": {"security_groups": ["sg-platform"]}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["denied"]["security_groups"][0], "sg-platform");
    assert_eq!(
        view["denied"]["ram_roles"],
        serde_json::json!([]),
        "replaced"
    );
    let mut request = mk_request("denied-group");
    request.security_group_id = "sg-platform".into();
    let error = h.try_create(request).await.unwrap_err();
    assert_eq!(error.code, "Forbidden.RAM");
    let mut request = mk_request("role-allowed-now");
    request.ram_role_name = "AdminRole".into();
    h.create(request).await;
    assert_eq!(h.server.mock().group_count(), 2);
    h.server.stop().await.unwrap();
}

/// DescribeImageCaches of one cache over gRPC.
async fn image_cache(h: &mut Harness, id: &str) -> Option<eci_proto::v20180808::ImageCache> {
    h.client
        .describe_image_caches(eci_proto::v20180808::DescribeImageCachesRequest {
            region_id: REGION.into(),
            image_cache_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .image_caches
        .into_iter()
        .next()
}

#[tokio::test(start_paused = true)]
async fn image_caches_over_grpc_build_serve_groups_and_survive_a_restart() {
    use eci_proto::v20180808::{CreateImageCacheRequest, DeleteImageCacheRequest};
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let flags = [
        "--state-file",
        state.to_str().unwrap(),
        "--image-cache-creation-delay",
        "5s",
        "--cached-provisioning-delay",
        "1s",
    ];
    let mut h = start(&flags).await;
    let created = h
        .client
        .create_image_cache(CreateImageCacheRequest {
            region_id: REGION.into(),
            image_cache_name: "app".into(),
            image: vec!["registry.example.com/app:1".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        !created
            .metadata()
            .get(REQUEST_ID_METADATA_KEY)
            .unwrap()
            .is_empty()
    );
    let id = created.into_inner().image_cache_id;
    sleep(1.0).await;
    assert_eq!(image_cache(&mut h, &id).await.unwrap().status, "Creating");
    h.server.stop().await.unwrap();

    // The build goes on across a restart and ends on schedule.
    let mut h = start(&flags).await;
    sleep(3.0).await;
    assert_eq!(image_cache(&mut h, &id).await.unwrap().status, "Creating");
    sleep(1.5).await;
    assert_eq!(image_cache(&mut h, &id).await.unwrap().status, "Ready");

    let mut from_cache = mk_request("from-cache");
    from_cache.image_snapshot_id = id.clone();
    let from_cache = h.create(from_cache).await;
    let pulled = h.create(mk_request("pulled")).await;
    sleep(1.5).await;
    assert_eq!(h.status(&from_cache).await, "Running");
    assert_ne!(h.status(&pulled).await, "Running");
    sleep(2.0).await;
    assert_eq!(h.status(&pulled).await, "Running");

    let mut unknown = mk_request("unknown-cache");
    unknown.image_snapshot_id = "imc-none".into();
    let error = h.try_create(unknown).await.unwrap_err();
    assert_eq!(error.code, "InvalidImageCache.NotFound");
    let status = h
        .client
        .delete_image_cache(DeleteImageCacheRequest {
            region_id: REGION.into(),
            image_cache_id: "imc-none".into(),
            client_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}
