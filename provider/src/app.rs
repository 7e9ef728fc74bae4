//! Wiring: connect, register, hold the Lease, report status, serve ops — until a signal, or
//! until a critical task dies (then the process exits non-zero rather than limp on).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::backend;
use crate::config::Settings;
use crate::lease::{LeaseIdentity, NodeLease};
use crate::node_status;
use crate::ops::{self, Readiness};
use crate::pods::PodController;
use crate::registration;
use crate::telemetry::Telemetry;

/// How long tasks get to finish after the stop signal.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs the daemon until `shutdown` completes (Ok) or a critical task fails (Err).
pub async fn run(settings: Settings, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let telemetry = Arc::new(Telemetry::new());
    let readiness = Arc::new(Readiness::default());
    let metrics_addr = settings.config.metrics_addr;
    let ops_listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| {
            format!(
                "--metrics-addr (METRICS_ADDR): cannot listen on {metrics_addr}; choose a free port"
            )
        })?;
    info!(address = %ops_listener.local_addr()?, "serving /healthz, /readyz and /metrics");

    let client = kube::Client::try_default()
        .await
        .context("cannot reach the Kubernetes API: no in-cluster configuration and no usable kubeconfig (set KUBECONFIG)")?;
    let (backend, backend_guard) = backend::connect(&settings).await?;
    let backend: backend::Backend = Arc::new(backend::Paced::new(
        backend,
        !settings.config.no_eci_client_rate_limits,
        Arc::clone(&telemetry),
    ));

    let nodes: Api<Node> = Api::all(client.clone());
    let node = registration::register(&nodes, &settings, &telemetry).await?;
    let node_uid = node.metadata.uid.clone().unwrap_or_default();
    let identity = LeaseIdentity {
        node: settings.node_name.clone(),
        node_uid,
        instance: uuid::Uuid::new_v4().to_string(),
        duration_seconds: settings.config.lease_duration_seconds,
        renew_interval: settings.config.lease_renew_interval,
    };
    let mut lease = NodeLease::acquire(client.clone(), identity, &telemetry).await?;
    readiness.serving.store(true, Ordering::SeqCst);
    info!(node = %settings.node_name, backend = ?settings.backend, "virtual-node-eci is serving its node");

    let stop = CancellationToken::new();
    let mut tasks: JoinSet<(&'static str, anyhow::Result<()>)> = JoinSet::new();
    {
        let (telemetry, stop) = (Arc::clone(&telemetry), stop.clone());
        tasks.spawn(async move {
            let result = lease.keep_renewing(&telemetry, &stop).await;
            if result.is_ok() {
                lease.release(&telemetry).await;
            }
            ("lease renewal", result.map_err(anyhow::Error::from))
        });
    }
    {
        let controller = PodController::new(
            settings.clone(),
            client.clone(),
            Arc::clone(&backend),
            Arc::clone(&telemetry),
        );
        let stop = stop.clone();
        tasks.spawn(async move { ("pod controller", controller.run(stop).await) });
    }
    {
        let (settings, telemetry, stop) = (settings.clone(), Arc::clone(&telemetry), stop.clone());
        tasks.spawn(async move {
            (
                "node status",
                node_status::run(nodes, backend, settings, telemetry, stop)
                    .await
                    .map_err(anyhow::Error::from),
            )
        });
    }
    {
        let router = ops::router(Arc::clone(&telemetry), Arc::clone(&readiness));
        let stop = stop.clone();
        tasks.spawn(async move {
            (
                "ops server",
                ops::serve(ops_listener, router, stop)
                    .await
                    .map_err(anyhow::Error::from),
            )
        });
    }

    tokio::pin!(shutdown);
    let outcome = tokio::select! {
        () = &mut shutdown => {
            info!("stop signal received; stopping every task");
            Ok(())
        }
        Some(joined) = tasks.join_next() => {
            let (name, result) = joined.unwrap_or_else(|panic| ("a task", Err(anyhow::anyhow!("panicked: {panic}"))));
            let failure = match result {
                Ok(()) => anyhow::anyhow!("the critical task `{name}` stopped unexpectedly"),
                Err(error) => error.context(format!("the critical task `{name}` failed")),
            };
            error!(error = %format!("{failure:#}"), "stopping: a critical task is gone");
            Err(failure)
        }
    };
    readiness.serving.store(false, Ordering::SeqCst);
    stop.cancel();
    let drained = tokio::time::timeout(STOP_GRACE, async {
        while let Some(joined) = tasks.join_next().await {
            if let Ok((name, Err(error))) = joined {
                warn!(task = name, error = %format!("{error:#}"), "task ended with an error while stopping");
            }
        }
    })
    .await;
    if drained.is_err() {
        warn!("some tasks did not stop within {STOP_GRACE:?}");
    }
    backend_guard.stop().await;
    outcome
}
