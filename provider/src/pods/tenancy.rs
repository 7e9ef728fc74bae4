//! The namespace scope and the annotation policy at runtime: keeps what
//! [`vne_core::tenancy::judge`] needs current — the policy ConfigMap (one watch of that one
//! object) and the namespaces' labels (a kube-runtime reflector), each only when configured —
//! and asks it. Every change bumps a counter the pod controller waits on to judge held pods
//! again. The decisions, the policy's format and the refusal reasons are vne-core's.

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use vne_core::tenancy::{AnnotationPolicy, Asked, Clearance, Labels, Policy, Written};

/// Why the feed stopped.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// A watch stream ended, which kube-runtime's watchers never do while the client lives.
    #[error("the {0} watch ended")]
    Ended(&'static str),
}

/// What the administrator configured.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The namespace scope (`None`: every namespace).
    pub scope: Option<Written>,
    /// The policy ConfigMap, `(namespace, name)` (`None`: no policy).
    pub policy: Option<(String, String)>,
}

/// The namespaces' labels: the reflector's store, and its writer until the watch takes it.
struct NamespaceLabels {
    store: Store<Namespace>,
    writer: parking_lot::Mutex<Option<reflector::store::Writer<Namespace>>>,
}

/// The current policy and namespace labels. Cheap to clone.
#[derive(Clone)]
pub struct PolicyFeed {
    settings: Arc<Settings>,
    policy: Arc<RwLock<Policy>>,
    namespaces: Option<Arc<NamespaceLabels>>,
    changes: watch::Sender<u64>,
}

impl std::fmt::Debug for PolicyFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyFeed")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl PolicyFeed {
    /// A feed for `settings`; nothing is watched until [`PolicyFeed::run`].
    pub fn new(settings: Settings) -> Self {
        let policy = if settings.policy.is_some() {
            Policy::Loading
        } else {
            Policy::Unrestricted
        };
        // Labels are needed only to judge a scope or a policy.
        let namespaces = (settings.scope.is_some() || settings.policy.is_some()).then(|| {
            let (store, writer) = reflector::store::<Namespace>();
            Arc::new(NamespaceLabels {
                store,
                writer: parking_lot::Mutex::new(Some(writer)),
            })
        });
        Self {
            settings: Arc::new(settings),
            policy: Arc::new(RwLock::new(policy)),
            namespaces,
            changes: watch::Sender::new(0),
        }
    }

    /// A receiver that sees every change of the policy or of a namespace's labels.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The verdict on a pod of `namespace` asking for `asked`, as of now.
    pub fn judge(&self, asked: &Asked<'_>, namespace: &str) -> Clearance {
        let policy = self.policy.read().clone();
        let found = self.namespaces.as_ref().and_then(|labels| {
            // Until the first listing, a missing namespace means "not listed yet".
            labels.store.wait_until_ready().now_or_never()?.ok()?;
            labels.store.get(&ObjectRef::new(namespace))
        });
        let empty = BTreeMap::new();
        let labels = match &found {
            Some(ns) => Labels::Known(ns.metadata.labels.as_ref().unwrap_or(&empty)),
            None => Labels::Unknown,
        };
        vne_core::tenancy::judge(
            asked,
            namespace,
            labels,
            self.settings.scope.as_ref(),
            &policy,
        )
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn set_policy(&self, policy: Policy) {
        let mut current = self.policy.write();
        if *current != policy {
            *current = policy;
            drop(current);
            self.changed();
        }
    }

    /// Runs the watches configured, until `stop`.
    pub async fn run(self, client: kube::Client, stop: CancellationToken) -> Result<(), FeedError> {
        let labels = self.clone().watch_namespaces(client.clone(), stop.clone());
        let policy = self.watch_policy(client, stop);
        tokio::try_join!(labels, policy)?;
        Ok(())
    }

    async fn watch_namespaces(
        self,
        client: kube::Client,
        stop: CancellationToken,
    ) -> Result<(), FeedError> {
        let Some(writer) = self
            .namespaces
            .as_ref()
            .and_then(|labels| labels.writer.lock().take())
        else {
            return Ok(());
        };
        let api: Api<Namespace> = Api::all(client);
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let mut events = reflector::reflector(writer, stream).boxed();
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                event = events.next() => event,
            };
            match event {
                None => return Err(FeedError::Ended("namespace")),
                Some(Err(error)) => warn!(%error, "namespace watch error; it recovers by itself"),
                Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
                Some(Ok(_)) => self.changed(),
            }
        }
    }

    async fn watch_policy(
        self,
        client: kube::Client,
        stop: CancellationToken,
    ) -> Result<(), FeedError> {
        let Some((namespace, name)) = self.settings.policy.clone() else {
            return Ok(());
        };
        let source = format!("{namespace}/{name}");
        let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut listed: Option<ConfigMap> = None;
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                event = events.next() => event,
            };
            let current = match event {
                None => return Err(FeedError::Ended("annotation policy")),
                Some(Err(error)) => {
                    warn!(%error, "annotation policy watch error; it recovers by itself");
                    continue;
                }
                Some(Ok(watcher::Event::Init)) => {
                    listed = None;
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(cm))) => {
                    listed = Some(cm);
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => listed.take(),
                Some(Ok(watcher::Event::Apply(cm))) => Some(cm),
                Some(Ok(watcher::Event::Delete(_))) => None,
            };
            let policy = read_policy(&source, current.as_ref());
            match &policy {
                Policy::Unavailable { why, .. } => {
                    warn!(policy = %source, %why, "the annotation policy cannot be used; pods bound here wait");
                }
                _ => info!(policy = %source, "annotation policy loaded"),
            }
            self.set_policy(policy);
        }
    }
}

/// The policy a (possibly missing) ConfigMap holds.
fn read_policy(source: &str, found: Option<&ConfigMap>) -> Policy {
    let unavailable = |why: String| Policy::Unavailable {
        source: source.to_owned(),
        why,
    };
    let Some(found) = found else {
        return unavailable("it does not exist".into());
    };
    match AnnotationPolicy::from_data(&found.data.clone().unwrap_or_default()) {
        Ok(policy) => Policy::Loaded {
            source: source.to_owned(),
            policy,
        },
        Err(error) => unavailable(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_invalid_configmap_makes_the_policy_unavailable() {
        let source = "kube-system/p";
        assert!(
            matches!(read_policy(source, None), Policy::Unavailable { why, .. } if why.contains("does not exist"))
        );
        let mut cm = ConfigMap {
            data: Some(BTreeMap::from([("eci-vswitch".into(), String::new())])),
            ..ConfigMap::default()
        };
        assert!(
            matches!(read_policy(source, Some(&cm)), Policy::Unavailable { why, .. } if why.contains("eci-vswitch"))
        );
        cm.data = Some(BTreeMap::from([("eci-vswitch".into(), "trusted".into())]));
        assert!(matches!(
            read_policy(source, Some(&cm)),
            Policy::Loaded { .. }
        ));
        cm.data = None;
        assert!(
            matches!(read_policy(source, Some(&cm)), Policy::Loaded { .. }),
            "an empty policy restricts nothing"
        );
    }
}
