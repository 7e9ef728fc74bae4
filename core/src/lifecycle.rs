//! The life of one pod on a virtual node, as the daemon's pod controller tracks it: one state
//! at a time, each carrying only what is valid in it (a group id only where a group exists),
//! and every transition a pure function of (state, event) that names the next state and what
//! the controller must do. The controller applies events under its lock and carries the effects
//! out; a transition that cannot happen is refused (the state stays as it was) and logged.
//!
//! The table test at the end of this file is the specification: every state against every
//! event.

/// Where a pod is in its life on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Lifecycle {
    /// No group and nothing under way: a pod just seen, a finished pod, or one whose deletion
    /// gave up (its next event starts the deletion again).
    #[default]
    Idle,
    /// Refused by the namespace scope or the annotation policy: judged again when the pod
    /// changes, or the policy or its namespace's labels do.
    Held,
    /// A create is queued, in flight or waiting out its back-off.
    Creating,
    /// No group, and none will be created: the pod does not run on virtual nodes, ECI can
    /// never run it as written, or its group vanished.
    GivenUp,
    /// A group the status poll found, tagged with the pod's UID, while no create answered for
    /// it: an earlier attempt made it and its answer was lost.
    Unanswered {
        /// The group's id.
        group: Box<str>,
        /// Whether its id is on the pod or queued to ride on its next status apply.
        annotated: bool,
    },
    /// The pod's group exists: created, adopted at start-up, or found by the poll.
    Created {
        /// The group's id.
        group: Box<str>,
        /// Whether its id is on the pod or queued to ride on its next status apply.
        annotated: bool,
    },
    /// A full listing missed the pod's group and a read confirmed it gone: the pod's next sync
    /// shows it lost, and nothing is created for it again.
    Lost {
        /// The group that vanished.
        group: Box<str>,
    },
    /// The pod passed its active deadline: it stays, Failed, and its group (`group`, while its
    /// deletion runs) is deleted; nothing is created for it again.
    Stopped {
        /// `None` once ECI accepted the group's deletion.
        group: Option<Box<str>>,
    },
    /// The pod is being deleted: its deletion (queued) deletes `group` (the group known when the
    /// deletion began), then the pod.
    Deleting {
        /// `None` once the deletion deleted it, or when the pod had none yet.
        group: Option<Box<str>>,
    },
}

/// The pod as a watch event (or a resync) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed<'a> {
    /// It carries a deletionTimestamp.
    pub terminating: bool,
    /// Its phase is Succeeded or Failed: it never runs again.
    pub finished: bool,
    /// Why it never runs on a virtual node (a static pod, a DaemonSet's), when so.
    pub unfit: Option<&'static str>,
    /// The instance-id annotation it shows.
    pub annotation: Option<&'a str>,
}

/// What happens to a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger<'a> {
    /// Start-up: ECI lists this group, tagged with this cluster, this node and the pod's UID.
    Adopted(&'a str),
    /// The watch shows the pod (a resync shows it again).
    Observed(Observed<'a>),
    /// A create answered with this group (also an answer recovered by the group's tags after
    /// the first one was lost).
    Created(&'a str),
    /// A create failed for good (ECI can never run the pod as written, an annotation is
    /// malformed): no more attempts.
    CreateFailed,
    /// The status poll lists this group with the pod's UID tag.
    Found(&'a str),
    /// The namespace scope or the annotation policy refused the pod.
    Refused,
    /// A full listing missed the group and a direct read confirmed it gone.
    Vanished,
    /// The deletion's group deletion ended: ECI accepted it or knows no such group.
    GroupDeleted,
    /// The deletion could not remove the pod.
    PodDeletionFailed,
    /// The pod, still running, is past its active deadline.
    DeadlinePassed,
}

/// What the controller does after a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Nothing.
    Nothing,
    /// Queue a create.
    Create,
    /// Tell the pod's author why it does not run here.
    Skip(&'static str),
    /// Record this group's id on the pod.
    Annotate(Box<str>),
    /// Start the deletion: this group (the pod's, if it has one yet), then the pod.
    Delete(Option<Box<str>>),
    /// Delete this group in the background: its pod is being deleted already.
    DeleteGroup(Box<str>),
    /// Fail the pod for its deadline and delete this group (the pod's, if the deletion is not
    /// under way already).
    Stop(Option<Box<str>>),
    /// Fail the pod: this group vanished.
    ShowLost(Box<str>),
}

/// A transition that cannot happen; the state stays as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no transition from {state} on {event}")]
pub struct Impossible {
    /// The state's name.
    state: &'static str,
    /// The event's name.
    event: &'static str,
}

/// The next state and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub next: Lifecycle,
    pub effect: Effect,
}

fn go(next: Lifecycle, effect: Effect) -> Result<Step, Lifecycle> {
    Ok(Step { next, effect })
}

fn stay(state: Lifecycle) -> Result<Step, Lifecycle> {
    go(state, Effect::Nothing)
}

impl Lifecycle {
    /// The pod's group, while one is known (the kubelet API's and the metrics' only source of
    /// group ids).
    pub fn group(&self) -> Option<&str> {
        match self {
            Self::Unanswered { group, .. }
            | Self::Created { group, .. }
            | Self::Stopped { group: Some(group) }
            | Self::Deleting { group: Some(group) } => Some(group),
            _ => None,
        }
    }

    /// The pod's group, while it runs and the pod is not being deleted.
    pub fn live_group(&self) -> Option<&str> {
        match self {
            Self::Unanswered { group, .. } | Self::Created { group, .. } => Some(group),
            _ => None,
        }
    }

    /// Whether the pod is being deleted.
    pub fn is_deleting(&self) -> bool {
        matches!(self, Self::Deleting { .. })
    }

    /// The group, taken with the state (the pod is no longer tracked).
    pub fn into_group(self) -> Option<Box<str>> {
        match self {
            Self::Unanswered { group, .. } | Self::Created { group, .. } => Some(group),
            Self::Stopped { group } | Self::Deleting { group } => group,
            _ => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Held => "held",
            Self::Creating => "creating",
            Self::GivenUp => "given up",
            Self::Lost { .. } => "group vanished",
            Self::Unanswered { .. } => "group found, create unanswered",
            Self::Created { .. } => "created",
            Self::Stopped { .. } => "stopped at its deadline",
            Self::Deleting { .. } => "deleting",
        }
    }

    /// The state after `event`, and what to do; a refusal hands the state back unchanged.
    pub fn on(self, event: Trigger<'_>) -> Result<Step, (Self, Impossible)> {
        let name = self.name();
        self.next(event).map_err(|state| {
            let event = event.name();
            (state, Impossible { state: name, event })
        })
    }

    #[allow(
        clippy::match_same_arms,
        reason = "a transition table: each event's rows stay together"
    )]
    fn next(self, event: Trigger<'_>) -> Result<Step, Self> {
        use Lifecycle::{
            Created, Creating, Deleting, GivenUp, Held, Idle, Lost, Stopped, Unanswered,
        };
        match (self, event) {
            // At start-up, before the watch: a pod listed twice (two groups under its UID
            // tag) keeps the later, as the listing comes.
            (Idle | Created { .. }, Trigger::Adopted(id)) => go(
                Created {
                    group: id.into(),
                    annotated: false,
                },
                Effect::Nothing,
            ),
            (state, Trigger::Adopted(_)) => Err(state),
            (state, Trigger::Observed(pod)) => observed(state, pod),
            // The pod began deleting, or was stopped, while its create was in flight: the new
            // group has no pod to run for.
            (state @ (Deleting { .. } | Stopped { .. }), Trigger::Created(id)) => {
                go(state, Effect::DeleteGroup(id.into()))
            }
            // Whatever the poll found meanwhile, the answer names the pod's group.
            (_, Trigger::Created(id)) => go(
                Created {
                    group: id.into(),
                    annotated: true,
                },
                Effect::Annotate(id.into()),
            ),
            (Creating, Trigger::CreateFailed) => stay(GivenUp),
            (
                state @ (Unanswered { .. } | Deleting { .. } | Stopped { .. }),
                Trigger::CreateFailed,
            ) => stay(state),
            (state, Trigger::CreateFailed) => Err(state),
            (Idle | Held, Trigger::Found(id)) => stay(Created {
                group: id.into(),
                annotated: false,
            }),
            (Creating | GivenUp | Lost { .. }, Trigger::Found(id)) => stay(Unanswered {
                group: id.into(),
                annotated: false,
            }),
            (state, Trigger::Found(_)) => stay(state),
            (Idle | Held | Creating | GivenUp, Trigger::Refused) => stay(Held),
            // A group an earlier attempt made runs on; no create for it is under way.
            (Unanswered { group, annotated }, Trigger::Refused) => {
                stay(Created { group, annotated })
            }
            (state, Trigger::Refused) => stay(state),
            (Deleting { .. }, Trigger::Vanished) => stay(Deleting { group: None }),
            (Stopped { .. }, Trigger::Vanished) => stay(Stopped { group: None }),
            // A vanished group is not created again: the pod's sync shows it lost.
            (Unanswered { group, .. } | Created { group, .. }, Trigger::Vanished) => {
                stay(Lost { group })
            }
            (state @ Lost { .. }, Trigger::Vanished) => stay(state),
            (_, Trigger::Vanished) => stay(GivenUp),
            (Deleting { .. }, Trigger::GroupDeleted) => stay(Deleting { group: None }),
            (Stopped { .. }, Trigger::GroupDeleted) => stay(Stopped { group: None }),
            (state, Trigger::GroupDeleted) => Err(state),
            (Deleting { group: None }, Trigger::PodDeletionFailed) => stay(Idle),
            (state, Trigger::PodDeletionFailed) => Err(state),
            // The kubelet stops the pod's containers and fails the pod; here the group goes.
            (Unanswered { group, .. } | Created { group, .. }, Trigger::DeadlinePassed) => go(
                Stopped {
                    group: Some(group.clone()),
                },
                Effect::Stop(Some(group)),
            ),
            // The pod still shows it running (the failure's write did not land): written again;
            // the group's deletion runs on its own.
            (state @ Stopped { .. }, Trigger::DeadlinePassed) => go(state, Effect::Stop(None)),
            (state, Trigger::DeadlinePassed) => stay(state),
        }
    }
}

/// A watch event's transition.
fn observed(state: Lifecycle, pod: Observed<'_>) -> Result<Step, Lifecycle> {
    use Lifecycle::{Created, Creating, Deleting, GivenUp, Held, Idle, Lost, Stopped, Unanswered};
    if pod.terminating {
        return match state {
            Deleting { .. } => stay(state),
            state => {
                let group = state.into_group();
                go(
                    Deleting {
                        group: group.clone(),
                    },
                    Effect::Delete(group),
                )
            }
        };
    }
    match state {
        // A deletionTimestamp is never taken back: a copy without one predates it (a status
        // write's answer kept just after the deletion began, shown again by a resync). A
        // create under way or given up is not started again.
        Deleting { .. } | Creating | GivenUp | Stopped { .. } => stay(state),
        Lost { group } => go(GivenUp, Effect::ShowLost(group)),
        Created { group, annotated } => {
            let (annotated, effect) = annotation(group.clone(), annotated, pod.annotation);
            go(Created { group, annotated }, effect)
        }
        Unanswered { group, annotated } => {
            let (annotated, effect) = annotation(group.clone(), annotated, pod.annotation);
            go(Unanswered { group, annotated }, effect)
        }
        Idle | Held if pod.finished => stay(state),
        Idle | Held => match pod.unfit {
            Some(reason) => go(GivenUp, Effect::Skip(reason)),
            // A held pod that changed is judged again.
            None => go(Creating, Effect::Create),
        },
    }
}

/// Whether the group's id is on the pod after this event, and whether to write it there. The
/// annotation is only ever our output, never read back: missing (the process died before it
/// wrote it) or written over by whoever may edit the pod, ours is written again.
fn annotation(group: Box<str>, annotated: bool, shown: Option<&str>) -> (bool, Effect) {
    match shown {
        Some(shown) if *shown == *group => (true, Effect::Nothing),
        None if annotated => (true, Effect::Nothing),
        // Missing and not queued, or someone else's id.
        _ => (true, Effect::Annotate(group)),
    }
}

impl Trigger<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::Adopted(_) => "adopted",
            Self::Observed(pod) if pod.terminating => "observed terminating",
            Self::Observed(_) => "observed",
            Self::Created(_) => "created",
            Self::CreateFailed => "create failed",
            Self::Found(_) => "found",
            Self::Refused => "refused",
            Self::Vanished => "vanished",
            Self::GroupDeleted => "group deleted",
            Self::PodDeletionFailed => "pod deletion failed",
            Self::DeadlinePassed => "deadline passed",
        }
    }
}

#[cfg(test)]
mod tests;
