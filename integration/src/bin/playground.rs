//! `playground`: try virtual-node-eci with no cluster and no cloud account. Starts the
//! Kubernetes API stand-in, mock-eci and daemon replicas, then prints how to point kubectl at
//! them. Ctrl-C stops everything.

#![allow(clippy::print_stdout)] // printing the instructions is this program's job

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use integration::harness::{Process, binary};
use integration::standin::{StandIn, StandInConfig};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, PostParams};
use tracing_subscriber::EnvFilter;

/// Try virtual-node-eci locally: API stand-in + mock-eci + daemon replicas.
#[derive(Debug, Parser)]
#[command(name = "playground")]
struct Args {
    /// Number of virtual nodes (daemon replicas).
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Directory for the kubeconfig and logs (a new temporary one by default).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("playground: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let temporary = tempfile::tempdir()?;
    let dir = args.dir.unwrap_or_else(|| temporary.path().to_owned());
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    let stand_in = StandIn::start(StandInConfig {
        kubeconfig: Some(kubeconfig.clone()),
        ..StandInConfig::default()
    })
    .await?;

    let mut mock_config = mock_eci::MockConfig::defaults();
    mock_config.listen = "127.0.0.1:0".parse()?;
    mock_config.admin_listen = Some("127.0.0.1:0".parse()?);
    let mock = mock_eci::MockServer::start(mock_config).await?;
    let admin = mock.admin_addr().map(|a| a.to_string()).unwrap_or_default();

    // The StatefulSet object, so `kubectl scale` has something to scale (no controller here:
    // start or stop replicas by re-running the playground with --replicas).
    let client = stand_in.client().await?;
    let sets: Api<StatefulSet> = Api::namespaced(client, "kube-system");
    let set: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "virtual-node-eci", "labels": {"app": "virtual-node-eci"}},
        "spec": {"replicas": args.replicas, "serviceName": "virtual-node-eci", "selector": {"matchLabels": {"app": "virtual-node-eci"}},
            "template": {"metadata": {"labels": {"app": "virtual-node-eci"}}, "spec": {"containers": [{"name": "virtual-node-eci", "image": "virtual-node-eci:dev"}]}}}
    }))?;
    sets.create(&PostParams::default(), &set).await?;

    let program = binary("virtual-node-eci", "virtual-node-eci")?;
    let mut daemons = Vec::new();
    for ordinal in 0..args.replicas {
        let name = format!("virtual-node-eci-{ordinal}");
        let env: Vec<(String, String)> = [
            ("POD_NAME", name.clone()),
            ("POD_NAMESPACE", "kube-system".into()),
            ("POD_IP", "127.0.0.1".into()),
            ("KUBECONFIG", kubeconfig.display().to_string()),
            ("ECI_BACKEND", format!("grpc://{}", mock.grpc_addr())),
            ("METRICS_ADDR", "127.0.0.1:0".into()),
            ("RUST_LOG", "info".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        daemons.push(Process::spawn(
            &name,
            &program,
            Vec::<String>::new(),
            &env,
            &dir,
        )?);
    }

    println!(
        "virtual-node-eci playground: {} virtual node(s), mock-eci at {}, logs in {}",
        args.replicas,
        mock.endpoint(),
        dir.display()
    );
    println!();
    println!("export KUBECONFIG={}", kubeconfig.display());
    println!("kubectl get nodes --show-labels");
    println!("kubectl get node virtual-node-eci-0 -o yaml");
    println!("kubectl -n kube-node-lease get leases -o yaml");
    println!(
        "curl -s -X PATCH -H 'content-type: application/json' -d '{{\"outage\": true}}' http://{admin}/admin/controls   # an ECI outage: the nodes turn NotReady"
    );
    println!(
        "curl -s http://{admin}/admin/groups                                                                # mock-eci's container groups"
    );
    println!();
    println!("Ctrl-C stops everything.");

    tokio::signal::ctrl_c().await?;
    for daemon in &mut daemons {
        daemon.terminate(Duration::from_secs(10)).await;
    }
    mock.stop().await?;
    stand_in.stop().await;
    Ok(())
}
