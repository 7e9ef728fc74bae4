//! The backend over the gRPC contract (mock-eci, or anything serving `eci.v20180808.Eci`).

use std::time::Duration;

use eci_proto::EciError;
use eci_proto::v20180808::eci_client::EciClient;
use eci_proto::v20180808::{
    CreateContainerGroupRequest, CreateContainerGroupResponse, DeleteContainerGroupRequest,
    DeleteContainerGroupResponse, DescribeContainerGroupMetricRequest,
    DescribeContainerGroupMetricResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupStatusResponse, DescribeContainerGroupsRequest,
    DescribeContainerGroupsResponse, DescribeContainerLogRequest, DescribeContainerLogResponse,
    DescribeMultiContainerGroupMetricRequest, DescribeMultiContainerGroupMetricResponse,
    ExecContainerCommandRequest, ExecContainerCommandResponse, RestartContainerGroupRequest,
    RestartContainerGroupResponse, UpdateContainerGroupRequest, UpdateContainerGroupResponse,
};
use tonic::transport::{Channel, Endpoint};

use eci_proto::v20180808::{
    CreateImageCacheRequest, CreateImageCacheResponse, DeleteImageCacheRequest,
    DeleteImageCacheResponse, DescribeImageCachesRequest, DescribeImageCachesResponse,
    UpdateImageCacheRequest, UpdateImageCacheResponse,
};

use super::{EciBackend, ImageCacheBackend};

/// Per-call deadline: a hung connection must fail a call, not stall the daemon.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A gRPC ECI client. Connects lazily and reconnects by itself after an outage.
#[derive(Debug, Clone)]
pub struct GrpcBackend {
    client: EciClient<Channel>,
}

impl GrpcBackend {
    /// A client for `endpoint` (`http://host:port`), connecting on first use.
    pub fn connect_lazy(endpoint: &str) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(endpoint.to_owned())?
            .connect_timeout(Duration::from_secs(3))
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true)
            // Status pages are ~100 KB; the 64 KiB HTTP/2 default would add round trips.
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(8 << 20))
            .connect_lazy();
        Ok(Self {
            client: EciClient::new(channel),
        })
    }
}

macro_rules! forward {
    ($trait:ident: $($method:ident($request:ty) -> $response:ty;)+) => {
        #[async_trait::async_trait]
        impl $trait for GrpcBackend {
            $(async fn $method(&self, request: $request) -> Result<$response, EciError> {
                self.client
                    .clone()
                    .$method(request)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|status| EciError::from_status(&status))
            })+
        }
    };
}

forward! {
    EciBackend:
    create_container_group(CreateContainerGroupRequest) -> CreateContainerGroupResponse;
    describe_container_groups(DescribeContainerGroupsRequest) -> DescribeContainerGroupsResponse;
    describe_container_group_status(DescribeContainerGroupStatusRequest) -> DescribeContainerGroupStatusResponse;
    delete_container_group(DeleteContainerGroupRequest) -> DeleteContainerGroupResponse;
    update_container_group(UpdateContainerGroupRequest) -> UpdateContainerGroupResponse;
    restart_container_group(RestartContainerGroupRequest) -> RestartContainerGroupResponse;
    describe_container_log(DescribeContainerLogRequest) -> DescribeContainerLogResponse;
    exec_container_command(ExecContainerCommandRequest) -> ExecContainerCommandResponse;
    describe_container_group_metric(DescribeContainerGroupMetricRequest) -> DescribeContainerGroupMetricResponse;
    describe_multi_container_group_metric(DescribeMultiContainerGroupMetricRequest) -> DescribeMultiContainerGroupMetricResponse;
}

forward! {
    ImageCacheBackend:
    create_image_cache(CreateImageCacheRequest) -> CreateImageCacheResponse;
    describe_image_caches(DescribeImageCachesRequest) -> DescribeImageCachesResponse;
    update_image_cache(UpdateImageCacheRequest) -> UpdateImageCacheResponse;
    delete_image_cache(DeleteImageCacheRequest) -> DeleteImageCacheResponse;
}
