//! Each area's own flags, one group per area, with the checks that need nothing else. The
//! [`Site`](super::Site) holds what several areas share.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, LogFormat, SelectorScope, Site, StopMode};

/// The node area's flags: capacity, Lease, status and ECI health.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Advertised CPU capacity in cores. Default 6000: ~3000 pods (Alibaba's guidance per
    /// virtual node) of 2 vCPU.
    #[arg(long, env = "ECI_QUOTA_CPU", default_value = "6000")]
    pub quota_cpu: String,

    /// Advertised memory capacity. Default 12Ti: ~3000 pods of 4 GiB.
    #[arg(long, env = "ECI_QUOTA_MEMORY", default_value = "12Ti")]
    pub quota_memory: String,

    /// Advertised pod capacity (Alibaba's guidance: about 3000 per virtual node; scale the
    /// StatefulSet out for more).
    #[arg(long, env = "ECI_QUOTA_POD", default_value_t = 3000)]
    pub quota_pods: u32,

    /// Advertised ephemeral storage. Default 90Ti: ~3000 pods of ECI's 30 GiB.
    #[arg(long, env = "ECI_QUOTA_EPHEMERAL_STORAGE", default_value = "90Ti")]
    pub quota_ephemeral_storage: String,

    /// Lease duration, seconds (the node lifecycle controller's clock).
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 40)]
    pub lease_duration_seconds: i32,

    /// How often the Lease is renewed.
    #[arg(long, env = "LEASE_RENEW_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub lease_renew_interval: Duration,

    /// How often ECI is probed with a cheap call.
    #[arg(long, env = "ECI_PROBE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub eci_probe_interval: Duration,

    /// How long ECI must fail before the node turns NotReady (reason EciUnreachable).
    #[arg(long, env = "ECI_UNREACHABLE_THRESHOLD", default_value = "30s", value_parser = humantime::parse_duration)]
    pub eci_unreachable_threshold: Duration,

    /// Longest time between node status writes when nothing changes (keeps lastHeartbeatTime
    /// honest).
    #[arg(long, env = "NODE_STATUS_MAX_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub node_status_max_interval: Duration,
}

impl NodeArgs {
    /// Quotas are quantities, the Lease is renewed in time, ECI is probed before it is judged.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        self.check_quotas()?;
        let renew = self.lease_renew_interval.as_secs_f64();
        if self.lease_duration_seconds <= 0
            || renew <= 0.0
            || renew * 2.0 > f64::from(self.lease_duration_seconds)
        {
            return Err(ConfigError {
                flag: "--lease-renew-interval (LEASE_RENEW_INTERVAL)",
                problem: format!(
                    "{renew}s does not fit twice in a {}s lease",
                    self.lease_duration_seconds
                ),
                fix: "renew at most every half lease duration (the default renews every 10s a 40s lease)",
            });
        }
        if self.eci_probe_interval.is_zero()
            || self.eci_unreachable_threshold < self.eci_probe_interval
        {
            return Err(ConfigError {
                flag: "--eci-unreachable-threshold (ECI_UNREACHABLE_THRESHOLD)",
                problem: "shorter than the probe interval".into(),
                fix: "make it at least --eci-probe-interval (defaults: 30s and 10s)",
            });
        }
        Ok(())
    }

    /// Quotas the node advertises are Kubernetes quantities.
    fn check_quotas(&self) -> Result<(), ConfigError> {
        for (flag, value) in [
            ("--quota-cpu (ECI_QUOTA_CPU)", &self.quota_cpu),
            ("--quota-memory (ECI_QUOTA_MEMORY)", &self.quota_memory),
            (
                "--quota-ephemeral-storage (ECI_QUOTA_EPHEMERAL_STORAGE)",
                &self.quota_ephemeral_storage,
            ),
        ] {
            if !is_quantity(value) {
                return Err(ConfigError {
                    flag,
                    problem: format!("{value:?} is not a Kubernetes quantity"),
                    fix: "write e.g. 6000, 500m, 12Ti or 64Gi",
                });
            }
        }
        Ok(())
    }
}

/// A quota is an amount: a quantity of zero or more (the one parser, `k8s::quantity`).
pub(super) fn is_quantity(text: &str) -> bool {
    crate::k8s::quantity::is_amount(text)
}

/// The kubelet API's flags (its port is the node's, in [`SiteArgs`](super::SiteArgs)).
#[derive(Debug, Clone, clap::Args)]
pub struct KubeletArgs {
    /// Address the kubelet API listens on (HTTPS, port KUBELET_PORT). Default: the node's
    /// InternalIP (POD_IP), the address the Node advertises to the apiserver.
    #[arg(long, env = "KUBELET_ADDRESS")]
    pub kubelet_address: Option<IpAddr>,

    /// A directory with tls.crt and tls.key for the kubelet API, reloaded when they change.
    /// Without it the daemon requests a certificate through a CertificateSigningRequest
    /// (signer kubernetes.io/kubelet-serving) and serves a self-signed one until it is issued.
    #[arg(long, env = "KUBELET_CERT_DIR")]
    pub kubelet_cert_dir: Option<PathBuf>,

    /// The CA (PEM) that client certificates of the kubelet API are verified against. Default:
    /// `client-ca-file` of the ConfigMap kube-system/extension-apiserver-authentication.
    #[arg(long, env = "KUBELET_CLIENT_CA_FILE")]
    pub kubelet_client_ca_file: Option<PathBuf>,

    /// How often `kubectl logs -f` polls ECI for new lines while lines keep coming (ECI has no
    /// log streaming; idle followers back off to 5x this).
    #[arg(long, env = "KUBELET_LOG_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub kubelet_log_poll_interval: Duration,
}

impl KubeletArgs {
    /// Where the API listens: KUBELET_ADDRESS, else the node's InternalIP.
    pub fn listen(&self, site: &Site) -> SocketAddr {
        SocketAddr::new(
            self.kubelet_address.unwrap_or(site.internal_ip),
            site.kubelet_port,
        )
    }

    /// Log polling leaves ECI some pace.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.kubelet_log_poll_interval.is_zero() {
            return Err(ConfigError {
                flag: "--kubelet-log-poll-interval (KUBELET_LOG_POLL_INTERVAL)",
                problem: "0".into(),
                fix: "poll at most every few seconds, e.g. 1s (each poll is one DescribeContainerLog call)",
            });
        }
        Ok(())
    }
}

/// The pods area's flags: what pods are told, how groups are polled and created, which
/// namespaces and annotations are served.
#[derive(Debug, Clone, clap::Args)]
pub struct PodsArgs {
    /// Cluster DNS server(s) for pods with `dnsPolicy: ClusterFirst` (comma-separated; the
    /// kube-dns Service IP). Without it such pods use ECI's resolver.
    #[arg(long, env = "CLUSTER_DNS", value_delimiter = ',')]
    pub cluster_dns: Vec<String>,

    /// The cluster's DNS domain.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,

    /// The apiserver address ECI pods get in KUBERNETES_SERVICE_HOST (and the KUBERNETES_PORT
    /// family), e.g. the cluster's internal SLB when ClusterIPs are not reachable from ECI.
    /// Default: the `default/kubernetes` Service's ClusterIP, as a kubelet gives.
    #[arg(long, env = "ECI_KUBERNETES_SERVICE_HOST")]
    pub kubernetes_service_host: Option<String>,

    /// The apiserver port ECI pods get in KUBERNETES_SERVICE_PORT. Default: the
    /// `default/kubernetes` Service's port (443 with ECI_KUBERNETES_SERVICE_HOST and no Service).
    #[arg(long, env = "ECI_KUBERNETES_SERVICE_PORT")]
    pub kubernetes_service_port: Option<u16>,

    /// ClusterIP Service access from ECI pods (ECI runs a kube-proxy in each group, one watch
    /// of the apiserver per pod); `false` spares the apiserver those watches. A pod's
    /// annotation k8s.aliyun.com/eci-kube-proxy-enabled overrides it.
    #[arg(long, env = "ECI_KUBE_PROXY", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub kube_proxy: bool,

    /// Keep running pods' configMap, secret and projected volumes current as their objects
    /// change, as the kubelet does (UpdateContainerGroup; no restart). Watches the metadata of
    /// every ConfigMap and Secret, which takes list and watch on both, cluster-wide; `false`
    /// (e.g. under per-namespace RBAC, deploy/README.md) keeps the files as they were when the
    /// group was created.
    #[arg(long, env = "VOLUME_UPDATES", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub volume_updates: bool,

    /// How often pod statuses are polled from ECI (one call per interval for the whole node:
    /// only the groups whose status changed).
    #[arg(long, env = "POD_STATUS_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub pod_status_poll_interval: Duration,

    /// How often every group of this node is listed again (catches anything an incremental
    /// poll missed, and groups that vanished).
    #[arg(long, env = "POD_RESYNC_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub pod_resync_interval: Duration,

    /// Most container group creations in flight at once.
    #[arg(long, env = "MAX_CONCURRENT_CREATES", default_value_t = 32)]
    pub max_concurrent_creates: usize,

    /// Serve only pods of namespaces whose labels match this selector (`kubectl -l` syntax,
    /// e.g. `eci.aliyun.com/tenant=true`). Pods bound here from other namespaces stay Pending
    /// with reason NamespaceNotServed: nothing of them is read and no instance is created.
    /// Unset: every namespace.
    #[arg(long, env = "NAMESPACE_SELECTOR")]
    pub namespace_selector: Option<String>,

    /// The ConfigMap (in POD_NAMESPACE) saying which namespaces may use which
    /// `k8s.aliyun.com/` annotations, an allow-list: key = annotation name without the prefix
    /// (e.g. `eci-ram-role-name`), `tag.<key>`, `oversized-specs` or
    /// `unknown-size-instance-types`; value = a namespace label selector, `all` or `none`. An
    /// annotation it does not name is refused; while it is missing or invalid, pods wait. The
    /// manifests ship one (`eci-annotation-policy`). Unset: every annotation allowed everywhere,
    /// as in ack-virtual-node.
    #[arg(long, env = "ANNOTATION_POLICY_CONFIGMAP")]
    pub annotation_policy_configmap: Option<String>,
}

impl PodsArgs {
    /// Polling and creation leave the daemon some pace; the pods' apiserver address and the
    /// served namespaces are well formed.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.pod_status_poll_interval.is_zero()
            || self.pod_resync_interval < self.pod_status_poll_interval
        {
            return Err(ConfigError {
                flag: "--pod-resync-interval (POD_RESYNC_INTERVAL)",
                problem: "shorter than the status poll interval".into(),
                fix: "make it at least --pod-status-poll-interval (defaults: 60s and 1s)",
            });
        }
        if self.max_concurrent_creates == 0 {
            return Err(ConfigError {
                flag: "--max-concurrent-creates (MAX_CONCURRENT_CREATES)",
                problem: "0".into(),
                fix: "allow at least 1",
            });
        }
        self.check_pod_api_address()?;
        self.check_scope()
    }

    /// The apiserver address given to pods, when set, is a host and a port.
    fn check_pod_api_address(&self) -> Result<(), ConfigError> {
        if let Some(host) = &self.kubernetes_service_host {
            // Pods read it as a bare host; `https://` or a port in it breaks every client.
            if host.is_empty() || host.contains("://") || host.contains(['/', ' ']) {
                return Err(ConfigError {
                    flag: "--kubernetes-service-host (ECI_KUBERNETES_SERVICE_HOST)",
                    problem: format!("{host:?} is not a host"),
                    fix: "give an IP address or DNS name only; the port goes in ECI_KUBERNETES_SERVICE_PORT",
                });
            }
        }
        if self.kubernetes_service_port == Some(0) {
            return Err(ConfigError {
                flag: "--kubernetes-service-port (ECI_KUBERNETES_SERVICE_PORT)",
                problem: "0".into(),
                fix: "give the apiserver's port as pods reach it, e.g. 6443",
            });
        }
        Ok(())
    }

    /// Which namespaces are served, and where the annotation policy lives.
    fn check_scope(&self) -> Result<(), ConfigError> {
        if let Some(text) = &self.namespace_selector
            && let Err(error) = vne_core::selector_text::parse(text)
        {
            return Err(ConfigError {
                flag: "--namespace-selector (NAMESPACE_SELECTOR)",
                problem: error.to_string(),
                fix: "write a label selector as kubectl -l takes it, e.g. eci.aliyun.com/tenant=true",
            });
        }
        if let Some(name) = &self.annotation_policy_configmap
            && name.contains('/')
        {
            return Err(ConfigError {
                flag: "--annotation-policy-configmap (ANNOTATION_POLICY_CONFIGMAP)",
                problem: name.clone(),
                fix: "give the ConfigMap's name only: it is read from POD_NAMESPACE",
            });
        }
        Ok(())
    }
}

/// The fleet area's flags: what a stop means, draining, orphan collection.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// What a stop signal means: `auto` decides from the StatefulSet (this replica's ordinal at
    /// or above `spec.replicas`, or the StatefulSet being deleted, means scale-in: drain and
    /// remove the node; anything else is a restart), `restart` always keeps the node and its
    /// pods for a successor, `decommission` always drains.
    #[arg(long, env = "ON_STOP", value_enum, default_value = "auto")]
    pub on_stop: StopMode,

    /// How long a scale-in drain may take before the replica gives up, leaving the node
    /// cordoned with what is left (the StatefulSet's terminationGracePeriodSeconds must be
    /// longer).
    #[arg(long, env = "DRAIN_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// Also evict pods that no controller owns when draining (like `kubectl drain --force`:
    /// nothing recreates them). Without it the drain waits for them and reports them.
    #[arg(long, env = "DRAIN_EVICT_UNMANAGED_PODS")]
    pub drain_evict_unmanaged_pods: bool,

    /// How often one replica (elected through a Lease) looks for container groups of this
    /// cluster whose node and pod are both gone, and deletes them. 0 turns it off.
    #[arg(long, env = "ORPHAN_GC_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub orphan_gc_interval: Duration,

    /// Most orphaned container groups deleted per garbage-collection round.
    #[arg(long, env = "ORPHAN_GC_MAX_DELETIONS", default_value_t = 50)]
    pub orphan_gc_max_deletions: usize,
}

/// The admission area's flags: the Selector webhook (its Service and certificate Secret are
/// shared with placement, in [`SiteArgs`](super::SiteArgs)).
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionArgs {
    /// Serve the Selector admission webhook (and register it).
    #[arg(long = "webhook", env = "WEBHOOK_ENABLED")]
    pub webhook_enabled: bool,

    /// Where the webhook listens (HTTPS).
    #[arg(long, env = "WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,

    /// The webhook's path.
    #[arg(long, env = "WEBHOOK_PATH", default_value = "/mutate-pods")]
    pub webhook_path: String,

    /// The Service's port.
    #[arg(long, env = "WEBHOOK_SERVICE_PORT", default_value_t = 443)]
    pub webhook_service_port: u16,

    /// A directory with tls.crt, tls.key (and ca.crt) to serve, reloaded when they change (e.g.
    /// a cert-manager Secret). Without it the replicas share a generated certificate stored in
    /// WEBHOOK_SECRET.
    #[arg(long, env = "WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,

    /// The MutatingWebhookConfiguration the daemon keeps current.
    #[arg(
        long,
        env = "WEBHOOK_CONFIGURATION",
        default_value = "virtual-node-eci"
    )]
    pub webhook_configuration: String,

    /// The webhook's timeoutSeconds.
    #[arg(long, env = "WEBHOOK_TIMEOUT_SECONDS", default_value_t = 5)]
    pub webhook_timeout_seconds: i32,

    /// Namespaces never sent to the webhook (comma-separated; empty for none).
    #[arg(
        long,
        env = "WEBHOOK_SKIP_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    pub webhook_skip_namespaces: Vec<String>,

    /// Who may call the webhook (comma-separated user names; empty: any caller). A caller
    /// proves its name with a client certificate of the cluster's client CA or a bearer token
    /// the API server accepts. kube-apiserver presents credentials to webhooks only when its
    /// admission configuration names them (`--admission-control-config-file`, a
    /// WebhookAdmissionConfiguration's kubeConfigFile: docs/operations.md, Listeners).
    #[arg(long, env = "WEBHOOK_CALLERS", value_delimiter = ',')]
    pub webhook_callers: Vec<String>,

    /// Which pods a Selector changes: `namespace` — those of its own namespace, and a
    /// Selector in the daemon's namespace (POD_NAMESPACE) those of every namespace; `cluster`
    /// — every namespace's, wherever the Selector is (eci-profile's behaviour: only for
    /// clusters where whoever may create a Selector is trusted with every namespace).
    #[arg(long, env = "SELECTOR_SCOPE", value_enum, default_value = "namespace")]
    pub selector_scope: SelectorScope,

    /// The legacy eci-profile ConfigMap, `<namespace>/<name>`.
    #[arg(
        long,
        env = "ECI_PROFILE_CONFIGMAP",
        default_value = "kube-system/eci-profile"
    )]
    pub eci_profile_configmap: String,

    /// Turn off the built-in selectors (pods or namespaces labelled alibabacloud.com/eci=true,
    /// namespaces labelled virtual-node-affinity-injection=enabled go to virtual nodes).
    #[arg(long, env = "NO_DEFAULT_SELECTORS")]
    pub no_default_selectors: bool,
}

impl AdmissionArgs {
    /// The callers named (none: any caller may call).
    pub fn callers(&self) -> Vec<String> {
        let named = self.webhook_callers.iter().filter(|n| !n.is_empty());
        named.cloned().collect()
    }
}

/// The placement area's flags: ResourcePolicy and its scheduler extender.
#[derive(Debug, Clone, clap::Args)]
pub struct PlacementArgs {
    /// ResourcePolicy placement (`scheduling.alibabacloud.com/v1alpha1`): ordered units, caps,
    /// reverse-order scale-in. Idle until the CRD is installed.
    #[arg(long, env = "PLACEMENT_ENABLED", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub placement_enabled: bool,

    /// Serve kube-scheduler's extender for ResourcePolicy from the elected replica. `false`
    /// leaves placement to admission alone (the first unit with room, no waiting, no bind-time
    /// cap).
    #[arg(long, env = "PLACEMENT_EXTENDER", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub placement_extender: bool,

    /// Where the elected replica serves the extender (HTTPS).
    #[arg(long, env = "PLACEMENT_EXTENDER_ADDR", default_value = "0.0.0.0:10263")]
    pub placement_extender_addr: SocketAddr,

    /// A directory with tls.crt and tls.key for the extender (reloaded when they change).
    /// Without it the extender serves the webhook's certificate from WEBHOOK_SECRET.
    #[arg(long, env = "PLACEMENT_EXTENDER_CERT_DIR")]
    pub placement_extender_cert_dir: Option<PathBuf>,

    /// PEM bundle of the CA whose client certificates the extender accepts (kube-scheduler's;
    /// user = CN, groups = O). Default: the cluster's client CA, client-ca-file of
    /// kube-system/extension-apiserver-authentication. Bearer tokens are accepted too; either
    /// way the caller must be allowed to create pods/binding in every namespace.
    #[arg(long, env = "PLACEMENT_EXTENDER_CLIENT_CA_FILE")]
    pub placement_extender_client_ca_file: Option<PathBuf>,
}

/// The process-wide flags: probes, the read-only port, logs.
#[derive(Debug, Clone, clap::Args)]
pub struct OpsArgs {
    /// Address of the probes, /healthz and /readyz, in plain HTTP (the manifests use
    /// 0.0.0.0:10248; port 0 picks a free port). Unset: not served.
    #[arg(long, env = "HEALTH_ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// The read-only port, off unless set (e.g. 0.0.0.0:10255): /metrics, /healthz and /readyz
    /// in plain HTTP to anyone who can reach it, as the kubelet's read-only port. Opt in only
    /// where the network keeps it private.
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// Log format (level from RUST_LOG, default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// How many threads run the daemon's tasks. Unset or 0: one per CPU the process may use
    /// (its cgroup's CPU limit, else every core of the node). The manifests set it to the
    /// pod's CPU request rounded up (the downward API's requests.cpu; 0 without a request), so
    /// that a replica sized for a tenth of a core does not wake a thread on every core of its
    /// node.
    #[arg(long, env = "WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
}
