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
use integration::cluster::{ControlPlane, ControlPlaneOptions, PlacementExtender};
use integration::harness::binary;
use integration::harness::deploy::{Mock, apply_local_overlay, wait_installed, wait_virtual_nodes};
use integration::host::{HostAgent, HostConfig, loopback_pod_network};
use integration::real_mode::{E2eTools, RealRuntime};
use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

/// Try virtual-node-eci locally on a real control plane: mock-eci plays ECI.
#[derive(Debug, Parser)]
#[command(
    name = "playground",
    long_about = "Try virtual-node-eci locally on a real control plane: mock-eci plays ECI.\n\n\
Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from their \
upstream Go modules by integration/upstream/build.sh and cached in ~/.cache/virtual-node-eci; \
the first run builds them, about 10 minutes on 2 cores, printing progress at least every 30 s), \
kwok ECS nodes, metrics-server, and a host node whose agent runs the project's own pods as local \
processes; then installs deploy/overlays/local (mock-eci and the virtual-node-eci StatefulSet) \
with kubectl. mock-eci gives container groups addresses on this machine's loopback and echoes \
every declared TCP port there, so `kubectl port-forward` to a pod on a virtual node answers.\n\n\
Each phase says how long it took. When everything is Ready it writes DIR/env (source it: the \
built kubectl on PATH, KUBECONFIG, MOCK_ECI_ADMIN), prints what to try, and runs until Ctrl-C \
(SIGINT) or SIGTERM, then stops everything within 30 s."
)]
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
    /// Run metrics-server, so `kubectl top` and HorizontalPodAutoscalers work
    /// (`--metrics-server false` saves its start-up and its scrapes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    metrics_server: bool,
    /// Configure kube-scheduler with the daemons' ResourcePolicy extender (filter, prioritize,
    /// bind over HTTPS on a free port of 127.0.0.1, certificate from the cluster CA; ignorable,
    /// so scheduling goes on while no daemon serves it); `--placement-extender false` leaves
    /// the scheduler as upstream ships it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    placement_extender: bool,
    /// Write kube-apiserver's audit log of the daemon's ServiceAccount's requests
    /// (`audit/audit.log` in the directory); `--audit-log false` leaves the apiserver
    /// unaudited, as the benchmarks run it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    audit_log: bool,
    /// Only the control plane, the host node and the ECS nodes: no mock-eci, no daemons (the
    /// end-to-end harness runs it so and deploys what each test needs).
    #[arg(long)]
    bare: bool,
    /// Also stop when standard input reaches its end (the end-to-end harness holds the other
    /// end, so the playground stops with the test process however it ends).
    #[arg(long)]
    stop_on_stdin_eof: bool,
    /// Remove `--dir` and everything in it at exit.
    #[arg(long)]
    remove_dir_on_exit: bool,
    /// How mock-eci runs containers: `real` (busybox and the other images from a local
    /// registry, which also stands in for Docker Hub, really run, each group in network
    /// namespaces on a bridge; the daemons and mock-eci get non-loopback addresses routed to an
    /// interface the playground creates and removes, so `kubectl logs`/`exec` go through the
    /// apiserver and Services get EndpointSlices), `simulated` (nothing runs; logs are made
    /// up), or `auto`: real where this machine has what it needs (root, runc, iproute2 and
    /// Debian's busybox-static), else simulated, saying what is missing.
    #[arg(long, env = "PLAYGROUND_RUNTIME", value_enum, default_value_t = Runtime::Auto)]
    runtime: Runtime,
    /// With `--runtime real`: also push the images Kubernetes' end-to-end suite runs
    /// (agnhost from this binary, built by `integration/upstream/build.sh e2e-test`; busybox;
    /// pause), as integration/upstream/run-conformance.sh does.
    #[arg(long, value_name = "AGNHOST")]
    e2e_images: Option<PathBuf>,
    /// With `--e2e-images`: the static busybox those images carry (`build.sh e2e-test` builds
    /// one from busybox's source, as upstream's image has it); Debian's when not given.
    #[arg(long, value_name = "BUSYBOX", requires = "e2e_images")]
    e2e_busybox: Option<PathBuf>,
    /// With `--e2e-images`: a static curl for the agnhost image (`build.sh e2e-test` builds
    /// one); without it the agnhost image has no curl, which the lifecycle-hook tests run.
    #[arg(long, value_name = "CURL", requires = "e2e_images")]
    e2e_curl: Option<PathBuf>,
}

/// How mock-eci runs containers in the playground.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Runtime {
    /// Real where the machine allows, else simulated.
    Auto,
    /// Timers and made-up output (mock-eci's default).
    Simulated,
    /// Real containers (mock-eci `--runtime real`).
    Real,
}

impl Runtime {
    /// `Auto` decided: real unless the machine lacks something real mode needs (said once).
    fn resolved(self) -> Self {
        match self {
            Self::Auto => match integration::real_mode::missing_prerequisite() {
                None => Self::Real,
                Some(missing) => {
                    say(&format!(
                        "simulated containers: running them for real (--runtime real) needs {missing}"
                    ));
                    Self::Simulated
                }
            },
            chosen => chosen,
        }
    }
}

/// The tour's Deployment (after `kubectl -n demo create deployment web`), the README's too: a
/// web server that says where it runs, real in real mode (busybox's httpd serving the group's
/// /etc) and simulated in the other.
const TOUR_WEB: &str = "--image=busybox --replicas=4 --port=80 -- sh -c 'echo serving from $(hostname); exec httpd -f -v -p 80 -h /etc'";

/// The host node's name.
const HOST_NODE: &str = "host-0";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("playground: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(Args::parse())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("playground: {error:#}");
            ExitCode::FAILURE
        }
    };
    // The stdin watch blocks a thread in read(2) until the parent closes the pipe; a runtime
    // dropped normally would wait for it forever, so a failed start would hang its caller.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    code
}

fn say(line: &str) {
    eprintln!("[playground] {line}");
}

/// `what` and how long it took since `started`, restarting the clock for the next phase.
fn done(what: &str, started: &mut std::time::Instant) {
    say(&format!(
        "{what} ({:.1} s)",
        started.elapsed().as_secs_f64()
    ));
    *started = std::time::Instant::now();
}

/// mock-eci's settings in the playground: group IPs from a block of this machine's loopback
/// (not the pod or Service blocks, 127.1-199.x.x) with a TCP echo on every declared port, so
/// port-forward to a pod on a virtual node reaches something; and containers that exit at
/// SIGTERM, as most servers do, so `kubectl delete pod` returns in a second, not after the
/// whole grace period (a container's `MOCK_ECI_STOP_AFTER` still holds it).
fn mock_eci_env() -> Vec<(String, String)> {
    let block = integration::cluster::random_in(200..=254);
    vec![
        ("MOCK_ECI_PORT_ECHO".to_owned(), "true".to_owned()),
        ("MOCK_ECI_IP_CIDR".to_owned(), format!("127.{block}.0.0/16")),
        ("MOCK_ECI_STOP_AFTER_SIGTERM".to_owned(), "0s".to_owned()),
    ]
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

    let begun = std::time::Instant::now();
    let mut phase = begun;
    let Some(plane) = start_plane(&args, &dir, &mut stop, &mut phase).await? else {
        return Ok(());
    };
    let client = plane.client().await?;

    say("building virtual-node-eci and mock-eci");
    let daemon = binary("virtual-node-eci", "virtual-node-eci")?;
    binary("mock-eci", "mock-eci")?;
    done("virtual-node-eci and mock-eci built", &mut phase);
    let runtime = if args.bare {
        Runtime::Simulated
    } else {
        args.runtime.resolved()
    };
    let real = match runtime {
        Runtime::Real => match start_real(&args, &dir, &mut stop, &mut phase).await? {
            Some(real) => Some(real),
            None => return Ok(()),
        },
        _ => None,
    };
    let bin_dir = daemon
        .parent()
        .context("the daemon binary has a directory")?
        .to_owned();
    let agent = match start_agent(&client, &plane, &dir, bin_dir, real.as_ref()).await {
        Ok(agent) => agent,
        Err(error) => {
            if let Some(real) = real {
                stop_real(real).await;
            }
            return Err(error).context("start the host-node agent");
        }
    };

    let playground = Playground {
        args: &args,
        plane: &plane,
        client: &client,
        dir: &dir,
        real: real.as_ref(),
    };
    let outcome = tokio::select! {
        outcome = playground.install(&mut phase) => Some(outcome),
        () = &mut stop => None,
    };
    if let Some(Ok(())) = outcome {
        say(&format!("ready in {:.1} s", begun.elapsed().as_secs_f64()));
        playground.instructions();
        stop.await;
    }
    say("stopping");
    agent.stop(Duration::from_secs(20)).await;
    if let Some(real) = real {
        stop_real(real).await;
    }
    plane.stop(Duration::from_secs(5)).await;
    let _ = std::fs::remove_file(dir.join("env"));
    if args.remove_dir_on_exit {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome.unwrap_or(Ok(()))
}

/// What [`stop_signal`] returns: resolves when the playground is to stop.
type Stop = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Starts the control plane `args` ask for; `None` when told to stop first.
async fn start_plane(
    args: &Args,
    dir: &Path,
    stop: &mut Stop,
    phase: &mut std::time::Instant,
) -> anyhow::Result<Option<ControlPlane>> {
    say("building or finding the upstream binaries (a cold build prints its progress)");
    let mut options = ControlPlaneOptions::new(dir);
    options.ecs_nodes = args.ecs_nodes;
    options.metrics_server = args.metrics_server;
    options.placement_extender = args.placement_extender;
    options.audit_log = args.audit_log;
    let plane = tokio::select! {
        plane = ControlPlane::start(options) => plane.context("start the control plane")?,
        () = stop => return Ok(None),
    };
    done(&format!("control plane ready at {}", plane.server()), phase);
    Ok(Some(plane))
}

/// Starts real mode (the network, the registry, mock-eci `--runtime real`) and pushes the
/// end-to-end images when asked; `None` when told to stop first.
async fn start_real(
    args: &Args,
    dir: &Path,
    stop: &mut Stop,
    phase: &mut std::time::Instant,
) -> anyhow::Result<Option<RealRuntime>> {
    say("real runtime: the network, the registry with busybox, mock-eci --runtime real");
    let real = tokio::select! {
        real = RealRuntime::start(dir) => real.context("start the real runtime")?,
        () = stop => return Ok(None),
    };
    if let Some(agnhost) = &args.e2e_images {
        let tools = E2eTools {
            agnhost: agnhost.clone(),
            busybox: args.e2e_busybox.clone(),
            curl: args.e2e_curl.clone(),
        };
        if let Err(error) = real.push_e2e_images(&tools).await {
            stop_real(real).await;
            return Err(error).context("push the end-to-end images");
        }
    }
    done(
        &format!(
            "mock-eci (real) at {}, pods on {}/16, groups on {}, registry {}",
            real.grpc(),
            real.pod_network(),
            real.groups_cidr(),
            real.registry()
        ),
        phase,
    );
    Ok(Some(real))
}

/// Starts the host node's agent, which runs the daemon images found in `bin_dir`.
async fn start_agent(
    client: &kube::Client,
    plane: &ControlPlane,
    dir: &Path,
    bin_dir: PathBuf,
    real: Option<&RealRuntime>,
) -> Result<HostAgent, integration::host::HostError> {
    HostAgent::start(
        client.clone(),
        HostConfig {
            node_name: HOST_NODE.into(),
            images: BTreeMap::from([("virtual-node-eci".to_owned(), bin_dir)]),
            dir: dir.join("host"),
            api_host: "127.0.0.1".into(),
            api_port: plane.api_port(),
            restart_backoff: (Duration::from_secs(1), Duration::from_secs(30)),
            // Random, like the Service range: two playgrounds (or test runs) rarely meet.
            pod_network: real.map_or_else(
                || loopback_pod_network(integration::cluster::random_in(1..=99)),
                RealRuntime::pod_network,
            ),
        },
    )
    .await
}

/// The running playground, as the install and the instructions need it.
struct Playground<'a> {
    args: &'a Args,
    plane: &'a ControlPlane,
    client: &'a kube::Client,
    dir: &'a Path,
    real: Option<&'a RealRuntime>,
}

impl Playground<'_> {
    /// Installs `deploy/overlays/local` (unless bare), waits for it to be Ready, and writes
    /// `DIR/env`.
    async fn install(&self, phase: &mut std::time::Instant) -> anyhow::Result<()> {
        let mut env = format!(
            "export KUBECONFIG={}\nexport PATH={}:$PATH\n",
            self.plane.kubeconfig().display(),
            self.plane
                .upstream()
                .path("kubectl")?
                .parent()
                .unwrap_or(Path::new("."))
                .display()
        );
        if !self.args.bare {
            let kubectl = self.plane.upstream().path("kubectl")?;
            say("kubectl apply -k deploy/overlays/local");
            // The daemons serve the extender where kube-scheduler calls it (the elected one).
            let mut daemon_env = self
                .plane
                .placement_extender()
                .map(PlacementExtender::env)
                .unwrap_or_default();
            if let Some(real) = self.real {
                daemon_env.extend(real.daemon_env());
                env += &self.install_real(kubectl, &daemon_env, real, phase).await?;
            } else {
                env += &self.install_mock(kubectl, &daemon_env, phase).await?;
            }
        }
        write_env(self.dir, &env)?;
        Ok(())
    }

    /// The overlay with mock-eci outside the cluster (real mode); returns `DIR/env`'s lines
    /// for it.
    async fn install_real(
        &self,
        kubectl: &Path,
        daemon_env: &[(String, String)],
        real: &RealRuntime,
        phase: &mut std::time::Instant,
    ) -> anyhow::Result<String> {
        let replicas = self.args.replicas;
        let kubeconfig = self.plane.kubeconfig();
        apply_local_overlay(
            kubectl,
            kubeconfig,
            self.dir,
            replicas,
            daemon_env,
            Mock::Outside,
        )
        .await?;
        apply_eci_profile(self.client, real.eci_profile()).await?;
        say("waiting for the virtual nodes to be Ready");
        wait_virtual_nodes(self.client, replicas, Duration::from_secs(300)).await?;
        done("the virtual nodes Ready", phase);
        let (link, prefix) = real.names();
        Ok(format!(
            "export MOCK_ECI_ADDR={}\nexport MOCK_ECI_ADMIN={}\nexport REGISTRY={}\n\
             export PLAYGROUND_LINK={link}\nexport PLAYGROUND_RUNTIME_PREFIX={prefix}\n",
            real.grpc(),
            real.admin_url(),
            real.registry(),
        ))
    }

    /// The overlay with mock-eci in the cluster; returns `DIR/env`'s lines for it.
    async fn install_mock(
        &self,
        kubectl: &Path,
        daemon_env: &[(String, String)],
        phase: &mut std::time::Instant,
    ) -> anyhow::Result<String> {
        let replicas = self.args.replicas;
        let mock_env = mock_eci_env();
        let mock = Mock::InCluster(&mock_env);
        let kubeconfig = self.plane.kubeconfig();
        apply_local_overlay(kubectl, kubeconfig, self.dir, replicas, daemon_env, mock).await?;
        say("waiting for mock-eci and the virtual nodes to be Ready");
        let mock = wait_installed(self.client, replicas, Duration::from_secs(300)).await?;
        done("mock-eci and the virtual nodes Ready", phase);
        Ok(format!(
            "export MOCK_ECI_ADDR={mock}:50051\nexport MOCK_ECI_ADMIN=http://{mock}:8080\n"
        ))
    }

    /// Prints what to try, for the runtime it runs.
    fn instructions(&self) {
        let args = self.args;
        match self.real {
            Some(real) => real_instructions(self.dir, args.replicas, real.registry()),
            None if !args.bare => instructions(
                self.dir,
                args.replicas,
                args.metrics_server,
                self.plane.placement_extender(),
            ),
            None => {}
        }
    }
}

/// Stops real mode's mock-eci, removes its network, and says whether anything was left.
async fn stop_real(real: RealRuntime) {
    let (link, prefix) = real.names();
    match real.stop().await {
        Ok(()) => say(&format!(
            "real runtime stopped: interface {link} removed, no interface or network namespace named {prefix}* left"
        )),
        Err(error) => say(&format!("real runtime: {error:#}")),
    }
}

/// Creates or replaces the eci-profile ConfigMap.
async fn apply_eci_profile(
    client: &kube::Client,
    profile: serde_json::Value,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-system");
    let map: ConfigMap = serde_json::from_value(profile)?;
    maps.patch(
        "eci-profile",
        &kube::api::PatchParams::apply("playground").force(),
        &kube::api::Patch::Apply(&map),
    )
    .await
    .context("apply the eci-profile ConfigMap")?;
    Ok(())
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

fn real_instructions(dir: &Path, replicas: u32, registry: &str) {
    println!(
        "virtual-node-eci playground, real runtime: a real control plane, {replicas} virtual node(s), mock-eci running containers with runc; logs in {}",
        dir.display()
    );
    println!(
        "images (pushed to the registry at {registry}): {}",
        integration::real_mode::IMAGES
            .map(|image| format!("$REGISTRY/{image}"))
            .join(", ")
    );
    println!(
        "Docker Hub names (busybox, docker.io/library/busybox:1.36) are pulled from it too: mock-eci has it as its Docker Hub mirror"
    );
    println!(
        "pods in namespaces labelled virtual-node-affinity-injection=enabled (or labelled alibabacloud.com/eci=true) go to virtual nodes and pull from it over plain HTTP (eci-profile adds k8s.aliyun.com/plain-http-registry)"
    );
    println!();
    println!("source {}/env", dir.display());
    println!("kubectl get nodes -o wide");
    println!("kubectl create namespace demo");
    println!("kubectl label namespace demo virtual-node-affinity-injection=enabled");
    println!(
        "kubectl -n demo run hello --image=busybox -- sh -c 'echo hello from $(hostname); while true; do date; sleep 5; done'"
    );
    println!("kubectl -n demo get pod hello -o wide   # a pod IP on mock-eci's bridge network");
    println!("kubectl -n demo logs hello");
    println!("kubectl -n demo exec hello -- sh -c 'hostname; ps; ip addr'");
    println!("kubectl -n demo create deployment web {TOUR_WEB}");
    println!("kubectl -n demo logs deploy/web   # what the server printed");
    println!(
        "kubectl -n demo port-forward deploy/web 8080:80 &   # then: curl -s -m 2 127.0.0.1:8080/hostname (the pod's /etc/hostname, served by its httpd)"
    );
    println!("kubectl -n demo expose deployment web --port=80");
    println!("kubectl -n demo get endpointslices -l kubernetes.io/service-name=web");
    println!(
        "curl -s http://$(kubectl -n demo get pod -l app=web -o jsonpath='{{.items[0].status.podIP}}')/hostname   # this machine reaches the groups on their bridge"
    );
    println!("curl -s $MOCK_ECI_ADMIN/admin/groups   # mock-eci's container groups");
    println!();
    println!("Ctrl-C stops everything (and removes the interface, the bridge and every group).");
}

fn instructions(
    dir: &Path,
    replicas: u32,
    metrics_server: bool,
    placement_extender: Option<&PlacementExtender>,
) {
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
    println!("kubectl -n demo create deployment web {TOUR_WEB}");
    println!("kubectl -n demo get pods -o wide");
    println!("kubectl -n demo logs deploy/web   # made up: mock-eci simulates the containers");
    println!("kubectl -n demo exec deploy/web -- hostname");
    println!(
        "kubectl -n demo port-forward deploy/web 8080:80 &   # then: curl -s --http0.9 -m 2 127.0.0.1:8080/hostname (mock-eci echoes the request)"
    );
    if metrics_server {
        println!(
            "kubectl -n demo top pod   # figures from ECI's metric calls, scraped by metrics-server every 10 s"
        );
        println!(
            "curl -s -X PUT $MOCK_ECI_ADMIN/admin/usage -d '{{\"rules\": [{{\"group_name_prefix\": \"demo-web-\", \"cpu\": 0.5}}]}}' -H 'content-type: application/json'   # their load"
        );
    }
    if let Some(extender) = placement_extender {
        println!(
            "# kube-scheduler calls the elected daemon's ResourcePolicy extender at {} (filter, prioritize, bind; ignorable)",
            extender.url_prefix()
        );
    }
    println!("kubectl -n kube-system scale statefulset virtual-node-eci --replicas=4");
    println!(
        "kubectl drain virtual-node-eci-3 --ignore-daemonsets && kubectl -n kube-system scale statefulset virtual-node-eci --replicas={replicas}"
    );
    println!("curl -s $MOCK_ECI_ADMIN/admin/groups   # mock-eci's container groups");
    println!();
    println!("Ctrl-C stops everything.");
}
