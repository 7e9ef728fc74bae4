//! End to end on the real control plane: the daemon's kubelet API as kubectl reaches it through
//! the apiserver (the built kubectl, the apiserver's kubelet client certificate, our
//! InternalIP:port from the Node), and as strangers reach it directly.
//!
//! - `kubectl logs` with `--tail`, `--since-time`, `--timestamps`, `--limit-bytes` and
//!   `--previous` answers what the kubelet would, for lines a test writes into mock-eci;
//! - `kubectl logs -f` keeps printing new lines for over 30 s, every line once, and ends when the
//!   container ends;
//! - every kubelet path answers 401 without credentials (and to a certificate of another CA),
//!   403 to a ServiceAccount token without `nodes/proxy`, and serves the apiserver's client
//!   certificate and a token with the right grant; a pod of another node is 404, an ECI failure
//!   a 500 whose message kubectl prints;
//! - `/runningpods/` lists, as the kubelet's runtime view, the pods ECI runs for the node (uid
//!   and running containers), and drops one once it has finished or been deleted;
//! - the serving certificate the daemon requests (signer kubernetes.io/kubelet-serving) is
//!   served once approved, issued by the cluster's CA.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use integration::harness::{Harness, HarnessError, run_scenario};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

const WAIT: Duration = Duration::from_secs(90);
const FAST_MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
    "--restart-backoff",
    "1s",
];
const FAST_DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("KUBELET_LOG_POLL_INTERVAL", "500ms"),
];
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";
const IMAGE: &str = "registry.example.com/app:1";

fn failed(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

/// What a scenario works with.
struct Scene {
    ns: String,
    node: String,
    admin: String,
    /// The daemon's kubelet API, `https://127.0.0.1:PORT`.
    kubelet: String,
}

async fn start(h: &mut Harness, suffix: &str) -> Result<Scene, HarnessError> {
    let ns = h.create_namespace(suffix).await?;
    let mock = h.start_mock_eci(FAST_MOCK).await?;
    let process = h.start_daemon(0, FAST_DAEMON)?;
    let port = h
        .kubelet_port(&process)
        .ok_or_else(|| failed("the daemon has no kubelet port"))?;
    Ok(Scene {
        ns,
        node: h.node_name(0),
        admin: mock.admin,
        kubelet: format!("https://127.0.0.1:{port}"),
    })
}

/// A pod kube-scheduler places on `node`, with one container `app` whose synthetic log is one
/// start line (the rest is what the test writes), and `restart_policy`.
fn pod_on(name: &str, node: &str, restart_policy: &str, env: &[(&str, &str)]) -> Pod {
    let mut env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    if !env.iter().any(|e| e["name"] == "MOCK_ECI_LOG_INTERVAL") {
        env.push(json!({"name": "MOCK_ECI_LOG_INTERVAL", "value": "1h"}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": IMAGE, "env": env}],
        },
    }))
    .unwrap()
}

async fn pod(h: &Harness, ns: &str, name: &str) -> Option<Value> {
    Api::<Pod>::namespaced(h.client(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|p| serde_json::to_value(p).unwrap())
}

async fn wait_pod(
    h: &Harness,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value, HarnessError> {
    h.wait_for(&format!("pod {ns}/{name}: {what}"), WAIT, |h| {
        let check = &check;
        async move { pod(h, ns, name).await.is_some_and(|p| check(&p)) }
    })
    .await?;
    pod(h, ns, name)
        .await
        .ok_or_else(|| failed(format!("pod {ns}/{name} vanished")))
}

fn container_status(pod: &Value) -> &Value {
    &pod["status"]["containerStatuses"][0]
}

/// Creates the pod and waits until it runs with its group recorded; the group's id.
async fn run_pod(h: &Harness, scene: &Scene, pod: &Pod) -> Result<String, HarnessError> {
    let name = pod.metadata.name.clone().unwrap();
    Api::<Pod>::namespaced(h.client(), &scene.ns)
        .create(&PostParams::default(), pod)
        .await?;
    let running = wait_pod(h, &scene.ns, &name, "running, its group recorded", |p| {
        container_status(p)["state"]["running"].is_object()
            && p["metadata"]["annotations"][INSTANCE_ID].is_string()
    })
    .await?;
    Ok(running["metadata"]["annotations"][INSTANCE_ID]
        .as_str()
        .unwrap()
        .to_owned())
}

/// Writes `lines` into the container's log through mock-eci's admin API.
async fn write_log(scene: &Scene, group: &str, lines: &[String]) -> Result<(), HarnessError> {
    let mut body = lines.join("\n");
    body.push('\n');
    let response = reqwest::Client::new()
        .post(format!(
            "{}/admin/groups/{group}/containers/app/log",
            scene.admin
        ))
        .body(body)
        .send()
        .await
        .map_err(|e| failed(format!("mock-eci admin: {e}")))?;
    if response.status() != 204 {
        return Err(failed(format!("writing the log: {}", response.status())));
    }
    Ok(())
}

/// Ends the container through mock-eci's admin API, with `exit_code`.
async fn end_container(scene: &Scene, group: &str, exit_code: i32) -> Result<(), HarnessError> {
    let response = reqwest::Client::new()
        .post(format!(
            "{}/admin/groups/{group}/containers/app/exit",
            scene.admin
        ))
        .json(&json!({"exit_code": exit_code}))
        .send()
        .await
        .map_err(|e| failed(format!("mock-eci admin: {e}")))?;
    if response.status() != 204 {
        return Err(failed(format!(
            "ending the container: {}",
            response.status()
        )));
    }
    Ok(())
}

struct Kubectl {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn kubectl(h: &Harness, args: &[&str]) -> Kubectl {
    let output = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .output()
        .await
        .expect("kubectl runs");
    Kubectl {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `kubectl logs` of the pod with `extra` flags: its output, or an error with kubectl's.
async fn logs(
    h: &Harness,
    scene: &Scene,
    pod: &str,
    extra: &[&str],
) -> Result<String, HarnessError> {
    let mut args = vec!["logs", "-n", &scene.ns, pod, "-c", "app"];
    args.extend_from_slice(extra);
    let out = kubectl(h, &args).await;
    if out.ok {
        Ok(out.stdout)
    } else {
        Err(failed(format!("kubectl {args:?}: {}", out.stderr)))
    }
}

fn lines_of(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_answers_what_the_kubelet_would() {
    run_scenario(async |h| {
        let scene = start(h, "logs").await?;
        let group = run_pod(h, &scene, &pod_on("talker", &scene.node, "Always", &[])).await?;
        let first: Vec<String> = (1..=10).map(|i| format!("line {i}")).collect();
        let second: Vec<String> = (11..=20).map(|i| format!("line {i} with ünïcode")).collect();
        write_log(&scene, &group, &first).await?;
        // The second batch in a later second than the first: `--since-time` travels with
        // second precision, as metav1.Time does.
        let stamped = logs(h, &scene, "talker", &["--timestamps", "--tail=1"]).await?;
        let first_at: jiff::Timestamp = stamped.split_once(' ').unwrap().0.parse().unwrap();
        let next_second = jiff::Timestamp::from_second(first_at.as_second() + 1).unwrap();
        h.wait_for("the next second", WAIT, |_| async move {
            jiff::Timestamp::now() >= next_second
        })
        .await?;
        write_log(&scene, &group, &second).await?;
        let start_line = format!("[app] starting {IMAGE}");
        let mut expected = vec![start_line.clone()];
        expected.extend(first.iter().chain(&second).cloned());

        let all = logs(h, &scene, "talker", &[]).await?;
        assert_eq!(lines_of(&all), expected);

        let asked = Instant::now();
        let tail = logs(h, &scene, "talker", &["--tail=3"]).await?;
        eprintln!(
            "logs: kubectl logs --tail=3 through the apiserver took {:?} (kubectl start included)",
            asked.elapsed()
        );
        assert_eq!(lines_of(&tail), expected[expected.len() - 3..]);
        assert_eq!(logs(h, &scene, "talker", &["--tail=0"]).await?, "");

        let stamped = logs(h, &scene, "talker", &["--timestamps"]).await?;
        let stamps: Vec<(String, String)> = stamped
            .lines()
            .map(|line| {
                let (stamp, text) = line.split_once(' ').unwrap();
                (stamp.to_owned(), text.to_owned())
            })
            .collect();
        assert_eq!(
            stamps.iter().map(|(_, text)| text.clone()).collect::<Vec<_>>(),
            expected,
            "the same lines, stamped"
        );
        for (stamp, _) in &stamps {
            // The kubelet's RFC3339NanoFixed: nine fractional digits, UTC.
            assert_eq!(stamp.len(), "2026-11-23T10:00:00.000000000Z".len(), "{stamp}");
            assert!(stamp.ends_with('Z') && stamp.as_bytes()[19] == b'.', "{stamp}");
            stamp.parse::<jiff::Timestamp>().unwrap();
        }
        assert!(stamps.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");

        // --since-time: every line at or after the time, as the kubelet keeps them.
        let since = next_second.to_string();
        let from_since: Vec<String> = stamps
            .iter()
            .filter(|(stamp, _)| stamp.parse::<jiff::Timestamp>().unwrap() >= next_second)
            .map(|(_, text)| text.clone())
            .collect();
        assert_eq!(from_since, second, "the second batch, alone in its second");
        let since_flag = format!("--since-time={since}");
        assert_eq!(
            lines_of(&logs(h, &scene, "talker", &[&since_flag]).await?),
            from_since
        );
        assert_eq!(
            lines_of(&logs(h, &scene, "talker", &[&since_flag, "--tail=2"]).await?),
            from_since[from_since.len() - 2..],
            "since, then tail"
        );
        assert_eq!(lines_of(&logs(h, &scene, "talker", &["--since=1h"]).await?), expected);

        // --limit-bytes: the first bytes written, cut mid-line; timestamps count.
        let limited = logs(h, &scene, "talker", &["--limit-bytes=40"]).await?;
        assert_eq!(limited.as_bytes(), &all.as_bytes()[..40]);
        let limited = logs(h, &scene, "talker", &["--limit-bytes=40", "--timestamps"]).await?;
        assert_eq!(limited.as_bytes(), &stamped.as_bytes()[..40]);

        // --previous: the instance before a restart, to its last line.
        assert!(
            logs(h, &scene, "talker", &["--previous"]).await.is_err(),
            "no previous instance yet"
        );
        end_container(&scene, &group, 3).await?;
        wait_pod(h, &scene.ns, "talker", "restarted and running", |p| {
            container_status(p)["restartCount"] == 1
                && container_status(p)["state"]["running"].is_object()
        })
        .await?;
        let previous = logs(h, &scene, "talker", &["--previous"]).await?;
        let mut ended = expected.clone();
        ended.push("[app] exited with code 3".into());
        assert_eq!(lines_of(&previous), ended);
        assert_eq!(
            lines_of(&logs(h, &scene, "talker", &["--previous", "--tail=2"]).await?),
            ended[ended.len() - 2..]
        );
        assert_eq!(lines_of(&logs(h, &scene, "talker", &[]).await?), [start_line]);

        // An ECI failure is a 500 whose message kubectl prints.
        reqwest::Client::new()
            .patch(format!("{}/admin/controls", scene.admin))
            .json(&json!({"faults": {"DescribeContainerLog": {"error_rate": 1.0, "error_code": "InternalError"}}}))
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let out = kubectl(h, &["logs", "-n", &scene.ns, "talker"]).await;
        assert!(!out.ok);
        assert!(
            out.stderr.contains("ECI cannot return the log of container app of pod")
                && out.stderr.contains("InternalError"),
            "{}",
            out.stderr
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_follow_prints_every_line_once_until_the_container_ends() {
    run_scenario(async |h| {
        let scene = start(h, "follow").await?;
        // Synthetic heartbeats twice a second, and bursts the test writes (several lines in
        // one instant, which the follower must neither repeat nor drop).
        let pod = pod_on(
            "chatty",
            &scene.node,
            "Never",
            &[("MOCK_ECI_LOG_INTERVAL", "500ms")],
        );
        let group = run_pod(h, &scene, &pod).await?;
        let mut follower = tokio::process::Command::new(h.kubectl())
            .arg("--kubeconfig")
            .arg(h.kubeconfig())
            .args(["logs", "-f", "-n", &scene.ns, "chatty"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl runs");
        let mut stdout = tokio::io::BufReader::new(follower.stdout.take().unwrap()).lines();
        let started = Instant::now();
        let mut received: Vec<(Duration, String)> = Vec::new();
        let mut burst = 0;
        let mut next_burst = Instant::now();
        // Read for 31 s from the first line, writing a burst of three lines every 700 ms. The
        // window opens at the first line, not at kubectl's start: how long kubectl takes to
        // start grows with the machine's load, and is not the follow's to answer for.
        let read_until = |received: &[(Duration, String)]| match received.first() {
            Some((first, _)) => started + *first + Duration::from_secs(31),
            None => started + WAIT,
        };
        while Instant::now() < read_until(&received) {
            if Instant::now() >= next_burst {
                burst += 1;
                let lines: Vec<String> =
                    (1..=3).map(|i| format!("burst {burst} line {i}")).collect();
                write_log(&scene, &group, &lines).await?;
                next_burst += Duration::from_millis(700);
            }
            let until = next_burst.min(read_until(&received));
            match tokio::time::timeout_at(until.into(), stdout.next_line()).await {
                Ok(Ok(Some(line))) => received.push((started.elapsed(), line)),
                Ok(Ok(None)) => {
                    return Err(failed(format!(
                        "kubectl logs -f ended early after {:?}: {received:?}",
                        started.elapsed()
                    )));
                }
                Ok(Err(error)) => return Err(failed(error.to_string())),
                Err(_) => {}
            }
        }
        if received.is_empty() {
            return Err(failed(format!(
                "kubectl logs -f printed nothing in {WAIT:?}"
            )));
        }
        let first_at = received[0].0;
        let last_at = received.last().map(|(at, _)| *at).unwrap_or_default();
        let longest_gap = received
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .max()
            .unwrap_or_default();
        eprintln!(
            "follow: {} lines over {:?}; longest gap between lines {longest_gap:?}",
            received.len(),
            last_at - first_at
        );
        assert!(
            last_at - first_at >= Duration::from_secs(30),
            "new lines kept coming for 30 s"
        );
        assert!(longest_gap < Duration::from_secs(5), "{longest_gap:?}");

        // The container ends: the follow ends too, within the poll and status delays.
        let ended = Instant::now();
        end_container(&scene, &group, 0).await?;
        let rest = tokio::time::timeout(WAIT, async {
            let mut rest = Vec::new();
            while let Some(line) = stdout.next_line().await.unwrap() {
                rest.push(line);
            }
            rest
        })
        .await
        .map_err(|_| failed("kubectl logs -f did not end with the container"))?;
        let status = follower.wait().await.unwrap();
        eprintln!("follow: ended {:?} after the container", ended.elapsed());
        assert!(status.success(), "kubectl logs -f exited {status}");

        // Every line of the log, once, in order: the same as the log read afterwards.
        let mut followed: Vec<String> = received.into_iter().map(|(_, line)| line).collect();
        followed.extend(rest);
        let whole = lines_of(&logs(h, &scene, "chatty", &[]).await?);
        assert_eq!(
            followed.last().map(String::as_str),
            Some("[app] exited with code 0")
        );
        assert_eq!(followed.len(), whole.len(), "no line lost or repeated");
        assert_eq!(followed, whole);
        assert!(
            followed.iter().filter(|l| l.starts_with("burst ")).count() >= 3 * 40,
            "the bursts came through"
        );
        Ok(())
    })
    .await;
}

/// A TokenRequest token of a new ServiceAccount `name` in `ns`.
async fn service_account_token(h: &Harness, ns: &str, name: &str) -> Result<String, HarnessError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(h.client(), ns);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .unwrap();
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?
        .status
        .map(|status| status.token)
        .ok_or_else(|| failed("TokenRequest without a token"))
}

/// A client of the kubelet API that does not check its certificate (as the apiserver does
/// without --kubelet-certificate-authority), with an optional client identity.
fn kubelet_client(identity: Option<reqwest::Identity>) -> reqwest::Client {
    let builder = reqwest::Client::builder().danger_accept_invalid_certs(true);
    match identity {
        Some(identity) => builder.identity(identity),
        None => builder,
    }
    .build()
    .unwrap()
}

async fn status_of(request: reqwest::RequestBuilder) -> (u16, String) {
    let response = request.send().await.expect("the kubelet API answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

fn identity_from(cert: &std::path::Path, key: &std::path::Path) -> reqwest::Identity {
    let mut pem = std::fs::read(cert).unwrap();
    pem.extend(std::fs::read(key).unwrap());
    reqwest::Identity::from_pem(&pem).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_api_is_closed_to_strangers_and_open_to_the_apiserver() {
    run_scenario(async |h| {
        let scene = start(h, "guard").await?;
        run_pod(h, &scene, &pod_on("guarded", &scene.node, "Always", &[])).await?;
        let ns = &scene.ns;
        let paths = [
            "/healthz".to_owned(),
            "/pods".to_owned(),
            format!("/containerLogs/{ns}/guarded/app"),
            format!("/containerLogs/{ns}/guarded/app?follow=true"),
            format!("/exec/{ns}/guarded/app?command=true&output=1"),
            format!("/attach/{ns}/guarded/app?output=1"),
            format!("/portForward/{ns}/guarded"),
            format!("/run/{ns}/guarded/app"),
            "/metrics/resource".to_owned(),
            "/stats/summary".to_owned(),
            "/spec/".to_owned(),
            "/configz".to_owned(),
            "/no/such/path".to_owned(),
        ];

        // No credentials: 401 everywhere, whatever the method.
        let anonymous = kubelet_client(None);
        for path in &paths {
            for method in [reqwest::Method::GET, reqwest::Method::POST] {
                let (status, body) =
                    status_of(anonymous.request(method.clone(), format!("{}{path}", scene.kubelet))).await;
                assert_eq!((status, body.as_str()), (401, "Unauthorized"), "{method} {path}");
            }
        }
        // A forged token and a certificate of another CA are no credentials either.
        let (status, _) = status_of(
            anonymous
                .get(format!("{}/pods", scene.kubelet))
                .bearer_auth("not-a-token"),
        )
        .await;
        assert_eq!(status, 401);
        let stranger_ca = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let forged = params.self_signed(&stranger_ca).unwrap();
        let forged = reqwest::Identity::from_pem(
            format!("{}{}", forged.pem(), stranger_ca.serialize_pem()).as_bytes(),
        )
        .unwrap();
        let (status, _) =
            status_of(kubelet_client(Some(forged)).get(format!("{}/pods", scene.kubelet))).await;
        assert_eq!(status, 401, "a self-made system:masters certificate");

        // A ServiceAccount without nodes/proxy: 403, naming the subresource(s) it lacks.
        let token = service_account_token(h, ns, "no-proxy").await?;
        for (path, subresources) in [
            (format!("/containerLogs/{ns}/guarded/app"), "[proxy]"),
            ("/pods".to_owned(), "[pods proxy]"),
            ("/healthz".to_owned(), "[healthz proxy]"),
            ("/stats/summary".to_owned(), "[stats]"),
        ] {
            let (status, body) = status_of(
                anonymous
                    .get(format!("{}{path}", scene.kubelet))
                    .bearer_auth(&token),
            )
            .await;
            assert_eq!(status, 403, "{path}: {body}");
            assert_eq!(
                body,
                format!(
                    "Forbidden (user=system:serviceaccount:{ns}:no-proxy, verb=get, resource=nodes, subresource(s)={subresources})\n"
                )
            );
        }
        // With nodes/proxy granted on this node, the same kind of token gets in.
        let token = service_account_token(h, ns, "node-proxy").await?;
        let role = format!("{ns}-node-proxy");
        Api::<ClusterRole>::all(h.client())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": role},
                    "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "resourceNames": [scene.node], "verbs": ["get"]}],
                }))
                .unwrap(),
            )
            .await?;
        Api::<ClusterRoleBinding>::all(h.client())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": role},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": "node-proxy", "namespace": ns}],
                }))
                .unwrap(),
            )
            .await?;
        let pods_url = format!("{}/pods", scene.kubelet);
        h.wait_for("nodes/proxy to be granted", WAIT, |_| {
            let request = anonymous.get(&pods_url).bearer_auth(&token);
            async move { status_of(request).await.0 == 200 }
        })
        .await?;
        let (_, body) = status_of(anonymous.get(&pods_url).bearer_auth(&token)).await;
        let list: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(list["kind"], "PodList");
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["guarded"], "only this node's pods");
        let (status, _) = status_of(
            anonymous
                .post(format!("{}/exec/{ns}/guarded/app?command=true", scene.kubelet))
                .bearer_auth(&token),
        )
        .await;
        assert_eq!(status, 403, "get on nodes/proxy is not create");

        // The apiserver's own client certificate gets through: directly…
        let pki = h.fixture_dir().join("pki");
        let apiserver = kubelet_client(Some(identity_from(
            &pki.join("apiserver-kubelet-client.crt"),
            &pki.join("apiserver-kubelet-client.key"),
        )));
        let (status, body) = status_of(apiserver.get(format!("{}/healthz", scene.kubelet))).await;
        assert_eq!((status, body.as_str()), (200, "ok"));
        let (status, body) =
            status_of(apiserver.get(format!("{}/containerLogs/{ns}/elsewhere/app", scene.kubelet))).await;
        assert_eq!(status, 404, "a pod not on this node: {body}");
        let (status, _) =
            status_of(apiserver.get(format!("{}/containerLogs/{ns}/guarded/sidecar", scene.kubelet))).await;
        assert_eq!(status, 404, "a container the pod does not have");
        // …and through the apiserver's proxy, as kubectl logs does.
        let log = logs(h, &scene, "guarded", &[]).await?;
        assert_eq!(log, format!("[app] starting {IMAGE}\n"));

        // The serving certificate the daemon asked for, once approved, is served: issued by
        // the cluster CA for the node's IP.
        let csrs: Api<CertificateSigningRequest> = Api::all(h.client());
        let prefix = format!("kubelet-serving-{}-", scene.node);
        let mut name = None;
        h.wait_for("the daemon's CertificateSigningRequest", WAIT, |_| {
            let csrs = csrs.clone();
            let prefix = prefix.clone();
            async move {
                csrs.list(&ListParams::default())
                    .await
                    .is_ok_and(|list| list.items.iter().any(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with(&prefix))))
            }
        })
        .await?;
        for csr in csrs.list(&ListParams::default()).await?.items {
            let csr_name = csr.metadata.name.clone().unwrap_or_default();
            if csr_name.starts_with(&prefix) {
                assert_eq!(csr.spec.signer_name, "kubernetes.io/kubelet-serving");
                name = Some(csr_name);
            }
        }
        let name = name.unwrap();
        let out = kubectl(h, &["certificate", "approve", &name]).await;
        assert!(out.ok, "{}", out.stderr);
        let ca = reqwest::Certificate::from_pem(&std::fs::read(pki.join("ca.crt")).unwrap()).unwrap();
        let verifying = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .identity(identity_from(
                &pki.join("apiserver-kubelet-client.crt"),
                &pki.join("apiserver-kubelet-client.key"),
            ))
            .build()
            .unwrap();
        let healthz = format!("{}/healthz", scene.kubelet);
        let approved = Instant::now();
        h.wait_for("the issued serving certificate to be served", WAIT, |_| {
            let request = verifying.get(&healthz);
            async move { request.send().await.is_ok_and(|r| r.status() == 200) }
        })
        .await?;
        eprintln!("serving certificate: served {:?} after the approval", approved.elapsed());
        Ok(())
    })
    .await;
}

// --- /runningpods/ (issue 46) ---

/// The pods `/runningpods/` lists, by name, each with its uid and containers.
async fn running_pods(
    kubelet: &reqwest::Client,
    scene: &Scene,
) -> Result<Vec<(String, String, Value)>, HarnessError> {
    let (status, body) = status_of(kubelet.get(format!("{}/runningpods/", scene.kubelet))).await;
    if status != 200 {
        return Err(failed(format!("GET /runningpods/: {status} {body}")));
    }
    let list: Value = serde_json::from_str(&body).map_err(|e| failed(format!("{e}: {body}")))?;
    assert_eq!(
        (&list["kind"], &list["apiVersion"]),
        (&json!("PodList"), &json!("v1"))
    );
    Ok(list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["metadata"]["namespace"] == scene.ns.as_str())
        .map(|item| {
            (
                item["metadata"]["name"].as_str().unwrap().to_owned(),
                item["metadata"]["uid"].as_str().unwrap().to_owned(),
                item["spec"]["containers"].clone(),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runningpods_lists_what_runs_on_eci_until_it_finishes_or_is_deleted() {
    run_scenario(async |h| {
        let scene = start(h, "running").await?;
        let ns = &scene.ns;
        run_pod(h, &scene, &pod_on("runner", &scene.node, "Always", &[])).await?;
        let finisher = run_pod(h, &scene, &pod_on("finisher", &scene.node, "Never", &[])).await?;
        let pki = h.fixture_dir().join("pki");
        let apiserver = kubelet_client(Some(identity_from(
            &pki.join("apiserver-kubelet-client.crt"),
            &pki.join("apiserver-kubelet-client.key"),
        )));

        // Both run: each with its uid and its running container, nothing else of the pod.
        let runner = pod(h, ns, "runner").await.unwrap();
        let mut listed = running_pods(&apiserver, &scene).await?;
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<&str> = listed.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["finisher", "runner"]);
        let (_, uid, containers) = &listed[1];
        assert_eq!(uid, runner["metadata"]["uid"].as_str().unwrap());
        assert_eq!(
            containers,
            &json!([{"name": "app", "image": container_status(&runner)["image"]}])
        );

        // A finished pod no longer runs, though ECI keeps its group until it is deleted.
        end_container(&scene, &finisher, 0).await?;
        wait_pod(h, ns, "finisher", "Succeeded", |p| {
            p["status"]["phase"] == "Succeeded"
        })
        .await?;
        let listed = running_pods(&apiserver, &scene).await?;
        let names: Vec<&str> = listed.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["runner"]);

        // A deleted pod is gone from it once the apiserver has forgotten the pod.
        Api::<Pod>::namespaced(h.client(), ns)
            .delete("runner", &Default::default())
            .await?;
        h.wait_for("runner to be deleted", WAIT, |h| async move {
            pod(h, ns, "runner").await.is_none()
        })
        .await?;
        assert_eq!(running_pods(&apiserver, &scene).await?, vec![]);

        // Authorized as the kubelet authorizes it: nodes/pods or nodes/proxy.
        let token = service_account_token(h, ns, "no-grant").await?;
        let (status, body) = status_of(
            kubelet_client(None)
                .get(format!("{}/runningpods/", scene.kubelet))
                .bearer_auth(&token),
        )
        .await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("subresource(s)=[pods proxy]"), "{body}");
        Ok(())
    })
    .await;
}

// --- fair shares (issue 45) ---

/// Calls of `kubectl logs` one namespace keeps waiting at once: far more than the replica's
/// `DescribeContainerLog` share serves (500 a minute, a burst of 50), so its calls queue.
const FLOOD: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespace_looping_logs_leaves_another_its_logs_within_two_seconds() {
    run_scenario(async |h| {
        let scene = start(h, "flood").await?;
        let other = Scene {
            ns: h.create_namespace("quiet").await?,
            node: scene.node.clone(),
            admin: scene.admin.clone(),
            kubelet: scene.kubelet.clone(),
        };
        run_pod(h, &scene, &pod_on("looper", &scene.node, "Always", &[])).await?;
        let group = run_pod(h, &other, &pod_on("quiet", &other.node, "Always", &[])).await?;
        write_log(&other, &group, &["still here".to_owned()]).await?;

        // The loop: FLOOD clients each asking for the looper's log again as soon as answered.
        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut loops = tokio::task::JoinSet::new();
        for _ in 0..FLOOD {
            let api = Api::<Pod>::namespaced(h.client(), &scene.ns);
            let (served, stop) = (served.clone(), stop.clone());
            loops.spawn(async move {
                let params = kube::api::LogParams {
                    container: Some("app".into()),
                    tail_lines: Some(1),
                    ..kube::api::LogParams::default()
                };
                while !stop.is_cancelled() {
                    tokio::select! {
                        answer = api.logs("looper", &params) => {
                            if answer.is_ok() {
                                served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                        }
                        () = stop.cancelled() => {}
                    }
                }
            });
        }
        // The burst is spent and the loop's calls wait for tokens.
        let served_ref = &served;
        h.wait_for("the loop spent the burst", WAIT, |_| async move {
            served_ref.load(std::sync::atomic::Ordering::SeqCst) > 80
        })
        .await?;

        let mut took = Vec::new();
        for _ in 0..3 {
            let asked = Instant::now();
            let out = kubectl(
                h,
                &[
                    "logs",
                    "--request-timeout=30s",
                    "-n",
                    &other.ns,
                    "quiet",
                    "-c",
                    "app",
                    "--tail=1",
                ],
            )
            .await;
            took.push(asked.elapsed());
            assert!(out.ok, "the quiet namespace's logs: {}", out.stderr);
            assert_eq!(lines_of(&out.stdout), ["still here"]);
        }
        let before = served.load(std::sync::atomic::Ordering::SeqCst);
        h.wait_for("the loop is still served", WAIT, |_| async move {
            served_ref.load(std::sync::atomic::Ordering::SeqCst) > before + 10
        })
        .await?;
        stop.cancel();
        while loops.join_next().await.is_some() {}
        eprintln!(
            "fair shares: with {FLOOD} looping clients ({} answered), the other namespace's kubectl logs took {took:?}",
            served.load(std::sync::atomic::Ordering::SeqCst)
        );
        for elapsed in took {
            assert!(
                elapsed < Duration::from_secs(2),
                "another namespace's kubectl logs took {elapsed:?} (the issue's bound: 2 s)"
            );
        }
        Ok(())
    })
    .await;
}
