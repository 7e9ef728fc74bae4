//! The ECI edge's flags: which backend, how the OpenAPI is reached and signed, how calls are
//! paced; and the backend they choose.

use std::path::PathBuf;
use std::time::Duration;

use super::{AddressKind, BackendChoice, ConfigError, Secret, TransportError, TransportPolicy};

/// The flags of the ECI edge (backend choice, OpenAPI client, credentials, pacing).
#[derive(Debug, Clone, clap::Args)]
pub struct EciArgs {
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

    /// Do not pace ECI calls by the documented per-action quotas (benchmarks against a
    /// mock-eci with its limits off).
    #[arg(long, env = "NO_ECI_CLIENT_RATE_LIMITS")]
    pub no_eci_client_rate_limits: bool,
}

impl EciArgs {
    /// The OpenAPI endpoint of `region`, without a trailing slash.
    pub fn openapi_endpoint(&self, region: &str) -> String {
        self.eci_endpoint.as_deref().map_or_else(
            || format!("https://eci.{region}.aliyuncs.com"),
            |endpoint| endpoint.trim_end_matches('/').to_owned(),
        )
    }

    /// Whether the client paces itself by the documented quotas.
    pub fn client_rate_limits(&self) -> bool {
        !self.no_eci_client_rate_limits
    }

    /// The backend and whether it may be reached in the clear; the OpenAPI one needs
    /// credentials.
    pub(super) fn backend(&self) -> Result<(BackendChoice, TransportPolicy), ConfigError> {
        let backend = self.named_backend()?;
        let transport = TransportPolicy::from_flag(self.eci_allow_insecure_endpoint);
        self.check_transport(&backend, transport)?;
        Ok((backend, transport))
    }

    /// The backend ECI_BACKEND names, with the credentials it needs.
    fn named_backend(&self) -> Result<BackendChoice, ConfigError> {
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
}
