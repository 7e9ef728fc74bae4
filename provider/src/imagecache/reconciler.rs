//! Runs [`plan`](super::plan) for every `ImageCache`, on the elected replica only: a kube
//! `Controller` (level-triggered, one step per pass, requeued while ECI builds and now and
//! then once settled), a finalizer so the ECI cache is deleted before the resource goes, the
//! status written by server-side apply, and Events for what went wrong.
//!
//! A cache is found by the id the status recorded, or — before that id was written, e.g. the
//! status write after a create was lost — by the resource's uid, tagged on every cache, so a
//! resource deleted at that moment does not leave its cache behind.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eci_proto::EciError;
use eci_proto::v20180808::{
    CreateImageCacheRequest, DeleteImageCacheRequest, DescribeImageCachesRequest,
    ImageCache as EciImageCache, ImageRegistryCredential, Tag, UpdateImageCacheRequest,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::finalizer::{self, Event as Finalized, finalizer};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::plan::{self, Build, Observed, Step};
use super::resource::{ImageCache, ImageCacheStatus};
use crate::config::Site;
use crate::eci::ImageCaches;
use crate::k8s::FIELD_MANAGER;
use crate::k8s::access::{Access, Scope};
use crate::k8s::election::{Candidate, LeaseLock, ROLE_RENEW_INTERVAL, Request, Standing};
use crate::ops::chain::Chain;
use crate::ops::events::EventPublisher;
use crate::ops::metrics::Telemetry;
use vne_core::to_eci::naming::TAG_CLUSTER;

/// How long a stopping controller's reconciles in flight may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// The election Lease (in the daemon's namespace) whose holder reconciles image caches.
pub const LEASE: &str = "virtual-node-eci-imagecache";
/// The finalizer held until the ECI cache is deleted.
pub const FINALIZER: &str = "virtual-node-eci.aliyun.com/image-cache";
/// Tag on every cache: the uid of the resource it was built for.
pub const TAG_UID: &str = "virtual-node-eci.aliyun.com/imagecache-uid";
/// The Event reason when ECI could not build a cache.
pub const REASON_FAILED: &str = "ImageCacheFailed";
/// The Event reason when a pass failed (ECI refused a call, a pull secret is missing, …).
pub const REASON_SYNC_FAILED: &str = "ImageCacheSyncFailed";

/// How often a cache ECI is building is looked at.
const BUILDING_POLL: Duration = Duration::from_secs(3);
/// How often a settled cache is looked at (an expiry, a deletion out of band).
const SETTLED_RESYNC: Duration = Duration::from_secs(300);
/// Retry after a failed pass: doubled per failure in a row, up to the cap.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_CAP: Duration = Duration::from_secs(120);

/// What one pass could not do.
#[derive(Debug, thiserror::Error)]
pub enum ImageCacheError {
    /// An ECI call failed.
    #[error("ECI {action} failed")]
    Eci {
        /// The action.
        action: &'static str,
        /// Why.
        #[source]
        source: EciError,
    },
    /// A pull secret could not be read.
    #[error("cannot read the pull secret {reference}")]
    ReadSecret {
        /// `namespace:name`.
        reference: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A pull secret does not exist or holds no registry credentials.
    #[error("the pull secret {reference} {why}")]
    UnusableSecret {
        /// `namespace:name`.
        reference: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Writing the status failed.
    #[error("cannot write the status")]
    Status(#[source] kube::Error),
    /// Adding or removing the finalizer failed (or the pass under it).
    #[error("image cache {name}")]
    Finalizer {
        /// The resource.
        name: String,
        /// Why.
        #[source]
        source: Box<finalizer::Error<ImageCacheError>>,
    },
}

/// The image-cache area: takes part in its election and, while elected, reconciles.
pub struct ImageCacheReconciler {
    site: Arc<Site>,
    client: kube::Client,
    backend: ImageCaches,
    telemetry: Arc<Telemetry>,
}

impl std::fmt::Debug for ImageCacheReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageCacheReconciler")
            .field("site", &self.site)
            .finish_non_exhaustive()
    }
}

fn operation(request: Request) -> &'static str {
    match request {
        Request::Get => "imagecache_lease_get",
        Request::Create => "imagecache_lease_create",
        Request::TakeOver => "imagecache_lease_take_over",
        Request::Renew => "imagecache_lease_renew",
        Request::Release => "imagecache_lease_release",
    }
}

impl ImageCacheReconciler {
    /// The area of the replica at `site`.
    pub fn new(
        site: Arc<Site>,
        client: kube::Client,
        backend: ImageCaches,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Self {
            site,
            client,
            backend,
            telemetry,
        }
    }

    /// Contends for [`LEASE`] every few seconds and runs the controller while holding it;
    /// until `stop` (then the Lease is released for a successor).
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let lock = LeaseLock::new(
            self.client.clone(),
            &self.site.pod_namespace,
            LEASE,
            Candidate::for_role(&self.site.node_name),
        );
        let count = |request| self.telemetry.kube_request(operation(request));
        let mut term: Option<(CancellationToken, tokio::task::JoinHandle<()>)> = None;
        let mut held = None;
        let mut ticks = tokio::time::interval(ROLE_RENEW_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            held = match lock.contend(held.as_ref(), &count).await {
                Ok(Standing::Leading(lease)) => Some(*lease),
                Ok(Standing::Following(_)) => None,
                Err(error) => {
                    warn!(error = %Chain(&error), "cannot take part in the image-cache election; stepping aside until it answers");
                    None
                }
            };
            let leading = held.is_some();
            match (leading, term.is_some()) {
                (true, false) => {
                    info!(lease = LEASE, "elected to reconcile ImageCaches");
                    let own = stop.child_token();
                    let task = tokio::spawn(self.controller(own.clone()));
                    term = Some((own, task));
                }
                (false, true) => {
                    warn!("no longer elected; ImageCaches are left to another replica");
                    end(term.take()).await;
                }
                _ => {}
            }
        }
        end(term.take()).await;
        if let Some(lease) = held {
            let release = lock.release(&lease, &count);
            if tokio::time::timeout(Duration::from_secs(5), release)
                .await
                .is_err()
            {
                debug!("releasing the image-cache election timed out; it expires instead");
            }
        }
        Ok(())
    }

    /// The controller, until `stop`.
    fn controller(&self, stop: CancellationToken) -> impl Future<Output = ()> + use<> {
        let api: Api<ImageCache> = Api::all(self.client.clone());
        let context = Arc::new(Context {
            api: api.clone(),
            client: self.client.clone(),
            backend: Arc::clone(&self.backend),
            site: Arc::clone(&self.site),
            events: EventPublisher::new(
                self.client.clone(),
                Reporter {
                    controller: FIELD_MANAGER.into(),
                    instance: Some(self.site.node_name.clone()),
                },
                Arc::clone(&self.telemetry),
            ),
            failures: std::sync::Mutex::new(std::collections::HashMap::new()),
        });
        // The reconciles in flight, so that a stop waits for them and for nothing else.
        let in_flight = TaskTracker::new();
        let tracked = in_flight.clone();
        async move {
            let stopped = stop.clone();
            let controller = Controller::new(api, watcher::Config::default())
                .graceful_shutdown_on(async move { stopped.cancelled().await })
                .run(
                    move |cache, cx| tracked.track_future(reconcile(cache, cx)),
                    error_policy,
                    context,
                )
                .for_each(|result| async move {
                    match result {
                        // The watch (a missing CRD, a denied list): retried with back-off.
                        Err(error @ kube::runtime::controller::Error::QueueError(_)) => {
                            warn!(error = %Chain(&error), "cannot watch ImageCaches; retrying");
                        }
                        // error_policy said it already.
                        Err(error) => debug!(error = %Chain(&error), "image-cache controller"),
                        Ok(_) => {}
                    }
                });
            tokio::pin!(controller);
            tokio::select! {
                () = &mut controller => {}
                () = stop.cancelled() => {
                    // The graceful shutdown lets reconciles in flight finish, but a watch
                    // retrying in back-off (the CRD not installed) keeps the stream from ending:
                    // the stop would wait for ever. So the stop waits for the reconciles in
                    // flight (still driven by the controller), within a grace, and drops the
                    // rest. Reconciles are idempotent: one cut short is redone by the next leader.
                    in_flight.close();
                    let settled = async {
                        tokio::select! {
                            () = &mut controller => {}
                            () = in_flight.wait() => {}
                        }
                    };
                    if tokio::time::timeout(SHUTDOWN_GRACE, settled).await.is_err() {
                        debug!("image-cache reconciles still ran after the grace; dropped");
                    }
                }
            }
        }
    }
}

async fn end(term: Option<(CancellationToken, tokio::task::JoinHandle<()>)>) {
    if let Some((stop, task)) = term {
        stop.cancel();
        if let Err(error) = task.await {
            warn!(%error, "the image-cache controller ended abnormally");
        }
    }
}

/// What every pass shares.
struct Context {
    api: Api<ImageCache>,
    client: kube::Client,
    backend: ImageCaches,
    site: Arc<Site>,
    events: EventPublisher,
    /// Failed passes in a row, per resource (the retry back-off).
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

async fn reconcile(cache: Arc<ImageCache>, cx: Arc<Context>) -> Result<Action, ImageCacheError> {
    let name = cache.name_any();
    let action = finalizer(&cx.api, FINALIZER, cache, |event| async {
        match event {
            Finalized::Apply(cache) => cx.pass(&cache, false).await,
            Finalized::Cleanup(cache) => cx.pass(&cache, true).await,
        }
    })
    .await
    .map_err(|source| ImageCacheError::Finalizer {
        name: name.clone(),
        source: Box::new(source),
    })?;
    if let Ok(mut failures) = cx.failures.lock() {
        failures.remove(&name);
    }
    Ok(action)
}

// The signature is kube's `error_policy` contract.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(cache: Arc<ImageCache>, error: &ImageCacheError, cx: Arc<Context>) -> Action {
    let name = cache.name_any();
    let failures = cx.failures.lock().map_or(1, |mut failures| {
        let n = failures.entry(name.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    });
    let delays = crate::ops::retry::doubling(RETRY_FIRST, RETRY_CAP);
    let delay = crate::ops::retry::nth(delays, failures.saturating_sub(1));
    warn!(imagecache = %name, error = %Chain(error), retry_in = ?delay, "image-cache pass failed");
    cx.events.publish_later(
        Event {
            type_: EventType::Warning,
            reason: REASON_SYNC_FAILED.into(),
            note: Some(Chain(error).to_string()),
            action: "Reconcile".into(),
            secondary: None,
        },
        cache.object_ref(&()),
    );
    Action::requeue(delay)
}

impl Context {
    /// One pass: look, decide, do one step, write the status.
    async fn pass(&self, cache: &ImageCache, deleting: bool) -> Result<Action, ImageCacheError> {
        let (name, uid) = (cache.name_any(), cache.uid().unwrap_or_default());
        let resource = plan::Resource {
            name: &name,
            uid: &uid,
            generation: cache.metadata.generation.unwrap_or_default(),
            spec: &cache.spec,
            status: cache.status.as_ref(),
            deleting,
        };
        let recorded = resource.status.and_then(|s| s.image_cache_id.as_deref());
        let found = self.observe(recorded, &uid).await?;
        let observed = match (&found, recorded) {
            (Some(eci), _) => Observed::Found(eci),
            (None, Some(_)) => Observed::Gone,
            (None, None) => Observed::NotCreated,
        };
        let step = plan::plan(&resource, observed, SystemTime::now());
        debug!(imagecache = %name, ?step, "image-cache pass");
        let created = match &step {
            Step::Create(build) => Some(self.create(build, &resource).await?),
            Step::Update { id, build } => {
                self.update(id, build, &resource).await?;
                None
            }
            Step::Delete { id } => {
                self.delete(id).await?;
                info!(imagecache = %name, id, "deleted the ECI image cache");
                return Ok(Action::await_change());
            }
            Step::Release => return Ok(Action::await_change()),
            Step::Wait | Step::Settled => None,
        };
        let now = crate::k8s::rfc3339(SystemTime::now());
        let status = plan::status(&resource, observed, &step, created.as_deref(), &now);
        if Some(&status) != cache.status.as_ref() {
            self.apply_status(&name, &status)
                .await
                .map_err(ImageCacheError::Status)?;
            self.announce(cache, &status);
        }
        Ok(match step {
            Step::Settled => Action::requeue(SETTLED_RESYNC),
            _ => Action::requeue(BUILDING_POLL),
        })
    }

    /// The cache by its recorded id, or else by the resource's uid tag.
    async fn observe(
        &self,
        recorded: Option<&str>,
        uid: &str,
    ) -> Result<Option<EciImageCache>, ImageCacheError> {
        let mut request = DescribeImageCachesRequest {
            region_id: self.site.region.clone(),
            ..DescribeImageCachesRequest::default()
        };
        match recorded {
            Some(id) => request.image_cache_id = id.to_owned(),
            None => request.tag = vec![tag(TAG_UID, uid)],
        }
        let answer = self
            .backend
            .describe_image_caches(request)
            .await
            .map_err(|source| ImageCacheError::Eci {
                action: "DescribeImageCaches",
                source,
            })?;
        Ok(answer
            .image_caches
            .into_iter()
            .find(|c| recorded.is_none_or(|id| c.image_cache_id == id)))
    }

    async fn create(
        &self,
        build: &Build,
        resource: &plan::Resource<'_>,
    ) -> Result<String, ImageCacheError> {
        let request = CreateImageCacheRequest {
            region_id: self.site.region.clone(),
            zone_id: self.site.zone.clone().unwrap_or_default(),
            security_group_id: self.site.security_group.clone(),
            v_switch_id: self.site.vswitch.clone(),
            image_cache_name: build.name.clone(),
            image: build.images.clone(),
            image_registry_credential: self.credentials(resource).await?,
            image_cache_size: build.size_gib,
            retention_days: build.retention_days,
            tag: vec![
                tag(TAG_UID, resource.uid),
                tag(TAG_CLUSTER, &self.site.cluster_name),
            ],
            client_token: build.client_token.clone(),
            ..CreateImageCacheRequest::default()
        };
        let answer = self
            .backend
            .create_image_cache(request)
            .await
            .map_err(|source| ImageCacheError::Eci {
                action: "CreateImageCache",
                source,
            })?;
        info!(imagecache = %resource.name, id = %answer.image_cache_id, "created the ECI image cache");
        Ok(answer.image_cache_id)
    }

    async fn update(
        &self,
        id: &str,
        build: &Build,
        resource: &plan::Resource<'_>,
    ) -> Result<(), ImageCacheError> {
        let request = UpdateImageCacheRequest {
            region_id: self.site.region.clone(),
            image_cache_id: id.to_owned(),
            image: build.images.clone(),
            image_registry_credential: self.credentials(resource).await?,
            image_cache_size: build.size_gib,
            retention_days: build.retention_days,
            client_token: build.client_token.clone(),
            ..UpdateImageCacheRequest::default()
        };
        self.backend
            .update_image_cache(request)
            .await
            .map_err(|source| ImageCacheError::Eci {
                action: "UpdateImageCache",
                source,
            })?;
        info!(imagecache = %resource.name, id, "rebuilding the ECI image cache for the new spec");
        Ok(())
    }

    /// Deletes cache `id`; one already gone is done.
    async fn delete(&self, id: &str) -> Result<(), ImageCacheError> {
        let request = DeleteImageCacheRequest {
            region_id: self.site.region.clone(),
            image_cache_id: id.to_owned(),
            ..DeleteImageCacheRequest::default()
        };
        match self.backend.delete_image_cache(request).await {
            Ok(_) => Ok(()),
            Err(error) if error.is_not_found() || error.code.ends_with(".NotFound") => Ok(()),
            Err(source) => Err(ImageCacheError::Eci {
                action: "DeleteImageCache",
                source,
            }),
        }
    }

    /// The registry credentials of the spec's `namespace:secretName` pull secrets. A missing
    /// secret, or one with no credentials, fails the pass: building without them would fail
    /// later with a less useful reason.
    async fn credentials(
        &self,
        resource: &plan::Resource<'_>,
    ) -> Result<Vec<ImageRegistryCredential>, ImageCacheError> {
        let mut out = Vec::new();
        for reference in &resource.spec.image_pull_secrets {
            let unusable = |why| ImageCacheError::UnusableSecret {
                reference: reference.clone(),
                why,
            };
            let (namespace, name) = reference
                .split_once(':')
                .ok_or_else(|| unusable("is not namespace:secretName"))?;
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let secret = secrets
                .get_opt(name)
                .await
                .map_err(|source| ImageCacheError::ReadSecret {
                    reference: reference.clone(),
                    source,
                })?
                .ok_or_else(|| unusable("does not exist"))?;
            let found = vne_core::to_eci::registry_credentials(&secret);
            if found.is_empty() {
                return Err(unusable(
                    "holds no registry credentials (.dockerconfigjson or .dockercfg with a user name)",
                ));
            }
            out.extend(found);
        }
        Ok(out)
    }

    async fn apply_status(&self, name: &str, status: &ImageCacheStatus) -> Result<(), kube::Error> {
        let patch = json!({
            "apiVersion": "eci.alibabacloud.com/v1",
            "kind": "ImageCache",
            "status": status,
        });
        self.api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map(|_| ())
    }

    /// A Warning Event when the cache's build failed (once, as the phase turns).
    fn announce(&self, cache: &ImageCache, status: &ImageCacheStatus) {
        let failed = |s: Option<&ImageCacheStatus>| {
            s.and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Failed" || p == "UpdateFailed")
        };
        if !failed(Some(status)) || failed(cache.status.as_ref()) {
            return;
        }
        let why = status
            .events
            .iter()
            .rev()
            .find(|e| e.kind == "Warning")
            .map_or_else(
                || "ECI reports no reason".to_owned(),
                |e| format!("{}: {}", e.reason, e.message),
            );
        let id = status.image_cache_id.as_deref().unwrap_or_default();
        self.events.publish_later(
            Event {
                type_: EventType::Warning,
                reason: REASON_FAILED.into(),
                note: Some(format!("ECI could not build image cache {id}: {why}")),
                action: "Build".into(),
                secondary: None,
            },
            cache.object_ref(&()),
        );
    }
}

fn tag(key: &str, value: &str) -> Tag {
    Tag {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

/// The API accesses of the image-cache area (see [`crate::k8s::access`]).
pub const KUBE_API: &[Access] = &[
    Access {
        scope: Scope::Cluster,
        group: "eci.alibabacloud.com",
        resource: "imagecaches",
        verbs: &["list", "watch", "patch"],
        why: "the ImageCache reconciler (the patch adds and removes its finalizer)",
    },
    Access {
        scope: Scope::Cluster,
        group: "eci.alibabacloud.com",
        resource: "imagecaches/status",
        verbs: &["patch"],
        why: "each ImageCache's status",
    },
    Access {
        scope: Scope::Cluster,
        group: "",
        resource: "secrets",
        verbs: &["get"],
        why: "an ImageCache's pull secrets (namespace:secretName), read when it is built",
    },
    Access {
        scope: Scope::OwnNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        why: "the image-cache election",
    },
];
