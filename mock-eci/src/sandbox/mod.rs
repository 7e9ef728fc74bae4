//! The real runtime's sandbox: one ECI container group as the machine's own namespaces,
//! interfaces, mounts, cgroups and processes.
//!
//! It owns, for the groups it creates and nothing else (everything is named from its
//! [`names::Prefix`]): a host bridge; per group a network namespace with a veth pair into the
//! bridge and the group's address, an IPC namespace shared by the group's containers, a state
//! directory (the group's /etc files, /dev/shm, each container's writable layer, bundle and
//! log); per container an OCI runtime container (own PID, UTS and mount namespaces; a cgroup
//! the runtime creates and removes). Beside them, a store of the volumes that outlive groups
//! (disks, NAS and OSS paths: [`VolumeSource::Stored`]), which nothing removes.
//!
//! It may call: `ip` (iproute2), `unshare` (util-linux), the OCI runtime's CLI, and mount(2)
//! for the containers' overlays. It takes each container's root file system as a read-only
//! directory (the image store yields it) and never writes there. It does not use the engine,
//! the service or the fronts: they will drive it.

pub mod bundle;
pub mod container;
pub mod files;
pub mod names;
pub mod net;
pub mod residue;
pub mod rewrite;
pub mod stats;
mod sweep;
pub mod volumes;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::Ipv4Net;

use bundle::{BundleError, ContainerConfig, LimitSupport};
pub use container::Exit;
use container::{Container, ContainerError};
pub use files::{Dns, HostAlias};
use names::{Label, NameError, Prefix};
use net::{GroupNet, NetError};
pub use volumes::{MountSpec, VolumeError, VolumeFile, VolumeSource, VolumeSpec};

/// The state directory's store of volumes that outlive groups.
const STORES: &str = "stores";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("invalid sandbox input")]
    Name(#[from] NameError),
    #[error("group network")]
    Net(#[from] NetError),
    #[error("container bundle")]
    Bundle(#[from] BundleError),
    #[error("container process")]
    Container(#[from] ContainerError),
    #[error("volume")]
    Volume(#[from] VolumeError),
    #[error("could not {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("group {0} already has a container named {1}")]
    DuplicateContainer(String, String),
    #[error("group {0} has no container named {1}")]
    NoContainer(String, String),
}

/// How a sandbox is set up.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Names every object the sandbox creates (1–6 of a-z, 0-9). The sandbox owns it on this
    /// machine: opening removes whatever carries it (an earlier run's leftovers).
    pub prefix: String,
    /// The bridge's address and the network groups' addresses are taken from, e.g.
    /// `10.213.0.1/16`: private, not loopback.
    pub network: Ipv4Net,
    /// Where groups' state lives (bundles, writable layers, logs).
    pub state_dir: PathBuf,
    /// The OCI runtime binary (runc's command line: `--root`, `run --bundle`, `kill`,
    /// `delete --force`).
    pub runtime: PathBuf,
}

/// What a group is made of (the caller's view of an ECI container group).
#[derive(Debug, Clone)]
pub struct GroupSpec {
    pub id: String,
    pub hostname: String,
    pub ip: Ipv4Addr,
    pub dns: Dns,
    pub host_aliases: Vec<HostAlias>,
    pub volumes: Vec<VolumeSpec>,
    /// Namespaced kernel parameters (`SecurityContext.Sysctl`), set in the group's network and
    /// IPC namespaces as each container starts.
    pub sysctls: Vec<(String, String)>,
}

/// One container to run: the command line is already resolved (the image's entrypoint and
/// command against the API's Command and Args).
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    /// The group's volumes it mounts.
    pub mounts: Vec<MountSpec>,
    /// The uid and gid its process (and every exec in it) runs as.
    pub user: (u32, u32),
    /// Its root file system is mounted read-only (volumes keep their own mode).
    pub read_only_root: bool,
    /// Where in the container its termination-message file is bound (an absolute path).
    pub termination_message_path: String,
}

/// The machine-wide part: bridge, naming, limits this machine supports.
#[derive(Debug)]
pub struct Sandbox {
    prefix: Prefix,
    network: Ipv4Net,
    state_dir: PathBuf,
    runtime: PathBuf,
    limits: LimitSupport,
}

impl Sandbox {
    /// Checks the configuration, removes whatever an earlier run with this prefix and state
    /// directory left (the prefix is this sandbox's own), creates the state directory and the
    /// bridge.
    pub async fn open(config: SandboxConfig) -> Result<Self, SandboxError> {
        let prefix = Prefix::new(&config.prefix)?;
        net::check_network(config.network)?;
        sweep::sweep(&prefix, &config.state_dir, &config.runtime).await?;
        let limits = LimitSupport::detect();
        if !(limits.memory && limits.cpu) {
            tracing::warn!(
                memory = limits.memory,
                cpu = limits.cpu,
                "this machine's cgroups lack a controller: those limits are not applied"
            );
        }
        create_dir(&config.state_dir.join("runtime")).await?;
        let bridge = prefix.bridge();
        net::run(&net::bridge_steps(
            &bridge,
            config.network,
            net::link_exists(&bridge),
        ))
        .await?;
        Ok(Self {
            prefix,
            network: config.network,
            state_dir: config.state_dir,
            runtime: config.runtime,
            limits,
        })
    }

    pub fn limits(&self) -> LimitSupport {
        self.limits
    }

    pub fn prefix(&self) -> &Prefix {
        &self.prefix
    }

    /// Where group `group`'s container `container` logs (CRI format), whether or not it
    /// exists; [`Group::remove_container`] keeps the run before as `log.previous` beside it.
    pub fn log_path(&self, group: &str, container: &str) -> Result<PathBuf, SandboxError> {
        let group = Label::new("group id", group)?;
        let container = Label::new("container name", container)?;
        Ok(self
            .state_dir
            .join("groups")
            .join(group.as_str())
            .join("containers")
            .join(container.as_str())
            .join("log"))
    }

    /// What each container of group `group` that has a cgroup (it runs) uses now, by name.
    pub fn group_usage(&self, group: &str) -> BTreeMap<String, stats::Usage> {
        let Ok(group) = Label::new("group id", group) else {
            return BTreeMap::new();
        };
        let dir = self
            .state_dir
            .join("groups")
            .join(group.as_str())
            .join("containers");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return BTreeMap::new();
        };
        entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let container = Label::new("container name", &name).ok()?;
                let usage = stats::read(&self.prefix.runtime_id(&group, &container))?;
                Some((name, usage))
            })
            .collect()
    }

    /// The command line that runs `argv` in group `group`'s running container `container`:
    /// the OCI runtime's `exec`, which enters every namespace of the container (its PID, UTS
    /// and mount namespaces: its processes, host name and files, nothing of the host's) and
    /// its cgroup, and takes the environment, working directory and user of the container's
    /// own process. With `tty` the runtime gives the command a terminal of its own, relayed to
    /// the runtime's stdio, which must then be a terminal too.
    pub fn exec_command(
        &self,
        group: &str,
        container: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<(PathBuf, Vec<OsString>), SandboxError> {
        let group = Label::new("group id", group)?;
        let container = Label::new("container name", container)?;
        let mut args: Vec<OsString> = vec![
            "--root".into(),
            self.state_dir.join("runtime").into_os_string(),
            "exec".into(),
        ];
        if tty {
            args.extend(["--tty".into(), "--env".into(), "TERM=xterm".into()]);
        }
        args.push(self.prefix.runtime_id(&group, &container).into());
        args.extend(argv.iter().map(OsString::from));
        Ok((self.runtime.clone(), args))
    }

    /// Removes the bridge (every group must have been deleted first).
    pub async fn close(&self) -> Result<(), SandboxError> {
        let bridge = self.prefix.bridge();
        net::run(&net::bridge_removal_steps(
            &bridge,
            net::link_exists(&bridge),
        ))
        .await?;
        Ok(())
    }

    /// Creates the group's network, IPC namespace and /etc files; on a failure, removes
    /// whatever part was made.
    pub async fn create_group(&self, spec: &GroupSpec) -> Result<Group, SandboxError> {
        let id = Label::new("group id", &spec.id)?;
        let hostname = names::hostname(&spec.hostname)?;
        check_names(spec)?;
        let address = names::group_address(self.network, spec.ip)?;
        let mut group = Group {
            net: GroupNet {
                netns: self.prefix.netns(&id),
                host_veth: self.prefix.host_veth(spec.ip),
                address,
            },
            dir: self.state_dir.join("groups").join(id.as_str()),
            runtime: self.runtime.clone(),
            runtime_root: self.state_dir.join("runtime"),
            stores: self.state_dir.join(STORES),
            prefix: self.prefix.clone(),
            limits: self.limits,
            hostname,
            volumes: Vec::new(),
            sysctls: spec.sysctls.clone(),
            id,
            containers: BTreeMap::new(),
        };
        match group
            .set_up(&self.prefix.bridge(), self.network.addr(), spec)
            .await
        {
            Ok(()) => Ok(group),
            Err(error) => {
                if let Err(cleanup) = group.tear_down().await {
                    tracing::warn!(group = %spec.id, error = %cleanup, "clean-up after a failed set-up");
                }
                Err(error)
            }
        }
    }
}

/// One group: see the module's doc. Delete it with [`Group::delete`]; dropping it leaves its
/// containers running and its namespaces and mounts in place, for the next [`Sandbox::open`]
/// on the same prefix to remove.
#[derive(Debug)]
pub struct Group {
    id: Label,
    hostname: String,
    net: GroupNet,
    dir: PathBuf,
    runtime: PathBuf,
    runtime_root: PathBuf,
    /// The machine's store of volumes that outlive groups ([`VolumeSource::Stored`]).
    stores: PathBuf,
    prefix: Prefix,
    limits: LimitSupport,
    /// Each volume and its directory.
    volumes: Vec<(VolumeSpec, PathBuf)>,
    sysctls: Vec<(String, String)>,
    containers: BTreeMap<Label, Container>,
}

impl Group {
    pub fn netns(&self) -> &str {
        &self.net.netns
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The container's log file (CRI format: timestamp, stream, F/P, text).
    pub fn log_path(&self, container: &str) -> PathBuf {
        self.dir.join("containers").join(container).join("log")
    }

    async fn set_up(
        &mut self,
        bridge: &str,
        gateway: Ipv4Addr,
        spec: &GroupSpec,
    ) -> Result<(), SandboxError> {
        let etc = self.dir.join("etc");
        create_dir(&etc).await?;
        create_dir(&self.dir.join("shm")).await?;
        create_dir(&self.dir.join("containers")).await?;
        for (name, text) in
            bundle::group_files(&self.hostname, spec.ip, &spec.host_aliases, &spec.dns)
        {
            write_file(&etc.join(name), text.as_bytes()).await?;
        }
        for (index, volume) in spec.volumes.iter().enumerate() {
            let dir = match &volume.source {
                VolumeSource::Stored { key, .. } => volumes::store_dir(&self.stores, key),
                _ => self.dir.join("volumes").join(index.to_string()),
            };
            volumes::create(&dir, volume)?;
            self.volumes.push((volume.clone(), dir));
        }
        bundle::create_ipc_namespace(&self.dir.join("ipc")).await?;
        net::run(&net::group_steps(bridge, gateway, &self.net)).await?;
        tracing::info!(group = %self.id.as_str(), address = %self.net.address, "group created");
        Ok(())
    }

    /// Starts a container over `rootfs` (read-only; its writes go to its own layer). On a
    /// failure nothing of the container is left (its directory, its mount).
    pub async fn start(&mut self, spec: &ContainerSpec, rootfs: &Path) -> Result<(), SandboxError> {
        let name = Label::new("container name", &spec.name)?;
        if self.containers.contains_key(&name) {
            return Err(SandboxError::DuplicateContainer(
                self.id.as_str().to_owned(),
                spec.name.clone(),
            ));
        }
        let dir = self.dir.join("containers").join(name.as_str());
        let id = self.prefix.runtime_id(&self.id, &name);
        let started = self.launch(spec, rootfs, &dir, &id).await;
        match started {
            Ok(container) => {
                self.containers.insert(name, container);
                Ok(())
            }
            Err(error) => {
                unmount_all_under(&dir)?;
                match tokio::fs::remove_dir_all(&dir).await {
                    Ok(()) => Err(error),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(error),
                    Err(e) => Err(io_error("remove", &dir, e)),
                }
            }
        }
    }

    /// Writes the bundle (config first: bad input fails before anything is mounted), mounts
    /// the root and runs the runtime.
    async fn launch(
        &self,
        spec: &ContainerSpec,
        rootfs: &Path,
        dir: &Path,
        id: &str,
    ) -> Result<Container, SandboxError> {
        let root = dir.join("rootfs");
        for sub in ["rootfs", "upper", "work"] {
            create_dir(&dir.join(sub)).await?;
        }
        let options = bundle::overlay_options(rootfs, &dir.join("upper"), &dir.join("work"))?;
        let netns = net::netns_path(&self.net.netns);
        let ipc = self.dir.join("ipc");
        let mut volume_mounts = Vec::new();
        for (index, mount) in spec.mounts.iter().enumerate() {
            let staging = dir.join("subpaths").join(index.to_string());
            let source = volumes::mount_source(&self.volumes, mount, &staging)?;
            // Files volumes (ConfigMaps, Secrets) are read-only, as Kubernetes mounts them;
            // so is a stored volume made read-only (an NFSVolume's `ReadOnly`).
            let volume_read_only = self.volumes.iter().any(|(volume, _)| {
                volume.name == mount.volume
                    && matches!(
                        volume.source,
                        VolumeSource::Files(_)
                            | VolumeSource::Stored {
                                read_only: true,
                                ..
                            }
                    )
            });
            volume_mounts.push(bundle::VolumeMount {
                source,
                destination: mount.path.clone(),
                read_only: mount.read_only || volume_read_only,
            });
        }
        volume_mounts.push(termination_message_mount(dir, &spec.termination_message_path).await?);
        let config = ContainerConfig {
            rootfs: &root,
            argv: &spec.argv,
            env: &spec.env,
            working_dir: spec.working_dir.as_deref(),
            hostname: &self.hostname,
            netns: &netns,
            ipc_ns: &ipc,
            group_dir: &self.dir,
            cgroup: id,
            memory_bytes: spec.memory_bytes,
            cpu_millis: spec.cpu_millis,
            limits: self.limits,
            volume_mounts: &volume_mounts,
            user: spec.user,
            read_only_root: spec.read_only_root,
            sysctls: &self.sysctls,
        };
        let config_json = serde_json::to_vec(&bundle::container_spec(&config)?)
            .map_err(|e| io_error("serialize", dir, std::io::Error::other(e)))?;
        write_file(&dir.join("config.json"), &config_json).await?;
        bundle::mount_overlay(&options, &root)?;
        let log = dir.join("log");
        Ok(Container::start(&self.runtime, &self.runtime_root, id, dir, &log).await?)
    }

    /// Brings the files of the group's files volumes (ConfigFileVolume) to those of `specs`
    /// in place (see [`rewrite`]): the running containers see the new files through their
    /// mounts and are not touched. Volumes not in `specs`, of another kind, or changed in
    /// another way are left as they are. Returns the names of the volumes rewritten; after a
    /// failure the volume counts as unchanged, so the next call tries again.
    pub fn update_files(&mut self, specs: &[VolumeSpec]) -> Result<Vec<String>, SandboxError> {
        let mut rewritten = Vec::new();
        for spec in specs {
            let Some((current, dir)) = self.volumes.iter_mut().find(|(v, _)| v.name == spec.name)
            else {
                continue;
            };
            let (VolumeSource::Files(old), VolumeSource::Files(new)) =
                (&current.source, &spec.source)
            else {
                continue;
            };
            if old == new {
                continue;
            }
            let steps = rewrite::plan(&spec.name, old, new)?;
            rewrite::apply(dir, &spec.name, &steps)?;
            *current = spec.clone();
            rewritten.push(spec.name.clone());
        }
        Ok(rewritten)
    }

    /// Waits for a container to end by itself.
    pub async fn wait(&mut self, container: &str) -> Result<Exit, SandboxError> {
        Ok(self.container(container)?.wait().await?)
    }

    /// Stops a container: SIGTERM, SIGKILL after `grace`.
    pub async fn stop(&mut self, container: &str, grace: Duration) -> Result<Exit, SandboxError> {
        Ok(self.container(container)?.stop(grace).await?)
    }

    /// Waits until one of the running containers ends (forever when none runs). Cancel-safe
    /// as far as [`Self::exited`] goes: an end seen here is also listed there.
    pub async fn wait_any(&mut self) {
        let waits: Vec<_> = self
            .containers
            .values_mut()
            .filter(|container| container.exit().is_none())
            .map(|container| Box::pin(container.wait()))
            .collect();
        if waits.is_empty() {
            std::future::pending::<()>().await;
        }
        let (result, _, _) = futures::future::select_all(waits).await;
        if let Err(error) = result {
            tracing::warn!(group = %self.id.as_str(), %error, "waiting for a container");
        }
    }

    /// The containers that ended, with how.
    pub fn exited(&self) -> Vec<(String, Exit)> {
        self.containers
            .iter()
            .filter_map(|(name, container)| Some((name.as_str().to_owned(), container.exit()?)))
            .collect()
    }

    /// Whether container `name` exists and has not been seen ending.
    pub fn is_running(&self, name: &str) -> bool {
        Label::new("container name", name)
            .ok()
            .and_then(|label| self.containers.get(&label))
            .is_some_and(|container| container.exit().is_none())
    }

    /// The last `limit` bytes of what container `name`'s latest run wrote to its
    /// termination-message file; empty when it wrote nothing (or the file is gone).
    pub fn termination_message(&self, name: &str, limit: usize) -> Vec<u8> {
        let path = self.log_path(name).with_file_name(TERMINATION_MESSAGE);
        read_tail(&path, limit).unwrap_or_default()
    }

    /// The last `limit` bytes of container `name`'s log, from the first whole line in them.
    pub fn log_tail(&self, name: &str, limit: usize) -> String {
        let mut tail = read_tail(&self.log_path(name), limit).unwrap_or_default();
        if tail.len() == limit {
            let first_line_end = tail.iter().position(|b| *b == b'\n').map_or(0, |at| at + 1);
            tail.drain(..first_line_end);
        }
        String::from_utf8_lossy(&tail).into_owned()
    }

    /// Forgets an ended (or stopped) container so that [`Self::start`] can run it again:
    /// removes its runtime state, mount and layer; its log becomes `log.previous`.
    pub async fn remove_container(&mut self, name: &str) -> Result<(), SandboxError> {
        let label = Label::new("container name", name)?;
        let Some(container) = self.containers.remove(&label) else {
            return Ok(());
        };
        container.force_delete().await;
        let dir = self.dir.join("containers").join(label.as_str());
        unmount_all_under(&dir)?;
        for sub in ["rootfs", "upper", "work", "subpaths"] {
            match tokio::fs::remove_dir_all(dir.join(sub)).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("remove", &dir.join(sub), e)),
            }
        }
        let (log, previous) = (dir.join("log"), dir.join("log.previous"));
        match tokio::fs::rename(&log, &previous).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("rename", &log, e)),
        }
    }

    fn container(&mut self, name: &str) -> Result<&mut Container, SandboxError> {
        let label = Label::new("container name", name)?;
        let group = self.id.as_str().to_owned();
        self.containers
            .get_mut(&label)
            .ok_or_else(|| SandboxError::NoContainer(group, name.to_owned()))
    }

    /// Stops every container (concurrently, each with `grace`), then removes the group's
    /// mounts, namespaces, interfaces and files.
    pub async fn delete(mut self, grace: Duration) -> Result<(), SandboxError> {
        let stops = self
            .containers
            .values_mut()
            .map(|container| container.stop(grace));
        for result in futures::future::join_all(stops).await {
            if let Err(error) = result {
                tracing::warn!(group = %self.id.as_str(), %error, "stopping a container");
            }
        }
        for container in self.containers.values() {
            container.force_delete().await;
        }
        self.tear_down().await?;
        tracing::info!(group = %self.id.as_str(), "group deleted");
        Ok(())
    }

    /// Removes what exists of the group, whatever state it is in.
    async fn tear_down(&self) -> Result<(), SandboxError> {
        // Containers' roots and sub paths, volumes' tmpfs, the IPC namespace.
        unmount_all_under(&self.dir)?;
        net::run(&net::group_removal_steps(
            &self.net,
            net::netns_exists(&self.net.netns),
            net::link_exists(&self.net.host_veth),
        ))
        .await?;
        match tokio::fs::remove_dir_all(&self.dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove", &self.dir, e)),
        }
    }
}

/// The caller's words that end up in the group's /etc files, one word each.
fn check_names(spec: &GroupSpec) -> Result<(), NameError> {
    for alias in &spec.host_aliases {
        for hostname in &alias.hostnames {
            names::hostname(hostname)?;
        }
    }
    for word in spec.dns.searches.iter().chain(&spec.dns.options) {
        names::dns_word(word)?;
    }
    Ok(())
}

/// Unmounts every mount at or under `dir`, the deepest first.
fn unmount_all_under(dir: &Path) -> Result<(), BundleError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for mount in residue::mounts_under(&mountinfo, dir).iter().rev() {
        bundle::unmount(mount)?;
    }
    Ok(())
}

fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> SandboxError {
    SandboxError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

async fn create_dir(path: &Path) -> Result<(), SandboxError> {
    tokio::fs::create_dir_all(path)
        .await
        .map_err(|e| io_error("create", path, e))
}

/// The file a container's run leaves its termination message in, in the container's directory.
const TERMINATION_MESSAGE: &str = "termination-message";

/// A new, empty termination-message file for the run, bound at `destination`. World-writable,
/// as the kubelet makes it: the container's user need not be root.
async fn termination_message_mount(
    dir: &Path,
    destination: &str,
) -> Result<bundle::VolumeMount, SandboxError> {
    use std::os::unix::fs::PermissionsExt as _;
    let source = dir.join(TERMINATION_MESSAGE);
    write_file(&source, b"").await?;
    tokio::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o666))
        .await
        .map_err(|e| io_error("chmod", &source, e))?;
    Ok(bundle::VolumeMount {
        source,
        destination: destination.to_owned(),
        read_only: false,
    })
}

/// The last `limit` bytes of the file at `path`.
fn read_tail(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let length = file.metadata()?.len();
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    file.seek(SeekFrom::Start(length.saturating_sub(limit)))?;
    let mut tail = Vec::new();
    file.take(limit).read_to_end(&mut tail)?;
    Ok(tail)
}

async fn write_file(path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
    tokio::fs::write(path, contents)
        .await
        .map_err(|e| io_error("write", path, e))
}
