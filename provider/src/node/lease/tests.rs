//! The node Lease's rules (as they were before the Lease helper held it), then acquire and
//! renew against the in-memory Lease API with paused tokio time.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use super::*;
use crate::k8s::election::fake::{FakeLeases, paused_clock};
use crate::k8s::election::{Holder, Refusal, after_refusal, claimed, judge};

fn identity(instance: &str) -> LeaseIdentity {
    LeaseIdentity {
        node: "vn-0".into(),
        node_uid: "uid-1".into(),
        instance: instance.into(),
        duration_seconds: 40,
        renew_interval: Duration::from_secs(10),
    }
}

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

fn held(instance: &str, previous: Option<&Lease>, now: SystemTime) -> Lease {
    claimed(
        "vn-0",
        LEASE_NAMESPACE,
        &identity(instance).candidate(),
        previous,
        now,
    )
}

fn annotations(lease: &Lease) -> &std::collections::BTreeMap<String, String> {
    lease.metadata.annotations.as_ref().unwrap()
}

#[test]
fn a_held_lease_names_the_node_and_the_process_and_is_owned_by_the_node() {
    let lease = held("a", None, at(0));
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("vn-0"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert_eq!(annotations(&lease)[INSTANCE_ANNOTATION], "a");
    assert_eq!(
        lease.metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-1"
    );
    assert_eq!(
        lease.metadata.owner_references.as_ref().unwrap()[0].kind,
        "Node"
    );
    assert_eq!(spec.lease_transitions, Some(0));
    let taken = held("b", Some(&lease), at(5));
    assert_eq!(taken.spec.unwrap().lease_transitions, Some(1));
}

#[test]
fn a_refused_renewal_is_a_loss_a_deletion_or_a_retry() {
    let ours = held("a", None, at(0));
    let me = |instance: &str| identity(instance).candidate();
    assert_eq!(after_refusal(None, &me("a")), Refusal::Deleted);
    assert_eq!(after_refusal(Some(&ours), &me("a")), Refusal::StillOurs);
    let lost = |instance: Option<&str>| Refusal::Lost {
        holder: Holder {
            identity: "vn-0".into(),
            instance: instance.map(str::to_owned),
        },
    };
    assert_eq!(after_refusal(Some(&ours), &me("b")), lost(Some("a")));
    let mut unnamed = ours;
    unnamed.metadata.annotations = Some(Default::default());
    assert_eq!(
        after_refusal(Some(&unnamed), &me("a")),
        lost(None),
        "a Lease without our annotation is not ours"
    );
}

#[test]
fn assessing_other_holders() {
    let other = held("a", None, at(0));
    match judge(&other, &identity("b").candidate(), at(3)) {
        Claim::Held(first) => {
            assert_eq!(first.holder.instance.as_deref(), Some("a"));
            assert_eq!(
                first.silent_after,
                at(16),
                "1.5 renew intervals and a second after its renewal"
            );
        }
        other => panic!("expected to observe, got {other:?}"),
    }
    assert_eq!(
        judge(&other, &identity("b").candidate(), at(41)),
        Claim::Free,
        "expired"
    );
    assert_eq!(
        judge(&other, &identity("a").candidate(), at(3)),
        Claim::Ours,
        "ours"
    );
    let mut released = other;
    released
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(RELEASED_ANNOTATION.into(), "true".into());
    assert_eq!(
        judge(&released, &identity("b").candidate(), at(3)),
        Claim::Free,
        "released"
    );
}

fn count(telemetry: &Telemetry, operation: &str) -> u64 {
    telemetry
        .render()
        .lines()
        .find(|line| {
            line.starts_with(&format!(
                "virtual_node_eci_kube_requests_total{{operation=\"{operation}\"}}"
            ))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A process for `vn-0` against `fake`, on `clock`.
async fn acquire(
    fake: &FakeLeases,
    instance: &str,
    clock: &crate::k8s::election::Clock,
    telemetry: &Telemetry,
) -> Result<NodeLease, LeaseError> {
    let identity = identity(instance);
    let lock = LeaseLock::new(fake.client(), LEASE_NAMESPACE, "vn-0", identity.candidate())
        .with_clock(std::sync::Arc::clone(clock));
    NodeLease::acquire_with(lock, identity, telemetry).await
}

/// The Lease held by another process `instance`, renewed at `now`.
fn renewed_by(fake: &FakeLeases, instance: &str, now: SystemTime) {
    let mut lease = fake
        .get("vn-0")
        .unwrap_or_else(|| held(instance, None, now));
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(INSTANCE_ANNOTATION.into(), instance.into());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = Some(MicroTime(now.try_into().unwrap()));
    fake.put(lease);
}

#[tokio::test(start_paused = true)]
async fn a_silent_holder_is_taken_over_after_one_and_a_half_intervals_a_live_one_refuses_us() {
    let (fake, clock) = (FakeLeases::default(), paused_clock(at(0)));
    let telemetry = std::sync::Arc::new(Telemetry::new());

    // A holder that renewed just now and then fell silent (a crash).
    renewed_by(&fake, "crashed", clock());
    let started = tokio::time::Instant::now();
    let successor = acquire(&fake, "successor", &clock, &telemetry)
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(16));
    let stored = fake.get("vn-0").unwrap();
    assert_eq!(annotations(&stored)[INSTANCE_ANNOTATION], "successor");
    assert_eq!(stored.spec.unwrap().lease_transitions, Some(1));
    assert_eq!(
        (
            count(&telemetry, "lease_get"),
            count(&telemetry, "lease_take_over")
        ),
        (2, 1)
    );

    // The successor renews every 10 s: a third process is refused, naming it.
    let stop = CancellationToken::new();
    let renewing = tokio::spawn({
        let (telemetry, stop) = (std::sync::Arc::clone(&telemetry), stop.clone());
        let mut successor = successor;
        async move {
            let (_uid, mut node_uid) = tokio::sync::watch::channel("uid-1".to_owned());
            successor
                .keep_renewing(&telemetry, &stop, &mut node_uid)
                .await
                .unwrap();
            successor
        }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = tokio::time::Instant::now();
    match acquire(&fake, "third", &clock, &telemetry).await {
        Err(LeaseError::HeldByLiveProcess { instance, .. }) => assert_eq!(instance, "successor"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(11),
        "it renewed at 10 s"
    );
    stop.cancel();
    let successor = renewing.await.unwrap();

    // Released: taken at once, from the first read.
    successor.release(&telemetry).await;
    let (gets, takeovers) = (
        count(&telemetry, "lease_get"),
        count(&telemetry, "lease_take_over"),
    );
    let started = tokio::time::Instant::now();
    let mut fourth = acquire(&fake, "fourth", &clock, &telemetry).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        (
            count(&telemetry, "lease_get") - gets,
            count(&telemetry, "lease_take_over") - takeovers
        ),
        (1, 1)
    );

    // Deleted under us: the renewal (refused: the uid is gone) creates it again.
    fake.delete("vn-0");
    fourth.renew(&telemetry).await.unwrap();
    assert_eq!(
        annotations(&fake.get("vn-0").unwrap())[INSTANCE_ANNOTATION],
        "fourth"
    );
    fourth.renew(&telemetry).await.unwrap();
}
