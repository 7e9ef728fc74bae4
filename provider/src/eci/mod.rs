//! The ECI backend: one trait with one method per ECI action, in the types of the gRPC
//! contract. The rest of the daemon talks to this trait only; which implementation serves it
//! (mock-eci in-process, mock-eci over gRPC, the real OpenAPI) is decided at start-up.

mod grpc;
pub mod misconfig;
pub mod openapi;
pub mod paging;
mod rate_budget;

use std::sync::Arc;

use eci_proto::EciError;
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
use eci_proto::v20180808::{
    CreateImageCacheRequest, CreateImageCacheResponse, DeleteImageCacheRequest,
    DeleteImageCacheResponse, DescribeImageCachesRequest, DescribeImageCachesResponse,
    UpdateImageCacheRequest, UpdateImageCacheResponse,
};
pub use grpc::GrpcBackend;
pub use rate_budget::{Lane, Paced, Pacer, ReplicaCount, Share, alone, share, share_of};
use tracing::info;

use self::openapi::credentials::{CredentialSource, Credentials};
use crate::config::{BackendChoice, EciArgs, WithSite};

/// The ECI API, whatever serves it. Errors carry the ECI error code (`EciError::code`), the
/// message and the request id, exactly as the HTTP API reports them.
#[async_trait::async_trait]
pub trait EciBackend: Send + Sync + 'static {
    /// CreateContainerGroup.
    async fn create_container_group(
        &self,
        request: CreateContainerGroupRequest,
    ) -> Result<CreateContainerGroupResponse, EciError>;
    /// DescribeContainerGroups.
    async fn describe_container_groups(
        &self,
        request: DescribeContainerGroupsRequest,
    ) -> Result<DescribeContainerGroupsResponse, EciError>;
    /// DescribeContainerGroupStatus.
    async fn describe_container_group_status(
        &self,
        request: DescribeContainerGroupStatusRequest,
    ) -> Result<DescribeContainerGroupStatusResponse, EciError>;
    /// DeleteContainerGroup.
    async fn delete_container_group(
        &self,
        request: DeleteContainerGroupRequest,
    ) -> Result<DeleteContainerGroupResponse, EciError>;
    /// UpdateContainerGroup.
    async fn update_container_group(
        &self,
        request: UpdateContainerGroupRequest,
    ) -> Result<UpdateContainerGroupResponse, EciError>;
    /// RestartContainerGroup.
    async fn restart_container_group(
        &self,
        request: RestartContainerGroupRequest,
    ) -> Result<RestartContainerGroupResponse, EciError>;
    /// DescribeContainerLog.
    async fn describe_container_log(
        &self,
        request: DescribeContainerLogRequest,
    ) -> Result<DescribeContainerLogResponse, EciError>;
    /// ExecContainerCommand.
    async fn exec_container_command(
        &self,
        request: ExecContainerCommandRequest,
    ) -> Result<ExecContainerCommandResponse, EciError>;
    /// DescribeContainerGroupMetric.
    async fn describe_container_group_metric(
        &self,
        request: DescribeContainerGroupMetricRequest,
    ) -> Result<DescribeContainerGroupMetricResponse, EciError>;
    /// DescribeMultiContainerGroupMetric.
    async fn describe_multi_container_group_metric(
        &self,
        request: DescribeMultiContainerGroupMetricRequest,
    ) -> Result<DescribeMultiContainerGroupMetricResponse, EciError>;
}

/// A shared backend.
pub type Backend = Arc<dyn EciBackend>;

/// The image-cache actions of the same API, served by the same backends (gRPC and OpenAPI).
/// Apart from [`EciBackend`] because only the image-cache reconciler of the elected replica
/// calls them; the pod paths never do.
#[async_trait::async_trait]
pub trait ImageCacheBackend: Send + Sync + 'static {
    /// CreateImageCache.
    async fn create_image_cache(
        &self,
        request: CreateImageCacheRequest,
    ) -> Result<CreateImageCacheResponse, EciError>;
    /// DescribeImageCaches.
    async fn describe_image_caches(
        &self,
        request: DescribeImageCachesRequest,
    ) -> Result<DescribeImageCachesResponse, EciError>;
    /// UpdateImageCache.
    async fn update_image_cache(
        &self,
        request: UpdateImageCacheRequest,
    ) -> Result<UpdateImageCacheResponse, EciError>;
    /// DeleteImageCache.
    async fn delete_image_cache(
        &self,
        request: DeleteImageCacheRequest,
    ) -> Result<DeleteImageCacheResponse, EciError>;
}

/// A shared image-cache backend.
pub type ImageCaches = Arc<dyn ImageCacheBackend>;

/// What [`connect`] sets up: the pod paths' backend, the image-cache reconciler's (the same
/// client), and what keeps an embedded mock-eci alive.
pub type Connection = (Backend, ImageCaches, BackendGuard);

/// The backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The embedded mock-eci did not start.
    #[cfg(feature = "embedded-mock")]
    #[error("the embedded mock-eci could not start")]
    Embedded(#[source] mock_eci::ServeError),
    /// `embedded` was chosen in a build without the embedded mock (the parser refuses it
    /// first; this keeps the backend honest if it is ever reached another way).
    #[cfg(not(feature = "embedded-mock"))]
    #[error("this build leaves the embedded mock-eci out")]
    NoEmbeddedMock,
    /// The gRPC endpoint is not a valid URL.
    #[error("--eci (ECI_BACKEND): {endpoint:?} is not a usable gRPC endpoint")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// `openapi` was chosen without any credentials.
    #[error(
        "--eci openapi: no credentials; set ECI_ACCESS_KEY and ECI_SECRET_KEY, ECI_CREDENTIALS_PATH or ECI_RAM_ROLE"
    )]
    NoCredentials,
    /// The OpenAPI client could not be set up.
    #[error(transparent)]
    OpenApi(#[from] openapi::OpenApiError),
}

/// What keeps an embedded backend alive.
#[derive(Debug)]
pub struct BackendGuard {
    #[cfg(feature = "embedded-mock")]
    embedded: Option<mock_eci::MockServer>,
}

impl BackendGuard {
    /// What a backend with nothing to keep alive holds.
    fn none() -> Self {
        Self {
            #[cfg(feature = "embedded-mock")]
            embedded: None,
        }
    }

    /// Stops the embedded mock-eci, if any.
    pub async fn stop(self) {
        #[cfg(feature = "embedded-mock")]
        if let Some(server) = self.embedded {
            if let Err(error) = server.stop().await {
                tracing::warn!(%error, "the embedded mock-eci did not stop cleanly");
            }
        }
    }
}

/// Starts mock-eci inside this process and connects to it over gRPC on loopback.
#[cfg(feature = "embedded-mock")]
async fn start_embedded(config: &WithSite<EciArgs>) -> Result<Connection, BackendError> {
    let mut mock = mock_eci::MockConfig::defaults();
    mock.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    mock.region.clone_from(&config.site.region);
    let server = mock_eci::MockServer::start(mock)
        .await
        .map_err(BackendError::Embedded)?;
    info!(endpoint = %server.endpoint(), "embedded mock-eci started (no Alibaba Cloud account needed)");
    let backend =
        GrpcBackend::connect_lazy(&server.endpoint()).map_err(|source| BackendError::Endpoint {
            endpoint: server.endpoint(),
            source,
        })?;
    let backend = Arc::new(backend);
    Ok((
        Arc::clone(&backend) as Backend,
        backend,
        BackendGuard {
            embedded: Some(server),
        },
    ))
}

#[cfg(not(feature = "embedded-mock"))]
async fn start_embedded(_config: &WithSite<EciArgs>) -> Result<Connection, BackendError> {
    Err(BackendError::NoEmbeddedMock)
}

/// Builds the configured backend. `pacer` (pacing on) also paces the pages the OpenAPI
/// client fetches inside one call of the trait.
pub async fn connect(
    config: &WithSite<EciArgs>,
    pacer: Option<Arc<Pacer>>,
) -> Result<Connection, BackendError> {
    match &config.site.backend {
        BackendChoice::Embedded => start_embedded(config).await,
        BackendChoice::Grpc(endpoint) => {
            let backend =
                GrpcBackend::connect_lazy(endpoint).map_err(|source| BackendError::Endpoint {
                    endpoint: endpoint.clone(),
                    source,
                })?;
            info!(%endpoint, "using a mock-eci over gRPC");
            let backend = Arc::new(backend);
            Ok((
                Arc::clone(&backend) as Backend,
                backend,
                BackendGuard::none(),
            ))
        }
        BackendChoice::OpenApi => {
            let options = openapi::OpenApiOptions {
                endpoint: config.args.openapi_endpoint(&config.site.region),
                timeout: config.args.eci_request_timeout,
                ca_file: config.args.eci_ca_file.clone(),
            };
            let credentials = match (&config.args.access_key, &config.args.secret_key) {
                (Some(id), Some(secret)) => CredentialSource::Static(Credentials {
                    access_key_id: id.clone(),
                    access_key_secret: secret.clone(),
                    security_token: config.args.security_token.clone(),
                }),
                _ => match (&config.args.credentials_path, &config.args.ram_role) {
                    (Some(path), _) => CredentialSource::file(path.clone()),
                    (None, Some(role)) => CredentialSource::ram_role(
                        reqwest::Client::builder()
                            .timeout(std::time::Duration::from_secs(5))
                            .build()
                            .map_err(openapi::OpenApiError::Client)?,
                        &config.args.metadata_endpoint,
                        role.clone(),
                    ),
                    (None, None) => return Err(BackendError::NoCredentials),
                },
            };
            let source = credentials.describe();
            let backend = openapi::OpenApiBackend::new(&options, credentials)?.with_pacer(pacer);
            info!(endpoint = %backend.endpoint(), credentials = %source, "using the Alibaba Cloud ECI OpenAPI");
            let backend = Arc::new(backend);
            Ok((
                Arc::clone(&backend) as Backend,
                backend,
                BackendGuard::none(),
            ))
        }
    }
}
