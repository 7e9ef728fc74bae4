//! The service: the shared [`MockEci`] handle, the gRPC face of the engine. Request ids,
//! injected faults, throttling ([`controls`]) and metrics ([`telemetry`]) around every action,
//! then the action itself under one lock; the state file ([`persist`]); the flags it is built
//! from ([`config`]).
//!
//! May call: the `engine` and the shared leaves. Never a front (`tests/layout.rs` checks it).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use eci_proto::v20180808::eci_server::{Eci, EciServer};
use eci_proto::v20180808::{
    ContainerGroup, CreateContainerGroupRequest, CreateContainerGroupResponse,
    DeleteContainerGroupRequest, DeleteContainerGroupResponse, DescribeContainerGroupMetricRequest,
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
use eci_proto::{EciError, REQUEST_ID_METADATA_KEY};
use tokio::sync::Notify;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::actions::Action;
use crate::clock::{Clock, Millis};
use crate::engine::{Engine, Snapshot};
use crate::service::config::MockConfig;
use crate::service::controls::{Controls, ControlsPatch, ControlsView, Verdict};
use crate::service::persist::PersistError;
use crate::service::telemetry::Telemetry;

pub mod config;
pub mod controls;
pub mod denials;
pub mod persist;
pub mod runtime;
pub mod telemetry;

/// The `result` label of calls served whose answer was lost on purpose
/// ([`crate::service::controls::Fault::lost_answer_rate`]).
pub const LOST_ANSWER: &str = "AnswerLost";

/// Responses carry the request id in a field as well as in metadata.
trait WithRequestId {
    fn set_request_id(&mut self, request_id: String);
}

macro_rules! with_request_id {
    ($($response:ty),+ $(,)?) => {
        $(impl WithRequestId for $response {
            fn set_request_id(&mut self, request_id: String) {
                self.request_id = request_id;
            }
        })+
    };
}

with_request_id!(
    CreateContainerGroupResponse,
    DescribeContainerGroupsResponse,
    DescribeContainerGroupStatusResponse,
    DeleteContainerGroupResponse,
    UpdateContainerGroupResponse,
    RestartContainerGroupResponse,
    DescribeContainerLogResponse,
    ExecContainerCommandResponse,
    DescribeContainerGroupMetricResponse,
    DescribeMultiContainerGroupMetricResponse,
    CreateImageCacheResponse,
    DescribeImageCachesResponse,
    UpdateImageCacheResponse,
    DeleteImageCacheResponse,
);

#[derive(Debug)]
struct Shared {
    engine: Mutex<Engine>,
    controls: Mutex<Controls>,
    clock: Clock,
    telemetry: Telemetry,
    /// Woken after every change worth persisting.
    dirty: Notify,
    /// Woken after every change the real runtime's driver should look at.
    runtime_wake: Notify,
    /// The real runtime, in real mode (set once at start).
    runtime: std::sync::OnceLock<Arc<runtime::RealRuntime>>,
}

/// A running mock-eci: cheap to clone, shared by the gRPC service and the admin endpoint.
#[derive(Debug, Clone)]
pub struct MockEci {
    shared: Arc<Shared>,
}

impl MockEci {
    /// A mock configured by `config`, continuing from its state file when there is one.
    pub fn new(config: &MockConfig) -> Result<Self, PersistError> {
        let snapshot = match &config.state_file {
            Some(path) => persist::load(path)?,
            None => None,
        };
        Ok(Self::from_parts(config, snapshot))
    }

    fn from_parts(config: &MockConfig, snapshot: Option<Snapshot>) -> Self {
        let settings = config.settings();
        let mut clock = Clock::new();
        let engine = match snapshot {
            Some(snapshot) => {
                // Never run time backwards relative to the saved state (clock skew, or a test's
                // paused clock): transitions would replay out of order.
                if snapshot.taken_at > clock.now() {
                    clock = Clock::starting_at(snapshot.taken_at);
                }
                Engine::restore(settings, snapshot)
            }
            None => Engine::new(settings),
        };
        let controls = Controls::new(
            !config.no_rate_limits,
            &config.rate_limit_overrides(),
            config.fault_map(),
            config.seed,
        )
        .with_denials(config.denials());
        Self {
            shared: Arc::new(Shared {
                engine: Mutex::new(engine),
                controls: Mutex::new(controls),
                clock,
                telemetry: Telemetry::new(),
                dirty: Notify::new(),
                runtime_wake: Notify::new(),
                runtime: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The tonic service to mount on a server.
    pub fn grpc_service(&self) -> EciServer<Self> {
        EciServer::new(self.clone())
    }

    /// The mock's clock (follows tokio's, so paused-time tests control it).
    pub fn now(&self) -> Millis {
        self.shared.clock.now()
    }

    fn engine(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock is a bug; the state is still the best we have.
        self.shared
            .engine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn controls_lock(&self) -> MutexGuard<'_, Controls> {
        self.shared
            .controls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The run-time switches.
    pub fn controls(&self) -> ControlsView {
        let mut view = self.controls_lock().view();
        let engine = self.engine();
        view.no_stock = engine.settings().no_stock;
        view.max_groups = engine.settings().max_groups;
        view.no_stock_zones = engine.settings().no_stock_zones.clone();
        view.vswitch_zones = engine.settings().vswitch_zones.clone();
        view
    }

    /// Changes run-time switches; nothing changes when the patch is invalid.
    pub fn patch_controls(&self, patch: &ControlsPatch) -> Result<ControlsView, String> {
        self.controls_lock().apply(patch)?;
        {
            let mut engine = self.engine();
            if let Some(no_stock) = patch.no_stock {
                engine.set_no_stock(no_stock);
            }
            if let Some(max_groups) = patch.max_groups {
                engine.set_max_groups(max_groups);
            }
            if let Some(zones) = &patch.no_stock_zones {
                engine.set_no_stock_zones(zones.clone());
            }
            if let Some(zones) = &patch.vswitch_zones {
                engine.map_vswitch_zones(zones.clone());
            }
        }
        Ok(self.controls())
    }

    /// Every group in full, finished ones included.
    pub fn groups(&self) -> Vec<ContainerGroup> {
        let now = self.now();
        self.engine().all_groups(now)
    }

    /// The TCP ports the running groups declare, at their IPs.
    pub fn running_tcp_ports(&self) -> HashSet<SocketAddr> {
        let now = self.now();
        self.engine().running_tcp_ports(now)
    }

    /// The request group `id` was created with (updates applied): every parameter the fake
    /// received and keeps, including those no answer shows (`HostName`, `DnsPolicy`, …).
    pub fn created_with(
        &self,
        id: &str,
    ) -> Option<eci_proto::v20180808::CreateContainerGroupRequest> {
        self.engine().created_with(id)
    }

    /// Number of groups.
    pub fn group_count(&self) -> usize {
        self.engine().len()
    }

    /// The load rules the metric calls follow.
    pub fn loads(&self) -> crate::engine::usage::LoadRules {
        self.engine().loads()
    }

    /// Puts load rules in force from now on; invalid rules change nothing.
    pub fn set_loads(
        &self,
        rules: crate::engine::usage::LoadRules,
    ) -> Result<crate::engine::usage::LoadRules, String> {
        let now = self.now();
        let mut engine = self.engine();
        engine.set_loads(rules, now)?;
        Ok(engine.loads())
    }

    /// Serves interactive exec sessions from `base` (`ws://host:port`) from now on.
    pub fn set_exec_base(&self, base: String) {
        self.engine().set_exec_base(base);
    }

    /// The real runtime, in real mode.
    pub fn real_runtime(&self) -> Option<Arc<runtime::RealRuntime>> {
        self.shared.runtime.get().cloned()
    }

    /// Takes the interactive exec session `session` for its one connection.
    pub fn take_exec(&self, session: &str) -> Option<crate::engine::exec_session::PendingExec> {
        let now = self.now();
        self.engine().take_exec(session, now)
    }

    /// Removes a group out of band, as if someone deleted it in the console.
    pub fn vanish(&self, id: &str) -> Result<(), EciError> {
        let now = self.now();
        self.engine().vanish(id, now)?;
        self.shared.dirty.notify_one();
        Ok(())
    }

    /// Writes `lines` into the log of a running container, now.
    pub fn append_log(&self, id: &str, container: &str, lines: &[String]) -> Result<(), EciError> {
        let now = self.now();
        self.engine().append_log(id, container, lines, now)
    }

    /// Ends a running container now with `exit_code`, as if its process exited.
    pub fn exit_container(
        &self,
        id: &str,
        container: &str,
        exit_code: i32,
    ) -> Result<(), EciError> {
        let now = self.now();
        self.engine()
            .exit_container(id, container, exit_code, now)?;
        self.shared.dirty.notify_one();
        Ok(())
    }

    /// Announces a spot reclaim of a group (a Warning `SpotToBeReleased` event); it runs on.
    pub fn announce_reclaim(&self, id: &str) -> Result<(), EciError> {
        let now = self.now();
        self.engine().announce_reclaim(id, now)?;
        self.shared.dirty.notify_one();
        Ok(())
    }

    /// Reclaims a group as a spot instance would be: it ends `Expired`.
    pub fn expire(&self, id: &str) -> Result<(), EciError> {
        let now = self.now();
        self.engine().expire(id, now)?;
        self.shared.dirty.notify_one();
        Ok(())
    }

    /// Runs containers for real from now on (`--runtime real`): the driver reads
    /// [`Self::runtime_plan`], DescribeContainerLog reads the runtime's log files.
    pub fn attach_runtime(&self, runtime: Arc<runtime::RealRuntime>) {
        let _ = self.shared.runtime.set(runtime);
    }

    /// What the real runtime should make exist now.
    pub fn runtime_plan(&self) -> Vec<(String, crate::engine::real::GroupPlan)> {
        let now = self.now();
        self.engine().runtime_plan(now)
    }

    /// What the real runtime saw happen to run `run` of a container.
    pub fn observe(
        &self,
        id: &str,
        container: &str,
        run: u32,
        observation: &crate::engine::real::Observation,
    ) {
        let now = self.now();
        self.engine().observe(id, container, run, observation, now);
        self.changed_now();
    }

    /// The real runtime removed a deleted group's sandbox.
    pub fn observe_deleted(&self, id: &str) {
        let now = self.now();
        self.engine().observe_deleted(id, now);
        self.changed_now();
    }

    /// Waits until something changed that the real runtime should look at.
    pub async fn runtime_changed(&self) {
        self.shared.runtime_wake.notified().await;
    }

    fn changed_now(&self) {
        self.shared.dirty.notify_one();
        self.shared.runtime_wake.notify_one();
    }

    /// A snapshot of the whole state.
    pub fn snapshot(&self) -> Snapshot {
        let now = self.now();
        let mut engine = self.engine();
        engine.advance(now);
        engine.snapshot(now)
    }

    /// Waits until a change is worth persisting.
    pub async fn changed(&self) {
        self.shared.dirty.notified().await;
    }

    /// The Prometheus text exposition.
    pub fn render_metrics(&self) -> String {
        let counts = {
            let now = self.now();
            let mut engine = self.engine();
            engine.advance(now);
            engine.count_by_status()
        };
        self.shared.telemetry.render(
            counts
                .into_iter()
                .map(|(status, count)| (status.as_str(), count)),
        )
    }

    async fn call<Req, Resp>(
        &self,
        action: Action,
        request: Request<Req>,
        serve: impl FnOnce(&mut Engine, Req, Millis) -> Result<Resp, EciError>,
    ) -> Result<Response<Resp>, Status>
    where
        Resp: WithRequestId,
    {
        let started = Instant::now();
        let request_id = uuid::Uuid::new_v4().to_string().to_uppercase();
        let verdict = self.controls_lock().admit(action, self.now());
        let (latency_ms, injected, lose_answer) = match verdict {
            Verdict::Serve {
                latency_ms,
                lose_answer,
            } => (latency_ms, None, lose_answer),
            Verdict::Fail { error, latency_ms } => (latency_ms, Some(error), false),
        };
        if latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(latency_ms)).await;
        }
        let result = match injected {
            Some(error) => Err(error),
            None => {
                let now = self.now();
                let result = serve(&mut self.engine(), request.into_inner(), now);
                if result.is_ok() && action.mutates() {
                    self.changed_now();
                }
                result
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(_) if lose_answer => {
                // Served, but the answer never arrives: a dropped connection, no ECI code.
                self.shared.telemetry.record(action, LOST_ANSWER, seconds);
                debug!(action = %action, request_id = %request_id, "served; answer lost (simulated)");
                Err(Status::unavailable(format!(
                    "connection reset: the answer to {action} was lost (simulated)"
                )))
            }
            Ok(mut body) => {
                self.shared.telemetry.record(action, "ok", seconds);
                body.set_request_id(request_id.clone());
                let mut response = Response::new(body);
                if let Ok(value) = MetadataValue::try_from(request_id.as_str()) {
                    response
                        .metadata_mut()
                        .insert(REQUEST_ID_METADATA_KEY, value);
                }
                Ok(response)
            }
            Err(error) => {
                self.shared.telemetry.record(action, &error.code, seconds);
                debug!(action = %action, request_id = %request_id, code = %error.code, message = %error.message, "call failed");
                if error.code == eci_proto::error::codes::FOREIGN_RESPONSE {
                    // Something in front of the service refused the call: a bare gRPC
                    // refusal, no ECI code, no request id (what tonic makes of a proxy's 403).
                    return Err(Status::permission_denied(format!(
                        "{action}: refused by a proxy in front of ECI (simulated)"
                    )));
                }
                Err(error.with_request_id(request_id).into_status())
            }
        }
    }
}

#[tonic::async_trait]
impl Eci for MockEci {
    async fn create_container_group(
        &self,
        request: Request<CreateContainerGroupRequest>,
    ) -> Result<Response<CreateContainerGroupResponse>, Status> {
        // Judged before the engine sees it: a refused create leaves no group behind.
        let refusal = self.controls_lock().refusal(request.get_ref());
        self.call(
            Action::CreateContainerGroup,
            request,
            |engine, request, now| {
                if let Some(error) = refusal {
                    return Err(error);
                }
                let container_group_id = engine.create(request, now)?;
                Ok(CreateContainerGroupResponse {
                    request_id: String::new(),
                    container_group_id,
                })
            },
        )
        .await
    }

    async fn describe_container_groups(
        &self,
        request: Request<DescribeContainerGroupsRequest>,
    ) -> Result<Response<DescribeContainerGroupsResponse>, Status> {
        self.call(
            Action::DescribeContainerGroups,
            request,
            |engine, request, now| engine.describe_groups(&request, now),
        )
        .await
    }

    async fn describe_container_group_status(
        &self,
        request: Request<DescribeContainerGroupStatusRequest>,
    ) -> Result<Response<DescribeContainerGroupStatusResponse>, Status> {
        self.call(
            Action::DescribeContainerGroupStatus,
            request,
            |engine, request, now| engine.describe_status(&request, now),
        )
        .await
    }

    async fn delete_container_group(
        &self,
        request: Request<DeleteContainerGroupRequest>,
    ) -> Result<Response<DeleteContainerGroupResponse>, Status> {
        self.call(
            Action::DeleteContainerGroup,
            request,
            |engine, request, now| {
                engine.delete(&request, now)?;
                Ok(DeleteContainerGroupResponse::default())
            },
        )
        .await
    }

    async fn update_container_group(
        &self,
        request: Request<UpdateContainerGroupRequest>,
    ) -> Result<Response<UpdateContainerGroupResponse>, Status> {
        self.call(
            Action::UpdateContainerGroup,
            request,
            |engine, request, now| {
                engine.update(&request, now)?;
                Ok(UpdateContainerGroupResponse::default())
            },
        )
        .await
    }

    async fn restart_container_group(
        &self,
        request: Request<RestartContainerGroupRequest>,
    ) -> Result<Response<RestartContainerGroupResponse>, Status> {
        self.call(
            Action::RestartContainerGroup,
            request,
            |engine, request, now| {
                engine.restart(&request, now)?;
                Ok(RestartContainerGroupResponse::default())
            },
        )
        .await
    }

    async fn describe_container_log(
        &self,
        request: Request<DescribeContainerLogRequest>,
    ) -> Result<Response<DescribeContainerLogResponse>, Status> {
        // Real mode: the files are read before the engine's lock is taken.
        let real = match self.shared.runtime.get() {
            Some(runtime) => {
                let request = request.get_ref();
                Some(
                    runtime
                        .logs(&request.container_group_id, &request.container_name)
                        .await
                        .unwrap_or_default(),
                )
            }
            None => None,
        };
        self.call(
            Action::DescribeContainerLog,
            request,
            |engine, request, now| engine.log_with(&request, now, real.as_ref()),
        )
        .await
    }

    async fn exec_container_command(
        &self,
        request: Request<ExecContainerCommandRequest>,
    ) -> Result<Response<ExecContainerCommandResponse>, Status> {
        let (group, container) = (
            request.get_ref().container_group_id.clone(),
            request.get_ref().container_name.clone(),
        );
        let (sync, command) = (request.get_ref().sync, request.get_ref().command.clone());
        let mut response = self
            .call(
                Action::ExecContainerCommand,
                request,
                |engine, request, now| engine.exec(&request, now),
            )
            .await?;
        // Real mode: the engine checked the call (the container runs); the command runs in
        // the container.
        if let (true, Some(runtime)) = (sync, self.shared.runtime.get()) {
            response.get_mut().sync_response =
                runtime.exec_sync(&group, &container, &command).await;
        }
        Ok(response)
    }

    async fn describe_container_group_metric(
        &self,
        request: Request<DescribeContainerGroupMetricRequest>,
    ) -> Result<Response<DescribeContainerGroupMetricResponse>, Status> {
        // Real mode: the cgroups are read before the engine's lock is taken.
        let measured = self.shared.runtime.get().map(|runtime| {
            runtime.measure(std::slice::from_ref(&request.get_ref().container_group_id))
        });
        self.call(
            Action::DescribeContainerGroupMetric,
            request,
            |engine, request, now| engine.metric_with(&request, now, measured.as_ref()),
        )
        .await
    }

    async fn describe_multi_container_group_metric(
        &self,
        request: Request<DescribeMultiContainerGroupMetricRequest>,
    ) -> Result<Response<DescribeMultiContainerGroupMetricResponse>, Status> {
        // Real mode: the cgroups are read before the engine's lock is taken.
        let measured = self
            .shared
            .runtime
            .get()
            .map(|runtime| runtime.measure(&request.get_ref().container_group_ids));
        self.call(
            Action::DescribeMultiContainerGroupMetric,
            request,
            |engine, request, now| engine.multi_metric_with(&request, now, measured.as_ref()),
        )
        .await
    }

    async fn create_image_cache(
        &self,
        request: Request<CreateImageCacheRequest>,
    ) -> Result<Response<CreateImageCacheResponse>, Status> {
        self.call(Action::CreateImageCache, request, |engine, request, now| {
            let image_cache_id = engine.create_image_cache(&request, now)?;
            Ok(CreateImageCacheResponse {
                image_cache_id,
                ..CreateImageCacheResponse::default()
            })
        })
        .await
    }

    async fn describe_image_caches(
        &self,
        request: Request<DescribeImageCachesRequest>,
    ) -> Result<Response<DescribeImageCachesResponse>, Status> {
        self.call(
            Action::DescribeImageCaches,
            request,
            |engine, request, now| engine.describe_image_caches(&request, now),
        )
        .await
    }

    async fn update_image_cache(
        &self,
        request: Request<UpdateImageCacheRequest>,
    ) -> Result<Response<UpdateImageCacheResponse>, Status> {
        self.call(Action::UpdateImageCache, request, |engine, request, now| {
            engine.update_image_cache(&request, now)?;
            Ok(UpdateImageCacheResponse::default())
        })
        .await
    }

    async fn delete_image_cache(
        &self,
        request: Request<DeleteImageCacheRequest>,
    ) -> Result<Response<DeleteImageCacheResponse>, Status> {
        self.call(Action::DeleteImageCache, request, |engine, request, now| {
            engine.delete_image_cache(&request, now)?;
            Ok(DeleteImageCacheResponse::default())
        })
        .await
    }
}
