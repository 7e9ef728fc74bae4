//! Configuration: every flag is also an environment variable, with the names users of
//! ack-virtual-node and virtual-kubelet know.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

mod node_labels;
mod secret;
mod transport;

pub use node_labels::{
    SET_BY_DAEMON as NODE_LABELS_SET_BY_DAEMON, is_reserved as is_reserved_label,
};
pub use secret::Secret;
pub use transport::{AddressKind, Transport, TransportError, TransportPolicy};

/// Taint effects a node taint may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaintEffect {
    /// Pods without a toleration are not scheduled here.
    #[value(name = "NoSchedule")]
    NoSchedule,
    /// The scheduler avoids the node.
    #[value(name = "PreferNoSchedule")]
    PreferNoSchedule,
    /// Pods without a toleration are evicted.
    #[value(name = "NoExecute")]
    NoExecute,
}

impl TaintEffect {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Which namespaces' pods a `Selector` reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SelectorScope {
    /// Its own namespace's; a Selector in the daemon's namespace reaches every namespace.
    Namespace,
    /// Every namespace's, from any namespace (eci-profile's behaviour).
    Cluster,
}

/// virtual-node-eci: runs pods bound to its virtual node as Alibaba Cloud ECI container
/// groups. One process (one StatefulSet replica) serves one node.
#[derive(Debug, Clone, Parser)]
#[command(name = "virtual-node-eci", version, about, long_about = None)]
pub struct Config {
    /// Name of the virtual node. Defaults to the pod name (POD_NAME), so the StatefulSet
    /// replica virtual-node-eci-2 serves the node virtual-node-eci-2.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// This daemon's pod name (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,

    /// This daemon's namespace (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub pod_namespace: String,

    /// This daemon's pod IP (downward API `status.podIP`): the node's InternalIP.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<IpAddr>,

    /// The ECI backend: `embedded` (mock-eci in this process; only in builds with the
    /// `embedded-mock` feature, which the release image leaves out), `grpc://HOST:PORT` (a mock-eci
    /// process) or `openapi` (the real Alibaba Cloud API). Unset: `openapi`, which refuses to
    /// start without credentials (an AccessKey, ECI_CREDENTIALS_PATH or ECI_RAM_ROLE); the
    /// embedded mock runs only when named.
    #[arg(long, env = "ECI_BACKEND")]
    pub eci: Option<String>,

    /// OpenAPI endpoint (default `https://eci.<region>.aliyuncs.com`).
    #[arg(long, env = "ECI_ENDPOINT")]
    pub eci_endpoint: Option<String>,

    /// Let ECI traffic travel unencrypted: an `http://` ECI_ENDPOINT, a `grpc://` backend and
    /// `ws://` exec streams, which are refused otherwise (they would carry the AccessKey's
    /// signature, STS token and the pods' Secret values in the clear). Only for a mock-eci on
    /// loopback or inside the cluster; warned about at every start.
    #[arg(
        long,
        env = "ECI_ALLOW_INSECURE_ENDPOINT",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub eci_allow_insecure_endpoint: bool,

    /// An extra CA certificate (PEM) to trust for the OpenAPI endpoint, e.g. an egress proxy's.
    #[arg(long, env = "ECI_CA_FILE")]
    pub eci_ca_file: Option<PathBuf>,

    /// Deadline of one OpenAPI request.
    #[arg(long, env = "ECI_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub eci_request_timeout: Duration,

    /// AccessKey id for the OpenAPI.
    #[arg(long, env = "ECI_ACCESS_KEY", hide_env_values = true)]
    pub access_key: Option<String>,

    /// AccessKey secret for the OpenAPI (never logged).
    #[arg(long, env = "ECI_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<Secret>,

    /// STS security token to go with a temporary AccessKey (never logged).
    #[arg(long, env = "ECI_SECURITY_TOKEN", hide_env_values = true)]
    pub security_token: Option<Secret>,

    /// A file of `ECI_ACCESS_KEY=…`/`ECI_SECRET_KEY=…`[/`ECI_SECURITY_TOKEN=…`] lines, or a
    /// directory with one file per name (a mounted Secret); read again whenever it changes.
    #[arg(long, env = "ECI_CREDENTIALS_PATH")]
    pub credentials_path: Option<PathBuf>,

    /// RAM role attached to the instance, whose credentials come from the metadata service.
    #[arg(long, env = "ECI_RAM_ROLE")]
    pub ram_role: Option<String>,

    /// Instance metadata service (for ECI_RAM_ROLE).
    #[arg(
        long,
        env = "ECI_METADATA_ENDPOINT",
        default_value = "http://100.100.100.200"
    )]
    pub metadata_endpoint: String,

    /// ECI region, e.g. cn-hangzhou.
    #[arg(long, env = "ECI_REGION", default_value = "cn-hangzhou")]
    pub region: String,

    /// The zone the vSwitches are in, when they are all in one (becomes the node's
    /// topology.kubernetes.io/zone label).
    #[arg(long, env = "ECI_ZONE")]
    pub zone: Option<String>,

    /// vSwitch id(s) for container groups, comma-separated (required for `openapi`).
    #[arg(long, env = "ECI_VSWITCH")]
    pub vswitch: Option<String>,

    /// Security group id for container groups (required for `openapi`).
    #[arg(long, env = "ECI_SECURITY_GROUP")]
    pub security_group: Option<String>,

    /// Cluster name (required, or ALIYUN_CLUSTERID): tagged on every container group, and a
    /// replica touches only groups tagged with it, so clusters sharing an ECI account never
    /// adopt or delete each other's groups. Unique per cluster, the same on every replica.
    #[arg(long, env = "ECI_CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// ACK cluster id, used as the cluster name when ECI_CLUSTER_NAME is not set.
    #[arg(long, env = "ALIYUN_CLUSTERID")]
    pub aliyun_cluster_id: Option<String>,

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

    /// Key of the node's taint.
    #[arg(
        long,
        env = "VKUBELET_TAINT_KEY",
        default_value = "k8s.aliyun.com/vnode"
    )]
    pub taint_key: String,

    /// Value of the node's taint.
    #[arg(long, env = "VKUBELET_TAINT_VALUE", default_value = "true")]
    pub taint_value: String,

    /// Effect of the node's taint.
    #[arg(
        long,
        env = "VKUBELET_TAINT_EFFECT",
        value_enum,
        default_value = "NoSchedule"
    )]
    pub taint_effect: TaintEffect,

    /// Extra labels on every virtual node, as the kubelet's --node-labels takes them
    /// (`key=value,key=value`); keys in the kubernetes.io and k8s.io namespaces only under
    /// kubelet.kubernetes.io/ or node.kubernetes.io/, and none the daemon sets itself.
    #[arg(long, env = "NODE_LABELS", default_value = "")]
    pub node_labels: String,

    /// Port of the kubelet API, advertised as the node's kubelet endpoint.
    #[arg(long, env = "KUBELET_PORT", default_value_t = 10250)]
    pub kubelet_port: u16,

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

    /// Address of the probes, /healthz and /readyz, in plain HTTP (the manifests use
    /// 0.0.0.0:10248; port 0 picks a free port). Unset: not served.
    #[arg(long, env = "HEALTH_ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// The read-only port, off unless set (e.g. 0.0.0.0:10255): /metrics, /healthz and /readyz
    /// in plain HTTP to anyone who can reach it, as the kubelet's read-only port. Opt in only
    /// where the network keeps it private.
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

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

    /// Do not pace ECI calls by the documented per-action quotas (benchmarks against a
    /// mock-eci with its limits off).
    #[arg(long, env = "NO_ECI_CLIENT_RATE_LIMITS")]
    pub no_eci_client_rate_limits: bool,

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

    /// Serve the Selector admission webhook (and register it).
    #[arg(long = "webhook", env = "WEBHOOK_ENABLED")]
    pub webhook_enabled: bool,

    /// Where the webhook listens (HTTPS).
    #[arg(long, env = "WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,

    /// The webhook's path.
    #[arg(long, env = "WEBHOOK_PATH", default_value = "/mutate-pods")]
    pub webhook_path: String,

    /// The Service in front of the replicas (in POD_NAMESPACE) the API server calls.
    #[arg(long, env = "WEBHOOK_SERVICE", default_value = "virtual-node-eci")]
    pub webhook_service: String,

    /// The Service's port.
    #[arg(long, env = "WEBHOOK_SERVICE_PORT", default_value_t = 443)]
    pub webhook_service_port: u16,

    /// A directory with tls.crt, tls.key (and ca.crt) to serve, reloaded when they change (e.g.
    /// a cert-manager Secret). Without it the replicas share a generated certificate stored in
    /// WEBHOOK_SECRET.
    #[arg(long, env = "WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,

    /// The Secret (in POD_NAMESPACE) holding the shared generated certificate.
    #[arg(
        long,
        env = "WEBHOOK_SECRET",
        default_value = "virtual-node-eci-webhook-tls"
    )]
    pub webhook_secret: String,

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
    pub placement_extender_cert_dir: Option<std::path::PathBuf>,

    /// PEM bundle of the CA whose client certificates the extender accepts (kube-scheduler's;
    /// user = CN, groups = O). Default: the cluster's client CA, client-ca-file of
    /// kube-system/extension-apiserver-authentication. Bearer tokens are accepted too; either
    /// way the caller must be allowed to create pods/binding in every namespace.
    #[arg(long, env = "PLACEMENT_EXTENDER_CLIENT_CA_FILE")]
    pub placement_extender_client_ca_file: Option<std::path::PathBuf>,

    /// Log format (level from RUST_LOG, default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// What a stop signal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StopMode {
    /// Decide from the StatefulSet.
    Auto,
    /// Always a restart: leave the node and its pods to a successor.
    Restart,
    /// Always a decommission: drain, then delete the node.
    Decommission,
}

/// A configuration that cannot work, with the flag and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {problem}; {fix}")]
pub struct ConfigError {
    /// The flag (and environment variable) at fault.
    pub flag: &'static str,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: &'static str,
}

/// Which ECI backend to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendChoice {
    /// mock-eci inside this process.
    Embedded,
    /// A mock-eci (or compatible) gRPC endpoint, `http://host:port`.
    Grpc(String),
    /// The Alibaba Cloud OpenAPI.
    OpenApi,
}

impl Settings {
    /// The OpenAPI endpoint, without a trailing slash.
    pub fn openapi_endpoint(&self) -> String {
        self.config.eci_endpoint.as_deref().map_or_else(
            || format!("https://eci.{}.aliyuncs.com", self.config.region),
            |endpoint| endpoint.trim_end_matches('/').to_owned(),
        )
    }
}

/// The configuration after checking, with derived values.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The raw configuration.
    pub config: Config,
    /// The node name.
    pub node_name: String,
    /// The cluster name tagged on groups.
    pub cluster_name: String,
    /// The backend.
    pub backend: BackendChoice,
    /// The node's InternalIP.
    pub internal_ip: IpAddr,
    /// The vSwitch id(s) groups get their IPs from (`ECI_VSWITCH`), checked to be set.
    pub vswitch: String,
    /// The groups' security group (`ECI_SECURITY_GROUP`), checked to be set.
    pub security_group: String,
    /// The administrator's extra node labels (`NODE_LABELS`), validated.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// Whether ECI traffic may be plaintext (`--eci-allow-insecure-endpoint`).
    pub transport: TransportPolicy,
}

/// `ECI_VSWITCH` as CreateContainerGroup takes it: 1 to 10 ids (ECI's limit per create),
/// comma-separated without blanks, each an id's characters.
fn vswitch_list(value: &str) -> Result<String, String> {
    let ids: Vec<&str> = value.split(',').map(str::trim).collect();
    if let Some(bad) = ids
        .iter()
        .find(|id| id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    {
        return Err(format!("{bad:?} in {value:?} is not a vSwitch id"));
    }
    if ids.len() > 10 {
        return Err(format!(
            "{} vSwitches given, ECI takes at most 10",
            ids.len()
        ));
    }
    Ok(ids.join(","))
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A quota is an amount: a quantity of zero or more (the one parser, `k8s::quantity`).
fn is_quantity(text: &str) -> bool {
    crate::k8s::quantity::is_amount(text)
}

/// What the node area (registration, Lease, status, capacity) is given.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node name.
    pub node_name: String,
    /// The node's InternalIP (where its kubelet endpoint is).
    pub internal_ip: IpAddr,
    /// The cluster name tagged on groups (the ECI probe lists by it).
    pub cluster_name: String,
    /// The ECI region (node label, probe).
    pub region: String,
    /// The ECI zone, when pinned (node label).
    pub zone: Option<String>,
    /// The node taint's key.
    pub taint_key: String,
    /// The node taint's value.
    pub taint_value: String,
    /// The node taint's effect.
    pub taint_effect: TaintEffect,
    /// The administrator's extra node labels (`NODE_LABELS`, validated).
    pub extra_labels: std::collections::BTreeMap<String, String>,
    /// The advertised kubelet port.
    pub kubelet_port: u16,
    /// Advertised CPU capacity (a quantity).
    pub quota_cpu: String,
    /// Advertised memory capacity (a quantity).
    pub quota_memory: String,
    /// Advertised pod capacity.
    pub quota_pods: u32,
    /// Advertised ephemeral storage (a quantity).
    pub quota_ephemeral_storage: String,
    /// The Lease's duration.
    pub lease_duration_seconds: i32,
    /// How often the Lease is renewed.
    pub lease_renew_interval: Duration,
    /// How often ECI is probed.
    pub eci_probe_interval: Duration,
    /// How long ECI may fail before the node turns NotReady.
    pub eci_unreachable_threshold: Duration,
    /// The node status is written at least this often.
    pub node_status_max_interval: Duration,
}

/// What the fleet area (membership, decommission, orphan collection) is given.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The node name.
    pub node_name: String,
    /// The cluster name tagged on groups.
    pub cluster_name: String,
    /// The ECI region.
    pub region: String,
    /// This replica's pod name (membership reads its StatefulSet).
    pub pod_name: Option<String>,
    /// This replica's namespace.
    pub pod_namespace: String,
    /// Restart or decommission on stop.
    pub on_stop: StopMode,
    /// How long a decommission may take.
    pub drain_timeout: Duration,
    /// Whether a decommission evicts pods it does not manage.
    pub drain_evict_unmanaged_pods: bool,
    /// How often the orphan collector runs (zero: never).
    pub orphan_gc_interval: Duration,
    /// Deletions per collector round at most.
    pub orphan_gc_max_deletions: usize,
}

/// What the kubelet API area (HTTPS server, authentication, logs) is given.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// The node name (the SubjectAccessReview's `nodes/<name>`, the pods served).
    pub node_name: String,
    /// The node's InternalIP (what the serving certificate names).
    pub internal_ip: IpAddr,
    /// Where the API listens.
    pub listen: SocketAddr,
    /// A directory with tls.crt and tls.key to serve, when given.
    pub cert_dir: Option<PathBuf>,
    /// The client CA file, when given instead of the cluster's.
    pub client_ca_file: Option<PathBuf>,
    /// How often a log follower polls ECI while lines keep coming.
    pub log_poll_interval: Duration,
    /// The ECI region (every ECI request names it).
    pub region: String,
    /// The cluster name tagged on groups (a pod's group is looked up by it and the pod's UID).
    pub cluster_name: String,
    /// Whether ECI's exec stream URIs may be `ws://`.
    pub stream_transport: TransportPolicy,
}

/// What the ECI edge (backend choice, OpenAPI client, credentials, pacing) is given.
#[derive(Debug, Clone)]
pub struct EciConfig {
    /// Which backend serves ECI.
    pub backend: BackendChoice,
    /// The ECI region.
    pub region: String,
    /// The OpenAPI endpoint, without a trailing slash.
    pub openapi_endpoint: String,
    /// Per-request timeout of the OpenAPI client.
    pub request_timeout: Duration,
    /// An extra CA the OpenAPI client trusts.
    pub ca_file: Option<PathBuf>,
    /// A static AccessKey id.
    pub access_key: Option<String>,
    /// Its secret.
    pub secret_key: Option<Secret>,
    /// The STS token of a temporary key.
    pub security_token: Option<Secret>,
    /// A directory or file the credentials are read from (again when it changes).
    pub credentials_path: Option<PathBuf>,
    /// A RAM role whose credentials come from the instance metadata service.
    pub ram_role: Option<String>,
    /// The instance metadata service.
    pub metadata_endpoint: String,
    /// Whether the client paces itself by the documented quotas.
    pub client_rate_limits: bool,
}

/// What the pods area (controller, translation, tokens) is given.
#[derive(Debug, Clone)]
pub struct PodsConfig {
    /// The node whose pods these are.
    pub node_name: String,
    /// The cluster name tagged on groups.
    pub cluster_name: String,
    /// The ECI region.
    pub region: String,
    /// The vSwitch id(s) groups get their IPs from.
    pub vswitch: String,
    /// The groups' security group.
    pub security_group: String,
    /// Nameservers for `ClusterFirst` DNS.
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// Whether ECI pods get ClusterIP Service access (`ECI_KUBE_PROXY`).
    pub kube_proxy: bool,
    /// Whether running groups' file volumes follow their ConfigMaps and Secrets.
    pub volume_updates: bool,
    /// The apiserver address pods are told, when not the `default/kubernetes` Service's.
    pub kubernetes_service_host: Option<String>,
    /// Its port.
    pub kubernetes_service_port: Option<u16>,
    /// Creates in flight at most.
    pub max_concurrent_creates: usize,
    /// How often group statuses are polled.
    pub pod_status_poll_interval: Duration,
    /// How often every group is listed in full.
    pub pod_resync_interval: Duration,
    /// The daemon's namespace (where the annotation policy ConfigMap lives).
    pub pod_namespace: String,
    /// Only namespaces matching this label selector are served (`None`: all).
    pub namespace_selector: Option<String>,
    /// The annotation policy ConfigMap's name (`None`: no policy).
    pub annotation_policy_configmap: Option<String>,
    /// The one zone this node's vSwitches are in, when it is known (`ECI_ZONE`): a cloud
    /// disk of another zone cannot be attached here.
    pub zone: Option<String>,
}

/// What the admission area (Selector engine, webhook) is given.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// This replica's node (Events' reporter instance).
    pub node_name: String,
    /// The daemon's namespace (webhook Service and Secret live there).
    pub pod_namespace: String,
    /// The virtual nodes' taint key, tolerated by the pods the webhook sends to them.
    pub taint_key: String,
    /// Its value.
    pub taint_value: String,
    /// Its effect.
    pub taint_effect: TaintEffect,
    /// Where the webhook listens.
    pub webhook_addr: SocketAddr,
    /// The path the API server calls.
    pub webhook_path: String,
    /// The Service in front of the webhook.
    pub webhook_service: String,
    /// That Service's port.
    pub webhook_service_port: u16,
    /// A directory with tls.crt/tls.key (else a self-managed certificate).
    pub webhook_cert_dir: Option<PathBuf>,
    /// The Secret holding the self-managed certificate.
    pub webhook_secret: String,
    /// The MutatingWebhookConfiguration's name.
    pub webhook_configuration: String,
    /// The API server's timeout for a call.
    pub webhook_timeout_seconds: i32,
    /// Namespaces never mutated.
    pub webhook_skip_namespaces: Vec<String>,
    /// Who may call the webhook (empty: anyone).
    pub webhook_callers: Vec<String>,
    /// Which namespaces' pods a Selector reaches (the daemon's namespace is `pod_namespace`).
    pub selector_scope: SelectorScope,
    /// The legacy eci-profile ConfigMap (`namespace/name`).
    pub eci_profile_configmap: String,
    /// No built-in Selectors.
    pub no_default_selectors: bool,
}

/// What the image-cache area (the `ImageCache` reconciler) is given.
#[derive(Debug, Clone)]
pub struct ImageCacheConfig {
    /// This replica's node (the election's identity, Events' reporter instance).
    pub node_name: String,
    /// The daemon's namespace (election Lease).
    pub pod_namespace: String,
    /// The cluster name, tagged on every cache.
    pub cluster_name: String,
    /// The ECI region.
    pub region: String,
    /// The zone, when pinned.
    pub zone: Option<String>,
    /// The vSwitch id(s) the building instance gets its IP from.
    pub vswitch: String,
    /// Its security group.
    pub security_group: String,
}

/// What the placement area (ResourcePolicy) is given.
#[derive(Debug, Clone)]
pub struct PlacementConfig {
    /// This replica's node (the election's identity, Events' reporter instance).
    pub node_name: String,
    /// This replica's pod, labelled while it leads (the extender Service selects it).
    pub pod_name: Option<String>,
    /// The daemon's namespace (election Lease, certificate Secret).
    pub pod_namespace: String,
    /// The virtual nodes' label and taint.
    pub taint_key: String,
    /// Its value.
    pub taint_value: String,
    /// Its effect.
    pub taint_effect: TaintEffect,
    /// Serve the extender when elected.
    pub extender: bool,
    /// Where.
    pub extender_addr: SocketAddr,
    /// Its certificate files, if not the webhook's Secret.
    pub extender_cert_dir: Option<PathBuf>,
    /// The CA of its callers' client certificates, if not the cluster's client CA.
    pub extender_client_ca_file: Option<PathBuf>,
    /// The webhook's certificate Secret (shared with the extender).
    pub webhook_secret: String,
    /// The webhook's Service (the certificate's names).
    pub webhook_service: String,
}

impl Settings {
    /// What the image-cache area is given.
    pub fn image_cache(&self) -> ImageCacheConfig {
        let config = &self.config;
        ImageCacheConfig {
            node_name: self.node_name.clone(),
            pod_namespace: config.pod_namespace.clone(),
            cluster_name: self.cluster_name.clone(),
            region: config.region.clone(),
            zone: config.zone.clone(),
            vswitch: self.vswitch.clone(),
            security_group: self.security_group.clone(),
        }
    }

    /// The placement area's part.
    pub fn placement(&self) -> PlacementConfig {
        let config = &self.config;
        PlacementConfig {
            node_name: self.node_name.clone(),
            pod_name: config.pod_name.clone(),
            pod_namespace: config.pod_namespace.clone(),
            taint_key: config.taint_key.clone(),
            taint_value: config.taint_value.clone(),
            taint_effect: config.taint_effect,
            extender: config.placement_extender,
            extender_addr: config.placement_extender_addr,
            extender_cert_dir: config.placement_extender_cert_dir.clone(),
            extender_client_ca_file: config.placement_extender_client_ca_file.clone(),
            webhook_secret: config.webhook_secret.clone(),
            webhook_service: config.webhook_service.clone(),
        }
    }

    /// The admission area's part.
    pub fn admission(&self) -> AdmissionConfig {
        let config = &self.config;
        AdmissionConfig {
            node_name: self.node_name.clone(),
            pod_namespace: config.pod_namespace.clone(),
            taint_key: config.taint_key.clone(),
            taint_value: config.taint_value.clone(),
            taint_effect: config.taint_effect,
            webhook_addr: config.webhook_addr,
            webhook_path: config.webhook_path.clone(),
            webhook_service: config.webhook_service.clone(),
            webhook_service_port: config.webhook_service_port,
            webhook_cert_dir: config.webhook_cert_dir.clone(),
            webhook_secret: config.webhook_secret.clone(),
            webhook_configuration: config.webhook_configuration.clone(),
            webhook_timeout_seconds: config.webhook_timeout_seconds,
            webhook_skip_namespaces: config.webhook_skip_namespaces.clone(),
            webhook_callers: config
                .webhook_callers
                .iter()
                .filter(|n| !n.is_empty())
                .cloned()
                .collect(),
            selector_scope: config.selector_scope,
            eci_profile_configmap: config.eci_profile_configmap.clone(),
            no_default_selectors: config.no_default_selectors,
        }
    }

    /// The pods area's part.
    pub fn pods(&self) -> PodsConfig {
        let config = &self.config;
        PodsConfig {
            node_name: self.node_name.clone(),
            cluster_name: self.cluster_name.clone(),
            region: config.region.clone(),
            vswitch: self.vswitch.clone(),
            security_group: self.security_group.clone(),
            cluster_dns: config.cluster_dns.clone(),
            cluster_domain: config.cluster_domain.clone(),
            kube_proxy: config.kube_proxy,
            volume_updates: config.volume_updates,
            kubernetes_service_host: config.kubernetes_service_host.clone(),
            kubernetes_service_port: config.kubernetes_service_port,
            max_concurrent_creates: config.max_concurrent_creates,
            pod_status_poll_interval: config.pod_status_poll_interval,
            pod_resync_interval: config.pod_resync_interval,
            pod_namespace: config.pod_namespace.clone(),
            namespace_selector: config
                .namespace_selector
                .clone()
                .filter(|s| !s.trim().is_empty()),
            annotation_policy_configmap: config
                .annotation_policy_configmap
                .clone()
                .filter(|s| !s.trim().is_empty()),
            zone: config.zone.clone().filter(|zone| !zone.trim().is_empty()),
        }
    }

    /// The ECI edge's part.
    pub fn eci(&self) -> EciConfig {
        let config = &self.config;
        EciConfig {
            backend: self.backend.clone(),
            region: config.region.clone(),
            openapi_endpoint: self.openapi_endpoint(),
            request_timeout: config.eci_request_timeout,
            ca_file: config.eci_ca_file.clone(),
            access_key: config.access_key.clone(),
            secret_key: config.secret_key.clone(),
            security_token: config.security_token.clone(),
            credentials_path: config.credentials_path.clone(),
            ram_role: config.ram_role.clone(),
            metadata_endpoint: config.metadata_endpoint.clone(),
            client_rate_limits: !config.no_eci_client_rate_limits,
        }
    }

    /// The node area's part.
    pub fn node(&self) -> NodeConfig {
        let config = &self.config;
        NodeConfig {
            node_name: self.node_name.clone(),
            internal_ip: self.internal_ip,
            cluster_name: self.cluster_name.clone(),
            region: config.region.clone(),
            zone: config.zone.clone().filter(|zone| !zone.is_empty()),
            taint_key: config.taint_key.clone(),
            taint_value: config.taint_value.clone(),
            taint_effect: config.taint_effect,
            extra_labels: self.node_labels.clone(),
            kubelet_port: config.kubelet_port,
            quota_cpu: config.quota_cpu.clone(),
            quota_memory: config.quota_memory.clone(),
            quota_pods: config.quota_pods,
            quota_ephemeral_storage: config.quota_ephemeral_storage.clone(),
            lease_duration_seconds: config.lease_duration_seconds,
            lease_renew_interval: config.lease_renew_interval,
            eci_probe_interval: config.eci_probe_interval,
            eci_unreachable_threshold: config.eci_unreachable_threshold,
            node_status_max_interval: config.node_status_max_interval,
        }
    }

    /// The kubelet API area's part.
    pub fn kubelet(&self) -> KubeletConfig {
        let config = &self.config;
        KubeletConfig {
            node_name: self.node_name.clone(),
            internal_ip: self.internal_ip,
            listen: SocketAddr::new(
                config.kubelet_address.unwrap_or(self.internal_ip),
                config.kubelet_port,
            ),
            cert_dir: config.kubelet_cert_dir.clone(),
            client_ca_file: config.kubelet_client_ca_file.clone(),
            log_poll_interval: config.kubelet_log_poll_interval,
            region: config.region.clone(),
            cluster_name: self.cluster_name.clone(),
            // The embedded mock-eci lives in this process and hands out streams on its own
            // loopback listener: nothing leaves the host, so plaintext needs no flag there.
            stream_transport: match self.backend {
                BackendChoice::Embedded => TransportPolicy::PlaintextAllowed,
                _ => self.transport,
            },
        }
    }

    /// The fleet area's part.
    pub fn fleet(&self) -> FleetConfig {
        let config = &self.config;
        FleetConfig {
            node_name: self.node_name.clone(),
            cluster_name: self.cluster_name.clone(),
            region: config.region.clone(),
            pod_name: config.pod_name.clone(),
            pod_namespace: config.pod_namespace.clone(),
            on_stop: config.on_stop,
            drain_timeout: config.drain_timeout,
            drain_evict_unmanaged_pods: config.drain_evict_unmanaged_pods,
            orphan_gc_interval: config.orphan_gc_interval,
            orphan_gc_max_deletions: config.orphan_gc_max_deletions,
        }
    }
}

impl Config {
    /// The cluster name tagged on groups: required, as a default shared by every cluster on an
    /// account would let them adopt and delete each other's groups.
    fn cluster_name(&self) -> Result<String, ConfigError> {
        let name = self
            .cluster_name
            .clone()
            .or_else(|| self.aliyun_cluster_id.clone())
            .filter(|name| !name.is_empty())
            .ok_or(ConfigError {
                flag: "--cluster-name (ECI_CLUSTER_NAME, or ALIYUN_CLUSTERID)",
                problem: "not set".into(),
                fix: "give this cluster's id (on ACK, the cluster id), the same on every replica and unique among the clusters sharing the ECI account: replicas touch only the groups tagged with it",
            })?;
        if name.chars().count() > 128 {
            return Err(ConfigError {
                flag: "--cluster-name (ECI_CLUSTER_NAME, or ALIYUN_CLUSTERID)",
                problem: "longer than 128 characters".into(),
                fix: "use a shorter name: ECI tag values hold at most 128",
            });
        }
        Ok(name)
    }

    /// Refuses a backend reached in the clear unless `transport` allows it.
    fn check_transport(
        &self,
        backend: &BackendChoice,
        transport: TransportPolicy,
    ) -> Result<(), ConfigError> {
        const INSECURE_FIX: &str = "use an https:// endpoint, or for a mock-eci on loopback or inside the cluster pass --eci-allow-insecure-endpoint (ECI_ALLOW_INSECURE_ENDPOINT)";
        match backend {
            BackendChoice::Embedded => Ok(()),
            // Served without TLS: this build's gRPC client has none.
            BackendChoice::Grpc(endpoint) => match transport.check(endpoint, AddressKind::Endpoint)
            {
                Ok(_) => Ok(()),
                Err(_) => Err(ConfigError {
                    flag: "--eci (ECI_BACKEND)",
                    problem: format!(
                        "{:?} is plaintext gRPC: the pods' Secret values would travel unencrypted",
                        self.eci.clone().unwrap_or_default()
                    ),
                    fix: "use --eci openapi with an https:// endpoint, or for a mock-eci on loopback or inside the cluster pass --eci-allow-insecure-endpoint (ECI_ALLOW_INSECURE_ENDPOINT)",
                }),
            },
            BackendChoice::OpenApi => {
                let Some(endpoint) = &self.eci_endpoint else {
                    return Ok(()); // The default is Alibaba Cloud's https:// endpoint.
                };
                match transport.check(endpoint, AddressKind::Endpoint) {
                    Ok(_) => Ok(()),
                    Err(TransportError::Plaintext { address, .. }) => Err(ConfigError {
                        flag: "--eci-endpoint (ECI_ENDPOINT)",
                        problem: format!(
                            "{address:?} is plaintext http: the AccessKey signature, STS token and the pods' Secret values would travel unencrypted"
                        ),
                        fix: INSECURE_FIX,
                    }),
                    Err(TransportError::Scheme { address, .. }) => Err(ConfigError {
                        flag: "--eci-endpoint (ECI_ENDPOINT)",
                        problem: format!("{address:?} is not an http(s) URL"),
                        fix: "write e.g. https://eci.cn-hangzhou.aliyuncs.com",
                    }),
                }
            }
        }
    }

    /// Checks the configuration and derives the settings.
    pub fn settings(self) -> Result<Settings, ConfigError> {
        let node_name = self.node_name()?;
        let backend = self.backend()?;
        let transport = TransportPolicy::from_flag(self.eci_allow_insecure_endpoint);
        self.check_transport(&backend, transport)?;
        let vswitch = self.vswitches()?;
        let security_group = self.security_group()?;
        self.check_quotas()?;
        self.check_node_lease()?;
        self.check_health_intervals()?;
        self.check_pod_api_address()?;
        self.check_pacing()?;
        self.check_scope()?;
        let cluster_name = self.cluster_name()?;
        let internal_ip = self.pod_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let node_labels = node_labels::parse(&self.node_labels, &node_labels::SET_BY_DAEMON)
            .map_err(|problem| ConfigError {
                flag: "--node-labels (NODE_LABELS)",
                problem,
                fix: "give key=value pairs separated by commas, with keys of your own namespace (or under node.kubernetes.io/)",
            })?;
        Ok(Settings {
            node_labels,
            vswitch,
            security_group,
            node_name,
            cluster_name,
            backend,
            internal_ip,
            transport,
            config: self,
        })
    }

    /// The node's name: NODE_NAME, else the pod's own name; a valid node name.
    fn node_name(&self) -> Result<String, ConfigError> {
        let node_name = self
            .node_name
            .clone()
            .or_else(|| self.pod_name.clone())
            .filter(|name| !name.is_empty())
            .ok_or(ConfigError {
                flag: "--node-name (NODE_NAME)",
                problem: "no node name: neither NODE_NAME nor POD_NAME is set".into(),
                fix: "set POD_NAME from the downward API (metadata.name) in the StatefulSet, or pass --node-name",
            })?;
        if !is_dns_subdomain(&node_name) {
            return Err(ConfigError {
                flag: "--node-name (NODE_NAME)",
                problem: format!("{node_name:?} is not a valid node name"),
                fix: "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
            });
        }
        Ok(node_name)
    }

    /// Which ECI backend to talk to; the OpenAPI one needs credentials.
    fn backend(&self) -> Result<BackendChoice, ConfigError> {
        let has_credentials = (self.access_key.is_some() && self.secret_key.is_some())
            || self.credentials_path.is_some()
            || self.ram_role.is_some();
        let named = self
            .eci
            .clone()
            .filter(|name| !name.is_empty())
            // A build meant for Alibaba Cloud talks to Alibaba Cloud unless told otherwise: the
            // embedded mock runs only when asked for by name.
            .unwrap_or_else(|| "openapi".to_owned());
        let backend = match named.as_str() {
            "embedded" if cfg!(feature = "embedded-mock") => BackendChoice::Embedded,
            "embedded" => {
                return Err(ConfigError {
                    flag: "--eci (ECI_BACKEND)",
                    problem: "this build leaves the embedded mock-eci out".into(),
                    fix: "run mock-eci as a process of its own and use grpc://HOST:PORT \
                          (or build the daemon with the embedded-mock feature)",
                });
            }
            "openapi" => BackendChoice::OpenApi,
            other => match other.strip_prefix("grpc://") {
                Some(address) if !address.is_empty() => {
                    BackendChoice::Grpc(format!("http://{address}"))
                }
                _ => {
                    return Err(ConfigError {
                        flag: "--eci (ECI_BACKEND)",
                        problem: format!("{other:?} is not a backend"),
                        fix: "use embedded, grpc://HOST:PORT or openapi",
                    });
                }
            },
        };
        if backend == BackendChoice::OpenApi {
            if self.access_key.is_some() != self.secret_key.is_some() {
                return Err(ConfigError {
                    flag: "--access-key/--secret-key (ECI_ACCESS_KEY/ECI_SECRET_KEY)",
                    problem: "only one of the pair is set".into(),
                    fix: "set both, or neither and use ECI_CREDENTIALS_PATH or ECI_RAM_ROLE",
                });
            }
            if !has_credentials {
                return Err(ConfigError {
                    flag: "--eci openapi (ECI_BACKEND)",
                    problem: "no credentials".into(),
                    fix: "set ECI_ACCESS_KEY and ECI_SECRET_KEY, ECI_CREDENTIALS_PATH (a mounted Secret) or ECI_RAM_ROLE",
                });
            }
        }
        Ok(backend)
    }

    /// The vSwitch ids container groups get their IPs from.
    fn vswitches(&self) -> Result<String, ConfigError> {
        // Every backend needs them (mock-eci refuses a create without them, as ECI does): a
        // missing one is a configuration error now, not a failed pod later.
        let vswitch = self
            .vswitch
            .clone()
            .filter(|id| !id.is_empty())
            .ok_or(ConfigError {
                flag: "--vswitch (ECI_VSWITCH)",
                problem: "not set".into(),
                fix: "give the vSwitch id(s) container groups get their IPs from, comma-separated",
            })?;
        vswitch_list(&vswitch).map_err(|problem| ConfigError {
            flag: "--vswitch (ECI_VSWITCH)",
            problem,
            fix: "give 1 to 10 vSwitch ids of one VPC, comma-separated (several zones ride out one zone's lack of stock)",
        })
    }

    /// The security group of the container groups (needed by every backend, as the vSwitches).
    fn security_group(&self) -> Result<String, ConfigError> {
        self.security_group
            .clone()
            .filter(|id| !id.is_empty())
            .ok_or(ConfigError {
                flag: "--security-group (ECI_SECURITY_GROUP)",
                problem: "not set".into(),
                fix: "give the security group of the container groups",
            })
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

    /// The node's taint and its Lease: renewed at least twice per lease duration.
    fn check_node_lease(&self) -> Result<(), ConfigError> {
        if self.taint_key.is_empty() {
            return Err(ConfigError {
                flag: "--taint-key (VKUBELET_TAINT_KEY)",
                problem: "empty".into(),
                fix: "use e.g. k8s.aliyun.com/vnode",
            });
        }
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
        Ok(())
    }

    /// ECI health and pod resync intervals: each at least as long as what it builds on.
    fn check_health_intervals(&self) -> Result<(), ConfigError> {
        if self.eci_probe_interval.is_zero()
            || self.eci_unreachable_threshold < self.eci_probe_interval
        {
            return Err(ConfigError {
                flag: "--eci-unreachable-threshold (ECI_UNREACHABLE_THRESHOLD)",
                problem: "shorter than the probe interval".into(),
                fix: "make it at least --eci-probe-interval (defaults: 30s and 10s)",
            });
        }
        if self.pod_status_poll_interval.is_zero()
            || self.pod_resync_interval < self.pod_status_poll_interval
        {
            return Err(ConfigError {
                flag: "--pod-resync-interval (POD_RESYNC_INTERVAL)",
                problem: "shorter than the status poll interval".into(),
                fix: "make it at least --pod-status-poll-interval (defaults: 60s and 1s)",
            });
        }
        Ok(())
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

    /// Log polling and creation concurrency leave the daemon some pace.
    fn check_pacing(&self) -> Result<(), ConfigError> {
        if self.kubelet_log_poll_interval.is_zero() {
            return Err(ConfigError {
                flag: "--kubelet-log-poll-interval (KUBELET_LOG_POLL_INTERVAL)",
                problem: "0".into(),
                fix: "poll at most every few seconds, e.g. 1s (each poll is one DescribeContainerLog call)",
            });
        }
        if self.max_concurrent_creates == 0 {
            return Err(ConfigError {
                flag: "--max-concurrent-creates (MAX_CONCURRENT_CREATES)",
                problem: "0".into(),
                fix: "allow at least 1",
            });
        }
        Ok(())
    }

    /// Which namespaces are served, and where the annotation policy lives.
    fn check_scope(&self) -> Result<(), ConfigError> {
        if let Some(text) = &self.namespace_selector
            && let Err(error) = crate::k8s::label_selector::parse(text)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings of `args`, with a cluster name when they give none (every daemon needs
    /// one; the test about that uses [`parse_as_given`]).
    fn parse(args: &[&str]) -> Result<Settings, ConfigError> {
        let named = args
            .iter()
            .any(|a| a.starts_with("--cluster-name") || a.starts_with("--aliyun-cluster-id"));
        let mut all = args.to_vec();
        if !named {
            all.extend(["--cluster-name", "c"]);
        }
        parse_as_given(&all)
    }

    fn parse_as_given(args: &[&str]) -> Result<Settings, ConfigError> {
        let mut all = vec!["virtual-node-eci"];
        all.extend_from_slice(args);
        Config::try_parse_from(all).unwrap().settings()
    }

    /// The embedded mock, named, with the network every backend needs.
    const EMBEDDED: [&str; 6] = [
        "--eci",
        "embedded",
        "--vswitch",
        "vsw-1",
        "--security-group",
        "sg-1",
    ];

    fn parse_embedded(args: &[&str]) -> Result<Settings, ConfigError> {
        let mut all = EMBEDDED.to_vec();
        all.extend_from_slice(args);
        parse(&all)
    }

    #[test]
    fn node_name_comes_from_the_pod_name() {
        let settings = parse_embedded(&["--pod-name", "virtual-node-eci-2"]).unwrap();
        assert_eq!(settings.node_name, "virtual-node-eci-2");
        assert_eq!(settings.backend, BackendChoice::Embedded);
        assert_eq!(settings.cluster_name, "c");
        assert_eq!(
            (settings.vswitch.as_str(), settings.security_group.as_str()),
            ("vsw-1", "sg-1")
        );
        let explicit =
            parse_embedded(&["--pod-name", "virtual-node-eci-2", "--node-name", "vn-a"]).unwrap();
        assert_eq!(explicit.node_name, "vn-a");
    }

    #[test]
    fn the_real_backend_is_the_default_and_needs_its_network_and_credentials() {
        // Unset ECI_BACKEND means Alibaba Cloud: without credentials that is an error naming
        // the flags, never a silent fallback to the mock.
        let error = parse(&[
            "--node-name",
            "n",
            "--vswitch",
            "v",
            "--security-group",
            "s",
        ])
        .unwrap_err();
        assert_eq!(error.flag, "--eci openapi (ECI_BACKEND)");
        let error = parse(&[
            "--node-name",
            "n",
            "--access-key",
            "id",
            "--secret-key",
            "s",
        ])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "--vswitch (ECI_VSWITCH): not set; give the vSwitch id(s) container groups get their IPs from, comma-separated"
        );
        let error =
            parse(&["--node-name", "n", "--eci", "embedded", "--vswitch", "v"]).unwrap_err();
        assert_eq!(error.flag, "--security-group (ECI_SECURITY_GROUP)");
    }

    #[test]
    fn several_vswitches_are_accepted_as_eci_takes_them() {
        let cases: [(&str, Result<&str, &str>); 6] = [
            ("vsw-a", Ok("vsw-a")),
            ("vsw-a,vsw-b", Ok("vsw-a,vsw-b")),
            (" vsw-a , vsw-b ", Ok("vsw-a,vsw-b")),
            ("vsw-a,,vsw-b", Err("\"\" in")),
            ("vsw-a;vsw-b", Err("is not a vSwitch id")),
            ("v1,v2,v3,v4,v5,v6,v7,v8,v9,v10,v11", Err("11 vSwitches")),
        ];
        for (value, expected) in cases {
            match (vswitch_list(value), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{value}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{value}: {got}"),
                (got, want) => panic!("{value}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn bad_configuration_names_the_flag_and_the_fix() {
        let error = parse(&[]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--node-name (NODE_NAME): no node name"),
            "{error}"
        );
        assert!(error.to_string().contains("downward API"));
        let error = parse_embedded(&["--node-name", "Bad_Name"]).unwrap_err();
        assert_eq!(error.flag, "--node-name (NODE_NAME)");
        let error = parse(&["--node-name", "n", "--eci", "tcp://x"]).unwrap_err();
        assert_eq!(error.flag, "--eci (ECI_BACKEND)");
        let error = parse(&[
            "--node-name",
            "n",
            "--access-key",
            "id",
            "--secret-key",
            "s",
        ])
        .unwrap_err();
        assert_eq!(error.flag, "--vswitch (ECI_VSWITCH)");
        let error = parse_embedded(&["--node-name", "n", "--quota-memory", "lots"]).unwrap_err();
        assert!(error.to_string().contains("not a Kubernetes quantity"));
        let error =
            parse_embedded(&["--node-name", "n", "--lease-renew-interval", "30s"]).unwrap_err();
        assert!(error.flag.starts_with("--lease-renew-interval"));
    }

    #[test]
    fn cluster_access_from_eci_pods() {
        let defaults = parse_embedded(&["--node-name", "n"]).unwrap();
        assert!(
            defaults.config.kube_proxy,
            "ECI_KUBE_PROXY is on by default"
        );
        assert_eq!(defaults.config.kubernetes_service_host, None);
        assert_eq!(defaults.config.kubernetes_service_port, None);
        let set = parse_embedded(&[
            "--node-name",
            "n",
            "--kube-proxy",
            "false",
            "--kubernetes-service-host",
            "192.168.0.10",
            "--kubernetes-service-port",
            "6443",
        ])
        .unwrap();
        assert!(!set.config.kube_proxy);
        assert_eq!(
            set.config.kubernetes_service_host.as_deref(),
            Some("192.168.0.10")
        );
        assert_eq!(set.config.kubernetes_service_port, Some(6443));
        for bad in ["https://192.168.0.10", "10.0.0.1/6443", ""] {
            let error = parse_embedded(&["--node-name", "n", "--kubernetes-service-host", bad])
                .unwrap_err();
            assert!(
                error.flag.starts_with("--kubernetes-service-host"),
                "{bad}: {error}"
            );
        }
        let error =
            parse_embedded(&["--node-name", "n", "--kubernetes-service-port", "0"]).unwrap_err();
        assert!(error.flag.starts_with("--kubernetes-service-port"));
    }

    #[test]
    fn backends_and_cluster_names() {
        let grpc = parse(&[
            "--node-name=n",
            "--eci=grpc://127.0.0.1:50051",
            "--eci-allow-insecure-endpoint",
            "--vswitch=v",
            "--security-group=s",
        ])
        .unwrap();
        assert_eq!(
            grpc.backend,
            BackendChoice::Grpc("http://127.0.0.1:50051".into())
        );
        let ack = parse_embedded(&["--node-name", "n", "--aliyun-cluster-id", "c-123"]).unwrap();
        assert_eq!(ack.cluster_name, "c-123");
        let named = parse_embedded(&[
            "--node-name",
            "n",
            "--aliyun-cluster-id",
            "c-123",
            "--cluster-name",
            "prod",
        ])
        .unwrap();
        assert_eq!(named.cluster_name, "prod");
    }

    #[test]
    fn without_a_cluster_name_the_daemon_refuses_to_start() {
        // Two clusters on one account both defaulting to one name adopted and deleted each
        // other's groups: there is no default.
        let network = [
            "--eci",
            "embedded",
            "--node-name",
            "n",
            "--vswitch",
            "v",
            "--security-group",
            "s",
        ];
        for missing in [
            &[][..],
            &["--cluster-name", ""],
            &["--aliyun-cluster-id", ""],
        ] {
            let mut args = network.to_vec();
            args.extend_from_slice(missing);
            let error = parse_as_given(&args).unwrap_err();
            assert_eq!(
                error.flag, "--cluster-name (ECI_CLUSTER_NAME, or ALIYUN_CLUSTERID)",
                "{missing:?}"
            );
            assert!(!error.to_string().contains('\n'), "one line: {error}");
        }
        let long = "c".repeat(129);
        let mut args = network.to_vec();
        args.extend(["--cluster-name", long.as_str()]);
        assert!(parse_as_given(&args).unwrap_err().problem.contains("128"));
    }

    #[test]
    fn credentials_select_the_openapi_backend() {
        let base = [
            "--node-name",
            "n",
            "--vswitch",
            "vsw-1",
            "--security-group",
            "sg-1",
        ];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            parse(&args)
        };
        let auto = with(&["--access-key", "id", "--secret-key", "s"]).unwrap();
        assert_eq!(auto.backend, BackendChoice::OpenApi);
        assert_eq!(
            auto.openapi_endpoint(),
            "https://eci.cn-hangzhou.aliyuncs.com"
        );
        let shown = format!("{:?}", auto.config);
        assert!(
            !shown.contains("secret-key\", \"s\"") && shown.contains("<redacted>"),
            "{shown}"
        );
        assert_eq!(
            with(&[
                "--ram-role",
                "EciRole",
                "--eci-endpoint",
                "https://127.0.0.1:9/"
            ])
            .unwrap()
            .openapi_endpoint(),
            "https://127.0.0.1:9"
        );
        assert_eq!(
            with(&["--credentials-path", "/etc/eci", "--eci", "embedded"])
                .unwrap()
                .backend,
            BackendChoice::Embedded
        );
        assert_eq!(
            with(&["--eci", "embedded"]).unwrap().backend,
            BackendChoice::Embedded
        );
        let half = with(&["--eci", "openapi", "--access-key", "id"]).unwrap_err();
        assert!(half.flag.contains("ECI_SECRET_KEY"), "{half}");
        let none = with(&["--eci", "openapi"]).unwrap_err();
        assert!(none.fix.contains("ECI_RAM_ROLE"), "{none}");
        let bad = with(&[
            "--access-key",
            "id",
            "--secret-key",
            "s",
            "--eci-endpoint",
            "eci.example",
        ])
        .unwrap_err();
        assert_eq!(bad.flag, "--eci-endpoint (ECI_ENDPOINT)");
    }

    #[test]
    fn plaintext_backends_need_the_insecure_flag() {
        use TransportPolicy::{EncryptedOnly, PlaintextAllowed};
        let base = [
            "--node-name",
            "n",
            "--vswitch",
            "v",
            "--security-group",
            "s",
            "--access-key",
            "id",
            "--secret-key",
            "not-a-real-secret",
        ];
        let openapi = |endpoint: &'static str| -> Vec<&'static str> {
            vec!["--eci", "openapi", "--eci-endpoint", endpoint]
        };
        let grpc = vec!["--eci", "grpc://127.0.0.1:50051"];
        let https = openapi("https://eci.example");
        let http = openapi("http://127.0.0.1:8080");
        let upper_http = openapi("HTTP://127.0.0.1:8080");
        let embedded = vec!["--eci", "embedded"];
        let default = vec!["--eci", "openapi"];
        // (backend flags, extra flags, Ok(transport, kubelet stream policy) or Err(flag at fault))
        type Want = Result<(TransportPolicy, TransportPolicy), &'static str>;
        let table: Vec<(&Vec<&str>, &[&str], Want)> = vec![
            (&default, &[], Ok((EncryptedOnly, EncryptedOnly))),
            (&https, &[], Ok((EncryptedOnly, EncryptedOnly))),
            (&http, &[], Err("--eci-endpoint (ECI_ENDPOINT)")),
            (&upper_http, &[], Err("--eci-endpoint (ECI_ENDPOINT)")),
            (&grpc, &[], Err("--eci (ECI_BACKEND)")),
            (&embedded, &[], Ok((EncryptedOnly, PlaintextAllowed))),
            (
                &http,
                &["--eci-allow-insecure-endpoint"],
                Ok((PlaintextAllowed, PlaintextAllowed)),
            ),
            (
                &grpc,
                &["--eci-allow-insecure-endpoint=true"],
                Ok((PlaintextAllowed, PlaintextAllowed)),
            ),
            (
                &https,
                &["--eci-allow-insecure-endpoint"],
                Ok((PlaintextAllowed, PlaintextAllowed)),
            ),
            (
                &grpc,
                &["--eci-allow-insecure-endpoint=false"],
                Err("--eci (ECI_BACKEND)"),
            ),
        ];
        for (backend, extra, want) in table {
            let mut args = base.to_vec();
            args.extend_from_slice(backend);
            args.extend_from_slice(extra);
            let got = parse(&args)
                .map(|settings| (settings.transport, settings.kubelet().stream_transport))
                .map_err(|error| {
                    assert!(
                        error.fix.contains("--eci-allow-insecure-endpoint"),
                        "{args:?}: {error}"
                    );
                    assert!(!error.to_string().contains("not-a-real-secret"), "{error}");
                    error.flag
                });
            assert_eq!(got, want, "{args:?}");
        }
    }

    #[test]
    fn the_kubelet_api_listens_where_the_node_advertises_it() {
        let defaults = parse_embedded(&["--node-name", "n", "--pod-ip", "10.1.2.3"]).unwrap();
        let kubelet = defaults.kubelet();
        assert_eq!(kubelet.listen, "10.1.2.3:10250".parse().unwrap());
        assert_eq!(kubelet.listen.port(), defaults.node().kubelet_port);
        assert_eq!(kubelet.listen.ip(), defaults.node().internal_ip);
        assert_eq!(kubelet.log_poll_interval, Duration::from_secs(1));
        let set = parse_embedded(&[
            "--node-name",
            "n",
            "--kubelet-port",
            "11250",
            "--kubelet-address",
            "0.0.0.0",
            "--kubelet-cert-dir",
            "/etc/kubelet-tls",
        ])
        .unwrap()
        .kubelet();
        assert_eq!(set.listen, "0.0.0.0:11250".parse().unwrap());
        assert_eq!(set.cert_dir, Some(PathBuf::from("/etc/kubelet-tls")));
        let error =
            parse_embedded(&["--node-name", "n", "--kubelet-log-poll-interval", "0s"]).unwrap_err();
        assert!(error.flag.starts_with("--kubelet-log-poll-interval"));
    }

    #[test]
    fn quantities() {
        for good in ["6000", "500m", "12Ti", "1.5", "64Gi"] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in ["", "Ti", "12TB", "-1"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
