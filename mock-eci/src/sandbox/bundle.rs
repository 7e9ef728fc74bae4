//! One container's OCI bundle: its config.json (built with `oci-spec`) and its root file system,
//! an overlay of the image's read-only rootfs (shared by every container of every group that
//! uses the image) under a writable layer of the container's own. An overlay rather than a copy:
//! it costs nothing per container whatever the image's size, keeps the image store read-only,
//! and removing the container's layer removes all it wrote.
//!
//! Also the group's shared pieces the containers join: a persistent IPC namespace (a bind mount
//! of an nsfs file, made by util-linux `unshare`), the /dev/shm directory and the /etc files.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxMemoryBuilder, LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxResourcesBuilder, Mount, MountBuilder, RootBuilder, Spec, UserBuilder,
};
use rustix::mount::{MountFlags, UnmountFlags};
use tokio::process::Command;

/// The CFS period quotas are expressed against (100 ms, the kernel's default).
const CPU_PERIOD_MICROS: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("could not build the container's OCI config")]
    Spec(#[source] oci_spec::OciSpecError),
    #[error("environment variable name {0:?} is empty or holds '='")]
    EnvName(String),
    #[error("working directory {0:?} must be an absolute path")]
    WorkingDir(String),
    #[error("path {0} cannot be an overlay layer (it holds ',' or ':')")]
    OverlayPath(PathBuf),
    #[error("could not mount the container's root file system at {target}")]
    Mount {
        target: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    #[error("could not unmount {target}")]
    Unmount {
        target: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    #[error("could not create the group's IPC namespace at {path}: {detail}")]
    Ipc { path: PathBuf, detail: String },
}

/// Which cgroup limits this machine lets the runtime apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSupport {
    pub memory: bool,
    pub cpu: bool,
}

impl LimitSupport {
    /// From what /sys/fs/cgroup shows: on a unified (v2) hierarchy the root's
    /// `cgroup.controllers`; otherwise whether v1 hierarchies of the controller are mounted.
    pub fn decide(v2_controllers: Option<&str>, v1_memory: bool, v1_cpu: bool) -> Self {
        match v2_controllers {
            Some(controllers) => {
                let has = |name: &str| controllers.split_whitespace().any(|c| c == name);
                Self {
                    memory: has("memory"),
                    cpu: has("cpu"),
                }
            }
            None => Self {
                memory: v1_memory,
                cpu: v1_cpu,
            },
        }
    }

    /// Reads this machine's cgroup mounts (the edge of [`LimitSupport::decide`]).
    pub fn detect() -> Self {
        let root = Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(root.join("cgroup.controllers")).ok();
        Self::decide(
            v2.as_deref(),
            root.join("memory").is_dir(),
            root.join("cpu").is_dir(),
        )
    }
}

/// Everything one container's config.json is made of.
#[derive(Debug, Clone)]
pub struct ContainerConfig<'a> {
    pub rootfs: &'a Path,
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub working_dir: Option<&'a str>,
    pub hostname: &'a str,
    pub netns: &'a Path,
    pub ipc_ns: &'a Path,
    /// The group's directory holding etc/ and shm/.
    pub group_dir: &'a Path,
    pub cgroup: &'a str,
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub limits: LimitSupport,
    pub volume_mounts: &'a [VolumeMount],
    /// uid and gid.
    pub user: (u32, u32),
    pub read_only_root: bool,
    /// Kernel parameters of the namespaces the container joins (the runtime refuses one that
    /// is not namespaced).
    pub sysctls: &'a [(String, String)],
}

/// A volume (or a part of one) bound into the container.
#[derive(Debug, Clone)]
pub struct VolumeMount {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
}

/// The container's OCI config: the runtime's usual defaults (mounts, masked paths,
/// capabilities), the group's network and IPC namespaces joined, new PID, UTS and mount
/// namespaces of its own, the group's /etc files and /dev/shm bound in.
pub fn container_spec(config: &ContainerConfig<'_>) -> Result<Spec, BundleError> {
    let mut spec = Spec::default();
    let root = RootBuilder::default()
        .path(config.rootfs)
        .readonly(config.read_only_root)
        .build()
        .map_err(BundleError::Spec)?;
    spec.set_root(Some(root));
    spec.set_hostname(Some(config.hostname.to_owned()));
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.retain(|mount| mount.destination() != Path::new("/dev/shm"));
    mounts.extend(group_mounts(config.group_dir)?);
    mounts.extend(volume_mounts(config.volume_mounts)?);
    spec.set_mounts(Some(mounts));
    if let Some(process) = spec.process_mut() {
        process.set_args(Some(config.argv.to_vec()));
        process.set_env(Some(environment(config.env, config.hostname)?));
        process.set_cwd(working_dir(config.working_dir)?);
        let (uid, gid) = config.user;
        let user = UserBuilder::default()
            .uid(uid)
            .gid(gid)
            .build()
            .map_err(BundleError::Spec)?;
        process.set_user(user);
    }
    if let Some(linux) = spec.linux_mut() {
        linux.set_namespaces(Some(namespaces(config.netns, config.ipc_ns)?));
        linux.set_cgroups_path(Some(PathBuf::from(format!("/{}", config.cgroup))));
        linux.set_resources(Some(resources(config)?));
        if !config.sysctls.is_empty() {
            linux.set_sysctl(Some(config.sysctls.iter().cloned().collect()));
        }
    }
    Ok(spec)
}

/// The OCI runtime needs an absolute working directory; the image's root if none is given.
fn working_dir(requested: Option<&str>) -> Result<PathBuf, BundleError> {
    match requested {
        None => Ok(PathBuf::from("/")),
        Some(dir) if dir.starts_with('/') => Ok(PathBuf::from(dir)),
        Some(dir) => Err(BundleError::WorkingDir(dir.to_owned())),
    }
}

fn namespaces(netns: &Path, ipc_ns: &Path) -> Result<Vec<LinuxNamespace>, BundleError> {
    let new = |typ| {
        LinuxNamespaceBuilder::default()
            .typ(typ)
            .build()
            .map_err(BundleError::Spec)
    };
    let join = |typ, path: &Path| {
        LinuxNamespaceBuilder::default()
            .typ(typ)
            .path(path)
            .build()
            .map_err(BundleError::Spec)
    };
    Ok(vec![
        new(LinuxNamespaceType::Pid)?,
        new(LinuxNamespaceType::Uts)?,
        new(LinuxNamespaceType::Mount)?,
        join(LinuxNamespaceType::Network, netns)?,
        join(LinuxNamespaceType::Ipc, ipc_ns)?,
    ])
}

/// The group's /etc files and /dev/shm, bound into every container of the group.
fn group_mounts(group_dir: &Path) -> Result<Vec<Mount>, BundleError> {
    let bind = |source: PathBuf, destination: &str| {
        MountBuilder::default()
            .destination(destination)
            .typ("bind")
            .source(source)
            .options(vec!["rbind".to_owned(), "rprivate".to_owned()])
            .build()
            .map_err(BundleError::Spec)
    };
    let etc = group_dir.join("etc");
    Ok(vec![
        bind(etc.join("hostname"), "/etc/hostname")?,
        bind(etc.join("hosts"), "/etc/hosts")?,
        bind(etc.join("resolv.conf"), "/etc/resolv.conf")?,
        bind(group_dir.join("shm"), "/dev/shm")?,
    ])
}

/// The volumes, bound where the container mounts them.
fn volume_mounts(volumes: &[VolumeMount]) -> Result<Vec<Mount>, BundleError> {
    volumes
        .iter()
        .map(|volume| {
            let mut options = vec!["rbind".to_owned(), "rprivate".to_owned()];
            if volume.read_only {
                options.push("ro".to_owned());
            }
            MountBuilder::default()
                .destination(&volume.destination)
                .typ("bind")
                .source(&volume.source)
                .options(options)
                .build()
                .map_err(BundleError::Spec)
        })
        .collect()
}

/// The caller's variables after the defaults a container expects (PATH, HOSTNAME), so the
/// caller's win (a later duplicate wins in execve's environment as the runtimes pass it).
fn environment(env: &[(String, String)], hostname: &str) -> Result<Vec<String>, BundleError> {
    let mut out = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        format!("HOSTNAME={hostname}"),
    ];
    for (name, value) in env {
        if name.is_empty() || name.contains('=') {
            return Err(BundleError::EnvName(name.clone()));
        }
        out.retain(|entry| !entry.starts_with(&format!("{name}=")));
        out.push(format!("{name}={value}"));
    }
    Ok(out)
}

fn resources(
    config: &ContainerConfig<'_>,
) -> Result<oci_spec::runtime::LinuxResources, BundleError> {
    let mut builder = LinuxResourcesBuilder::default().devices(Vec::new());
    if let Some(bytes) = config.memory_bytes.filter(|_| config.limits.memory) {
        let memory = LinuxMemoryBuilder::default()
            .limit(i64::try_from(bytes).unwrap_or(i64::MAX))
            .build()
            .map_err(BundleError::Spec)?;
        builder = builder.memory(memory);
    }
    if let Some(millis) = config.cpu_millis.filter(|_| config.limits.cpu) {
        let quota = millis.saturating_mul(CPU_PERIOD_MICROS) / 1000;
        let cpu = LinuxCpuBuilder::default()
            .quota(i64::try_from(quota).unwrap_or(i64::MAX))
            .period(CPU_PERIOD_MICROS)
            .build()
            .map_err(BundleError::Spec)?;
        builder = builder.cpu(cpu);
    }
    builder.build().map_err(BundleError::Spec)
}

/// The overlay options for a container's root: the image below, its own layer above.
pub fn overlay_options(lower: &Path, upper: &Path, work: &Path) -> Result<String, BundleError> {
    for path in [lower, upper, work] {
        let text = path.to_string_lossy();
        if text.contains(',') || text.contains(':') {
            return Err(BundleError::OverlayPath(path.to_owned()));
        }
    }
    Ok(format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    ))
}

pub fn mount_overlay(options: &str, target: &Path) -> Result<(), BundleError> {
    let data = std::ffi::CString::new(options)
        .map_err(|_| BundleError::OverlayPath(PathBuf::from(options)))?;
    rustix::mount::mount("overlay", target, "overlay", MountFlags::empty(), &*data).map_err(
        |source| BundleError::Mount {
            target: target.to_owned(),
            source,
        },
    )
}

/// Unmounts `target` if something is mounted there (a detached unmount: a process still
/// holding it cannot keep the sandbox from removing it).
pub fn unmount(target: &Path) -> Result<(), BundleError> {
    match rustix::mount::unmount(target, UnmountFlags::DETACH) {
        Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => Ok(()),
        Err(source) => Err(BundleError::Unmount {
            target: target.to_owned(),
            source,
        }),
    }
}

/// Creates the group's IPC namespace, kept alive by a bind mount on `path`.
pub async fn create_ipc_namespace(path: &Path) -> Result<(), BundleError> {
    let failed = |detail: String| BundleError::Ipc {
        path: path.to_owned(),
        detail,
    };
    tokio::fs::write(path, b"")
        .await
        .map_err(|e| failed(e.to_string()))?;
    let output = Command::new("unshare")
        .arg(format!("--ipc={}", path.display()))
        .arg("true")
        .output()
        .await
        .map_err(|e| failed(format!("{e} (is util-linux installed?)")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(failed(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ))
    }
}

/// The group's /etc files' contents, written before its first container starts.
pub fn group_files(
    hostname: &str,
    ip: Ipv4Addr,
    aliases: &[super::files::HostAlias],
    dns: &super::files::Dns,
) -> [(&'static str, String); 3] {
    [
        ("hostname", super::files::hostname_file(hostname)),
        ("hosts", super::files::hosts_file(hostname, ip, aliases)),
        ("resolv.conf", super::files::resolv_conf(dns)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config<'a>(argv: &'a [String], env: &'a [(String, String)]) -> ContainerConfig<'a> {
        ContainerConfig {
            rootfs: Path::new("/state/g/app/rootfs"),
            argv,
            env,
            working_dir: Some("/srv"),
            hostname: "web-0",
            netns: Path::new("/run/netns/vt-g"),
            ipc_ns: Path::new("/state/g/ipc"),
            group_dir: Path::new("/state/g"),
            cgroup: "vt-g-app",
            memory_bytes: Some(64 << 20),
            cpu_millis: Some(250),
            limits: LimitSupport {
                memory: true,
                cpu: true,
            },
            volume_mounts: &[],
            user: (0, 0),
            read_only_root: false,
            sysctls: &[],
        }
    }

    #[test]
    fn limit_support_follows_the_hierarchy() {
        let cases = [
            (
                Some("cpuset cpu io memory pids"),
                false,
                false,
                (true, true),
            ),
            (Some("cpuset io pids"), true, true, (false, false)),
            (None, true, true, (true, true)),
            (None, true, false, (true, false)),
            (None, false, false, (false, false)),
        ];
        for (v2, memory, cpu, (want_memory, want_cpu)) in cases {
            let got = LimitSupport::decide(v2, memory, cpu);
            assert_eq!((got.memory, got.cpu), (want_memory, want_cpu), "{v2:?}");
        }
    }

    #[test]
    fn the_spec_joins_the_groups_namespaces_and_owns_the_rest() {
        let argv = vec!["sh".to_owned(), "-c".to_owned(), "true".to_owned()];
        let env = vec![("PATH".to_owned(), "/bin".to_owned())];
        let spec = container_spec(&config(&argv, &env)).expect("spec");
        let json = serde_json::to_value(&spec).expect("json");
        let namespaces = &json["linux"]["namespaces"];
        let expected = serde_json::json!([
            {"type": "pid"}, {"type": "uts"}, {"type": "mount"},
            {"type": "network", "path": "/run/netns/vt-g"},
            {"type": "ipc", "path": "/state/g/ipc"},
        ]);
        assert_eq!(namespaces, &expected);
        assert_eq!(json["hostname"], "web-0");
        assert_eq!(json["root"]["path"], "/state/g/app/rootfs");
        assert_eq!(json["process"]["args"], serde_json::json!(argv));
        assert_eq!(json["process"]["cwd"], "/srv");
        assert_eq!(
            json["process"]["env"],
            serde_json::json!(["HOSTNAME=web-0", "PATH=/bin"])
        );
        assert_eq!(json["linux"]["cgroupsPath"], "/vt-g-app");
        assert_eq!(json["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(json["linux"]["resources"]["cpu"]["quota"], 25_000);
        let shm: Vec<_> = json["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter(|m| m["destination"] == "/dev/shm")
            .collect();
        assert_eq!(shm.len(), 1);
        assert_eq!(shm[0]["source"], "/state/g/shm");
    }

    #[test]
    fn limits_are_left_out_where_the_machine_has_no_controller() {
        let argv = vec!["true".to_owned()];
        let mut config = config(&argv, &[]);
        config.limits = LimitSupport {
            memory: false,
            cpu: false,
        };
        let json = serde_json::to_value(container_spec(&config).expect("spec")).expect("json");
        assert!(json["linux"]["resources"].get("memory").is_none(), "{json}");
        assert!(json["linux"]["resources"].get("cpu").is_none(), "{json}");
    }

    #[test]
    fn bad_input_is_refused() {
        let argv = vec!["true".to_owned()];
        let env = vec![("A=B".to_owned(), "c".to_owned())];
        assert!(matches!(
            container_spec(&config(&argv, &env)),
            Err(BundleError::EnvName(_))
        ));
        let mut relative = config(&argv, &[]);
        relative.working_dir = Some("srv");
        assert!(matches!(
            container_spec(&relative),
            Err(BundleError::WorkingDir(_))
        ));
        assert!(matches!(
            overlay_options(Path::new("/img/a,b"), Path::new("/u"), Path::new("/w")),
            Err(BundleError::OverlayPath(_))
        ));
        assert_eq!(
            overlay_options(Path::new("/img"), Path::new("/u"), Path::new("/w")).expect("options"),
            "lowerdir=/img,upperdir=/u,workdir=/w"
        );
    }
}
