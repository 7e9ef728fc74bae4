//! The hostile-tenant suite (issue 26): a user bound only to the built-in `admin` ClusterRole
//! in their own namespace ([`integration::harness::Tenant`]) tries what a pod author on a
//! shared cluster would try, with their own token, through kubectl and the daemon's listeners.
//! Each attack must be refused, or must reach nothing but the tenant's own objects.
//!
//! Attacks, one test each:
//! - **forged instance id**: the tenant writes another namespace's group id into their own
//!   pod's `k8s.aliyun.com/eci-instance-id`, then runs `kubectl exec` and `kubectl logs` on it:
//!   both reach the tenant's own group, and the annotation is written back.
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
