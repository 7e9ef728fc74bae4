//! The one stop signal: SIGTERM (Kubernetes stopping the pod) or Ctrl-C. `app::run` fans it out
//! to every task through cancellation tokens.

/// Completes on the first SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        // Without a handler Ctrl-C still kills the process, so a failed install is not fatal.
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the daemon gracefully");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
