//! The fronts: everything that listens. This module wires the gRPC API, the OpenAPI front
//! ([`openapi`]), the admin HTTP API ([`admin`]), the exec-session WebSockets
//! ([`exec_session`]), the echo listeners ([`echo`]) and the state-file writer, and stops them
//! together.
//!
//! May call: `service` (the shared [`MockEci`] handle), the engine's plain data types, and the
//! shared leaves. Nothing below calls back into a front (`tests/layout.rs` checks it).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

use crate::fronts::openapi::{FrontCredentials, OpenApiFront};
use crate::service::MockEci;
use crate::service::config::{MockConfig, RuntimeMode};
use crate::service::persist::{self, PersistError};
use crate::service::runtime::RealRuntime;

pub mod admin;
pub mod echo;
pub mod exec_session;
pub mod openapi;

/// An error and its causes on one line, for log lines: errors here say their own part once and
/// chain the cause, which a field holding only `Display` (and JSON logs) would drop.
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

/// Starting or running the servers failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A listening address could not be bound.
    #[error("cannot listen on {addr} (set by {flag}); choose another address or free the port")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The flag that set it.
        flag: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The OpenAPI front could not start.
    #[error(transparent)]
    OpenApi(#[from] crate::fronts::openapi::FrontError),
    /// The state file could not be loaded.
    #[error(transparent)]
    State(#[from] PersistError),
    /// Real mode cannot run here.
    #[error("the real runtime cannot start")]
    Runtime(#[from] crate::service::runtime::RuntimeError),
    /// The gRPC server failed.
    #[error("the gRPC server failed")]
    Grpc(#[source] tonic::transport::Error),
    /// The admin server failed.
    #[error("the admin server failed")]
    Admin(#[source] io::Error),
    /// A server task panicked or was cancelled.
    #[error("a server task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
}

/// A mock-eci serving in the background of this process (tests, embedded mode).
#[derive(Debug)]
pub struct MockServer {
    grpc_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    mock: MockEci,
    openapi: Option<OpenApiFront>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl MockServer {
    /// Binds `config.listen` (and `config.admin_listen`) and starts serving.
    pub async fn start(config: MockConfig) -> Result<Self, ServeError> {
        config.check().map_err(ServeError::Config)?;
        let mock = MockEci::new(&config)?;
        let grpc = bind(config.listen, "--listen").await?;
        let admin = match config.admin_listen {
            Some(addr) => Some(bind(addr, "--admin-listen").await?),
            None => None,
        };
        let openapi = match config.openapi_listen {
            Some(addr) => Some(bind(addr, "--openapi-listen").await?),
            None => None,
        };
        let runtime = match config.runtime {
            RuntimeMode::Real => Some(Arc::new(RealRuntime::open(&config).await?)),
            RuntimeMode::Simulated => None,
        };
        let mut server = Self::start_with(grpc, admin, mock, &config, runtime)?;
        if let Some(listener) = openapi {
            let front = OpenApiFront::start(
                listener,
                server.mock.clone(),
                FrontCredentials {
                    access_key_id: config.openapi_access_key_id.clone(),
                    access_key_secret: config.openapi_access_key_secret.clone(),
                    security_token: config.openapi_security_token.clone(),
                },
                config.openapi_tls_dir.as_deref(),
            )?;
            server.openapi = Some(front);
        }
        Ok(server)
    }

    /// Serves `mock` on listeners bound by the caller.
    pub fn start_on(
        grpc: TcpListener,
        admin: Option<TcpListener>,
        mock: MockEci,
        config: &MockConfig,
    ) -> Result<Self, ServeError> {
        Self::start_with(grpc, admin, mock, config, None)
    }

    fn start_with(
        grpc: TcpListener,
        admin: Option<TcpListener>,
        mock: MockEci,
        config: &MockConfig,
        runtime: Option<Arc<RealRuntime>>,
    ) -> Result<Self, ServeError> {
        let grpc_addr = grpc.local_addr().map_err(|source| ServeError::Bind {
            addr: config.listen,
            flag: "--listen",
            source,
        })?;
        let admin_addr = admin
            .as_ref()
            .and_then(|listener| listener.local_addr().ok());
        if let Some(addr) = admin_addr {
            // Interactive execs are streamed by the admin listener.
            mock.set_exec_base(format!("ws://{addr}"));
        }
        let (shutdown, signal) = watch::channel(false);
        let state = config
            .state_file
            .clone()
            .map(|path| (path, config.state_flush_interval));
        if config.port_echo {
            tokio::spawn(crate::fronts::echo::run(mock.clone(), signal.clone()));
        }
        if let Some(runtime) = &runtime {
            mock.attach_runtime(runtime.clone());
        }
        let task = tokio::spawn(serve(grpc, admin, mock.clone(), state, signal, runtime));
        info!(grpc = %grpc_addr, admin = ?admin_addr, region = %config.region, "mock-eci serving");
        Ok(Self {
            grpc_addr,
            admin_addr,
            mock,
            openapi: None,
            shutdown,
            task,
        })
    }

    /// Where the gRPC API listens.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The gRPC endpoint as a URL (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// Where the admin endpoint listens, when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The mock itself, to inspect or steer it in-process.
    pub fn mock(&self) -> &MockEci {
        &self.mock
    }

    /// The OpenAPI front, when enabled.
    pub fn openapi(&self) -> Option<&OpenApiFront> {
        self.openapi.as_ref()
    }

    /// Stops serving and writes the state file one last time.
    pub async fn stop(self) -> Result<(), ServeError> {
        if let Some(front) = self.openapi {
            front.stop().await;
        }
        let _ = self.shutdown.send(true);
        self.task.await.map_err(ServeError::Task)?
    }

    /// Serves until `signal` completes, then stops.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), ServeError> {
        let mut task = self.task;
        let _front = self.openapi;
        tokio::select! {
            () = signal => {
                info!("shutting down");
                let _ = self.shutdown.send(true);
                task.await.map_err(ServeError::Task)?
            }
            // A server that ends on its own is a failure: report it rather than hang.
            result = &mut task => result.map_err(ServeError::Task)?,
        }
    }
}

async fn bind(addr: SocketAddr, flag: &'static str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, flag, source })
}

async fn stopped(mut signal: watch::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = signal.wait_for(|stop| *stop).await;
}

async fn serve(
    grpc: TcpListener,
    admin: Option<TcpListener>,
    mock: MockEci,
    state: Option<(PathBuf, Duration)>,
    signal: watch::Receiver<bool>,
    runtime: Option<Arc<RealRuntime>>,
) -> Result<(), ServeError> {
    // Without TCP_NODELAY, multi-segment responses stall on delayed ACKs (~40 ms a page).
    let incoming = TcpListenerStream::new(grpc).map(|stream| {
        if let Ok(stream) = &stream {
            let _ = stream.set_nodelay(true);
        }
        stream
    });
    let grpc_server = tonic::transport::Server::builder()
        .add_service(mock.grpc_service())
        .serve_with_incoming_shutdown(incoming, stopped(signal.clone()));
    let grpc_server = async { grpc_server.await.map_err(ServeError::Grpc) };
    let admin_server = async {
        match admin {
            Some(listener) => axum::serve(listener, admin::router(mock.clone()))
                .with_graceful_shutdown(stopped(signal.clone()))
                .await
                .map_err(ServeError::Admin),
            None => Ok(()),
        }
    };
    let writer = async {
        if let Some((path, interval)) = &state {
            write_state_until(&mock, path, *interval, signal.clone()).await;
        }
        Ok(())
    };
    let driver = async {
        if let Some(runtime) = runtime {
            runtime.drive(mock.clone(), signal.clone()).await;
        }
        Ok(())
    };
    tokio::try_join!(grpc_server, admin_server, writer, driver)?;
    if let Some((path, _)) = &state {
        save(&mock, path).await?;
    }
    Ok(())
}

/// Writes the state file shortly after each change, until told to stop.
async fn write_state_until(
    mock: &MockEci,
    path: &Path,
    interval: Duration,
    signal: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = mock.changed() => {}
            () = stopped(signal.clone()) => return,
        }
        // Coalesce a burst of changes into one write.
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stopped(signal.clone()) => return,
        }
        if let Err(error) = save(mock, path).await {
            warn!(error = %ErrorChain(&error), "could not write the state file; groups may not survive a restart");
        }
    }
}

async fn save(mock: &MockEci, path: &Path) -> Result<(), PersistError> {
    let snapshot = mock.snapshot();
    let path = path.to_owned();
    let target = path.clone();
    tokio::task::spawn_blocking(move || persist::save(&path, &snapshot))
        .await
        .unwrap_or_else(|error| {
            Err(PersistError::Io {
                path: target,
                source: io::Error::other(error),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_their_part_once_and_the_chain_says_the_cause() {
        let error = ServeError::State(PersistError::Io {
            path: "/state.json".into(),
            source: io::Error::other("disk full"),
        });
        assert_eq!(error.to_string(), "state file /state.json");
        assert_eq!(
            ErrorChain(&error).to_string(),
            "state file /state.json: disk full"
        );
    }
}
