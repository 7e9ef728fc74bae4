//! Child processes of the test fixtures: spawned with their output in a log file, stopped
//! with SIGTERM or SIGKILL, killed when dropped.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Starting or finding a process failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A binary could not be built.
    #[error("{0}")]
    Build(String),
}

/// Where [`free_port`] looks when the kernel does not say its ephemeral range.
const EPHEMERAL_START: u16 = 32_768;
/// The lowest port [`free_port`] hands out.
const LOWEST_PORT: u16 = 15_000;
/// How many ports this process has handed out: each is handed out once.
static HANDED_OUT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The first port of the kernel's ephemeral range (`ip_local_port_range`).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .filter(|start| *start > LOWEST_PORT + 1_000)
        .unwrap_or(EPHEMERAL_START)
}

/// A port on 127.0.0.1 that was free a moment ago (for a child process to listen on).
///
/// Taken from below the kernel's ephemeral range, never from it: the kernel picks the local
/// port of every outgoing connection and of every `:0` listener from that range, so a port
/// found free there can be taken by any connection on the machine before the child binds it
/// (a daemon that cannot bind its port, or a test that reaches some other process on it).
/// Below the range only another caller of this function can take it: each process walks the
/// range from a start its pid picks, and hands every port out once.
pub fn free_port() -> Result<u16, ProcessError> {
    use std::sync::atomic::Ordering;
    let span = u32::from(ephemeral_start() - LOWEST_PORT);
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let step = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        let offset = u16::try_from(start.wrapping_add(step) % span).unwrap_or(0);
        let port = LOWEST_PORT + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(ProcessError::Io {
        what: "find a free port".into(),
        source: std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("every port from {LOWEST_PORT} to the ephemeral range is taken"),
        ),
    })
}

/// A running child process.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args` and `envs`, output to `<log_dir>/<name>.log`. Call it from a
    /// thread that lives as long as the process should (a runtime's worker, not a blocking-pool
    /// thread): the child is killed when that thread ends.
    pub fn spawn<I, S>(
        name: &str,
        program: &Path,
        args: I,
        envs: &[(String, String)],
        log_dir: &Path,
    ) -> Result<Self, ProcessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let log = log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(|source| ProcessError::Io {
            what: format!("create {}", log.display()),
            source,
        })?;
        let stderr = file.try_clone().map_err(|source| ProcessError::Io {
            what: "duplicate a log handle".into(),
            source,
        })?;
        // `setpriv --pdeathsig KILL` (util-linux) has the kernel kill the child if the thread
        // that started it dies without cleaning up (SIGKILL, abort): nothing outlives its owner,
        // and no unsafe `prctl` is needed. Its pid is the program's (setpriv execs it).
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProcessError::Io {
                what: format!("start {}", program.display()),
                source,
            })?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// The process's name in logs and dumps.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operating-system process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether it has exited (and with what), without waiting.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM without waiting (what a kubelet does first when a pod is deleted).
    pub fn signal_term(&self) {
        if let Some(pid) = self.pid() {
            // `kill` keeps this crate free of unsafe signal calls.
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }

    /// Waits up to `timeout` for the exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Sends SIGTERM and waits up to `grace` for the exit, then SIGKILL.
    pub async fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.signal_term();
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => self.kill().await,
        }
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let _ = self.child.start_kill();
        self.child.wait().await.ok()
    }

    /// The last `lines` lines of its output. A Go crash prints its reason (`fatal error: …`,
    /// `panic: …`) once and then hundreds of lines of goroutine stacks, so when that line is
    /// older than the tail it is put first: the tail alone would show only stack frames.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        tail_of(&text, lines)
    }

    /// The whole output so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The last `lines` lines of `text`, preceded by the first Go crash reason when it is older.
fn tail_of(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let reason = all[..start]
        .iter()
        .find(|line| line.starts_with("fatal error: ") || line.starts_with("panic: "));
    let tail = all[start..].join("\n");
    match reason {
        Some(reason) => format!("{reason}\n…\n{tail}"),
        None => tail,
    }
}

/// The path of a workspace binary, building it when it is missing. `VNE_BIN_DIR` overrides
/// where binaries are looked for.
pub fn binary(package: &str, name: &str) -> Result<PathBuf, ProcessError> {
    let dir = match (std::env::var_os("VNE_BIN_DIR"), BUILT_DIR.get()) {
        (Some(dir), _) => PathBuf::from(dir),
        (None, Some(built)) => built.clone(),
        (None, None) => target_dir()?,
    };
    let path = dir.join(name);
    if path.exists() {
        return Ok(path);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command.args(["build", "--quiet", "-p", package, "--bin", name]);
    if dir.ends_with("release") {
        command.arg("--release");
    }
    let status = command.status().map_err(|source| ProcessError::Io {
        what: format!("build {name}"),
        source,
    })?;
    if status.success() && path.exists() {
        Ok(path)
    } else {
        Err(ProcessError::Build(format!(
            "{name} is not built and `cargo build -p {package} --bin {name}` failed"
        )))
    }
}

/// Where [`build_binaries`] put the binaries, once it ran.
static BUILT_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Builds (or confirms up to date) every binary the harness starts, as release builds in a
/// target directory of their own (`target/bench-bins`), and makes [`binary`] use them. Benchmarks
/// call it first: [`binary`] alone reuses whatever binary is already there, which after a change
/// to another package is a stale one (`VNE_BIN_DIR`, when set, still wins). The separate directory keeps this build's feature set from
/// invalidating the benchmark's own build (and the other way round).
pub fn build_binaries() -> Result<(), ProcessError> {
    let mut target = target_dir()?;
    target.pop();
    let target = target.join("bench-bins");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "integration",
            "--bin",
            "playground",
            "-p",
            "mock-eci",
            "--bin",
            "mock-eci",
            "-p",
            "virtual-node-eci",
            "--bin",
            "virtual-node-eci",
            "--target-dir",
        ])
        .arg(&target)
        .status()
        .map_err(|source| ProcessError::Io {
            what: "build the binaries".into(),
            source,
        })?;
    if !status.success() {
        return Err(ProcessError::Build(format!(
            "building the binaries failed ({status})"
        )));
    }
    let _ = BUILT_DIR.set(target.join("release"));
    Ok(())
}

/// `target/<profile>` of the running test binary (`target/<profile>/deps/<test>`).
fn target_dir() -> Result<PathBuf, ProcessError> {
    let exe = std::env::current_exe().map_err(|source| ProcessError::Io {
        what: "find the test binary".into(),
        source,
    })?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(
            ports
                .iter()
                .all(|p| (LOWEST_PORT..ephemeral_start()).contains(p)),
            "{ports:?}"
        );
        // Each one can be listened on.
        for port in ports {
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }

    #[test]
    fn a_go_crash_keeps_its_reason_above_the_stacks() {
        let log = "started\nfatal error: concurrent map writes\n\ngoroutine 1 [running]:\nframe a\nframe b\nframe c";
        assert_eq!(
            tail_of(log, 2),
            "fatal error: concurrent map writes\n…\nframe b\nframe c"
        );
        assert_eq!(tail_of(log, 10), log, "the reason is in the tail already");
        assert_eq!(tail_of("a\nb\nc", 2), "b\nc", "no crash, the tail alone");
    }
}
