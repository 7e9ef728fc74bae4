//! Command-line configuration; every flag is also an environment variable (`MOCK_ECI_*`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::actions::Action;
use crate::clock::millis;
use crate::service::controls::{Fault, RateLimit};
use crate::settings::{Cidr, DelayRange, Settings};

/// A local fake of the Alibaba Cloud ECI API (2018-08-08), served over gRPC.
#[derive(Debug, Clone, Parser)]
#[command(name = "mock-eci", version, about, long_about = None)]
pub struct MockConfig {
    /// Address the gRPC API listens on (port 0 picks a free port; the address is logged).
    #[arg(long, env = "MOCK_ECI_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Address of the admin HTTP endpoint: /healthz, /metrics (Prometheus), /admin/controls
    /// (GET, PATCH: rate limits, faults, outage, stock), /admin/groups. Off when unset.
    #[arg(long, env = "MOCK_ECI_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,

    /// Also serve the ECI OpenAPI (signed HTTPS, JSON) here, for the daemon's `--eci openapi`
    /// client. Off when unset.
    #[arg(long, env = "MOCK_ECI_OPENAPI_LISTEN")]
    pub openapi_listen: Option<SocketAddr>,

    /// The OpenAPI front's certificate directory: `ca.pem`, `tls.crt` and `tls.key` are used
    /// when present, else generated and written there (clients trust `ca.pem`; a restart keeps
    /// it). Without it the certificate is generated in memory only.
    #[arg(long, env = "MOCK_ECI_OPENAPI_TLS_DIR")]
    pub openapi_tls_dir: Option<PathBuf>,

    /// The AccessKey id the OpenAPI front accepts.
    #[arg(
        long,
        env = "MOCK_ECI_OPENAPI_ACCESS_KEY_ID",
        default_value = "mock-access-key-id"
    )]
    pub openapi_access_key_id: String,

    /// The AccessKey secret the OpenAPI front verifies signatures with.
    #[arg(
        long,
        env = "MOCK_ECI_OPENAPI_ACCESS_KEY_SECRET",
        default_value = "mock-access-key-secret",
        hide_env_values = true
    )]
    pub openapi_access_key_secret: String,

    /// When set, OpenAPI requests must carry this STS SecurityToken.
    #[arg(long, env = "MOCK_ECI_OPENAPI_SECURITY_TOKEN", hide_env_values = true)]
    pub openapi_security_token: Option<String>,

    /// The region served; requests for another region fail with InvalidRegionId.NotFound.
    #[arg(long, env = "MOCK_ECI_REGION", default_value = "cn-hangzhou")]
    pub region: String,

    /// The zone groups are placed in when the request names none.
    #[arg(long, env = "MOCK_ECI_ZONE", default_value = "cn-hangzhou-k")]
    pub zone: String,

    /// Time from creation to Running: fixed (`3s`) or a range (`2s..8s`, a deterministic value
    /// per group).
    #[arg(long, env = "MOCK_ECI_PROVISIONING_DELAY", default_value = "2s..4s")]
    pub provisioning_delay: DelayRange,

    /// Time from creation to Running of a group created from a Ready image cache (its images
    /// need no pull); never longer than `--provisioning-delay` would have been.
    #[arg(long, env = "MOCK_ECI_CACHED_PROVISIONING_DELAY", default_value = "1s")]
    pub cached_provisioning_delay: DelayRange,

    /// Time an image cache takes from CreateImageCache (or an UpdateImageCache with new
    /// images) to Ready or Failed.
    #[arg(
        long,
        env = "MOCK_ECI_IMAGE_CACHE_CREATION_DELAY",
        default_value = "10s..20s"
    )]
    pub image_cache_creation_delay: DelayRange,

    /// Time from creation to Scheduling (when capacity and the IP are claimed).
    #[arg(long, env = "MOCK_ECI_SCHEDULING_DELAY", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub scheduling_delay: Duration,

    /// How long an init container runs when its variables say nothing.
    #[arg(long, env = "MOCK_ECI_INIT_CONTAINER_DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub init_container_duration: Duration,

    /// First restart back-off of a crashed container; doubles per restart.
    #[arg(long, env = "MOCK_ECI_RESTART_BACKOFF", default_value = "10s", value_parser = humantime::parse_duration)]
    pub restart_backoff: Duration,

    /// Longest restart back-off.
    #[arg(long, env = "MOCK_ECI_MAX_RESTART_BACKOFF", default_value = "5m", value_parser = humantime::parse_duration)]
    pub max_restart_backoff: Duration,

    /// Longest termination grace period honoured on delete (requests may ask for more).
    #[arg(long, env = "MOCK_ECI_MAX_GRACE_PERIOD", default_value = "5m", value_parser = humantime::parse_duration)]
    pub max_grace_period: Duration,

    /// How long a container takes to exit after SIGTERM when its own `MOCK_ECI_STOP_AFTER`
    /// does not say; unset, it uses the whole grace period (it ignores SIGTERM).
    #[arg(long, env = "MOCK_ECI_STOP_AFTER_SIGTERM", value_parser = humantime::parse_duration)]
    pub stop_after_sigterm: Option<Duration>,

    /// How long finished groups (Succeeded, Failed, ScheduleFailed, Expired) stay visible.
    #[arg(long, env = "MOCK_ECI_RETENTION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub retention: Duration,

    /// The block intranet IPs come from; when it is exhausted new groups end ScheduleFailed.
    #[arg(long, env = "MOCK_ECI_IP_CIDR", default_value = "192.168.0.0/16")]
    pub ip_cidr: Cidr,

    /// Serve a TCP echo on every declared container port of running groups, at the group's IP
    /// (port-forward tests; give an `--ip-cidr` of this host, e.g. 127.77.0.0/16).
    #[arg(long, env = "MOCK_ECI_PORT_ECHO")]
    pub port_echo: bool,

    /// Most groups holding capacity at once; beyond it new groups end ScheduleFailed.
    #[arg(long, env = "MOCK_ECI_MAX_GROUPS")]
    pub max_groups: Option<usize>,

    /// Start with "no stock": every new group ends ScheduleFailed (switchable at run time).
    #[arg(long, env = "MOCK_ECI_NO_STOCK")]
    pub no_stock: bool,

    /// The zone of a vSwitch: `VSWITCH=ZONE`, e.g. `vsw-a=cn-hangzhou-a`. Repeatable;
    /// comma-separated in the environment variable. A vSwitch not given is in `--zone`.
    #[arg(long = "vswitch-zone", env = "MOCK_ECI_VSWITCH_ZONES", value_delimiter = ',', value_parser = parse_vswitch_zone)]
    pub vswitch_zones: Vec<(String, String)>,

    /// A zone without stock: creates land in another zone they list, or are refused
    /// `OperationDenied.NoStock` (switchable at run time). Repeatable; comma-separated in the
    /// environment variable.
    #[arg(
        long = "no-stock-zone",
        env = "MOCK_ECI_NO_STOCK_ZONES",
        value_delimiter = ','
    )]
    pub no_stock_zones: Vec<String>,

    /// Turn the per-action rate limits off (they default to the documented quotas).
    #[arg(long, env = "MOCK_ECI_NO_RATE_LIMITS")]
    pub no_rate_limits: bool,

    /// Override a rate limit: `Action=PER_MINUTE[/BURST]`, e.g. `CreateContainerGroup=100/10`.
    /// Repeatable; comma-separated in the environment variable.
    #[arg(long = "rate-limit", env = "MOCK_ECI_RATE_LIMITS", value_delimiter = ',', value_parser = parse_rate_limit)]
    pub rate_limits: Vec<(Action, RateLimit)>,

    /// Inject errors: `Action=RATE[:CODE]` (Action may be `*`), e.g.
    /// `CreateContainerGroup=0.1:InternalError`. Repeatable.
    #[arg(long = "fault", env = "MOCK_ECI_FAULTS", value_delimiter = ',', value_parser = parse_fault)]
    pub faults: Vec<(String, f64, String)>,

    /// Inject latency: `Action=DURATION` (Action may be `*`), e.g. `*=50ms`. Repeatable.
    #[arg(long = "latency", env = "MOCK_ECI_LATENCY", value_delimiter = ',', value_parser = parse_latency)]
    pub latency: Vec<(String, Duration)>,

    /// Refuse creates naming this RAM role (`RamRoleName`) with `Forbidden.RAM`, HTTP 403, as
    /// the service refuses a role the caller may not pass. Repeatable.
    #[arg(
        long = "deny-ram-role",
        env = "MOCK_ECI_DENY_RAM_ROLES",
        value_delimiter = ','
    )]
    pub deny_ram_roles: Vec<String>,

    /// Refuse creates in this security group (`SecurityGroupId`) the same way. Repeatable.
    #[arg(
        long = "deny-security-group",
        env = "MOCK_ECI_DENY_SECURITY_GROUPS",
        value_delimiter = ','
    )]
    pub deny_security_groups: Vec<String>,

    /// Keep the groups in this file so they survive a restart (written shortly after every
    /// change and on shutdown; loaded at start).
    #[arg(long, env = "MOCK_ECI_STATE_FILE")]
    pub state_file: Option<PathBuf>,

    /// Longest time a change waits before it is written to the state file.
    #[arg(long, env = "MOCK_ECI_STATE_FLUSH_INTERVAL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub state_flush_interval: Duration,

    /// Seed for ids, per-group delays and injected-fault draws.
    #[arg(long, env = "MOCK_ECI_SEED", default_value_t = 0)]
    pub seed: u64,

    /// Log as JSON lines instead of text (level from RUST_LOG, default info).
    #[arg(long, env = "MOCK_ECI_LOG_JSON")]
    pub log_json: bool,

    /// How containers run: `simulated` (timers and reserved variables, no processes) or `real`
    /// (images pulled, each group a sandbox of namespaces with OCI containers; needs root and an
    /// OCI runtime; see mock-eci/README.md).
    #[arg(long, env = "MOCK_ECI_RUNTIME", value_enum, default_value_t = RuntimeMode::Simulated)]
    pub runtime: RuntimeMode,

    /// Real runtime: the host bridge's address and the network groups' IntranetIps come from
    /// (private, not loopback; the bridge takes the network's first address). Replaces
    /// `--ip-cidr` in real mode.
    #[arg(
        long,
        env = "MOCK_ECI_RUNTIME_NETWORK",
        default_value = "10.214.0.1/16"
    )]
    pub runtime_network: ipnet::Ipv4Net,

    /// Real runtime: where groups' bundles, writable layers and logs live (and the image store
    /// unless `--image-store` says otherwise).
    #[arg(
        long,
        env = "MOCK_ECI_RUNTIME_DIR",
        default_value = "/var/lib/mock-eci"
    )]
    pub runtime_dir: PathBuf,

    /// Real runtime: the image store's directory (default: `<runtime-dir>/images`).
    #[arg(long, env = "MOCK_ECI_IMAGE_STORE")]
    pub image_store: Option<PathBuf>,

    /// Real runtime: the OCI runtime binary (runc's command line), a path or a name on PATH.
    #[arg(long, env = "MOCK_ECI_OCI_RUNTIME", default_value = "runc")]
    pub oci_runtime: PathBuf,

    /// Real runtime: the resolv.conf whose resolvers stand for the VPC's: a group with
    /// `DnsPolicy` `Default` (or none) gets its nameservers (loopback ones left out), search
    /// domains and options, with the group's `DnsConfig` merged in.
    #[arg(
        long,
        env = "MOCK_ECI_RUNTIME_RESOLV_CONF",
        default_value = "/etc/resolv.conf"
    )]
    pub runtime_resolv_conf: PathBuf,

    /// Real runtime: a registry mirror for Docker Hub (`http://HOST[:PORT]` or
    /// `https://HOST[:PORT]`): images named on Docker Hub (`busybox`, `docker.io/library/…`)
    /// are pulled from it, the same repository and tag, as a container runtime's mirror does.
    /// Without it they are pulled from Docker Hub.
    #[arg(long, env = "MOCK_ECI_RUNTIME_REGISTRY_MIRROR")]
    pub runtime_registry_mirror: Option<crate::images::RegistryMirror>,

    /// Real runtime: names the bridge, namespaces, interfaces and containers this mock-eci
    /// creates (1-6 of a-z, 0-9). It owns the prefix on this machine: whatever carries it is
    /// removed at start (an earlier run's leftovers).
    #[arg(long, env = "MOCK_ECI_RUNTIME_PREFIX", default_value = "meci")]
    pub runtime_prefix: String,
}

/// How containers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeMode {
    /// Timers and reserved variables; no process runs.
    Simulated,
    /// Real images, namespaces and OCI containers.
    Real,
}

impl MockConfig {
    /// The defaults, as if no flag were given (tests start from here).
    pub fn defaults() -> Self {
        Self::parse_from(["mock-eci"])
    }

    /// The engine settings.
    pub fn settings(&self) -> Settings {
        Settings {
            region: self.region.clone(),
            zone: self.zone.clone(),
            provisioning: self.provisioning_delay,
            cached_provisioning: self.cached_provisioning_delay,
            image_cache_creation: self.image_cache_creation_delay,
            scheduling_delay_ms: millis(self.scheduling_delay),
            init_duration_ms: millis(self.init_container_duration),
            restart_backoff_ms: millis(self.restart_backoff),
            max_restart_backoff_ms: millis(self.max_restart_backoff),
            max_grace_ms: millis(self.max_grace_period),
            stop_after_ms: self.stop_after_sigterm.map(millis),
            retention_ms: millis(self.retention),
            ip_cidr: self.ip_cidr,
            max_groups: self.max_groups,
            no_stock: self.no_stock,
            vswitch_zones: self.vswitch_zones.iter().cloned().collect(),
            no_stock_zones: self.no_stock_zones.iter().cloned().collect(),
            seed: self.seed,
            real_runtime: self.runtime == RuntimeMode::Real,
        }
        .with_real_network(self.real_network())
    }

    /// The sandbox network in real mode, as the engine's address block.
    fn real_network(&self) -> Option<Cidr> {
        (self.runtime == RuntimeMode::Real).then(|| Cidr {
            network: self.runtime_network.network(),
            prefix: self.runtime_network.prefix_len(),
        })
    }

    /// The image store's directory in real mode.
    pub fn image_store_dir(&self) -> PathBuf {
        self.image_store
            .clone()
            .unwrap_or_else(|| self.runtime_dir.join("images"))
    }

    /// The values creates may not name.
    pub fn denials(&self) -> crate::service::denials::Denials {
        crate::service::denials::Denials {
            ram_roles: self.deny_ram_roles.iter().cloned().collect(),
            security_groups: self.deny_security_groups.iter().cloned().collect(),
        }
    }

    /// Rate-limit overrides by action.
    pub fn rate_limit_overrides(&self) -> BTreeMap<Action, RateLimit> {
        self.rate_limits.iter().copied().collect()
    }

    /// Faults (errors and latency) by action, `*` expanded.
    pub fn fault_map(&self) -> BTreeMap<Action, Fault> {
        let expand = |name: &str| -> Vec<Action> {
            if name == "*" {
                Action::ALL.to_vec()
            } else {
                name.parse().map(|action| vec![action]).unwrap_or_default()
            }
        };
        let mut faults: BTreeMap<Action, Fault> = BTreeMap::new();
        for (name, rate, code) in &self.faults {
            for action in expand(name) {
                let fault = faults.entry(action).or_default();
                fault.error_rate = *rate;
                fault.error_code.clone_from(code);
            }
        }
        for (name, latency) in &self.latency {
            for action in expand(name) {
                faults.entry(action).or_default().latency_ms =
                    u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
            }
        }
        faults
    }

    /// Checks that the settings make sense together.
    pub fn check(&self) -> Result<(), String> {
        if millis(self.scheduling_delay) > self.provisioning_delay.min_ms {
            return Err(format!(
                "--scheduling-delay ({}) must not exceed the shortest --provisioning-delay ({}ms)",
                humantime::format_duration(self.scheduling_delay),
                self.provisioning_delay.min_ms
            ));
        }
        if self.restart_backoff > self.max_restart_backoff {
            return Err("--restart-backoff must not exceed --max-restart-backoff".into());
        }
        if self.runtime == RuntimeMode::Real {
            let network = self.runtime_network;
            let first = std::net::Ipv4Addr::from(u32::from(network.network()).saturating_add(1));
            if network.addr() != first || !network.addr().is_private() || network.prefix_len() > 29
            {
                return Err(format!(
                    "--runtime-network {network}: give a private block of /29 or larger by its first address, e.g. {first}/{}",
                    network.prefix_len().min(29)
                ));
            }
        }
        Ok(())
    }
}

fn action_or_star(name: &str) -> Result<String, String> {
    if name == "*" {
        Ok(name.to_owned())
    } else {
        name.parse::<Action>()
            .map(|action| action.name().to_owned())
    }
}

fn parse_vswitch_zone(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((vswitch, zone)) if !vswitch.trim().is_empty() && !zone.trim().is_empty() => {
            Ok((vswitch.trim().to_owned(), zone.trim().to_owned()))
        }
        _ => Err(format!(
            "{text:?}: write VSWITCH=ZONE, e.g. vsw-a=cn-hangzhou-a"
        )),
    }
}

fn parse_rate_limit(text: &str) -> Result<(Action, RateLimit), String> {
    let (action, limit) = text.split_once('=').ok_or_else(|| {
        format!("{text:?}: write Action=PER_MINUTE[/BURST], e.g. CreateContainerGroup=100/10")
    })?;
    let action: Action = action.parse()?;
    let (per_minute, burst) = match limit.split_once('/') {
        Some((per_minute, burst)) => (per_minute, Some(burst)),
        None => (limit, None),
    };
    let per_minute: u32 = per_minute
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?}: calls per minute must be a positive integer"))?;
    let burst = match burst {
        Some(burst) => burst
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{text:?}: the burst must be a positive integer"))?,
        None => (per_minute / 10).max(1),
    };
    Ok((action, RateLimit { per_minute, burst }))
}

fn parse_fault(text: &str) -> Result<(String, f64, String), String> {
    let (action, rest) = text.split_once('=').ok_or_else(|| {
        format!("{text:?}: write Action=RATE[:CODE], e.g. CreateContainerGroup=0.1:InternalError")
    })?;
    let (rate, code) = rest
        .split_once(':')
        .unwrap_or((rest, eci_proto::error::codes::SERVICE_UNAVAILABLE));
    let rate: f64 = rate
        .parse()
        .ok()
        .filter(|rate| (0.0..=1.0).contains(rate))
        .ok_or_else(|| format!("{text:?}: the rate must be a number between 0 and 1"))?;
    Ok((action_or_star(action)?, rate, code.to_owned()))
}

fn parse_latency(text: &str) -> Result<(String, Duration), String> {
    let (action, duration) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: write Action=DURATION, e.g. *=50ms"))?;
    let duration =
        humantime::parse_duration(duration).map_err(|error| format!("{text:?}: {error}"))?;
    Ok((action_or_star(action)?, duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_consistent() {
        let config = MockConfig::defaults();
        config.check().unwrap();
        assert_eq!(config.settings().retention_ms, 3_600_000);
        assert!(!config.no_rate_limits);
    }

    #[test]
    fn parses_limits_faults_and_latency() {
        let config = MockConfig::parse_from([
            "mock-eci",
            "--rate-limit",
            "CreateContainerGroup=100/5",
            "--fault",
            "*=0.5:InternalError",
            "--latency",
            "DescribeContainerGroups=20ms",
        ]);
        assert_eq!(
            config.rate_limit_overrides()[&Action::CreateContainerGroup],
            RateLimit {
                per_minute: 100,
                burst: 5
            }
        );
        let faults = config.fault_map();
        assert_eq!(faults.len(), Action::ALL.len());
        assert_eq!(
            faults[&Action::DeleteContainerGroup].error_code,
            "InternalError"
        );
        assert_eq!(faults[&Action::DescribeContainerGroups].latency_ms, 20);
    }

    #[test]
    fn rejects_bad_values_with_the_fix() {
        let error =
            MockConfig::try_parse_from(["mock-eci", "--rate-limit", "Create=1"]).unwrap_err();
        assert!(
            error.to_string().contains("unknown action \"Create\""),
            "{error}"
        );
        assert!(MockConfig::try_parse_from(["mock-eci", "--fault", "*=2"]).is_err());
        assert!(MockConfig::try_parse_from(["mock-eci", "--ip-cidr", "10.0.0.0"]).is_err());
        let config = MockConfig::parse_from([
            "mock-eci",
            "--provisioning-delay",
            "100ms",
            "--scheduling-delay",
            "1s",
        ]);
        assert!(config.check().unwrap_err().contains("--scheduling-delay"));
    }
}
