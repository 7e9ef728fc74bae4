//! The hostile-tenant suite (issue 26): a user bound only to the built-in `admin` ClusterRole
//! in their own namespace ([`integration::harness::Tenant`]) tries what a pod author on a
//! shared cluster would try, with their own token, through kubectl and the daemon's listeners.
//! Each attack must be refused, or must reach nothing but the tenant's own objects.
//!
//! Attacks, one test each:
//! - **forged instance id**: the tenant writes another namespace's group id into their own
//!   pod's `k8s.aliyun.com/eci-instance-id`, then runs `kubectl exec` and `kubectl logs` on it:
//!   both reach the tenant's own group, and the annotation is written back.
//! - **chosen RAM role and security group**: under the recommended shared-cluster annotation
//!   policy (deploy/examples/annotation-policy-shared-cluster.yaml), the tenant sets
//!   `k8s.aliyun.com/eci-ram-role-name` and `eci-security-group` on their own pod: it stays
//!   Pending with `AnnotationNotAllowed` and mock-eci gets no group; the tenant cannot label
//!   their namespace into the allowed set (the `admin` role may not patch namespaces).
//!
//! With `TENANCY_OUT=<file>` each attack appends one JSON object (`attack`, `status`: `pass`
//! when refused, else `fail`; `summary`, `details`) to the file: the reliability report
//! (`integration/src/bin/reliability.rs`) lists them in its own section.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io::Write as _;
use std::time::Duration;

use integration::harness::{Harness, HarnessError, Tenant, run_scenario};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
];
const DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("KUBELET_LOG_POLL_INTERVAL", "250ms"),
];
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";

// ---- shared plumbing ----

fn failed(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// One attack's outcome, printed and appended to `TENANCY_OUT` when set.
fn record(attack: &str, refused: bool, summary: &str, details: &Value) {
    let status = if refused { "pass" } else { "fail" };
    eprintln!("[tenant] {attack}: {} — {summary}", status.to_uppercase());
    let Some(path) = std::env::var_os("TENANCY_OUT") else {
        return;
    };
    let line = json!({
        "attack": attack,
        "status": status,
        "summary": summary,
        "details": details,
    });
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("TENANCY_OUT can be opened");
    writeln!(file, "{line}").expect("TENANCY_OUT can be written");
}

/// A pod `name` on the test's first virtual node, as any pod author would write it.
fn pod_manifest(h: &Harness, name: &str, greeting: &str, image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": h.node_name(0)},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": image,
                "env": [
                    {"name": "GREETING", "value": greeting},
                    {"name": "MOCK_ECI_LOG_INTERVAL", "value": "1h"},
                ],
            }],
        },
    }))
    .expect("the pod manifest is a Pod")
}

/// The pod's group id once it runs with its group recorded.
async fn running_group(pods: &Api<Pod>, name: &str) -> Option<String> {
    let pod = serde_json::to_value(pods.get(name).await.ok()?).ok()?;
    let running = pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
    let id = pod["metadata"]["annotations"][INSTANCE_ID].as_str()?;
    running.then(|| id.to_owned())
}

/// Creates `name` as the tenant (their own client) and waits until it runs; its group id.
async fn tenant_pod(
    h: &Harness,
    tenant: &Tenant,
    name: &str,
    greeting: &str,
    image: &str,
) -> Result<String, HarnessError> {
    let pods: Api<Pod> = Api::namespaced(tenant.client(), tenant.namespace());
    pods.create(
        &PostParams::default(),
        &pod_manifest(h, name, greeting, image),
    )
    .await?;
    h.wait_for(
        &format!("{}/{name} running", tenant.namespace()),
        WAIT,
        |_| {
            let pods = pods.clone();
            async move { running_group(&pods, name).await.is_some() }
        },
    )
    .await?;
    running_group(&pods, name)
        .await
        .ok_or_else(|| failed(format!("{name} lost its group")))
}

// ---- attacks ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_instance_id_reaches_only_the_tenants_own_group() {
    run_scenario(async |h| {
        let victim = h.create_tenant("victim").await?;
        let attacker = h.create_tenant("attacker").await?;
        h.start_mock_eci(MOCK).await?;
        h.start_daemon(0, DAEMON)?;
        let victim_group = tenant_pod(h, &victim, "db", "the victim's secret", "registry.example.com/victim-db:1").await?;
        let own_group = tenant_pod(h, &attacker, "box", "the attacker's own", "registry.example.com/attacker:1").await?;
        let ns = attacker.namespace();

        let forged = format!("{INSTANCE_ID}={victim_group}");
        let annotate = attacker
            .kubectl(&["annotate", "--overwrite", "-n", ns, "pod", "box", &forged], b"")
            .await?;
        if !annotate.succeeded() {
            return Err(failed(format!("the tenant may annotate their own pod: {}", annotate.stderr)));
        }
        let exec = attacker
            .kubectl(&["exec", "-n", ns, "box", "--", "printenv", "GREETING"], b"")
            .await?;
        let logs = attacker.kubectl(&["logs", "-n", ns, "box"], b"").await?;
        let exec_own = exec.succeeded() && exec.stdout == "the attacker's own\n";
        let logs_own = logs.succeeded()
            && logs.stdout.contains("starting registry.example.com/attacker:1")
            && !logs.stdout.contains("victim");
        let pods: Api<Pod> = Api::namespaced(attacker.client(), ns);
        let written_back = h
            .wait_for("the pod's own group id written back over the forged one", WAIT, |_| {
                let (pods, own) = (pods.clone(), own_group.clone());
                async move { running_group(&pods, "box").await == Some(own) }
            })
            .await
            .is_ok();
        let refused = exec_own && logs_own && written_back;
        record(
            "forged instance id",
            refused,
            "exec and logs on a pod whose eci-instance-id names another namespace's group reach the pod's own group; the id is written back",
            &json!({
                "exec": {"code": exec.code, "stdout": exec.stdout, "stderr": exec.stderr},
                "logs_are_own": logs_own,
                "written_back": written_back,
            }),
        );
        assert!(exec_own, "exec ran in the pod's own group: {exec:?}");
        assert!(logs_own, "the log is the pod's own group's: {logs:?}");
        assert!(written_back, "the forged annotation was corrected");
        Ok(())
    })
    .await;
}

/// The `data` of the recommended shared-cluster policy, read from the example file itself
/// (flat `key: value` lines under `data:`).
fn shared_cluster_policy() -> serde_json::Map<String, Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/annotation-policy-shared-cluster.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the example policy exists");
    let data = text
        .split("\ndata:\n")
        .nth(1)
        .expect("the example has data");
    data.lines()
        .filter_map(|line| line.trim().split_once(": "))
        .map(|(k, v)| (k.to_owned(), Value::String(v.trim().to_owned())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_choose_the_ram_role_or_security_group_under_the_shared_cluster_policy() {
    use k8s_openapi::api::core::v1::{ConfigMap, Event};
    run_scenario(async |h| {
        let tenant = h.create_tenant("identity").await?;
        let policy_name = format!("{}-policy", h.daemon_set_name());
        let data = shared_cluster_policy();
        assert!(data.contains_key("eci-ram-role-name") && data.contains_key("eci-security-group"));
        let policy: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": policy_name, "namespace": "kube-system"},
            "data": data,
        }))
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(h.client(), "kube-system")
            .create(&PostParams::default(), &policy)
            .await?;
        let mock = h.start_mock_eci(MOCK).await?;
        let mut daemon = DAEMON.to_vec();
        daemon.push(("ANNOTATION_POLICY_CONFIGMAP", &policy_name));
        h.start_daemon(0, &daemon)?;
        let ns = tenant.namespace();

        let mut pod = pod_manifest(h, "escalate", "hi", "registry.example.com/attacker:1");
        pod.metadata.annotations = Some(
            [
                ("k8s.aliyun.com/eci-ram-role-name", "AliyunECSInstanceForAdminRole"),
                ("k8s.aliyun.com/eci-security-group", "sg-platform-internal"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        let pods: Api<Pod> = Api::namespaced(tenant.client(), ns);
        pods.create(&PostParams::default(), &pod).await?;
        let refused_pod = h
            .wait_pod(ns, "escalate", "Pending, refused by the annotation policy", WAIT, |p| {
                p["status"]["phase"] == "Pending"
                    && p["status"]["conditions"].as_array().into_iter().flatten().any(|c| {
                        c["type"] == "ContainerInstanceCreated"
                            && c["reason"] == "AnnotationNotAllowed"
                            && c["message"].as_str().is_some_and(|m| {
                                m.contains("k8s.aliyun.com/eci-") && m.contains(&policy_name)
                            })
                    })
            })
            .await?;
        let events: Api<Event> = Api::namespaced(h.client(), ns);
        h.wait_for("a Warning Event AnnotationNotAllowed", WAIT, |_| {
            let events = events.clone();
            async move {
                events.list(&Default::default()).await.is_ok_and(|list| {
                    list.items.iter().any(|e| {
                        e.reason.as_deref() == Some("AnnotationNotAllowed")
                            && e.involved_object.name.as_deref() == Some("escalate")
                    })
                })
            }
        })
        .await?;
        // The tenant's way out would be to label their own namespace as trusted.
        let relabel = tenant
            .kubectl(&["label", "namespace", ns, "eci.aliyun.com/trusted=true"], b"")
            .await?;
        let can_patch = tenant
            .kubectl(&["auth", "can-i", "patch", &format!("namespace/{ns}")], b"")
            .await?;
        let uid = refused_pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let groups: Vec<Value> = reqwest::get(format!("{}/admin/groups", mock.admin))
            .await
            .map_err(|e| failed(e.to_string()))?
            .json()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let created = groups.iter().any(|g| {
            g["tags"].as_array().into_iter().flatten().any(|t| {
                t["key"] == "k8s.aliyun.com/pod-uid" && t["value"].as_str() == Some(uid.as_str())
            })
        });
        let still_pending = h
            .pod_json(ns, "escalate")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Pending");
        let relabel_refused = !relabel.succeeded() && relabel.stderr.contains("forbidden");
        let cannot_patch = can_patch.stdout.trim() == "no";
        let refused = !created && still_pending && relabel_refused && cannot_patch;
        record(
            "chosen RAM role and security group",
            refused,
            "under the shared-cluster policy a tenant's pod naming a RAM role and security group stays Pending (AnnotationNotAllowed) with no ECI group, and the tenant cannot label their namespace trusted",
            &json!({
                "group_created": created,
                "still_pending": still_pending,
                "relabel": {"code": relabel.code, "stderr": relabel.stderr},
                "can_i_patch_namespace": can_patch.stdout.trim(),
            }),
        );
        let _ = Api::<ConfigMap>::namespaced(h.client(), "kube-system")
            .delete(&policy_name, &Default::default())
            .await;
        assert!(!created, "mock-eci got no group for the refused pod: {groups:?}");
        assert!(still_pending, "the refused pod stays Pending");
        assert!(relabel_refused, "the tenant may not label their namespace: {relabel:?}");
        assert!(cannot_patch, "kubectl auth can-i patch namespace says no: {can_patch:?}");
        Ok(())
    })
    .await;
}
