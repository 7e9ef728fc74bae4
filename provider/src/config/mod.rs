//! Configuration: every flag is also an environment variable, with the names users of
//! ack-virtual-node and virtual-kubelet know. The flags come in groups, one per area and one
//! for what several areas share; [`Config::settings`] checks them and derives the [`Site`]
//! every area is given with its own group.

use std::sync::Arc;

use clap::{Parser, ValueEnum};

mod area_flags;
mod eci_flags;
mod node_labels;
mod secret;
mod site;
mod transport;

pub use area_flags::{
    AdmissionArgs, FleetArgs, KubeletArgs, NodeArgs, OpsArgs, PlacementArgs, PodsArgs,
};
pub use eci_flags::EciArgs;
pub use node_labels::{
    SET_BY_DAEMON as NODE_LABELS_SET_BY_DAEMON, is_reserved as is_reserved_label,
};
pub use secret::Secret;
pub use site::{Site, SiteArgs};
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
    /// Who this replica is and where its groups run.
    #[command(flatten)]
    pub site: SiteArgs,
    /// The ECI edge.
    #[command(flatten)]
    pub eci: EciArgs,
    /// The node area.
    #[command(flatten)]
    pub node: NodeArgs,
    /// The kubelet API.
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    /// The pods area.
    #[command(flatten)]
    pub pods: PodsArgs,
    /// The fleet area.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// The admission area.
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// The placement area.
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Probes, metrics and logs.
    #[command(flatten)]
    pub ops: OpsArgs,
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

/// The configuration after checking: the flags and the [`Site`] they give.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The flags as given.
    pub config: Config,
    /// The replica as every area sees it.
    pub site: Arc<Site>,
}

impl Settings {
    /// What the area of the flags `args` is given.
    pub fn with_site<A: Clone>(&self, args: &A) -> WithSite<A> {
        WithSite {
            site: Arc::clone(&self.site),
            args: args.clone(),
        }
    }
}

/// What an area is given: the [`Site`] all areas share and its own flags.
#[derive(Debug, Clone)]
pub struct WithSite<A> {
    /// The replica as every area sees it.
    pub site: Arc<Site>,
    /// The area's flags.
    pub args: A,
}

impl Config {
    /// Checks the configuration and derives the settings.
    pub fn settings(self) -> Result<Settings, ConfigError> {
        let node_name = self.site.node_name()?;
        let (backend, transport) = self.eci.backend()?;
        let site = self.site.checked(node_name, backend, transport)?;
        self.node.check()?;
        self.kubelet.check()?;
        self.pods.check()?;
        Ok(Settings {
            config: self,
            site: Arc::new(site),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::area_flags::is_quantity;
    use super::site::vswitch_list;
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
        assert_eq!(settings.site.node_name, "virtual-node-eci-2");
        assert_eq!(settings.site.backend, BackendChoice::Embedded);
        assert_eq!(settings.site.cluster_name, "c");
        assert_eq!(
            (
                settings.site.vswitch.as_str(),
                settings.site.security_group.as_str()
            ),
            ("vsw-1", "sg-1")
        );
        let explicit =
            parse_embedded(&["--pod-name", "virtual-node-eci-2", "--node-name", "vn-a"]).unwrap();
        assert_eq!(explicit.site.node_name, "vn-a");
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
            defaults.config.pods.kube_proxy,
            "ECI_KUBE_PROXY is on by default"
        );
        assert_eq!(defaults.config.pods.kubernetes_service_host, None);
        assert_eq!(defaults.config.pods.kubernetes_service_port, None);
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
        assert!(!set.config.pods.kube_proxy);
        assert_eq!(
            set.config.pods.kubernetes_service_host.as_deref(),
            Some("192.168.0.10")
        );
        assert_eq!(set.config.pods.kubernetes_service_port, Some(6443));
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
            grpc.site.backend,
            BackendChoice::Grpc("http://127.0.0.1:50051".into())
        );
        let ack = parse_embedded(&["--node-name", "n", "--aliyun-cluster-id", "c-123"]).unwrap();
        assert_eq!(ack.site.cluster_name, "c-123");
        let named = parse_embedded(&[
            "--node-name",
            "n",
            "--aliyun-cluster-id",
            "c-123",
            "--cluster-name",
            "prod",
        ])
        .unwrap();
        assert_eq!(named.site.cluster_name, "prod");
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
        assert_eq!(auto.site.backend, BackendChoice::OpenApi);
        assert_eq!(
            auto.config.eci.openapi_endpoint(&auto.site.region),
            "https://eci.cn-hangzhou.aliyuncs.com"
        );
        let shown = format!("{:?}", auto.config);
        assert!(
            !shown.contains("secret-key\", \"s\"") && shown.contains("<redacted>"),
            "{shown}"
        );
        let pinned = with(&[
            "--ram-role",
            "EciRole",
            "--eci-endpoint",
            "https://127.0.0.1:9/",
        ])
        .unwrap();
        assert_eq!(
            pinned.config.eci.openapi_endpoint(&pinned.site.region),
            "https://127.0.0.1:9"
        );
        assert_eq!(
            with(&["--credentials-path", "/etc/eci", "--eci", "embedded"])
                .unwrap()
                .site
                .backend,
            BackendChoice::Embedded
        );
        assert_eq!(
            with(&["--eci", "embedded"]).unwrap().site.backend,
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
                .map(|settings| (settings.site.transport, settings.site.stream_transport()))
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
        let (kubelet, site) = (&defaults.config.kubelet, &defaults.site);
        assert_eq!(kubelet.listen(site), "10.1.2.3:10250".parse().unwrap());
        assert_eq!(kubelet.listen(site).port(), site.kubelet_port);
        assert_eq!(kubelet.listen(site).ip(), site.internal_ip);
        assert_eq!(kubelet.kubelet_log_poll_interval, Duration::from_secs(1));
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
        .unwrap();
        let kubelet = &set.config.kubelet;
        assert_eq!(kubelet.listen(&set.site), "0.0.0.0:11250".parse().unwrap());
        assert_eq!(
            kubelet.kubelet_cert_dir,
            Some(PathBuf::from("/etc/kubelet-tls"))
        );
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
