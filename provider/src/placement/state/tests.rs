// Fixtures take `json!` values built inline by each caller.
#![allow(clippy::needless_pass_by_value)]

use std::sync::Arc;

use super::*;

fn policy(value: serde_json::Value) -> ResourcePolicy {
    serde_json::from_value(value).unwrap()
}

fn node(name: &str, labels: serde_json::Value, cpu: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"}},
    }))
    .unwrap()
}

fn pod(name: &str, labels: serde_json::Value, node: Option<&str>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": labels,
            "creationTimestamp": "2026-11-23T10:00:00Z"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
    }))
    .unwrap()
}

fn index_with(spec: serde_json::Value) -> (PlacementIndex, PolicyEntry) {
    let index = PlacementIndex::new(VirtualNodes::default());
    index.set_policies([policy(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-11-23T09:00:00Z"},
        "spec": spec,
    }))]);
    index.set_nodes([
        node(
            "sub-1",
            serde_json::json!({"paidtype": "subscription"}),
            "2",
        ),
        node(
            "sub-2",
            serde_json::json!({"paidtype": "subscription"}),
            "2",
        ),
        node(
            "payg-1",
            serde_json::json!({"paidtype": "pay-as-you-go"}),
            "2",
        ),
        node(
            "vk-0",
            serde_json::json!({"k8s.aliyun.com/vnode": "true"}),
            "1000",
        ),
    ]);
    index.set_pods(Vec::<Pod>::new());
    let entry = index
        .policy_for(
            "ns",
            &BTreeMap::from([("app".to_owned(), "web".to_owned())]),
        )
        .unwrap();
    (index, entry)
}

fn seed() -> serde_json::Value {
    serde_json::json!({
        "selector": {"app": "web"},
        "units": [
            {"resource": "ecs", "nodeSelector": {"paidtype": "subscription"}, "max": 5},
            {"resource": "ecs", "nodeSelector": {"paidtype": "pay-as-you-go"}},
            {"resource": "eci"},
        ],
    })
}

/// Counts taken before the pods are listed would miss them: no place until all three sources
/// were listed whole, and the first full listing is reported once.
#[test]
fn no_place_is_granted_until_policies_nodes_and_pods_are_listed() {
    let index = PlacementIndex::new(VirtualNodes::default());
    let spec = seed();
    let listed = index.set_policies([policy(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-11-23T09:00:00Z"},
        "spec": spec,
    }))]);
    assert!(!listed);
    let sub = node(
        "sub-1",
        serde_json::json!({"paidtype": "subscription"}),
        "2",
    );
    assert!(!index.set_nodes([sub]));
    let entry = index
        .policy_for(
            "ns",
            &BTreeMap::from([("app".to_owned(), "web".to_owned())]),
        )
        .unwrap();
    let pending = PodEntry::of(&pod("one", serde_json::json!({"app": "web"}), None));
    let not_listed = Err(Refusal::NotListed {
        policy: "ns/p".into(),
    });
    assert!(!index.is_listed());
    assert_eq!(
        index.reserve_on_node(&entry, &pending, "sub-1", "r1"),
        not_listed
    );
    assert_eq!(index.reserve_unit(&entry, &pending, 0, "r2"), not_listed);
    let chosen = index.choose(&entry, &pending, None, SystemTime::now());
    assert_eq!(chosen.map(|_| ()), not_listed.map(|_| ()));

    assert!(index.set_pods(Vec::<Pod>::new()), "the listing is complete");
    assert!(index.is_listed());
    assert!(
        !index.set_pods(Vec::<Pod>::new()),
        "a relist is not a first listing"
    );
    assert!(
        index
            .reserve_on_node(&entry, &pending, "sub-1", "r1")
            .is_ok()
    );
}

/// Fifty binds racing for a unit with `max: 5`, for two groups at once: exactly five per
/// group get a place.
#[test]
fn concurrent_reservations_never_exceed_max_per_group() {
    let mut spec = seed();
    spec["matchLabelKeys"] = serde_json::json!(["pod-template-hash"]);
    let (index, entry) = index_with(spec);
    let index = Arc::new(index);
    let mut threads = Vec::new();
    for i in 0..100 {
        let (index, entry) = (Arc::clone(&index), entry.clone());
        threads.push(std::thread::spawn(move || {
            let hash = if i % 2 == 0 { "a" } else { "b" };
            let pod = PodEntry::of(&pod(
                &format!("p{i}"),
                serde_json::json!({"app": "web", "pod-template-hash": hash}),
                None,
            ));
            index
                .reserve_on_node(&entry, &pod, "sub-1", &pod.uid)
                .ok()
                .map(|_| hash)
        }));
    }
    let granted: Vec<&str> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(granted.iter().filter(|h| **h == "a").count(), 5);
    assert_eq!(granted.iter().filter(|h| **h == "b").count(), 5);
}

#[test]
fn a_bound_pod_replaces_its_reservation_and_is_counted_once() {
    let (index, entry) = index_with(seed());
    let pending = pod("one", serde_json::json!({"app": "web"}), None);
    let entry_pod = PodEntry::of(&pending);
    let placement = index
        .reserve_on_node(&entry, &entry_pod, "sub-1", &entry_pod.uid)
        .unwrap();
    assert_eq!(placement.unit, 0);
    assert_eq!(placement.annotations[DELETION_COST_ANNOTATION], "300");
    // A retried bind of the same pod does not take a second place.
    index
        .reserve_on_node(&entry, &entry_pod, "sub-1", &entry_pod.uid)
        .unwrap();
    assert_eq!(index.unit_counts(&entry)[0].values().sum::<u32>(), 0);
    index.apply_pod(&pod(
        "one",
        serde_json::json!({"app": "web"}),
        Some("sub-1"),
    ));
    let (choice, _) = index
        .choose(
            &entry,
            &PodEntry::of(&pod("two", serde_json::json!({"app": "web"}), None)),
            Some(&["sub-1".to_owned()]),
            SystemTime::now(),
        )
        .unwrap();
    assert_eq!(choice.destination, Destination::Place(0));
    assert_eq!(index.unit_counts(&entry)[0].values().sum::<u32>(), 1);
}

#[test]
fn a_full_unit_refuses_with_its_reason() {
    let (index, entry) = index_with(seed());
    for i in 0..5 {
        index.apply_pod(&pod(
            &format!("p{i}"),
            serde_json::json!({"app": "web"}),
            Some("sub-1"),
        ));
    }
    let late = PodEntry::of(&pod("late", serde_json::json!({"app": "web"}), None));
    let refusal = index
        .reserve_on_node(&entry, &late, "sub-2", &late.uid)
        .unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "ResourcePolicy ns/p: unit 1 (ecs paidtype=subscription) is full (max 5)"
    );
    // Other units still take it; nodes outside every unit never do.
    assert_eq!(
        index
            .reserve_on_node(&entry, &late, "payg-1", &late.uid)
            .unwrap()
            .unit,
        1
    );
    index.apply_node(&node("spot", serde_json::json!({"paidtype": "spot"}), "2"));
    assert!(matches!(
        index.reserve_on_node(&entry, &late, "spot", &late.uid),
        Err(Refusal::NotInUnit { .. })
    ));
}

#[test]
fn admission_placement_sees_room_left_on_the_units_nodes() {
    let (index, entry) = index_with(serde_json::json!({
        "selector": {"app": "web"},
        "units": [
            {"resource": "ecs", "nodeSelector": {"paidtype": "subscription"}},
            {"resource": "ecs", "nodeSelector": {"paidtype": "pay-as-you-go"}},
            {"resource": "eci"},
        ],
    }));
    let new = PodEntry::of(&pod("new", serde_json::json!({"app": "web"}), None));
    let unit = |index: &PlacementIndex| {
        let (choice, _) = index.choose(&entry, &new, None, SystemTime::now()).unwrap();
        placed_unit(&choice)
    };
    assert_eq!(unit(&index), Some(0));
    // Both 2-CPU subscription nodes taken by 2-CPU pods (one of them not ours).
    index.apply_pod(&pod("a", serde_json::json!({"app": "web"}), Some("sub-1")));
    index.apply_pod(&pod(
        "other",
        serde_json::json!({"app": "db"}),
        Some("sub-2"),
    ));
    assert_eq!(unit(&index), Some(1));
    index.apply_pod(&pod("b", serde_json::json!({"app": "web"}), Some("payg-1")));
    assert_eq!(unit(&index), Some(2));
}

#[test]
fn pods_lacking_a_group_label_are_refused() {
    let mut spec = seed();
    spec["matchLabelKeys"] = serde_json::json!(["pod-template-hash"]);
    let (index, entry) = index_with(spec);
    let bare = PodEntry::of(&pod("bare", serde_json::json!({"app": "web"}), None));
    assert_eq!(
        index
            .choose(&entry, &bare, Some(&[]), SystemTime::now())
            .unwrap_err()
            .to_string(),
        "ResourcePolicy ns/p: the pod lacks the label pod-template-hash named in matchLabelKeys"
    );
}

#[test]
fn ignore_previous_pod_leaves_older_pods_out() {
    let mut spec = seed();
    spec["ignorePreviousPod"] = serde_json::json!(true);
    let index = PlacementIndex::new(VirtualNodes::default());
    index.set_policies([policy(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-11-23T11:00:00Z"},
        "spec": spec,
    }))]);
    index.set_nodes([node(
        "sub-1",
        serde_json::json!({"paidtype": "subscription"}),
        "64",
    )]);
    index.set_pods(Vec::<Pod>::new());
    // Created 10:00, before the policy (11:00).
    index.apply_pod(&pod(
        "old",
        serde_json::json!({"app": "web"}),
        Some("sub-1"),
    ));
    let entry = index.policies().pop().unwrap();
    assert_eq!(index.unit_counts(&entry)[0].values().sum::<u32>(), 0);
}

/// A burst through the filter: each filter takes its place before the next pod is filtered,
/// so unit 1 (max 5) takes exactly five of twenty pods and the rest go on.
#[test]
fn places_are_taken_at_filter_time() {
    let (index, entry) = index_with(seed());
    let candidates: Vec<String> = ["sub-1", "sub-2", "payg-1", "vk-0"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut units = Vec::new();
    for i in 0..20 {
        let pod = PodEntry::of(&pod(
            &format!("p{i}"),
            serde_json::json!({"app": "web"}),
            None,
        ));
        let (choice, _) = index
            .choose_and_reserve(
                &entry,
                &pod,
                Some(&candidates),
                SystemTime::now(),
                Some(&pod.uid),
            )
            .unwrap();
        units.push(placed_unit(&choice).unwrap());
        // A retried filter of the same pod keeps its place rather than taking another.
        let (again, _) = index
            .choose_and_reserve(
                &entry,
                &pod,
                Some(&candidates),
                SystemTime::now(),
                Some(&pod.uid),
            )
            .unwrap();
        assert_eq!(placed_unit(&again), Some(units[i]));
    }
    assert_eq!(units.iter().filter(|u| **u == 0).count(), 5);
    assert_eq!(units.iter().filter(|u| **u == 1).count(), 15);
    // The bind of one of the five re-checks and keeps its own place.
    let first = PodEntry::of(&pod("p0", serde_json::json!({"app": "web"}), None));
    assert_eq!(
        index
            .reserve_on_node(&entry, &first, "sub-1", &first.uid)
            .unwrap()
            .unit,
        0
    );
    // Marked by its bind (labels and annotations land before the Binding): counted once.
    let mut marked = pod("p0", serde_json::json!({"app": "web"}), None);
    marked.metadata.annotations = Some(grant(&entry, 0).annotations.into_iter().collect());
    index.apply_pod(&marked);
    let late = PodEntry::of(&pod("late", serde_json::json!({"app": "web"}), None));
    let (choice, _) = index
        .choose(&entry, &late, Some(&candidates), SystemTime::now())
        .unwrap();
    assert_eq!(placed_unit(&choice), Some(1));
}
