//! A node's pods as the metrics need them: which run, and when their containers started — a
//! few strings per pod, never the `Pod`, so a daemon's index of them grows with the pod count,
//! not with the size of the pods' specs — and which of them ECI can be asked about.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

/// One pod of the node. Which ECI group runs it is not here: the pod controller records that,
/// never the pod's annotations (whoever may edit the pod writes those), and it is asked when
/// the figures are read ([`by_group`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `status.phase` is `Running`: only then does ECI have figures for it.
    pub running: bool,
    /// `status.startTime`.
    pub start_time: Option<Timestamp>,
    /// Start times of its running containers (`state.running.startedAt`), by name.
    pub containers: Vec<(String, Timestamp)>,
}

impl PodEntry {
    /// The slim entry of `pod` (`None` without a UID, which a stored pod always has).
    pub fn of(pod: &Pod) -> Option<Self> {
        let metadata = &pod.metadata;
        let status = pod.status.as_ref();
        let containers = status
            .and_then(|s| s.container_statuses.as_ref())
            .map(|statuses| {
                statuses
                    .iter()
                    .filter_map(|c| {
                        let started = c.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
                        Some((c.name.clone(), started.0))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
            uid: metadata.uid.clone()?,
            running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
            start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            containers,
        })
    }

    /// When container `name` started, if it runs.
    pub fn container_start(&self, name: &str) -> Option<Timestamp> {
        self.containers
            .iter()
            .find(|(container, _)| container == name)
            .map(|(_, at)| *at)
    }
}

/// The pods ECI can be asked about, by the group that runs each: those that run and whose
/// group `group_of` (the pod controller's record, by pod UID) knows. Two pods said to share a
/// group (which a recorded group never is) are one entry: ECI answers once per group.
pub fn by_group<'a>(
    pods: impl IntoIterator<Item = &'a PodEntry>,
    group_of: impl Fn(&str) -> Option<String>,
) -> HashMap<String, PodEntry> {
    pods.into_iter()
        .filter(|pod| pod.running)
        .filter_map(|pod| Some((group_of(&pod.uid)?, pod.clone())))
        .collect()
}
