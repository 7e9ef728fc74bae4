//! The playground's real-runtime mode (`playground --runtime real`): mock-eci runs container
//! groups for real (`--runtime real`), pulling from a local registry that holds the images the
//! project builds offline, and every address the apiserver has to reach is off loopback.
//!
//! - An interface of the playground's (a bridge with no ports) makes a private /16 local to this machine ([`crate::local_net`]): the
//!   host-node agent gives its pods (the daemons: their pod IP is their node's InternalIP and
//!   their kubelet API's address) addresses from it, and mock-eci listens on its first address.
//! - mock-eci is a child process of the playground, not a pod of the host agent: it needs root
//!   and this machine's mount namespace (its groups' network namespaces are bind mounts under
//!   /run/netns, which a pod's private mount namespace would hide), and its stop is what removes
//!   its groups and bridge. Its groups get addresses from a second /16 on its bridge.
//! - A distribution registry on 127.0.0.1 holds busybox (mock-eci pulls from the host, so
//!   loopback serves); an eci-profile selector adds `k8s.aliyun.com/plain-http-registry` for
//!   it to the pods the playground sends to virtual nodes, since the registry speaks plain HTTP.
//!
//! - Each playground holds one of the machine's slots ([`Slot`]), which names mock-eci's prefix
//!   and runtime directory: what a playground killed with -9 left is removed by the next one
//!   started in its slot. The slot also records the two /16 blocks the playground took, so
//!   playgrounds starting together never share one.
//!
//! [`RealRuntime::stop`] stops mock-eci (which removes every group, namespace, veth and its
//! bridge), deletes the interface, and then looks for anything left with either name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::images;
use crate::local_net::{self, Block, LocalNetwork};
use crate::process::{Process, binary};
use crate::registry::TestRegistry;

/// The images the playground pushes, as `<registry>/<name>`.
pub const IMAGES: [&str; 3] = [
    "library/busybox:latest",
    "library/busybox:1.37",
    "library/busybox:1.36",
];

/// The images of Kubernetes' end-to-end suite the playground can serve (`--e2e-images`), as
/// `<registry>/<name>` and what each is: KUBE_TEST_REPO_LIST maps `registry.k8s.io` (and its
/// `e2e-test-images`) onto the registry. agnhost is the suite's own program
/// (k8s.io/kubernetes/test/images/agnhost, built by `upstream/build.sh e2e-test`) on busybox
/// with curl, as upstream puts it on a small base with a shell; pause is agnhost's `pause` (it
/// waits for a signal, which is all a pause container does); busybox is [`E2eTools::busybox`].
pub const E2E_IMAGES: [(&str, E2eImage); 6] = [
    ("e2e-test-images/agnhost:2.66.1", E2eImage::Agnhost),
    // The suite's "previous" agnhost, which it runs only as a container to replace with the
    // current one: the same program under the older tag.
    ("e2e-test-images/agnhost:2.55", E2eImage::Agnhost),
    ("e2e-test-images/busybox:1.37.0-2", E2eImage::Busybox),
    ("e2e-test-images/busybox:1.36.1-1", E2eImage::Busybox),
    ("pause:3.10.2", E2eImage::Pause),
    ("pause:3.10", E2eImage::Pause),
];

/// The programs [`E2E_IMAGES`] are built from (`upstream/build.sh e2e-test` builds all three).
#[derive(Debug, Clone, Default)]
pub struct E2eTools {
    /// The suite's agnhost.
    pub agnhost: PathBuf,
    /// A static busybox built from busybox's own source with its default configuration, as the
    /// suite's busybox image has it; Debian's `/bin/busybox` when absent. (Debian's ash drops
    /// environment variables whose names are not shell identifiers, which the suite's env tests
    /// print.)
    pub busybox: Option<PathBuf>,
    /// A static curl for the agnhost image (upstream's is Alpine with curl; the lifecycle-hook
    /// tests run it); none when absent.
    pub curl: Option<PathBuf>,
}

/// What an end-to-end image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E2eImage {
    /// busybox alone.
    Busybox,
    /// busybox, curl and `/agnhost` (and `/agnhost-2`, a link to it), entrypoint `/agnhost`,
    /// command `pause`.
    Agnhost,
    /// busybox, curl and `/agnhost`, entrypoint `/agnhost pause`.
    Pause,
}

/// mock-eci's gRPC and admin ports on its address.
const MOCK_GRPC_PORT: u16 = 50051;
const MOCK_ADMIN_PORT: u16 = 8080;

/// Real mode could not start or left something behind.
#[derive(Debug, thiserror::Error)]
pub enum RealModeError {
    /// Something real mode needs is missing.
    #[error("`--runtime real` needs {0}")]
    Prerequisite(String),
    /// The network could not be set up or removed.
    #[error(transparent)]
    Net(#[from] local_net::LocalNetError),
    /// The registry did not start.
    #[error("start the image registry: {0}")]
    Registry(#[from] crate::registry::RegistryError),
    /// An image could not be built or pushed.
    #[error("the playground's images: {0}")]
    Image(#[from] images::ImageError),
    /// mock-eci could not be started or did not answer.
    #[error("mock-eci: {0}")]
    Mock(String),
    /// Something the run made is still there after it stopped.
    #[error("left behind after the stop: {0}")]
    Leftover(String),
}

/// What real mode runs beside the control plane.
#[derive(Debug)]
pub struct RealRuntime {
    network: LocalNetwork,
    groups: Block,
    prefix: String,
    registry: TestRegistry,
    mock: Process,
    runtime_dir: PathBuf,
    /// Held until the run ends (dropped last).
    _slot: Slot,
}

/// Where the locks of this machine's real-mode slots are (cleared at boot, as everything a
/// killed run leaves is).
const SLOTS_DIR: &str = "/run/virtual-node-eci-playground";
/// Where each slot's mock-eci keeps its runtime (images, groups' state, runtime records).
const RUNTIME_DIRS: &str = "/var/tmp/virtual-node-eci-playground";
/// At most this many real-mode playgrounds run on a machine at once.
const SLOTS: u32 = 32;

/// One of the machine's real-mode slots, held by a live playground: an advisory lock on its
/// file, which the kernel releases when the process ends, however it ends. The slot names
/// mock-eci's prefix and runtime directory, so a playground killed with -9 leaves its containers,
/// namespaces, interfaces, cgroups and mounts to the next playground in its slot: that one's
/// mock-eci finds them by the same prefix and directory at start and removes them. The lowest
/// free slot is taken, so one playground at a time always reuses the first.
#[derive(Debug)]
struct Slot {
    lock: std::fs::File,
    index: u32,
}

impl Slot {
    fn claim() -> Result<Self, RealModeError> {
        let io = |what: String| {
            move |e: std::io::Error| RealModeError::Prerequisite(format!("{what}: {e}"))
        };
        std::fs::create_dir_all(SLOTS_DIR).map_err(io(format!("a directory {SLOTS_DIR}")))?;
        for index in 0..SLOTS {
            let path = slot_lock(index);
            let file = open_lock_file(&path)?;
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Self { lock: file, index }),
                Err(rustix::io::Errno::WOULDBLOCK) => {}
                Err(errno) => {
                    return Err(io(format!("a lock on {}", path.display()))(errno.into()));
                }
            }
        }
        Err(RealModeError::Prerequisite(format!(
            "a free slot ({SLOTS} real-mode playgrounds run on this machine already)"
        )))
    }

    /// mock-eci's prefix (it owns the machine's objects whose names start with it): of one
    /// width, so that no slot's prefix starts another's.
    fn prefix(&self) -> String {
        format!("pg{:02}", self.index)
    }

    fn runtime_dir(&self) -> PathBuf {
        Path::new(RUNTIME_DIRS).join(self.prefix())
    }

    /// Two free /16 blocks (the host agent's, the groups'), recorded in this slot's lock file.
    ///
    /// A block's route appears only once its interface exists (the groups' bridge is mock-eci's,
    /// made seconds later), so the machine's routes alone would let two playgrounds starting
    /// together take the same block, and each would then reach the other's groups. The choice
    /// is therefore made under one machine-wide lock and leaves out the blocks recorded by the
    /// other live slots.
    async fn reserve_blocks(&self) -> Result<(Block, Block), RealModeError> {
        let io = |what: String| {
            move |e: std::io::Error| RealModeError::Prerequisite(format!("{what}: {e}"))
        };
        let path = Path::new(SLOTS_DIR).join("blocks.lock");
        let choosing = open_lock_file(&path)?;
        // Held for one `ip route` and a few file reads by whoever has it.
        rustix::fs::flock(&choosing, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|errno| io(format!("a lock on {}", path.display()))(errno.into()))?;
        let routes = local_net::ip(&["-4", "-o", "route", "show", "table", "all"]).await?;
        let mut taken = local_net::route_destinations(&routes);
        taken.extend(
            self.blocks_of_live_slots()
                .into_iter()
                .map(|block| (block.network(), 16)),
        );
        let (first, last) = PLAYGROUND_BLOCKS;
        let start = crate::cluster::random_in(0..=last - first);
        let blocks = local_net::free_blocks(&taken, first, last, start, 2)?;
        let record = local_net::blocks_record(&blocks);
        self.lock
            .set_len(0)
            .and_then(|()| {
                std::os::unix::fs::FileExt::write_all_at(&self.lock, record.as_bytes(), 0)
            })
            .map_err(io(format!("recording {record} in slot {}", self.index)))?;
        Ok((blocks[0], blocks[1]))
    }

    /// The blocks recorded by the slots other than this one whose playground is alive (its
    /// lock is held).
    fn blocks_of_live_slots(&self) -> Vec<Block> {
        (0..SLOTS)
            .filter(|index| *index != self.index)
            .filter_map(|index| {
                let path = slot_lock(index);
                let file = std::fs::File::open(&path).ok()?;
                let free =
                    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared)
                        .is_ok();
                (!free)
                    .then(|| std::fs::read_to_string(&path).ok())
                    .flatten()
            })
            .flat_map(|record| local_net::parse_blocks_record(&record))
            .collect()
    }
}

/// The lock file of slot `index`.
fn slot_lock(index: u32) -> PathBuf {
    Path::new(SLOTS_DIR).join(format!("pg{index:02}.lock"))
}

/// Opens (creating) a lock file, keeping what it holds.
fn open_lock_file(path: &Path) -> Result<std::fs::File, RealModeError> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| RealModeError::Prerequisite(format!("the lock file {}: {e}", path.display())))
}

/// The second octets of the 10.X.0.0/16 blocks playgrounds take. 10.213 and 10.215 are left to
/// mock-eci's sandbox and real-runtime suites, whose fixed networks come and go while they run.
const PLAYGROUND_BLOCKS: (u8, u8) = (216, 254);

/// What this machine lacks for real mode, if anything: root, runc, iproute2 or Debian's
/// busybox-static (found as mock-eci finds its OCI runtime).
pub fn missing_prerequisite() -> Option<String> {
    use mock_eci::service::runtime::{find_program, running_as_root};
    if !running_as_root() {
        return Some("root (it creates a network interface and runs containers with runc)".into());
    }
    ["runc", "ip", images::DEBIAN_BUSYBOX]
        .into_iter()
        .find(|program| find_program(Path::new(program)).is_none())
        .map(|program| format!("{program} (Debian: apt-get install runc iproute2 busybox-static)"))
}

impl RealRuntime {
    /// Checks the prerequisites, makes the network, starts the registry with the images and
    /// mock-eci in real mode (its files and log under `dir`). Undoes what it made on failure.
    pub async fn start(dir: &Path) -> Result<Self, RealModeError> {
        if let Some(missing) = missing_prerequisite() {
            return Err(RealModeError::Prerequisite(missing));
        }
        let slot = Slot::claim()?;
        let (hosts, groups) = slot.reserve_blocks().await?;
        let network = LocalNetwork::create(local_net::link_name(std::process::id()), hosts).await?;
        let prefix = slot.prefix();
        let started = async {
            let registry = TestRegistry::start(None).await?;
            let busybox = images::busybox()?;
            for name in IMAGES {
                images::push(&busybox, &format!("{}/{name}", registry.host()), None).await?;
            }
            let runtime_dir = slot.runtime_dir();
            let mock =
                start_mock(dir, &runtime_dir, (hosts, groups), &prefix, registry.host()).await?;
            Ok::<_, RealModeError>((registry, mock, runtime_dir))
        };
        match started.await {
            Ok((registry, mock, runtime_dir)) => Ok(Self {
                network,
                groups,
                prefix,
                registry,
                mock,
                runtime_dir,
                _slot: slot,
            }),
            Err(error) => {
                let _ = network.remove().await;
                Err(error)
            }
        }
    }

    /// The daemon's environment: mock-eci's gRPC API at its address.
    pub fn daemon_env(&self) -> Vec<(String, String)> {
        vec![("ECI_BACKEND".to_owned(), format!("grpc://{}", self.grpc()))]
    }

    /// mock-eci's gRPC `host:port`.
    pub fn grpc(&self) -> String {
        format!("{}:{MOCK_GRPC_PORT}", self.network.block().first_host())
    }

    /// mock-eci's admin URL.
    pub fn admin_url(&self) -> String {
        format!(
            "http://{}:{MOCK_ADMIN_PORT}",
            self.network.block().first_host()
        )
    }

    /// The host agent's pod network (the block the interface routes locally).
    pub fn pod_network(&self) -> std::net::Ipv4Addr {
        self.network.block().network()
    }

    /// `host:port` of the registry.
    pub fn registry(&self) -> &str {
        self.registry.host()
    }

    /// Pushes [`E2E_IMAGES`], built from `tools`.
    pub async fn push_e2e_images(&self, tools: &E2eTools) -> Result<(), RealModeError> {
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|source| images::ImageError::Io {
                what: format!(
                    "read {what} at {} (upstream/build.sh e2e-test)",
                    path.display()
                ),
                source,
            })
        };
        let mut layer = images::LayerBuilder::default();
        layer.file("agnhost", 0o755, &read(&tools.agnhost, "agnhost")?)?;
        // As upstream's image: the entrypoint tests run agnhost under a second name.
        layer.symlink("agnhost-2", "agnhost")?;
        if let Some(curl) = &tools.curl {
            layer.file("usr/bin/curl", 0o755, &read(curl, "curl")?)?;
        }
        let agnhost_layer = layer.finish()?;
        let busybox_binary = tools
            .busybox
            .as_deref()
            .unwrap_or(Path::new(images::DEBIAN_BUSYBOX));
        let layout = if tools.busybox.is_some() {
            images::Applets::AllInBin
        } else {
            images::Applets::Listed
        };
        let busybox_layer = images::busybox_layer(busybox_binary, layout)?;
        for (name, kind) in E2E_IMAGES {
            let image = match kind {
                E2eImage::Busybox => match &tools.busybox {
                    Some(binary) => images::busybox_from(binary)?,
                    None => images::busybox()?,
                },
                E2eImage::Agnhost | E2eImage::Pause => {
                    let (entrypoint, cmd) = if kind == E2eImage::Agnhost {
                        (vec!["/agnhost".to_owned()], Some(vec!["pause".to_owned()]))
                    } else {
                        (vec!["/agnhost".to_owned(), "pause".to_owned()], None)
                    };
                    let run = images::RunConfig {
                        entrypoint: Some(entrypoint),
                        cmd,
                        env: vec![images::DEFAULT_PATH.to_owned()],
                        ..images::RunConfig::default()
                    };
                    images::BuiltImage::from_tars(
                        &[busybox_layer.clone(), agnhost_layer.clone()],
                        &run,
                    )?
                }
            };
            images::push(&image, &format!("{}/{name}", self.registry()), None).await?;
        }
        Ok(())
    }

    /// The names this run's things carry on the machine: the interface, mock-eci's prefix.
    pub fn names(&self) -> (String, String) {
        (self.network.link().to_owned(), self.prefix.clone())
    }

    /// The groups' network.
    pub fn groups_cidr(&self) -> String {
        self.groups.cidr()
    }

    /// The eci-profile ConfigMap: pods the playground sends to virtual nodes (in namespaces
    /// labelled `virtual-node-affinity-injection=enabled` or, Kubernetes' end-to-end suite's,
    /// `e2e-run`, or labelled `alibabacloud.com/eci=true` themselves) pull from the plain-HTTP
    /// registry.
    pub fn eci_profile(&self) -> serde_json::Value {
        let effect = serde_json::json!({
            "annotations": {"k8s.aliyun.com/plain-http-registry": self.registry()},
        });
        let selectors = serde_json::json!([
            {
                "name": "playground-registry-namespaces",
                "namespaceSelector": {"matchLabels": {"virtual-node-affinity-injection": "enabled"}},
                "effect": effect,
            },
            {
                "name": "playground-registry-e2e",
                "namespaceSelector": {"matchExpressions": [{"key": "e2e-run", "operator": "Exists"}]},
                "effect": effect,
            },
            {
                "name": "playground-registry-pods",
                "objectSelector": {"matchLabels": {"alibabacloud.com/eci": "true"}},
                "effect": effect,
            },
        ]);
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "eci-profile", "namespace": "kube-system"},
            "data": {"selectors": selectors.to_string()},
        })
    }

    /// Stops mock-eci (it removes its groups and bridge), deletes the interface, and checks
    /// that no interface or network namespace of this run is left.
    pub async fn stop(mut self) -> Result<(), RealModeError> {
        if self.mock.terminate(Duration::from_secs(60)).await.is_none() {
            tracing::warn!("mock-eci did not stop within 60 s of SIGTERM; killed");
        }
        let (link, prefix) = self.names();
        let removed = self.network.remove().await;
        let links = local_net::link_names(&local_net::ip(&["-o", "link", "show"]).await?);
        let netns = local_net::ip(&["netns", "list"]).await.unwrap_or_default();
        let mut left: Vec<String> = links
            .into_iter()
            .filter(|name| *name == link || name.starts_with(&prefix))
            .map(|name| format!("interface {name}"))
            .collect();
        left.extend(
            netns
                .lines()
                .filter_map(|line| line.split_whitespace().next())
                .filter(|name| name.starts_with(&prefix))
                .map(|name| format!("network namespace {name}")),
        );
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
        removed?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(RealModeError::Leftover(left.join(", ")))
        }
    }
}

/// Starts mock-eci in real mode on `hosts`' first address, its groups on `groups`, its log in
/// `log_dir`, with `registry` as its Docker Hub mirror: a manifest naming `busybox` runs the
/// registry's `library/busybox`, as it would run Docker Hub's.
async fn start_mock(
    log_dir: &Path,
    runtime_dir: &Path,
    (hosts, groups): (Block, Block),
    prefix: &str,
    registry: &str,
) -> Result<Process, RealModeError> {
    let program = binary("mock-eci", "mock-eci").map_err(|e| RealModeError::Mock(e.to_string()))?;
    std::fs::create_dir_all(runtime_dir)
        .map_err(|e| RealModeError::Mock(format!("create {}: {e}", runtime_dir.display())))?;
    let address = hosts.first_host();
    let listen = format!("{address}:{MOCK_GRPC_PORT}");
    let args = [
        "--listen".to_owned(),
        listen.clone(),
        "--admin-listen".to_owned(),
        format!("{address}:{MOCK_ADMIN_PORT}"),
        "--runtime".to_owned(),
        "real".to_owned(),
        "--runtime-network".to_owned(),
        format!("{}/16", groups.first_host()),
        "--runtime-prefix".to_owned(),
        prefix.to_owned(),
        "--runtime-dir".to_owned(),
        runtime_dir.display().to_string(),
        "--restart-backoff".to_owned(),
        "2s".to_owned(),
        "--runtime-registry-mirror".to_owned(),
        format!("http://{registry}"),
    ];
    let mut process = Process::spawn(
        "mock-eci",
        &program,
        &args,
        &[("RUST_LOG".to_owned(), "info".to_owned())],
        log_dir,
    )
    .map_err(|e| RealModeError::Mock(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if tokio::net::TcpStream::connect(&listen).await.is_ok() {
            return Ok(process);
        }
        if let Some(status) = process.exit_status() {
            return Err(RealModeError::Mock(format!(
                "exited ({status}) before answering: {}",
                process.tail(20)
            )));
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = process.kill().await;
            return Err(RealModeError::Mock(format!(
                "no answer on {listen} within 60 s: {}",
                process.tail(20)
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mock-eci sweeps every object whose name starts with its prefix: no slot may sweep
    /// another's.
    #[test]
    fn no_slot_s_prefix_starts_another_s() {
        let prefixes: Vec<String> = (0..SLOTS)
            .map(|index| Slot {
                lock: tempfile::tempfile().unwrap(),
                index,
            })
            .map(|slot| slot.prefix())
            .collect();
        for (i, a) in prefixes.iter().enumerate() {
            assert!(a.len() <= 6, "mock-eci takes 1-6 characters: {a}");
            for (j, b) in prefixes.iter().enumerate() {
                assert!(i == j || !a.starts_with(b.as_str()), "{a} starts with {b}");
            }
        }
    }

    /// Two live playgrounds never share a slot (the lock is per open file, so this holds in
    /// one process too). Needs root (the locks are in /run), as real mode does.
    #[test]
    fn slots_held_at_once_differ() {
        let first = Slot::claim().unwrap();
        let second = Slot::claim().unwrap();
        assert_ne!(first.index, second.index);
    }

    /// Two playgrounds starting together take different blocks, though neither block has a
    /// route yet (the slots' records keep them apart).
    #[tokio::test]
    async fn blocks_reserved_at_once_differ() {
        let (first, second) = (Slot::claim().unwrap(), Slot::claim().unwrap());
        let (a, b) = first.reserve_blocks().await.unwrap();
        let (c, d) = second.reserve_blocks().await.unwrap();
        assert_ne!(a, b);
        for block in [c, d] {
            assert!(block != a && block != b, "{block:?} is also {a:?}/{b:?}");
            assert!((PLAYGROUND_BLOCKS.0..=PLAYGROUND_BLOCKS.1).contains(&block.second));
        }
        // A third playground reads the second's record.
        let third = Slot::claim().unwrap();
        assert!(third.blocks_of_live_slots().contains(&c));
    }
}
