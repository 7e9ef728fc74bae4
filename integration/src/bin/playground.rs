//! `playground`: try virtual-node-eci with no cluster and no cloud account. Starts a real
//! control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from
//! upstream), kwok ECS nodes, the host node whose agent runs the project's own pods as local
//! processes, and `deploy/overlays/local` (mock-eci and the virtual-node-eci StatefulSet) with
//! `kubectl apply -k`. When everything is Ready it writes `DIR/env` (a file to `source`) and
//! waits in the foreground until SIGINT or SIGTERM, then stops everything within 30 s.
//!
//! The end-to-end harness runs it with `--bare --stop-on-stdin-eof` as the supervisor of one
//! control plane per test binary: when the test process ends, however it ends, its end of the
//! pipe closes and the playground stops every process it started.

#![allow(clippy::print_stdout, clippy::print_stderr)] // telling the user what to do is its job

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use integration::cluster::{ControlPlane, ControlPlaneOptions};
use integration::harness::binary;
use integration::host::{HostAgent, HostConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

/// Try virtual-node-eci locally on a real control plane: mock-eci plays ECI.
#[derive(Debug, Parser)]
#[command(name = "playground")]
struct Args {
    /// Virtual nodes: replicas of the virtual-node-eci StatefulSet (0 allowed).
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Simulated ordinary (ECS) nodes run by kwok, named `ecs-0` … (2 CPU, 4 GiB, 110 pods).
    #[arg(long, default_value_t = 2)]
    ecs_nodes: u32,
    /// Directory for the kubeconfig, `env`, PKI, data and every log (default: a fresh
    /// temporary directory, removed at exit).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the control plane, the host node and the ECS nodes: no mock-eci, no daemons (the
    /// end-to-end harness deploys what each test needs).
    #[arg(long, hide = true)]
    bare: bool,
    /// Also stop when standard input reaches its end (the harness holds the other end).
    #[arg(long, hide = true)]
    stop_on_stdin_eof: bool,
}

/// The host node's name.
const HOST_NODE: &str = "host-0";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("playground: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(line: &str) {
    eprintln!("[playground] {line}");
}

async fn run(args: Args) -> anyhow::Result<()> {
    let temporary = tempfile::tempdir()?;
    let dir = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            std::fs::canonicalize(dir)?
        }
        None => temporary.path().to_owned(),
    };
    let _ = std::fs::remove_file(dir.join("env"));
    say(&format!("directory {}", dir.display()));
    let mut stop = stop_signal(args.stop_on_stdin_eof)?;

    say("building or finding the upstream binaries (a cold build prints its progress)");
    let mut options = ControlPlaneOptions::new(&dir);
    options.ecs_nodes = args.ecs_nodes;
    let plane = tokio::select! {
        plane = ControlPlane::start(options) => plane.context("start the control plane")?,
        () = &mut stop => return Ok(()),
    };
    say(&format!("control plane ready at {}", plane.server()));
    let client = plane.client().await?;

    say("building virtual-node-eci and mock-eci");
    let daemon = binary("virtual-node-eci", "virtual-node-eci")?;
    binary("mock-eci", "mock-eci")?;
    let bin_dir = daemon
        .parent()
        .context("the daemon binary has a directory")?
        .to_owned();
    let agent = HostAgent::start(
        client.clone(),
        HostConfig {
            node_name: HOST_NODE.into(),
            images: BTreeMap::from([("virtual-node-eci".to_owned(), bin_dir)]),
            dir: dir.join("host"),
            api_host: "127.0.0.1".into(),
            api_port: plane.api_port(),
            restart_backoff: (Duration::from_secs(1), Duration::from_secs(30)),
        },
    )
    .await
    .context("start the host-node agent")?;

    let ready = async {
        let mut env = format!(
            "export KUBECONFIG={}\nexport PATH={}:$PATH\n",
            plane.kubeconfig().display(),
            plane
                .upstream()
                .path("kubectl")?
                .parent()
                .unwrap_or(Path::new("."))
                .display()
        );
        if !args.bare {
            let mock = deploy(&plane, &client, &dir, args.replicas).await?;
            env += &format!(
                "export MOCK_ECI_ADDR={mock}:50051\nexport MOCK_ECI_ADMIN=http://{mock}:8080\n"
            );
        }
        write_env(&dir, &env)?;
        anyhow::Ok(())
    };
    let outcome = tokio::select! {
        outcome = ready => Some(outcome),
        () = &mut stop => None,
    };
    if let Some(Ok(())) = outcome {
        if !args.bare {
            instructions(&dir, args.replicas);
        }
        stop.await;
    }
    say("stopping");
    agent.stop(Duration::from_secs(20)).await;
    plane.stop(Duration::from_secs(5)).await;
    let _ = std::fs::remove_file(dir.join("env"));
    outcome.unwrap_or(Ok(()))
}

/// Resolves on SIGINT or SIGTERM (and at the end of stdin when asked).
fn stop_signal(
    on_stdin_eof: bool,
) -> anyhow::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(Box::pin(async move {
        let stdin_closed = async {
            if on_stdin_eof {
                let mut stdin = tokio::io::stdin();
                let mut buffer = [0_u8; 64];
                while stdin.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            () = stdin_closed => {}
        }
    }))
}

/// Writes `DIR/env` whole or not at all (scripts wait for it to appear).
fn write_env(dir: &Path, contents: &str) -> anyhow::Result<()> {
    let partial = dir.join("env.partial");
    std::fs::write(&partial, contents)?;
    std::fs::rename(&partial, dir.join("env"))?;
    Ok(())
}

/// Applies `deploy/overlays/local` with `replicas`, waits for mock-eci and the virtual nodes,
/// and answers mock-eci's Service address (served by the host agent's proxy: gRPC on 50051,
/// the admin API on 8080).
async fn deploy(
    plane: &ControlPlane,
    client: &kube::Client,
    dir: &Path,
    replicas: u32,
) -> anyhow::Result<String> {
    let overlay = dir.join("overlay");
    std::fs::create_dir_all(&overlay)?;
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/overlays/local");
    let local = std::fs::canonicalize(&local)
        .with_context(|| format!("find {}", local.display()))?;
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\nreplicas:\n  - name: virtual-node-eci\n    count: {replicas}\n",
            local.display()
        ),
    )?;
    say("kubectl apply -k deploy/overlays/local");
    let output = tokio::process::Command::new(plane.upstream().path("kubectl")?)
        .arg("--kubeconfig")
        .arg(plane.kubeconfig())
        .args(["apply", "-k"])
        .arg(&overlay)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl apply -k failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    wait("mock-eci to be available", Duration::from_secs(180), || {
        let deployments = deployments.clone();
        async move {
            deployments.get_opt("mock-eci").await.ok().flatten().is_some_and(|d| {
                d.status.and_then(|s| s.available_replicas).unwrap_or(0) >= 1
            })
        }
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    wait(
        &format!("{replicas} Ready virtual node(s)"),
        Duration::from_secs(180),
        || {
            let nodes = nodes.clone();
            async move {
                let Ok(list) = nodes
                    .list(&ListParams::default().labels("type=virtual-kubelet"))
                    .await
                else {
                    return false;
                };
                list.items.iter().filter(|n| is_ready(n)).count() == replicas as usize
            }
        },
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let mock = services.get("mock-eci").await?;
    let ip = mock
        .spec
        .and_then(|s| s.cluster_ip)
        .context("mock-eci's Service has a cluster IP")?;
    Ok(ip)
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn wait<F, Fut>(what: &str, timeout: Duration, condition: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    say(&format!("waiting for {what}"));
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    while !condition().await {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    Ok(())
}

fn instructions(dir: &Path, replicas: u32) {
    println!(
        "virtual-node-eci playground: a real control plane, {replicas} virtual node(s), mock-eci as ECI; logs in {}",
        dir.display()
    );
    println!();
    println!("source {}/env", dir.display());
    println!("kubectl get nodes -o wide");
    println!("kubectl create namespace demo");
    println!(
        "kubectl label namespace demo virtual-node-affinity-injection=enabled   # the webhook sends its pods to virtual nodes"
    );
    println!("kubectl -n demo create deployment web --image=nginx --replicas=4");
    println!("kubectl -n demo get pods -o wide");
    println!("kubectl -n kube-system scale statefulset virtual-node-eci --replicas=4");
    println!("curl -s $MOCK_ECI_ADMIN/admin/groups   # mock-eci's container groups");
    println!();
    println!("Ctrl-C stops everything.");
}
