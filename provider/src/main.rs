//! `virtual-node-eci`: the daemon.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use virtual_node_eci::app;
use virtual_node_eci::config::{Config, LogFormat};

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match config.log_format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
        // Colours only on a terminal: log collectors would store the escape codes.
        LogFormat::Text => tracing_subscriber::fmt()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .with_env_filter(filter)
            .init(),
    }
    let settings = match config.settings() {
        Ok(settings) => settings,
        Err(error) => {
            tracing::error!("invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    match Box::pin(app::run(settings, shutdown_signal())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("virtual-node-eci stopped: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM (Kubernetes stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
