//! The specification of a pod's life on this node: every state against every event.

use super::*;

use Lifecycle::{Created, Creating, Deleting, GivenUp, Held, Idle, Lost, Stopped, Unanswered};

/// The group the state holds, when it holds one.
const OURS: &str = "eci-1";
/// A group id an event brings.
const NEW: &str = "eci-2";
const UNFIT: &str = "DaemonSet pods do not run on virtual nodes";

fn created(group: &str, annotated: bool) -> Lifecycle {
    Created {
        group: group.into(),
        annotated,
    }
}

fn unanswered(group: &str, annotated: bool) -> Lifecycle {
    Unanswered {
        group: group.into(),
        annotated,
    }
}

fn stopped(group: Option<&str>) -> Lifecycle {
    Stopped {
        group: group.map(Into::into),
    }
}

fn deleting(group: Option<&str>) -> Lifecycle {
    Deleting {
        group: group.map(Into::into),
    }
}

/// Every state, each group-holding one as after a create answered (annotated).
fn states() -> [Lifecycle; 11] {
    [
        Idle,
        Held,
        Creating,
        GivenUp,
        Lost { group: OURS.into() },
        unanswered(OURS, true),
        created(OURS, true),
        stopped(Some(OURS)),
        stopped(None),
        deleting(Some(OURS)),
        deleting(None),
    ]
}

const PLAIN: Observed<'static> = Observed {
    terminating: false,
    finished: false,
    unfit: None,
    annotation: Some(OURS),
};

/// Every event (the pod shown in each way that makes a difference).
fn events() -> [(&'static str, Trigger<'static>); 16] {
    [
        ("adopted", Trigger::Adopted(NEW)),
        ("observed", Trigger::Observed(PLAIN)),
        (
            "observed, no annotation",
            Trigger::Observed(Observed {
                annotation: None,
                ..PLAIN
            }),
        ),
        (
            "observed, annotation written over",
            Trigger::Observed(Observed {
                annotation: Some("eci-forged"),
                ..PLAIN
            }),
        ),
        (
            "observed finished",
            Trigger::Observed(Observed {
                finished: true,
                ..PLAIN
            }),
        ),
        (
            "observed unfit",
            Trigger::Observed(Observed {
                unfit: Some(UNFIT),
                ..PLAIN
            }),
        ),
        (
            "observed terminating",
            Trigger::Observed(Observed {
                terminating: true,
                ..PLAIN
            }),
        ),
        ("created", Trigger::Created(NEW)),
        ("create failed", Trigger::CreateFailed),
        ("found", Trigger::Found(NEW)),
        ("refused", Trigger::Refused),
        ("vanished", Trigger::Vanished),
        ("group deleted", Trigger::GroupDeleted),
        ("pod deletion failed", Trigger::PodDeletionFailed),
        ("deadline passed", Trigger::DeadlinePassed),
        (
            "observed terminating and finished",
            Trigger::Observed(Observed {
                terminating: true,
                finished: true,
                annotation: None,
                ..PLAIN
            }),
        ),
    ]
}

/// What a row expects: the next state and effect, or a refusal.
type Outcome = Option<(Lifecycle, Effect)>;

fn to(next: Lifecycle, effect: Effect) -> Outcome {
    Some((next, effect))
}

fn same(state: &Lifecycle) -> Outcome {
    Some((state.clone(), Effect::Nothing))
}

const REFUSED: Outcome = None;

/// The specification, row by row: (event, state) → outcome.
#[allow(
    clippy::match_same_arms,
    reason = "the specification: each event's rows stay together"
)]
fn expected(event: &str, state: &Lifecycle) -> Outcome {
    let nothing = Effect::Nothing;
    let delete_ours = || Effect::Delete(Some(OURS.into()));
    match (event, state) {
        // Start-up adoption runs before the watch, on pods nobody tracks yet; a second group
        // under one pod UID replaces the first, as the listing comes.
        ("adopted", Idle | Created { .. }) => to(created(NEW, false), nothing),
        ("adopted", _) => REFUSED,

        // A pod seen: created when it is new or held (a held pod that changed is judged
        // again); its group's id written on it when missing or written over.
        (
            "observed" | "observed, no annotation" | "observed, annotation written over",
            Idle | Held,
        ) => to(Creating, Effect::Create),
        ("observed", Unanswered { .. } | Created { .. }) => same(state),
        ("observed, no annotation", Unanswered { .. } | Created { .. }) => same(state),
        ("observed, annotation written over", Unanswered { .. } | Created { .. }) => {
            to(state.clone(), Effect::Annotate(OURS.into()))
        }
        ("observed finished", Idle | Held) => same(state),
        ("observed unfit", Idle | Held) => to(GivenUp, Effect::Skip(UNFIT)),
        // A vanished group's pod is shown lost once, by the sync after the listing.
        (
            "observed"
            | "observed, no annotation"
            | "observed, annotation written over"
            | "observed finished"
            | "observed unfit",
            Lost { .. },
        ) => to(GivenUp, Effect::ShowLost(OURS.into())),
        (
            "observed"
            | "observed, no annotation"
            | "observed, annotation written over"
            | "observed finished"
            | "observed unfit",
            Creating | GivenUp | Unanswered { .. } | Created { .. } | Stopped { .. },
        ) => same(state),
        // A deletionTimestamp is never removed: a copy without one is older than the
        // deletion and changes nothing.
        (
            "observed"
            | "observed, no annotation"
            | "observed, annotation written over"
            | "observed finished"
            | "observed unfit",
            Deleting { .. },
        ) => same(state),
        // Deleting: what the pod has of a group goes first. A delete arriving while the create
        // is in flight deletes the pod alone; the create's answer is handled below.
        (
            "observed terminating" | "observed terminating and finished",
            Unanswered { .. } | Created { .. } | Stopped { group: Some(_) },
        ) => to(deleting(Some(OURS)), delete_ours()),
        ("observed terminating" | "observed terminating and finished", Deleting { .. }) => {
            same(state)
        }
        ("observed terminating" | "observed terminating and finished", _) => {
            to(deleting(None), Effect::Delete(None))
        }

        // A create's answer (also one recovered by the group's tags after the first answer
        // was lost) names the pod's group, whatever the poll found meanwhile; arriving after
        // the pod began deleting, the new group is deleted.
        ("created", Deleting { .. } | Stopped { .. }) => {
            to(state.clone(), Effect::DeleteGroup(NEW.into()))
        }
        ("created", _) => to(created(NEW, true), Effect::Annotate(NEW.into())),
        ("create failed", Creating) => to(GivenUp, nothing),
        ("create failed", Unanswered { .. } | Deleting { .. } | Stopped { .. }) => same(state),
        ("create failed", _) => REFUSED,

        // The status poll's find: the pod's group when none is known (a lost answer).
        ("found", Idle | Held) => to(created(NEW, false), nothing),
        ("found", Creating | GivenUp | Lost { .. }) => to(unanswered(NEW, false), nothing),
        ("found", _) => same(state),

        ("refused", Idle | Held | Creating | GivenUp) => to(Held, nothing),
        ("refused", Unanswered { .. }) => to(created(OURS, true), nothing),
        ("refused", _) => same(state),

        ("vanished", Deleting { .. }) => to(deleting(None), nothing),
        ("vanished", Stopped { .. }) => to(stopped(None), nothing),
        ("vanished", Unanswered { .. } | Created { .. }) => {
            to(Lost { group: OURS.into() }, nothing)
        }
        ("vanished", Lost { .. }) => same(state),
        ("vanished", _) => to(GivenUp, nothing),
        ("group deleted", Deleting { .. }) => to(deleting(None), nothing),
        ("group deleted", Stopped { .. }) => to(stopped(None), nothing),
        ("group deleted", _) => REFUSED,
        ("pod deletion failed", Deleting { group: None }) => to(Idle, nothing),
        ("pod deletion failed", _) => REFUSED,

        // Past its deadline, a running pod fails and its group is deleted; one already
        // stopped is only shown failed again (its group's deletion runs on its own); nothing
        // else has a group to stop.
        ("deadline passed", Unanswered { .. } | Created { .. }) => {
            to(stopped(Some(OURS)), Effect::Stop(Some(OURS.into())))
        }
        ("deadline passed", Stopped { .. }) => to(state.clone(), Effect::Stop(None)),
        ("deadline passed", _) => same(state),
        (event, state) => panic!("the specification misses {event} in {state:?}"),
    }
}

#[test]
fn every_state_meets_every_event_as_specified() {
    let mut pairs = 0;
    for state in states() {
        for (name, event) in events() {
            let outcome = match state.clone().on(event) {
                Ok(step) => Some((step.next, step.effect)),
                Err((back, impossible)) => {
                    assert_eq!(back, state, "a refusal hands the state back");
                    assert_eq!(impossible.state, state.name());
                    None
                }
            };
            assert_eq!(outcome, expected(name, &state), "{name} in {state:?}");
            pairs += 1;
        }
    }
    assert_eq!(pairs, states().len() * events().len());
}

#[test]
fn an_annotation_is_written_once_until_it_is_written_over() {
    let seen = |annotation| {
        Trigger::Observed(Observed {
            annotation,
            ..PLAIN
        })
    };
    // Adopted after a restart before the id was ever written: written once, not at every
    // event while the write is queued.
    let step = Idle.on(Trigger::Adopted(OURS)).unwrap();
    let step = step.next.on(seen(None)).unwrap();
    assert_eq!(step.effect, Effect::Annotate(OURS.into()));
    let step = step.next.on(seen(None)).unwrap();
    assert_eq!(step.effect, Effect::Nothing);
    let step = step.next.on(seen(Some(OURS))).unwrap();
    assert_eq!(
        (step.next.clone(), step.effect),
        (created(OURS, true), Effect::Nothing)
    );
}

#[test]
fn only_created_adopted_or_found_groups_are_a_pods_group() {
    assert_eq!(Idle.group(), None);
    assert_eq!(Held.group(), None);
    assert_eq!(Creating.group(), None);
    assert_eq!(GivenUp.group(), None);
    assert_eq!(unanswered(OURS, false).group(), Some(OURS));
    assert_eq!(created(OURS, false).group(), Some(OURS));
    assert_eq!(stopped(Some(OURS)).group(), Some(OURS));
    assert_eq!(stopped(None).group(), None);
    assert_eq!(
        stopped(Some(OURS)).live_group(),
        None,
        "a stopped pod's status is not synced"
    );
    assert_eq!(deleting(Some(OURS)).group(), Some(OURS));
    assert_eq!(deleting(None).group(), None);
    // Whatever the pod's annotation says, it names no group.
    let forged = Trigger::Observed(Observed {
        annotation: Some("eci-forged"),
        ..PLAIN
    });
    for state in states() {
        if let Ok(step) = state.clone().on(forged) {
            assert_ne!(step.next.group(), Some("eci-forged"), "{state:?}");
        }
    }
}
