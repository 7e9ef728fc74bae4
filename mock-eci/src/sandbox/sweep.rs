//! Removing what an earlier run of a sandbox left behind (its process killed with -9, a test
//! that failed half-way): found by the sandbox's prefix and state directory
//! ([`Residue::list`]), removed in the order the kernel allows — processes first (they hold
//! mounts and namespaces), then the runtime's records, mounts, namespaces, interfaces,
//! cgroups and files.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::names::Prefix;
use super::residue::Residue;
use super::{SandboxError, bundle, io_error, net};

/// How long killed processes get to disappear before the sweep goes on without them.
const PROCESS_EXIT_BOUND: Duration = Duration::from_secs(10);

/// Removes everything [`Residue::list`] finds; returns what it found.
pub(super) async fn sweep(
    prefix: &Prefix,
    state_dir: &Path,
    runtime: &Path,
) -> Result<Residue, SandboxError> {
    let found = Residue::list(prefix, state_dir);
    if found.is_empty() {
        return Ok(found);
    }
    tracing::warn!(?found, "removing what an earlier run of the sandbox left");
    kill_all(prefix, state_dir).await;
    forget_runtime_containers(runtime, &state_dir.join("runtime")).await;
    for mount in found.mounts.iter().rev() {
        bundle::unmount(mount)?;
    }
    // Host ends of veth pairs before namespaces: deleting a namespace makes the kernel destroy
    // its pairs later, on its own schedule, so a link listed now could vanish under our delete.
    for link in &found.links {
        remove_link(link).await?;
    }
    for netns in &found.netns {
        net::run(&[vec!["netns".into(), "del".into(), netns.clone()]]).await?;
    }
    for cgroup in found.cgroups.iter().rev() {
        if let Err(error) = tokio::fs::remove_dir(cgroup).await {
            tracing::warn!(cgroup = %cgroup.display(), %error, "cgroup left");
        }
    }
    let groups = state_dir.join("groups");
    match tokio::fs::remove_dir_all(&groups).await {
        Ok(()) => Ok(found),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(found),
        Err(e) => Err(io_error("remove", &groups, e)),
    }
}

/// Deletes an interface; one that disappeared meanwhile (its pair's namespace destroyed) is
/// what was wanted.
async fn remove_link(link: &str) -> Result<(), SandboxError> {
    if !net::link_exists(link) {
        return Ok(());
    }
    match net::run(&[vec!["link".into(), "del".into(), link.to_owned()]]).await {
        Err(_) if !net::link_exists(link) => Ok(()),
        done => done.map_err(SandboxError::from),
    }
}

/// SIGKILL to every process of the sandbox, until none is left (bounded).
async fn kill_all(prefix: &Prefix, state_dir: &Path) {
    let start = tokio::time::Instant::now();
    loop {
        let processes = Residue::list(prefix, state_dir).processes;
        if processes.is_empty() || start.elapsed() > PROCESS_EXIT_BOUND {
            if !processes.is_empty() {
                tracing::warn!(?processes, "processes survived SIGKILL");
            }
            return;
        }
        for pid in processes {
            let pid = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(pid) = pid {
                // Gone already is fine: that is the goal.
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes the runtime's records of containers whose processes are gone.
async fn forget_runtime_containers(runtime: &Path, root: &Path) {
    let listed = Command::new(runtime)
        .arg("--root")
        .arg(root)
        .args(["list", "--quiet"])
        .output()
        .await;
    let Ok(listed) = listed else { return };
    for id in String::from_utf8_lossy(&listed.stdout).lines() {
        let deleted = Command::new(runtime)
            .arg("--root")
            .arg(root)
            .args(["delete", "--force", id])
            .output()
            .await;
        if let Err(error) = deleted {
            tracing::warn!(container = id, %error, "runtime delete");
        }
    }
}
