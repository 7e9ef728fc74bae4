//! A Kubernetes API server stand-in — **test infrastructure, not a product component**.
//!
//! No kube-apiserver can be installed on our machines, so the end-to-end tests run against this:
//! a small API server that follows the Kubernetes API conventions for the part of the API
//! virtual-node-eci touches (see the crate README for what is in and what is deliberately out).
//! The same tests run unchanged against a real cluster.

pub mod admission;
pub mod api;
pub mod auth;
pub mod error;
pub mod faults;
pub mod patch;
pub mod registry;
pub mod selectors;
mod server;
pub mod store;
mod table;
mod tls;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;
use tracing::info;

pub use admission::AdmissionRecord;
pub use auth::{AccessRule, AuthRules, TokenUser};
pub use faults::{FaultRule, Faults};

/// How the stand-in runs.
#[derive(Debug, Clone)]
pub struct StandInConfig {
    /// Where to listen (port 0 picks one).
    pub listen: SocketAddr,
    /// Serve plain HTTP instead of HTTPS.
    pub plain_http: bool,
    /// Where to write a kubeconfig for it.
    pub kubeconfig: Option<PathBuf>,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// How many changes watches can replay; older versions answer 410 Gone.
    pub watch_history: usize,
}

impl Default for StandInConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            plain_http: false,
            kubeconfig: None,
            bookmark_interval: Duration::from_secs(5),
            watch_history: 100_000,
        }
    }
}

/// Tuning read by the handlers.
#[derive(Debug, Clone)]
pub struct Options {
    /// See [`StandInConfig::bookmark_interval`].
    pub bookmark_interval: Duration,
}

/// Shared state of a running stand-in.
#[derive(Debug)]
pub struct State {
    api: Mutex<api::Api>,
    /// Fault switches.
    pub faults: Faults,
    /// Handler tuning.
    pub options: Options,
    auth: Mutex<AuthRules>,
    admission_log: Mutex<Vec<AdmissionRecord>>,
}

impl State {
    fn lock(&self) -> MutexGuard<'_, api::Api> {
        self.api.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starting the stand-in failed.
#[derive(Debug, thiserror::Error)]
pub enum StandInError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The certificate could not be made.
    #[error("cannot create the serving certificate: {0}")]
    Tls(String),
    /// The kubeconfig could not be written.
    #[error("cannot write the kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A running stand-in.
#[derive(Debug)]
pub struct StandIn {
    addr: SocketAddr,
    url: String,
    ca_pem: Option<String>,
    state: Arc<State>,
    shutdown: signal::Sender<bool>,
    task: JoinHandle<()>,
}

impl StandIn {
    /// Binds and starts serving.
    pub async fn start(config: StandInConfig) -> Result<Self, StandInError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StandInError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| StandInError::Bind {
            addr: config.listen,
            source,
        })?;
        let (tls, ca_pem) = if config.plain_http {
            (None, None)
        } else {
            let serving = tls::serving_certificate().map_err(StandInError::Tls)?;
            (Some(serving.acceptor), Some(serving.ca_pem))
        };
        let scheme = if config.plain_http { "http" } else { "https" };
        let url = format!("{scheme}://{addr}");
        let root_ca = ca_pem
            .clone()
            .unwrap_or_else(|| "# plain HTTP: no CA\n".to_owned());
        let state = Arc::new(State {
            api: Mutex::new(api::Api::new(config.watch_history, root_ca)),
            faults: Faults::default(),
            options: Options {
                bookmark_interval: config.bookmark_interval,
            },
            auth: Mutex::new(AuthRules::default()),
            admission_log: Mutex::new(Vec::new()),
        });
        let (shutdown, stopped) = signal::channel(false);
        let task = tokio::spawn(server::serve(listener, tls, Arc::clone(&state), stopped));
        let stand_in = Self {
            addr,
            url,
            ca_pem,
            state,
            shutdown,
            task,
        };
        if let Some(path) = &config.kubeconfig {
            stand_in.write_kubeconfig(path)?;
        }
        info!(address = %addr, url = %stand_in.url, kubeconfig = ?config.kubeconfig, "Kubernetes API stand-in listening");
        Ok(stand_in)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM of the CA that signed the serving certificate (HTTPS only).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kubeconfig for this server (JSON, which every YAML reader accepts).
    pub fn kubeconfig(&self) -> Value {
        use base64::Engine as _;
        let mut cluster = json!({"server": self.url});
        if let Some(pem) = &self.ca_pem {
            cluster["certificate-authority-data"] =
                Value::String(base64::engine::general_purpose::STANDARD.encode(pem));
        }
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "standin", "cluster": cluster}],
            "users": [{"name": auth::ADMIN_USER, "user": {"token": auth::ADMIN_TOKEN}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": auth::ADMIN_USER, "namespace": "default"}}],
            "current-context": "standin",
        })
    }

    /// Writes [`Self::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), StandInError> {
        let text = serde_json::to_string_pretty(&self.kubeconfig()).unwrap_or_default();
        std::fs::write(path, text).map_err(|source| StandInError::Kubeconfig {
            path: path.to_owned(),
            source,
        })
    }

    /// A kube-rs client for this server. Its built-in retry of 429/503 is off, so tests see
    /// exactly what the server answered.
    pub async fn client(&self) -> Result<kube::Client, kube::Error> {
        let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(self.kubeconfig())
            .map_err(|e| kube::Error::Service(e.into()))?;
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| kube::Error::Service(e.into()))?;
        config.default_retry = false;
        kube::Client::try_from(config)
    }

    /// Fault switches.
    pub fn faults(&self) -> &Faults {
        &self.state.faults
    }

    /// Forgets the watch history: watches from any earlier version get 410 Gone.
    pub fn compact(&self) {
        self.state.lock().store.compact();
    }

    /// Replaces the TokenReview / SubjectAccessReview rules.
    pub fn set_auth(&self, rules: AuthRules) {
        *self
            .state
            .auth
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = rules;
    }

    /// Every webhook call so far.
    pub fn admission_log(&self) -> Vec<AdmissionRecord> {
        self.state
            .admission_log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.lock().store.rv()
    }

    /// Stops serving and closes open connections.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}
