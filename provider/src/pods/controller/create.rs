//! Creating container groups: references, translation, retries, failures on the pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::Retryable as _;
use eci_proto::EciError;
use eci_proto::error::codes;
use eci_proto::v20180808::{
    CreateContainerGroupResponse, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupStatusResponse, Tag,
};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::gate::Admission;
use super::notice::Notice;
use super::{
    ANNOTATION_WRITERS, Failure, INSTANCE_ANNOTATION, PROVIDER_FAILED, PodController, backoff,
    carried, misconfigured, pod_key, pod_key_parts, retry_delays,
};
use vne_core::lifecycle::{Effect, Trigger};
use vne_core::refs;
use vne_core::to_eci::{self, Context, annotations, naming};

/// A pod's ConfigMaps and Secrets read at once, at most.
const REFERENCE_READS: usize = 8;

/// Event reason: the group was created, but ECI cannot do all the pod asks (see
/// [`to_eci::limits`]).
pub(super) const NOT_FULLY_SUPPORTED: &str = "NotFullySupportedOnECI";

/// What the daemon writes on a pod once its group exists: the group's id and what the
/// creation's answer said (see [`annotations::written_back`]), in one metadata patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WriteBack {
    values: BTreeMap<&'static str, String>,
    /// The create listed several vSwitches, so only the service knows the zone the group
    /// landed in: the writer adds it from the group's description to the same patch.
    look_up_zone: bool,
}

impl WriteBack {
    /// From the creation's answer (`request_id` empty when it is not known: a group adopted
    /// after a restart).
    pub(super) fn new(group_id: &str, request_id: &str) -> Self {
        Self {
            values: annotations::written_back(group_id, request_id),
            look_up_zone: false,
        }
    }

    /// The zone is to be read before writing (see `look_up_zone`).
    fn with_zone_lookup(mut self, several_vswitches: bool) -> Self {
        self.look_up_zone = several_vswitches;
        self
    }

    fn group_id(&self) -> &str {
        self.values
            .get(INSTANCE_ANNOTATION)
            .map_or("", String::as_str)
    }
}

/// Failed creation attempts after which the pod says why it is still Pending (once; the
/// daemon keeps trying).
const REPORT_AFTER_ATTEMPTS: u32 = 3;

/// Whether the failure of creation attempt `attempt` (counted from 0) is reported on the pod
/// (`ProviderFailed`, phase Pending): once the problem persisted, and only while ECI shows no
/// group for the pod. A group the status poll already found (`group_seen`) was made by an
/// earlier attempt whose answer was lost — a timeout, a dropped connection — and the pod
/// already shows its state: a Pending written over it would stay, since the group's state
/// does not change again and so is never written again.
fn report_failure(attempt: u32, group_seen: bool) -> bool {
    attempt == REPORT_AFTER_ATTEMPTS && !group_seen
}

/// Condition and Event reason (the kubelet's attach-detach controller's): a disk the pod
/// mounts is attached elsewhere.
const FAILED_ATTACH_VOLUME: &str = "FailedAttachVolume";

/// What a pod waiting for a disk another group holds is told (`service`: ECI's message).
fn disk_in_use_message(service: &str) -> String {
    format!(
        "Multi-Attach error: {}; a cloud disk (ReadWriteOnce) is one ECI instance's at a time, so the pod stays Pending and is retried with back-off until the other instance is deleted",
        service.trim_end_matches('.')
    )
}

/// Condition and Event reason (ACK's): no zone of the pod's vSwitches has stock.
pub(super) const NO_STOCK: &str = "NoStock";

/// What a create refused for lack of stock in every listed zone comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StockVerdict {
    /// The pod stays Pending and is retried with back-off (what it shows).
    Wait(String),
    /// The pod fails (why).
    Fail(String),
}

/// The pod's `eci-fail-strategy` and `eci-max-pending-minute` (`limit`) applied to a create
/// refused for stock after the pod `waited` since its creation; `service` is ECI's message.
fn on_no_stock(
    strategy: annotations::FailStrategy,
    waited: Duration,
    limit: Duration,
    service: &str,
) -> StockVerdict {
    let minutes = limit.as_secs() / 60;
    let service = service.trim_end_matches('.');
    match strategy {
        annotations::FailStrategy::FailFast => StockVerdict::Fail(format!(
            "No zone of the pod's vSwitches has stock ({service}); eci-fail-strategy is fail-fast, so the pod is not retried"
        )),
        annotations::FailStrategy::Retry if waited >= limit => StockVerdict::Fail(format!(
            "No zone of the pod's vSwitches had stock for {minutes} minutes, the pod's eci-max-pending-minute ({service}); give it vSwitches in more zones or other instance specifications"
        )),
        annotations::FailStrategy::Retry => StockVerdict::Wait(format!(
            "No zone of the pod's vSwitches has stock ({service}); the pod stays Pending and is retried with back-off for up to {minutes} minutes after its creation (eci-max-pending-minute)"
        )),
    }
}

/// A pod waiting for its group: how many attempts failed, and when it was first seen (the
/// creation latency metric starts there).
#[derive(Debug, Clone, Copy)]
pub(super) struct CreateJob {
    pub(super) attempt: u32,
    pub(super) seen: tokio::time::Instant,
    /// What the last attempt met that is already shown on the pod (not shown again).
    pub(super) shown: Explained,
}

/// A refusal already shown on a waiting pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Explained {
    /// Nothing.
    Nothing,
    /// A misconfiguration: the job waits for the configuration to be accepted again (or its
    /// back-off).
    Misconfiguration,
    /// A refusal of the pod's own parameters, by its fingerprint: the job waits its back-off.
    Refusal(u64),
    /// No zone has stock: the job waits its back-off.
    NoStock,
    /// References the pod needs are missing, by their fingerprint: the job waits its back-off.
    Absent(u64),
    /// A disk the pod mounts is another group's, by the message's fingerprint: the job waits
    /// its back-off.
    DiskInUse(u64),
    /// A container's settings cannot be resolved, by the message's fingerprint: the job waits
    /// its back-off.
    ContainerConfig(u64),
}

/// What a create reads or issues for the pod before translating it.
struct Gathered {
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    claims: BTreeMap<String, PersistentVolume>,
    issued: crate::pods::tokens::Issued,
    /// Optional references that do not exist: the pod is created without them.
    optional: Vec<refs::Absent>,
}

/// What showing `failure` on the pod explains: the same explanation is not shown twice in a
/// row.
fn explained(failure: &Failure) -> Explained {
    match failure {
        Failure::Misconfigured(_) => Explained::Misconfiguration,
        Failure::Refused(refusal) => Explained::Refusal(super::hash_of(&refusal.describe())),
        Failure::Absent(absent) => Explained::Absent(super::hash_of(absent)),
        Failure::DiskInUse(message) => Explained::DiskInUse(super::hash_of(message)),
        Failure::ContainerConfig { message, .. } => {
            Explained::ContainerConfig(super::hash_of(message))
        }
        Failure::NoStock(_) => Explained::NoStock,
        Failure::Retry(_) | Failure::Permanent(_) | Failure::InvalidAnnotation(_) => {
            Explained::Nothing
        }
    }
}

impl CreateJob {
    /// A first attempt, for a pod seen now.
    pub(super) fn fresh() -> Self {
        Self {
            attempt: 0,
            seen: tokio::time::Instant::now(),
            shown: Explained::Nothing,
        }
    }
}

impl PodController {
    /// Shows on the pod why it does not run on ECI (from its sync).
    pub(super) fn explain_skip(&self, pod: &Pod, reason: &'static str) {
        info!(reason, "not running this pod on ECI");
        self.show(
            pod,
            Notice::phase("Pending", "NotSupportedOnVirtualNode", reason),
        );
    }

    /// A Selector's effect deferred to binding (fair, normalNodePrefer) lands on the pod now,
    /// before the group is created, so the group is created with it and the pod shows it.
    /// Only an effect the webhook sealed is applied: one a pod author wrote (or altered, or
    /// copied from another pod) is ignored, with a Warning Event and a log line.
    async fn apply_pending_effect(&self, pod: Arc<Pod>) -> Result<Arc<Pod>, Failure> {
        use crate::admission::seal;
        use vne_core::selector::engine::PENDING_EFFECT_ANNOTATION;
        if !pod.annotations().contains_key(PENDING_EFFECT_ANNOTATION) {
            return Ok(pod);
        }
        let key = seal::shared_key(&self.inner.client, &self.inner.config.site.pod_namespace)
            .await
            .map_err(|error| {
                Failure::Retry(format!(
                    "cannot check the Selector's effect: {}",
                    crate::ops::chain::Chain(&error)
                ))
            })?;
        let patch = match key.check(&pod) {
            seal::Checked::Absent => return Ok(pod),
            seal::Checked::Sealed(patch) => patch,
            seal::Checked::Refused(why) => {
                warn!(%why, "ignoring a Selector effect the webhook did not write");
                self.event(
                    &pod,
                    EventType::Warning,
                    "ForgedSelectorEffect",
                    &format!("ignored, not applied: {why}"),
                )
                .await;
                return Ok(pod);
            }
        };
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        self.inner.telemetry.kube_request("pod_patch");
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        {
            Ok(patched) => {
                info!("applied the Selector's effect before creating the container group");
                Ok(Arc::new(patched))
            }
            Err(error) => Err(Failure::Retry(format!(
                "cannot apply the Selector's effect to the pod: {error}"
            ))),
        }
    }

    /// Creation workers (`MAX_CONCURRENT_CREATES` of them): one attempt per job; a pod to
    /// retry waits out its back-off as a value in the queue's timers, outside the workers, so
    /// pods backing off (a missing ConfigMap, an outage) never hold a slot the others need and
    /// cost a few bytes each. Pods held back by the daemon's configuration go as soon as ECI
    /// no longer refuses it, not at the end of a back-off of up to 20 s.
    pub(super) async fn create_groups(self, stop: CancellationToken) -> anyhow::Result<()> {
        let workers = self.inner.config.args.max_concurrent_creates;
        let this = self.clone();
        let creating = self.inner.creations.serve(workers, &stop, move |uid, job| {
            let this = this.clone();
            async move {
                if let Some(next) = this.create_once(&uid, job).await {
                    let creations = &this.inner.creations;
                    // Fixed while this attempt ran: its release went by before it waited.
                    let fixed = this.inner.misconfig.current().is_none();
                    if next.shown == Explained::Misconfiguration && fixed {
                        creations.push(uid, next);
                    } else {
                        creations.push_after(uid, next, backoff(next.attempt));
                    }
                }
            }
        });
        let mut configuration = self.inner.misconfig.subscribe();
        let configuration_fixed = async {
            while configuration.changed().await.is_ok() {
                if configuration.borrow_and_update().is_none() {
                    let waiting = |job: &CreateJob| job.shown == Explained::Misconfiguration;
                    self.inner.creations.release_now(waiting);
                }
            }
        };
        let until_stop = async {
            tokio::select! {
                () = stop.cancelled() => {}
                () = configuration_fixed => {}
            }
        };
        tokio::join!(creating, until_stop);
        Ok(())
    }

    /// The whole pod for a creation: the kept copy unless it was slimmed, then a fresh read.
    async fn whole_pod(&self, uid: &str) -> Result<Option<Arc<Pod>>, Failure> {
        let (pod, slim) = {
            let tracked = self.tracked();
            match tracked.get(uid) {
                Some(t) if !t.lifecycle.is_deleting() => match &t.pod {
                    Some(kept) => (kept.clone(), kept.is_slim()),
                    None => return Ok(None),
                },
                _ => return Ok(None),
            }
        };
        let Some(pod) = pod.pod() else {
            return Ok(None);
        };
        if !slim {
            return Ok(Some(pod));
        }
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        self.inner.telemetry.kube_request("pod_get");
        match api.get_opt(&pod.name_any()).await {
            Ok(Some(fresh)) if fresh.uid().as_deref() == Some(uid) => Ok(Some(Arc::new(fresh))),
            Ok(_) => Ok(None),
            Err(error) => Err(Failure::Retry(format!("cannot read the pod: {error}"))),
        }
    }

    /// One creation attempt; the job to retry, if any.
    async fn create_once(&self, uid: &str, job: CreateJob) -> Option<CreateJob> {
        let retry = CreateJob {
            attempt: job.attempt + 1,
            seen: job.seen,
            shown: Explained::Nothing,
        };
        let pod = match self.whole_pod(uid).await {
            Ok(Some(pod)) => pod,
            Ok(None) => {
                if job.attempt > 0 {
                    // Off the creation worker: the look-up retries with back-off.
                    let (this, uid) = (self.clone(), uid.to_owned());
                    self.spawn_pod_task(async move { this.sweep_unanswered(&uid).await });
                }
                return None;
            }
            Err(failure) => {
                debug!(pod_uid = %uid, message = %failure.message(), "retrying");
                return Some(retry);
            }
        };
        let span = info_span!("reconcile", pod = %pod_key(&pod), uid = %uid);
        async {
            // Before anything of the pod is read or created: the administrators' say.
            match self.admit(&pod, uid).await {
                Admission::Go => {}
                Admission::Held => return None,
                Admission::Later => return Some(retry),
            }
            let judged = pod.clone();
            let pod = match self.apply_pending_effect(pod).await {
                Ok(patched) => patched,
                Err(failure) => {
                    debug!(message = %failure.message(), attempt = job.attempt, "retrying");
                    return Some(retry);
                }
            };
            // The patch answers with the pod as the API server holds it now, which may carry
            // what its author wrote since the copy judged above: the copy translated is the
            // copy judged.
            if !Arc::ptr_eq(&pod, &judged) {
                match self.admit(&pod, uid).await {
                    Admission::Go => {}
                    Admission::Held => return None,
                    Admission::Later => return Some(retry),
                }
            }
            match self.try_create(&pod, uid).await {
                Ok((created, left_out)) => {
                    self.on_created(uid, &pod, job, created, &left_out).await
                }
                Err(failure) => self.on_failure(uid, &pod, job, failure),
            }
        }
        .instrument(span)
        .await
    }

    /// A group was created for the pod: recorded (deleted again if the pod went meanwhile),
    /// its id queued for the pod, and the author told what it runs without.
    async fn on_created(
        &self,
        uid: &str,
        pod: &Arc<Pod>,
        job: CreateJob,
        created: WriteBack,
        left_out: &[refs::Absent],
    ) -> Option<CreateJob> {
        let pod = Arc::clone(pod);
        let id = created.group_id().to_owned();
        self.inner
            .metrics
            .pod_create_seconds
            .observe(job.seen.elapsed().as_secs_f64());
        // Not when the pod began deleting meanwhile (or went).
        let wanted = matches!(self.record_created(uid, &id), Some(Effect::Annotate(_)));
        if !wanted {
            // The pod went away while its group was being created: no leak.
            info!(eci_id = %id, "the pod was deleted during creation; deleting its new container group");
            self.delete_group_eventually(id);
            return None;
        }
        info!(eci_id = %id, "created container group");
        self.inner
            .annotations
            .push(uid.to_owned(), (pod_key_parts(&pod), created));
        let unused = annotations::notices(&pod.annotations().clone());
        if !unused.is_empty() {
            // Created without them: the author hears which and why.
            self.event(
                &pod,
                EventType::Warning,
                annotations::NOT_HONOURED,
                &unused.join("; "),
            )
            .await;
        }
        for absent in left_out {
            // Created without them, as the pod allows: the author hears which.
            self.event(
                &pod,
                EventType::Warning,
                absent.reason(),
                &absent.to_string(),
            )
            .await;
        }
        let limits = to_eci::limits(&pod);
        if !limits.is_empty() {
            // The group runs, but not exactly as asked: never silently.
            self.event(
                &pod,
                EventType::Warning,
                NOT_FULLY_SUPPORTED,
                &limits.join("; "),
            )
            .await;
        }
        None
    }

    /// No zone had stock: the pod waits (told once) or fails, as its fail strategy says.
    fn on_no_stock(
        &self,
        uid: &str,
        pod: &Pod,
        job: CreateJob,
        retry: CreateJob,
        message: &str,
    ) -> Option<CreateJob> {
        self.inner.metrics.pod_create_retries.inc();
        let (strategy, limit) = annotations::on_no_stock(pod.annotations());
        let waited = pod
            .creation_timestamp()
            .and_then(|t| SystemTime::from(t.0).elapsed().ok())
            .unwrap_or_default();
        match on_no_stock(strategy, waited, limit, message) {
            StockVerdict::Wait(shown) => {
                let group_seen = self.has_group(uid);
                if job.shown != Explained::NoStock && !group_seen {
                    self.show(
                        pod,
                        Notice::not_created("Pending", NO_STOCK, NO_STOCK, &shown),
                    );
                }
                debug!(attempt = job.attempt, "no zone has stock; retrying");
                Some(CreateJob {
                    shown: Explained::NoStock,
                    ..retry
                })
            }
            StockVerdict::Fail(why) => {
                warn!(%why, "no zone has stock; failing the pod");
                let notice = Notice::not_created("Failed", PROVIDER_FAILED, NO_STOCK, &why);
                self.show(pod, notice);
                None
            }
        }
    }

    /// A create failed: the retry to queue (explained on the pod once), or none.
    fn on_failure(
        &self,
        uid: &str,
        pod: &Arc<Pod>,
        job: CreateJob,
        failure: Failure,
    ) -> Option<CreateJob> {
        let pod = Arc::clone(pod);
        let retry = CreateJob {
            attempt: job.attempt + 1,
            seen: job.seen,
            shown: Explained::Nothing,
        };
        match failure {
            Failure::Retry(message) => {
                self.inner.metrics.pod_create_retries.inc();
                let group_seen = self.has_group(uid);
                if report_failure(job.attempt, group_seen) {
                    // Tell the user once the problem persists, then keep trying.
                    self.set_provider_failed(&pod, &message, false);
                }
                debug!(%message, attempt = job.attempt, "create failed; retrying");
                Some(retry)
            }
            Failure::Permanent(message) => {
                warn!(%message, "this pod cannot run on ECI");
                self.advance(uid, Trigger::CreateFailed);
                self.set_provider_failed(&pod, &message, true);
                None
            }
            Failure::InvalidAnnotation(message) => {
                warn!(%message, "the pod's annotation is malformed; not creating its group");
                self.advance(uid, Trigger::CreateFailed);
                self.set_invalid_annotation(&pod, &message);
                None
            }
            Failure::NoStock(message) => self.on_no_stock(uid, &pod, job, retry, &message),
            waiting => self.on_waiting(uid, &pod, job.shown, retry, &waiting),
        }
    }

    /// A failure the pod waits out — ECI refusing the daemon's configuration or the pod's own
    /// parameters, missing references, a disk another group holds: shown on the pod once per
    /// distinct reason (not at every retry), never over a group found meanwhile.
    fn on_waiting(
        &self,
        uid: &str,
        pod: &Pod,
        shown_before: Explained,
        retry: CreateJob,
        failure: &Failure,
    ) -> Option<CreateJob> {
        self.inner.metrics.pod_create_retries.inc();
        let shown = explained(failure);
        if shown != shown_before && !self.has_group(uid) {
            self.explain_waiting(pod, failure);
        }
        debug!(attempt = retry.attempt, reason = %failure.message(), "the pod waits; retrying");
        Some(CreateJob { shown, ..retry })
    }

    /// Shows on the pod why it waits (see [`Self::on_waiting`]).
    fn explain_waiting(&self, pod: &Pod, failure: &Failure) {
        match failure {
            Failure::Misconfigured(found) => self.explain_misconfiguration(pod, found),
            Failure::Refused(refusal) => self.explain_refusal(pod, refusal),
            Failure::Absent(absent) => self.explain_absent(pod, absent),
            Failure::DiskInUse(message) => {
                let message = disk_in_use_message(message);
                info!(%message, "a disk the pod mounts is another group's; it waits");
                let notice = Notice::not_created(
                    "Pending",
                    "ContainerCreating",
                    FAILED_ATTACH_VOLUME,
                    &message,
                );
                self.show(pod, notice);
            }
            Failure::ContainerConfig { container, message } => {
                info!(%container, %message, "a container's settings cannot be resolved; the pod waits");
                self.show(pod, Notice::container_config(container, message));
            }
            Failure::Retry(_)
            | Failure::Permanent(_)
            | Failure::InvalidAnnotation(_)
            | Failure::NoStock(_) => {}
        }
    }

    /// One create: the group's write-back, and the optional references it was created without.
    pub(super) async fn try_create(
        &self,
        pod: &Pod,
        uid: &str,
    ) -> Result<(WriteBack, Vec<refs::Absent>), Failure> {
        let gathered = self.gather(pod).await?;
        let request = self.translate(pod, &gathered).await?;
        debug_assert_eq!(request.client_token, uid);
        let config = &self.inner.config;
        let several_vswitches = request.v_switch_id.contains(',');
        let chosen = misconfigured::pod_chosen(
            &request,
            misconfigured::OwnParameters {
                vswitch: &config.site.vswitch,
                security_group: &config.site.security_group,
            },
        );
        let outcome = self.inner.backend.create_container_group(request).await;
        let outcome = self.recover_lost_answer(uid, outcome).await?;
        // The one place a creation's answer is judged: the pod's problem, the node's
        // (a misconfiguration, see `misconfigured.rs`), or a moment's.
        let response = self.judge_creation(outcome, chosen)?;
        self.inner.tokens.track(
            pod,
            &response.container_group_id,
            gathered.issued.refresh_in,
        );
        let back = WriteBack::new(&response.container_group_id, &response.request_id)
            .with_zone_lookup(several_vswitches);
        Ok((back, gathered.optional))
    }

    /// What the pod references, read (or issued, for tokens) at once: a token-mounting pod
    /// waits one round trip before its create, not one per object. Missing mandatory
    /// references fail it ([`Failure::Absent`]); missing optional ones are returned.
    async fn gather(&self, pod: &Pod) -> Result<Gathered, Failure> {
        let namespace = pod.namespace().unwrap_or_default();
        let refs = refs::references(pod);
        let tokens = async {
            if refs.tokens.is_empty() {
                return Ok(crate::pods::tokens::Issued::default());
            }
            // A retried create reuses the tokens of its earlier attempts.
            self.inner
                .tokens
                .issue_for_create(&self.inner.client, &self.inner.telemetry, pod, &refs.tokens)
                .await
                .map_err(|e| Failure::Retry(crate::ops::chain::Chain(&e).to_string()))
        };
        let (config_maps, secrets, (claims, unmountable), issued) = tokio::try_join!(
            self.fetch::<ConfigMap>(&namespace, &refs.config_maps),
            self.fetch::<Secret>(&namespace, &refs.secrets),
            self.claimed_volumes(pod, &namespace, &refs.claims),
            tokens,
        )?;
        // A disk of another zone than this node's waits as an unmountable claim does, before
        // any create: ECI would refuse it.
        let out_of_zone = refs::out_of_zone(pod, &claims, self.inner.config.site.zone.as_deref());
        let (absent, optional): (Vec<_>, Vec<_>) = refs::absent(pod, &config_maps, &secrets)
            .into_iter()
            .chain(unmountable)
            .chain(out_of_zone)
            .partition(|absent| !absent.optional);
        if !absent.is_empty() {
            return Err(Failure::Absent(absent));
        }
        Ok(Gathered {
            config_maps,
            secrets,
            claims,
            issued,
            optional,
        })
    }

    /// The pod as a CreateContainerGroup request, with what was gathered for it and the
    /// Services its environment shows.
    async fn translate(
        &self,
        pod: &Pod,
        gathered: &Gathered,
    ) -> Result<eci_proto::v20180808::CreateContainerGroupRequest, Failure> {
        // The Service environment comes from the cache, complete only once it listed.
        if !self.inner.services.ready(Duration::from_secs(5)).await {
            return Err(Failure::Retry(
                "the Service cache has not listed the cluster's Services yet".into(),
            ));
        }
        let config = &self.inner.config;
        let apiserver = vne_core::service_env::apiserver_service(
            self.inner.services.apiserver().as_deref(),
            config.args.kubernetes_service_host.as_deref(),
            config.args.kubernetes_service_port,
        );
        let links = pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false);
        let services = if links {
            self.inner
                .services
                .in_namespace(&pod.namespace().unwrap_or_default())
        } else {
            Vec::new()
        };
        let cx = Context {
            config_maps: &gathered.config_maps,
            secrets: &gathered.secrets,
            claims: &gathered.claims,
            service_account_tokens: &gathered.issued.tokens,
            apiserver: apiserver.as_ref(),
            services: &services,
            ..crate::pods::site_context(config)
        };
        to_eci::translate(pod, &cx).map_err(|rejection| {
            let message = rejection.to_string();
            if annotations::rejected_annotation(&rejection).is_some() {
                Failure::InvalidAnnotation(message)
            } else if let Some(container) = rejection.config_error_in {
                Failure::ContainerConfig { container, message }
            } else if rejection.retryable {
                Failure::Retry(message)
            } else {
                Failure::Permanent(message)
            }
        })
    }

    /// ECI refuses a `ClientToken` reused with other parameters (`IdempotentParameterMismatch`),
    /// and a retry after a lost answer is such a reuse when anything the request is made from
    /// changed in between: a service account token issued again, a Service, a ConfigMap. The
    /// earlier attempt made the group, so it is looked up by its own tags (this cluster and
    /// node, the pod's UID) and taken as the answer; its tokens are refreshed on the usual
    /// schedule.
    ///
    /// The mismatch says such a group was made, so until it is found (a failed look-up, a
    /// listing that lags) the pod is retried, never failed beside a group nobody tracks; and a
    /// failed look-up is not judged as the create's answer.
    async fn recover_lost_answer(
        &self,
        uid: &str,
        outcome: Result<CreateContainerGroupResponse, EciError>,
    ) -> Result<Result<CreateContainerGroupResponse, EciError>, Failure> {
        match &outcome {
            Err(error) if error.code == codes::IDEMPOTENT_PARAMETER_MISMATCH => {}
            _ => return Ok(outcome),
        }
        let page = self.groups_of_pod(uid).await.map_err(|error| {
            Failure::Retry(format!(
                "an earlier create's answer was lost and its group cannot be looked up yet: {error}"
            ))
        })?;
        let Some(group) = page.data.into_iter().next() else {
            return Err(Failure::Retry(
                "an earlier create's answer was lost and its group is not listed yet".into(),
            ));
        };
        info!(eci_id = %group.container_group_id, "an earlier create's answer was lost; its container group is this pod's");
        Ok(Ok(CreateContainerGroupResponse {
            request_id: page.request_id,
            container_group_id: group.container_group_id,
        }))
    }

    /// The groups of this node tagged with the pod UID `uid` (at most one, unless something
    /// else created groups under our tags).
    async fn groups_of_pod(
        &self,
        uid: &str,
    ) -> Result<DescribeContainerGroupStatusResponse, EciError> {
        let mut tags = self.node_tags();
        tags.push(Tag {
            key: naming::TAG_POD_UID.into(),
            value: uid.to_owned(),
        });
        let mut page = self
            .inner
            .backend
            .describe_container_group_status(DescribeContainerGroupStatusRequest {
                region_id: self.inner.config.site.region.clone(),
                tag: tags,
                limit: Some(20),
                ..DescribeContainerGroupStatusRequest::default()
            })
            .await?;
        page.data
            .retain(|group| super::tag(group, naming::TAG_POD_UID).as_deref() == Some(uid));
        Ok(page)
    }

    /// A pod that went away while its creation was being retried. An earlier attempt's answer
    /// may have been lost after ECI made the group (a timeout, a dropped connection), and
    /// nothing else would ever delete that group while this node lives (the orphan collector
    /// spares live nodes' groups, and only a restart's adoption lists them): it is looked up by
    /// its tags and deleted. One read per such pod.
    async fn sweep_unanswered(&self, uid: &str) {
        let looked_up = (|| self.groups_of_pod(uid))
            .retry(retry_delays().with_max_times(3))
            .notify(|error, wait| {
                debug!(pod_uid = %uid, %error, retry_in = ?wait, "cannot look for a group an unanswered create made; retrying");
            })
            .await;
        match looked_up {
            Ok(page) => {
                for group in page.data {
                    info!(pod_uid = %uid, eci_id = %group.container_group_id, "the pod went away while its creation was retried; deleting the group an unanswered attempt made");
                    self.delete_group_eventually(group.container_group_id);
                }
            }
            Err(error) => {
                warn!(pod_uid = %uid, %error, "could not look for a group an unanswered create may have made; the next restart's adoption finds it if it exists");
            }
        }
    }

    /// The PersistentVolume each of the pod's `claims` (of `namespace`) is bound to, by claim
    /// name, and the claims that cannot be mounted yet ([`refs::bound_volumes`]).
    async fn claimed_volumes(
        &self,
        pod: &Pod,
        namespace: &str,
        claims: &std::collections::BTreeSet<String>,
    ) -> Result<(BTreeMap<String, PersistentVolume>, Vec<refs::Absent>), Failure> {
        if claims.is_empty() {
            return Ok((BTreeMap::new(), Vec::new()));
        }
        let claims = self
            .fetch::<PersistentVolumeClaim>(namespace, claims)
            .await?;
        let all: Api<PersistentVolume> = Api::all(self.inner.client.clone());
        let volumes = self.read_each(all, &refs::volume_names(&claims)).await?;
        Ok(refs::bound_volumes(pod, &claims, &volumes))
    }

    pub(super) async fn fetch<K>(
        &self,
        namespace: &str,
        names: &std::collections::BTreeSet<String>,
    ) -> Result<BTreeMap<String, K>, Failure>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.inner.client.clone(), namespace);
        self.read_each(api, names).await
    }

    /// The objects of `api` named `names` that exist, by name.
    async fn read_each<K>(
        &self,
        api: Api<K>,
        names: &std::collections::BTreeSet<String>,
    ) -> Result<BTreeMap<String, K>, Failure>
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        // Together: a pod's few references cost one round trip, not one each; a pod naming
        // dozens does not open dozens of requests at once.
        let reads = names.iter().cloned().map(|name| {
            let (api, telemetry) = (api.clone(), Arc::clone(&self.inner.telemetry));
            async move {
                telemetry.kube_request("pod_reference_get");
                match api.get_opt(&name).await {
                    Ok(object) => Ok(object.map(|object| (name, object))),
                    Err(error) => Err(Failure::Retry(format!("cannot read {name}: {error}"))),
                }
            }
        });
        let found: Vec<Option<(String, K)>> = futures::stream::iter(reads)
            .buffer_unordered(REFERENCE_READS)
            .try_collect()
            .await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// Annotation writers: gather what each new group's pod is to show of it, off the creation
    /// path (a creation worker moves on to the next pod as soon as ECI accepted the group).
    pub(super) async fn annotate_pods(self, stop: CancellationToken) -> anyhow::Result<()> {
        let this = self.clone();
        self.inner
            .annotations
            .serve(ANNOTATION_WRITERS, &stop, move |uid, (key, back)| {
                let this = this.clone();
                async move { this.annotate(&key, &uid, &back).await }
            })
            .await;
        Ok(())
    }

    /// Queues the group's id (and what else the creation's answer gave, see [`WriteBack`])
    /// for the pod with `uid`, with what the group's description adds
    /// ([`annotations::described`]), to ride on the pod's next status apply (see
    /// [`carried`](super::carried)): no pod write of its own. The description is shared with
    /// the other writers' (one DescribeContainerGroups per up to 20 groups); when it fails the
    /// pod is annotated with what is known rather than not at all.
    async fn annotate(&self, (namespace, name): &(String, String), uid: &str, back: &WriteBack) {
        let id = back.group_id();
        let mut values = back.values.clone();
        match self
            .describe_group(id, super::describe::Lookup::WriteBack)
            .await
        {
            Ok(Some(group)) => values.extend(annotations::described(&group, back.look_up_zone)),
            Ok(None) => {
                warn!(pod = %format!("{namespace}/{name}"), eci_id = %id, "the container group is not described yet; annotating the pod with the creation's answer only");
            }
            Err(error) => {
                let error = crate::ops::chain::Chain(&error).to_string();
                warn!(pod = %format!("{namespace}/{name}"), eci_id = %id, %error, "cannot describe the container group; annotating the pod with the creation's answer only");
            }
        }
        let values = carried::values(values.iter().map(|(key, value)| (*key, value.as_str())));
        let queued = match self.tracked().get_mut(uid) {
            Some(entry) if entry.lifecycle.live_group() == Some(id) => {
                entry.carried.queue(values, tokio::time::Instant::now());
                true
            }
            _ => false,
        };
        // The sync that falls due when they waited too long writes them, unless a status
        // write carries them first.
        if queued {
            self.requeue(uid, None);
        }
    }

    /// A malformed annotation: the pod is Failed with the condition ACK users watch
    /// (`ContainerInstanceCreated=False`, reason `InvalidAnnotation`, the message naming the
    /// annotation and what it accepts) and a Warning Event; nothing is created.
    fn set_invalid_annotation(&self, pod: &Pod, message: &str) {
        let invalid = annotations::INVALID;
        self.show(
            pod,
            Notice::not_created("Failed", invalid, invalid, message),
        );
    }

    /// References the pod needs are missing: it stays Pending with the condition ACK users
    /// watch (`ContainerInstanceCreated=False`, the first one's reason) and the kubelet's pod
    /// reason for a container it cannot configure, and a Warning Event names each.
    fn explain_absent(&self, pod: &Pod, absent: &[refs::Absent]) {
        let Some(first) = absent.first() else { return };
        let message = super::absent_message(absent);
        info!(%message, "references the pod needs are missing; it waits");
        let notice = Notice::not_created("Pending", first.pod_reason(), first.reason(), &message);
        self.show(pod, notice);
        for other in &absent[1..] {
            self.publish_later(pod, EventType::Warning, other.reason(), &other.to_string());
        }
    }

    pub(super) fn set_provider_failed(&self, pod: &Pod, message: &str, permanent: bool) {
        let phase = if permanent { "Failed" } else { "Pending" };
        self.show(pod, Notice::phase(phase, PROVIDER_FAILED, message));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_persistent_failure_is_reported_once_and_never_over_a_group_eci_shows() {
        let reported: Vec<u32> = (0..10).filter(|a| report_failure(*a, false)).collect();
        assert_eq!(reported, [REPORT_AFTER_ATTEMPTS], "once, when it persisted");
        // The first attempt's answer was lost, yet the group exists and the status poll found
        // it (the fault suite's lost_create_answers case stranded pods in Pending this way).
        assert!((0..10).all(|a| !report_failure(a, true)));
    }

    #[test]
    fn no_stock_waits_or_fails_as_the_pod_asks() {
        use annotations::FailStrategy::{FailFast, Retry};
        let minute = Duration::from_secs(60);
        let cases = [
            // (strategy, waited, limit, fails, the message says)
            (
                Retry,
                Duration::ZERO,
                240 * minute,
                false,
                "up to 240 minutes",
            ),
            (Retry, 239 * minute, 240 * minute, false, "stays Pending"),
            (Retry, 240 * minute, 240 * minute, true, "for 240 minutes"),
            (
                Retry,
                31 * minute,
                30 * minute,
                true,
                "eci-max-pending-minute",
            ),
            (FailFast, Duration::ZERO, 240 * minute, true, "fail-fast"),
            (FailFast, 500 * minute, 240 * minute, true, "not retried"),
        ];
        for (strategy, waited, limit, fails, says) in cases {
            let verdict = on_no_stock(strategy, waited, limit, "out of stock in zone-a.");
            let (failed, text) = match &verdict {
                StockVerdict::Fail(text) => (true, text),
                StockVerdict::Wait(text) => (false, text),
            };
            assert_eq!(failed, fails, "{strategy:?} {waited:?}: {verdict:?}");
            assert!(text.contains(says), "{text}");
            assert!(
                text.contains("out of stock in zone-a"),
                "ECI's words kept: {text}"
            );
        }
    }

    #[test]
    fn the_write_back_carries_the_group_id_under_the_instance_annotation() {
        let back = WriteBack::new("eci-1", "req-1");
        assert_eq!(back.group_id(), "eci-1");
        assert_eq!(back.values.len(), 2, "{back:?}");
        assert!(!back.look_up_zone, "one vSwitch: nothing to look up");
        assert!(back.with_zone_lookup(true).look_up_zone);
        assert_eq!(WriteBack::new("eci-2", "").group_id(), "eci-2");
    }

    /// A token-mounting pod's create asks for its root CA ConfigMap, its Secret and its token
    /// at the same moment, each answered after a second: its create waits one round trip, not
    /// three (under load each round trip is long, and a create worker waits through them all).
    #[tokio::test(start_paused = true)]
    async fn a_pods_references_and_tokens_are_asked_for_at_once() {
        use std::sync::Mutex;

        let started = tokio::time::Instant::now();
        let asked: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
        let seen = Arc::clone(&asked);
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let path = request.uri().path().to_owned();
            seen.lock()
                .unwrap()
                .push((format!("{} {path}", request.method()), started.elapsed()));
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let name = path.rsplit('/').next().unwrap_or_default().to_owned();
                let body = if path.ends_with("/token") {
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"audiences": [], "expirationSeconds": 3607},
                        "status": {"token": "header.payload.signature", "expirationTimestamp": "2026-11-26T09:00:00Z"}})
                } else if path.contains("/secrets/") {
                    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"password": "cw=="}})
                } else {
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"ca.crt": "CA"}})
                };
                answer(200, &body)
            }
        });
        let controller = over(service);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1"},
            "spec": {"nodeName": "vn-0", "containers": [{"name": "app", "image": "nginx:1.27",
                    "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}],
                "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}]},
        }))
        .unwrap();
        // The Service cache never fills here, so the create stops there, after the reads.
        let Err(Failure::Retry(why)) = controller.try_create(&pod, "u-1").await else {
            panic!("the create is retried until the Service cache fills");
        };
        assert!(why.contains("Service cache"), "{why}");
        let asked = asked.lock().unwrap().clone();
        let paths: std::collections::BTreeSet<&str> =
            asked.iter().map(|(what, _)| what.as_str()).collect();
        assert_eq!(
            paths,
            [
                "GET /api/v1/namespaces/shop/configmaps/kube-root-ca.crt",
                "GET /api/v1/namespaces/shop/secrets/db",
                "POST /api/v1/namespaces/shop/serviceaccounts/default/token",
            ]
            .into(),
            "each asked once"
        );
        assert!(
            asked.iter().all(|(_, at)| *at == Duration::ZERO),
            "all asked at once, none waiting for another's answer: {asked:?}"
        );
    }

    /// The fake API server's answer: `code` with `body`.
    fn answer(
        code: u16,
        body: &serde_json::Value,
    ) -> Result<hyper::Response<kube::client::Body>, std::convert::Infallible> {
        Ok(hyper::Response::builder()
            .status(code)
            .body(kube::client::Body::from(body.to_string().into_bytes()))
            .unwrap())
    }

    /// A controller of node vn-0 over no ECI and the fake API server `service`.
    fn over<S>(service: S) -> PodController
    where
        S: tower::Service<
                hyper::Request<kube::client::Body>,
                Response = hyper::Response<kube::client::Body>,
                Error = std::convert::Infallible,
            > + Send
            + Clone
            + 'static,
        S::Future: Send + 'static,
    {
        super::super::tests::controller_over(Arc::default(), kube::Client::new(service, "default"))
    }

    /// A controller of pod shop/web-0 (group eci-1 created) whose API server answers every
    /// request with the pod at version "11", recording the requests' bodies.
    fn annotating() -> (PodController, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
        let bodies: Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Arc::default();
        let seen = Arc::clone(&bodies);
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let seen = Arc::clone(&seen);
            async move {
                let body = request.into_body().collect_bytes().await.unwrap();
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                seen.lock().unwrap().push(body.clone());
                let mut pod = body;
                pod["metadata"]["uid"] = json!("u-1");
                pod["metadata"]["resourceVersion"] = json!("11");
                pod["spec"] = json!({"containers": [{"name": "app", "image": "nginx:1.27"}]});
                answer(200, &pod)
            }
        });
        let controller = over(service);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "resourceVersion": "10"},
            "spec": {"nodeName": "vn-0", "containers": [{"name": "app", "image": "nginx:1.27"}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap();
        let mut entry = super::super::PodEntry {
            lifecycle: super::super::Lifecycle::Created {
                group: "eci-1".into(),
                annotated: true,
            },
            ..super::super::PodEntry::default()
        };
        entry.keep(&Arc::new(pod));
        controller.tracked().insert("u-1".into(), entry);
        (controller, bodies)
    }

    /// Queues group eci-1's id (and `request_id`) for pod shop/web-0 (uid u-1).
    async fn queue_group_id(controller: &PodController, request_id: &str) {
        let key = ("shop".to_owned(), "web-0".to_owned());
        controller
            .annotate(&key, "u-1", &WriteBack::new("eci-1", request_id))
            .await;
    }

    fn kept(controller: &PodController) -> Arc<Pod> {
        controller.tracked()["u-1"]
            .pod
            .as_ref()
            .unwrap()
            .pod()
            .unwrap()
    }

    /// The group's id costs no pod write of its own (it was one PATCH per pod, a large share
    /// of the apiserver requests per pod; docs/performance.md): it rides on the pod's next
    /// status apply, and every apply after it carries it again (leaving it out would remove
    /// it: our field manager owns it).
    #[tokio::test]
    async fn the_group_id_rides_on_the_next_status_apply_and_every_one_after() {
        let (controller, bodies) = annotating();
        queue_group_id(&controller, "req-1").await;
        assert!(bodies.lock().unwrap().is_empty(), "no write of its own");
        let running = |_: &Pod| Some(json!({"phase": "Running"}));
        for _ in 0..2 {
            let written = controller.apply_status(&kept(&controller), running).await;
            assert!(matches!(
                written,
                super::super::status_writes::Written::Stored(_)
            ));
        }
        let bodies = bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        for body in &bodies {
            assert_eq!(
                body["metadata"]["annotations"],
                json!({INSTANCE_ANNOTATION: "eci-1", annotations::REQUEST_ID: "req-1"}),
                "{body}"
            );
            assert_eq!(body["status"]["phase"], "Running");
        }
        assert!(matches!(
            controller.tracked()["u-1"].carried,
            carried::OwnAnnotations::Written(_)
        ));
    }

    /// The annotations carry no uid of their own: the apply carries the kept copy's
    /// resourceVersion, so a pod deleted and recreated under the name answers 409, and the
    /// read after it finds another uid — nothing is written on the other pod (the merge patch
    /// this replaced carried the uid as a precondition for the same reason).
    #[tokio::test]
    async fn a_pod_recreated_under_the_name_never_gets_the_groups_id() {
        let requests: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let seen = Arc::clone(&requests);
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let seen = Arc::clone(&seen);
            async move {
                let method = request.method().to_string();
                seen.lock().unwrap().push(method.clone());
                if method == "PATCH" {
                    answer(
                        409,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
                    )
                } else {
                    answer(
                        200,
                        &json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-2", "resourceVersion": "20"},
                        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}}),
                    )
                }
            }
        });
        let (annotated, _) = annotating();
        let controller = over(service);
        let entry = annotated.tracked().remove("u-1").unwrap();
        controller.tracked().insert("u-1".into(), entry);
        queue_group_id(&controller, "").await;
        let written = controller
            .apply_status(&kept(&controller), |_| Some(json!({"phase": "Running"})))
            .await;
        assert_eq!(written, super::super::status_writes::Written::Failed);
        assert_eq!(
            *requests.lock().unwrap(),
            ["PATCH", "GET"],
            "one apply, one read"
        );
        let now = tokio::time::Instant::now();
        let wait = controller.annotation_wait();
        assert!(
            controller.tracked()["u-1"].carried.backlog(now, wait) != carried::Backlog::Empty,
            "still ours to write"
        );
    }

    /// A group that changes nothing after its create (no status write comes): its id gets a
    /// write of its own once its wait ends, the pod's status re-stated as it shows. A sync that
    /// comes sooner and writes nothing leaves it waiting, its own sync queued for the end.
    #[tokio::test(start_paused = true)]
    async fn an_id_no_status_write_took_is_written_when_its_wait_ends() {
        let (controller, bodies) = annotating();
        let wait = controller.annotation_wait();
        queue_group_id(&controller, "").await;
        let syncs = &controller.inner.syncs;
        assert!(syncs.is_empty(), "it waits");
        assert_eq!(
            syncs.delayed_len(),
            1,
            "its sync is queued for the end of the wait"
        );
        tokio::time::advance(wait / 2).await;
        syncs.push("u-1".to_owned(), ());
        let (uid, ()) = syncs.try_next().unwrap();
        controller.sync(&uid).await;
        controller.write_status_of(&uid).await;
        syncs.done(&uid);
        assert!(bodies.lock().unwrap().is_empty(), "not due yet");
        assert_eq!(
            syncs.delayed_len(),
            1,
            "queued again for the end of the wait"
        );
        tokio::time::advance(wait / 2).await;
        controller.sync("u-1").await;
        controller.write_status_of("u-1").await;
        let written = bodies.lock().unwrap().clone();
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(
            written[0]["metadata"]["annotations"],
            json!({INSTANCE_ANNOTATION: "eci-1"})
        );
        assert_eq!(written[0]["status"], json!({"phase": "Pending"}));
        let now = tokio::time::Instant::now();
        assert_eq!(
            controller.tracked()["u-1"].carried.backlog(now, wait),
            carried::Backlog::Empty
        );
        controller.sync("u-1").await;
        controller.write_status_of("u-1").await;
        assert_eq!(bodies.lock().unwrap().len(), 1, "nothing left to write");
    }
}
