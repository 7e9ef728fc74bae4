//! Runs the pods bound to this node as ECI container groups.
//!
//! - A watch of this node's pods (`spec.nodeName=<node>`) drives creation and deletion.
//! - Creation: fetch what the pod references, translate ([`crate::translate`]), create with
//!   `ClientToken` = pod UID (idempotent across retries and restarts), retrying throttling and
//!   server errors with back-off; a request that can never work fails the pod with
//!   `ProviderFailed`, one that may work later leaves it Pending with the reason.
//! - Status: one `DescribeContainerGroupStatus` per interval for the whole node with
//!   `since_second`, plus a periodic full listing; a pod's status is written only when it
//!   changed ([`crate::pod_status`]).
//! - Deletion: a pod with a deletionTimestamp gets its group deleted (grace period honoured),
//!   then the Pod is deleted with grace 0 and a UID precondition.
//! - Start-up: groups tagged with this cluster and node are adopted by pod UID; groups whose pod
//!   no longer exists are deleted; nothing of other nodes or clusters is ever touched.

pub mod refs;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use eci_proto::EciError;
use eci_proto::v20180808::{
    ContainerGroupStatus, DeleteContainerGroupRequest, DescribeContainerGroupStatusRequest,
    DescribeContainerGroupsRequest, Tag,
};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::backend::Backend;
use crate::config::Settings;
use crate::pod_status;
use crate::telemetry::Telemetry;
use crate::translate::{self, Context, naming};

/// Annotation recording the pod's ECI instance.
pub const INSTANCE_ANNOTATION: &str = "k8s.aliyun.com/eci-instance-id";
/// Reason of pod conditions and events when ECI cannot run a pod.
pub const PROVIDER_FAILED: &str = "ProviderFailed";

#[derive(Debug, Default)]
struct Tracked {
    pod: Option<Arc<Pod>>,
    group: Option<String>,
    creating: bool,
    deleting: bool,
    /// Hash of the status last written (a hash, not the JSON: memory per pod matters at
    /// thousands of pods).
    written: Option<u64>,
    /// Hashes of the ECI events already turned into Events.
    events_seen: HashSet<u64>,
}

/// The controller.
#[derive(Clone)]
pub struct PodController {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    client: kube::Client,
    backend: Backend,
    telemetry: Arc<Telemetry>,
    recorder: Recorder,
    pods: Mutex<HashMap<String, Tracked>>,
    creates: Semaphore,
    /// Groups being deleted, and who waits for them to be gone.
    awaiting_removal: Mutex<HashMap<String, Vec<tokio::sync::oneshot::Sender<()>>>>,
}

impl std::fmt::Debug for PodController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodController")
            .field("node", &self.inner.settings.node_name)
            .finish_non_exhaustive()
    }
}

fn tag(group: &ContainerGroupStatus, key: &str) -> Option<String> {
    group
        .tags
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.value.clone())
}

fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(250).saturating_mul(1u32 << attempt.min(7));
    let capped = base.min(Duration::from_secs(30));
    // ±20 % jitter from the clock's low bits: spread retries of many pods apart.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    capped.mul_f64(0.8 + f64::from(nanos % 400) / 1000.0)
}

impl PodController {
    /// A controller for `settings.node_name`.
    pub fn new(
        settings: Settings,
        client: kube::Client,
        backend: Backend,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let reporter = Reporter {
            controller: "virtual-node-eci".into(),
            instance: Some(settings.node_name.clone()),
        };
        let creates = Semaphore::new(settings.config.max_concurrent_creates);
        Self {
            inner: Arc::new(Inner {
                recorder: Recorder::new(client.clone(), reporter),
                settings,
                client,
                backend,
                telemetry,
                pods: Mutex::new(HashMap::new()),
                creates,
                awaiting_removal: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn tracked(&self) -> MutexGuard<'_, HashMap<String, Tracked>> {
        self.inner
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn node_tags(&self) -> Vec<Tag> {
        vec![
            Tag {
                key: naming::TAG_CLUSTER.into(),
                value: self.inner.settings.cluster_name.clone(),
            },
            Tag {
                key: naming::TAG_NODE.into(),
                value: self.inner.settings.node_name.clone(),
            },
        ]
    }

    /// Every group of this node (paged).
    async fn list_groups(
        &self,
        since_second: Option<i32>,
    ) -> Result<Vec<ContainerGroupStatus>, EciError> {
        let mut groups = Vec::new();
        let mut next_token = String::new();
        loop {
            let page = self
                .inner
                .backend
                .describe_container_group_status(DescribeContainerGroupStatusRequest {
                    region_id: self.inner.settings.config.region.clone(),
                    tag: self.node_tags(),
                    limit: Some(200),
                    next_token: next_token.clone(),
                    since_second,
                    ..DescribeContainerGroupStatusRequest::default()
                })
                .await?;
            groups.extend(page.data);
            if page.next_token.is_empty() {
                return Ok(groups);
            }
            next_token = page.next_token;
        }
    }

    /// Runs until cancelled: adopt, watch pods, poll statuses.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let groups = loop {
            match self.list_groups(None).await {
                Ok(groups) => break groups,
                Err(error) => {
                    warn!(%error, "cannot list this node's container groups yet; retrying");
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(Duration::from_secs(2)) => {}
                    }
                }
            }
        };
        {
            let mut tracked = self.tracked();
            for group in &groups {
                if let Some(uid) = tag(group, naming::TAG_POD_UID) {
                    tracked.entry(uid).or_default().group = Some(group.container_group_id.clone());
                }
            }
        }
        info!(
            groups = groups.len(),
            "adopted this node's container groups"
        );
        let watch = self.clone().watch_pods(groups, stop.clone());
        let poll = self.clone().poll_statuses(stop.clone());
        let removals = self.clone().watch_removals(stop.clone());
        tokio::try_join!(watch, poll, removals)?;
        Ok(())
    }

    async fn watch_pods(
        self,
        initial_groups: Vec<ContainerGroupStatus>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::all(self.inner.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={}", self.inner.settings.node_name));
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut initial_groups = Some(initial_groups);
        let mut listed: HashSet<String> = HashSet::new();
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                event = events.next() => event,
            };
            match event {
                None => anyhow::bail!("the pod watch ended"),
                Some(Err(error)) => warn!(%error, "pod watch error; it recovers by itself"),
                Some(Ok(watcher::Event::Init)) => listed.clear(),
                Some(Ok(watcher::Event::InitApply(pod))) => {
                    listed.insert(pod.uid().unwrap_or_default());
                    self.observe(Arc::new(pod));
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(groups) = initial_groups.take() {
                        self.collect_orphans(&groups, &listed).await;
                        info!(
                            pods = listed.len(),
                            groups = groups.len(),
                            "resync complete: every pod and group of this node accounted for"
                        );
                    }
                }
                Some(Ok(watcher::Event::Apply(pod))) => self.observe(Arc::new(pod)),
                Some(Ok(watcher::Event::Delete(pod))) => self.forget(&pod).await,
            }
        }
    }

    /// Groups of this node whose pod is gone (confirmed by a direct read) are deleted.
    async fn collect_orphans(&self, groups: &[ContainerGroupStatus], listed: &HashSet<String>) {
        for group in groups {
            let Some(uid) = tag(group, naming::TAG_POD_UID) else {
                continue;
            };
            if listed.contains(&uid) {
                continue;
            }
            let (Some(namespace), Some(name)) = (
                tag(group, naming::TAG_NAMESPACE),
                tag(group, naming::TAG_POD_NAME),
            ) else {
                continue;
            };
            let pods: Api<Pod> = Api::namespaced(self.inner.client.clone(), &namespace);
            match pods.get_opt(&name).await {
                Ok(Some(pod)) if pod.uid().as_deref() == Some(uid.as_str()) => continue,
                Ok(_) => {
                    info!(eci_id = %group.container_group_id, pod = %format!("{namespace}/{name}"), "deleting an orphaned container group: its pod no longer exists");
                    self.delete_group(&group.container_group_id, true).await;
                    self.tracked().remove(&uid);
                }
                Err(error) => {
                    warn!(%error, eci_id = %group.container_group_id, "cannot confirm whether the group's pod exists; keeping the group");
                }
            }
        }
    }

    fn observe(&self, pod: Arc<Pod>) {
        let Some(uid) = pod.uid() else { return };
        let action = {
            let mut tracked = self.tracked();
            let entry = tracked.entry(uid.clone()).or_default();
            entry.pod = Some(pod.clone());
            if pod.metadata.deletion_timestamp.is_some() {
                if entry.deleting {
                    None
                } else {
                    entry.deleting = true;
                    Some(Action::Delete)
                }
            } else if entry.group.is_some()
                || entry.creating
                // A finished pod is never run again.
                || matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
            {
                None
            } else if let Some(reason) = not_for_virtual_nodes(&pod) {
                entry.creating = true; // never try again
                Some(Action::Skip(reason))
            } else {
                entry.creating = true;
                Some(Action::Create)
            }
        };
        let controller = self.clone();
        let span = info_span!("reconcile", pod = %pod_key(&pod), uid = %uid);
        match action {
            None => {}
            Some(Action::Create) => {
                let seen = tokio::time::Instant::now();
                tokio::spawn(
                    async move { controller.create(pod, uid, seen).await }.instrument(span),
                );
            }
            Some(Action::Delete) => {
                tokio::spawn(async move { controller.delete(pod, uid).await }.instrument(span));
            }
            Some(Action::Skip(reason)) => {
                tokio::spawn(
                    async move { controller.explain_skip(&pod, reason).await }.instrument(span),
                );
            }
        }
    }

    async fn forget(&self, pod: &Pod) {
        let Some(uid) = pod.uid() else { return };
        let group = self.tracked().remove(&uid).and_then(|t| t.group);
        // Removed without going through our deletion (force-deleted): the group must go too.
        if let Some(id) = group {
            info!(pod = %pod_key(pod), eci_id = %id, "pod removed; deleting its container group");
            self.delete_group(&id, true).await;
        }
    }

    async fn explain_skip(&self, pod: &Pod, reason: &'static str) {
        info!(pod = %pod_key(pod), reason, "not running this pod on ECI");
        let status =
            json!({"phase": "Pending", "reason": "NotSupportedOnVirtualNode", "message": reason});
        self.write_status(pod, status).await;
        self.event(pod, EventType::Warning, "NotSupportedOnVirtualNode", reason)
            .await;
    }

    async fn create(self, pod: Arc<Pod>, uid: String, seen: tokio::time::Instant) {
        let _permit = self.inner.creates.acquire().await;
        let mut attempt = 0u32;
        loop {
            if self.tracked().get(&uid).is_none_or(|t| t.deleting) {
                return;
            }
            let outcome = self.try_create(&pod, &uid).await;
            match outcome {
                Ok(id) => {
                    self.inner
                        .telemetry
                        .pod_create_seconds
                        .observe(seen.elapsed().as_secs_f64());
                    let wanted = {
                        let mut tracked = self.tracked();
                        match tracked.get_mut(&uid) {
                            Some(entry) if !entry.deleting => {
                                entry.group = Some(id.clone());
                                entry.creating = false;
                                true
                            }
                            _ => false,
                        }
                    };
                    if !wanted {
                        // The pod went away while its group was being created: no leak.
                        info!(eci_id = %id, "the pod was deleted during creation; deleting its new container group");
                        self.delete_group(&id, true).await;
                        return;
                    }
                    info!(eci_id = %id, "created container group");
                    self.annotate(&pod, &id).await;
                    return;
                }
                Err(Failure::Retry(message)) => {
                    self.inner.telemetry.pod_create_retries.inc();
                    if attempt == 3 {
                        // Tell the user once the problem persists, then keep trying.
                        self.set_provider_failed(&pod, &message, false).await;
                    }
                    debug!(%message, attempt, "create failed; retrying");
                }
                Err(Failure::Permanent(message)) => {
                    warn!(%message, "this pod cannot run on ECI");
                    self.set_provider_failed(&pod, &message, true).await;
                    return;
                }
            }
            attempt += 1;
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    async fn try_create(&self, pod: &Pod, uid: &str) -> Result<String, Failure> {
        let namespace = pod.namespace().unwrap_or_default();
        let refs = refs::references(pod);
        let config_maps = self
            .fetch::<ConfigMap>(&namespace, &refs.config_maps)
            .await?;
        let secrets = self.fetch::<Secret>(&namespace, &refs.secrets).await?;
        let token = match refs.token_seconds {
            Some(seconds) => Some(self.token(pod, seconds).await?),
            None => None,
        };
        let settings = &self.inner.settings;
        let cx = Context {
            region: &settings.config.region,
            vswitch: settings.config.vswitch.as_deref().unwrap_or("vsw-mock"),
            security_group: settings
                .config
                .security_group
                .as_deref()
                .unwrap_or("sg-mock"),
            cluster_name: &settings.cluster_name,
            node_name: &settings.node_name,
            cluster_dns: &settings.config.cluster_dns,
            cluster_domain: &settings.config.cluster_domain,
            config_maps: &config_maps,
            secrets: &secrets,
            service_account_token: token.as_deref(),
            default_spec: (2.0, 4.0),
        };
        let request = translate::translate(pod, &cx).map_err(|rejection| {
            let message = rejection.to_string();
            if rejection.retryable {
                Failure::Retry(message)
            } else {
                Failure::Permanent(message)
            }
        })?;
        debug_assert_eq!(request.client_token, uid);
        match self.inner.backend.create_container_group(request).await {
            Ok(response) => Ok(response.container_group_id),
            Err(error) if error.is_retryable() => Err(Failure::Retry(error.to_string())),
            Err(error) => Err(Failure::Permanent(error.to_string())),
        }
    }

    async fn fetch<K>(
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
        let mut found = BTreeMap::new();
        for name in names {
            self.inner.telemetry.kube_request("pod_reference_get");
            match api.get_opt(name).await {
                Ok(Some(object)) => {
                    found.insert(name.clone(), object);
                }
                Ok(None) => {}
                Err(error) => return Err(Failure::Retry(format!("cannot read {name}: {error}"))),
            }
        }
        Ok(found)
    }

    async fn token(&self, pod: &Pod, seconds: i64) -> Result<String, Failure> {
        let namespace = pod.namespace().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let api: Api<ServiceAccount> = Api::namespaced(self.inner.client.clone(), &namespace);
        let request: TokenRequest = serde_json::from_value(json!({"spec": {
            "audiences": [], "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()},
        }}))
        .map_err(|e| Failure::Permanent(e.to_string()))?;
        self.inner.telemetry.kube_request("token_request");
        let answer = api
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                Failure::Retry(format!(
                    "cannot issue a token for service account {namespace}/{account}: {e}"
                ))
            })?;
        answer
            .status
            .map(|s| s.token)
            .ok_or_else(|| Failure::Retry("the TokenRequest answer has no token".into()))
    }

    async fn annotate(&self, pod: &Pod, id: &str) {
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        self.inner.telemetry.kube_request("pod_annotate");
        let patch = json!({"metadata": {"annotations": {INSTANCE_ANNOTATION: id}}});
        if let Err(error) = api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        {
            warn!(%error, "could not record the ECI instance id on the pod");
        }
    }

    async fn set_provider_failed(&self, pod: &Pod, message: &str, permanent: bool) {
        let phase = if permanent { "Failed" } else { "Pending" };
        let status = json!({"phase": phase, "reason": PROVIDER_FAILED, "message": message});
        self.write_status(pod, status).await;
        self.event(pod, EventType::Warning, PROVIDER_FAILED, message)
            .await;
    }

    /// Writes a pod status with optimistic concurrency: the patch carries the latest
    /// resourceVersion we know; on a conflict the pod is read again and the write retried once.
    async fn write_status(&self, pod: &Pod, status: Value) {
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let uid = pod.uid().unwrap_or_default();
        let latest_rv = |fallback: &Pod| {
            self.tracked()
                .get(&uid)
                .and_then(|t| {
                    t.pod
                        .as_ref()
                        .and_then(|p| p.metadata.resource_version.clone())
                })
                .or_else(|| fallback.metadata.resource_version.clone())
        };
        for attempt in 0..2 {
            let body = json!({"metadata": {"resourceVersion": latest_rv(pod)}, "status": &status});
            self.inner.telemetry.kube_request("pod_status_patch");
            match api
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(body),
                )
                .await
            {
                Ok(updated) => {
                    self.remember(&uid, updated);
                    return;
                }
                Err(kube::Error::Api(conflict)) if conflict.code == 409 && attempt == 0 => {
                    self.inner.telemetry.kube_request("pod_get");
                    match api.get(&pod.name_any()).await {
                        Ok(fresh) if fresh.uid().as_deref() == Some(uid.as_str()) => {
                            self.remember(&uid, fresh);
                        }
                        _ => return,
                    }
                }
                Err(error) => {
                    warn!(pod = %pod_key(pod), %error, "could not write the pod status; the next poll retries");
                    if let Some(t) = self.tracked().get_mut(&uid) {
                        t.written = None;
                    }
                    return;
                }
            }
        }
    }

    /// Keeps the copy of a pod the API just returned: its resourceVersion is what the next
    /// write carries (resourceVersions are opaque, so the latest answer wins, not a comparison).
    fn remember(&self, uid: &str, pod: Pod) {
        if let Some(t) = self.tracked().get_mut(uid) {
            t.pod = Some(Arc::new(pod));
        }
    }

    async fn event(&self, pod: &Pod, kind: EventType, reason: &str, note: &str) {
        let event = Event {
            type_: kind,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        self.inner.telemetry.kube_request("event_publish");
        if let Err(error) = self
            .inner
            .recorder
            .publish(&event, &pod.object_ref(&()))
            .await
        {
            debug!(%error, "could not publish an event");
        }
    }

    async fn delete(self, pod: Arc<Pod>, uid: String) {
        let group = self.tracked().get(&uid).and_then(|t| t.group.clone());
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0);
        if let Some(id) = &group {
            self.delete_group(id, false).await;
            let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
            let (gone, until_gone) = tokio::sync::oneshot::channel();
            self.inner
                .awaiting_removal
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(id.clone())
                .or_default()
                .push(gone);
            if tokio::time::timeout(grace, until_gone).await.is_err() {
                // The grace period is over: stop it now.
                self.delete_group(id, true).await;
            }
        }
        // The group is gone: the pod's removal from the watch must not delete it again.
        if let Some(t) = self.tracked().get_mut(&uid) {
            t.group = None;
        }
        let api: Api<Pod> = Api::namespaced(
            self.inner.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        for attempt in 0..8 {
            self.inner.telemetry.kube_request("pod_delete");
            match api.delete(&pod.name_any(), &params).await {
                Ok(_) => {
                    info!(eci_id = ?group, "pod deleted after its container group stopped");
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => return,
                Err(error) => {
                    debug!(%error, attempt, "could not delete the pod; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
        warn!("could not delete the pod; the next resync tries again");
        if let Some(t) = self.tracked().get_mut(&uid) {
            t.deleting = false;
        }
    }

    /// Drives every tracked pod again (after a failed step, nothing else might wake it).
    fn redrive(&self) {
        let pods: Vec<Arc<Pod>> = self
            .tracked()
            .values()
            .filter_map(|t| t.pod.clone())
            .collect();
        for pod in pods {
            self.observe(pod);
        }
    }

    /// Tells deletions when their groups are gone: one DescribeContainerGroups per 20 groups
    /// per interval, however many pods are being deleted.
    async fn watch_removals(self, stop: CancellationToken) -> anyhow::Result<()> {
        let mut ticks = tokio::time::interval(
            self.inner
                .settings
                .config
                .pod_status_poll_interval
                .min(Duration::from_millis(500)),
        );
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let ids: Vec<String> = {
                let mut waiting = self
                    .inner
                    .awaiting_removal
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // Waiters that gave up (grace period over) are dropped.
                waiting.retain(|_, senders| {
                    senders.retain(|s| !s.is_closed());
                    !senders.is_empty()
                });
                waiting.keys().cloned().collect()
            };
            for chunk in ids.chunks(20) {
                let Ok(answer) = self
                    .inner
                    .backend
                    .describe_container_groups(DescribeContainerGroupsRequest {
                        region_id: self.inner.settings.config.region.clone(),
                        container_group_ids: chunk.to_vec(),
                        limit: Some(20),
                        ..DescribeContainerGroupsRequest::default()
                    })
                    .await
                else {
                    continue;
                };
                let present: HashSet<&str> = answer
                    .container_groups
                    .iter()
                    .map(|g| g.container_group_id.as_str())
                    .collect();
                let mut waiting = self
                    .inner
                    .awaiting_removal
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                for id in chunk.iter().filter(|id| !present.contains(id.as_str())) {
                    for sender in waiting.remove(id).into_iter().flatten() {
                        let _ = sender.send(());
                    }
                }
            }
        }
    }

    async fn group_exists(&self, id: &str) -> Result<bool, EciError> {
        let answer = self
            .inner
            .backend
            .describe_container_groups(DescribeContainerGroupsRequest {
                region_id: self.inner.settings.config.region.clone(),
                container_group_ids: vec![id.to_owned()],
                ..DescribeContainerGroupsRequest::default()
            })
            .await?;
        Ok(!answer.container_groups.is_empty())
    }

    async fn delete_group(&self, id: &str, force: bool) {
        let mut attempt = 0;
        loop {
            let result = self
                .inner
                .backend
                .delete_container_group(DeleteContainerGroupRequest {
                    region_id: self.inner.settings.config.region.clone(),
                    container_group_id: id.to_owned(),
                    force,
                    ..DeleteContainerGroupRequest::default()
                })
                .await;
            match result {
                Ok(_) => return,
                Err(error) if error.is_not_found() => return,
                Err(error) if error.is_retryable() && attempt < 8 => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(error) => {
                    warn!(eci_id = %id, %error, "could not delete the container group; the next resync retries");
                    return;
                }
            }
        }
    }

    async fn poll_statuses(self, stop: CancellationToken) -> anyhow::Result<()> {
        let config = &self.inner.settings.config;
        let mut ticks = tokio::time::interval(config.pod_status_poll_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let window =
            i32::try_from(config.pod_status_poll_interval.as_secs() + 3).unwrap_or(i32::MAX);
        let mut last_full = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            let full = last_full.elapsed() >= config.pod_resync_interval;
            let groups = match self
                .list_groups(if full { None } else { Some(window) })
                .await
            {
                Ok(groups) => groups,
                Err(error) => {
                    debug!(%error, "status poll failed; next interval");
                    continue;
                }
            };
            if full {
                last_full = tokio::time::Instant::now();
                self.detect_vanished(&groups).await;
                self.redrive();
            }
            self.count_phases();
            // Statuses are written in parallel: a burst of changes must not queue behind itself.
            futures::stream::iter(groups)
                .for_each_concurrent(32, |group| self.apply_status(group))
                .await;
        }
    }

    fn count_phases(&self) {
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for tracked in self.tracked().values() {
            if let Some(pod) = &tracked.pod {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into());
                *counts.entry(phase).or_default() += 1;
            }
        }
        self.inner.telemetry.pods.clear();
        for (phase, count) in counts {
            self.inner
                .telemetry
                .pods
                .get_or_create(&crate::telemetry::PhaseLabels { phase })
                .set(count);
        }
    }

    async fn apply_status(&self, group: ContainerGroupStatus) {
        let Some(uid) = tag(&group, naming::TAG_POD_UID) else {
            return;
        };
        let (pod, written, new_events) = {
            let mut tracked = self.tracked();
            let Some(entry) = tracked.get_mut(&uid) else {
                return;
            };
            if entry.deleting || group.status == "Terminating" {
                return;
            }
            entry
                .group
                .get_or_insert_with(|| group.container_group_id.clone());
            let Some(pod) = entry.pod.clone() else { return };
            let new_events: Vec<_> = group
                .events
                .iter()
                .filter(|e| {
                    entry
                        .events_seen
                        .insert(hash_of(&(&e.reason, &e.message, e.count)))
                })
                .cloned()
                .collect();
            (pod, entry.written, new_events)
        };
        for event in new_events {
            let kind = if event.r#type == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.event(&pod, kind, &event.reason, &event.message).await;
        }
        let status = pod_status::pod_status(&pod, &group, SystemTime::now());
        let fingerprint = hash_of(&pod_status::fingerprint(&status).to_string());
        let current = pod.status.as_ref().map(|s| {
            hash_of(
                &pod_status::fingerprint(&serde_json::to_value(s).unwrap_or_default()).to_string(),
            )
        });
        // Nothing new: neither what we wrote last nor what the pod already shows (an adopted
        // pod after a restart is not rewritten).
        if written == Some(fingerprint) || current == Some(fingerprint) {
            return;
        }
        self.write_status(&pod, status).await;
        if let Some(changed) = humantime::parse_rfc3339_weak(&group.status_change_time)
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
        {
            self.inner
                .telemetry
                .pod_status_propagation_seconds
                .observe(changed.as_secs_f64());
        }
        if let Some(entry) = self.tracked().get_mut(&uid) {
            entry.written = Some(fingerprint);
        }
    }

    /// Pods whose group is missing from a full listing, confirmed by a direct read, fail
    /// with reason `NotFound`.
    async fn detect_vanished(&self, groups: &[ContainerGroupStatus]) {
        let present: HashSet<&str> = groups
            .iter()
            .map(|g| g.container_group_id.as_str())
            .collect();
        let suspects: Vec<(String, String, Arc<Pod>)> = self
            .tracked()
            .iter()
            .filter(|(_, t)| !t.deleting && !t.creating)
            .filter_map(|(uid, t)| Some((uid.clone(), t.group.clone()?, t.pod.clone()?)))
            .filter(|(_, id, _)| !present.contains(id.as_str()))
            .collect();
        for (uid, id, pod) in suspects {
            if matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ) {
                continue;
            }
            if let Ok(false) = self.group_exists(&id).await {
                warn!(pod = %pod_key(&pod), eci_id = %id, "the container group vanished");
                let message = format!("the ECI container group {id} no longer exists");
                self.write_status(
                    &pod,
                    json!({"phase": "Failed", "reason": "NotFound", "message": message}),
                )
                .await;
                self.event(&pod, EventType::Warning, "NotFound", &message)
                    .await;
                if let Some(t) = self.tracked().get_mut(&uid) {
                    t.group = None;
                    t.creating = true; // a vanished group is not re-created
                }
            }
        }
    }
}

enum Action {
    Create,
    Delete,
    Skip(&'static str),
}

enum Failure {
    Retry(String),
    Permanent(String),
}

/// An in-process hash (never persisted).
fn hash_of<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher as _;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// Pods that must not become container groups, and why.
fn not_for_virtual_nodes(pod: &Pod) -> Option<&'static str> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if annotations.contains_key("kubernetes.io/config.mirror") {
        return Some("static (mirror) pods belong to a kubelet and do not run on virtual nodes");
    }
    let daemon_set = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    daemon_set.then_some("DaemonSet pods do not run on virtual nodes: each virtual node is a pool of ECI instances, not a machine to put an agent on")
}
