//! Container processes: the image's binary started in a mount and UTS namespace of its own
//! (`unshare`), with the pod's volumes and hosts file bind-mounted at their mount paths, its
//! own process group, output appended to a log file, and killed with the agent
//! (`setpriv --pdeathsig KILL`, `kill_on_drop`). Signals go through the `kill` command (this
//! crate has no unsafe code).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// Starting or signalling a container process failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A command the agent needs is not installed.
    #[error("`{name}` was not found on PATH; the host agent needs it (util-linux / coreutils)")]
    ToolMissing {
        /// The command.
        name: &'static str,
    },
    /// The container's image is not one the agent has binaries for.
    #[error("image {image:?} is not among the host agent's images ({known})")]
    UnknownImage {
        /// The image.
        image: String,
        /// The repositories it knows.
        known: String,
    },
    /// The image has no binary for the container (no command and no default binary).
    #[error("image {image:?} has no binary {}", path.display())]
    NoBinary {
        /// The image.
        image: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A file (log, pid, hosts) could not be prepared.
    #[error("{what} {}: {source}", path.display())]
    File {
        /// What was done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("start {}: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A failing mount check at start (unshare does not work here).
    #[error(
        "the host agent cannot create mount namespaces (`unshare --mount` failed: {detail}); it needs root"
    )]
    NoMountNamespaces {
        /// What unshare said.
        detail: String,
    },
}

/// Absolute paths of the commands the agent runs.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub(crate) setpriv: PathBuf,
    pub(crate) unshare: PathBuf,
    pub(crate) sh: PathBuf,
    pub(crate) mount: PathBuf,
    pub(crate) mkdir: PathBuf,
    pub(crate) touch: PathBuf,
    pub(crate) hostname: Option<PathBuf>,
    pub(crate) nsenter: PathBuf,
    pub(crate) kill: PathBuf,
}

impl Tools {
    /// Finds the tools on PATH and checks that a mount namespace can be made.
    pub(crate) async fn find() -> Result<Self, ProcessError> {
        let need = |name: &'static str| which(name).ok_or(ProcessError::ToolMissing { name });
        let tools = Self {
            setpriv: need("setpriv")?,
            unshare: need("unshare")?,
            sh: need("sh")?,
            mount: need("mount")?,
            mkdir: need("mkdir")?,
            touch: need("touch")?,
            hostname: which("hostname"),
            nsenter: need("nsenter")?,
            kill: need("kill")?,
        };
        let output = Command::new(&tools.unshare)
            .args(["--mount", "--uts", "--propagation", "private", "--"])
            .arg(&tools.sh)
            .args(["-c", "exit 0"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|source| ProcessError::Spawn {
                program: tools.unshare.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(ProcessError::NoMountNamespaces {
                detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(tools)
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// Host path.
    pub(crate) source: PathBuf,
    /// Path in the container.
    pub(crate) target: String,
    /// Remounted read-only.
    pub(crate) read_only: bool,
    /// The source is a file (the mount point is created as a file).
    pub(crate) file: bool,
}

/// Everything needed to start one container run.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The binary.
    pub(crate) program: PathBuf,
    /// Its arguments.
    pub(crate) args: Vec<String>,
    /// The whole environment.
    pub(crate) env: Vec<(String, String)>,
    /// Bind mounts.
    pub(crate) mounts: Vec<Mount>,
    /// The UTS hostname.
    pub(crate) hostname: String,
    /// `workingDir`.
    pub(crate) working_dir: Option<String>,
    /// Output (appended).
    pub(crate) log: PathBuf,
}

/// The default PATH of the container when its environment has none.
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The image repository of `image`: tag and digest stripped (`registry/a/b:tag@sha256:…` →
/// `registry/a/b`).
pub(crate) fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

/// The program and arguments of a container: `command[0]` by its file name inside the image's
/// directory (else as written: a tool of the host, like `/bin/sh`); with no command the image's
/// default binary, named like the repository's last path segment.
pub(crate) fn resolve_program(
    images: &BTreeMap<String, PathBuf>,
    image: &str,
    command: &[String],
    args: &[String],
) -> Result<(PathBuf, Vec<String>, PathBuf), ProcessError> {
    let repo = repository(image);
    let last = repo.rsplit('/').next().unwrap_or(repo);
    let dir = images
        .get(repo)
        .or_else(|| images.get(last))
        .ok_or_else(|| ProcessError::UnknownImage {
            image: image.to_owned(),
            known: images.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
    let Some((first, rest)) = command.split_first() else {
        let program = dir.join(last);
        if !program.is_file() {
            return Err(ProcessError::NoBinary {
                image: image.to_owned(),
                path: program,
            });
        }
        return Ok((program, args.to_vec(), dir.clone()));
    };
    let mut all_args: Vec<String> = rest.to_vec();
    all_args.extend(args.iter().cloned());
    let in_image = Path::new(first)
        .file_name()
        .map(|name| dir.join(name))
        .filter(|path| path.is_file());
    let program = match in_image {
        Some(program) => program,
        // An absolute path that is neither in the image nor on the host cannot start.
        None if Path::new(first).is_absolute() && !Path::new(first).exists() => {
            return Err(ProcessError::NoBinary {
                image: image.to_owned(),
                path: PathBuf::from(first),
            });
        }
        None => PathBuf::from(first),
    };
    Ok((program, all_args, dir.clone()))
}

/// Quotes for `sh`.
pub(crate) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The `sh -c` script run inside the new namespaces before `exec "$@"`: mount points created,
/// bind mounts made (shallow paths first), read-only ones remounted, hostname set, working
/// directory entered.
pub(crate) fn setup_script(tools: &Tools, launch: &Launch) -> String {
    let mut mounts: Vec<&Mount> = launch.mounts.iter().collect();
    mounts.sort_by_key(|m| Path::new(&m.target).components().count());
    let mut lines = vec!["set -e".to_owned()];
    let (mkdir, touch, mount) = (
        quote(&tools.mkdir.to_string_lossy()),
        quote(&tools.touch.to_string_lossy()),
        quote(&tools.mount.to_string_lossy()),
    );
    for m in mounts {
        let target = quote(&m.target);
        if m.file {
            let parent = Path::new(&m.target)
                .parent()
                .map_or_else(|| "/".to_owned(), |p| p.to_string_lossy().into_owned());
            lines.push(format!("{mkdir} -p {}", quote(&parent)));
            lines.push(format!("[ -e {target} ] || {touch} {target}"));
        } else {
            lines.push(format!("{mkdir} -p {target}"));
        }
        lines.push(format!(
            "{mount} --bind {} {target}",
            quote(&m.source.to_string_lossy())
        ));
        if m.read_only {
            lines.push(format!("{mount} -o remount,bind,ro {target}"));
        }
    }
    if let Some(hostname) = &tools.hostname {
        lines.push(format!(
            "{} {} || true",
            quote(&hostname.to_string_lossy()),
            quote(&launch.hostname)
        ));
    }
    if let Some(dir) = launch.working_dir.as_deref().filter(|d| !d.is_empty()) {
        lines.push(format!("{mkdir} -p {0} && cd {0}", quote(dir)));
    } else {
        lines.push("cd /".to_owned());
    }
    lines.push("exec \"$@\"".to_owned());
    lines.join("\n")
}

/// Starts the container process; its pid is the program's own (every wrapper execs).
pub(crate) fn spawn(tools: &Tools, launch: &Launch) -> Result<Child, ProcessError> {
    let file_error = |what: &'static str, source| ProcessError::File {
        what,
        path: launch.log.clone(),
        source,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&launch.log)
        .map_err(|source| file_error("open log", source))?;
    let log_err = log
        .try_clone()
        .map_err(|source| file_error("open log", source))?;
    let mut env = launch.env.clone();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    if !env.iter().any(|(k, _)| k == "HOSTNAME") {
        env.push(("HOSTNAME".into(), launch.hostname.clone()));
    }
    let mut command = Command::new(&tools.setpriv);
    command
        .args(["--pdeathsig", "KILL", "--"])
        .arg(&tools.unshare)
        .args(["--mount", "--uts", "--propagation", "private", "--"])
        .arg(&tools.sh)
        .arg("-c")
        .arg(setup_script(tools, launch))
        .arg("sh")
        .arg(&launch.program)
        .args(&launch.args)
        .env_clear()
        .envs(env)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().map_err(|source| ProcessError::Spawn {
        program: launch.program.clone(),
        source,
    })
}

/// Sends `signal` (`TERM`, `KILL`, …) to `pid`, or with `group` to its process group.
pub(crate) async fn signal(tools: &Tools, pid: u32, signal: &str, group: bool) {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let _ = Command::new(&tools.kill)
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await;
}

/// A command run inside a running container's namespaces (exec probes and hooks).
pub(crate) fn exec_in(
    tools: &Tools,
    pid: u32,
    command: &[String],
    env: &[(String, String)],
) -> Option<Command> {
    let (program, args) = command.split_first()?;
    let mut cmd = Command::new(&tools.nsenter);
    cmd.arg("--target")
        .arg(pid.to_string())
        .args(["--mount", "--uts", "--"])
        .arg(program)
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if !env.iter().any(|(k, _)| k == "PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    Some(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories() {
        let cases = [
            ("virtual-node-eci:latest", "virtual-node-eci"),
            ("virtual-node-eci", "virtual-node-eci"),
            (
                "registry:5000/team/mock-eci:v1",
                "registry:5000/team/mock-eci",
            ),
            ("registry:5000/team/mock-eci", "registry:5000/team/mock-eci"),
            ("mock-eci@sha256:abc", "mock-eci"),
            ("mock-eci:1@sha256:abc", "mock-eci"),
        ];
        for (image, want) in cases {
            assert_eq!(repository(image), want, "{image}");
        }
    }

    #[test]
    fn programs_resolve_inside_the_image() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["virtual-node-eci", "mock-eci"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let images = BTreeMap::from([
            ("virtual-node-eci".to_owned(), dir.path().to_owned()),
            ("mock-eci".to_owned(), dir.path().to_owned()),
        ]);
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (program, args, _) = resolve_program(
            &images,
            "virtual-node-eci:latest",
            &s(&["/usr/local/bin/mock-eci", "--x"]),
            &s(&["y"]),
        )
        .unwrap();
        assert_eq!(program, dir.path().join("mock-eci"));
        assert_eq!(args, ["--x", "y"]);
        let (program, args, _) = resolve_program(
            &images,
            "example.com/virtual-node-eci:v2",
            &[],
            &s(&["--help"]),
        )
        .unwrap();
        assert_eq!(program, dir.path().join("virtual-node-eci"));
        assert_eq!(args, ["--help"]);
        let (program, args, _) =
            resolve_program(&images, "mock-eci", &s(&["/bin/sh", "-c", "exit 3"]), &[]).unwrap();
        assert_eq!(program, PathBuf::from("/bin/sh"));
        assert_eq!(args, ["-c", "exit 3"]);
        assert!(matches!(
            resolve_program(&images, "mock-eci", &s(&["/nonexistent/tool"]), &[]),
            Err(ProcessError::NoBinary { .. })
        ));
        let (program, _, _) = resolve_program(&images, "mock-eci", &s(&["sh"]), &[]).unwrap();
        assert_eq!(
            program,
            PathBuf::from("sh"),
            "a bare name is looked up on the PATH"
        );
        assert!(matches!(
            resolve_program(&images, "busybox:1", &s(&["sh"]), &[]),
            Err(ProcessError::UnknownImage { .. })
        ));
        let other = BTreeMap::from([("tools".to_owned(), dir.path().to_owned())]);
        assert!(matches!(
            resolve_program(&other, "tools", &[], &[]),
            Err(ProcessError::NoBinary { .. })
        ));
    }

    fn tools() -> Tools {
        Tools {
            setpriv: "/usr/bin/setpriv".into(),
            unshare: "/usr/bin/unshare".into(),
            sh: "/bin/sh".into(),
            mount: "/bin/mount".into(),
            mkdir: "/bin/mkdir".into(),
            touch: "/bin/touch".into(),
            hostname: Some("/bin/hostname".into()),
            nsenter: "/usr/bin/nsenter".into(),
            kill: "/bin/kill".into(),
        }
    }

    #[test]
    fn setup_script_mounts_shallow_first() {
        let launch = Launch {
            program: "/x".into(),
            args: vec![],
            env: vec![],
            mounts: vec![
                Mount {
                    source: "/pods/a/volumes/token".into(),
                    target: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                    read_only: true,
                    file: false,
                },
                Mount {
                    source: "/pods/a/hosts".into(),
                    target: "/etc/hosts".into(),
                    read_only: false,
                    file: true,
                },
                Mount {
                    source: "/pods/a/volumes/it's".into(),
                    target: "/data".into(),
                    read_only: false,
                    file: false,
                },
            ],
            hostname: "web-0".into(),
            working_dir: Some("/work".into()),
            log: "/pods/a/c.log".into(),
        };
        let script = setup_script(&tools(), &launch);
        let want = "set -e
'/bin/mkdir' -p '/data'
'/bin/mount' --bind '/pods/a/volumes/it'\\''s' '/data'
'/bin/mkdir' -p '/etc'
[ -e '/etc/hosts' ] || '/bin/touch' '/etc/hosts'
'/bin/mount' --bind '/pods/a/hosts' '/etc/hosts'
'/bin/mkdir' -p '/var/run/secrets/kubernetes.io/serviceaccount'
'/bin/mount' --bind '/pods/a/volumes/token' '/var/run/secrets/kubernetes.io/serviceaccount'
'/bin/mount' -o remount,bind,ro '/var/run/secrets/kubernetes.io/serviceaccount'
'/bin/hostname' 'web-0' || true
'/bin/mkdir' -p '/work' && cd '/work'
exec \"$@\"";
        assert_eq!(script, want);
    }
}
