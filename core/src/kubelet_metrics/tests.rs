use std::collections::{HashMap, HashSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::fixtures::{at, cpu_metric, entry, memory_metric, record};
use super::*;

/// The calls a scrape makes for `pods`, each with the group the pod controller recorded for it.
fn calls_for(pods: &[(PodEntry, Option<String>)]) -> Vec<Vec<String>> {
    let recorded: HashMap<&str, &String> = pods
        .iter()
        .filter_map(|(pod, group)| Some((pod.uid.as_str(), group.as_ref()?)))
        .collect();
    let measured = by_group(pods.iter().map(|(pod, _)| pod), |uid| {
        recorded.get(uid).map(|group| (*group).clone())
    });
    batches(measured.keys().map(String::as_str))
}

#[test]
fn batches_ask_for_each_running_group_once_twenty_a_call() {
    let cases: &[(usize, usize, &[usize])] = &[
        // (measurable pods, others, batch sizes)
        (0, 3, &[]),
        (1, 0, &[1]),
        (20, 5, &[20]),
        (21, 0, &[20, 1]),
        (45, 7, &[20, 20, 5]),
        (3_000, 0, &[20; 150]),
    ];
    for (measurable, others, sizes) in cases {
        let mut pods: Vec<(PodEntry, Option<String>)> = (0..*measurable)
            .map(|i| {
                let pod = entry("ns", &format!("p{i}"), true);
                (pod, Some(format!("eci-{i:05}")))
            })
            .collect();
        // Not running, or no group recorded yet: ECI has nothing for them.
        pods.extend((0..*others).map(|i| {
            if i % 2 == 0 {
                let pod = entry("ns", &format!("pending{i}"), false);
                (pod, Some(format!("eci-p{i}")))
            } else {
                (entry("ns", &format!("new{i}"), true), None)
            }
        }));
        let got = calls_for(&pods);
        let got_sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(
            &got_sizes, sizes,
            "{measurable} measurable, {others} others"
        );
        let all: HashSet<&String> = got.iter().flatten().collect();
        assert_eq!(all.len(), *measurable, "each group once");
        // Stable: the same pods in another order give the same calls.
        pods.reverse();
        assert_eq!(calls_for(&pods), got);
    }
    // Two pods said to share one group cost one slot.
    let pods = [
        (entry("ns", "a", true), Some("eci-1".to_owned())),
        (entry("ns", "b", true), Some("eci-1".to_owned())),
    ];
    assert_eq!(calls_for(&pods), vec![vec!["eci-1".to_owned()]]);
    // Groups named twice are asked for once, in order.
    assert_eq!(
        batches(["eci-2", "eci-1", "eci-2"]),
        vec![vec!["eci-1".to_owned(), "eci-2".to_owned()]]
    );
}

#[test]
fn a_record_becomes_a_sample_stamped_with_its_own_time() {
    let pod = entry("ns", "web", true);
    let older = record("2023-11-14T22:13:00Z", &[("app", 1, 1, 1)]);
    let newer = record(
        "2023-11-14T22:13:20Z",
        &[
            ("sidecar", 100, 2_000, 20),
            ("app", 500_000_000, 7_000_000_000, 1_000),
        ],
    );
    let unreadable = record("yesterday", &[("app", 9, 9, 9)]);
    let sample = pod_sample(&pod, &[older, newer, unreadable]).expect("a sample");
    assert_eq!(
        sample.at,
        "2023-11-14T22:13:20Z".parse::<Timestamp>().unwrap()
    );
    assert_eq!(
        (sample.namespace.as_str(), sample.name.as_str()),
        ("ns", "web")
    );
    let names: Vec<&str> = sample.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["app", "sidecar"], "containers sorted by name");
    let app = &sample.containers[0];
    assert_eq!(
        app.cpu,
        Some(Cpu {
            nano_cores: 500_000_000,
            core_nanos: 7_000_000_000
        })
    );
    assert_eq!(app.memory.map(|m| m.working_set), Some(1_000));
    assert_eq!(app.start_time, Some(at(1)), "from the pod's status");
    assert_eq!(
        sample.containers[1].start_time, None,
        "sidecar not running per the pod"
    );
    // No group totals in the record: summed from the containers.
    assert_eq!(
        sample.cpu,
        Some(Cpu {
            nano_cores: 500_000_100,
            core_nanos: 7_000_002_000
        })
    );
    assert_eq!(sample.memory.map(|m| m.working_set), Some(1_020));
    assert_eq!(sample.interfaces[0].rx_bytes, 1_000);
    assert_eq!(
        sample.fs,
        Some(Fs {
            used: 10,
            capacity: 100,
            available: 90
        })
    );

    // Group totals, when ECI gives them, are taken as they are.
    let mut with_totals = record("2023-11-14T22:13:20Z", &[("app", 1, 2, 3)]);
    with_totals.cpu = Some(cpu_metric(42, 4_200));
    with_totals.memory = Some(memory_metric(77));
    let sample = pod_sample(&pod, &[with_totals]).expect("a sample");
    assert_eq!(
        sample.cpu.map(|c| (c.nano_cores, c.core_nanos)),
        Some((42, 4_200))
    );
    assert_eq!(sample.memory.map(|m| m.working_set), Some(77));

    // Nothing usable: no sample.
    assert_eq!(pod_sample(&pod, &[]), None);
    assert_eq!(pod_sample(&pod, &[record("not a time", &[])]), None);
    // Negative figures (never sent, but i64 on the wire) are read as 0.
    let negative = pod_sample(
        &pod,
        &[record("2023-11-14T22:13:20Z", &[("app", -5, -5, -5)])],
    )
    .expect("a sample");
    assert_eq!(
        negative.containers[0].cpu,
        Some(Cpu {
            nano_cores: 0,
            core_nanos: 0
        })
    );
}

#[test]
fn counter_sums_never_go_backwards() {
    // (what happens, the total after it)
    enum Step {
        Observe(&'static str, Option<i64>, u64),
        Leave(&'static str),
    }
    use Step::{Leave, Observe};
    let steps: &[(Step, u128)] = &[
        (Observe("a", Some(1), 100), 100),
        (Observe("b", Some(1), 50), 150),
        (Observe("a", Some(1), 130), 180),
        // Restart with a new start time: the old run's 130 is carried, the new run counts.
        (Observe("a", Some(2), 10), 190),
        // A reset without a known start time: detected by the counter falling.
        (Observe("b", None, 5), 195),
        // The start time becoming known is the same run, not a new one.
        (Observe("b", Some(7), 8), 198),
        // Missing from a scrape (not observed): keeps its last value.
        (Observe("a", Some(2), 15), 203),
        // Pod b leaves: its last value stays in the total.
        (Leave("b"), 203),
        // A pod coming back under the same uid starts a new series.
        (Observe("b", Some(9), 1), 204),
        (Leave("a"), 204),
        (Leave("b"), 204),
        (Observe("c", None, 0), 204),
    ];
    let mut sum = CounterSum::default();
    let mut on_node: HashSet<&str> = HashSet::new();
    for (i, (step, total)) in steps.iter().enumerate() {
        match step {
            Observe(uid, instance, value) => {
                on_node.insert(uid);
                sum.observe(uid, "app", *instance, *value);
            }
            Leave(uid) => {
                on_node.remove(uid);
                sum.retain_pods(|u| on_node.contains(u));
            }
        }
        assert_eq!(sum.total(), *total, "after step {i}");
    }
}

/// A long random life of a node — pods arriving, working, restarting, missing scrapes,
/// leaving — never makes the node's CPU counter or timestamp go back, and the counter always
/// equals what the containers used while observed.
#[test]
fn node_cpu_is_monotonic_through_a_random_life() {
    let mut seed: u64 = 0x5EED_CAFE;
    let mut random = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    // uid → (start, counter)
    let mut live: std::collections::BTreeMap<String, (i64, u64)> = Default::default();
    let mut counters = NodeCounters::default();
    let mut last_total = 0_u128;
    let mut last_at = None;
    let mut next_uid = 0;
    let mut used: u128 = 0;
    for tick in 1..2_000_i64 {
        match random(10) {
            0 => {
                live.insert(format!("pod-{next_uid}"), (tick, 0));
                next_uid += 1;
            }
            1 if !live.is_empty() => {
                let key = live.keys().nth(random(live.len() as u64) as usize).cloned();
                live.remove(&key.expect("a pod"));
            }
            2 if !live.is_empty() => {
                let key = live.keys().nth(random(live.len() as u64) as usize).cloned();
                live.insert(key.expect("a pod"), (tick, 0));
            }
            _ => {}
        }
        for (_, counter) in live.values_mut() {
            let delta = random(1_000_000);
            *counter += delta;
            used += u128::from(delta);
        }
        // One pod in five is missing from this scrape (its call failed).
        let draws: Vec<(bool, i64)> = live
            .keys()
            .map(|_| (random(5) != 0, i64::try_from(random(3)).unwrap()))
            .collect();
        let samples: Vec<PodSample> = live
            .iter()
            .zip(&draws)
            .filter(|(_, (present, _))| *present)
            .map(|((uid, (start, counter)), (_, lag))| PodSample {
                namespace: "ns".into(),
                name: uid.clone(),
                uid: uid.clone(),
                start_time: None,
                at: at(tick - lag),
                cpu: None,
                memory: None,
                interfaces: Vec::new(),
                fs: None,
                containers: vec![ContainerSample {
                    name: "app".into(),
                    start_time: Some(at(*start)),
                    cpu: Some(Cpu {
                        nano_cores: 0,
                        core_nanos: *counter,
                    }),
                    memory: None,
                }],
            })
            .collect();
        let node = counters.update(&samples, |uid| live.contains_key(uid));
        assert!(
            node.core_nanos >= last_total,
            "tick {tick}: the node's CPU went back"
        );
        assert!(
            node.core_nanos <= used,
            "tick {tick}: counted more than was used"
        );
        assert!(node.at >= last_at, "tick {tick}: the node's time went back");
        last_total = node.core_nanos;
        last_at = node.at;
    }
    assert!(last_total > 0);
}

fn pod_sample_of(name: &str, at_second: i64, core_nanos: u64, working_set: u64) -> PodSample {
    PodSample {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        start_time: Some(at(0)),
        at: at(at_second),
        cpu: Some(Cpu {
            nano_cores: 1,
            core_nanos,
        }),
        memory: Some(Memory {
            working_set,
            usage: working_set,
            rss: working_set,
            available: None,
        }),
        interfaces: vec![Interface {
            name: "eth0".into(),
            rx_bytes: 7,
            rx_errors: 0,
            tx_bytes: 3,
            tx_errors: 0,
        }],
        fs: Some(Fs {
            used: 1,
            capacity: 10,
            available: 9,
        }),
        containers: vec![ContainerSample {
            name: "app".into(),
            start_time: Some(at(1)),
            cpu: Some(Cpu {
                nano_cores: 1,
                core_nanos,
            }),
            memory: Some(Memory {
                working_set,
                usage: working_set,
                rss: working_set,
                available: None,
            }),
        }],
    }
}

#[test]
fn previous_samples_stand_in_for_failed_calls_for_a_while() {
    let previous = [
        pod_sample_of("a", 10, 1, 1),
        pod_sample_of("b", 10, 1, 1),
        pod_sample_of("gone", 10, 1, 1),
        pod_sample_of("old", -500, 1, 1),
    ];
    let fresh = vec![pod_sample_of("a", 20, 2, 2)];
    // b's and old's calls failed; "gone" left the node, so no call asked for it.
    let failed: HashSet<&str> = ["uid-b", "uid-old"].into();
    let merged = merge(fresh, &failed, &previous, |s| s.at >= at(0));
    let got: Vec<(&str, Timestamp)> = merged.iter().map(|s| (s.name.as_str(), s.at)).collect();
    assert_eq!(got, [("a", at(20)), ("b", at(10))]);
}

#[test]
fn resource_metrics_are_the_kubelets_text() {
    let mut counters = NodeCounters::default();
    let pods = [
        pod_sample_of("web-1", 20, 1_500_000_000, 2_048),
        pod_sample_of("web-0", 19, 250_000_000, 1_024),
    ];
    let mut sorted = pods.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let node = counters.update(&sorted, |_| true);
    let text = resource_metrics(&node, &sorted, false);
    let t19 = at(19).as_millisecond();
    let t20 = at(20).as_millisecond();
    let start = at(1).as_second();
    let expected = format!(
        "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{{container=\"app\",namespace=\"ns\",pod=\"web-0\"}} 0.25 {t19}
container_cpu_usage_seconds_total{{container=\"app\",namespace=\"ns\",pod=\"web-1\"}} 1.5 {t20}
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{{container=\"app\",namespace=\"ns\",pod=\"web-0\"}} 1024 {t19}
container_memory_working_set_bytes{{container=\"app\",namespace=\"ns\",pod=\"web-1\"}} 2048 {t20}
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{{container=\"app\",namespace=\"ns\",pod=\"web-0\"}} {start}
container_start_time_seconds{{container=\"app\",namespace=\"ns\",pod=\"web-1\"}} {start}
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 1.75 {t20}
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 3072 {t20}
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{{namespace=\"ns\",pod=\"web-0\"}} 0.25 {t19}
pod_cpu_usage_seconds_total{{namespace=\"ns\",pod=\"web-1\"}} 1.5 {t20}
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{{namespace=\"ns\",pod=\"web-0\"}} 1024 {t19}
pod_memory_working_set_bytes{{namespace=\"ns\",pod=\"web-1\"}} 2048 {t20}
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
# HELP scrape_error [ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise
# TYPE scrape_error gauge
scrape_error 0
"
    );
    assert_eq!(text, expected);
}

/// What metrics-server v0.9.0 (`decode.go`) needs of every line: its metric name followed by
/// `{` or a space, labels it finds by `container="`, `pod="`, `namespace="`, a float, and for
/// CPU and memory an integer millisecond timestamp.
#[test]
fn resource_metrics_parse_as_metrics_server_reads_them() {
    let cases = [
        (Vec::new(), true),
        (vec![pod_sample_of("a", 5, 10, 10)], false),
        (
            vec![
                pod_sample_of("a", 5, 10, 10),
                pod_sample_of("b\"quoted\\", 6, 20, 20),
            ],
            true,
        ),
    ];
    for (pods, error) in cases {
        let node = NodeCounters::default().update(&pods, |_| true);
        let text = resource_metrics(&node, &pods, error);
        let mut families = HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                assert!(["counter", "gauge"].contains(&kind), "{line}");
                assert!(
                    families.insert(name.to_owned()),
                    "one TYPE per family: {line}"
                );
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let name_end = line.find(['{', ' ']).expect("name then labels or value");
            let name = &line[..name_end];
            assert!(families.contains(name), "sample after its TYPE: {line}");
            let after_labels = match line[name_end..].strip_prefix('{') {
                Some(rest) => {
                    let close = rest.rfind("} ").expect("labels closed");
                    let labels = &rest[..close];
                    if name.starts_with("container_") {
                        for key in ["container=\"", "pod=\"", "namespace=\""] {
                            assert!(labels.contains(key), "{key} in {line}");
                        }
                    }
                    &rest[close + 2..]
                }
                None => &line[name_end + 1..],
            };
            let fields: Vec<&str> = after_labels.split(' ').collect();
            let value: f64 = fields[0].parse().expect("a float value");
            assert!(value.is_finite());
            let stamped = name.contains("cpu_usage") || name.contains("working_set");
            assert_eq!(fields.len(), if stamped { 2 } else { 1 }, "{line}");
            if stamped {
                fields[1]
                    .parse::<i64>()
                    .expect("an integer millisecond timestamp");
            }
        }
        let has_error = text.contains(&format!("\nresource_scrape_error {}\n", u8::from(error)));
        assert!(has_error, "{text}");
        assert_eq!(
            pods.is_empty(),
            !text.contains("node_cpu_usage_seconds_total "),
            "{text}"
        );
    }
    // Label values are escaped.
    let pods = [pod_sample_of("b\"quoted\\", 6, 20, 20)];
    let text = resource_metrics(&NodeSample::default(), &pods, false);
    assert!(text.contains("pod=\"b\\\"quoted\\\\\""), "{text}");
}

#[test]
fn summary_has_the_kubelets_shape() {
    let pods = [pod_sample_of("web-0", 19, 250_000_000, 1_024)];
    let node = NodeCounters::default().update(&pods, |_| true);
    let full = serde_json::to_value(summary("vn-0", at(0), &node, &pods, false)).unwrap();
    assert_eq!(
        full["node"],
        json!({
            "nodeName": "vn-0",
            "startTime": "2023-11-14T22:13:20Z",
            "cpu": {"time": "2023-11-14T22:13:39Z", "usageNanoCores": 1, "usageCoreNanoSeconds": 250_000_000},
            "memory": {"time": "2023-11-14T22:13:39Z", "usageBytes": 1_024, "workingSetBytes": 1_024, "rssBytes": 1_024},
            "network": {"time": "2023-11-14T22:13:39Z", "name": "eth0", "rxBytes": 7, "rxErrors": 0, "txBytes": 3, "txErrors": 0},
            "fs": {"time": "2023-11-14T22:13:39Z", "availableBytes": 9, "capacityBytes": 10, "usedBytes": 1},
        })
    );
    let pod = &full["pods"][0];
    assert_eq!(
        pod["podRef"],
        json!({"name": "web-0", "namespace": "ns", "uid": "uid-web-0"})
    );
    assert_eq!(pod["startTime"], "2023-11-14T22:13:20Z");
    assert_eq!(pod["containers"][0]["name"], "app");
    assert_eq!(pod["containers"][0]["startTime"], "2023-11-14T22:13:21Z");
    assert_eq!(
        pod["containers"][0]["cpu"]["usageCoreNanoSeconds"],
        250_000_000
    );
    assert_eq!(pod["network"]["name"], "eth0");
    assert_eq!(pod["network"]["interfaces"][0]["rxBytes"], 7);
    assert_eq!(pod["ephemeral-storage"]["usedBytes"], 1);

    let trimmed = serde_json::to_value(summary("vn-0", at(0), &node, &pods, true)).unwrap();
    assert!(trimmed["node"].get("network").is_none());
    assert!(trimmed["node"].get("fs").is_none());
    assert!(trimmed["pods"][0].get("network").is_none());
    assert!(trimmed["pods"][0].get("ephemeral-storage").is_none());
    assert_eq!(
        trimmed["pods"][0]["containers"][0]["memory"]["workingSetBytes"],
        1_024
    );

    // Nothing measured yet: the node has only its name and start time.
    let empty =
        serde_json::to_value(summary("vn-0", at(0), &NodeSample::default(), &[], false)).unwrap();
    assert_eq!(
        empty,
        json!({"node": {"nodeName": "vn-0", "startTime": "2023-11-14T22:13:20Z"}, "pods": []})
    );
}

fn pod(name: &str, uid: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "app"}, {"name": "side"}]},
        "status": {
            "phase": phase,
            "startTime": "2023-11-14T22:13:20Z",
            "containerStatuses": [
                {"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2023-11-14T22:13:25Z"}}},
                {"name": "side", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ],
        },
    }))
    .expect("a pod")
}

#[test]
fn a_pod_entry_keeps_what_the_metrics_need() {
    let entry = PodEntry::of(&pod("a", "u-a", "Running")).expect("an entry");
    assert!(entry.running);
    assert_eq!(entry.start_time, Some(at(0)));
    assert_eq!(
        entry.containers,
        [("app".to_owned(), at(5))],
        "running containers only"
    );
    assert_eq!(entry.container_start("app"), Some(at(5)));
    assert_eq!(entry.container_start("side"), None);
    assert!(!PodEntry::of(&pod("b", "u-b", "Pending")).unwrap().running);
    let mut no_uid = pod("c", "u-c", "Running");
    no_uid.metadata.uid = None;
    assert_eq!(PodEntry::of(&no_uid), None);
}
