//! ResourcePolicy placement (ACK-compatible `scheduling.alibabacloud.com/v1alpha1`): pods go
//! to the first unit (node pool, then ECI) with room, capped per unit, and leave in reverse
//! order on scale-in. The policy types and the decisions are pure (`vne_core::placement`); the
//! `state` index is fed by the policy watch and the replica's shared node and pod watches
//! (`k8s::shared_watch`); the elected replica serves the scheduler `extender` and
//! runs the `upkeep` (status counts, deletion costs); every replica answers the admission side
//! (`admit`) for the webhook. May call `k8s`, `ops`, `config`.

pub mod admit;
pub mod extender;
pub mod state;
pub mod upkeep;

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::events::Reporter;
use kube::runtime::watcher::{self, Event as WatchEvent};
use serde_json::json;
use tls_serve::{CertificateFiles, ClientAuth, ReloadableCertificate, TlsServer};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use vne_core::placement::decide::VirtualNodes;
use vne_core::placement::policy::ResourcePolicy;

use self::admit::Enforcement;
use self::state::{PlacementIndex, PodEntry};
use crate::config::{PlacementArgs, WithSite};
use crate::k8s::access::{Access, Scope};
use crate::k8s::callers;
use crate::k8s::election::{Candidate, HeldBy, LeaseLock, ROLE_RENEW_INTERVAL, Request, Standing};
use crate::k8s::serving_cert;
use crate::k8s::shared_watch::{ClusterWatches, Reader};
use crate::ops::chain::Chain;
use crate::ops::events::EventPublisher;
use crate::ops::metrics::{MetricSet as _, Telemetry};

/// The Service in front of the elected replica's extender (deploy/base/services.yaml); the
/// shared serving certificate names it.
pub const SERVICE: &str = "virtual-node-eci-placement";
/// The election Lease (in the daemon's namespace) whose holder serves the extender.
pub const LEASE: &str = "virtual-node-eci-placement";
/// The label the leader sets on its own pod; the extender's Service selects it.
pub const LEADER_LABEL: &str = "placement.virtual-node-eci.aliyun.com/leader";
/// How often the certificate files are checked for a renewal.
const CERT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// How long an admission waits for a listing under way (the first policy just appeared, or
/// the replica just started): the webhook's own timeout is 5 s.
pub const ADMISSION_LISTING_WAIT: Duration = Duration::from_secs(2);

/// What the webhook reads of placement.
#[derive(Debug)]
pub struct Shared {
    /// The index.
    pub index: Arc<PlacementIndex>,
    /// Who enforces the unit order now.
    pub enforcement: watch::Receiver<Enforcement>,
    /// True once a ResourcePolicy exists, and from then on: only then does the replica read
    /// the cluster's nodes and pods.
    wanted: watch::Sender<bool>,
}

impl Shared {
    /// Whether the index has seen a full list of everything (before, admission leaves pods
    /// alone).
    pub fn is_synced(&self) -> bool {
        self.index.is_listed()
    }

    /// Waits up to `within` for the listing of nodes and pods a policy asked for; returns at
    /// once when no policy exists (there is nothing to place) or the index is listed.
    pub async fn settle(&self, within: Duration) -> bool {
        if !*self.wanted.borrow() {
            return self.is_synced();
        }
        self.index.wait_listed(within).await
    }

    /// Notes that the index holds a policy: the node and pod watches are wanted from now on.
    fn want_if_policies(&self) {
        if self.index.has_policies() {
            self.wanted
                .send_if_modified(|wanted| !std::mem::replace(wanted, true));
        }
    }
}

/// The placement area: built first (the webhook reads it), then run.
#[derive(Debug)]
pub struct Placement {
    config: WithSite<PlacementArgs>,
    shared: Arc<Shared>,
    enforcement: watch::Sender<Enforcement>,
}

impl Placement {
    /// The area for `config`.
    pub fn new(config: WithSite<PlacementArgs>) -> Self {
        let vnodes = VirtualNodes {
            taint_key: config.site.taint_key.clone(),
            taint_value: config.site.taint_value.clone(),
            taint_effect: config.site.taint_effect.as_str().to_owned(),
            ..VirtualNodes::default()
        };
        let initial = Enforcement::Admission {
            why: "no replica has been elected to serve the scheduler extender yet".into(),
        };
        let (enforcement, receiver) = watch::channel(initial);
        Self {
            config,
            shared: Arc::new(Shared {
                index: Arc::new(PlacementIndex::new(vnodes)),
                enforcement: receiver,
                wanted: watch::Sender::new(false),
            }),
            enforcement,
        }
    }

    /// What the webhook reads.
    pub fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Feeds the index (policies from their own watch; nodes and pods from the replica's
    /// shared ones, once a policy exists), takes part in the election and, while elected,
    /// serves the extender and keeps statuses and deletion costs; until `stop`.
    pub async fn run(
        self,
        client: kube::Client,
        watches: &ClusterWatches,
        telemetry: Arc<Telemetry>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let mut tasks: JoinSet<()> = JoinSet::new();
        let index = Arc::clone(&self.shared.index);
        {
            let (client, shared, stop) = (client.clone(), Arc::clone(&self.shared), stop.clone());
            tasks.spawn(feed_policies(client, shared, stop));
        }
        {
            let (watches, shared, stop) = (watches.clone(), Arc::clone(&self.shared), stop.clone());
            tasks.spawn(read_cluster_once_wanted(watches, shared, stop));
        }
        let events = EventPublisher::new(
            client.clone(),
            Reporter {
                controller: crate::k8s::FIELD_MANAGER.into(),
                instance: Some(self.config.site.node_name.clone()),
            },
            Arc::clone(&telemetry),
        );
        let leadership = Leadership {
            config: self.config,
            client,
            index,
            telemetry,
            events,
            enforcement: self.enforcement,
            receiver: self.shared.enforcement.clone(),
        };
        leadership.run(stop.clone()).await;
        stop.cancel();
        while tasks.join_next().await.is_some() {}
        Ok(())
    }
}

/// The watcher's stream as index updates; a failed list or watch is retried with back-off
/// (a missing CRD is reported, not fatal: placement idles until it is installed).
async fn feed<K, F>(api: Api<K>, what: &'static str, stop: CancellationToken, mut apply: F)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(WatchEvent<K>),
{
    let config = watcher::Config::default().page_size(crate::k8s::shared_watch::PAGE_SIZE);
    let stream = watcher::watcher(api, config)
        .default_backoff()
        .map_err(|error| {
            warn!(what, error = %Chain(&error), "placement watch failed; retrying");
            error
        });
    let mut stream = std::pin::pin!(stream);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            next = stream.next() => match next {
                Some(Ok(event)) => apply(event),
                Some(Err(_)) => {}
                None => return,
            },
        }
    }
}

async fn feed_policies(client: kube::Client, shared: Arc<Shared>, stop: CancellationToken) {
    let mut read = policy_reader(shared);
    feed(
        Api::<ResourcePolicy>::all(client),
        "ResourcePolicy",
        stop,
        |event| read(&event),
    )
    .await;
}

/// Placement's reader of the policy watch; the first policy seen asks for the node and pod
/// watches.
fn policy_reader(shared: Arc<Shared>) -> impl FnMut(&WatchEvent<ResourcePolicy>) {
    let mut listing: Vec<ResourcePolicy> = Vec::new();
    move |event| {
        let index = &shared.index;
        match event {
            WatchEvent::Apply(p) => index.apply_policy(p.clone()),
            WatchEvent::Delete(p) => index.delete_policy(p),
            WatchEvent::Init => listing.clear(),
            WatchEvent::InitApply(p) => listing.push(p.clone()),
            WatchEvent::InitDone => announce(index.set_policies(std::mem::take(&mut listing))),
        }
        shared.want_if_policies();
    }
}

/// Subscribes placement to the replica's shared node and pod watches once a ResourcePolicy
/// exists, and from then on. A cluster-wide pod watch (every pod's changes, decoded and
/// indexed by every replica) is not worth paying for in a cluster that places nothing.
async fn read_cluster_once_wanted(
    watches: ClusterWatches,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut wanted = shared.wanted.subscribe();
    tokio::select! {
        () = stop.cancelled() => return,
        // The sender lives in `shared`, held here: the wait ends only by the flag.
        _ = wanted.wait_for(|w| *w) => {}
    }
    info!("a ResourcePolicy exists: placement reads the shared node and pod watches");
    watches.nodes.subscribe(node_reader(Arc::clone(&shared)));
    watches.pods.subscribe(pod_reader(shared));
}

fn announce(completed_listing: bool) {
    if completed_listing {
        info!("ResourcePolicy placement has listed policies, nodes and pods");
    }
}

/// Placement's reader of the shared node watch: a relist replaces every node.
fn node_reader(shared: Arc<Shared>) -> Reader<Node> {
    let mut listing: Option<Vec<Node>> = None;
    Box::new(move |event| match event {
        WatchEvent::Apply(n) => shared.index.apply_node(n),
        WatchEvent::Delete(n) => shared.index.delete_node(n),
        WatchEvent::Init => listing = Some(Vec::new()),
        WatchEvent::InitApply(n) => listing.get_or_insert_default().push(n.clone()),
        WatchEvent::InitDone => {
            announce(shared.index.set_nodes(listing.take().unwrap_or_default()));
        }
    })
}

/// Placement's reader of the shared pod watch: a relist, kept as slim views meanwhile,
/// replaces every pod (those it does not name were deleted while the watch was broken).
fn pod_reader(shared: Arc<Shared>) -> Reader<Pod> {
    let mut listing: Option<Vec<PodEntry>> = None;
    Box::new(move |event| match event {
        WatchEvent::Apply(p) => shared.index.apply_pod(p),
        WatchEvent::Delete(p) => shared.index.delete_pod(p),
        WatchEvent::Init => listing = Some(Vec::new()),
        WatchEvent::InitApply(p) => listing.get_or_insert_default().push(PodEntry::of(p)),
        WatchEvent::InitDone => announce(
            shared
                .index
                .replace_pods(listing.take().unwrap_or_default()),
        ),
    })
}

fn operation(request: Request) -> &'static str {
    match request {
        Request::Get => "placement_lease_get",
        Request::Create => "placement_lease_create",
        Request::TakeOver => "placement_lease_take_over",
        Request::Renew => "placement_lease_renew",
        Request::Release => "placement_lease_release",
    }
}

struct Leadership {
    config: WithSite<PlacementArgs>,
    client: kube::Client,
    index: Arc<PlacementIndex>,
    telemetry: Arc<Telemetry>,
    events: EventPublisher,
    enforcement: watch::Sender<Enforcement>,
    receiver: watch::Receiver<Enforcement>,
}

/// What this replica is doing as leader.
struct Term {
    stop: CancellationToken,
    tasks: JoinSet<()>,
    lease: Lease,
}

impl Leadership {
    fn set_enforcement(&self, next: &Enforcement) {
        let changed = self.enforcement.send_if_modified(|current| {
            let changed = current != next;
            current.clone_from(next);
            changed
        });
        if changed {
            match next {
                Enforcement::Extender => {
                    info!("ResourcePolicy unit order is enforced by the scheduler extender");
                }
                Enforcement::Admission { why } => {
                    warn!(%why, "ResourcePolicy unit order cannot be enforced by the scheduler extender; pods are placed at admission instead (first unit with room; no waiting, no bind-time cap)");
                }
            }
        }
    }

    async fn run(self, stop: CancellationToken) {
        let lock = LeaseLock::new(
            self.client.clone(),
            &self.config.site.pod_namespace,
            LEASE,
            Candidate::for_role(&self.config.site.node_name),
        );
        let mut term: Option<Term> = None;
        let mut ticks = tokio::time::interval(ROLE_RENEW_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let count = |request| self.telemetry.kube_request(operation(request));
            let held = term.as_ref().map(|held| &held.lease);
            match lock.contend(held, &count).await {
                Ok(Standing::Leading(lease)) => {
                    if let Some(held) = term.as_mut() {
                        held.lease = *lease;
                    } else {
                        info!(lease = LEASE, "elected to serve ResourcePolicy placement");
                        term = Some(self.begin(*lease).await);
                    }
                    self.set_enforcement(&self.own_enforcement());
                }
                Ok(Standing::Following(holder)) => {
                    if let Some(ended) = term.take() {
                        warn!("lost the placement election; no longer serving the extender");
                        self.end(ended, false, &lock).await;
                    }
                    if let Some(holder) = &holder {
                        debug!(holder = %holder.holder.identity, "another replica serves placement");
                    }
                    let next = self.others_enforcement(holder.as_ref(), &lock, &count);
                    self.set_enforcement(&next.await);
                }
                Err(error) => {
                    warn!(error = %Chain(&error), "cannot take part in the placement election; retrying");
                    if term.is_none() {
                        self.set_enforcement(&self.others_enforcement(None, &lock, &count).await);
                    }
                }
            }
        }
        if let Some(ended) = term.take() {
            self.end(ended, true, &lock).await;
        }
    }

    /// While we lead.
    fn own_enforcement(&self) -> Enforcement {
        if self.config.args.placement_extender {
            Enforcement::Extender
        } else {
            Enforcement::Admission {
                why: "PLACEMENT_EXTENDER=false: the elected replica serves no scheduler extender"
                    .into(),
            }
        }
    }

    /// While another replica leads (or nobody does). `holder`: whom this round's own read found
    /// holding the Lease, unexpired; that settles it without reading the Lease a second time.
    async fn others_enforcement(
        &self,
        holder: Option<&HeldBy>,
        lock: &LeaseLock,
        count: &crate::k8s::election::Count<'_>,
    ) -> Enforcement {
        if !self.config.args.placement_extender {
            return self.own_enforcement();
        }
        if holder.is_some() {
            return Enforcement::Extender;
        }
        match lock.observe(count).await {
            Ok(Some(lease)) => {
                match crate::k8s::election::judge(&lease, &lock.candidate, lock.now()) {
                    crate::k8s::election::Claim::Held(_) => Enforcement::Extender,
                    _ => Enforcement::Admission {
                        why: format!(
                            "the placement Lease {}/{LEASE} has expired or was released: no replica serves the scheduler extender",
                            self.config.site.pod_namespace
                        ),
                    },
                }
            }
            Ok(None) => Enforcement::Admission {
                why: format!(
                    "no replica holds the placement Lease {}/{LEASE}: no scheduler extender is serving",
                    self.config.site.pod_namespace
                ),
            },
            Err(error) => Enforcement::Admission {
                why: format!("cannot read the placement Lease: {}", Chain(&error)),
            },
        }
    }

    async fn begin(&self, lease: Lease) -> Term {
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        self.label_own_pod(true).await;
        {
            let (client, index, receiver, events, stop) = (
                self.client.clone(),
                Arc::clone(&self.index),
                self.receiver.clone(),
                self.events.clone(),
                stop.clone(),
            );
            tasks.spawn(upkeep::run(client, index, receiver, events, stop));
        }
        if self.config.args.placement_extender {
            let served = Arc::new(extender::Extender {
                index: Arc::clone(&self.index),
                client: self.client.clone(),
                metrics: extender::PlacementMetrics::of(&self.telemetry),
                events: self.events.clone(),
                binds: tokio_util::task::TaskTracker::new(),
            });
            let (config, client, stop) = (self.config.clone(), self.client.clone(), stop.clone());
            tasks.spawn(serve_extender(config, client, served, stop));
        }
        Term { stop, tasks, lease }
    }

    async fn end(&self, mut term: Term, release: bool, lock: &LeaseLock) {
        term.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while term.tasks.join_next().await.is_some() {}
        })
        .await;
        term.tasks.abort_all();
        self.label_own_pod(false).await;
        if release {
            let count = |request| self.telemetry.kube_request(operation(request));
            match tokio::time::timeout(Duration::from_secs(5), lock.release(&term.lease, &count))
                .await
            {
                Ok(Ok(_)) => info!("released the placement election"),
                _ => debug!("could not release the placement election; it expires instead"),
            }
        }
    }

    /// Marks (or unmarks) this replica's pod as the one the extender Service sends to.
    async fn label_own_pod(&self, leading: bool) {
        let Some(pod) = &self.config.site.pod_name else {
            return;
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.config.site.pod_namespace);
        let value = if leading {
            json!("true")
        } else {
            serde_json::Value::Null
        };
        let patch = json!({"metadata": {"labels": {LEADER_LABEL: value}}});
        if let Err(error) = pods
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            // Outside a pod (a test host) there is nothing to label.
            debug!(%pod, error = %Chain(&error), "could not label this replica's pod for the extender Service");
        }
    }
}

/// The names the shared certificate must carry: the webhook's Service and the extender's.
pub fn certificate_names(webhook_service: &str, namespace: &str) -> Vec<String> {
    let mut names = serving_cert::service_names(webhook_service, namespace);
    names.extend(serving_cert::service_names(SERVICE, namespace));
    names
}

/// The extender's serving certificate, from its directory or the shared Secret: tried again
/// every few seconds until there is one (the webhook's leader may not have written it yet), or
/// `None` once `stop` is cancelled.
async fn extender_certificate(
    config: &WithSite<PlacementArgs>,
    client: &kube::Client,
    stop: &CancellationToken,
) -> Option<Arc<rustls::sign::CertifiedKey>> {
    loop {
        let attempt = match &config.args.placement_extender_cert_dir {
            Some(dir) => serving_cert::from_dir(dir),
            None => {
                let names =
                    certificate_names(&config.site.webhook_service, &config.site.pod_namespace);
                serving_cert::from_secret(
                    client.clone(),
                    &config.site.pod_namespace,
                    &config.site.webhook_secret,
                    &names,
                )
                .await
            }
        };
        match attempt.and_then(|m| m.certified_key()) {
            Ok(key) => return Some(key),
            Err(error) => {
                warn!(error = %Chain(&error), "no certificate for the scheduler extender yet; retrying");
                tokio::select! {
                    () = stop.cancelled() => return None,
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    }
}

/// Serves the extender until `stop`: binding the address is retried (a previous leader on the
/// same host may still hold it for a moment).
async fn serve_extender(
    config: WithSite<PlacementArgs>,
    client: kube::Client,
    served: Arc<extender::Extender>,
    stop: CancellationToken,
) {
    let Some(material) = extender_certificate(&config, &client, &stop).await else {
        return;
    };
    let mut tasks: JoinSet<()> = JoinSet::new();
    let certificate = Arc::new(ReloadableCertificate::new(material));
    if let Some(dir) = config.args.placement_extender_cert_dir.clone() {
        let (certificate, stop) = (Arc::clone(&certificate), stop.clone());
        tasks.spawn(async move {
            CertificateFiles::in_dir(&dir)
                .watch(certificate, CERT_RELOAD_INTERVAL, stop)
                .await;
        });
    }
    // Client certificates are asked for but optional (token callers connect too); the chain
    // is judged per request against the CA in force then (`extender::caller`).
    let client_auth = ClientAuth::Verify(Arc::new(callers::RequestClientCertificate::default()));
    let server = match TlsServer::new(certificate, client_auth) {
        Ok(server) => server.with_limits(extender::limits()),
        Err(error) => {
            warn!(error = %Chain(&error), "cannot serve the scheduler extender");
            return;
        }
    };
    let bind = || tokio::net::TcpListener::bind(config.args.placement_extender_addr);
    let bound = bind
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(5))
                .without_max_times(),
        )
        .notify(|error, wait| {
            warn!(address = %config.args.placement_extender_addr, %error, retry_in = ?wait, "cannot listen for the scheduler extender yet");
        });
    let listener = tokio::select! {
        () = stop.cancelled() => return,
        bound = bound => match bound {
            Ok(listener) => listener,
            Err(error) => {
                warn!(address = %config.args.placement_extender_addr, %error, "cannot serve the scheduler extender");
                return;
            }
        },
    };
    let callers = callers(&config, &client, &mut tasks, &stop).await;
    info!(address = %config.args.placement_extender_addr, prefix = extender::PREFIX, "serving the scheduler extender");
    server
        .serve(listener, extender::router(served, callers), stop.clone())
        .await;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
}

/// Who may call the extender: the client CA loaded (before the first call, so kube-scheduler's
/// first is not refused) and kept current on `tasks`.
async fn callers(
    config: &WithSite<PlacementArgs>,
    client: &kube::Client,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
) -> Arc<extender::caller::CallerGuard> {
    let client_ca = Arc::new(callers::ClientCa::default());
    let source = match &config.args.placement_extender_client_ca_file {
        Some(path) => callers::ClientCaSource::File(path.clone()),
        None => callers::ClientCaSource::Cluster(client.clone()),
    };
    source.load_into(&client_ca).await;
    tasks.spawn(source.keep_current(Arc::clone(&client_ca), stop.clone()));
    Arc::new(extender::caller::CallerGuard::new(
        Arc::new(callers::ApiReviewer::new(client.clone())),
        client_ca,
        extender::BODY_LIMIT,
    ))
}

/// The API accesses of placement (see [`crate::k8s::access`]).
pub const KUBE_API: &[Access] = &[
    Access {
        scope: Scope::Cluster,
        group: "scheduling.alibabacloud.com",
        resource: "resourcepolicies",
        verbs: &["list", "watch"],
        why: "the ResourcePolicy index",
    },
    Access {
        scope: Scope::Cluster,
        group: "scheduling.alibabacloud.com",
        resource: "resourcepolicies/status",
        verbs: &["patch"],
        why: "per-unit counts in each policy's status",
    },
    Access {
        scope: Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        why: "which unit each node is in, and the room left on it",
    },
    Access {
        scope: Scope::Cluster,
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch", "patch"],
        why: "counting pods per unit; marking placed pods (unit, deletion cost); the leader's own label",
    },
    Access {
        scope: Scope::Cluster,
        group: "",
        resource: "pods/binding",
        verbs: &["create"],
        why: "the scheduler extender binds the pods it placed",
    },
    Access {
        scope: Scope::OwnNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        why: "the placement election",
    },
    Access {
        scope: Scope::OwnNamespace,
        group: "",
        resource: "secrets",
        verbs: &["get", "create"],
        why: "the extender's certificate (the webhook's, shared)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Placement as built: nothing listed, nothing wanted.
    fn unlisted() -> Arc<Shared> {
        Arc::new(Shared {
            index: Arc::new(PlacementIndex::new(VirtualNodes::default())),
            enforcement: watch::channel(Enforcement::Extender).1,
            wanted: watch::Sender::new(false),
        })
    }

    /// With policies and nodes listed, and pods not yet.
    fn shared() -> Arc<Shared> {
        let shared = unlisted();
        shared.index.set_policies([]);
        shared.index.set_nodes([]);
        shared
    }

    fn policy(name: &str) -> ResourcePolicy {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "a"},
            "spec": {"selector": {"app": "web"}, "units": [{"resource": "eci"}]},
        }))
        .unwrap()
    }

    #[test]
    fn the_first_policy_asks_for_the_node_and_pod_watches_for_good() {
        let shared = unlisted();
        let wanted = || *shared.wanted.borrow();
        let mut read = policy_reader(Arc::clone(&shared));
        read(&WatchEvent::Init);
        read(&WatchEvent::InitDone);
        assert!(!wanted(), "a cluster without policies reads no pods");
        read(&WatchEvent::Apply(policy("p")));
        assert!(wanted());
        read(&WatchEvent::Delete(policy("p")));
        assert!(!shared.index.has_policies());
        assert!(wanted(), "the watches, once read, stay");

        let listed_with_one = unlisted();
        let mut read = policy_reader(Arc::clone(&listed_with_one));
        read(&WatchEvent::Init);
        read(&WatchEvent::InitApply(policy("p")));
        assert!(!*listed_with_one.wanted.borrow(), "a list lands at its end");
        read(&WatchEvent::InitDone);
        assert!(*listed_with_one.wanted.borrow());
    }

    #[tokio::test]
    async fn the_cluster_watches_are_subscribed_to_only_once_wanted() {
        let watches = ClusterWatches::default();
        let shared = shared();
        let stop = CancellationToken::new();
        stop.cancel();
        read_cluster_once_wanted(watches.clone(), Arc::clone(&shared), stop).await;
        assert_eq!((watches.nodes.readers(), watches.pods.readers()), (0, 0));

        shared.index.apply_policy(policy("p"));
        shared.want_if_policies();
        read_cluster_once_wanted(watches.clone(), shared, CancellationToken::new()).await;
        assert_eq!((watches.nodes.readers(), watches.pods.readers()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn admission_waits_for_a_listing_under_way_and_only_then() {
        let started = tokio::time::Instant::now();
        let wait = ADMISSION_LISTING_WAIT;
        let idle = shared();
        assert!(
            !idle.settle(wait).await,
            "no policy: nothing listed, nothing to wait for"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);

        let listing = shared();
        listing.index.apply_policy(policy("p"));
        listing.want_if_policies();
        let lister = Arc::clone(&listing);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            lister.index.set_pods([]);
        });
        assert!(
            listing.settle(wait).await,
            "the listing ended within the wait"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(300));

        let stuck = shared();
        stuck.index.apply_policy(policy("p"));
        stuck.want_if_policies();
        let before = tokio::time::Instant::now();
        assert!(!stuck.settle(wait).await);
        assert_eq!(before.elapsed(), wait, "bounded");
        let before = tokio::time::Instant::now();
        assert!(!stuck.settle(wait).await);
        assert_eq!(
            before.elapsed(),
            Duration::ZERO,
            "a wait that ran out is not paid again"
        );
    }

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "a", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap()
    }

    #[test]
    fn the_pod_reader_applies_a_relist_whole_and_marks_the_index_listed() {
        let shared = shared();
        let mut read = pod_reader(Arc::clone(&shared));
        let uids = |shared: &Shared| {
            let mut uids: Vec<String> = shared
                .index
                .pods_in("a")
                .into_iter()
                .map(|p| p.uid)
                .collect();
            uids.sort();
            uids
        };
        read(&WatchEvent::Init);
        read(&WatchEvent::InitApply(pod("x")));
        read(&WatchEvent::InitApply(pod("y")));
        assert!(!shared.is_synced(), "not before the list ends");
        assert!(uids(&shared).is_empty(), "a list lands at its end");
        read(&WatchEvent::InitDone);
        assert!(shared.is_synced());
        read(&WatchEvent::Apply(pod("z")));
        assert_eq!(uids(&shared), ["x", "y", "z"]);
        // The watch broke; x and z were deleted meanwhile and only the relist says so.
        read(&WatchEvent::Init);
        read(&WatchEvent::InitApply(pod("y")));
        assert_eq!(uids(&shared), ["x", "y", "z"], "kept until the relist ends");
        read(&WatchEvent::InitDone);
        assert_eq!(uids(&shared), ["y"]);
    }
}
