//! `kube-standin`: the Kubernetes API stand-in as a process (test infrastructure).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use integration::standin::{StandIn, StandInConfig};
use tracing_subscriber::EnvFilter;

/// A small Kubernetes API server for end-to-end tests of virtual-node-eci. Not a product
/// component: it follows the API conventions for the resources virtual-node-eci touches.
#[derive(Debug, Parser)]
#[command(name = "kube-standin", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the address is logged).
    #[arg(long, env = "STANDIN_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server here.
    #[arg(long, env = "STANDIN_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS with a self-signed certificate.
    #[arg(long, env = "STANDIN_HTTP")]
    http: bool,
    /// Interval between watch bookmarks.
    #[arg(long, env = "STANDIN_BOOKMARK_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    bookmark_interval: Duration,
    /// Changes kept for watches to replay; older resourceVersions answer 410 Gone.
    #[arg(long, env = "STANDIN_WATCH_HISTORY", default_value_t = 100_000)]
    watch_history: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let config = StandInConfig {
        listen: args.listen,
        plain_http: args.http,
        kubeconfig: args.kubeconfig,
        bookmark_interval: args.bookmark_interval,
        watch_history: args.watch_history,
    };
    let stand_in = match StandIn::start(config).await {
        Ok(stand_in) => stand_in,
        Err(error) => {
            tracing::error!(%error, "kube-standin could not start");
            return ExitCode::FAILURE;
        }
    };
    let _ = tokio::signal::ctrl_c().await;
    stand_in.stop().await;
    ExitCode::SUCCESS
}
