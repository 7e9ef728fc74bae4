//! A real OCI registry on loopback for the image tests (and, later, the playground): the CNCF
//! distribution registry that `upstream/build.sh registry` builds, serving plain HTTP on
//! 127.0.0.1 with filesystem storage in a directory of its own, optionally behind the
//! registry's own htpasswd (bcrypt) basic auth.

use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::{UpstreamError, upstream::locate_binary_blocking};
use crate::process::{Process, ProcessError, free_port};

/// How long the registry gets to answer `/v2/` after it starts (generous: a loaded machine).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Starting the test registry failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry binary could not be built or found.
    #[error("locate the registry binary")]
    Upstream(#[from] UpstreamError),
    /// Its process could not be started, or no port was free.
    #[error("start the registry")]
    Process(#[from] ProcessError),
    /// Its directory or files could not be written.
    #[error("write {path}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The password could not be hashed for the htpasswd file.
    #[error("hash the htpasswd password")]
    Hash(#[from] bcrypt::BcryptError),
    /// It did not answer `/v2/` in time, or exited; its log's tail says why.
    #[error("the registry did not become ready within {READY_WITHIN:?}; its log ends:\n{tail}")]
    NotReady {
        /// The last lines of its log.
        tail: String,
    },
}

/// A user the registry accepts with basic auth (nobody else may push or pull).
#[derive(Debug, Clone)]
pub struct BasicAuth {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: String,
}

/// A running distribution registry, stopped (SIGKILL) when dropped.
#[derive(Debug)]
pub struct TestRegistry {
    process: Process,
    host: String,
    _dir: tempfile::TempDir,
}

impl TestRegistry {
    /// Starts a registry on a free loopback port (building the binary on a cold cache) and
    /// waits until it answers. With `auth`, every request needs that user's credentials.
    pub async fn start(auth: Option<BasicAuth>) -> Result<Self, RegistryError> {
        let binary = tokio::task::spawn_blocking(|| locate_binary_blocking("registry", "registry"))
            .await
            .map_err(|join| RegistryError::NotReady {
                tail: format!("locating the binary panicked: {join}"),
            })??;
        let dir = tempfile::Builder::new()
            .prefix("test-registry-")
            .tempdir()
            .map_err(|source| RegistryError::Write {
                path: std::env::temp_dir(),
                source,
            })?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config = write_config(dir.path(), &host, auth.as_ref())?;
        // The registry exports traces over OTLP unless told not to; nothing listens for them.
        let envs = [("OTEL_TRACES_EXPORTER".to_owned(), "none".to_owned())];
        let process = Process::spawn(
            "registry",
            &binary,
            [std::ffi::OsStr::new("serve"), config.as_os_str()],
            &envs,
            dir.path(),
        )?;
        let mut registry = Self {
            process,
            host,
            _dir: dir,
        };
        registry.wait_ready().await?;
        Ok(registry)
    }

    /// `host:port` of the registry, as image references name it (`127.0.0.1:PORT/repo:tag`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        self.process.output()
    }

    /// Polls `/v2/` until it answers 200 (open) or 401 (auth on), or the process exits.
    async fn wait_ready(&mut self) -> Result<(), RegistryError> {
        let url = format!("http://{}/v2/", self.host);
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        while tokio::time::Instant::now() < deadline && self.process.exit_status().is_none() {
            if let Ok(response) = client.get(&url).send().await {
                let status = response.status().as_u16();
                if status == 200 || status == 401 {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(RegistryError::NotReady {
            tail: self.process.tail(30),
        })
    }
}

/// Writes the registry's config (and the htpasswd file with `auth`) into `dir`; returns the
/// config's path.
fn write_config(
    dir: &std::path::Path,
    host: &str,
    auth: Option<&BasicAuth>,
) -> Result<PathBuf, RegistryError> {
    let write = |path: PathBuf, text: String| {
        std::fs::write(&path, text)
            .map(|()| path.clone())
            .map_err(|source| RegistryError::Write { path, source })
    };
    let storage = dir.join("storage");
    let auth_section = match auth {
        Some(auth) => {
            let hash = bcrypt::hash(&auth.password, bcrypt::DEFAULT_COST)?;
            let htpasswd = write(dir.join("htpasswd"), format!("{}:{hash}\n", auth.user))?;
            format!(
                "auth:\n  htpasswd:\n    realm: test-registry\n    path: {}\n",
                htpasswd.display()
            )
        }
        None => String::new(),
    };
    let config = format!(
        "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
         delete:\n    enabled: true\nhttp:\n  addr: {host}\n  secret: test-registry-secret\n\
         {auth_section}",
        storage.display()
    );
    write(dir.join("config.yml"), config)
}
