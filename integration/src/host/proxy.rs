//! The service proxy, a userspace kube-proxy for the host: one TCP listener per Service port at
//! `clusterIP:port` (the fixture's service range is on loopback), each connection forwarded to a
//! Ready pod of this host selected by the Service (round-robin; closed when none is Ready).
//! Endpoints are not used: the API refuses loopback pod IPs in them.
//!
//! It also keeps every pod's `/etc/hosts` (bind-mounted into its containers) listing the
//! Services as `<name>.<ns>.svc[.cluster.local]`, so in-cluster addresses resolve.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use super::Ctx;

/// The service proxy or a hosts file failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A Service port's listener could not be bound.
    #[error("listen on {addr} for Service {service}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// `namespace/name`.
        service: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A pod's hosts file could not be written.
    #[error("write hosts file {}: {source}", path.display())]
    HostsFile {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A Service as the hosts files show it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ServiceName {
    /// Namespace.
    pub(crate) namespace: String,
    /// Name.
    pub(crate) name: String,
    /// Cluster IP.
    pub(crate) cluster_ip: String,
}

/// What goes into one pod's hosts file besides the Services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostsEntry {
    /// The file (bind-mounted as `/etc/hosts`).
    pub(crate) path: PathBuf,
    /// The pod's namespace.
    pub(crate) namespace: String,
    /// The pod's IP.
    pub(crate) pod_ip: String,
    /// `spec.hostname` or the pod name.
    pub(crate) hostname: String,
    /// `spec.subdomain`, if any.
    pub(crate) subdomain: Option<String>,
    /// `spec.hostAliases`: IP and names.
    pub(crate) aliases: Vec<(String, Vec<String>)>,
}

/// The kubelet's managed hosts file, plus the Services (sorted by namespace and name).
pub(crate) fn render_hosts(entry: &HostsEntry, services: &[ServiceName]) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file (host agent).\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    match &entry.subdomain {
        Some(subdomain) => out.push_str(&format!(
            "{}\t{}.{subdomain}.{}.svc.cluster.local\t{}\n",
            entry.pod_ip, entry.hostname, entry.namespace, entry.hostname
        )),
        None => out.push_str(&format!("{}\t{}\n", entry.pod_ip, entry.hostname)),
    }
    if !entry.aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for (ip, names) in &entry.aliases {
            out.push_str(&format!("{ip}\t{}\n", names.join("\t")));
        }
    }
    if !services.is_empty() {
        out.push_str("\n# Services (host agent's service proxy).\n");
        let mut sorted: Vec<&ServiceName> = services.iter().collect();
        sorted.sort();
        for svc in sorted {
            let short = if svc.namespace == entry.namespace {
                format!("\t{}", svc.name)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "{ip}\t{name}.{ns}.svc\t{name}.{ns}.svc.cluster.local{short}\n",
                ip = svc.cluster_ip,
                name = svc.name,
                ns = svc.namespace,
            ));
        }
    }
    out
}

/// The Services with a cluster IP, as the hosts files show them.
pub(crate) fn service_names(services: &[Arc<Service>]) -> Vec<ServiceName> {
    let mut names: Vec<ServiceName> = services
        .iter()
        .filter_map(|svc| {
            let ip = svc.spec.as_ref()?.cluster_ip.as_deref()?;
            if ip.is_empty() || ip == "None" {
                return None;
            }
            Some(ServiceName {
                namespace: svc.metadata.namespace.clone()?,
                name: svc.metadata.name.clone()?,
                cluster_ip: ip.to_owned(),
            })
        })
        .collect();
    names.sort();
    names
}

/// The hosts files of the running pods, rewritten in place (same inode: they are bind-mounted)
/// when the Services change.
#[derive(Debug, Default)]
pub(crate) struct HostsFiles {
    inner: parking_lot::Mutex<HostsState>,
}

#[derive(Debug, Default)]
struct HostsState {
    entries: BTreeMap<String, (HostsEntry, String)>,
    services: Vec<ServiceName>,
}

impl HostsFiles {
    /// Adds (or replaces) a pod's file and writes it.
    pub(crate) fn register(&self, key: &str, entry: HostsEntry) -> Result<(), ProxyError> {
        let mut state = self.lock();
        let text = render_hosts(&entry, &state.services);
        write_in_place(&entry.path, &text)?;
        state.entries.insert(key.to_owned(), (entry, text));
        Ok(())
    }

    /// Forgets a pod's file (the file stays).
    pub(crate) fn unregister(&self, key: &str) {
        self.lock().entries.remove(key);
    }

    /// New set of Services: rewrites the files whose text changes.
    pub(crate) fn set_services(&self, services: Vec<ServiceName>) {
        let mut state = self.lock();
        if state.services == services {
            return;
        }
        state.services = services;
        let HostsState { entries, services } = &mut *state;
        for (entry, written) in entries.values_mut() {
            let text = render_hosts(entry, services);
            if text != *written {
                match write_in_place(&entry.path, &text) {
                    Ok(()) => *written = text,
                    Err(error) => warn!(error = %error, "could not update a pod's hosts file"),
                }
            }
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HostsState> {
        self.inner.lock()
    }
}

/// Truncates and writes, keeping the inode (a rename would leave bind mounts on the old file).
fn write_in_place(path: &Path, text: &str) -> Result<(), ProxyError> {
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()));
    result.map_err(|source| ProxyError::HostsFile {
        path: path.to_owned(),
        source,
    })
}

/// A listener's Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    namespace: String,
    name: String,
    port: i32,
}

/// Keeps the Service store (`writer`) and the listeners up to date until `cancel`.
pub(crate) async fn run(ctx: Arc<Ctx>, mut writer: Writer<Service>, cancel: CancellationToken) {
    let api: Api<Service> = Api::all(ctx.client.clone());
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut listeners: HashMap<SocketAddr, (Target, CancellationToken)> = HashMap::new();
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut resync = tokio::time::interval(Duration::from_secs(5));
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            event = events.next() => match event {
                Some(Ok(event)) => {
                    writer.apply_watcher_event(&event);
                    if matches!(event, watcher::Event::InitApply(_) | watcher::Event::Init) {
                        continue;
                    }
                }
                Some(Err(error)) => {
                    debug!(error = %error, "service watch interrupted");
                    continue;
                }
                None => break,
            },
            _ = resync.tick() => {}
            Some(_) = tasks.join_next() => continue,
        }
        let services = ctx.services.state();
        ctx.hosts.set_services(service_names(&services));
        reconcile(&ctx, &services, &mut listeners, &mut tasks, &cancel);
    }
    tasks.shutdown().await;
}

/// The listeners the Services call for: `clusterIP:port` → Service port (TCP, with a selector,
/// not `default/kubernetes`).
fn desired(services: &[Arc<Service>]) -> HashMap<SocketAddr, Target> {
    let mut out = HashMap::new();
    for svc in services {
        let (Some(namespace), Some(name), Some(spec)) =
            (&svc.metadata.namespace, &svc.metadata.name, &svc.spec)
        else {
            continue;
        };
        if namespace == "default" && name == "kubernetes" {
            continue;
        }
        if spec.selector.as_ref().is_none_or(BTreeMap::is_empty) {
            continue;
        }
        let Some(ip) = spec
            .cluster_ip
            .as_deref()
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            continue;
        };
        for port in spec.ports.iter().flatten() {
            if port.protocol.as_deref().is_some_and(|p| p != "TCP") {
                continue;
            }
            let Ok(number) = u16::try_from(port.port) else {
                continue;
            };
            out.insert(
                SocketAddr::new(ip, number),
                Target {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    port: port.port,
                },
            );
        }
    }
    out
}

fn reconcile(
    ctx: &Arc<Ctx>,
    services: &[Arc<Service>],
    listeners: &mut HashMap<SocketAddr, (Target, CancellationToken)>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    let want = desired(services);
    listeners.retain(|addr, (target, token)| {
        let keep = want.get(addr) == Some(target) && !token.is_cancelled();
        if !keep {
            token.cancel();
        }
        keep
    });
    for (addr, target) in want {
        if listeners.contains_key(&addr) {
            continue;
        }
        let service = format!("{}/{}", target.namespace, target.name);
        let listener = match bind(addr) {
            Ok(listener) => listener,
            Err(source) => {
                let error = ProxyError::Bind {
                    addr,
                    service,
                    source,
                };
                warn!(error = %error, "service port not proxied (retried)");
                continue;
            }
        };
        info!(%addr, service, "proxying service port");
        let token = cancel.child_token();
        listeners.insert(addr, (target.clone(), token.clone()));
        let span = info_span!("service", service, %addr);
        tasks.spawn(serve(Arc::clone(ctx), listener, target, token).instrument(span));
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn serve(ctx: Arc<Ctx>, listener: TcpListener, target: Target, token: CancellationToken) {
    let next = AtomicUsize::new(0);
    let mut connections: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            () = token.cancelled() => break,
            Some(_) = connections.join_next() => {}
            accepted = listener.accept() => {
                let (inbound, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        debug!(error = %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let backends = backends(&ctx, &target);
                if backends.is_empty() {
                    debug!(%peer, "no Ready pod: connection closed");
                    continue;
                }
                let start = next.fetch_add(1, Ordering::Relaxed);
                connections.spawn(forward(inbound, backends, start));
            }
        }
    }
    connections.shutdown().await;
}

/// Connects to the backends in turn from `start` and relays.
async fn forward(mut inbound: TcpStream, backends: Vec<SocketAddr>, start: usize) {
    for i in 0..backends.len() {
        let backend = backends[(start + i) % backends.len()];
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(backend)).await {
            Ok(Ok(mut outbound)) => {
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                return;
            }
            Ok(Err(error)) => debug!(%backend, error = %error, "backend refused"),
            Err(_) => debug!(%backend, "backend connect timed out"),
        }
    }
}

/// The Ready, not terminating pods of this host that the Service selects, at the target port.
fn backends(ctx: &Ctx, target: &Target) -> Vec<SocketAddr> {
    let Some(svc) = ctx
        .services
        .get(&ObjectRef::new(&target.name).within(&target.namespace))
    else {
        return Vec::new();
    };
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let Some(port) = spec.ports.iter().flatten().find(|p| p.port == target.port) else {
        return Vec::new();
    };
    let selector = spec.selector.clone().unwrap_or_default();
    let mut pods: Vec<(IpAddr, Arc<Pod>)> = ctx
        .ready
        .snapshot()
        .into_iter()
        .filter(|(_, pod)| {
            pod.metadata.namespace.as_deref() == Some(target.namespace.as_str())
                && pod.metadata.deletion_timestamp.is_none()
                && selector
                    .iter()
                    .all(|(k, v)| pod.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
        })
        .collect();
    pods.sort_by(|a, b| a.1.metadata.name.cmp(&b.1.metadata.name));
    pods.iter()
        .filter_map(|(ip, pod)| {
            let number = target_port(pod, port.target_port.as_ref(), port.port)?;
            Some(SocketAddr::new(*ip, number))
        })
        .collect()
}

/// The pods of this host the agent reports Ready. The status writer adds a pod before it
/// writes Ready=True and removes it before it writes anything else, so whoever sees a Ready pod
/// in the API finds the proxy already forwarding to it (no watch lag, unlike Endpoints).
#[derive(Debug, Default)]
pub(crate) struct ReadyPods {
    inner: parking_lot::Mutex<BTreeMap<String, ReadyPod>>,
}

/// A Ready pod: its IP and its latest object (labels, ports, deletion).
pub(crate) type ReadyPod = (IpAddr, watch::Receiver<Arc<Pod>>);

impl ReadyPods {
    /// Marks the pod with `uid` Ready at `ip` (its latest object read at each connection), or
    /// not Ready with `None`.
    pub(crate) fn set(&self, uid: &str, ready: Option<ReadyPod>) {
        let mut inner = self.inner.lock();
        match ready {
            Some(entry) => {
                inner.insert(uid.to_owned(), entry);
            }
            None => {
                inner.remove(uid);
            }
        }
    }

    /// The Ready pods: IP and latest object.
    fn snapshot(&self) -> Vec<(IpAddr, Arc<Pod>)> {
        let inner = self.inner.lock();
        inner
            .values()
            .map(|(ip, pod)| (*ip, Arc::clone(&pod.borrow())))
            .collect()
    }
}

/// A Service's `targetPort` on `pod`: a number, or a container port's name; default the port.
pub(crate) fn target_port(pod: &Pod, target: Option<&IntOrString>, port: i32) -> Option<u16> {
    let number = match target {
        None => port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(name)) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => {
                pod.spec
                    .as_ref()?
                    .containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|p| p.name.as_deref() == Some(name.as_str()))?
                    .container_port
            }
        },
    };
    u16::try_from(number).ok().filter(|n| *n != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec, ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn entry(subdomain: Option<&str>) -> HostsEntry {
        HostsEntry {
            path: PathBuf::from("/nonexistent"),
            namespace: "kube-system".into(),
            pod_ip: "127.0.0.3".into(),
            hostname: "virtual-node-eci-0".into(),
            subdomain: subdomain.map(str::to_owned),
            aliases: vec![(
                "10.1.1.1".into(),
                vec!["a.example".into(), "b.example".into()],
            )],
        }
    }

    fn name(ns: &str, name: &str, ip: &str) -> ServiceName {
        ServiceName {
            namespace: ns.into(),
            name: name.into(),
            cluster_ip: ip.into(),
        }
    }

    #[test]
    fn hosts_file_lists_pod_aliases_and_services() {
        let services = vec![
            name("kube-system", "mock-eci", "127.100.0.10"),
            name("default", "web", "127.100.0.11"),
        ];
        let text = render_hosts(&entry(Some("virtual-node-eci-headless")), &services);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "127.0.0.1\tlocalhost");
        assert!(lines.contains(
            &"127.0.0.3\tvirtual-node-eci-0.virtual-node-eci-headless.kube-system.svc.cluster.local\tvirtual-node-eci-0"
        ));
        assert!(lines.contains(&"10.1.1.1\ta.example\tb.example"));
        assert!(lines.contains(&"127.100.0.10\tmock-eci.kube-system.svc\tmock-eci.kube-system.svc.cluster.local\tmock-eci"));
        assert!(lines.contains(&"127.100.0.11\tweb.default.svc\tweb.default.svc.cluster.local"));
        // Sorted by namespace: default before kube-system.
        let web = lines
            .iter()
            .position(|l| l.contains("web.default"))
            .unwrap();
        let mock = lines
            .iter()
            .position(|l| l.contains("mock-eci.kube"))
            .unwrap();
        assert!(web < mock);

        let plain = render_hosts(&entry(None), &[]);
        assert!(plain.contains("127.0.0.3\tvirtual-node-eci-0\n"));
        assert!(!plain.contains("Services"));
    }

    #[test]
    fn hosts_files_are_rewritten_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        let files = HostsFiles::default();
        let mut e = entry(None);
        e.path.clone_from(&path);
        files.register("ns/pod", e).unwrap();
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = inode(&path);
        files.set_services(vec![name("kube-system", "mock-eci", "127.100.0.10")]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("mock-eci.kube-system.svc"));
        assert_eq!(inode(&path), before);
        files.set_services(Vec::new());
        assert!(!std::fs::read_to_string(&path).unwrap().contains("mock-eci"));
        files.unregister("ns/pod");
        files.set_services(vec![name("a", "b", "127.100.0.1")]);
        assert!(!std::fs::read_to_string(&path).unwrap().contains("b.a.svc"));
    }

    fn service(
        ns: &str,
        name: &str,
        ip: &str,
        selector: bool,
        ports: &[(i32, Option<&str>)],
    ) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                selector: selector.then(|| BTreeMap::from([("app".into(), name.into())])),
                ports: Some(
                    ports
                        .iter()
                        .map(|(port, protocol)| ServicePort {
                            port: *port,
                            protocol: protocol.map(str::to_owned),
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            status: None,
        })
    }

    #[test]
    fn listeners_for_tcp_ports_of_selecting_services() {
        let services = vec![
            service(
                "kube-system",
                "mock-eci",
                "127.100.0.10",
                true,
                &[(50051, None), (8080, Some("TCP"))],
            ),
            service("default", "kubernetes", "127.100.0.1", true, &[(443, None)]),
            service("default", "manual", "127.100.0.2", false, &[(80, None)]),
            service("default", "headless", "None", true, &[(80, None)]),
            service("default", "dns", "127.100.0.3", true, &[(53, Some("UDP"))]),
        ];
        let want = desired(&services);
        let mut addrs: Vec<String> = want.keys().map(ToString::to_string).collect();
        addrs.sort();
        assert_eq!(addrs, ["127.100.0.10:50051", "127.100.0.10:8080"]);
        let target = &want[&"127.100.0.10:8080".parse().unwrap()];
        assert_eq!((target.name.as_str(), target.port), ("mock-eci", 8080));
    }

    #[test]
    fn target_ports_by_number_or_name() {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![ContainerPort {
                        name: Some("admin".into()),
                        container_port: 8080,
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let cases = [
            (None, 80, Some(80)),
            (Some(IntOrString::Int(9000)), 80, Some(9000)),
            (Some(IntOrString::String("admin".into())), 80, Some(8080)),
            (Some(IntOrString::String("9443".into())), 80, Some(9443)),
            (Some(IntOrString::String("grpc".into())), 80, None),
            (Some(IntOrString::Int(0)), 80, None),
        ];
        for (target, port, want) in cases {
            assert_eq!(target_port(&pod, target.as_ref(), port), want, "{target:?}");
        }
    }
}
