//! The decisions as tables, and the API flows against the in-memory Lease API with paused
//! tokio time: races between contenders, renewals refused for each reason, release.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::fake::{FakeLeases, paused_clock};
use super::*;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

/// A node-Lease style candidate: identity `vn-0`, told apart by `instance`.
fn process(instance: &str) -> Candidate {
    Candidate {
        holder: "vn-0".into(),
        instance: Some(instance.into()),
        duration: Duration::from_secs(40),
        renew_interval: Duration::from_secs(10),
        owner: None,
    }
}

/// An election candidate: the identity alone.
fn replica(name: &str) -> Candidate {
    Candidate {
        holder: name.into(),
        instance: None,
        duration: Duration::from_secs(30),
        renew_interval: Duration::from_secs(10),
        owner: None,
    }
}

/// Held by `holder` (instance `instance`), renewed at `renewed`.
fn held_by(holder: &str, instance: Option<&str>, renewed: u64) -> Lease {
    let mut annotations = BTreeMap::new();
    if let Some(instance) = instance {
        annotations.insert(INSTANCE_ANNOTATION.to_owned(), instance.to_owned());
    }
    annotations.insert(RENEW_INTERVAL_ANNOTATION.to_owned(), "10000".to_owned());
    Lease {
        metadata: ObjectMeta {
            name: Some("lease".into()),
            namespace: Some("ns".into()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(40),
            renew_time: micro_time(at(renewed)),
            acquire_time: micro_time(at(renewed)),
            ..LeaseSpec::default()
        }),
    }
}

fn with(mut lease: Lease, change: impl FnOnce(&mut Lease)) -> Lease {
    change(&mut lease);
    lease
}

fn annotate(key: &str, value: &str) -> impl FnOnce(&mut Lease) {
    let (key, value) = (key.to_owned(), value.to_owned());
    move |lease| {
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key, value);
    }
}

fn held(silent_after: u64, expires: u64, holder: &str, instance: Option<&str>) -> Claim {
    Claim::Held(HeldBy {
        holder: Holder {
            identity: holder.into(),
            instance: instance.map(str::to_owned),
        },
        renewed: at(0),
        expires: at(expires),
        silent_after: at(silent_after),
    })
}

#[test]
fn judging_a_lease() {
    let other = held_by("vn-0", Some("a"), 0);
    let cases: Vec<(&str, Lease, Candidate, u64, Claim)> = vec![
        ("our instance", other.clone(), process("a"), 3, Claim::Ours),
        (
            "another instance of our identity, renewing: watch it until 1.5 intervals and a second",
            other.clone(),
            process("b"),
            3,
            held(16, 40, "vn-0", Some("a")),
        ),
        (
            "a Lease without an instance is not a process's",
            held_by("vn-0", None, 0),
            process("a"),
            3,
            held(16, 40, "vn-0", None),
        ),
        (
            "expired, exactly",
            other.clone(),
            process("b"),
            40,
            Claim::Free,
        ),
        ("expired", other.clone(), process("b"), 41, Claim::Free),
        (
            "released",
            with(other.clone(), annotate(RELEASED_ANNOTATION, "true")),
            process("b"),
            3,
            Claim::Free,
        ),
        (
            "never renewed",
            with(other.clone(), |l| {
                l.spec.as_mut().unwrap().renew_time = None;
            }),
            process("b"),
            3,
            Claim::Free,
        ),
        (
            "nobody holds it",
            with(other.clone(), |l| {
                l.spec.as_mut().unwrap().holder_identity = None;
            }),
            replica("vn-1"),
            3,
            Claim::Free,
        ),
        (
            "an interval longer than the Lease: watched until it expires",
            with(other.clone(), annotate(RENEW_INTERVAL_ANNOTATION, "60000")),
            process("b"),
            3,
            held(40, 40, "vn-0", Some("a")),
        ),
        (
            "no recorded interval: a quarter of the duration",
            with(other, |l| {
                l.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .remove(RENEW_INTERVAL_ANNOTATION);
            }),
            process("b"),
            3,
            held(16, 40, "vn-0", Some("a")),
        ),
        (
            "no duration on the Lease: ours",
            with(held_by("vn-0", None, 0), |l| {
                l.spec.as_mut().unwrap().lease_duration_seconds = None;
            }),
            replica("vn-1"),
            3,
            held(16, 30, "vn-0", None),
        ),
        (
            "an election: the identity is ours",
            held_by("vn-0", None, 0),
            replica("vn-0"),
            5,
            Claim::Ours,
        ),
        (
            "an election: another replica, fresh",
            held_by("vn-0", None, 0),
            replica("vn-1"),
            5,
            held(16, 40, "vn-0", None),
        ),
    ];
    for (name, lease, me, now, expected) in cases {
        assert_eq!(judge(&lease, &me, at(now)), expected, "{name}");
    }
}

#[test]
fn a_second_look_tells_alive_from_silent_from_changed() {
    let first = held_by("vn-0", Some("a"), 0);
    let Claim::Held(look) = judge(&first, &process("b"), at(3)) else {
        panic!("held");
    };
    let cases: Vec<(&str, Option<Lease>, SecondLook)> = vec![
        ("deleted", None, SecondLook::Changed),
        (
            "taken by a third",
            Some(held_by("vn-0", Some("c"), 10)),
            SecondLook::Changed,
        ),
        ("not renewed", Some(first.clone()), SecondLook::Silent),
        (
            "released",
            Some(with(first, annotate(RELEASED_ANNOTATION, "true"))),
            SecondLook::Silent,
        ),
        (
            "renewed",
            Some(held_by("vn-0", Some("a"), 10)),
            SecondLook::Renewed { at: at(10) },
        ),
    ];
    for (name, again, expected) in cases {
        assert_eq!(second_look(&look, again.as_ref()), expected, "{name}");
    }
}

#[test]
fn a_refused_renewal_is_a_loss_a_deletion_or_ours_still() {
    let ours = held_by("vn-0", Some("a"), 0);
    assert_eq!(after_refusal(None, &process("a")), Refusal::Deleted);
    assert_eq!(
        after_refusal(Some(&ours), &process("a")),
        Refusal::StillOurs
    );
    assert_eq!(
        after_refusal(Some(&ours), &process("b")),
        Refusal::Lost {
            holder: Holder {
                identity: "vn-0".into(),
                instance: Some("a".into())
            }
        }
    );
    assert_eq!(
        after_refusal(Some(&held_by("vn-0", None, 0)), &process("a")),
        Refusal::Lost {
            holder: Holder {
                identity: "vn-0".into(),
                instance: None
            }
        },
        "a Lease without our instance is not ours"
    );
}

#[test]
fn claiming_counts_transitions_keeps_others_metadata_and_the_precondition() {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: "vn-0".into(),
        uid: "uid-1".into(),
        ..OwnerReference::default()
    };
    let me = Candidate {
        owner: Some(owner),
        ..process("b")
    };
    let fresh = claimed("lease", "ns", &me, None, at(0));
    let spec = fresh.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("vn-0"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(
        fresh.metadata.annotations.as_ref().unwrap()[INSTANCE_ANNOTATION],
        "b"
    );
    assert_eq!(
        fresh.metadata.annotations.as_ref().unwrap()[RENEW_INTERVAL_ANNOTATION],
        "10000"
    );
    assert_eq!(
        fresh.metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-1"
    );

    let mut theirs = with(
        held_by("vn-0", Some("a"), 0),
        annotate(RELEASED_ANNOTATION, "true"),
    );
    theirs.metadata.resource_version = Some("7".into());
    theirs.metadata.labels = Some(BTreeMap::from([("audited".into(), "yes".into())]));
    let taken = claimed("lease", "ns", &me, Some(&theirs), at(50));
    assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(taken.metadata.labels, theirs.metadata.labels);
    let annotations = taken.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[INSTANCE_ANNOTATION], "b");
    assert!(!annotations.contains_key(RELEASED_ANNOTATION));
    assert_eq!(taken.spec.as_ref().unwrap().lease_transitions, Some(1));
    assert_eq!(
        taken.spec.as_ref().unwrap().acquire_time,
        micro_time(at(50))
    );

    let again = claimed("lease", "ns", &me, Some(&taken), at(60));
    let spec = again.spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(1), "ours: no transition");
    assert_eq!(spec.acquire_time, micro_time(at(50)), "ours: acquired then");
    assert_eq!(spec.renew_time, micro_time(at(60)));

    let released = released(&taken, &me, at(70));
    assert_eq!(
        released.metadata.annotations.unwrap()[RELEASED_ANNOTATION],
        "true"
    );
    assert_eq!(released.spec.unwrap().renew_time, micro_time(at(70)));
}

fn nothing(_: Request) {}

fn lock(fake: &FakeLeases, me: Candidate, clock: &Clock) -> LeaseLock {
    LeaseLock::new(fake.client(), "ns", "lease", me).with_clock(Arc::clone(clock))
}

#[tokio::test(start_paused = true)]
async fn two_contenders_never_both_win() {
    // A Lease nobody has: both read "absent", both create, one is refused.
    let (fake, clock) = (FakeLeases::default(), paused_clock(at(0)));
    let (a, b) = (
        lock(&fake, replica("vn-0"), &clock),
        lock(&fake, replica("vn-1"), &clock),
    );
    let (first, second) = tokio::join!(a.try_acquire(&nothing), b.try_acquire(&nothing));
    let won = [first.unwrap(), second.unwrap()]
        .into_iter()
        .filter(|outcome| matches!(outcome, Acquire::Acquired(_)))
        .count();
    assert_eq!(won, 1, "exactly one creates it");

    // An expired Lease: both judge it free and replace it from the same version; one wins.
    tokio::time::advance(Duration::from_secs(600)).await;
    let (c, d) = (
        lock(&fake, replica("vn-2"), &clock),
        lock(&fake, replica("vn-3"), &clock),
    );
    let (first, second) = tokio::join!(c.try_acquire(&nothing), d.try_acquire(&nothing));
    let outcomes = [first.unwrap(), second.unwrap()];
    let winners: Vec<String> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Acquire::Acquired(lease) => holder_of(lease).identity.into(),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert_eq!(holder_of(&fake.get("lease").unwrap()).identity, winners[0]);
    assert_eq!(
        fake.get("lease").unwrap().spec.unwrap().lease_transitions,
        Some(1)
    );
}

#[tokio::test(start_paused = true)]
async fn an_election_goes_to_the_holder_until_it_falls_silent_or_releases() {
    let (fake, clock) = (FakeLeases::default(), paused_clock(at(0)));
    let (leader, other) = (
        lock(&fake, replica("vn-0"), &clock),
        lock(&fake, replica("vn-1"), &clock),
    );
    assert!(matches!(
        leader.try_acquire(&nothing).await.unwrap(),
        Acquire::Acquired(_)
    ));
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(matches!(
        other.try_acquire(&nothing).await.unwrap(),
        Acquire::Held(_)
    ));
    assert!(
        matches!(
            leader.try_acquire(&nothing).await.unwrap(),
            Acquire::Acquired(_)
        ),
        "the holder renews"
    );
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(matches!(
        other.try_acquire(&nothing).await.unwrap(),
        Acquire::Held(_)
    ));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        matches!(
            other.try_acquire(&nothing).await.unwrap(),
            Acquire::Acquired(_)
        ),
        "30 s of silence: expired"
    );

    let held = fake.get("lease").unwrap();
    other.release(&held, &nothing).await.unwrap();
    assert!(
        matches!(
            leader.try_acquire(&nothing).await.unwrap(),
            Acquire::Acquired(_)
        ),
        "released: taken at once"
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_refused_for_each_reason() {
    let (fake, clock) = (FakeLeases::default(), paused_clock(at(0)));
    let me = lock(&fake, process("a"), &clock);
    let Acquire::Acquired(acquired) = me.try_acquire(&nothing).await.unwrap() else {
        panic!("acquired");
    };
    let mut held = *acquired;
    let requests = std::sync::Mutex::new(Vec::new());
    let count = |request| requests.lock().unwrap().push(request);

    // Someone labels it: our stale write is refused; still ours.
    let labelled = fake.put(with(fake.get("lease").unwrap(), |l| {
        l.metadata.labels = Some(BTreeMap::from([("audited".into(), "yes".into())]));
    }));
    match me.renew(&held, &count).await.unwrap() {
        Renewal::Changed(fresh) => {
            assert_eq!(
                fresh.metadata.resource_version,
                labelled.metadata.resource_version
            );
            held = fresh;
        }
        other => panic!("expected a change, got {other:?}"),
    }
    assert_eq!(*requests.lock().unwrap(), [Request::Renew, Request::Get]);
    let Renewal::Renewed(renewed) = me.renew(&held, &nothing).await.unwrap() else {
        panic!("renewed");
    };
    assert_eq!(renewed.metadata.labels, labelled.metadata.labels);
    held = renewed;

    // Deleted: the write names a uid that is gone.
    fake.delete("lease");
    assert!(matches!(
        me.renew(&held, &nothing).await.unwrap(),
        Renewal::Deleted
    ));
    held = me.take(None, &nothing).await.unwrap();

    // Taken by another process.
    fake.put(with(
        fake.get("lease").unwrap(),
        annotate(INSTANCE_ANNOTATION, "usurper"),
    ));
    match me.renew(&held, &nothing).await.unwrap() {
        Renewal::Lost(holder) => assert_eq!(holder.instance.as_deref(), Some("usurper")),
        other => panic!("expected a loss, got {other:?}"),
    }
}
