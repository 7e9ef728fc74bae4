//! The long-running loops of one component (a watch, a poll, the writers of a work queue …),
//! each a named task of its own, so they run in parallel and none waits on another's slow poll.
//!
//! Rules: the loops share a stop token derived from the component's; the first loop to fail
//! (an error, or a panic) cancels that token, so the others stop as they would on a normal
//! stop, and its error, named after the loop, is what [`Loops::join`] returns once every loop
//! has ended. A loop that ends well before the stop is not a failure (some have nothing to do).
//! Dropping [`Loops`] aborts what still runs.

use std::collections::HashMap;

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Why the loops ended.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("the {name} loop failed")]
    Failed {
        name: &'static str,
        #[source]
        source: anyhow::Error,
    },
    #[error("the {name} loop panicked")]
    Panicked {
        name: &'static str,
        #[source]
        source: JoinError,
    },
}

impl LoopError {
    /// The loop that failed.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Failed { name, .. } | Self::Panicked { name, .. } => name,
        }
    }
}

/// Named loops and the stop token they share.
#[derive(Debug)]
pub struct Loops {
    running: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, &'static str>,
    stop: CancellationToken,
}

impl Loops {
    /// Loops stopped by `stop`, or by the first of them to fail.
    pub fn new(stop: &CancellationToken) -> Self {
        Self {
            running: JoinSet::new(),
            names: HashMap::new(),
            stop: stop.child_token(),
        }
    }

    /// The token to hand to each loop.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Starts `run` as the loop called `name`.
    pub fn spawn<F>(&mut self, name: &'static str, run: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let id = self.running.spawn(run).id();
        self.names.insert(id, name);
    }

    /// Waits for every loop to end; the first failure, if any, is the answer.
    pub async fn join(mut self) -> Result<(), LoopError> {
        let mut first = None;
        while let Some(ended) = self.running.join_next_with_id().await {
            let name = |id| self.names.get(&id).copied().unwrap_or("unnamed");
            let failure = match ended {
                Ok((_, Ok(()))) => continue,
                Ok((id, Err(source))) => LoopError::Failed {
                    name: name(id),
                    source,
                },
                Err(source) => LoopError::Panicked {
                    name: name(source.id()),
                    source,
                },
            };
            if first.is_none() {
                warn!(error = %failure, "stopping the other loops");
                self.stop.cancel();
                first = Some(failure);
            } else {
                warn!(error = %failure, "a loop failed while stopping");
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop that runs until its stop.
    fn steady(stop: &CancellationToken) -> impl Future<Output = anyhow::Result<()>> + use<> {
        let stop = stop.clone();
        async move {
            stop.cancelled().await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_stop_ends_every_loop_without_error() {
        let stop = CancellationToken::new();
        let mut loops = Loops::new(&stop);
        loops.spawn("a", steady(loops.stop()));
        loops.spawn("b", steady(loops.stop()));
        loops.spawn("done early", async { Ok(()) });
        stop.cancel();
        assert!(loops.join().await.is_ok());
    }

    #[tokio::test]
    async fn the_first_failure_stops_the_others_and_is_returned_by_name() {
        let stop = CancellationToken::new();
        let mut loops = Loops::new(&stop);
        loops.spawn("steady", steady(loops.stop()));
        loops.spawn("failing", async { anyhow::bail!("gone") });
        let error = loops.join().await.unwrap_err();
        assert!(matches!(
            error,
            LoopError::Failed {
                name: "failing",
                ..
            }
        ));
        assert_eq!(error.to_string(), "the failing loop failed");
        assert_eq!(
            std::error::Error::source(&error).unwrap().to_string(),
            "gone"
        );
        // Only the loops' own token: the component's caller decides about its own.
        assert!(!stop.is_cancelled());
    }

    #[tokio::test]
    async fn a_panic_stops_the_others_and_is_returned_by_name() {
        let stop = CancellationToken::new();
        let mut loops = Loops::new(&stop);
        loops.spawn("steady", steady(loops.stop()));
        loops.spawn("panicking", async { panic!("a bug") });
        let error = loops.join().await.unwrap_err();
        assert!(matches!(
            error,
            LoopError::Panicked {
                name: "panicking",
                ..
            }
        ));
        assert_eq!(error.name(), "panicking");
    }
}
