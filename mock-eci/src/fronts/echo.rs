//! `--port-echo`: a TCP echo listener on every declared TCP port of every running group, at the
//! group's intranet IP, so port-forward has something real to reach. Reconciled from the
//! groups twice a second; a port that cannot be bound (taken, or an IP that is not this host's:
//! give an `--ip-cidr` such as 127.77.0.0/16, reachable on Linux's loopback) is logged once and
//! tried again later.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info};

use crate::service::MockEci;

/// How often the listeners follow the groups.
const RECONCILE_EVERY: Duration = Duration::from_millis(500);

/// Keeps the echo listeners in step with the groups until `stop`.
pub async fn run(mock: MockEci, mut stop: watch::Receiver<bool>) {
    let mut listening: HashMap<SocketAddr, JoinHandle<()>> = HashMap::new();
    let mut refused: HashSet<SocketAddr> = HashSet::new();
    loop {
        let wanted = mock.running_tcp_ports();
        listening.retain(|addr, task| {
            let keep = wanted.contains(addr);
            if !keep {
                task.abort();
            }
            keep
        });
        for addr in wanted {
            if listening.contains_key(&addr) {
                continue;
            }
            match TcpListener::bind(addr).await {
                Ok(listener) => {
                    info!(%addr, "echo listener up");
                    refused.remove(&addr);
                    listening.insert(addr, tokio::spawn(serve(listener)));
                }
                Err(error) => {
                    if refused.insert(addr) {
                        info!(%addr, %error, "cannot listen for the echo; retrying");
                    }
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RECONCILE_EVERY) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    for task in listening.into_values() {
        task.abort();
    }
}

async fn serve(listener: TcpListener) {
    while let Ok((mut socket, peer)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 16 * 1024];
            loop {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if socket.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = socket.shutdown().await;
            debug!(%peer, "echo connection closed");
        });
    }
}
