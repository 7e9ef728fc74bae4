//! The task tree: connect, register, hold the Lease, run every area — until the stop signal,
//! or until a critical task dies (then the process exits non-zero rather than limp on). Owns
//! the shutdown order: stop intake (pods, webhook, collectors, ops), let in-flight ECI calls
//! finish within a deadline, and only then release the Lease. May call every area.

pub mod logging;
pub mod rbac;
pub mod signals;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admission;
use crate::config::{Settings, TransportPolicy};
use crate::eci as backend;
use crate::fleet::drain::{Decommission, DrainEnd};
use crate::fleet::membership::{Membership, StopKind};
use crate::fleet::orphans::OrphanCollector;
use crate::fleet::replicas;
use crate::imagecache::reconciler::ImageCacheReconciler;
use crate::k8s::shared_watch::{ClusterWatches, SharedWatch, bound_to};
use crate::kubelet;
use crate::node::guard as node_watch;
use crate::node::lease::{LeaseIdentity, NodeLease};
use crate::node::registration;
use crate::node::status as node_status;
use crate::ops::metrics::Telemetry;
use crate::ops::server::{self as ops, Readiness};
use crate::ops::supervisor::Supervisor;
use crate::placement::Placement;
use crate::pods::PodController;

/// How long the areas get to finish in-flight work (ECI calls, status writes) after the stop
/// signal, before the Lease is released regardless.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long releasing the Lease may take once the areas stopped.
const LEASE_RELEASE_GRACE: Duration = Duration::from_secs(5);

/// How long the start waits for the fleet's first count of live replicas before pacing as if
/// alone (the count keeps following the fleet afterwards).
const REPLICA_COUNT_WAIT: Duration = Duration::from_secs(10);

/// Waits until the live replicas are first counted, so a replica started with nine others
/// does not spend the whole account's burst before it knows of them.
async fn wait_for_replica_count(mut count: watch::Receiver<u32>) {
    match tokio::time::timeout(REPLICA_COUNT_WAIT, count.wait_for(|n| *n > 0)).await {
        Ok(Ok(n)) => info!(replicas = *n, "ECI quotas shared among the live replicas"),
        Ok(Err(_)) | Err(_) => warn!(
            "the live replicas could not be counted yet; pacing ECI calls as the only replica until they are"
        ),
    }
}

/// Runs the daemon until `shutdown` completes (Ok) or a critical task fails (Err).
pub async fn run(settings: Settings, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    if settings.site.transport == TransportPolicy::PlaintextAllowed {
        // Said at every start, so a forgotten flag in a real deployment shows in its logs.
        warn!(
            backend = ?settings.site.backend,
            "--eci-allow-insecure-endpoint (ECI_ALLOW_INSECURE_ENDPOINT) is set: ECI requests, the pods' Secret values and exec streams may travel unencrypted; use it only with a local mock-eci"
        );
    }
    let telemetry = Arc::new(telemetry::every_metric());
    let readiness = Arc::new(Readiness::default());
    let listeners = Listeners::bind(&settings).await?;
    let clients = Clients::connect().await?;
    // ECI's quotas are the account's: each replica paces itself to 1/N of them, N the live
    // replicas (0 until the fleet's count is first known, paced as 1 meanwhile).
    let (replica_sender, replica_count) = watch::channel(0_u32);
    let eci = connect_eci(&settings, replica_count.clone(), &telemetry).await?;
    let joined = join(&settings, &clients.main, &telemetry).await?;
    readiness.serving.store(true, Ordering::SeqCst);
    info!(node = %settings.site.node_name, backend = ?settings.site.backend, "virtual-node-eci is serving its node");

    // Two stops: the areas' ends intake and work in every area; the Lease's comes after they
    // finished, so the node is held (and its pods not handed to a successor) until then.
    let mut lease_task = spawn_lease(joined.lease, joined.node_uid.1.clone(), &telemetry);
    let mut tasks = Supervisor::new(&CancellationToken::new());
    {
        let (client, region) = (clients.main.clone(), settings.site.region.clone());
        let (telemetry, stop) = (Arc::clone(&telemetry), tasks.stop().clone());
        tasks.spawn_critical("replica count", async move {
            replicas::run(client, region, replica_sender, telemetry, stop).await
        });
    }
    wait_for_replica_count(replica_count.clone()).await;
    let areas = Areas {
        settings: &settings,
        client: &clients.main,
        backend: &eci.backend,
        telemetry: &telemetry,
        replica_count,
        node_uid: joined.node_uid,
    };
    areas.spawn(&mut tasks, eci.image_caches);
    spawn_listeners(&mut tasks, listeners, &telemetry, &readiness);

    let stopping = Stopping {
        settings: &settings,
        membership: &joined.membership,
        drain_client: clients.drain,
        telemetry: &telemetry,
    };
    let (outcome, decommission) = stopping.wait(shutdown, &mut tasks, &mut lease_task).await;
    if let Err(failure) = &outcome {
        error!(error = %format!("{failure:#}"), "stopping");
    }
    readiness.serving.store(false, Ordering::SeqCst);
    // Tasks that do not stop in time are named in the log and aborted, their in-flight work
    // abandoned.
    tasks.shutdown(STOP_GRACE).await;
    // Only now may a successor take the node over.
    if !lease_task.shutdown(LEASE_RELEASE_GRACE).await {
        warn!(grace = ?LEASE_RELEASE_GRACE, "the Lease was not released in time; a successor waits for it to expire");
    }
    let outcome = match (outcome, decommission) {
        (Ok(()), Some(drain)) => drain.remove_node().await.map_err(anyhow::Error::from),
        (outcome, _) => outcome,
    };
    eci.guard.stop().await;
    outcome
}

/// The probe and read-only ports, bound before anything else so a taken port fails the start.
struct Listeners {
    health: Option<tokio::net::TcpListener>,
    ops: Option<tokio::net::TcpListener>,
}

impl Listeners {
    async fn bind(settings: &Settings) -> anyhow::Result<Self> {
        let health = match settings.config.ops.health_addr {
            Some(address) => {
                let listener = tokio::net::TcpListener::bind(address).await.with_context(|| {
                    format!("--health-addr (HEALTH_ADDR): cannot listen on {address}; choose a free port")
                })?;
                info!(address = %listener.local_addr()?, "serving the probes, /healthz and /readyz");
                Some(listener)
            }
            None => None,
        };
        let ops = match settings.config.ops.metrics_addr {
            Some(address) => {
                let listener = tokio::net::TcpListener::bind(address).await.with_context(|| {
                    format!("--metrics-addr (METRICS_ADDR): cannot listen on {address}; choose a free port")
                })?;
                info!(address = %listener.local_addr()?, "serving /healthz, /readyz and /metrics on the read-only port (METRICS_ADDR)");
                Some(listener)
            }
            None => None,
        };
        Ok(Self { health, ops })
    }
}

fn spawn_listeners(
    tasks: &mut Supervisor,
    listeners: Listeners,
    telemetry: &Arc<Telemetry>,
    readiness: &Arc<Readiness>,
) {
    if let Some(listener) = listeners.ops {
        let router = ops::router(Arc::clone(telemetry), Arc::clone(readiness));
        let stop = tasks.stop().clone();
        tasks.spawn_critical("read-only port", async move {
            ops::serve(listener, router, stop).await;
            Ok(())
        });
    }
    if let Some(listener) = listeners.health {
        let router = ops::probes(Arc::clone(readiness));
        let stop = tasks.stop().clone();
        tasks.spawn_critical("probes", async move {
            ops::serve(listener, router, stop).await;
            Ok(())
        });
    }
}

/// The Kubernetes clients.
struct Clients {
    main: kube::Client,
    /// Without the client's own retries: evictions refused by a disruption budget (429) must
    /// reach the drain loop at once, not be retried inside the client for minutes.
    drain: kube::Client,
}

impl Clients {
    async fn connect() -> anyhow::Result<Self> {
        let kube_config = kube::Config::infer()
            .await
            .context("cannot reach the Kubernetes API: no in-cluster configuration and no usable kubeconfig (set KUBECONFIG)")?;
        let mut no_retry = kube_config.clone();
        no_retry.default_retry = false;
        Ok(Self {
            drain: kube::Client::try_from(no_retry).context("cannot build a Kubernetes client")?,
            main: kube::Client::try_from(kube_config)
                .context("cannot build a Kubernetes client")?,
        })
    }
}

/// The ECI edge as the areas use it.
struct Eci {
    backend: backend::Backend,
    image_caches: backend::ImageCaches,
    guard: backend::BackendGuard,
}

async fn connect_eci(
    settings: &Settings,
    replica_count: watch::Receiver<u32>,
    telemetry: &Arc<Telemetry>,
) -> anyhow::Result<Eci> {
    let eci_config = settings.with_site(&settings.config.eci);
    let paced = eci_config.args.client_rate_limits();
    let pacer = paced.then(|| Arc::new(backend::Pacer::new(replica_count)));
    let (backend, image_caches, guard) = backend::connect(&eci_config, pacer.clone()).await?;
    let backend: backend::Backend =
        Arc::new(backend::Paced::new(backend, pacer, Arc::clone(telemetry)));
    // Only the elected replica reconciles image caches, so it has their actions' whole quota.
    let elected_alone = paced.then(|| Arc::new(backend::Pacer::new(crate::eci::alone())));
    let image_caches: backend::ImageCaches = Arc::new(backend::Paced::new(
        image_caches,
        elected_alone,
        Arc::clone(telemetry),
    ));
    Ok(Eci {
        backend,
        image_caches,
        guard,
    })
}

/// The node this replica serves: registered, its Lease held, the fleet it belongs to known.
struct Joined {
    lease: NodeLease,
    /// The Node's uid as the node watch follows it (a Node deleted and registered again).
    node_uid: (watch::Sender<String>, watch::Receiver<String>),
    membership: Membership,
}

async fn join(
    settings: &Settings,
    client: &kube::Client,
    telemetry: &Arc<Telemetry>,
) -> anyhow::Result<Joined> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = registration::register(
        &nodes,
        &settings.with_site(&settings.config.node),
        telemetry,
    )
    .await?;
    let identity = LeaseIdentity {
        node: settings.site.node_name.clone(),
        node_uid: node.metadata.uid.clone().unwrap_or_default(),
        instance: uuid::Uuid::new_v4().to_string(),
        duration_seconds: settings.config.node.lease_duration_seconds,
        renew_interval: settings.config.node.lease_renew_interval,
    };
    let node_uid = watch::channel(identity.node_uid.clone());
    let lease = NodeLease::acquire(client.clone(), identity, telemetry).await?;
    let membership =
        Membership::discover(client.clone(), &settings.with_site(&settings.config.fleet)).await;
    Ok(Joined {
        lease,
        node_uid,
        membership,
    })
}

/// The Lease's renewal, in a supervisor of its own: it stops after every other task.
fn spawn_lease(
    mut lease: NodeLease,
    mut node_uid: watch::Receiver<String>,
    telemetry: &Arc<Telemetry>,
) -> Supervisor {
    let mut lease_task = Supervisor::new(&CancellationToken::new());
    let (telemetry, stop) = (Arc::clone(telemetry), lease_task.stop().clone());
    lease_task.spawn_critical("lease renewal", async move {
        let result = lease.keep_renewing(&telemetry, &stop, &mut node_uid).await;
        if result.is_ok() {
            lease.release(&telemetry).await;
        }
        result.map_err(anyhow::Error::from)
    });
    lease_task
}

/// What every area is started with.
struct Areas<'a> {
    settings: &'a Settings,
    client: &'a kube::Client,
    backend: &'a backend::Backend,
    telemetry: &'a Arc<Telemetry>,
    replica_count: watch::Receiver<u32>,
    node_uid: (watch::Sender<String>, watch::Receiver<String>),
}

impl Areas<'_> {
    /// Starts every area under `tasks`.
    fn spawn(self, tasks: &mut Supervisor, image_caches: backend::ImageCaches) {
        let stop = tasks.stop().clone();
        // One watch of this node's pods, read by the pod controller and the kubelet API's metrics.
        let node_pods = SharedWatch::<Pod>::new("this node's pod");
        {
            let (watch, client, stop) = (Arc::clone(&node_pods), self.client.clone(), stop.clone());
            let this_node = bound_to(&self.settings.site.node_name);
            tasks.spawn_critical("this node's pod watch", async move {
                watch
                    .run(Api::all(client), this_node, stop)
                    .await
                    .map_err(anyhow::Error::from)
            });
        }
        let controller = PodController::new(
            self.settings.with_site(&self.settings.config.pods),
            self.client.clone(),
            Arc::clone(self.backend),
            Arc::clone(self.telemetry),
            Arc::clone(&node_pods),
            self.replica_count.clone(),
        );
        let groups = controller.groups();
        let misconfig = controller.misconfig_monitor();
        {
            let stop = stop.clone();
            tasks.spawn_critical("pod controller", async move { controller.run(stop).await });
        }
        self.spawn_node(tasks, misconfig);
        self.spawn_placement_and_admission(tasks);
        self.spawn_fleet_and_caches(tasks, image_caches);
        // The kubelet API (logs, exec, metrics of this node's pods), at the address the Node
        // advertises; it stops with the other areas.
        let settings = self.settings;
        let (config, client) = (
            settings.with_site(&settings.config.kubelet),
            self.client.clone(),
        );
        let (backend, telemetry) = (Arc::clone(self.backend), Arc::clone(self.telemetry));
        tasks.spawn_critical("kubelet API", async move {
            kubelet::run(config, client, backend, groups, node_pods, telemetry, stop)
                .await
                .map_err(anyhow::Error::from)
        });
    }

    fn spawn_node(&self, tasks: &mut Supervisor, misconfig: Arc<crate::eci::misconfig::Monitor>) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node_config = self.settings.with_site(&self.settings.config.node);
        {
            let (config, telemetry) = (node_config.clone(), Arc::clone(self.telemetry));
            let (nodes, backend) = (nodes.clone(), Arc::clone(self.backend));
            let (uid, stop) = (self.node_uid.1.clone(), tasks.stop().clone());
            tasks.spawn_critical("node status", async move {
                node_status::run(nodes, backend, config, telemetry, misconfig, uid, stop)
                    .await
                    .map_err(anyhow::Error::from)
            });
        }
        let (client, telemetry) = (self.client.clone(), Arc::clone(self.telemetry));
        let (uid, stop) = (self.node_uid.0.clone(), tasks.stop().clone());
        tasks.spawn_critical("node watch", async move {
            node_watch::run(nodes, client, node_config, telemetry, uid, stop).await
        });
    }

    fn spawn_placement_and_admission(&self, tasks: &mut Supervisor) {
        let stop = tasks.stop().clone();
        // ResourcePolicy placement: the webhook reads its index, so it is built first.
        let settings = self.settings;
        let placement = settings
            .config
            .placement
            .placement_enabled
            .then(|| Placement::new(settings.with_site(&settings.config.placement)));
        let placement_shared = placement.as_ref().map(Placement::shared);
        // One cluster-wide pod watch and one node watch per replica, read by placement and the
        // admission capacity view alike; each starts with its first reader.
        let watches = ClusterWatches::default();
        {
            let (watches, client, stop) = (watches.clone(), self.client.clone(), stop.clone());
            tasks.spawn_critical("shared pod and node watches", async move {
                watches.run(client, stop).await.map_err(anyhow::Error::from)
            });
        }
        if let Some(placement) = placement {
            let (client, telemetry, stop) = (
                self.client.clone(),
                Arc::clone(self.telemetry),
                stop.clone(),
            );
            let watches = watches.clone();
            tasks.spawn_critical("ResourcePolicy placement", async move {
                placement.run(client, &watches, telemetry, stop).await
            });
        }
        if settings.config.admission.webhook_enabled {
            let (client, config) = (
                self.client.clone(),
                settings.with_site(&settings.config.admission),
            );
            let telemetry = Arc::clone(self.telemetry);
            tasks.spawn_critical("Selector webhook", async move {
                admission::run(client, config, placement_shared, watches, telemetry, stop).await
            });
        }
    }

    fn spawn_fleet_and_caches(&self, tasks: &mut Supervisor, image_caches: backend::ImageCaches) {
        let collector = OrphanCollector::new(
            self.client.clone(),
            Arc::clone(self.backend),
            self.settings.with_site(&self.settings.config.fleet),
            Arc::clone(self.telemetry),
        );
        let stop = tasks.stop().clone();
        tasks.spawn_critical("orphan collector", async move { collector.run(stop).await });
        // ImageCaches, reconciled by the replica elected for them (a missing CRD is retried).
        let reconciler = ImageCacheReconciler::new(
            Arc::clone(&self.settings.site),
            self.client.clone(),
            image_caches,
            Arc::clone(self.telemetry),
        );
        let stop = tasks.stop().clone();
        tasks.spawn_critical("ImageCache reconciler", async move {
            reconciler.run(stop).await
        });
    }
}

/// What the stop is decided with.
struct Stopping<'a> {
    settings: &'a Settings,
    membership: &'a Membership,
    drain_client: kube::Client,
    telemetry: &'a Arc<Telemetry>,
}

impl Stopping<'_> {
    /// Until `shutdown` or a critical task's failure: a restart leaves the node to the
    /// successor; a decommission drains it first (the drain to finish once the tasks stopped).
    async fn wait(
        self,
        shutdown: impl Future<Output = ()>,
        tasks: &mut Supervisor,
        lease_task: &mut Supervisor,
    ) -> (anyhow::Result<()>, Option<Decommission>) {
        tokio::select! {
            () = shutdown => match self.membership.classify().await {
                StopKind::Restart { why } => {
                    info!(%why, "stop signal received: a restart; leaving the node, its pods and their groups to the successor");
                    (Ok(()), None)
                }
                StopKind::Decommission { why } => {
                    info!(%why, "stop signal received: decommissioning this node");
                    self.decommission(&why, tasks, lease_task).await
                }
            },
            failure = tasks.failure() => (Err(failure.into()), None),
            failure = lease_task.failure() => (Err(failure.into()), None),
        }
    }

    async fn decommission(
        self,
        why: &str,
        tasks: &mut Supervisor,
        lease_task: &mut Supervisor,
    ) -> (anyhow::Result<()>, Option<Decommission>) {
        let drain = Decommission::new(
            self.drain_client,
            self.settings.with_site(&self.settings.config.fleet),
            Arc::clone(self.telemetry),
        );
        // The pod lifecycle keeps running meanwhile: evicted pods leave ECI gracefully.
        let drained = tokio::select! {
            drained = drain.drain(why) => drained,
            failure = tasks.failure() => return (Err(failure.into()), None),
            failure = lease_task.failure() => return (Err(failure.into()), None),
        };
        match drained {
            Ok(DrainEnd::Drained) => (Ok(()), Some(drain)),
            Ok(DrainEnd::TimedOut { left }) => (
                Err(anyhow::anyhow!(
                    "the decommission did not finish within {:?} (DRAIN_TIMEOUT); the node stays cordoned with: {left}",
                    self.settings.config.fleet.drain_timeout
                )),
                None,
            ),
            Err(error) => (Err(anyhow::Error::from(error)), None),
        }
    }
}
