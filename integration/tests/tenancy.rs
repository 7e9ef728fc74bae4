//! The hostile-tenant suite (issue 26): a user bound only to the built-in `admin` ClusterRole
//! in their own namespace ([`integration::harness::Tenant`]) tries what a pod author on a
//! shared cluster would try, with their own token, through kubectl and the daemon's listeners.
//! Each attack must be refused, or must reach nothing but the tenant's own objects.
//!
//! Attacks, one test each:
//! - **forged instance id**: the tenant writes another namespace's group id into their own
//!   pod's `k8s.aliyun.com/eci-instance-id`, then runs `kubectl exec` and `kubectl logs` on it:
//!   both reach the tenant's own group, and the annotation is written back.
//! - **chosen RAM role and security group**: under the shipped annotation policy
//!   (deploy/base/annotation-policy.yaml), the tenant sets
//!   `k8s.aliyun.com/eci-ram-role-name` and `eci-security-group` on their own pod: it stays
//!   Pending with `AnnotationNotAllowed` and mock-eci gets no group; the tenant cannot label
//!   their namespace into the allowed set (the `admin` role may not patch namespaces).
//! - **scheduler extender**: the tenant calls the ResourcePolicy extender's `/bind` (a pending
//!   pod of another namespace onto a virtual node) and `/filter` (pods of their capped policy,
//!   to take its place) with no credentials (401) and with their own token (403), and declares
//!   a 100 MiB body (413): the pod stays unbound, and the tenant's real pod still gets the
//!   unit's only place.
//! - **node taint by a forbidden RAM role**: with `annotationPolicy: open` (everything allowed) the
//!   tenant names, in `k8s.aliyun.com/eci-ram-role-name`, a RAM role the account may not use;
//!   ECI refuses the create with `Forbidden.RAM`. That is the pod's problem alone: it stays
//!   Pending with the code on its `ContainerInstanceCreated` condition and a Warning Event,
//!   the node is never tainted `virtual-node.eci/misconfigured` (watched throughout), and
//!   another tenant's pod runs there.
//! - **annotation policy defaults (issue 45)**: on a default install (the shipped policy) each
//!   annotation choosing a cloud identity, network or another team's resource, and one the
//!   policy does not name, keeps the tenant's pod Pending (`AnnotationNotAllowed`) with no
//!   group, until an administrator marks the namespace; a pod requesting 100m with
//!   `eci-use-specs: 64-256Gi` in a 1 CPU / 1 GiB namespace stays Pending
//!   (`SpecLargerThanResources`); with `annotationPolicy: open` both run as in ack-virtual-node.
//!
//! With `TENANCY_OUT=<file>` each attack appends one JSON object (`attack`, `status`: `pass`
//! when refused, else `fail`; `summary`, `details`) to the file: the reliability report
//! (`integration/src/bin/reliability.rs`) lists them in its own section.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io::Write as _;
use std::time::Duration;

use integration::harness::mock_admin;
use integration::harness::{FixtureOptions, Harness, HarnessError, Tenant};
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

/// Runs `scenario` on the binary's shared cluster, started (by whichever test comes first)
/// with kube-scheduler calling the daemon's extender, so every test here asks for the same.
async fn run_scenario<F>(scenario: F)
where
    F: AsyncFnOnce(&mut Harness) -> Result<(), HarnessError>,
{
    let options = FixtureOptions {
        placement_extender: true,
        ..FixtureOptions::default()
    };
    let mut h = Harness::start_with(options)
        .await
        .expect("the harness starts");
    let result = scenario(&mut h).await;
    h.finish(result).await;
}

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

/// The `data` of the shared-cluster policy: the shipped default.
fn shared_cluster_policy() -> serde_json::Map<String, Value> {
    shipped_policy()
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
        let groups = mock_admin::groups(&mock.admin).await?;
        let created = groups.iter().any(|g| {
            mock_admin::tag(g, "k8s.aliyun.com/pod-uid") == uid
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

/// The ResourcePolicy CRD as deploy/ ships it (the harness applies only the Selector CRD),
/// served before this returns.
async fn install_resource_policy_crd(h: &Harness) -> Result<(), HarnessError> {
    let crd = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/base/resourcepolicy-crd.yaml");
    for args in [
        vec![
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crd.display().to_string(),
        ],
        vec![
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/resourcepolicies.scheduling.alibabacloud.com",
        ],
    ] {
        let output = tokio::process::Command::new(h.kubectl())
            .arg("--kubeconfig")
            .arg(h.kubeconfig())
            .args(&args)
            .output()
            .await
            .map_err(|source| HarnessError::Io {
                what: "run kubectl".into(),
                source,
            })?;
        if !output.status.success() {
            return Err(failed(format!(
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
    }
    Ok(())
}

/// One HTTPS POST to the extender (trusting the fixture's CA) as a tenant could send it: its
/// own JSON `body`, or a `declared` Content-Length it never sends in full. The status code,
/// and the answer's head; `None` when no HTTP answer came.
async fn post_to_extender(
    extender: &integration::cluster::PlacementExtender,
    verb: &str,
    token: Option<&str>,
    body: &[u8],
    declared: Option<usize>,
) -> Option<(u16, String)> {
    use rustls::pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(extender.ca_file()).ok()?)
        .ok()?;
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(extender.addr).await.ok()?;
        let name = rustls::pki_types::ServerName::IpAddress(extender.addr.ip().into());
        let mut tls = connector.connect(name, tcp).await.ok()?;
        let mut head = format!(
            "POST /resourcepolicy/{verb} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            extender.addr,
            declared.unwrap_or(body.len()),
        );
        if let Some(token) = token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        tls.write_all(head.as_bytes()).await.ok()?;
        tls.write_all(body).await.ok()?;
        tls.flush().await.ok()?;
        // The answer's head is enough (a refused body is never read, so the connection may
        // stay open waiting for the rest of it).
        let mut answer = Vec::new();
        let mut buffer = [0_u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let read = tls.read(&mut buffer).await.ok()?;
            if read == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..read]);
        }
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text.split(' ').nth(1)?.parse().ok()?;
        Some((status, text.lines().next().unwrap_or_default().to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_extender_refuses_a_tenant() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    run_scenario(async |h| {
        let Some(extender) = h.placement_extender() else {
            return Err(failed("the fixture runs kube-scheduler with the extender"));
        };
        install_resource_policy_crd(h).await?;
        let victim = h.create_tenant("victim-bind").await?;
        let attacker = h.create_tenant("binder").await?;
        let ns = attacker.namespace().to_owned();
        h.start_mock_eci(MOCK).await?;
        let mut env: Vec<(String, String)> =
            DAEMON.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        env.extend(h.placement_env());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        h.start_daemon(0, &env)?;
        let node = h.node_name(0);
        let toleration = json!([{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);

        // The victim's pod, pending for good: it selects a label no node has.
        let victim_pods: Api<Pod> = Api::namespaced(victim.client(), victim.namespace());
        let pending: Pod = serde_json::from_value(json!({
            "metadata": {"name": "pending"},
            "spec": {
                "nodeSelector": {"e2e-no-such-node": "true"},
                "tolerations": toleration,
                "containers": [{"name": "app", "image": "registry.example.com/victim:1"}],
            },
        }))
        .unwrap();
        victim_pods.create(&PostParams::default(), &pending).await?;
        // The attacker's namespace gets a policy with one place on the virtual nodes (written
        // by the administrator: `admin` does not cover the CRD).
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("scheduling.alibabacloud.com", "v1alpha1", "ResourcePolicy"),
            "resourcepolicies",
        );
        let policies: Api<DynamicObject> = Api::namespaced_with(h.client(), &ns, &resource);
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
            "kind": "ResourcePolicy",
            "metadata": {"name": "capped"},
            "spec": {"selector": {"app": "capped"}, "units": [{"resource": "eci", "max": 1}]},
        }))
        .unwrap();
        policies.create(&PostParams::default(), &policy).await?;
        // Its status is written by the elected replica, which then serves the extender too.
        h.wait_for("the elected replica to count the policy", WAIT, |_| {
            let policies = policies.clone();
            async move {
                policies.get_opt("capped").await.ok().flatten().is_some_and(|p| {
                    let status = p.data.get("status").cloned().unwrap_or_default();
                    !status["observedGeneration"].is_null()
                })
            }
        })
        .await?;
        h.wait_for("the extender to answer over HTTPS", WAIT, |_| {
            let extender = extender.clone();
            async move { post_to_extender(&extender, "filter", None, b"{}", None).await.is_some() }
        })
        .await?;

        let bind = serde_json::to_vec(&json!({
            "PodName": "pending", "PodNamespace": victim.namespace(), "PodUID": "", "Node": node,
        }))
        .unwrap();
        let forged_filter = |uid: &str| {
            serde_json::to_vec(&json!({
                "Pod": {
                    "metadata": {"name": format!("forged-{uid}"), "namespace": ns, "uid": uid, "labels": {"app": "capped"}},
                    "spec": {"containers": [{"name": "app", "image": "x"}]},
                },
                "NodeNames": [node],
            }))
            .unwrap()
        };
        let token = attacker.token();
        let mut answers = Vec::new();
        for (name, verb, token, body, declared, expected) in [
            ("bind, no credentials", "bind", None, bind.clone(), None, 401),
            ("bind, the tenant's token", "bind", Some(token), bind.clone(), None, 403),
            ("filter, no credentials", "filter", None, forged_filter("forged-1"), None, 401),
            ("filter, the tenant's token", "filter", Some(token), forged_filter("forged-2"), None, 403),
            ("a 100 MiB body declared", "filter", Some(token), b"{".to_vec(), Some(100 << 20), 413),
        ] {
            let answer = post_to_extender(&extender, verb, token, &body, declared).await;
            let ok = answer.as_ref().is_some_and(|(status, _)| *status == expected);
            answers.push((name, expected, answer, ok));
        }
        let statuses_ok = answers.iter().all(|(.., ok)| *ok);

        // Nothing was bound…
        let still_pending = victim_pods
            .get("pending")
            .await?
            .spec
            .is_some_and(|spec| spec.node_name.is_none());
        // …and nothing reserved: the unit's one place goes to the tenant's real pod, well
        // within the 60 s a forged filter's reservation would hold it. The pod is held to this
        // test's node: the unit takes any virtual node, and a node of a test running beside
        // this one is deleted when that test ends, its pods then removed by the pod GC.
        let pods: Api<Pod> = Api::namespaced(attacker.client(), &ns);
        let real: Pod = serde_json::from_value(json!({
            "metadata": {"name": "real", "labels": {"app": "capped"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": toleration,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": "registry.example.com/attacker:1"}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &real).await?;
        let placed = h
            .wait_for("the real pod placed by the extender", Duration::from_secs(120), |_| {
                let (pods, node) = (pods.clone(), node.clone());
                async move {
                    pods.get_opt("real").await.ok().flatten().is_some_and(|pod| {
                        let placed_by = pod
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("placement.virtual-node-eci.aliyun.com/placed-by"))
                            .cloned();
                        pod.spec.and_then(|s| s.node_name) == Some(node)
                            && placed_by.as_deref() == Some("extender")
                    })
                }
            })
            .await
            .is_ok();

        // Where the real pod went and who placed it: a failure says which step fell through
        // (the scheduler binding it itself after an extender timeout; admission-time placement
        // after the placement Lease lapsed; a unit refused as full).
        // Read as the cluster's admin too: the tenant's read failing and the pod being gone
        // are different failures.
        let real_now = pods.get_opt("real").await;
        let real_seen = match &real_now {
            Ok(Some(pod)) => json!({
                "node": pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                "annotations": pod.metadata.annotations,
            }),
            Ok(None) => json!({"tenant_read": "not found", "admin_read": h.pod_json(&ns, "real").await}),
            Err(error) => json!({"tenant_read": error.to_string(), "admin_read": h.pod_json(&ns, "real").await}),
        };
        let refused = statuses_ok && still_pending && placed;
        let details: Vec<Value> = answers
            .iter()
            .map(|(name, expected, answer, ok)| {
                json!({"call": name, "expected": expected, "answer": answer.as_ref().map(|(_, head)| head), "ok": ok})
            })
            .collect();
        record(
            "scheduler extender",
            refused,
            "the extender answers a tenant's /bind and /filter with 401 without credentials and 403 with their token, a declared 100 MiB body with 413; nothing is bound or reserved",
            &json!({"calls": details, "victim_pod_unbound": still_pending, "real_pod_placed": placed, "real_pod": real_seen}),
        );
        assert!(statuses_ok, "the extender's answers: {answers:?}");
        assert!(still_pending, "the victim's pod was not bound");
        assert!(
            placed,
            "the real pod was placed by the extender on {node} (the unit's place was not taken by a forged filter): {real_seen:?}"
        );
        Ok(())
    })
    .await;
}

/// Every sighting of the misconfiguration on `node` (its `EciMisconfigured=True` condition or
/// its `virtual-node.eci/misconfigured` taint), from a watch of the Node: a state that came and
/// went between two polls is seen too.
fn watch_misconfiguration(
    h: &Harness,
    node: &str,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
) {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::{WatchStreamExt as _, watcher};

    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let nodes: Api<Node> = Api::all(h.client());
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let sink = std::sync::Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(nodes, config).default_backoff().applied_objects());
        while let Some(event) = stream.next().await {
            let Ok(node) = event else { continue };
            let node = serde_json::to_value(node).unwrap_or_default();
            let condition = node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "EciMisconfigured" && c["status"] == "True");
            let taint = node["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["key"] == "virtual-node.eci/misconfigured");
            if condition.is_some() || taint.is_some() {
                sink.lock()
                    .unwrap()
                    .push(json!({"condition": condition, "taint": taint}));
            }
        }
    });
    (task, seen)
}

/// How many creates mock-eci refused with `code`, from its metrics.
async fn refused_creates(admin: &str, code: &str) -> u64 {
    let prefix =
        format!(r#"mock_eci_calls_total{{action="CreateContainerGroup",result="{code}"}} "#);
    let Ok(response) = reqwest::get(format!("{admin}/metrics")).await else {
        return 0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ram_role_the_account_may_not_use_refuses_only_the_pod_that_names_it() {
    use k8s_openapi::api::core::v1::Event;
    const ROLE: &str = "AliyunECSInstanceForAdminRole";
    const CODE: &str = "Forbidden.RAM";
    run_scenario(async |h| {
        let attacker = h.create_tenant("taint-attacker").await?;
        let bystander = h.create_tenant("bystander").await?;
        let mut mock_flags = MOCK.to_vec();
        mock_flags.extend(["--deny-ram-role", ROLE]);
        let mock = h.start_mock_eci(&mock_flags).await?;
        let node = h.node_name(0);
        let (watch, sightings) = watch_misconfiguration(h, &node);
        // `annotationPolicy: open` (no policy named): every annotation allowed everywhere, so
        // the RAM role reaches ECI.
        h.start_daemon(0, DAEMON)?;
        let ns = attacker.namespace();

        let mut pod = pod_manifest(h, "escalate", "hi", "registry.example.com/attacker:1");
        pod.metadata.annotations = Some(
            [("k8s.aliyun.com/eci-ram-role-name".to_owned(), ROLE.to_owned())].into(),
        );
        Api::<Pod>::namespaced(attacker.client(), ns)
            .create(&PostParams::default(), &pod)
            .await?;
        // The attack has acted — and was retried — once ECI refused the create twice.
        let retried = h
            .wait_for("mock-eci refused the attacker's create twice", WAIT, |_| {
                let admin = mock.admin.clone();
                async move { refused_creates(&admin, CODE).await >= 2 }
            })
            .await
            .is_ok();
        // The taint would keep this pod off the node.
        let bystander_runs = tenant_pod(h, &bystander, "ordinary", "hello", "registry.example.com/app:1")
            .await
            .is_ok();
        let explained = h
            .wait_pod(ns, "escalate", "Pending, ContainerInstanceCreated=False naming the code", WAIT, |p| {
                p["status"]["phase"] == "Pending"
                    && p["status"]["conditions"].as_array().into_iter().flatten().any(|c| {
                        c["type"] == "ContainerInstanceCreated"
                            && c["status"] == "False"
                            && c["reason"].as_str().is_some_and(|r| r.contains(CODE))
                            && c["message"].as_str().is_some_and(|m| m.contains(ROLE))
                    })
            })
            .await
            .is_ok();
        let events: Api<Event> = Api::namespaced(h.client(), ns);
        let warned = h
            .wait_for("a Warning Event naming the code on the attacker's pod", WAIT, |_| {
                let events = events.clone();
                async move {
                    events.list(&Default::default()).await.is_ok_and(|list| {
                        list.items.iter().any(|e| {
                            e.type_.as_deref() == Some("Warning")
                                && e.involved_object.name.as_deref() == Some("escalate")
                                && e.reason.as_deref().is_some_and(|r| r.contains(CODE))
                        })
                    })
                }
            })
            .await
            .is_ok();
        watch.abort();
        let seen = sightings.lock().unwrap().clone();
        let node_clean = seen.is_empty();
        let refused = retried && bystander_runs && explained && warned && node_clean;
        record(
            "node taint by a forbidden RAM role",
            refused,
            "a pod naming a RAM role the account may not use (Forbidden.RAM) stays Pending with the code on its own condition and a Warning Event; the node is never tainted misconfigured and another tenant's pod runs",
            &json!({
                "refusals_retried": retried,
                "bystander_running": bystander_runs,
                "pod_condition": explained,
                "warning_event": warned,
                "node_sightings": seen,
            }),
        );
        assert!(retried, "mock-eci refused the attacker's create, and it was retried");
        assert!(node_clean, "the node was never shown misconfigured: {seen:?}");
        assert!(bystander_runs, "the other tenant's pod runs on the node");
        assert!(explained, "the attacker's pod shows the refusal on its condition");
        assert!(warned, "the attacker's pod has a Warning Event naming the code");
        Ok(())
    })
    .await;
}

// --- annotation policy defaults (issue 45) ---
//
// A default install (chart and kustomize) carries the shipped policy,
// deploy/base/annotation-policy.yaml, and names it in ANNOTATION_POLICY_CONFIGMAP; these tests
// create that very ConfigMap and start the daemon naming it. `annotationPolicy: open` renders
// neither (provider/tests/chart.rs), which is the daemon started without the setting.

/// The shipped policy's `data`, read from deploy/base/annotation-policy.yaml.
fn shipped_policy() -> serde_json::Map<String, Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/annotation-policy.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the shipped policy exists");
    let data = text.split("\ndata:\n").nth(1).expect("the policy has data");
    data.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(": "))
        .map(|(k, v)| (k.to_owned(), Value::String(v.trim().to_owned())))
        .collect()
}

/// Creates the shipped policy (under a name of this test's) and starts mock-eci and the
/// daemon naming it, as a default install runs.
async fn default_install(h: &mut Harness) -> Result<(String, String), HarnessError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let policy_name = format!("{}-shipped-policy", h.daemon_set_name());
    let policy: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": policy_name, "namespace": "kube-system"},
        "data": shipped_policy(),
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(h.client(), "kube-system")
        .create(&PostParams::default(), &policy)
        .await?;
    let mock = h.start_mock_eci(MOCK).await?;
    let mut daemon = DAEMON.to_vec();
    daemon.push(("ANNOTATION_POLICY_CONFIGMAP", &policy_name));
    h.start_daemon(0, &daemon)?;
    Ok((policy_name, mock.admin))
}

/// The tenant's pod `name` with `annotations` and `resources` on its container.
fn annotated_pod(h: &Harness, name: &str, annotations: &Value, resources: &Value) -> Pod {
    let mut pod = serde_json::to_value(pod_manifest(h, name, "hi", "registry.example.com/app:1"))
        .expect("a pod is JSON");
    pod["metadata"]["annotations"] = annotations.clone();
    pod["spec"]["containers"][0]["resources"] = resources.clone();
    serde_json::from_value(pod).expect("still a pod")
}

// Used by the daemon-owned annotation tests (issue 45).
const PENDING_EFFECT: &str = "virtual-node-eci.aliyun.com/pending-effect";
const EIP_ADDRESS: &str = "k8s.aliyun.com/allocated-eipAddress";

/// The tenant creates `pod` in their namespace with their own client, adding `annotations`.
async fn tenant_creates(
    h: &Harness,
    tenant: &Tenant,
    name: &str,
    annotations: Value,
) -> Result<Api<Pod>, HarnessError> {
    let mut pod = pod_manifest(h, name, "hello", "registry.example.com/app:1");
    pod.metadata.annotations = Some(serde_json::from_value(annotations).unwrap());
    let pods: Api<Pod> = Api::namespaced(tenant.client(), tenant.namespace());
    pods.create(&PostParams::default(), &pod).await?;
    Ok(pods)
}

/// mock-eci's group of the pod with `uid`, if any.
async fn group_of(admin: &str, uid: &str) -> Result<Option<Value>, HarnessError> {
    let groups = mock_admin::groups(admin).await?;
    Ok(groups
        .into_iter()
        .find(|g| mock_admin::tag(g, "k8s.aliyun.com/pod-uid") == uid))
}

/// Waits until `ns/name` is Pending, refused with `reason` saying each of `naming` (its
/// condition and a Warning Event); its UID.
async fn wait_refused(
    h: &Harness,
    ns: &str,
    name: &str,
    reason: &str,
    naming: &[&str],
) -> Result<String, HarnessError> {
    let pod = h
        .wait_refused((ns, name), "Pending", reason, naming, WAIT)
        .await?;
    Ok(pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

/// Every annotation of the attack, one pod each, with a value the translation accepts.
const IDENTITY_AND_NETWORK: &[(&str, &str)] = &[
    ("eci-ram-role-name", "PlatformAdminRole"),
    ("eci-security-group", "sg-other-team"),
    ("eci-vswitch", "vsw-other-team"),
    ("eci-with-eip", "true"),
    ("eci-eip-instanceid", "eip-other-team"),
    ("eci-private-ip-address", "10.0.0.10"),
    ("eci-resource-group-id", "rg-other-team"),
    ("eci-imc-id", "imc-other-team"),
    ("acr-instance-ids", "cri-other-team"),
    ("acr-service-arns", "acs:ram::1:role/other-team"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_install_keeps_cloud_identity_and_network_to_marked_namespaces() {
    run_scenario(async |h| {
        let tenant = h.create_tenant("identity-default").await?;
        let (policy_name, admin) = default_install(h).await?;
        let ns = tenant.namespace().to_owned();
        let pods: Api<Pod> = Api::namespaced(tenant.client(), &ns);
        let mut refused = Vec::new();
        for (short, value) in IDENTITY_AND_NETWORK {
            let name = format!("take-{}", short.replace('_', "-"));
            let annotation = format!("k8s.aliyun.com/{short}");
            let pod = annotated_pod(h, &name, &json!({&annotation: value}), &json!({}));
            pods.create(&PostParams::default(), &pod).await?;
            let uid = wait_refused(h, &ns, &name, "AnnotationNotAllowed", &[&annotation, &policy_name]).await?;
            refused.push((name, uid));
        }
        // An annotation the policy does not name: refused too (an allow-list).
        let unnamed = annotated_pod(h, "unnamed", &json!({"k8s.aliyun.com/eci-made-up": "x"}), &json!({}));
        pods.create(&PostParams::default(), &unnamed).await?;
        let uid = wait_refused(h, &ns, "unnamed", "AnnotationNotAllowed", &["k8s.aliyun.com/eci-made-up", "does not name it"]).await?;
        refused.push(("unnamed".to_owned(), uid));
        // What a pod chooses for itself alone stays open.
        let own = annotated_pod(h, "own-choice", &json!({"k8s.aliyun.com/eci-spot-strategy": "SpotAsPriceGo"}), &json!({}));
        pods.create(&PostParams::default(), &own).await?;
        let own_runs = h
            .wait_for("the spot pod running", WAIT, |_| {
                let pods = pods.clone();
                async move { running_group(&pods, "own-choice").await.is_some() }
            })
            .await
            .is_ok();
        let mut created = Vec::new();
        for (name, uid) in &refused {
            if group_of(&admin, uid).await?.is_some() {
                created.push(name.clone());
            }
        }
        // The administrator marks the namespace (the tenant cannot): the RAM role pod runs.
        let relabel = tenant
            .kubectl(&["label", "namespace", &ns, "eci.aliyun.com/trusted=true"], b"")
            .await?;
        let relabel_refused = !relabel.succeeded() && relabel.stderr.contains("forbidden");
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(h.client());
        namespaces
            .patch(
                &ns,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {"eci.aliyun.com/trusted": "true"}}})),
            )
            .await?;
        let marked_runs = h
            .wait_for("the RAM role pod running once the namespace is marked", WAIT, |_| {
                let pods = pods.clone();
                async move { running_group(&pods, "take-eci-ram-role-name").await.is_some() }
            })
            .await
            .is_ok();
        let ok = created.is_empty() && own_runs && relabel_refused && marked_runs;
        record(
            "cloud identity and network on a default install",
            ok,
            "on a default install each identity, network or other-team annotation (and one the policy does not name) keeps a tenant's pod Pending (AnnotationNotAllowed) with no ECI group; a spot pod runs; the tenant cannot mark the namespace, an administrator can",
            &json!({"groups_created": created, "own_choice_runs": own_runs, "relabel_refused": relabel_refused, "marked_runs": marked_runs}),
        );
        assert!(created.is_empty(), "no group for a refused pod: {created:?}");
        assert!(own_runs, "a pod's own choices (spot) stay open");
        assert!(relabel_refused, "the tenant cannot mark their namespace: {relabel:?}");
        assert!(marked_runs, "a marked namespace may choose the RAM role");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_install_refuses_a_spec_larger_than_the_containers_ask_for() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    run_scenario(async |h| {
        let tenant = h.create_tenant("quota-default").await?;
        let ns = tenant.namespace().to_owned();
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "small"},
            "spec": {"hard": {"requests.cpu": "1", "requests.memory": "1Gi", "limits.cpu": "1", "limits.memory": "1Gi"}},
        }))
        .expect("a ResourceQuota");
        Api::<ResourceQuota>::namespaced(h.client(), &ns)
            .create(&PostParams::default(), &quota)
            .await?;
        let (_, admin) = default_install(h).await?;
        let pods: Api<Pod> = Api::namespaced(tenant.client(), &ns);
        let small = json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}});
        let big = annotated_pod(h, "big", &json!({"k8s.aliyun.com/eci-use-specs": "64-256Gi"}), &small);
        pods.create(&PostParams::default(), &big).await?;
        let uid = wait_refused(h, &ns, "big", "SpecLargerThanResources", &["64-256Gi", "ResourceQuota"]).await?;
        // The same pod with a spec its containers fill (ECI's smallest) runs.
        let fits = annotated_pod(h, "fits", &json!({"k8s.aliyun.com/eci-use-specs": "0.25-0.5Gi"}), &small);
        pods.create(&PostParams::default(), &fits).await?;
        let fits_runs = h
            .wait_for("the pod with a fitting spec running", WAIT, |_| {
                let pods = pods.clone();
                async move { running_group(&pods, "fits").await.is_some() }
            })
            .await
            .is_ok();
        let big_group = group_of(&admin, &uid).await?;
        let ok = big_group.is_none() && fits_runs;
        record(
            "quota escape by eci-use-specs on a default install",
            ok,
            "in a namespace limited to 1 CPU / 1 GiB a pod requesting 100m with eci-use-specs 64-256Gi stays Pending (SpecLargerThanResources) with no ECI group; a spec its containers fill runs",
            &json!({"big_group": big_group, "fits_runs": fits_runs}),
        );
        assert!(big_group.is_none(), "no 64-vCPU group: {big_group:?}");
        assert!(fits_runs, "a spec the containers fill runs");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_policy_open_restores_ack_virtual_nodes_behaviour() {
    run_scenario(async |h| {
        let tenant = h.create_tenant("open").await?;
        let ns = tenant.namespace().to_owned();
        let mock = h.start_mock_eci(MOCK).await?;
        // `annotationPolicy: open`: no policy named.
        h.start_daemon(0, DAEMON)?;
        let pods: Api<Pod> = Api::namespaced(tenant.client(), &ns);
        let annotations = json!({
            "k8s.aliyun.com/eci-ram-role-name": "PlatformAdminRole",
            "k8s.aliyun.com/eci-use-specs": "64-256Gi",
            "k8s.aliyun.com/eci-made-up": "x",
        });
        let small = json!({"requests": {"cpu": "100m", "memory": "128Mi"}});
        pods.create(
            &PostParams::default(),
            &annotated_pod(h, "anything", &annotations, &small),
        )
        .await?;
        h.wait_for("the pod running", WAIT, |_| {
            let pods = pods.clone();
            async move { running_group(&pods, "anything").await.is_some() }
        })
        .await?;
        let uid = h
            .pod_json(&ns, "anything")
            .await
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let group = group_of(&mock.admin, &uid)
            .await?
            .ok_or_else(|| failed("no group"))?;
        assert_eq!(group["ram_role_name"], "PlatformAdminRole", "{group}");
        assert_eq!(group["cpu"].as_f64(), Some(64.0), "{group}");
        Ok(())
    })
    .await;
}

// --- daemon-owned annotations and Selector scope (issue 45) ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_effect_the_tenant_wrote_is_not_applied() {
    run_scenario(async |h| {
        let tenant = h.create_tenant("forger").await?;
        let mock = h.start_mock_eci(MOCK).await?;
        h.start_daemon(0, DAEMON)?;
        // What a fair Selector's effect looks like, written by the pod's author.
        let forged = json!({
            "labels": {"team": "platform"},
            "annotations": {"k8s.aliyun.com/eci-use-specs": "64-256Gi"},
        });
        let pods = tenant_creates(h, &tenant, "forger", json!({PENDING_EFFECT: forged.to_string()})).await?;
        h.wait_for("the pod running", WAIT, |_| {
            let pods = pods.clone();
            async move { running_group(&pods, "forger").await.is_some() }
        })
        .await?;
        let pod = serde_json::to_value(pods.get("forger").await?).unwrap();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let group = group_of(&mock.admin, &uid).await?.ok_or_else(|| failed("no group for the pod"))?;
        let labelled = pod["metadata"]["labels"].get("team").is_some();
        let spec_taken = pod["metadata"]["annotations"].get("k8s.aliyun.com/eci-use-specs").is_some()
            || group["cpu"].as_f64() == Some(64.0);
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(h.client(), tenant.namespace());
        let reported = h
            .wait_for("a ForgedSelectorEffect Warning Event", WAIT, |_| {
                let events = events.clone();
                async move {
                    events.list(&Default::default()).await.is_ok_and(|l| {
                        l.items.iter().any(|e| e.reason.as_deref() == Some("ForgedSelectorEffect"))
                    })
                }
            })
            .await
            .is_ok();
        let refused = !labelled && !spec_taken && reported;
        record(
            "forged pending effect",
            refused,
            "a pending-effect annotation the pod's author wrote is neither patched onto the pod nor sent to ECI, and is reported",
            &json!({"labelled": labelled, "spec_taken": spec_taken, "group_cpu": group["cpu"], "reported": reported}),
        );
        assert!(!labelled, "the forged label was not applied: {pod}");
        assert!(!spec_taken, "the forged spec reached neither the pod nor the group: {group}");
        assert!(reported, "the forgery is reported on the pod");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotation_of_ours_the_tenant_set_is_cleared_when_eci_has_no_value() {
    run_scenario(async |h| {
        let tenant = h.create_tenant("liar").await?;
        h.start_mock_eci(MOCK).await?;
        h.start_daemon(0, DAEMON)?;
        // The pod has no EIP: a tenant-set address would be read as its public address.
        let pods = tenant_creates(h, &tenant, "liar", json!({EIP_ADDRESS: "203.0.113.7"})).await?;
        h.wait_for("the pod running", WAIT, |_| {
            let pods = pods.clone();
            async move { running_group(&pods, "liar").await.is_some() }
        })
        .await?;
        let cleared = h
            .wait_for("the tenant's EIP address gone from the pod", WAIT, |_| {
                let pods = pods.clone();
                async move {
                    pods.get("liar").await.is_ok_and(|p| {
                        p.metadata.annotations.unwrap_or_default().get(EIP_ADDRESS).is_none_or(String::is_empty)
                    })
                }
            })
            .await
            .is_ok();
        let shown = pods.get("liar").await?.metadata.annotations.unwrap_or_default().get(EIP_ADDRESS).cloned();
        record(
            "lie in an annotation of ours",
            cleared,
            "an allocated-eipAddress the pod's author set is cleared by the daemon's status write when the group has no EIP",
            &json!({"shown": shown}),
        );
        assert!(cleared, "the lie was cleared: {shown:?}");
        Ok(())
    })
    .await;
}
