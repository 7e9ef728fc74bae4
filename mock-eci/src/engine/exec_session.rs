//! Interactive exec sessions as data: what an `ExecContainerCommand` (no `Sync`) asked for,
//! held under a one-use id until its WebSocket connects. Serving that WebSocket (running the
//! command, streaming it) is a front's job: `fronts::exec_session`.

use std::collections::HashMap;

use crate::clock::Millis;

/// How long a `WebSocketUri` stays usable.
pub const SESSION_TTL_MS: Millis = 30_000;

/// What an `ExecContainerCommand` asked for, waiting for its WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingExec {
    /// The command, as given.
    pub command: Vec<String>,
    /// `TTY`.
    pub tty: bool,
    /// `Stdin`.
    pub stdin: bool,
    /// The group's id.
    pub group: String,
    /// The container's name.
    pub container: String,
    /// Where the command runs.
    pub target: ExecTarget,
    /// When the URI stops working.
    pub expires: Millis,
}

/// Where a session's command runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecTarget {
    /// In the container itself (`--runtime real`): the runtime's exec enters it.
    Container,
    /// Nowhere: the simulated runtime answers from [`crate::engine::exec::simulate`].
    Simulated(crate::engine::exec::Simulation),
}

/// Sessions handed out and not yet connected to.
#[derive(Debug, Default)]
pub struct Sessions {
    /// `ws://host:port` of the server that serves them, once it listens.
    base: Option<String>,
    pending: HashMap<String, PendingExec>,
}

impl Sessions {
    /// Where the sessions are served from now on.
    pub fn set_base(&mut self, base: String) {
        self.base = Some(base);
    }

    /// Records `exec` and returns its URI, or `None` when nothing serves sessions.
    pub fn open(&mut self, exec: PendingExec, now: Millis) -> Option<String> {
        let base = self.base.clone()?;
        self.pending.retain(|_, pending| pending.expires > now);
        let session = uuid::Uuid::new_v4().simple().to_string();
        self.pending.insert(session.clone(), exec);
        Some(format!("{base}/exec/{session}"))
    }

    /// Takes the session for its one connection.
    pub fn take(&mut self, session: &str, now: Millis) -> Option<PendingExec> {
        self.pending
            .remove(session)
            .filter(|pending| pending.expires > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_serve_once_and_expire() {
        let mut sessions = Sessions::default();
        let exec = PendingExec {
            command: vec!["true".into()],
            tty: false,
            stdin: false,
            group: "g".into(),
            container: "c".into(),
            target: ExecTarget::Container,
            expires: 1_000 + SESSION_TTL_MS,
        };
        assert_eq!(
            sessions.open(exec.clone(), 1_000),
            None,
            "nothing serves them yet"
        );
        sessions.set_base("ws://127.0.0.1:1".into());
        let uri = sessions.open(exec.clone(), 1_000).expect("a URI");
        let session = uri.rsplit('/').next().expect("session").to_owned();
        assert!(uri.starts_with("ws://127.0.0.1:1/exec/"));
        assert_eq!(sessions.take(&session, 2_000), Some(exec.clone()));
        assert_eq!(
            sessions.take(&session, 2_000),
            None,
            "one connection per URI"
        );
        let uri = sessions.open(exec, 1_000).expect("a URI");
        let session = uri.rsplit('/').next().expect("session").to_owned();
        assert_eq!(
            sessions.take(&session, 1_000 + SESSION_TTL_MS),
            None,
            "expired"
        );
    }
}
