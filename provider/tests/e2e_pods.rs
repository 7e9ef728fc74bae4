//! End to end on the real control plane: pods kube-scheduler places on a virtual node run as
//! mock-eci container groups, the daemon talking to mock-eci over the gRPC contract.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "scenarios/pods.rs"]
mod pods;

use integration::harness::EciApi;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_with_its_ip_conditions_and_references() {
    pods::a_pod_runs_with_its_ip_conditions_and_references(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_under_each_restart_policy_and_init_containers() {
    pods::exit_codes_under_each_restart_policy_and_init_containers(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_deletion_waits_for_the_group_then_removes_the_pod() {
    pods::graceful_deletion_waits_for_the_group_then_removes_the_pod(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_visible_on_the_pod() {
    pods::failures_are_visible_on_the_pod(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_and_restarts_leave_one_group_per_pod_and_no_orphans() {
    pods::outages_and_restarts_leave_one_group_per_pod_and_no_orphans(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_the_middle_of_a_200_pod_burst_leaves_exactly_one_group_per_pod() {
    pods::a_crash_in_the_middle_of_a_200_pod_burst_leaves_exactly_one_group_per_pod(EciApi::Grpc)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_storm_ends_with_every_pod_running_and_nothing_leaked() {
    pods::a_throttling_storm_ends_with_every_pod_running_and_nothing_leaked(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_identity_and_security_reach_eci() {
    pods::a_pods_identity_and_security_reach_eci(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_costs_one_create_and_one_delete() {
    pods::each_pod_costs_one_create_and_one_delete(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_publishes_no_eci_event_twice() {
    pods::a_restart_publishes_no_eci_event_twice(EciApi::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_answers_on_token_mounting_pods_cost_no_pod_and_no_group() {
    pods::lost_create_answers_on_token_mounting_pods_cost_no_pod_and_no_group(EciApi::Grpc).await;
}
