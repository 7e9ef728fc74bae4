//! Keeps the Node's status honest: probes ECI on a timer and patches the status subresource
//! when anything changed, and at least every `node_status_max_interval` for the heartbeat.
//!
//! A configuration ECI refuses (credentials, RAM permissions, clock, account, an endpoint that
//! is not ECI — [`crate::eci::misconfig`]) is the node's problem: the `EciMisconfigured`
//! condition says which and how to fix it, and the `virtual-node.eci/misconfigured:NoSchedule`
//! taint keeps new pods away (kube-scheduler's TaintToleration filter honours it). Ready stays
//! as reachability says: a NotReady node gets the node lifecycle controller's `not-ready`
//! NoExecute taint and its running pods evicted, though their groups run fine.

use std::time::SystemTime;

use eci_proto::EciError;
use eci_proto::v20180808::{DescribeContainerGroupStatusRequest, Tag};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::NodeMetrics;
use super::shape;
use crate::config::{NodeArgs, WithSite};
use crate::eci::Backend;
use crate::eci::misconfig::{Misconfiguration, Monitor};
use crate::node::eci_health::{EciHealth, HealthTracker};
use crate::ops::metrics::{MetricSet as _, ResultLabels, Telemetry};

/// Tag key carrying the cluster name on every container group.
pub const CLUSTER_TAG: &str = "k8s.aliyun.com/cluster";

/// Whether an ECI error means the API did not answer (as opposed to answering "no").
pub fn is_unreachable(error: &EciError) -> bool {
    error.is_retryable() && !error.is_throttling()
}

/// The action [`probe`] calls.
const PROBE_ACTION: &str = "DescribeContainerGroupStatus";

/// One cheap call: a one-item status page of this cluster's groups. Its outcome goes to
/// `monitor`; the answer is the error only when ECI did not answer at all.
pub async fn probe(
    backend: &Backend,
    config: &WithSite<NodeArgs>,
    monitor: &Monitor,
) -> Result<(), EciError> {
    let request = DescribeContainerGroupStatusRequest {
        region_id: config.site.region.clone(),
        limit: Some(1),
        tag: vec![Tag {
            key: CLUSTER_TAG.into(),
            value: config.site.cluster_name.clone(),
        }],
        ..DescribeContainerGroupStatusRequest::default()
    };
    let outcome = backend.describe_container_group_status(request).await;
    monitor.record(PROBE_ACTION, outcome.as_ref().map(|_| ()));
    match outcome {
        Err(error) if is_unreachable(&error) => Err(error),
        // An answer — even a throttled or refused call — means ECI is reachable.
        _ => Ok(()),
    }
}

/// The reporter's memory of what it last wrote.
#[derive(Debug)]
pub struct StatusReporter {
    tracker: HealthTracker,
    last_written: Option<(Value, Instant)>,
    kubelet_version: String,
}

impl StatusReporter {
    /// A reporter that has written nothing yet.
    pub fn new(config: &WithSite<NodeArgs>) -> Self {
        Self {
            tracker: HealthTracker::new(config.args.eci_unreachable_threshold),
            last_written: None,
            kubelet_version: shape::kubelet_version(),
        }
    }

    /// Reports the kubelet version that goes with a control plane at `git_version` (its
    /// `/version`); an unparsable one keeps the current.
    pub fn follow_control_plane(&mut self, git_version: &str) {
        if let Some(version) = shape::kubelet_version_for(git_version) {
            self.kubelet_version = version;
        }
    }

    /// Records a probe outcome.
    pub fn record(&mut self, outcome: Result<(), EciError>, telemetry: &Telemetry) {
        let metrics = NodeMetrics::of(telemetry);
        match outcome {
            Ok(()) => {
                self.tracker.record_success();
                metrics
                    .eci_probes
                    .get_or_create(&ResultLabels {
                        result: "ok".into(),
                    })
                    .inc();
            }
            Err(error) => {
                metrics
                    .eci_probes
                    .get_or_create(&ResultLabels {
                        result: error.code.clone(),
                    })
                    .inc();
                self.tracker.record_failure(
                    Instant::now(),
                    SystemTime::now(),
                    format!("{}: {}", error.code, error.message),
                );
            }
        }
    }

    /// The status to write now, if one is due: when it differs from the last written one or
    /// the last write is `max_interval` old.
    pub fn due(
        &self,
        config: &WithSite<NodeArgs>,
        now: Instant,
        misconfigured: Option<&Misconfiguration>,
    ) -> Option<(Value, EciHealth)> {
        let health = self.tracker.health(now);
        let previous = self.last_written.as_ref().map(|(status, _)| status);
        let status = shape::status(
            config,
            &health,
            misconfigured,
            previous,
            SystemTime::now(),
            &self.kubelet_version,
        );
        let stale = self.last_written.as_ref().is_none_or(|(written, at)| {
            shape::fingerprint(written) != shape::fingerprint(&status)
                || now.duration_since(*at) >= config.args.node_status_max_interval
        });
        stale.then_some((status, health))
    }

    /// Remembers a written status.
    pub fn written(&mut self, status: Value, now: Instant) {
        self.last_written = Some((status, now));
    }

    /// Forgets what was written, so the next check writes (after the Node was recreated).
    pub fn forget(&mut self) {
        self.last_written = None;
    }
}

/// Asks the API server its version (`/version`, readable by every authenticated caller) so the
/// node reports a kubelet of the same minor; without an answer within 10 s the node reports
/// [`shape::KUBERNETES_COMPAT`] until the daemon restarts.
async fn follow_control_plane(nodes: &Api<Node>, reporter: &mut StatusReporter) {
    let client = nodes.clone().into_client();
    match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.apiserver_version(),
    )
    .await
    {
        Ok(Ok(info)) => reporter.follow_control_plane(&info.git_version),
        Ok(Err(error)) => {
            warn!(%error, "could not read the API server's version; reporting kubelet {}", shape::KUBERNETES_COMPAT);
        }
        Err(_) => {
            warn!(
                "the API server's version took over 10 s; reporting kubelet {}",
                shape::KUBERNETES_COMPAT
            );
        }
    }
}

/// Adds or removes [`shape::MISCONFIGURED_TAINT`] so the node shows `misconfigured`; whether
/// it does now. The taints are a list the apiserver replaces whole: the write carries the
/// resourceVersion read, so a concurrent change of another taint is never lost (a conflict
/// is retried at the next check).
async fn sync_taint(
    nodes: &Api<Node>,
    name: &str,
    misconfigured: bool,
    telemetry: &Telemetry,
) -> Result<(), kube::Error> {
    telemetry.kube_request("node_get");
    let node = nodes.get(name).await?;
    let current = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.clone())
        .unwrap_or_default();
    let Some(taints) = shape::misconfigured_taints(&current, misconfigured) else {
        return Ok(());
    };
    let patch = json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": taints},
    });
    telemetry.kube_request("node_patch");
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    if misconfigured {
        warn!(node = %name, taint = shape::MISCONFIGURED_TAINT, "ECI refuses this daemon's configuration: new pods are kept off the node");
    } else {
        info!(node = %name, taint = shape::MISCONFIGURED_TAINT, "ECI accepts this daemon's configuration again: the node takes new pods");
    }
    Ok(())
}

/// Probes and reports until cancelled; also reports at once when the pod creators meet a
/// misconfiguration (`monitor`).
pub async fn run(
    nodes: Api<Node>,
    backend: Backend,
    config: WithSite<NodeArgs>,
    telemetry: std::sync::Arc<Telemetry>,
    monitor: std::sync::Arc<Monitor>,
    mut node_uid: tokio::sync::watch::Receiver<String>,
    stop: CancellationToken,
) -> Result<(), kube::Error> {
    let mut reporter = StatusReporter::new(&config);
    follow_control_plane(&nodes, &mut reporter).await;
    let mut ticks = tokio::time::interval(config.args.eci_probe_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = monitor.subscribe();
    // What the node's taints show, once known.
    let mut tainted: Option<bool> = None;
    loop {
        let probe_due = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = ticks.tick() => true,
            Ok(()) = changes.changed() => false,
        };
        if node_uid.has_changed().unwrap_or(false) {
            // A new Node object: its status starts empty, so write ours at once.
            node_uid.mark_unchanged();
            reporter.forget();
            tainted = None;
        }
        if probe_due {
            let outcome = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                outcome = probe(&backend, &config, &monitor) => outcome,
            };
            reporter.record(outcome, &telemetry);
        }
        let misconfigured = changes.borrow_and_update().clone();
        if tainted != Some(misconfigured.is_some()) {
            match sync_taint(
                &nodes,
                &config.site.node_name,
                misconfigured.is_some(),
                &telemetry,
            )
            .await
            {
                Ok(()) => tainted = Some(misconfigured.is_some()),
                Err(error) => {
                    warn!(node = %config.site.node_name, %error, "could not update the node's misconfiguration taint; retrying at the next probe");
                }
            }
        }
        let now = Instant::now();
        let Some((status, health)) = reporter.due(&config, now, misconfigured.as_ref()) else {
            continue;
        };
        match patch_status(&nodes, &config.site.node_name, &status, &telemetry).await {
            Ok(()) => {
                report_written(&config, &telemetry, &health, misconfigured.as_ref());
                reporter.written(status, now);
            }
            Err(error) => {
                warn!(node = %config.site.node_name, %error, "could not write the node status; retrying at the next probe");
                reporter.forget();
            }
        }
    }
}

/// Writes the node's status.
async fn patch_status(
    nodes: &Api<Node>,
    name: &str,
    status: &Value,
    telemetry: &Telemetry,
) -> Result<(), kube::Error> {
    telemetry.kube_request("node_status_patch");
    // Strategic merge: conditions merge by type, so those other components add to the
    // node (node-problem-detector's, say) are kept.
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": status})),
        )
        .await?;
    Ok(())
}

/// A status written: the gauges follow it, and what keeps the node from serving is logged.
fn report_written(
    config: &WithSite<NodeArgs>,
    telemetry: &Telemetry,
    health: &EciHealth,
    misconfigured: Option<&Misconfiguration>,
) {
    let ready = *health == EciHealth::Reachable;
    let metrics = NodeMetrics::of(telemetry);
    metrics.eci_reachable.set(i64::from(ready));
    metrics.node_ready.set(i64::from(ready));
    if let EciHealth::Unreachable { error, .. } = health {
        warn!(node = %config.site.node_name, %error, "ECI unreachable: node NotReady (EciUnreachable)");
    }
    if let Some(found) = misconfigured {
        warn!(node = %config.site.node_name, code = %found.code, action = %found.action, request_id = %found.request_id, fix = found.problem.fix(), "ECI refuses this daemon's configuration ({})", shape::MISCONFIGURED_CONDITION);
    }
    info!(node = %config.site.node_name, ready, "node status written");
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        why: "report Ready, capacity and the heartbeat",
    },
    crate::k8s::access::Access {
        scope: crate::k8s::access::Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["get", "patch"],
        why: "taint the node while ECI refuses the daemon's configuration",
    },
];

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::config::Config;

    fn mk_config() -> WithSite<NodeArgs> {
        let settings = Config::parse_from([
            "virtual-node-eci",
            "--node-name=vn-0",
            "--eci=embedded",
            "--vswitch=vsw-test",
            "--security-group=sg-test",
            "--cluster-name=c",
        ])
        .settings()
        .unwrap();
        settings.with_site(&settings.config.node)
    }

    fn unavailable() -> EciError {
        EciError::new("ServiceUnavailable", "connection refused")
    }

    #[tokio::test(start_paused = true)]
    async fn ready_follows_eci_health_and_writes_only_when_needed() {
        let config = mk_config();
        let telemetry = Telemetry::new();
        let mut reporter = StatusReporter::new(&config);
        let ready = |status: &Value| {
            status["conditions"][0]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };

        reporter.record(Ok(()), &telemetry);
        let (status, _) = reporter
            .due(&config, Instant::now(), None)
            .expect("the first status is always written");
        assert_eq!(ready(&status), "True");
        reporter.written(status, Instant::now());

        // Probes every 10 s: nothing changes, nothing is written until the 60 s heartbeat.
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(10)).await;
            reporter.record(Ok(()), &telemetry);
            assert!(reporter.due(&config, Instant::now(), None).is_none());
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        reporter.record(Ok(()), &telemetry);
        let (heartbeat, _) = reporter
            .due(&config, Instant::now(), None)
            .expect("the heartbeat is due at 60 s");
        reporter.written(heartbeat, Instant::now());

        // ECI fails: still Ready within the 30 s threshold, NotReady after it.
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(10)).await;
            reporter.record(Err(unavailable()), &telemetry);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        reporter.record(Err(unavailable()), &telemetry);
        let (down, health) = reporter
            .due(&config, Instant::now(), None)
            .expect("a change is written at once");
        assert!(matches!(health, EciHealth::Unreachable { .. }));
        assert_eq!(ready(&down), "False");
        assert_eq!(down["conditions"][0]["reason"], "EciUnreachable");
        assert!(
            down["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("ServiceUnavailable: connection refused")
        );
        reporter.written(down, Instant::now());

        tokio::time::advance(Duration::from_secs(10)).await;
        reporter.record(Ok(()), &telemetry);
        let (up, _) = reporter
            .due(&config, Instant::now(), None)
            .expect("recovery is written at once");
        assert_eq!(ready(&up), "True");
    }

    #[test]
    fn answers_that_are_refusals_still_mean_reachable() {
        assert!(is_unreachable(&unavailable()));
        assert!(is_unreachable(&EciError::new("InternalError", "boom")));
        assert!(!is_unreachable(&EciError::new(
            "Throttling.User",
            "slow down"
        )));
        assert!(!is_unreachable(&EciError::new(
            "InvalidParameter.Limit",
            "bad"
        )));
    }
}
