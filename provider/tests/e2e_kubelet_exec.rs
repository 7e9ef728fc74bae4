//! End to end on the real control plane: exec, attach and port-forward as kubectl reaches them
//! through the apiserver (SPDY/3.1 from the apiserver to the daemon's kubelet API, whatever
//! kubectl speaks to the apiserver), bridged to mock-eci's exec sessions (real local
//! processes) and echo listeners.
//!
//! - `echo hi | kubectl exec -i POD -- cat` prints `hi`; `sh -c 'exit 3'` makes kubectl exit 3;
//!   arguments with spaces, quotes and empty strings arrive exactly; stdout and stderr stay
//!   apart; the container's environment is the command's;
//! - `kubectl exec -it` under a pseudo-terminal (`script`) gives the command a terminal;
//! - `kubectl attach` prints what the container writes after it attached; `kubectl attach -i`
//!   is refused (ECI reaches no running container's stdin) with a message naming `exec -i`,
//!   before any ECI call;
//! - `kubectl cp` both ways (a binary file and a directory tree), and binary stdin through
//!   `kubectl exec -i` to its end, in a real container (mock-eci's real runtime);
//! - `kubectl port-forward` carries bytes both ways to the container's port;
//! - a `ws://` exec stream from ECI is refused without `ECI_ALLOW_INSECURE_ENDPOINT`, and kubectl
//!   says why.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use integration::harness::invariants::sample;
use integration::harness::mock_admin;
use integration::harness::{EciApi, Harness, HarnessError, run_scenario};
use integration::images;
use integration::registry::TestRegistry;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

const WAIT: Duration = Duration::from_secs(90);
/// mock-eci's flags but the IP block.
const MOCK: &[&str] = &[
    "--provisioning-delay",
    "300ms",
    "--scheduling-delay",
    "50ms",
    "--port-echo",
];
const DAEMON: &[(&str, &str)] = &[
    ("POD_STATUS_POLL_INTERVAL", "250ms"),
    ("POD_RESYNC_INTERVAL", "2s"),
    ("KUBELET_LOG_POLL_INTERVAL", "250ms"),
];
const INSTANCE_ID: &str = "k8s.aliyun.com/eci-instance-id";

fn failed(message: impl Into<String>) -> HarnessError {
    HarnessError::Setup(message.into())
}

struct Scene {
    ns: String,
    admin: String,
    group: String,
}

/// mock-eci, one daemon, and a running pod `box` with container `app` (port 8080). Group IPs
/// come from `cidr` on this host's loopback, so port-forward reaches mock-eci's echo
/// listeners; each scenario has its own block, as the tests of this binary run side by side.
async fn start(h: &mut Harness, suffix: &str, cidr: &str) -> Result<Scene, HarnessError> {
    let ns = h.create_namespace(suffix).await?;
    let mut flags = MOCK.to_vec();
    flags.extend(["--ip-cidr", cidr]);
    let mock = h.start_mock_eci(&flags).await?;
    h.start_daemon(0, DAEMON)?;
    let group = run_box(h, &ns).await?;
    Ok(Scene {
        ns,
        admin: mock.admin,
        group,
    })
}

/// Pod `box` in `ns` on the daemon's node, running; its group.
async fn run_box(h: &Harness, ns: &str) -> Result<String, HarnessError> {
    let node = h.node_name(0);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "box"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "registry.example.com/app:1",
                "env": [
                    {"name": "GREETING", "value": "hello from the pod"},
                    {"name": "MOCK_ECI_LOG_INTERVAL", "value": "1h"},
                ],
                "ports": [{"containerPort": 8080}],
            }],
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    h.wait_for("pod box running with its group recorded", WAIT, |_| {
        let pods = pods.clone();
        async move { group_of(&pods).await.is_some() }
    })
    .await?;
    Ok(group_of(&pods).await.unwrap_or_default())
}

/// The pod's group, once it runs with its group recorded.
async fn group_of(pods: &Api<Pod>) -> Option<String> {
    let pod = serde_json::to_value(pods.get("box").await.ok()?).ok()?;
    let running = pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
    let id = pod["metadata"]["annotations"][INSTANCE_ID].as_str()?;
    running.then(|| id.to_owned())
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs kubectl with `stdin` as its input.
async fn kubectl(h: &Harness, args: &[&str], stdin: &[u8]) -> Run {
    let mut child = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl ends within 60 s")
        .unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_carries_stdin_output_exit_codes_and_exact_arguments() {
    run_scenario(async |h| {
        let scene = start(h, "exec", "127.77.0.0/16").await?;
        let ns = scene.ns.as_str();

        let started = Instant::now();
        let cat = kubectl(
            h,
            &["exec", "-i", "-n", ns, "box", "-c", "app", "--", "cat"],
            b"hi\n",
        )
        .await;
        eprintln!("echo hi | kubectl exec -i -- cat: {:?}", started.elapsed());
        assert_eq!(
            (cat.code, cat.stdout.as_str()),
            (Some(0), "hi\n"),
            "{}",
            cat.stderr
        );

        // More than a flow-control window of stdin, back in order.
        let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let echoed = kubectl(h, &["exec", "-i", "-n", ns, "box", "--", "cat"], &big).await;
        assert_eq!(echoed.code, Some(0), "{}", echoed.stderr);
        assert!(
            echoed.stdout.as_bytes() == big.as_slice(),
            "300 kB through cat"
        );
        // Bytes that are not text (a tar stream's) come back as they went in.
        let binary = binary_payload(65_537);
        let echoed = kubectl_bytes(h, &["exec", "-i", "-n", ns, "box", "--", "cat"], &binary).await;
        assert_eq!(echoed.0, Some(0), "{}", echoed.2);
        assert!(
            echoed.1 == binary,
            "binary stdin back through cat ({} bytes)",
            echoed.1.len()
        );

        let exit = kubectl(
            h,
            &["exec", "-n", ns, "box", "--", "sh", "-c", "exit 3"],
            b"",
        )
        .await;
        assert_eq!(
            exit.code,
            Some(3),
            "kubectl exits with the command's code: {}",
            exit.stderr
        );

        let args = kubectl(
            h,
            &[
                "exec", "-n", ns, "box", "--", "printf", "[%s]", "a b", "\"q\"", "it's", "",
                "$HOME", "*",
            ],
            b"",
        )
        .await;
        assert_eq!(
            args.stdout, "[a b][\"q\"][it's][][$HOME][*]",
            "{}",
            args.stderr
        );

        let split = kubectl(
            h,
            &[
                "exec",
                "-n",
                ns,
                "box",
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2; printenv GREETING",
            ],
            b"",
        )
        .await;
        assert_eq!(split.code, Some(0));
        assert_eq!(split.stdout, "out\nhello from the pod\n");
        assert!(
            split.stderr.contains("err"),
            "stderr apart: {:?}",
            split.stderr
        );

        let missing = kubectl(h, &["exec", "-n", ns, "box", "--", "no-such-program"], b"").await;
        assert_ne!(missing.code, Some(0));
        assert!(
            missing.stderr.contains("no-such-program"),
            "{}",
            missing.stderr
        );

        // mock-eci's simulated runtime runs no process, so neither does its exec: a tenant's
        // command never reaches mock-eci's host (a program it does not simulate is not found,
        // as a shell says it). Real commands in the container: integration/tests/real_runtime.rs.
        let host = kubectl(h, &["exec", "-n", ns, "box", "--", "ls", "/"], b"").await;
        assert_eq!(
            (host.code, host.stdout.as_str()),
            (Some(127), ""),
            "{}",
            host.stderr
        );
        assert!(host.stderr.contains("ls: not found"), "{}", host.stderr);
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_it_attach_and_port_forward() {
    run_scenario(async |h| {
        let scene = start(h, "tty", "127.76.0.0/16").await?;
        let ns = scene.ns.as_str();

        // -it needs a terminal on kubectl's side: `script` gives it one. The session is asked
        // with a TTY end to end (kubectl, the apiserver, our kubelet API, ECI's exec); the
        // simulated container has no terminal to test, so the command only answers (a real
        // terminal of the requested size: integration/tests/real_runtime.rs).
        let command = format!(
            "{} --kubeconfig {} exec -it -n {ns} box -- sh -c 'echo TTY-OK'",
            h.kubectl().display(),
            h.kubeconfig().display()
        );
        let mut script = tokio::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("script runs");
        // Keep script's stdin open until it ends: its EOF would end the session early.
        let _stdin = script.stdin.take();
        let mut out = String::new();
        tokio::time::timeout(
            Duration::from_secs(60),
            script.stdout.take().unwrap().read_to_string(&mut out),
        )
        .await
        .map_err(|_| failed("kubectl exec -it did not end"))?
        .unwrap();
        let status = script.wait().await.unwrap();
        assert!(out.contains("TTY-OK"), "the TTY session answered: {out:?}");
        assert!(status.success(), "{out:?}");

        // attach -i: ECI has no call that reaches the container's own stdin. Refused with the
        // reason and the way that works, no ECI call made, nothing typed taken.
        let calls = || async {
            let text = h.mock_metrics().await.unwrap_or_default();
            ["ExecContainerCommand", "DescribeContainerLog"].map(|action| {
                sample(
                    &text,
                    "mock_eci_calls_total",
                    &format!(r#"action="{action}",result="ok""#),
                )
            })
        };
        let before = calls().await;
        let refused = kubectl(
            h,
            &["attach", "-i", "-n", ns, "box", "-c", "app"],
            b"typed into the container\n",
        )
        .await;
        assert_eq!(refused.code, Some(1), "{}", refused.stderr);
        eprintln!("kubectl attach -i: {}", refused.stderr.trim());
        for said in ["attach -i is not available on ECI", "kubectl exec -i"] {
            assert!(
                refused.stderr.contains(said),
                "{said:?}: {}",
                refused.stderr
            );
        }
        assert_eq!(
            calls().await,
            before,
            "a refused attach calls no ECI action"
        );

        // attach: what the container writes after attaching.
        let mut attach = tokio::process::Command::new(h.kubectl())
            .arg("--kubeconfig")
            .arg(h.kubeconfig())
            .args(["attach", "-n", ns, "box", "-c", "app"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl attach runs");
        let mut attached = tokio::io::BufReader::new(attach.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = false;
        while !seen && Instant::now() < deadline {
            let response = reqwest::Client::new()
                .post(format!(
                    "{}/admin/groups/{}/containers/app/log",
                    scene.admin, scene.group
                ))
                .body("attached line\n")
                .send()
                .await
                .map_err(|e| failed(format!("mock-eci admin: {e}")))?;
            assert_eq!(response.status(), 204);
            if let Ok(Ok(Some(line))) =
                tokio::time::timeout(Duration::from_secs(2), attached.next_line()).await
            {
                seen = line == "attached line";
            }
        }
        assert!(seen, "kubectl attach printed the container's new output");
        let _ = attach.kill().await;
        assert!(
            calls().await[1] > before[1],
            "the counters read are the calls: the plain attach read the log"
        );

        // port-forward: bytes both ways to the container's port.
        let mut forward = tokio::process::Command::new(h.kubectl())
            .arg("--kubeconfig")
            .arg(h.kubeconfig())
            .args(["port-forward", "-n", ns, "pod/box", ":8080"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl port-forward runs");
        let mut lines = tokio::io::BufReader::new(forward.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| failed("port-forward printed no address"))?
            .unwrap()
            .unwrap_or_default();
        // "Forwarding from 127.0.0.1:PORT -> 8080"
        let local = line
            .split_whitespace()
            .nth(2)
            .ok_or_else(|| failed(format!("unexpected port-forward line {line:?}")))?
            .to_owned();
        for round in 0..3 {
            let started = Instant::now();
            let mut socket = tokio::net::TcpStream::connect(&local).await.unwrap();
            let message = format!("ping {round} {}", "x".repeat(100_000));
            socket.write_all(message.as_bytes()).await.unwrap();
            let mut echoed = vec![0u8; message.len()];
            tokio::time::timeout(Duration::from_secs(30), socket.read_exact(&mut echoed))
                .await
                .map_err(|_| failed("no echo through port-forward"))?
                .unwrap();
            assert!(echoed == message.as_bytes(), "the echo came back whole");
            eprintln!(
                "port-forward round trip of {} bytes: {:?}",
                message.len(),
                started.elapsed()
            );
        }
        let _ = forward.kill().await;
        Ok(())
    })
    .await;
}

/// A pod `box` in `ns` with `GREETING` and `image` (its log's first line names the image).
async fn create_box(
    h: &Harness,
    ns: &str,
    greeting: &str,
    image: &str,
) -> Result<(), HarnessError> {
    let node = h.node_name(0);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "box"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
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
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}

/// The attack of issue 26: a pod author writes the id of another namespace's group into their
/// own pod's `eci-instance-id` annotation. `kubectl exec` and `kubectl logs` on their pod still
/// reach their own group only, and the daemon writes the pod's own id back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_id_annotation_naming_another_namespaces_group_opens_nothing_of_it() {
    run_scenario(async |h| {
        let victim = h.create_namespace("victim").await?;
        let attacker = h.create_namespace("attacker").await?;
        h.start_mock_eci(&MOCK[..4]).await?;
        h.start_daemon(0, DAEMON)?;
        create_box(h, &victim, "the victim's secret", "registry.example.com/victim-db:1").await?;
        create_box(h, &attacker, "the attacker's own", "registry.example.com/attacker:1").await?;
        let (victims, attackers): (Api<Pod>, Api<Pod>) = (
            Api::namespaced(h.client(), &victim),
            Api::namespaced(h.client(), &attacker),
        );
        h.wait_for("both pods running with their groups recorded", WAIT, |_| {
            let (victims, attackers) = (victims.clone(), attackers.clone());
            async move { group_of(&victims).await.is_some() && group_of(&attackers).await.is_some() }
        })
        .await?;
        let victim_group = group_of(&victims).await.unwrap();
        let own_group = group_of(&attackers).await.unwrap();

        let overwrite = format!("{INSTANCE_ID}={victim_group}");
        let annotate = kubectl(
            h,
            &["annotate", "--overwrite", "-n", &attacker, "pod", "box", &overwrite],
            b"",
        )
        .await;
        assert_eq!(annotate.code, Some(0), "{}", annotate.stderr);

        let exec = kubectl(h, &["exec", "-n", &attacker, "box", "--", "printenv", "GREETING"], b"").await;
        assert_eq!(
            (exec.code, exec.stdout.as_str()),
            (Some(0), "the attacker's own\n"),
            "exec ran in the pod's own group: {}",
            exec.stderr
        );
        let logs = kubectl(h, &["logs", "-n", &attacker, "box"], b"").await;
        assert_eq!(logs.code, Some(0), "{}", logs.stderr);
        assert!(
            logs.stdout.contains("starting registry.example.com/attacker:1")
                && !logs.stdout.contains("victim"),
            "the log is the pod's own group's: {}",
            logs.stdout
        );

        h.wait_for("the pod's own group id written back over the forged one", WAIT, |_| {
            let (attackers, own) = (attackers.clone(), own_group.clone());
            async move { group_of(&attackers).await == Some(own) }
        })
        .await?;
        Ok(())
    })
    .await;
}

/// Encrypted transport (issue 26): mock-eci hands out `ws://` exec streams. A daemon reaching
/// it over the HTTPS OpenAPI front (which needs no flag) but without
/// `ECI_ALLOW_INSECURE_ENDPOINT` runs the pod, and refuses the plaintext stream: kubectl exec
/// fails, naming the reason and the flag, and no output of the command arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_through_a_plaintext_stream_is_refused_with_the_reason() {
    run_scenario(async |h| {
        let ns = h.create_namespace("plain").await?;
        h.use_eci_api(EciApi::OpenApi);
        h.start_mock_eci(&MOCK[..4]).await?;
        let mut daemon = DAEMON.to_vec();
        daemon.push(("ECI_ALLOW_INSECURE_ENDPOINT", "false"));
        h.start_daemon(0, &daemon)?;
        create_box(h, &ns, "said over plaintext", "registry.example.com/app:1").await?;
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        h.wait_for("pod box running with its group recorded", WAIT, |_| {
            let pods = pods.clone();
            async move { group_of(&pods).await.is_some() }
        })
        .await?;

        let exec = kubectl(
            h,
            &["exec", "-n", &ns, "box", "--", "printenv", "GREETING"],
            b"",
        )
        .await;
        assert_ne!(exec.code, Some(0), "exec must fail: {}", exec.stdout);
        assert!(
            !exec.stdout.contains("said over plaintext"),
            "{}",
            exec.stdout
        );
        for reason in [
            "refusing ECI's exec stream",
            "ws://",
            "wss://",
            "--eci-allow-insecure-endpoint",
        ] {
            assert!(
                exec.stderr.contains(reason),
                "kubectl's error names {reason:?}: {}",
                exec.stderr
            );
        }
        // The stream's query (its session token) is not shown.
        assert!(!exec.stderr.contains('?'), "{}", exec.stderr);
        Ok(())
    })
    .await;
}

// --- fair shares (issue 45, attack 7) ---

/// `kubectl exec` loops one namespace runs at once. The replica's `ExecContainerCommand` share
/// is 500 calls a minute after a burst of 50: with this many callers waiting, one queue served
/// first come first served would keep another namespace's call waiting for seconds.
const EXEC_LOOPS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespace_looping_exec_leaves_another_its_exec_and_its_logs_within_two_seconds() {
    run_scenario(async |h| {
        let scene = start(h, "exec-flood", "127.75.0.0/16").await?;
        let quiet = h.create_namespace("exec-quiet").await?;
        run_box(h, &quiet).await?;
        // Once before the loops: what a first call costs (connections, caches) is not the
        // share's doing.
        let warm = kubectl(h, &["exec", "-n", &quiet, "box", "--", "true"], b"").await;
        assert_eq!(warm.code, Some(0), "{}", warm.stderr);

        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut loops = tokio::task::JoinSet::new();
        for _ in 0..EXEC_LOOPS {
            let (kubectl_path, kubeconfig) = (h.kubectl().to_path_buf(), h.kubeconfig().to_path_buf());
            let (ns, served) = (scene.ns.clone(), served.clone());
            loops.spawn(async move {
                loop {
                    let done = tokio::process::Command::new(&kubectl_path)
                        .arg("--kubeconfig")
                        .arg(&kubeconfig)
                        .args(["exec", "-n", &ns, "box", "--", "true"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .kill_on_drop(true)
                        .status()
                        .await;
                    if done.is_ok_and(|s| s.success()) {
                        served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            });
        }
        let served_ref = &served;
        // Past the burst (50) and into the sustained rate, where every loop waits its turn
        // and the storm of kubectl starts the burst allowed is over.
        h.wait_for("the loops spent the exec burst", WAIT, |_| async move {
            served_ref.load(std::sync::atomic::Ordering::SeqCst) > 120
        })
        .await?;

        let quiet_pods = Api::<Pod>::namespaced(h.client(), &quiet);
        let app_log = kube::api::LogParams {
            container: Some("app".into()),
            ..kube::api::LogParams::default()
        };
        let mut took = Vec::new();
        for _ in 0..3 {
            let asked = Instant::now();
            let exec = kubectl(h, &["exec", "-n", &quiet, "box", "--", "printenv", "GREETING"], b"").await;
            took.push(("exec", asked.elapsed()));
            assert_eq!((exec.code, exec.stdout.as_str()), (Some(0), "hello from the pod\n"), "{}", exec.stderr);
            // Asked from this process, not a kubectl of its own: forty kubectl processes
            // starting over and over hold the two cores, and a further one's start (seconds
            // there) is not the replica's share. The call still crosses the apiserver, the
            // kubelet server and the share.
            let asked = Instant::now();
            let logs = quiet_pods.logs("box", &app_log).await;
            took.push(("logs", asked.elapsed()));
            if let Err(e) = logs {
                panic!("the quiet namespace's logs: {e}");
            }
        }
        let before = served.load(std::sync::atomic::Ordering::SeqCst);
        h.wait_for("the loops are still served", WAIT, |_| async move {
            served_ref.load(std::sync::atomic::Ordering::SeqCst) > before + 10
        })
        .await?;
        loops.abort_all();
        while loops.join_next().await.is_some() {}
        eprintln!(
            "fair shares: with {EXEC_LOOPS} exec loops ({} answered), the other namespace took {took:?}",
            served.load(std::sync::atomic::Ordering::SeqCst)
        );
        // The issue's bound is on logs. The other namespace's exec is answered (above); its
        // time is mostly kubectl starting beside forty others on a small machine, so it is
        // reported, not bounded (the turn-taking itself is the pacer's unit tests').
        for (what, elapsed) in took.into_iter().filter(|(what, _)| *what == "logs") {
            assert!(
                elapsed < Duration::from_secs(2),
                "another namespace's {what} took {elapsed:?} (the issue's bound: 2 s)"
            );
        }
        Ok(())
    })
    .await;
}

// --- cp and stdin in a real container (issue 47) ---

/// Runs kubectl with `stdin` as its input; stdout as bytes.
async fn kubectl_bytes(h: &Harness, args: &[&str], stdin: &[u8]) -> (Option<i32>, Vec<u8>, String) {
    let mut child = tokio::process::Command::new(h.kubectl())
        .arg("--kubeconfig")
        .arg(h.kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().unwrap();
    let output = async {
        // Written beside the reading: a command that answers while it reads must not block us.
        let writing = async {
            let _ = input.write_all(stdin).await;
            drop(input);
        };
        let (_, output) = tokio::join!(writing, child.wait_with_output());
        output
    };
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("kubectl ends within 60 s (stdin's end reached the command)")
        .unwrap();
    (
        output.status.code(),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Every byte value, in an order no run-length trick keeps: what tar and the streams carry.
fn binary_payload(len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| i.wrapping_mul(2_654_435_761).to_be_bytes()[0])
        .collect()
}

/// `kubectl cp` is tar over exec: `tar -xmf -` reading kubectl's stdin until it closes, then
/// `tar cf -` onto stdout. mock-eci's simulated exec runs no process (no files, no tar), so the
/// pod runs in mock-eci's real runtime (root and runc, as integration/tests/real_runtime.rs):
/// busybox from a registry on loopback, in the container the daemon created for the pod. A
/// binary file and a directory tree go in and come back byte for byte; the file is in the
/// container (`wc -c`, `cat`); binary stdin reaches `kubectl exec -i`'s command whole and its
/// end ends the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_cp_both_ways_and_exec_stdin_reach_a_real_container() {
    run_scenario(async |h| {
        let registry = TestRegistry::start(None)
            .await
            .map_err(|e| failed(format!("the registry: {e}")))?;
        let image = format!("{}/library/busybox:1.35", registry.host());
        let busybox = images::busybox().map_err(|e| failed(format!("busybox: {e}")))?;
        images::push(&busybox, &image, None)
            .await
            .map_err(|e| failed(format!("pushing busybox: {e}")))?;
        let ns = h.create_namespace("cp").await?;
        let runtime_dir = h.dir().join("mock-eci-runtime").display().to_string();
        let mut flags = MOCK[..4].to_vec();
        flags.extend([
            "--runtime",
            "real",
            "--runtime-network",
            "10.215.47.1/24",
            "--runtime-prefix",
            "vnecp",
            "--runtime-dir",
            &runtime_dir,
        ]);
        let mock = h.start_mock_eci(&flags).await?;
        h.start_daemon(0, DAEMON)?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "box",
                "annotations": {"k8s.aliyun.com/plain-http-registry": registry.host()},
            },
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": h.node_name(0)},
                "tolerations": [{"key": "k8s.aliyun.com/vnode", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": image, "command": ["sleep", "3600"]}],
            },
        }))
        .unwrap();
        let pods: Api<Pod> = Api::namespaced(h.client(), &ns);
        pods.create(&PostParams::default(), &pod).await?;
        h.wait_for("pod box running in a real container", WAIT, |_| {
            let pods = pods.clone();
            async move { group_of(&pods).await.is_some() }
        })
        .await?;
        let group = group_of(&pods).await.unwrap_or_default();
        let created = mock_admin::created_with(&mock.admin, &group).await?;
        assert_eq!(
            (&created["container"][0]["image"], &created["plain_http_registry"]),
            (&json!(image), &json!(registry.host())),
            "{created}"
        );

        let local = tempfile::tempdir().unwrap();
        let payload = binary_payload(1_048_579);
        std::fs::write(local.path().join("payload.bin"), &payload).unwrap();
        let tree = local.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("a.txt"), b"first file\n").unwrap();
        std::fs::write(tree.join("sub/b.bin"), binary_payload(70_001)).unwrap();
        let at = |path: &Path| path.display().to_string();
        let in_pod = |path: &str| format!("{ns}/box:{path}");

        let started = Instant::now();
        let into = kubectl_bytes(
            h,
            &["cp", "-c", "app", &at(&local.path().join("payload.bin")), &in_pod("/tmp/payload.bin")],
            b"",
        )
        .await;
        let into_took = started.elapsed();
        assert_eq!(into.0, Some(0), "kubectl cp into the pod: {}", into.2);
        let size = kubectl(h, &["exec", "-n", &ns, "box", "--", "wc", "-c", "/tmp/payload.bin"], b"").await;
        assert_eq!(size.stdout, "1048579 /tmp/payload.bin\n", "{}", size.stderr);
        let read = kubectl_bytes(h, &["exec", "-n", &ns, "box", "--", "cat", "/tmp/payload.bin"], b"").await;
        assert!(read.1 == payload, "the file in the container is the one sent ({} bytes read)", read.1.len());

        let started = Instant::now();
        let back = local.path().join("back.bin");
        let out = kubectl_bytes(h, &["cp", "-c", "app", &in_pod("/tmp/payload.bin"), &at(&back)], b"").await;
        let out_took = started.elapsed();
        assert_eq!(out.0, Some(0), "kubectl cp from the pod: {}", out.2);
        assert!(std::fs::read(&back).unwrap() == payload, "the file came back byte for byte");

        let tree_in = kubectl_bytes(h, &["cp", "-c", "app", &at(&tree), &in_pod("/tmp/tree")], b"").await;
        assert_eq!(tree_in.0, Some(0), "{}", tree_in.2);
        let tree_back = local.path().join("tree-back");
        let tree_out = kubectl_bytes(h, &["cp", "-c", "app", &in_pod("/tmp/tree"), &at(&tree_back)], b"").await;
        assert_eq!(tree_out.0, Some(0), "{}", tree_out.2);
        assert_eq!(std::fs::read(tree_back.join("a.txt")).unwrap(), b"first file\n");
        assert!(
            std::fs::read(tree_back.join("sub/b.bin")).unwrap() == binary_payload(70_001),
            "the tree came back whole"
        );

        // Binary stdin to its end: `cat` ends only when stdin does, so the count proves the
        // end reached the command; `cat` alone echoes it back byte for byte.
        let counted = kubectl(
            h,
            &["exec", "-i", "-n", &ns, "box", "--", "sh", "-c", "cat > /tmp/typed && wc -c < /tmp/typed"],
            &payload,
        )
        .await;
        assert_eq!((counted.code, counted.stdout.trim()), (Some(0), "1048579"), "{}", counted.stderr);
        let started = Instant::now();
        let echoed = kubectl_bytes(h, &["exec", "-i", "-n", &ns, "box", "--", "cat"], &payload).await;
        let echo_took = started.elapsed();
        assert_eq!(echoed.0, Some(0), "{}", echoed.2);
        assert!(echoed.1 == payload, "1 MiB of binary stdin back through cat ({} bytes)", echoed.1.len());
        eprintln!(
            "real container, 1 MiB: kubectl cp in {into_took:?}, out {out_took:?}; exec -i cat echo {echo_took:?}"
        );
        Ok(())
    })
    .await;
}
