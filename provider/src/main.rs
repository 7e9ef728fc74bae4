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

fn main() -> ExitCode {
    let config = Config::parse();
    logging::init(config.ops.log_format);
    let worker_threads = config.ops.worker_threads;
    let settings = match config.settings() {
        Ok(settings) => settings,
        Err(error) => {
            tracing::error!("invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        runtime.worker_threads(worker_threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!("cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(Box::pin(app::run(settings, signals::shutdown_signal()))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("virtual-node-eci stopped: {error:#}");
            ExitCode::FAILURE
        }
    }
}
