//! Who this replica is and where it runs: the flags several areas share, and the [`Site`]
//! they become once checked, handed to every area.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use super::{BackendChoice, ConfigError, TaintEffect, TransportPolicy, node_labels};

/// The flags naming this replica, its node, its cluster and where its groups run.
#[derive(Debug, Clone, clap::Args)]
pub struct SiteArgs {
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

    /// Cluster name (required, or ALIYUN_CLUSTERID): tagged on every container group, and a
    /// replica touches only groups tagged with it, so clusters sharing an ECI account never
    /// adopt or delete each other's groups. Unique per cluster, the same on every replica.
    #[arg(long, env = "ECI_CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// ACK cluster id, used as the cluster name when ECI_CLUSTER_NAME is not set.
    #[arg(long, env = "ALIYUN_CLUSTERID")]
    pub aliyun_cluster_id: Option<String>,

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

    /// The Service in front of the replicas (in POD_NAMESPACE) the API server calls.
    #[arg(long, env = "WEBHOOK_SERVICE", default_value = "virtual-node-eci")]
    pub webhook_service: String,

    /// The Secret (in POD_NAMESPACE) holding the shared generated certificate.
    #[arg(
        long,
        env = "WEBHOOK_SECRET",
        default_value = "virtual-node-eci-webhook-tls"
    )]
    pub webhook_secret: String,
}

/// The replica as every area sees it: [`SiteArgs`] checked, with what follows from them and
/// from the ECI backend chosen.
#[derive(Debug, Clone)]
pub struct Site {
    /// The node's name: NODE_NAME, else POD_NAME.
    pub node_name: String,
    /// This replica's pod (membership reads its StatefulSet, placement labels it).
    pub pod_name: Option<String>,
    /// The daemon's namespace: Leases, Secrets and ConfigMaps of the daemon live there.
    pub pod_namespace: String,
    /// The node's InternalIP (POD_IP), where its kubelet endpoint is.
    pub internal_ip: IpAddr,
    /// The kubelet port the node advertises.
    pub kubelet_port: u16,
    /// The cluster name tagged on groups: ECI_CLUSTER_NAME, else ALIYUN_CLUSTERID.
    pub cluster_name: String,
    /// The ECI region.
    pub region: String,
    /// The one zone the vSwitches are in, when given.
    pub zone: Option<String>,
    /// The vSwitch id(s) groups get their IPs from, as CreateContainerGroup takes them.
    pub vswitch: String,
    /// The groups' security group.
    pub security_group: String,
    /// The virtual nodes' taint key (the webhook and placement tolerate it).
    pub taint_key: String,
    /// Its value.
    pub taint_value: String,
    /// Its effect.
    pub taint_effect: TaintEffect,
    /// The administrator's extra node labels (`NODE_LABELS`), validated.
    pub node_labels: BTreeMap<String, String>,
    /// Which backend serves ECI.
    pub backend: BackendChoice,
    /// Whether ECI traffic may be plaintext (`--eci-allow-insecure-endpoint`).
    pub transport: TransportPolicy,
    /// The webhook's Service, whose names the certificate shared with the extender carries.
    pub webhook_service: String,
    /// The Secret holding that certificate.
    pub webhook_secret: String,
}

impl Site {
    /// Whether ECI's exec stream URIs may be `ws://`.
    pub fn stream_transport(&self) -> TransportPolicy {
        // The embedded mock-eci lives in this process and hands out streams on its own
        // loopback listener: nothing leaves the host, so plaintext needs no flag there.
        match self.backend {
            BackendChoice::Embedded => TransportPolicy::PlaintextAllowed,
            _ => self.transport,
        }
    }
}

impl SiteArgs {
    /// The node's name: NODE_NAME, else the pod's own name; a valid node name.
    pub(super) fn node_name(&self) -> Result<String, ConfigError> {
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

    /// The site of the node `node_name` served from `backend`; the rest of the flags checked.
    pub(super) fn checked(
        &self,
        node_name: String,
        backend: BackendChoice,
        transport: TransportPolicy,
    ) -> Result<Site, ConfigError> {
        let vswitch = self.vswitches()?;
        let security_group = self.security_group()?;
        if self.taint_key.is_empty() {
            return Err(ConfigError {
                flag: "--taint-key (VKUBELET_TAINT_KEY)",
                problem: "empty".into(),
                fix: "use e.g. k8s.aliyun.com/vnode",
            });
        }
        let cluster_name = self.cluster_name()?;
        let node_labels = node_labels::parse(&self.node_labels, &node_labels::SET_BY_DAEMON)
            .map_err(|problem| ConfigError {
                flag: "--node-labels (NODE_LABELS)",
                problem,
                fix: "give key=value pairs separated by commas, with keys of your own namespace (or under node.kubernetes.io/)",
            })?;
        Ok(Site {
            node_name,
            pod_name: self.pod_name.clone(),
            pod_namespace: self.pod_namespace.clone(),
            internal_ip: self.pod_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            kubelet_port: self.kubelet_port,
            cluster_name,
            region: self.region.clone(),
            zone: self.zone.clone().filter(|zone| !zone.trim().is_empty()),
            vswitch,
            security_group,
            taint_key: self.taint_key.clone(),
            taint_value: self.taint_value.clone(),
            taint_effect: self.taint_effect,
            node_labels,
            backend,
            transport,
            webhook_service: self.webhook_service.clone(),
            webhook_secret: self.webhook_secret.clone(),
        })
    }

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
}

/// `ECI_VSWITCH` as CreateContainerGroup takes it: 1 to 10 ids (ECI's limit per create),
/// comma-separated without blanks, each an id's characters.
pub(super) fn vswitch_list(value: &str) -> Result<String, String> {
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

pub(super) fn is_dns_subdomain(name: &str) -> bool {
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
