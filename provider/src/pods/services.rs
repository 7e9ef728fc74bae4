//! The Services pods see in their environment, as a kubelet's informer holds them: one watch
//! of every Service in the cluster feeding a kube-runtime reflector, so translating a pod never
//! lists Services. Each Service is kept stripped to what the variables are made of (name,
//! namespace, cluster IP, ports): at thousands of Services the rest (managed fields,
//! annotations, status) would be most of the memory.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use vne_core::service_env::{APISERVER_NAMESPACE, APISERVER_SERVICE};

/// Why the Service cache stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServiceCacheError {
    /// `run` was called a second time: one cache has one watch.
    #[error("the Service cache is already being fed")]
    AlreadyRunning,
    /// The watch stream ended, which a kube-runtime watcher never does on its own.
    #[error("the Service watch ended")]
    WatchEnded,
}

/// The cache: cheap to clone, read from any task.
#[derive(Clone)]
pub struct ServiceCache {
    store: Store<Service>,
    /// The store's writer until `run` takes it.
    feed: Arc<Mutex<Option<reflector::store::Writer<Service>>>>,
}

impl std::fmt::Debug for ServiceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceCache")
            .field("services", &self.store.len())
            .finish_non_exhaustive()
    }
}

impl Default for ServiceCache {
    fn default() -> Self {
        Self::new()
    }
}

/// What of a Service the variables need.
fn strip(service: &mut Service) {
    let ObjectMeta {
        name,
        namespace,
        resource_version,
        uid,
        ..
    } = std::mem::take(&mut service.metadata);
    service.metadata = ObjectMeta {
        name,
        namespace,
        resource_version,
        uid,
        ..ObjectMeta::default()
    };
    service.status = None;
    service.spec = service.spec.take().map(|spec| ServiceSpec {
        cluster_ip: spec.cluster_ip,
        ports: spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|port| ServicePort {
                    name: port.name,
                    port: port.port,
                    protocol: port.protocol,
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    });
}

impl ServiceCache {
    /// An empty cache; [`Self::run`] fills it.
    pub fn new() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            feed: Arc::new(Mutex::new(Some(writer))),
        }
    }

    /// Watches every Service until `stop`, keeping the cache current (a broken watch relists
    /// by itself, with back-off).
    pub async fn run(
        &self,
        client: kube::Client,
        stop: CancellationToken,
    ) -> Result<(), ServiceCacheError> {
        let writer = self
            .feed
            .lock()
            .take()
            .ok_or(ServiceCacheError::AlreadyRunning)?;
        let api: Api<Service> = Api::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(strip);
        let mut events = reflector::reflector(writer, stream).boxed();
        let mut listed = false;
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                event = events.next() => event,
            };
            match event {
                None => return Err(ServiceCacheError::WatchEnded),
                Some(Err(error)) => {
                    warn!(%error, "Service watch error; it recovers by itself");
                }
                Some(Ok(watcher::Event::InitDone)) if !listed => {
                    listed = true;
                    info!(
                        services = self.store.len(),
                        "Service cache filled (service links for ECI pods)"
                    );
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Waits until the first listing is in, at most `within`; whether it is.
    pub async fn ready(&self, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.store.wait_until_ready()).await,
            Ok(Ok(()))
        )
    }

    /// The apiserver's Service, `default/kubernetes`, when it exists.
    pub fn apiserver(&self) -> Option<Arc<Service>> {
        self.store
            .get(&ObjectRef::new(APISERVER_SERVICE).within(APISERVER_NAMESPACE))
    }

    /// The Services of one namespace.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<Service>> {
        self.store
            .state_filter(|service| service.metadata.namespace.as_deref() == Some(namespace))
    }
}

/// The API accesses of the Service cache (see [`crate::k8s::access`]).
pub const KUBE_API: &[crate::k8s::access::Access] = &[crate::k8s::access::Access {
    scope: crate::k8s::access::Scope::Cluster,
    group: "",
    resource: "services",
    verbs: &["list", "watch"],
    why: "the Service environment of ECI pods (KUBERNETES_SERVICE_HOST, service links), from one watch",
}];

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn services_are_kept_stripped_to_what_the_variables_need() {
        let mut service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "7",
                "labels": {"app": "web"}, "annotations": {"big": "x".repeat(4096)},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"], "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            "status": {"loadBalancer": {}},
        }))
        .unwrap();
        strip(&mut service);
        assert_eq!(
            serde_json::to_value(&service).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "7"},
                "spec": {"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            })
        );
        let vars = vne_core::service_env::from_services([&service]);
        assert_eq!(vars[0], ("WEB_SERVICE_HOST".into(), "10.96.0.20".into()));
    }
}
