//! End to end on the real control plane: the daemon owns a pod's status the way a kubelet
//! does, and a broken watch loses no deletion.
//!
//! - Status writes are server-side applies under the daemon's field manager: a condition
//!   another manager adds to a running pod survives ten of our writes.
//! - `spec.readinessGates`: Ready waits for the gate's condition (set by another client), then
//!   follows it, though ECI shows nothing new.
//! - Pods deleted while the daemon is stopped leave no ECI group once it is back: its first
//!   list finds them gone (the orphan collector is off, so nothing else cleans up).
//! - Pods deleted while the daemon's watch is broken leave no group either. The daemon talks to
//!   a second kube-apiserver on the fixture's etcd, started without a watch cache so that every
//!   watch is served from etcd; the daemon is frozen (SIGSTOP), that apiserver crashes, pods
//!   are force-deleted, etcd is compacted to its current revision and the apiserver restarts.
//!   Thawed, the daemon's watch resumes from a compacted resourceVersion, gets 410 Gone and
//!   relists. This one case cannot run against `E2E_KUBECONFIG`'s cluster (no etcd to compact,
//!   no apiserver to crash): there it logs that it did not run and returns; the others run in
//!   both modes.
//! - The same gap seen by the replica's shared pod watch (`k8s::shared_watch`, which placement
//!   and the admission capacity view read): its readers get a whole relist that no longer names
//!   the pods deleted in the gap, and never a Delete for them — a reader that kept its entries
//!   until a Delete would count them for ever. Fixture only, like the case above.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use integration::harness::mock_admin::{groups, tag};
use integration::harness::run_scenario;
use integration::harness::{ClusterKind, Harness, HarnessError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
/// The daemon's field manager.
const OURS: &str = "virtual-node-eci";
/// The field manager of the "load-balancer controller" the tests play.
const THEIRS: &str = "e2e-lb-controller";
/// The condition that controller owns (and the readiness gate's type).
const LB_READY: &str = "example.com/lb-ready";
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
    "--restart-backoff",
    "1s",
    // A crash-looping container restarts every second, not on a growing back-off.
    "--max-restart-backoff",
    "1s",
    "--init-container-duration",
    "300ms",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    // Off: a group left behind must be deleted by the daemon's own list, not by the collector.
    ("ORPHAN_GC_INTERVAL", "0"),
];

/// A scenario's namespace, virtual node, mock-eci admin URL and daemon process.
struct Scene {
    ns: String,
    node: String,
    admin: String,
    daemon: String,
}

async fn start(h: &mut Harness, daemon_env: &[(&str, &str)]) -> Result<Scene, HarnessError> {
    let ns = h.create_namespace("status").await?;
    let mock = h.start_mock_eci(FAST_MOCK).await?;
    let mut env = FAST_DAEMON.to_vec();
    env.extend_from_slice(daemon_env);
    let daemon = h.start_daemon(0, &env)?;
    Ok(Scene {
        ns,
        node: h.node_name(0),
        admin: mock.admin,
        daemon,
    })
}

/// A pod for kube-scheduler to place on `node` (it tolerates the virtual nodes' taint and
/// selects `node` by hostname).
fn pod_spec(name: &str, node: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = json!([{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn container(env: &[(&str, &str)]) -> Value {
    json!({"name": "app", "image": "registry.example.com/app:1", "env": env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>()})
}

async fn get(h: &Harness, ns: &str, name: &str) -> Option<Value> {
    h.pod_json(ns, name).await
}

async fn wait_pod(
    h: &Harness,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value, HarnessError> {
    h.wait_pod(ns, name, what, WAIT, check).await
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

/// A condition of a pod (`Null` when it has none of that type).
fn condition<'a>(pod: &'a Value, kind: &str) -> &'a Value {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .unwrap_or(&Value::Null)
}

fn status_of<'a>(pod: &'a Value, kind: &str) -> &'a str {
    condition(pod, kind)["status"].as_str().unwrap_or_default()
}

/// Sets the load-balancer condition as another controller would: a strategic merge patch of
/// the status under a field manager of its own (conditions merge by type).
async fn set_lb_ready(
    h: &Harness,
    ns: &str,
    name: &str,
    status: &str,
) -> Result<Pod, HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    let params = PatchParams {
        field_manager: Some(THEIRS.into()),
        ..PatchParams::default()
    };
    let patch = json!({"status": {"conditions": [{
        "type": LB_READY, "status": status, "reason": "TargetRegistration",
        "lastTransitionTime": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    }]}});
    Ok(pods
        .patch_status(name, &params, &Patch::Strategic(patch))
        .await?)
}

/// The pods the groups of mock-eci were created for, from their tags.
async fn group_pods(admin: &str) -> BTreeSet<String> {
    groups(admin)
        .await
        .unwrap()
        .iter()
        .map(|g| tag(g, "k8s.aliyun.com/pod-name"))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn wait_group_pods(h: &Harness, admin: &str, expected: &[&str]) -> Result<(), HarnessError> {
    let expected: BTreeSet<String> = expected.iter().map(|p| (*p).to_owned()).collect();
    h.wait_for(
        &format!("mock-eci to hold exactly the groups of {expected:?}"),
        WAIT,
        |_| {
            let expected = expected.clone();
            async move { group_pods(admin).await == expected }
        },
    )
    .await
}

/// Creates the pods and waits until each runs.
async fn create_running(h: &Harness, scene: &Scene, names: &[&str]) -> Result<(), HarnessError> {
    let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
    for name in names {
        let pod = pod_spec(name, &scene.node, json!({"containers": [container(&[])]}));
        pods.create(&PostParams::default(), &pod).await?;
    }
    for name in names {
        wait_pod(h, &scene.ns, name, "Running", |p| phase(p) == "Running").await?;
    }
    Ok(())
}

/// A sample of the daemon's metrics, read at the address it logged.
async fn daemon_metric(h: &Harness, daemon: &str, name: &str) -> Option<f64> {
    let output = h.process_output(daemon)?;
    let address = output
        .lines()
        .filter(|l| l.contains("serving /healthz"))
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("address="))
        })?
        .to_owned();
    let text = reqwest::get(format!("http://{address}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

const GAP_METRIC: &str = "virtual_node_eci_pods_deleted_during_watch_gap_total";

/// Whether `manager` owns the condition of type `kind` on `pod` (its managedFields say so).
fn owns_condition(pod: &Value, manager: &str, kind: &str) -> bool {
    let key = format!("k:{}", json!({"type": kind}));
    pod["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["manager"] == manager)
        .any(|entry| {
            entry["fieldsV1"]["f:status"]["f:conditions"]
                .get(&key)
                .is_some()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_another_manager_adds_survives_ten_of_our_status_writes() {
    run_scenario(async |h| {
        let scene = start(h, &[]).await?;
        // Exits after half a second, restarts a second later, forever: every turn is a status
        // change the daemon writes.
        let crashing = pod_spec(
            "crashing",
            &scene.node,
            json!({"restartPolicy": "Always", "containers": [container(&[("MOCK_ECI_EXIT_CODE", "1"), ("MOCK_ECI_EXIT_AFTER", "500ms")])]}),
        );
        let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
        pods.create(&PostParams::default(), &crashing).await?;
        wait_pod(h, &scene.ns, "crashing", "Running with our conditions", |p| {
            phase(p) == "Running" && !condition(p, "ContainersReady").is_null()
        })
        .await?;

        let patched = set_lb_ready(h, &scene.ns, "crashing", "True").await?;
        // kube-runtime's watcher, not a bare watch: the binary's other tests compact etcd,
        // which can end a watch served from the apiserver's cache; the watcher relists and
        // goes on, and a relisted pod is checked like any other state.
        let config = kube::runtime::watcher::Config::default().fields("metadata.name=crashing");
        let mut events = kube::runtime::watcher(pods.clone(), config)
            .default_backoff()
            .boxed();
        let mut ours = 0;
        let mut last = serde_json::to_value(&patched).unwrap();
        let watched = tokio::time::timeout(Duration::from_secs(180), async {
            while ours < 10 {
                let pod = match events.next().await {
                    Some(Ok(
                        kube::runtime::watcher::Event::Apply(pod)
                        | kube::runtime::watcher::Event::InitApply(pod),
                    )) => pod,
                    Some(_) => continue,
                    None => return false,
                };
                let pod = serde_json::to_value(&pod).unwrap();
                let lb = condition(&pod, LB_READY);
                assert_eq!(lb["status"], "True", "write {ours} kept {LB_READY}: {pod}");
                assert_eq!(lb["reason"], "TargetRegistration", "{pod}");
                if pod["status"] != last["status"] {
                    ours += 1;
                }
                last = pod;
            }
            true
        })
        .await;
        if watched != Ok(true) {
            return Err(HarnessError::Setup(format!(
                "only {ours} status writes of ours seen ({watched:?})"
            )));
        }
        let now = get(h, &scene.ns, "crashing").await.unwrap();
        assert_eq!(status_of(&now, LB_READY), "True", "{now}");
        assert!(
            now["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(3),
            "the writes were the container's restarts: {now}"
        );
        // Who owns what: our apply owns our conditions, the other manager its own.
        assert!(owns_condition(&now, THEIRS, LB_READY), "{now}");
        assert!(!owns_condition(&now, OURS, LB_READY), "{now}");
        assert!(owns_condition(&now, OURS, "Ready"), "{now}");
        let applied = now["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["manager"] == OURS && e["operation"] == "Apply" && e["subresource"] == "status");
        assert!(applied, "the daemon writes status with server-side apply: {now}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_gate_holds_ready_until_its_condition_is_true() {
    run_scenario(async |h| {
        let scene = start(h, &[]).await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
        // Every state the pod shows, as (Ready, the gate's condition): Ready must never turn
        // True while the gate is not.
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let recorder = {
            let (pods, seen) = (pods.clone(), Arc::clone(&seen));
            let config = kube::runtime::watcher::Config::default().fields("metadata.name=gated");
            tokio::spawn(async move {
                let mut events = kube::runtime::watcher(pods, config).boxed();
                while let Some(event) = events.next().await {
                    if let Ok(
                        kube::runtime::watcher::Event::Apply(pod)
                        | kube::runtime::watcher::Event::InitApply(pod),
                    ) = event
                    {
                        let pod = serde_json::to_value(pod).unwrap();
                        let state = (
                            status_of(&pod, "Ready").to_owned(),
                            status_of(&pod, LB_READY).to_owned(),
                        );
                        seen.lock().unwrap().push(state);
                    }
                }
            })
        };
        let mut gated = pod_spec(
            "gated",
            &scene.node,
            json!({"containers": [container(&[])]}),
        );
        gated.spec.as_mut().unwrap().readiness_gates =
            Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
                condition_type: LB_READY.into(),
            }]);
        pods.create(&PostParams::default(), &gated).await?;

        let held = wait_pod(
            h,
            &scene.ns,
            "gated",
            "containers ready, Ready held by the gate",
            |p| {
                status_of(p, "ContainersReady") == "True"
                    && condition(p, "Ready")["reason"] == "ReadinessGatesNotReady"
            },
        )
        .await?;
        assert_eq!(phase(&held), "Running");
        assert_eq!(status_of(&held, "Ready"), "False");
        assert_eq!(
            condition(&held, "Ready")["message"],
            format!("corresponding condition of pod readiness gate \"{LB_READY}\" does not exist."),
        );

        // The gate's condition appears, not True: still held, and the reason follows it though
        // ECI shows nothing new.
        set_lb_ready(h, &scene.ns, "gated", "False").await?;
        let still = wait_pod(h, &scene.ns, "gated", "Ready held by a False gate", |p| {
            condition(p, "Ready")["message"]
                == format!(
                    "the status of pod readiness gate \"{LB_READY}\" is not \"True\", but False"
                )
        })
        .await?;
        assert_eq!(status_of(&still, "Ready"), "False");
        assert_eq!(
            condition(&still, "Ready")["reason"],
            "ReadinessGatesNotReady"
        );

        set_lb_ready(h, &scene.ns, "gated", "True").await?;
        let ready = wait_pod(h, &scene.ns, "gated", "Ready once the gate is True", |p| {
            status_of(p, "Ready") == "True"
        })
        .await?;
        assert!(condition(&ready, "Ready")["reason"].is_null(), "{ready}");
        assert_eq!(status_of(&ready, LB_READY), "True");
        if let Some(generation) = ready["metadata"]["generation"].as_i64() {
            assert_eq!(
                condition(&ready, "Ready")["observedGeneration"],
                generation,
                "{ready}"
            );
            assert_eq!(ready["status"]["observedGeneration"], generation, "{ready}");
        }

        // And back: the load balancer takes the pod out, Ready follows.
        set_lb_ready(h, &scene.ns, "gated", "False").await?;
        wait_pod(
            h,
            &scene.ns,
            "gated",
            "not Ready once the gate is False again",
            |p| {
                status_of(p, "Ready") == "False"
                    && condition(p, "Ready")["reason"] == "ReadinessGatesNotReady"
            },
        )
        .await?;

        // The recorder has seen the last state before it is judged.
        h.wait_for("the recorder to catch up", WAIT, |_| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .last()
                    .is_some_and(|(ready, lb)| ready == "False" && lb == "False")
            }
        })
        .await?;
        recorder.abort();
        let seen = seen.lock().unwrap().clone();
        assert!(seen.iter().any(|(ready, _)| ready == "True"), "{seen:?}");
        // Ready turns True only in a state where the gate is True. (The other way round lags
        // by one write, as with a kubelet: the gate turning False is itself a state that still
        // shows the Ready written before it.)
        let mut before = "";
        for (ready, lb) in &seen {
            assert!(
                !(ready == "True" && before != "True" && lb != "True"),
                "Ready turned True while the gate was not: {seen:?}"
            );
            before = ready.as_str();
        }
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_while_the_daemon_is_stopped_leave_no_group() {
    run_scenario(async |h| {
        let scene = start(h, &[]).await?;
        create_running(h, &scene, &["s0", "s1", "s2", "s3"]).await?;
        wait_group_pods(h, &scene.admin, &["s0", "s1", "s2", "s3"]).await?;

        h.process(&scene.daemon)
            .unwrap()
            .terminate(Duration::from_secs(10))
            .await;
        let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
        // Force-deleted: gone from the API at once, no Delete event will ever reach the daemon.
        for name in ["s0", "s1"] {
            pods.delete(name, &DeleteParams::default().grace_period(0))
                .await?;
        }
        // Deleted gracefully: with nobody to stop it, it waits Terminating for the daemon (a
        // short grace period: the group uses all of it to stop).
        pods.delete("s2", &DeleteParams::default().grace_period(2))
            .await?;

        let daemon = h.start_daemon(0, FAST_DAEMON)?;
        wait_group_pods(h, &scene.admin, &["s3"]).await?;
        h.wait_for("s2 to be removed once its group is gone", WAIT, |h| {
            let ns = scene.ns.clone();
            async move { get(h, &ns, "s2").await.is_none() }
        })
        .await?;
        assert_eq!(phase(&get(h, &scene.ns, "s3").await.unwrap()), "Running");
        assert_eq!(
            daemon_metric(h, &daemon, GAP_METRIC).await,
            Some(2.0),
            "the two force-deleted pods were found gone by the first list"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_while_the_watch_is_broken_by_etcd_compaction_leave_no_group() {
    run_scenario(async |h| {
        if h.kind() == ClusterKind::External {
            eprintln!(
                "pods_deleted_while_the_watch_is_broken_by_etcd_compaction_leave_no_group: NOT RUN \
                 against E2E_KUBECONFIG: it compacts the fixture's etcd and crashes an apiserver of its own"
            );
            return Ok(());
        }
        // Without a watch cache every watch is served from etcd, so once etcd is compacted the
        // daemon's resourceVersion is gone for good.
        let second = h.start_second_apiserver(&["--watch-cache=false"]).await?;
        let kubeconfig = second.daemon_kubeconfig.display().to_string();
        let scene = start(h, &[("KUBECONFIG", kubeconfig.as_str())]).await?;
        create_running(h, &scene, &["c0", "c1", "c2", "c3"]).await?;
        wait_group_pods(h, &scene.admin, &["c0", "c1", "c2", "c3"]).await?;
        let before = h.process_output(&scene.daemon).unwrap_or_default().len();

        h.signal_process(&scene.daemon, "STOP")?;
        h.kill_second_apiserver().await;
        let pods: Api<Pod> = Api::namespaced(h.client(), &scene.ns);
        for name in ["c0", "c1"] {
            pods.delete(name, &DeleteParams::default().grace_period(0)).await?;
        }
        let revision = h.compact_etcd().await?;
        eprintln!("etcd compacted to revision {revision}");
        h.restart_second_apiserver(&second).await?;
        h.signal_process(&scene.daemon, "CONT")?;

        wait_group_pods(h, &scene.admin, &["c2", "c3"]).await?;
        for name in ["c2", "c3"] {
            assert_eq!(phase(&get(h, &scene.ns, name).await.unwrap()), "Running", "{name}");
        }
        h.wait_for("the gap to be counted", WAIT, |h| {
            let daemon = scene.daemon.clone();
            async move { daemon_metric(h, &daemon, GAP_METRIC).await == Some(2.0) }
        })
        .await?;
        // It was a relist after 410 Gone that found them, not Delete events.
        let after = h.process_output(&scene.daemon).unwrap_or_default();
        let after = &after[before.min(after.len())..];
        assert!(
            after.lines().any(|l| l.contains("shared watch failed") && l.contains("this node") && (l.contains("too old") || l.contains("410") || l.contains("Expired"))),
            "the watch was answered 410 Gone:\n{after}"
        );
        assert!(
            after.lines().any(|l| l.contains("resync complete") && l.contains("gone=2") && l.contains("relist=true")),
            "a relist found the two pods gone:\n{after}"
        );
        Ok(())
    })
    .await;
}

/// Records what a shared-watch reader is handed for the pods of `namespace`, in order.
fn recording_reader(
    namespace: String,
    seen: Arc<Mutex<Vec<String>>>,
) -> virtual_node_eci::k8s::shared_watch::Reader<Pod> {
    use kube::ResourceExt as _;
    use kube::runtime::watcher::Event;
    Box::new(move |event: &Event<Pod>| {
        let ours = |p: &Pod| p.namespace().as_deref() == Some(namespace.as_str());
        let line = match event {
            Event::Init => "init".to_owned(),
            Event::InitDone => "done".to_owned(),
            Event::InitApply(p) if ours(p) => format!("list {}", p.name_any()),
            Event::Apply(p) if ours(p) => format!("apply {}", p.name_any()),
            Event::Delete(p) if ours(p) => format!("delete {}", p.name_any()),
            _ => return,
        };
        seen.lock().unwrap().push(line);
    })
}

/// The pods the last complete list named, if one completed after the first `skip` lines.
fn last_list(seen: &[String], skip: usize) -> Option<BTreeSet<String>> {
    let seen = &seen[skip.min(seen.len())..];
    let done = seen.iter().rposition(|l| l == "done")?;
    let init = seen[..done].iter().rposition(|l| l == "init")?;
    Some(
        seen[init..done]
            .iter()
            .filter_map(|l| l.strip_prefix("list "))
            .map(str::to_owned)
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_pod_watch_relists_without_the_pods_deleted_in_a_compacted_gap() {
    use virtual_node_eci::k8s::shared_watch::SharedWatch;
    run_scenario(async |h| {
        if h.kind() == ClusterKind::External {
            eprintln!(
                "the_shared_pod_watch_relists_without_the_pods_deleted_in_a_compacted_gap: NOT RUN \
                 against E2E_KUBECONFIG: it compacts the fixture's etcd and crashes an apiserver of its own"
            );
            return Ok(());
        }
        let ns = h.create_namespace("sharedwatch").await?;
        let second = h.start_second_apiserver(&["--watch-cache=false"]).await?;
        let kubeconfig = kube::config::Kubeconfig::read_from(&second.daemon_kubeconfig)
            .map_err(|e| HarnessError::Setup(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| HarnessError::Setup(e.to_string()))?;
        let client = kube::Client::try_from(config).map_err(|e| HarnessError::Setup(e.to_string()))?;

        let watch = SharedWatch::<Pod>::new("pod");
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        watch.subscribe(recording_reader(ns.clone(), Arc::clone(&seen)));
        let stop = tokio_util::sync::CancellationToken::new();
        let running = tokio::spawn(Arc::clone(&watch).run(
            Api::all(client),
            kube::runtime::watcher::Config::default(),
            stop.clone(),
        ));

        // Pods no node will take: nothing but this test changes them.
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        let names = ["c0", "c1", "c2", "c3"];
        for name in names {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"nodeSelector": {"example.com/no-such-node": "x"}, "containers": [container(&[])]},
            }))
            .unwrap();
            pods.create(&PostParams::default(), &pod).await?;
        }
        h.wait_for("the four pods in the shared watch", WAIT, |_| {
            let seen = Arc::clone(&seen);
            async move {
                let seen = seen.lock().unwrap();
                names.iter().all(|n| {
                    seen.iter()
                        .any(|l| l == &format!("apply {n}") || l == &format!("list {n}"))
                })
            }
        })
        .await?;
        let before = seen.lock().unwrap().len();

        h.kill_second_apiserver().await;
        for name in ["c0", "c1"] {
            pods.delete(name, &DeleteParams::default().grace_period(0)).await?;
        }
        let revision = h.compact_etcd().await?;
        eprintln!("etcd compacted to revision {revision}");
        h.restart_second_apiserver(&second).await?;

        h.wait_for("a relist after the gap", WAIT, |_| {
            let seen = Arc::clone(&seen);
            async move { last_list(&seen.lock().unwrap(), before).is_some() }
        })
        .await?;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            last_list(&seen, before).unwrap(),
            BTreeSet::from(["c2".to_owned(), "c3".to_owned()]),
            "the relist names only the pods left: {seen:?}"
        );
        assert!(
            !seen.iter().any(|l| l.starts_with("delete ")),
            "no Delete event reached the readers (the relist is the only news): {seen:?}"
        );
        stop.cancel();
        running.await.expect("the watch task").expect("the watch ends cleanly");
        Ok(())
    })
    .await;
}
