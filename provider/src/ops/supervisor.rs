//! The one supervisor of long-running tasks (the process's areas, a component's loops: a
//! watch, a poll, the writers of a work queue …), each a named task of its own, so they run in
//! parallel and none waits on another's slow poll.
//!
//! Rules:
//! - The tasks share a stop token derived from the one the supervisor was made with; a task
//!   stops when it is cancelled, as a normal stop.
//! - A task fails by returning an error or panicking; a [critical](Supervisor::spawn_critical)
//!   one also fails by ending before the stop (the process cannot serve without it), while an
//!   ordinary one may end early (some have nothing to do).
//! - [`Supervisor::join`]: the first failure cancels the shared token, so the others stop as
//!   they would on a normal stop; its error, named after the task, is the answer once every
//!   task has ended. Failures while stopping are logged.
//! - [`Supervisor::failure`] waits for a failure without stopping anything, for a caller that
//!   waits for other things too; [`Supervisor::shutdown`] then stops the tasks and gives them a
//!   grace period before aborting what is left.
//! - A stop that drags names its cause: tasks still running [`SLOW_STOP`] after the stop are
//!   named in the log (once), as are those a [`Supervisor::shutdown`] aborts.
//! - Dropping a supervisor aborts what still runs.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How long tasks may take to end after the stop before those still running are named in the
/// log: an idle task ends at once, and in-flight work (a write, an ECI call) within a second
/// or two.
pub const SLOW_STOP: Duration = Duration::from_secs(2);

/// Why a task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("the {name} task failed")]
    Failed {
        name: &'static str,
        #[source]
        source: anyhow::Error,
    },
    #[error("the {name} task panicked")]
    Panicked {
        name: &'static str,
        #[source]
        source: JoinError,
    },
    #[error("the critical {name} task stopped unexpectedly")]
    Ended { name: &'static str },
}

impl TaskError {
    /// The task that failed.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Failed { name, .. } | Self::Panicked { name, .. } | Self::Ended { name } => name,
        }
    }
}

/// Whether a task may end before the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Ending early is normal.
    Allowed,
    /// Ending early is a failure.
    Failure,
}

/// Named tasks and the stop token they share.
#[derive(Debug)]
pub struct Supervisor {
    running: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, (&'static str, Ending)>,
    stop: CancellationToken,
    /// Where the stop is in naming the tasks that outlive it.
    stopping: Stopping,
}

/// Whether the tasks that outlive the stop are to be named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopping {
    /// Not stopped yet (as far as this supervisor has seen).
    Running,
    /// Stopped then: those still running at [`SLOW_STOP`] after it are named.
    Since(Instant),
    /// Named (or none was left to name).
    Named,
}

impl Supervisor {
    /// Tasks stopped by `stop`, or by the first of them to fail.
    pub fn new(stop: &CancellationToken) -> Self {
        Self {
            running: JoinSet::new(),
            names: HashMap::new(),
            stop: stop.child_token(),
            stopping: Stopping::Running,
        }
    }

    /// The token to hand to each task.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Starts `run` as the task called `name`; it may end before the stop.
    pub fn spawn<F>(&mut self, name: &'static str, run: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.start(name, Ending::Allowed, run);
    }

    /// Starts `run` as the task called `name`; ending before the stop is a failure.
    pub fn spawn_critical<F>(&mut self, name: &'static str, run: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.start(name, Ending::Failure, run);
    }

    fn start<F>(&mut self, name: &'static str, ending: Ending, run: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let id = self.running.spawn(run).id();
        self.names.insert(id, (name, ending));
    }

    /// The next task to end, judged: `None` when no task is left. Meanwhile, notes the stop
    /// and names the tasks that outlive it by [`SLOW_STOP`]. Cancel-safe.
    async fn next_ended(&mut self) -> Option<Result<(), TaskError>> {
        let ended = loop {
            let stop = self.stop.clone();
            tokio::select! {
                ended = self.running.join_next_with_id() => break ended?,
                () = stop.cancelled(), if self.stopping == Stopping::Running => {
                    self.stopping = Stopping::Since(Instant::now());
                }
                () = sleep_until_slow(self.stopping) => {
                    warn!(tasks = ?self.still_running(), after = ?SLOW_STOP, "tasks still running after the stop");
                    self.stopping = Stopping::Named;
                }
            }
        };
        let id = match &ended {
            Ok((id, _)) => *id,
            Err(error) => error.id(),
        };
        let (name, ending) = self
            .names
            .remove(&id)
            .unwrap_or(("unnamed", Ending::Allowed));
        Some(match ended {
            Ok((_, Ok(()))) if ending == Ending::Failure && !self.stop.is_cancelled() => {
                Err(TaskError::Ended { name })
            }
            Ok((_, Ok(()))) => Ok(()),
            Ok((_, Err(source))) => Err(TaskError::Failed { name, source }),
            Err(source) => Err(TaskError::Panicked { name, source }),
        })
    }

    /// Waits for a task to fail, without stopping the others; pending for ever while none
    /// does. Cancel-safe (for `select!`).
    pub async fn failure(&mut self) -> TaskError {
        loop {
            match self.next_ended().await {
                Some(Err(failure)) => return failure,
                Some(Ok(())) => {}
                None => std::future::pending().await,
            }
        }
    }

    /// Waits for every task to end; the first failure, if any, is the answer (and stops the
    /// others).
    pub async fn join(mut self) -> Result<(), TaskError> {
        let mut first = None;
        while let Some(ended) = self.next_ended().await {
            let Err(failure) = ended else { continue };
            if first.is_none() {
                warn!(error = %failure, "stopping the other tasks");
                self.stop.cancel();
                first = Some(failure);
            } else {
                warn!(error = %failure, "a task failed while stopping");
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Stops every task and waits up to `grace` for them to end (failures are logged), then
    /// aborts what is left. Whether every task ended in time.
    pub async fn shutdown(mut self, grace: Duration) -> bool {
        self.stop.cancel();
        let ended = tokio::time::timeout(grace, async {
            while let Some(ended) = self.next_ended().await {
                if let Err(failure) = ended {
                    warn!(error = %format!("{:#}", anyhow::Error::from(failure)), "a task ended with an error while stopping");
                }
            }
        })
        .await;
        if ended.is_err() {
            warn!(tasks = ?self.still_running(), ?grace, "tasks aborted: they did not stop in time");
            self.running.abort_all();
        }
        ended.is_ok()
    }

    /// The names of the tasks still running, sorted.
    fn still_running(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.names.values().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names
    }
}

/// Completes when the tasks still running after the stop are to be named; never otherwise.
async fn sleep_until_slow(stopping: Stopping) {
    match stopping {
        Stopping::Since(at) => tokio::time::sleep_until(at + SLOW_STOP).await,
        Stopping::Running | Stopping::Named => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that runs until its stop.
    fn steady(stop: &CancellationToken) -> impl Future<Output = anyhow::Result<()>> + use<> {
        let stop = stop.clone();
        async move {
            stop.cancelled().await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_stop_ends_every_task_without_error() {
        let stop = CancellationToken::new();
        let mut tasks = Supervisor::new(&stop);
        tasks.spawn("a", steady(tasks.stop()));
        tasks.spawn_critical("b", steady(tasks.stop()));
        tasks.spawn("done early", async { Ok(()) });
        stop.cancel();
        assert!(tasks.join().await.is_ok());
    }

    #[tokio::test]
    async fn the_first_failure_stops_the_others_and_is_returned_by_name() {
        let stop = CancellationToken::new();
        let mut tasks = Supervisor::new(&stop);
        tasks.spawn("steady", steady(tasks.stop()));
        tasks.spawn("failing", async { anyhow::bail!("gone") });
        let error = tasks.join().await.unwrap_err();
        assert!(matches!(
            error,
            TaskError::Failed {
                name: "failing",
                ..
            }
        ));
        assert_eq!(error.to_string(), "the failing task failed");
        assert_eq!(
            std::error::Error::source(&error).unwrap().to_string(),
            "gone"
        );
        // Only the tasks' own token: the component's caller decides about its own.
        assert!(!stop.is_cancelled());
    }

    #[tokio::test]
    async fn a_panic_stops_the_others_and_is_returned_by_name() {
        let stop = CancellationToken::new();
        let mut tasks = Supervisor::new(&stop);
        tasks.spawn("steady", steady(tasks.stop()));
        tasks.spawn("panicking", async { panic!("a bug") });
        let error = tasks.join().await.unwrap_err();
        assert!(matches!(
            error,
            TaskError::Panicked {
                name: "panicking",
                ..
            }
        ));
        assert_eq!(error.name(), "panicking");
    }

    #[tokio::test]
    async fn a_critical_task_ending_early_is_a_failure_an_ordinary_one_is_not() {
        let stop = CancellationToken::new();
        let mut tasks = Supervisor::new(&stop);
        tasks.spawn("steady", steady(tasks.stop()));
        tasks.spawn("nothing to do", async { Ok(()) });
        tasks.spawn_critical("server", async { Ok(()) });
        let failure = tasks.failure().await;
        assert!(matches!(failure, TaskError::Ended { name: "server" }));
        assert_eq!(
            failure.to_string(),
            "the critical server task stopped unexpectedly"
        );
        // Waiting for a failure stops nothing; the shutdown does.
        assert!(!tasks.stop().is_cancelled());
        assert!(tasks.shutdown(Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_shutdown_aborts_what_outlives_its_grace() {
        let stop = CancellationToken::new();
        let mut tasks = Supervisor::new(&stop);
        let (dropped, gone) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn_critical("stubborn", async move {
            let _held = dropped;
            std::future::pending::<()>().await;
            Ok(())
        });
        tasks.spawn_critical("steady", steady(tasks.stop()));
        assert!(!tasks.shutdown(Duration::from_millis(50)).await);
        // Aborted: what it held is released.
        assert!(gone.await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_tasks_that_outlive_the_stop_are_named_once() {
        let stop = CancellationToken::new();
        let mut tasks = Supervisor::new(&stop);
        tasks.spawn("stubborn", std::future::pending());
        tasks.spawn("steady", steady(tasks.stop()));
        assert_eq!(tasks.still_running(), ["steady", "stubborn"]);
        stop.cancel();
        assert!(
            matches!(tasks.next_ended().await, Some(Ok(()))),
            "steady ends"
        );
        let started = Instant::now();
        let waited = tokio::time::timeout(2 * SLOW_STOP, tasks.next_ended()).await;
        assert!(waited.is_err(), "the stubborn one never ends");
        assert!(
            matches!(tasks.stopping, Stopping::Named),
            "{:?}",
            tasks.stopping
        );
        assert!(started.elapsed() >= SLOW_STOP);
        assert_eq!(tasks.still_running(), ["stubborn"], "what was named");
    }
}
