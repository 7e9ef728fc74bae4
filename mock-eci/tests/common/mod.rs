//! Shared helpers: a mock-eci on 127.0.0.1:0, a connected client, request builders.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use clap::Parser;
use eci_proto::EciError;
use eci_proto::v20180808::eci_client::EciClient;
use eci_proto::v20180808::{
    Container, ContainerGroup, CreateContainerGroupRequest, DescribeContainerGroupsRequest,
    EnvironmentVar, Tag,
};
use mock_eci::{MockConfig, MockServer};
use tonic::transport::Channel;

pub const REGION: &str = "cn-hangzhou";

pub struct Harness {
    pub server: MockServer,
    pub client: EciClient<Channel>,
}

/// Starts mock-eci with a fixed 3 s provisioning delay, no rate limits, and `extra` flags.
pub async fn start(extra: &[&str]) -> Harness {
    let mut args = vec![
        "mock-eci",
        "--listen",
        "127.0.0.1:0",
        "--provisioning-delay",
        "3s",
        "--no-rate-limits",
    ];
    args.extend_from_slice(extra);
    start_with(MockConfig::parse_from(args)).await
}

pub async fn start_with(config: MockConfig) -> Harness {
    let server = MockServer::start(config).await.expect("mock-eci starts");
    let client = EciClient::connect(server.endpoint())
        .await
        .expect("client connects");
    Harness { server, client }
}

pub async fn sleep(seconds: f64) {
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
}

pub fn env(key: &str, value: &str) -> EnvironmentVar {
    EnvironmentVar {
        key: key.into(),
        value: value.into(),
        field_ref: None,
    }
}

pub fn tag(key: &str, value: &str) -> Tag {
    Tag {
        key: key.into(),
        value: value.into(),
    }
}

pub fn mk_container(name: &str, env: Vec<EnvironmentVar>) -> Container {
    Container {
        name: name.into(),
        image: "registry.example.com/app:1".into(),
        environment_var: env,
        ..Container::default()
    }
}

pub fn mk_request(name: &str) -> CreateContainerGroupRequest {
    CreateContainerGroupRequest {
        region_id: REGION.into(),
        security_group_id: "sg-test".into(),
        v_switch_id: "vsw-test".into(),
        container_group_name: name.into(),
        container: vec![mk_container("app", Vec::new())],
        tag: vec![tag("cluster", "c1")],
        ..CreateContainerGroupRequest::default()
    }
}

impl Harness {
    pub async fn create(&mut self, request: CreateContainerGroupRequest) -> String {
        self.client
            .create_container_group(request)
            .await
            .expect("create succeeds")
            .into_inner()
            .container_group_id
    }

    pub async fn try_create(
        &mut self,
        request: CreateContainerGroupRequest,
    ) -> Result<String, EciError> {
        self.client
            .create_container_group(request)
            .await
            .map(|response| response.into_inner().container_group_id)
            .map_err(|status| EciError::from_status(&status))
    }

    /// The group, or `None` once it is gone.
    pub async fn get(&mut self, id: &str) -> Option<ContainerGroup> {
        self.client
            .describe_container_groups(DescribeContainerGroupsRequest {
                region_id: REGION.into(),
                container_group_ids: vec![id.to_owned()],
                with_event: true,
                ..DescribeContainerGroupsRequest::default()
            })
            .await
            .expect("describe succeeds")
            .into_inner()
            .container_groups
            .into_iter()
            .next()
    }

    pub async fn status(&mut self, id: &str) -> String {
        self.get(id)
            .await
            .map_or_else(|| "<gone>".to_owned(), |group| group.status)
    }
}
