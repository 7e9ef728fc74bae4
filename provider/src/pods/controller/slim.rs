//! The copy of a pod the controller keeps once its container group exists.
//!
//! After creation the controller reads a pod only to write its status (container names,
//! images, CPU and memory, which init containers are sidecars, readiness gates, generation, the
//! current status), to delete it (grace period) and to publish Events about it.
//! Of the annotations, only those the daemon writes back are kept: a status write corrects a
//! value of them that ECI did not give (a pod author's claim in a field other controllers read
//! as ours). Everything else — env, volumes, probes, affinity, managed fields, the other
//! annotations — is dropped:
//! the controller keeps a copy of every pod of its node, and at scale a whole `Pod` per pod
//! would be most of the daemon's memory.
//!
//! Even slimmed, a `Pod` value is large (a `Container` alone is over 2 KiB of mostly empty
//! options), so the slim copy is kept packed as JSON — which leaves the empty options out —
//! compressed (LZ4, against a dictionary of what every pod's JSON repeats: the field names), and
//! unpacked for the few steps that need it (a status write, a deletion, an Event).

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::error;

use super::deadline;
use vne_core::to_eci::annotations::WRITTEN_BACK;

/// The controller's copy of a pod.
#[derive(Debug, Clone)]
pub(super) enum PodCopy {
    /// The whole pod, while its group is still to be created.
    Whole(Arc<Pod>),
    /// The [`slim`] copy, packed.
    Packed(Packed),
}

/// A slim pod as compressed JSON, with the fields read without unpacking it.
#[derive(Debug, Clone)]
pub(super) struct Packed {
    glance: Glance,
    /// The hash of its resourceVersion.
    version: u64,
    /// The JSON, LZ4-compressed against [`DICTIONARY`] (its length first).
    compressed: Arc<[u8]>,
}

/// What packed copies are compressed against: the field names and values that the JSON of
/// every slim pod repeats (LZ4 finds repeats only within what it has seen, and one pod's JSON
/// is too short to repeat much of itself), so a copy holds little more than its own names,
/// times and addresses. Any JSON packs and unpacks; this only makes the usual one smaller.
const DICTIONARY: &[u8] = br#"{"metadata":{"annotations":{"k8s.aliyun.com/eci-instance-id":"eci-"},"deletionGracePeriodSeconds":30,"deletionTimestamp":"","generation":1,"name":"","namespace":"default","resourceVersion":"","uid":""},"spec":{"containers":[{"image":"","name":"","resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"500m","memory":"512Mi"}}}],"nodeName":"virtual-node-eci-0","restartPolicy":"Always","terminationGracePeriodSeconds":30},"status":{"conditions":[{"lastProbeTime":null,"lastTransitionTime":"","status":"True","type":"PodReadyToStartContainers"},{"lastProbeTime":null,"lastTransitionTime":"","status":"True","type":"Initialized"},{"lastProbeTime":null,"lastTransitionTime":"","status":"True","type":"Ready"},{"lastProbeTime":null,"lastTransitionTime":"","status":"True","type":"ContainersReady"},{"lastProbeTime":null,"lastTransitionTime":"","status":"True","type":"PodScheduled"},{"lastTransitionTime":"","message":"","reason":"","status":"True","type":"ContainerInstanceCreated"}],"containerStatuses":[{"allocatedResources":{"cpu":"","memory":""},"containerID":"containerd://","image":"","imageID":"","lastState":{},"name":"","ready":true,"resources":{"limits":{"cpu":"","memory":""},"requests":{"cpu":"","memory":""}},"restartCount":0,"started":true,"state":{"running":{"startedAt":""}}}],"hostIP":"","hostIPs":[{"ip":""}],"observedGeneration":1,"phase":"Running","podIP":"","podIPs":[{"ip":""}],"qosClass":"Burstable","startTime":"2026-01-01T00:00:00Z"}}"#;

impl PodCopy {
    /// The whole pod.
    pub(super) fn whole(pod: &Arc<Pod>) -> Self {
        Self::Whole(Arc::clone(pod))
    }

    /// The slim copy of `pod`, packed.
    pub(super) fn packed(pod: &Pod) -> Self {
        let slimmed = slim(pod);
        match serde_json::to_vec(&slimmed) {
            Ok(json) => Self::Packed(Packed {
                glance: Glance::of(&slimmed),
                version: version_of(pod),
                compressed: lz4_flex::block::compress_prepend_size_with_dict(&json, DICTIONARY)
                    .into(),
            }),
            // Not expected of a value that came from JSON; keep it unpacked rather than lose it.
            Err(_) => Self::Whole(Arc::new(slimmed)),
        }
    }

    /// Whether this is exactly `pod` (the same watch event seen twice).
    pub(super) fn is(&self, pod: &Arc<Pod>) -> bool {
        matches!(self, Self::Whole(kept) if Arc::ptr_eq(kept, pod))
    }

    /// Whether this is a packed copy of `pod`'s very version (the watch bringing the version
    /// a write of ours was answered with): packing `pod` again would give the same copy.
    /// A resourceVersion names one state of an object, so equal versions hold equal pods.
    pub(super) fn packs_version_of(&self, pod: &Pod) -> bool {
        matches!(self, Self::Packed(packed)
            if pod.metadata.resource_version.is_some() && packed.version == version_of(pod))
    }

    /// Whether `other` is this very copy (not merely an equal one): a later copy of the pod
    /// replaced it if not.
    #[cfg(test)]
    pub(super) fn same_copy(&self, other: &PodCopy) -> bool {
        match (self, other) {
            (Self::Whole(a), Self::Whole(b)) => Arc::ptr_eq(a, b),
            (Self::Packed(a), Self::Packed(b)) => Arc::ptr_eq(&a.compressed, &b.compressed),
            _ => false,
        }
    }

    /// Whether only the slim copy is kept (a creation must read the whole pod again).
    pub(super) fn is_slim(&self) -> bool {
        matches!(self, Self::Packed(_))
    }

    /// The pod's phase.
    pub(super) fn phase(&self) -> Option<&str> {
        match self {
            Self::Whole(pod) => pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Self::Packed(packed) => packed.glance.phase.as_deref(),
        }
    }

    /// What a sync reads of the pod: taken when a copy is packed, so a sync that finds
    /// nothing to do (most of them) never unpacks it.
    pub(super) fn glance(&self) -> Glance {
        match self {
            Self::Whole(pod) => Glance::of(pod),
            Self::Packed(packed) => packed.glance.clone(),
        }
    }

    /// The hash of the copy's resourceVersion.
    pub(super) fn version(&self) -> u64 {
        match self {
            Self::Whole(pod) => version_of(pod),
            Self::Packed(packed) => packed.version,
        }
    }

    /// The pod (slim once packed). Cheap to call under a lock only for a whole pod: clone the
    /// `PodCopy` out first.
    pub(super) fn pod(&self) -> Option<Arc<Pod>> {
        match self {
            Self::Whole(pod) => Some(Arc::clone(pod)),
            Self::Packed(packed) => match packed.unpack() {
                Ok(pod) => Some(Arc::new(pod)),
                Err(error) => {
                    error!(%error, "a kept pod copy does not unpack; this is a bug");
                    None
                }
            },
        }
    }
}

/// What a pod's sync reads of it ([`PodCopy::glance`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Glance {
    pub(super) phase: Option<Box<str>>,
    /// It has a deletionTimestamp.
    pub(super) terminating: bool,
    /// Why it must not become a container group, if it must not.
    pub(super) unfit: Option<&'static str>,
    /// Its instance-id annotation.
    pub(super) instance_id: Option<Box<str>>,
    /// When its active deadline falls due ([`deadline::due_at`]).
    pub(super) deadline_due: Option<SystemTime>,
    /// The fingerprint of the status of ours it shows ([`super::shown`]).
    pub(super) shown: Option<u64>,
    /// Its readiness gates or generation changed what its status is to be
    /// ([`vne_core::from_eci::refresh`], which depends on the pod alone for that).
    pub(super) refresh: bool,
}

impl Glance {
    pub(super) fn of(pod: &Pod) -> Self {
        Self {
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .map(Box::from),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            unfit: super::not_for_virtual_nodes(pod),
            instance_id: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|all| all.get(super::INSTANCE_ANNOTATION))
                .map(|id| Box::from(id.as_str())),
            deadline_due: deadline::due_at(pod),
            shown: super::shown(pod),
            refresh: vne_core::from_eci::refresh(pod, SystemTime::now()).is_some(),
        }
    }

    /// It finished (phase Succeeded or Failed).
    pub(super) fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// A packed copy that does not unpack (a bug: it was packed from a pod).
#[derive(Debug, thiserror::Error)]
pub(super) enum UnpackError {
    /// The bytes do not decompress.
    #[error("the packed copy does not decompress")]
    Decompress(#[source] lz4_flex::block::DecompressError),
    /// The JSON does not read as a pod.
    #[error("the packed copy is not a pod's JSON")]
    Json(#[source] serde_json::Error),
}

impl Packed {
    fn unpack(&self) -> Result<Pod, UnpackError> {
        let json =
            lz4_flex::block::decompress_size_prepended_with_dict(&self.compressed, DICTIONARY)
                .map_err(UnpackError::Decompress)?;
        serde_json::from_slice(&json).map_err(UnpackError::Json)
    }
}

/// The hash of `pod`'s resourceVersion: versions are opaque, compared for equality only.
pub(super) fn version_of(pod: &Pod) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.resource_version.hash(&mut hasher);
    hasher.finish()
}

fn slim_container(container: &Container) -> Container {
    Container {
        name: container.name.clone(),
        image: container.image.clone(),
        // Marks a native sidecar, whose status ECI reports among the containers.
        restart_policy: container.restart_policy.clone(),
        // Its CPU and memory: the status reports them, and a resize compares them.
        resources: container.resources.as_ref().map(cpu_and_memory),
        ..Container::default()
    }
}

/// The CPU and memory requests and limits of `resources`.
fn cpu_and_memory(resources: &ResourceRequirements) -> ResourceRequirements {
    let kept = |list: &Option<std::collections::BTreeMap<String, Quantity>>| {
        let kept: std::collections::BTreeMap<String, Quantity> = list
            .iter()
            .flatten()
            .filter(|(kind, _)| matches!(kind.as_str(), "cpu" | "memory"))
            .map(|(kind, quantity)| (kind.clone(), quantity.clone()))
            .collect();
        (!kept.is_empty()).then_some(kept)
    };
    ResourceRequirements {
        requests: kept(&resources.requests),
        limits: kept(&resources.limits),
        ..ResourceRequirements::default()
    }
}

/// What the controller still needs of `pod` once its group exists.
pub(super) fn slim(pod: &Pod) -> Pod {
    let meta = &pod.metadata;
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            // Acknowledged as `observedGeneration` in the status.
            generation: meta.generation,
            deletion_timestamp: meta.deletion_timestamp.clone(),
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            annotations: written_back(meta),
            ..ObjectMeta::default()
        },
        spec: pod.spec.as_ref().map(|spec| PodSpec {
            containers: spec.containers.iter().map(slim_container).collect(),
            init_containers: spec
                .init_containers
                .as_ref()
                .map(|init| init.iter().map(slim_container).collect()),
            node_name: spec.node_name.clone(),
            // Ready waits for them.
            readiness_gates: spec.readiness_gates.clone(),
            restart_policy: spec.restart_policy.clone(),
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            // Enforced from the start time (see `controller::deadline`).
            active_deadline_seconds: spec.active_deadline_seconds,
            ..PodSpec::default()
        }),
        status: pod.status.clone(),
    }
}

/// The pod's annotations among those the daemon writes back, if it has any.
fn written_back(meta: &ObjectMeta) -> Option<std::collections::BTreeMap<String, String>> {
    let kept: std::collections::BTreeMap<String, String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(key, _)| WRITTEN_BACK.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use eci_proto::v20180808::{ContainerGroupStatus, ContainerInfo, ContainerState};
    use kube::Resource;
    use serde_json::json;

    use super::*;
    use vne_core::from_eci;

    fn mk_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "resourceVersion": "42", "generation": 2,
                "labels": {"app": "web"}, "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "deletionTimestamp": "2026-11-21T10:00:00Z", "deletionGracePeriodSeconds": 15},
            "spec": {"nodeName": "vn-0", "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 45,
                "initContainers": [{"name": "migrate", "image": "migrate:1", "env": [{"name": "A", "value": "1"}]},
                    {"name": "proxy", "image": "envoy:1", "restartPolicy": "Always"}],
                "containers": [{"name": "app", "image": "nginx:1.27", "args": ["-g", "daemon off;"],
                    "env": [{"name": "B", "value": "2"}], "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"requests": {"cpu": "250m", "ephemeral-storage": "1Gi"}, "limits": {"memory": "512Mi", "nvidia.com/gpu": "1"}}}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "readinessGates": [{"conditionType": "example.com/lb-ready"}],
                "tolerations": [{"operator": "Exists"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T09:00:00Z"}]},
        }))
        .unwrap()
    }

    #[test]
    fn of_the_annotations_keeps_only_those_the_daemon_writes_back() {
        let mut pod = mk_pod();
        let annotations = pod.metadata.annotations.get_or_insert_default();
        annotations.insert(
            "k8s.aliyun.com/allocated-eipAddress".into(),
            "203.0.113.7".into(),
        );
        annotations.insert("k8s.aliyun.com/eci-use-specs".into(), "2-4Gi".into());
        let kept = slim(&pod).metadata.annotations.unwrap_or_default();
        assert_eq!(
            kept.into_iter().collect::<Vec<_>>(),
            vec![(
                "k8s.aliyun.com/allocated-eipAddress".to_owned(),
                "203.0.113.7".to_owned()
            )],
            "a value a status write may have to correct stays; the rest goes"
        );
    }

    #[test]
    fn keeps_identity_deletion_containers_and_status_and_drops_the_rest() {
        let pod = mk_pod();
        let kept = slim(&pod);
        assert_eq!(kept.metadata.name.as_deref(), Some("web-0"));
        assert_eq!(kept.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(kept.metadata.generation, Some(2));
        assert_eq!(kept.metadata.deletion_grace_period_seconds, Some(15));
        assert!(kept.metadata.deletion_timestamp.is_some());
        assert!(kept.metadata.labels.is_none());
        assert!(kept.metadata.annotations.is_none());
        assert!(kept.metadata.managed_fields.is_none());
        let spec = kept.spec.as_ref().unwrap();
        assert_eq!(spec.termination_grace_period_seconds, Some(45));
        assert_eq!(
            spec.readiness_gates.as_ref().unwrap()[0].condition_type,
            "example.com/lb-ready"
        );
        assert_eq!(spec.containers[0].name, "app");
        assert_eq!(spec.containers[0].image.as_deref(), Some("nginx:1.27"));
        assert!(spec.containers[0].env.is_none() && spec.containers[0].args.is_none());
        // CPU and memory stay (the status reports them); other resources go.
        let resources = spec.containers[0].resources.as_ref().unwrap();
        let keys = |list: &Option<std::collections::BTreeMap<String, Quantity>>| {
            list.iter()
                .flatten()
                .map(|(k, q)| format!("{k}={}", q.0))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            (keys(&resources.requests), keys(&resources.limits)),
            (vec!["cpu=250m".to_owned()], vec!["memory=512Mi".to_owned()])
        );
        let init = spec.init_containers.as_ref().unwrap();
        assert_eq!(init[0].name, "migrate");
        // Which init container is a sidecar decides where its status comes from.
        assert_eq!(
            (
                init[0].restart_policy.as_deref(),
                init[1].restart_policy.as_deref()
            ),
            (None, Some("Always"))
        );
        assert!(spec.volumes.is_none() && spec.tolerations.is_none());
        assert_eq!(kept.status, pod.status);
        assert_eq!(kept.object_ref(&()), pod.object_ref(&()));
    }

    #[test]
    fn a_packed_copy_unpacks_to_the_slim_pod_and_answers_without_unpacking() {
        let pod = mk_pod();
        let packed = PodCopy::packed(&pod);
        assert!(packed.is_slim());
        assert_eq!(packed.phase(), Some("Running"));
        assert_eq!(packed.pod().as_deref(), Some(&slim(&pod)));
        let PodCopy::Packed(inner) = &packed else {
            unreachable!("packed above")
        };
        let json = serde_json::to_vec(&slim(&pod)).unwrap();
        assert!(
            inner.compressed.len() * 10 < json.len() * 7,
            "{} bytes packed of {} bytes of JSON",
            inner.compressed.len(),
            json.len()
        );

        let shared = Arc::new(pod);
        let whole = PodCopy::whole(&shared);
        assert!(whole.is(&shared) && !whole.is_slim() && !packed.is(&shared));
        assert_eq!(whole.phase(), Some("Running"));
        assert!(Arc::ptr_eq(&whole.pod().unwrap(), &shared));
    }

    /// A sync steps by the glance and unpacks only to act: what it reads of a packed copy
    /// must be what it would read of the copy unpacked, and a whole copy's what the pod shows.
    #[test]
    fn a_glance_reads_what_the_unpacked_copy_shows() {
        let mut running = mk_pod();
        running.metadata.deletion_timestamp = None;
        running
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(super::super::INSTANCE_ANNOTATION.into(), "eci-1".into());
        let spec = running.spec.as_mut().unwrap();
        spec.active_deadline_seconds = Some(60);
        let status = running.status.as_mut().unwrap();
        status.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-21T09:00:00Z".parse().unwrap(),
        ));
        let mut failed = running.clone();
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        for pod in [mk_pod(), running, failed] {
            let packed = PodCopy::packed(&pod);
            let unpacked = packed.pod().unwrap();
            assert_eq!(packed.glance(), Glance::of(&unpacked));
            assert_eq!(
                PodCopy::whole(&Arc::new(pod.clone())).glance(),
                Glance::of(&pod)
            );
        }
        let mut gated = mk_pod();
        let conditions = gated.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conditions.push(
            serde_json::from_value(json!({"type": "ContainersReady", "status": "True"})).unwrap(),
        );
        let glance = PodCopy::packed(&gated).glance();
        assert!(glance.terminating && !glance.finished() && glance.instance_id.is_none());
        // Its readiness gate is not met while Ready shows True: its status is to be refreshed.
        assert!(glance.refresh && glance.shown.is_some());
        assert!(!PodCopy::packed(&mk_pod()).glance().refresh);
    }

    #[test]
    fn a_packed_copy_stands_for_its_version_only_and_only_for_a_versioned_pod() {
        let pod = mk_pod();
        let packed = PodCopy::packed(&pod);
        assert!(packed.packs_version_of(&pod), "the same version");

        let mut newer = pod.clone();
        newer.metadata.resource_version = Some("43".into());
        assert!(!packed.packs_version_of(&newer), "another version");

        let mut unversioned = pod.clone();
        unversioned.metadata.resource_version = None;
        let packed_unversioned = PodCopy::packed(&unversioned);
        assert!(
            !packed_unversioned.packs_version_of(&unversioned),
            "without a version nothing tells two copies apart"
        );
        assert!(
            !PodCopy::whole(&Arc::new(pod.clone())).packs_version_of(&pod),
            "a whole copy never stands for a packed one"
        );
    }

    #[test]
    fn a_pod_unlike_the_dictionary_packs_and_unpacks_whole() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "ж-".repeat(40), "uid": "\u{1F980}", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "x", "image": "\"quoted\"\n"}]},
            "status": {"phase": "Weird", "message": "x".repeat(5000)},
        }))
        .unwrap();
        let packed = PodCopy::packed(&pod);
        assert_eq!(packed.phase(), Some("Weird"));
        assert_eq!(packed.pod().as_deref(), Some(&slim(&pod)));
    }

    #[test]
    fn the_status_written_for_a_slim_pod_is_the_one_written_for_the_whole_pod() {
        let pod = mk_pod();
        let group = ContainerGroupStatus {
            container_group_id: "eci-1".into(),
            status: "Running".into(),
            intranet_ip: "10.0.0.7".into(),
            containers: vec![ContainerInfo {
                name: "app".into(),
                ready: true,
                started: true,
                current_state: Some(ContainerState {
                    state: "Running".into(),
                    ..ContainerState::default()
                }),
                ..ContainerInfo::default()
            }],
            ..ContainerGroupStatus::default()
        };
        let now = SystemTime::now();
        assert_eq!(
            from_eci::pod_status(&slim(&pod), &group, now),
            from_eci::pod_status(&pod, &group, now)
        );
    }
}
