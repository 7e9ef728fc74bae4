//! The node Lease (`kube-node-lease/<node>`): claimed at start, renewed on a timer, released
//! on a clean shutdown so a successor takes over at once.
//!
//! `holderIdentity` is the node name, as for kubelets. Which *process* holds it is recorded in
//! an annotation, so a second process for the same node can tell a live holder (it renews:
//! refuse to start) from a crashed one (it stopped renewing: take over) and from a cleanly
//! stopped one (released: take over at once). The Lease itself is held through
//! [`crate::k8s::election`], the one Lease helper.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::NodeMetrics;
use crate::k8s::election::{Candidate, Claim, LeaseLock, Renewal, Request, SecondLook};
pub use crate::k8s::election::{
    INSTANCE_ANNOTATION, RELEASED_ANNOTATION, RENEW_INTERVAL_ANNOTATION,
};
use crate::ops::chain::Chain;
use crate::ops::metrics::{MetricSet as _, ResultLabels, Telemetry};

/// Namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

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
    #[error("Lease {LEASE_NAMESPACE}/{node}")]
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

/// The Lease is owned by the Node it describes (deleted with it).
fn owner(identity: &LeaseIdentity) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: identity.node.clone(),
        uid: identity.node_uid.clone(),
        ..OwnerReference::default()
    }
}

impl LeaseIdentity {
    /// The node Lease's candidate: the node name as holder identity, this process as instance.
    fn candidate(&self) -> Candidate {
        Candidate {
            holder: self.node.clone(),
            instance: Some(self.instance.clone()),
            duration: Duration::from_secs(u64::try_from(self.duration_seconds).unwrap_or(0)),
            renew_interval: self.renew_interval,
            owner: Some(owner(self)),
        }
    }
}

/// The metric name of a request.
fn operation(request: Request) -> &'static str {
    match request {
        Request::Get => "lease_get",
        Request::Create => "lease_create",
        Request::TakeOver => "lease_take_over",
        Request::Renew => "lease_renew",
        Request::Release => "lease_release",
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// A held Lease.
#[derive(Debug)]
pub struct NodeLease {
    lock: LeaseLock,
    identity: LeaseIdentity,
    current: Lease,
}

impl NodeLease {
    /// Claims the Lease: creates it, takes over a released, expired or dead holder's, or
    /// refuses when a live process holds it.
    pub async fn acquire(
        client: kube::Client,
        identity: LeaseIdentity,
        telemetry: &Telemetry,
    ) -> Result<Self, LeaseError> {
        let lock = LeaseLock::new(
            client,
            LEASE_NAMESPACE,
            &identity.node,
            identity.candidate(),
        );
        Self::acquire_with(lock, identity, telemetry).await
    }

    async fn acquire_with(
        lock: LeaseLock,
        identity: LeaseIdentity,
        telemetry: &Telemetry,
    ) -> Result<Self, LeaseError> {
        let error = |source| LeaseError::Api {
            node: identity.node.clone(),
            source,
        };
        let count = |request| telemetry.kube_request(operation(request));
        loop {
            let existing = lock.observe(&count).await.map_err(error)?;
            let attempt = match existing {
                None => lock.take(None, &count).await,
                Some(existing) => {
                    match crate::k8s::election::judge(&existing, &lock.candidate, lock.now()) {
                        Claim::Ours | Claim::Free => lock.take(Some(&existing), &count).await,
                        Claim::Held(first) => {
                            let instance = first.holder.instance.clone().unwrap_or_default();
                            info!(node = %identity.node, holder = %instance, renewed = %crate::k8s::rfc3339_micros(first.renewed), "the Lease is held by another process; waiting to see whether it is alive");
                            let wait = first
                                .silent_after
                                .duration_since(lock.now())
                                .unwrap_or_default();
                            tokio::time::sleep(wait).await;
                            let again = lock.observe(&count).await.map_err(error)?;
                            match crate::k8s::election::second_look(&first, again.as_ref()) {
                                SecondLook::Renewed { at } => {
                                    return Err(LeaseError::HeldByLiveProcess {
                                        node: identity.node.clone(),
                                        instance,
                                        renewed: crate::k8s::rfc3339_micros(at),
                                    });
                                }
                                // Still the silent holder (or it released): it is gone.
                                SecondLook::Silent => lock.take(again.as_ref(), &count).await,
                                // Deleted, or claimed by yet another process: start over.
                                SecondLook::Changed => continue,
                            }
                        }
                    }
                }
            };
            match attempt {
                Ok(lease) => {
                    info!(node = %identity.node, instance = %identity.instance, "holding the node Lease");
                    return Ok(Self {
                        lock,
                        current: lease,
                        identity,
                    });
                }
                // Someone else wrote between our read and our write: judge again.
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(error(e)),
            }
        }
    }

    /// Renews one time. A conflict re-reads the Lease: if another process took it, that is
    /// [`LeaseError::Lost`]; if it was deleted, a fresh one is created (the apiserver answers
    /// the renewal of a deleted Lease with a conflict, its uid precondition failing); if
    /// someone else only changed it, what is stored is renewed.
    pub async fn renew(&mut self, telemetry: &Telemetry) -> Result<(), LeaseError> {
        let count = |request| telemetry.kube_request(operation(request));
        let renewal = self
            .lock
            .renew(&self.current, &count)
            .await
            .map_err(|source| LeaseError::Api {
                node: self.identity.node.clone(),
                source,
            })?;
        match renewal {
            Renewal::Renewed(lease) => {
                self.current = lease;
                Ok(())
            }
            Renewal::Changed(fresh) => {
                self.current = fresh;
                Box::pin(self.renew(telemetry)).await
            }
            Renewal::Lost(holder) => Err(LeaseError::Lost {
                node: self.identity.node.clone(),
                instance: holder.instance.unwrap_or_default(),
            }),
            Renewal::Deleted => self.recreate(telemetry).await,
        }
    }

    /// The Lease was deleted under us: hold a fresh one.
    async fn recreate(&mut self, telemetry: &Telemetry) -> Result<(), LeaseError> {
        warn!(node = %self.identity.node, "the Lease was deleted; creating it again");
        let count = |request| telemetry.kube_request(operation(request));
        self.current = self
            .lock
            .take(None, &count)
            .await
            .map_err(|source| LeaseError::Api {
                node: self.identity.node.clone(),
                source,
            })?;
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
        let metrics = NodeMetrics::of(telemetry);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            if node_uid.has_changed().unwrap_or(false) {
                self.identity.node_uid = node_uid.borrow_and_update().clone();
                // Written with the next renewal: the stored Lease may have lost its owner.
                self.lock.candidate.owner = Some(owner(&self.identity));
            }
            match self.renew(telemetry).await {
                Ok(()) => {
                    metrics
                        .lease_renewals
                        .get_or_create(&ResultLabels {
                            result: "ok".into(),
                        })
                        .inc();
                }
                Err(lost @ LeaseError::Lost { .. }) => return Err(lost),
                Err(error) => {
                    metrics
                        .lease_renewals
                        .get_or_create(&ResultLabels {
                            result: "error".into(),
                        })
                        .inc();
                    warn!(error = %Chain(&error), "could not renew the node Lease; retrying at the next interval");
                }
            }
        }
    }

    /// Marks the Lease released (keeping it fresh) so a successor takes over without waiting.
    pub async fn release(mut self, telemetry: &Telemetry) {
        let count = |request| telemetry.kube_request(operation(request));
        match self.lock.release(&self.current, &count).await {
            Ok(lease) => {
                self.current = lease;
                info!(node = %self.identity.node, "released the node Lease for a successor");
            }
            Err(error) => {
                warn!(error = %Chain(&error), "could not release the node Lease; a successor waits for it to go stale");
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
mod tests;
