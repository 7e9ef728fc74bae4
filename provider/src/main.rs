//! `virtual-node-eci`: the daemon. Everything but parsing flags lives in `app`.

use std::process::ExitCode;

use clap::Parser;
use virtual_node_eci::app::{self, logging, signals};
use virtual_node_eci::config::Config;

/// mimalloc rather than glibc's malloc: glibc gives the multi-thread runtime's workers arenas
/// of their own, and what a burst of pod starts freed stayed resident in them after the burst.
/// mimalloc gives it back; capping glibc's arenas (`MALLOC_ARENA_MAX`) helps too, but only
/// where the environment sets it (measured: docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    logging::init(config.ops.log_format);
    let settings = match config.settings() {
        Ok(settings) => settings,
        Err(error) => {
            tracing::error!("invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    match Box::pin(app::run(settings, signals::shutdown_signal())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("virtual-node-eci stopped: {error:#}");
            ExitCode::FAILURE
        }
    }
}
