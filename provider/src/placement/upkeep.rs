//! The elected replica's upkeep: each policy's status (counts per unit and group, problems
//! the schema could not catch) and each placed pod's unit annotation and deletion cost, so
//! that pods placed without the extender (or before the policy, or before it was edited) still
//! leave in reverse unit order. A pod bound with no placement of ours while the extender is
//! supposed to serve is reported once: its unit order was not enforced.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};
use vne_core::placement::decide;
use vne_core::placement::policy::{self, ResourcePolicy, ResourcePolicyStatus, UnitStatus};

use super::admit::Enforcement;
use super::state::{
    DELETION_COST_ANNOTATION, PLACED_BY_ANNOTATION, POLICY_ANNOTATION, PlacementIndex, PolicyEntry,
    REASON_ANNOTATION, UNIT_ANNOTATION,
};
use crate::ops::chain::Chain;
use crate::ops::events::EventPublisher;

/// How often the upkeep runs (it only writes what changed).
const PERIOD: Duration = Duration::from_secs(3);
/// The field manager of our status writes.
const MANAGER: &str = crate::k8s::FIELD_MANAGER;

/// One pod's annotations as they should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Correction {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (what the once-only warnings remember).
    pub uid: String,
    /// Bound without the extender having placed it (no [`PLACED_BY_ANNOTATION`]).
    pub placed_without_extender: bool,
    /// Annotations to set.
    pub annotations: BTreeMap<String, String>,
}

/// The status a policy should show (pure).
pub fn status_of(entry: &PolicyEntry, counts: &[BTreeMap<String, u32>]) -> ResourcePolicyStatus {
    let spec = &entry.policy.spec;
    let grouped = !spec.match_label_keys.is_empty();
    let units: Vec<UnitStatus> = spec
        .units
        .iter()
        .zip(counts)
        .enumerate()
        .map(|(i, (unit, groups))| UnitStatus {
            unit: i32::try_from(i + 1).unwrap_or(i32::MAX),
            description: unit.describe(),
            pods: i32::try_from(groups.values().sum::<u32>()).unwrap_or(i32::MAX),
            groups: if grouped {
                groups
                    .iter()
                    .map(|(k, v)| (k.clone(), i32::try_from(*v).unwrap_or(i32::MAX)))
                    .collect()
            } else {
                BTreeMap::new()
            },
        })
        .collect();
    let problems = policy::validate(spec);
    ResourcePolicyStatus {
        observed_generation: entry.policy.metadata.generation,
        unit_count: i32::try_from(spec.units.len()).unwrap_or(i32::MAX),
        placed_pods: units.iter().map(|u| u.pods).sum(),
        units,
        problem: (!problems.is_empty()).then(|| {
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        }),
    }
}

/// The annotation fixes the policy's bound pods need (pure but for reading the index).
pub fn corrections(index: &PlacementIndex, entry: &PolicyEntry) -> Vec<Correction> {
    let spec = &entry.policy.spec;
    let mut out = Vec::new();
    for pod in index.pods_in(&entry.namespace) {
        let (Some(node), false, false) = (&pod.node, pod.terminating, pod.finished) else {
            continue;
        };
        if index
            .policy_for(&entry.namespace, &pod.labels)
            .is_none_or(|p| p.key != entry.key)
        {
            continue;
        }
        let Some(labels) = index.node_labels(node) else {
            continue;
        };
        let Some(unit) = decide::unit_of_node(spec, &labels, index.vnodes()) else {
            continue;
        };
        let wanted = [
            (UNIT_ANNOTATION, (unit + 1).to_string()),
            (POLICY_ANNOTATION, entry.key.clone()),
            (
                DELETION_COST_ANNOTATION,
                decide::deletion_cost(unit, spec.units.len()).to_string(),
            ),
        ];
        let missing: BTreeMap<String, String> = wanted
            .into_iter()
            .filter(|(k, v)| pod.annotations.get(*k) != Some(v))
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        if !missing.is_empty() {
            out.push(Correction {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                placed_without_extender: !pod.annotations.contains_key(PLACED_BY_ANNOTATION),
                annotations: missing,
            });
        }
    }
    out
}

/// The upkeep loop, while this replica leads.
pub async fn run(
    client: kube::Client,
    index: Arc<PlacementIndex>,
    enforcement: tokio::sync::watch::Receiver<Enforcement>,
    events: EventPublisher,
    stop: CancellationToken,
) {
    let mut written: HashMap<String, ResourcePolicyStatus> = HashMap::new();
    let mut reported: HashSet<String> = HashSet::new();
    let mut announced: HashSet<String> = HashSet::new();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if !index.is_listed() {
            // Counts taken now would miss pods not listed yet, and be written as the status.
            continue;
        }
        let extender = *enforcement.borrow() == Enforcement::Extender;
        for entry in index.policies() {
            let span = info_span!("placement upkeep", policy = %entry.key);
            upkeep(
                &client,
                &index,
                &entry,
                &mut written,
                &mut reported,
                extender,
            )
            .instrument(span)
            .await;
            announce_admission_placements(&index, &entry, &events, &mut announced);
        }
        let live: HashSet<String> = index.policies().into_iter().map(|p| p.key).collect();
        written.retain(|k, _| live.contains(k));
        let live_pods = live_pod_uids(&index);
        reported.retain(|uid| live_pods.contains(uid));
        announced.retain(|uid| live_pods.contains(uid));
    }
}

/// The UIDs of the pods the index holds in the namespaces of its policies: what the
/// once-only warnings and Events may still need to remember (a deleted pod's entry would
/// only grow the sets).
fn live_pod_uids(index: &PlacementIndex) -> HashSet<String> {
    let namespaces: HashSet<String> = index.policies().into_iter().map(|p| p.namespace).collect();
    namespaces
        .iter()
        .flat_map(|namespace| index.pods_in(namespace))
        .map(|pod| pod.uid)
        .collect()
}

/// Pods admission placed get their Event once bound (at admission their name may not exist
/// yet: `generateName`).
fn announce_admission_placements(
    index: &PlacementIndex,
    entry: &PolicyEntry,
    events: &EventPublisher,
    announced: &mut HashSet<String>,
) {
    for pod in index.pods_in(&entry.namespace) {
        let (Some(_), Some(note)) = (&pod.node, pod.annotations.get(REASON_ANNOTATION)) else {
            continue;
        };
        if pod.annotations.get(POLICY_ANNOTATION) != Some(&entry.key)
            || !announced.insert(pod.uid.clone())
        {
            continue;
        }
        events.publish_later(
            kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: "Placed".into(),
                note: Some(format!("ResourcePolicy {}: {note}", entry.key)),
                action: "Admit".into(),
                secondary: None,
            },
            k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
                ..Default::default()
            },
        );
    }
}

async fn upkeep(
    client: &kube::Client,
    index: &PlacementIndex,
    entry: &PolicyEntry,
    written: &mut HashMap<String, ResourcePolicyStatus>,
    reported: &mut HashSet<String>,
    extender: bool,
) {
    let status = status_of(entry, &index.unit_counts(entry));
    if written.get(&entry.key) != Some(&status) {
        let policies: Api<ResourcePolicy> = Api::namespaced(client.clone(), &entry.namespace);
        let name = entry.policy.metadata.name.clone().unwrap_or_default();
        let patch = json!({
            "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
            "kind": "ResourcePolicy",
            "status": status,
        });
        match policies
            .patch_status(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {
                if let Some(problem) = &status.problem {
                    warn!(%problem, "the ResourcePolicy cannot be used as written");
                }
                written.insert(entry.key.clone(), status);
            }
            Err(error) => debug!(error = %Chain(&error), "could not write the status; retrying"),
        }
    }
    for correction in corrections(index, entry) {
        let key = format!("{}/{}", correction.namespace, correction.name);
        if extender && correction.placed_without_extender && reported.insert(correction.uid.clone())
        {
            warn!(pod = %key, "pod was bound without the scheduler extender, so its unit order was not enforced (is kube-scheduler configured with the extender? see deploy/examples/scheduler-extender.yaml); its deletion cost follows its node's unit");
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &correction.namespace);
        let patch = json!({"metadata": {"annotations": correction.annotations}});
        match pods
            .patch(
                &correction.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                info!(pod = %key, annotations = ?correction.annotations, "set the pod's unit and deletion cost");
            }
            Err(error) => {
                debug!(pod = %key, error = %Chain(&error), "could not set the pod's unit; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vne_core::placement::decide::VirtualNodes;

    fn index() -> PlacementIndex {
        let index = PlacementIndex::new(VirtualNodes::default());
        let policy: ResourcePolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "generation": 3},
            "spec": {"selector": {"app": "web"}, "matchLabelKeys": ["v"], "units": [
                {"resource": "ecs", "nodeSelector": {"pool": "a"}, "max": 2},
                {"resource": "eci"},
            ]},
        }))
        .unwrap();
        index.set_policies([policy]);
        let node = |name: &str, labels: serde_json::Value| -> k8s_openapi::api::core::v1::Node {
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
        };
        index.set_nodes([
            node("a-1", json!({"pool": "a"})),
            node("vk", json!({"k8s.aliyun.com/vnode": "true"})),
        ]);
        let pod = |name: &str, node: &str, v: &str, annotations: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name,
                    "labels": {"app": "web", "v": v}, "annotations": annotations},
                "spec": {"nodeName": node, "containers": []},
            }))
            .unwrap()
        };
        index.set_pods([
            pod("x", "a-1", "1", json!({})),
            pod(
                "y",
                "vk",
                "1",
                json!({
                UNIT_ANNOTATION: "2", POLICY_ANNOTATION: "ns/p", DELETION_COST_ANNOTATION: "100"}),
            ),
            pod("z", "a-1", "2", json!({})),
        ]);
        index
    }

    #[test]
    fn status_counts_units_and_groups() {
        let index = index();
        let entry = index.policies().pop().unwrap();
        let status = status_of(&entry, &index.unit_counts(&entry));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.placed_pods, 3);
        assert_eq!(status.units[0].pods, 2);
        assert_eq!(
            status.units[0].groups,
            BTreeMap::from([("v=1".to_owned(), 1), ("v=2".to_owned(), 1)])
        );
        assert_eq!(status.units[1].description, "eci");
        assert_eq!(status.problem, None);
    }

    #[test]
    fn pods_placed_without_us_get_their_units_cost() {
        let index = index();
        let entry = index.policies().pop().unwrap();
        let mut fixes = corrections(&index, &entry);
        fixes.sort_by(|a, b| a.name.cmp(&b.name));
        let names: Vec<&str> = fixes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["x", "z"]);
        assert_eq!(fixes[0].annotations[DELETION_COST_ANNOTATION], "200");
        assert_eq!(fixes[0].annotations[UNIT_ANNOTATION], "1");
        assert_eq!(fixes[0].uid, "x");
        assert!(
            fixes[0].placed_without_extender,
            "x has no placed-by annotation"
        );
    }

    #[test]
    fn only_pods_still_in_the_index_are_remembered() {
        let index = index();
        assert_eq!(
            live_pod_uids(&index),
            HashSet::from(["x".to_owned(), "y".to_owned(), "z".to_owned()])
        );
        // A deleted pod leaves the index, and so the once-only sets.
        index.set_pods(Vec::<Pod>::new());
        assert!(live_pod_uids(&index).is_empty());
    }
}
