//! The node Lease (`kube-node-lease/<node>`): claimed at start, renewed on a timer, released
//! on a clean shutdown so a successor takes over at once.
//!
//! `holderIdentity` is the node name, as for kubelets. Which *process* holds it is recorded in
//! an annotation, so a second process for the same node can tell a live holder (it renews:
//! refuse to start) from a crashed one (it stopped renewing: take over) and from a cleanly
//! stopped one (released: take over at once).

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ops::metrics::{ResultLabels, Telemetry};

/// Namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Annotation: the process instance holding the Lease.
pub const INSTANCE_ANNOTATION: &str = "virtual-node-eci.aliyun.com/holder-instance";
/// Annotation: the holder's renew interval in milliseconds.
pub const RENEW_INTERVAL_ANNOTATION: &str = "virtual-node-eci.aliyun.com/renew-interval-ms";
/// Annotation: the holder stopped cleanly and released the Lease.
pub const RELEASED_ANNOTATION: &str = "virtual-node-eci.aliyun.com/released";

/// Lease handling failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another live process serves this node.
    #[error(
        "node {node} is already served by another virtual-node-eci process (instance {instance} renewed the Lease {LEASE_NAMESPACE}/{node} at {renewed}); stop that process or give this one another --node-name"
    )]
    HeldByLiveProcess {
        /// The node.
        node: String,
        /// The other process.
        instance: String,
        /// When it last renewed.
        renewed: String,
    },
    /// Another process took the Lease over while we held it.
    #[error(
        "another process (instance {instance}) took over the Lease {LEASE_NAMESPACE}/{node}; this process stops serving the node"
    )]
    Lost {
        /// The node.
        node: String,
        /// The new holder.
        instance: String,
    },
    /// The API failed.
    #[error("Lease {LEASE_NAMESPACE}/{node}: {source}")]
    Api {
        /// The node.
        node: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// Who this process is, and how it renews.
#[derive(Debug, Clone)]
pub struct LeaseIdentity {
    /// Node name (the holder identity).
    pub node: String,
    /// The Node's uid, for the owner reference.
    pub node_uid: String,
    /// This process.
    pub instance: String,
    /// Lease duration.
    pub duration_seconds: i32,
    /// Renew interval.
    pub renew_interval: Duration,
}

fn micro_time(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

fn annotation<'a>(lease: &'a Value, key: &str) -> Option<&'a str> {
    lease
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// What to do about an existing Lease at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// Take it now: released, expired, or ours.
    TakeOver,
    /// Held by another process that renewed recently: watch whether it renews again before
    /// `deadline`.
    Observe {
        /// The other process.
        instance: String,
        /// Its last renewTime as written.
        renewed: String,
        /// When to conclude it is dead.
        deadline: SystemTime,
    },
}

/// Decides about an existing Lease (pure).
pub fn assess(lease: &Value, identity: &LeaseIdentity, now: SystemTime) -> Assessment {
    let instance = annotation(lease, INSTANCE_ANNOTATION)
        .unwrap_or_default()
        .to_owned();
    if instance == identity.instance || annotation(lease, RELEASED_ANNOTATION) == Some("true") {
        return Assessment::TakeOver;
    }
    let renewed_text = lease
        .pointer("/spec/renewTime")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let Ok(renewed) = humantime::parse_rfc3339_weak(&renewed_text) else {
        return Assessment::TakeOver;
    };
    let duration = lease
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(40);
    if renewed + Duration::from_secs(duration) <= now {
        return Assessment::TakeOver;
    }
    // A live holder renews every `interval`; allow one and a half of them plus a second.
    let interval = annotation(lease, RENEW_INTERVAL_ANNOTATION)
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(Duration::from_secs(duration / 4), Duration::from_millis);
    let deadline = (renewed + interval.mul_f64(1.5) + Duration::from_secs(1))
        .min(renewed + Duration::from_secs(duration));
    Assessment::Observe {
        instance,
        renewed: renewed_text,
        deadline,
    }
}

/// What a renewal the apiserver refused as a conflict means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another process holds the Lease now.
    Lost {
        /// Its instance.
        holder: String,
    },
    /// The Lease no longer exists: create it again.
    Deleted,
    /// Still ours, changed by someone else (a label, an annotation): renew what is stored.
    StillOurs,
}

/// Decides about a refused renewal from the Lease as it is now (pure).
pub fn after_refusal(fresh: Option<&Value>, instance: &str) -> Refusal {
    let Some(fresh) = fresh else {
        return Refusal::Deleted;
    };
    let holder = annotation(fresh, INSTANCE_ANNOTATION).unwrap_or_default();
    if holder == instance {
        Refusal::StillOurs
    } else {
        Refusal::Lost {
            holder: holder.to_owned(),
        }
    }
}

/// The Lease is owned by the Node it describes (deleted with it).
fn owner_references(identity: &LeaseIdentity) -> Value {
    json!([{"apiVersion": "v1", "kind": "Node", "name": identity.node, "uid": identity.node_uid}])
}

/// The Lease as this process holds it.
fn held(identity: &LeaseIdentity, previous: Option<&Value>, now: SystemTime) -> Value {
    let transitions = previous
        .and_then(|p| p.pointer("/spec/leaseTransitions"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
        + i64::from(previous.is_some_and(|p| {
            annotation(p, INSTANCE_ANNOTATION) != Some(identity.instance.as_str())
        }));
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": identity.node,
            "namespace": LEASE_NAMESPACE,
            "annotations": {
                INSTANCE_ANNOTATION: identity.instance,
                RENEW_INTERVAL_ANNOTATION: identity.renew_interval.as_millis().to_string(),
            },
            "ownerReferences": owner_references(identity),
        },
        "spec": {
            "holderIdentity": identity.node,
            "leaseDurationSeconds": identity.duration_seconds,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        },
    });
    if let Some(rv) = previous.and_then(|p| p.pointer("/metadata/resourceVersion")) {
        lease["metadata"]["resourceVersion"] = rv.clone();
    }
    lease
}

fn to_lease(value: Value) -> Result<Lease, kube::Error> {
    serde_json::from_value(value).map_err(kube::Error::SerdeError)
}

fn to_value(lease: &Lease) -> Value {
    serde_json::to_value(lease).unwrap_or_default()
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// A held Lease.
#[derive(Debug)]
pub struct NodeLease {
    api: Api<Lease>,
    identity: LeaseIdentity,
    current: Value,
}

impl NodeLease {
    /// Claims the Lease: creates it, takes over a released, expired or dead holder's, or
    /// refuses when a live process holds it.
    pub async fn acquire(
        client: kube::Client,
        identity: LeaseIdentity,
        telemetry: &Telemetry,
    ) -> Result<Self, LeaseError> {
        let api: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
        let error = |source| LeaseError::Api {
            node: identity.node.clone(),
            source,
        };
        loop {
            telemetry.kube_request("lease_get");
            let existing = api.get_opt(&identity.node).await.map_err(error)?;
            let now = SystemTime::now();
            let attempt = match existing {
                None => {
                    telemetry.kube_request("lease_create");
                    api.create(
                        &PostParams::default(),
                        &to_lease(held(&identity, None, now)).map_err(error)?,
                    )
                    .await
                }
                Some(existing) => {
                    let existing = to_value(&existing);
                    match assess(&existing, &identity, now) {
                        Assessment::TakeOver => {
                            telemetry.kube_request("lease_take_over");
                            api.replace(
                                &identity.node,
                                &PostParams::default(),
                                &to_lease(held(&identity, Some(&existing), now)).map_err(error)?,
                            )
                            .await
                        }
                        Assessment::Observe {
                            instance,
                            renewed,
                            deadline,
                        } => {
                            info!(node = %identity.node, holder = %instance, %renewed, "the Lease is held by another process; waiting to see whether it is alive");
                            let wait = deadline
                                .duration_since(SystemTime::now())
                                .unwrap_or_default();
                            tokio::time::sleep(wait).await;
                            telemetry.kube_request("lease_get");
                            let again = api
                                .get_opt(&identity.node)
                                .await
                                .map_err(error)?
                                .map(|l| to_value(&l));
                            let renewed_again = again
                                .as_ref()
                                .and_then(|l| l.pointer("/spec/renewTime"))
                                .and_then(Value::as_str)
                                .unwrap_or_default();
                            let same_holder = again
                                .as_ref()
                                .and_then(|l| annotation(l, INSTANCE_ANNOTATION))
                                == Some(instance.as_str());
                            let released = again
                                .as_ref()
                                .and_then(|l| annotation(l, RELEASED_ANNOTATION))
                                == Some("true");
                            if same_holder && !released && renewed_again != renewed {
                                return Err(LeaseError::HeldByLiveProcess {
                                    node: identity.node.clone(),
                                    instance,
                                    renewed: renewed_again.to_owned(),
                                });
                            }
                            match again {
                                // Still the silent holder (or it released): it is gone.
                                Some(again) if same_holder => {
                                    telemetry.kube_request("lease_take_over");
                                    api.replace(
                                        &identity.node,
                                        &PostParams::default(),
                                        &to_lease(held(&identity, Some(&again), SystemTime::now()))
                                            .map_err(error)?,
                                    )
                                    .await
                                }
                                // Deleted, or claimed by yet another process: start over.
                                _ => continue,
                            }
                        }
                    }
                }
            };
            match attempt {
                Ok(lease) => {
                    info!(node = %identity.node, instance = %identity.instance, "holding the node Lease");
                    return Ok(Self {
                        api,
                        current: to_value(&lease),
                        identity,
                    });
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(error(e)),
            }
        }
    }

    /// Renews one time. A conflict re-reads the Lease: if another process took it, that is
    /// [`LeaseError::Lost`]; if it was deleted, a fresh one is created (the apiserver answers
    /// the renewal of a deleted Lease with a conflict, its uid precondition failing).
    pub async fn renew(&mut self, telemetry: &Telemetry) -> Result<(), LeaseError> {
        let error = |source| LeaseError::Api {
            node: self.identity.node.clone(),
            source,
        };
        let mut next = self.current.clone();
        next["spec"]["renewTime"] = Value::String(micro_time(SystemTime::now()));
        telemetry.kube_request("lease_renew");
        match self
            .api
            .replace(
                &self.identity.node,
                &PostParams::default(),
                &to_lease(next).map_err(error)?,
            )
            .await
        {
            Ok(lease) => {
                self.current = to_value(&lease);
                Ok(())
            }
            Err(e) if is_conflict(&e) => {
                telemetry.kube_request("lease_get");
                let fresh = self
                    .api
                    .get_opt(&self.identity.node)
                    .await
                    .map_err(error)?
                    .map(|lease| to_value(&lease));
                match after_refusal(fresh.as_ref(), &self.identity.instance) {
                    Refusal::Lost { holder } => Err(LeaseError::Lost {
                        node: self.identity.node.clone(),
                        instance: holder,
                    }),
                    Refusal::Deleted => self.recreate(telemetry).await,
                    Refusal::StillOurs => {
                        self.current = fresh.unwrap_or_default();
                        Box::pin(self.renew(telemetry)).await
                    }
                }
            }
            Err(e) if matches!(&e, kube::Error::Api(status) if status.code == 404) => {
                self.recreate(telemetry).await
            }
            Err(e) => Err(error(e)),
        }
    }

    /// The Lease was deleted under us: hold a fresh one.
    async fn recreate(&mut self, telemetry: &Telemetry) -> Result<(), LeaseError> {
        let error = |source| LeaseError::Api {
            node: self.identity.node.clone(),
            source,
        };
        warn!(node = %self.identity.node, "the Lease was deleted; creating it again");
        telemetry.kube_request("lease_create");
        let lease = self
            .api
            .create(
                &PostParams::default(),
                &to_lease(held(&self.identity, None, SystemTime::now())).map_err(error)?,
            )
            .await
            .map_err(error)?;
        self.current = to_value(&lease);
        Ok(())
    }

    /// Renews every interval until cancelled. Transient failures are logged and retried; losing
    /// the Lease to another process ends the loop with an error.
    /// `node_uid` carries the Node's uid when it is registered again, so the Lease stays owned
    /// by the Node that exists (an owner that is gone would get the Lease garbage-collected).
    pub async fn keep_renewing(
        &mut self,
        telemetry: &Telemetry,
        stop: &CancellationToken,
        node_uid: &mut tokio::sync::watch::Receiver<String>,
    ) -> Result<(), LeaseError> {
        let mut ticks = tokio::time::interval(self.identity.renew_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            if node_uid.has_changed().unwrap_or(false) {
                self.identity.node_uid = node_uid.borrow_and_update().clone();
                // Replaced whole: the stored Lease may have lost its owner reference.
                self.current["metadata"]["ownerReferences"] = owner_references(&self.identity);
            }
            match self.renew(telemetry).await {
                Ok(()) => {
                    telemetry
                        .lease_renewals
                        .get_or_create(&ResultLabels {
                            result: "ok".into(),
                        })
                        .inc();
                }
                Err(lost @ LeaseError::Lost { .. }) => return Err(lost),
                Err(error) => {
                    telemetry
                        .lease_renewals
                        .get_or_create(&ResultLabels {
                            result: "error".into(),
                        })
                        .inc();
                    warn!(%error, "could not renew the node Lease; retrying at the next interval");
                }
            }
        }
    }

    /// Marks the Lease released (keeping it fresh) so a successor takes over without waiting.
    pub async fn release(mut self, telemetry: &Telemetry) {
        let mut next = self.current.clone();
        next["spec"]["renewTime"] = Value::String(micro_time(SystemTime::now()));
        next["metadata"]["annotations"][RELEASED_ANNOTATION] = Value::String("true".into());
        telemetry.kube_request("lease_release");
        let Ok(lease) = to_lease(next) else { return };
        match self
            .api
            .replace(&self.identity.node, &PostParams::default(), &lease)
            .await
        {
            Ok(lease) => {
                self.current = to_value(&lease);
                info!(node = %self.identity.node, "released the node Lease for a successor");
            }
            Err(error) => {
                warn!(%error, "could not release the node Lease; a successor waits for it to go stale");
            }
        }
    }
}

/// The API accesses of this module (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[crate::k8s::access::Access {
    scope: crate::k8s::access::Scope::NodeLeases,
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "update"],
    why: "hold and renew the node Lease",
}];

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(instance: &str) -> LeaseIdentity {
        LeaseIdentity {
            node: "vn-0".into(),
            node_uid: "uid-1".into(),
            instance: instance.into(),
            duration_seconds: 40,
            renew_interval: Duration::from_secs(10),
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    #[test]
    fn a_held_lease_names_the_node_and_the_process_and_is_owned_by_the_node() {
        let lease = held(&identity("a"), None, at(0));
        assert_eq!(lease["spec"]["holderIdentity"], "vn-0");
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(lease["metadata"]["annotations"][INSTANCE_ANNOTATION], "a");
        assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(lease["spec"]["leaseTransitions"], 0);
        let taken = held(&identity("b"), Some(&lease), at(5));
        assert_eq!(taken["spec"]["leaseTransitions"], 1);
    }

    #[test]
    fn a_refused_renewal_is_a_loss_a_deletion_or_a_retry() {
        let ours = held(&identity("a"), None, at(0));
        assert_eq!(after_refusal(None, "a"), Refusal::Deleted);
        assert_eq!(after_refusal(Some(&ours), "a"), Refusal::StillOurs);
        assert_eq!(
            after_refusal(Some(&ours), "b"),
            Refusal::Lost { holder: "a".into() }
        );
        let mut unnamed = ours;
        unnamed["metadata"]["annotations"] = json!({});
        assert_eq!(
            after_refusal(Some(&unnamed), "a"),
            Refusal::Lost {
                holder: String::new()
            },
            "a Lease without our annotation is not ours"
        );
    }

    #[test]
    fn assessing_other_holders() {
        let other = held(&identity("a"), None, at(0));
        match assess(&other, &identity("b"), at(3)) {
            Assessment::Observe {
                instance, deadline, ..
            } => {
                assert_eq!(instance, "a");
                assert_eq!(
                    deadline,
                    at(16),
                    "1.5 renew intervals and a second after its renewal"
                );
            }
            other => panic!("expected to observe, got {other:?}"),
        }
        assert_eq!(
            assess(&other, &identity("b"), at(41)),
            Assessment::TakeOver,
            "expired"
        );
        assert_eq!(
            assess(&other, &identity("a"), at(3)),
            Assessment::TakeOver,
            "ours"
        );
        let mut released = other;
        released["metadata"]["annotations"][RELEASED_ANNOTATION] = json!("true");
        assert_eq!(
            assess(&released, &identity("b"), at(3)),
            Assessment::TakeOver,
            "released"
        );
    }
}
