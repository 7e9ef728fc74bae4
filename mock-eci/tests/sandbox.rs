//! The real sandbox (`mock_eci::sandbox`) on this machine: groups in their own network, UTS and
//! IPC namespaces, containers in their own PID namespaces run by the OCI runtime, and nothing
//! left behind once a group is deleted.
//!
//! Needs root, iproute2, util-linux, runc and Debian's busybox-static (the containers' root file
//! system is built here from /bin/busybox). Without them the tests fail, saying what to install.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mock_eci::sandbox::residue::Residue;
use mock_eci::sandbox::{
    ContainerSpec, Dns, Group, GroupSpec, MountSpec, Sandbox, SandboxConfig, VolumeSource,
    VolumeSpec,
};
use tokio::io::AsyncWriteExt;

const RUNTIME: &str = "runc";
const BUSYBOX: &str = "/bin/busybox";
/// A generous bound for anything the tests wait on.
const PATIENCE: Duration = Duration::from_secs(60);

/// Fails loudly, naming what is missing, instead of skipping.
fn preflight() {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map(|meta| meta.uid());
    assert!(
        uid.is_ok_and(|uid| uid == 0),
        "the sandbox tests need root (network namespaces, mounts, cgroups)"
    );
    let runtime = std::process::Command::new(RUNTIME)
        .arg("--version")
        .output();
    assert!(
        runtime.is_ok_and(|out| out.status.success()),
        "the OCI runtime `{RUNTIME}` is missing: apt-get install -y runc"
    );
    assert!(
        Path::new(BUSYBOX).is_file(),
        "{BUSYBOX} is missing: apt-get install -y busybox-static"
    );
    for tool in ["ip", "unshare"] {
        let found = std::process::Command::new(tool).arg("-V").output();
        assert!(
            found.is_ok_and(|out| out.status.success()),
            "`{tool}` is missing: apt-get install -y iproute2 util-linux"
        );
    }
}

/// A read-only root file system: busybox and its applets' links.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for sub in ["bin", "proc", "dev", "sys", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(sub)).expect("rootfs dir");
    }
    std::fs::copy(BUSYBOX, root.join("bin/busybox")).expect("copy busybox");
    let list = std::process::Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))
                .expect("applet link");
        }
    }
    root
}

struct Fixture {
    sandbox: Sandbox,
    config: SandboxConfig,
    rootfs: PathBuf,
    /// Fixed per prefix, so that a run after a failed one removes what that one left (mounts
    /// included) when it opens the sandbox on the same state directory.
    base: PathBuf,
    subnet: u8,
}

impl Fixture {
    /// A sandbox of its own: prefix `vt<subnet>`, network 10.213.<subnet>.0/24.
    async fn new(subnet: u8) -> Self {
        preflight();
        let base = std::env::temp_dir()
            .join("mock-eci-sandbox-tests")
            .join(format!("vt{subnet}"));
        let config = SandboxConfig {
            prefix: format!("vt{subnet}"),
            network: format!("10.213.{subnet}.1/24").parse().expect("network"),
            state_dir: base.join("sandbox"),
            runtime: RUNTIME.into(),
        };
        let sandbox = Sandbox::open(config.clone()).await.expect("sandbox opens");
        let _fresh = std::fs::remove_dir_all(base.join("rootfs"));
        let rootfs = busybox_rootfs(&base);
        Self {
            sandbox,
            config,
            rootfs,
            base,
            subnet,
        }
    }

    fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, host)
    }

    /// Closes the sandbox and removes the state directory.
    async fn finish(self) {
        self.sandbox.close().await.expect("close");
        std::fs::remove_dir_all(&self.base).expect("state directory removed");
    }

    async fn group(&self, id: &str, hostname: &str, host: u8) -> Group {
        let spec = GroupSpec {
            id: id.to_owned(),
            hostname: hostname.to_owned(),
            ip: self.ip(host),
            dns: Dns::default(),
            host_aliases: Vec::new(),
            volumes: Vec::new(),
            sysctls: Vec::new(),
        };
        self.sandbox.create_group(&spec).await.expect("group")
    }

    fn residue(&self) -> Residue {
        Residue::list(self.sandbox.prefix(), &self.config.state_dir)
    }
}

fn shell(name: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.to_owned(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: Vec::new(),
        working_dir: None,
        memory_bytes: Some(64 << 20),
        cpu_millis: Some(500),
        mounts: Vec::new(),
        user: (0, 0),
        read_only_root: false,
        termination_message_path: "/dev/termination-log".into(),
    }
}

/// The log's text lines, each checked to be `<RFC 3339> <stream> <F|P> <text>`.
fn log_texts(group: &Group, container: &str) -> Vec<String> {
    let text = std::fs::read_to_string(group.log_path(container)).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let at = parts.next().unwrap_or_default();
            assert!(
                at.parse::<jiff::Timestamp>().is_ok(),
                "timestamp of {line:?}"
            );
            assert!(
                matches!(parts.next(), Some("stdout" | "stderr")),
                "{line:?}"
            );
            assert!(matches!(parts.next(), Some("F" | "P")), "{line:?}");
            parts.next().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Waits (bounded) until the container's log holds `line`.
async fn wait_for_line(group: &Group, container: &str, line: &str) {
    let start = Instant::now();
    while !log_texts(group, container).iter().any(|l| l == line) {
        assert!(
            start.elapsed() < PATIENCE,
            "{container} never printed {line:?}: {:?}",
            log_texts(group, container)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_container_sees_the_groups_hostname_and_only_its_own_processes() {
    let fixture = Fixture::new(1).await;
    let mut group = fixture.group("eci-one", "web-0", 2).await;
    let sibling = "readlink /proc/self/ns/ipc; echo up; exec sleep 3600";
    group
        .start(&shell("sibling", sibling), &fixture.rootfs)
        .await
        .expect("sibling starts");
    wait_for_line(&group, "sibling", "up").await;
    let script = "hostname; cat /etc/hostname; grep -c web-0 /etc/hosts; \
                  readlink /proc/self/ns/ipc; ps -o pid,args; exit 3";
    group
        .start(&shell("main", script), &fixture.rootfs)
        .await
        .expect("main starts");
    let exit = group.wait("main").await.expect("main ends");
    assert_eq!(exit.code, 3);

    let lines = log_texts(&group, "main");
    assert_eq!(lines[..3], ["web-0", "web-0", "1"], "{lines:?}");
    let host_ipc = std::fs::read_link("/proc/self/ns/ipc").expect("host ipc ns");
    let sibling_ipc = &log_texts(&group, "sibling")[0];
    assert_eq!(&lines[3], sibling_ipc, "the group's containers share IPC");
    assert_ne!(
        lines[3],
        host_ipc.to_string_lossy(),
        "IPC is not the host's"
    );
    let processes: Vec<&String> = lines[5..].iter().collect();
    assert_eq!(lines[4].split_whitespace().next(), Some("PID"), "{lines:?}");
    assert_eq!(processes.len(), 2, "only sh and ps: {processes:?}");
    assert!(
        processes[0].trim_start().starts_with("1 sh -c"),
        "{processes:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("sleep")), "{lines:?}");

    group.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}

#[tokio::test]
async fn two_groups_see_neither_each_others_processes_nor_files_but_reach_each_other() {
    let fixture = Fixture::new(2).await;
    let mut server = fixture.group("eci-server", "server", 2).await;
    let mut client = fixture.group("eci-client", "client", 3).await;
    let serve = "echo mine > /tmp/server-only; echo listening; \
                 nc -l -p 7000 -e sh -c 'head -n 1 > /tmp/got'; cat /tmp/got";
    server
        .start(&shell("app", serve), &fixture.rootfs)
        .await
        .expect("server starts");
    wait_for_line(&server, "app", "listening").await;
    let call = format!(
        "for i in $(seq 300); do echo hello-from-client | nc -w 5 {} 7000 && break; sleep 0.1; done; \
         ls /tmp; ps -o args",
        fixture.ip(2)
    );
    client
        .start(&shell("app", &call), &fixture.rootfs)
        .await
        .expect("client starts");
    assert_eq!(client.wait("app").await.expect("client ends").code, 0);
    assert_eq!(server.wait("app").await.expect("server ends").code, 0);

    let heard = log_texts(&server, "app");
    assert!(heard.contains(&"hello-from-client".to_owned()), "{heard:?}");
    let seen = log_texts(&client, "app");
    assert!(!seen.iter().any(|l| l.contains("server-only")), "{seen:?}");
    assert!(!seen.iter().any(|l| l.contains("nc -l")), "{seen:?}");
    let header = seen.iter().position(|l| l == "COMMAND").expect("ps ran");
    for process in &seen[header + 1..] {
        // The client's shell, and ps itself (named by busybox's fork as `{ps} <parent argv>`
        // until it execs).
        assert!(
            process.contains("hello-from-client") || process == "ps -o args",
            "only the client's own processes: {seen:?}"
        );
    }

    server.delete(Duration::from_secs(1)).await.expect("delete");
    client.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}

/// Prints the first line a caller sends (nc's `-e` keeps the line from racing nc's own
/// end-of-input, which the container's empty stdin gives at once).
const LISTEN_7001: &str = "nc -l -p 7001 -e sh -c 'head -n 1 > /tmp/got'; cat /tmp/got";

#[tokio::test]
async fn the_host_reaches_a_group_at_its_address() {
    let fixture = Fixture::new(3).await;
    let mut group = fixture.group("eci-listener", "listener", 9).await;
    group
        .start(&shell("app", LISTEN_7001), &fixture.rootfs)
        .await
        .expect("starts");
    let start = Instant::now();
    let mut stream = loop {
        match tokio::net::TcpStream::connect((fixture.ip(9), 7001)).await {
            Ok(stream) => break stream,
            Err(error) => assert!(start.elapsed() < PATIENCE, "never connected: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stream.write_all(b"hello-from-host\n").await.expect("write");
    stream.shutdown().await.expect("shutdown");
    drop(stream);
    assert_eq!(group.wait("app").await.expect("ends").code, 0);
    assert_eq!(log_texts(&group, "app"), ["hello-from-host"]);
    group.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}

#[tokio::test]
async fn stop_sends_sigterm_then_sigkill_after_the_grace_period() {
    let fixture = Fixture::new(4).await;
    let mut group = fixture.group("eci-stop", "stop", 2).await;
    let polite = "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.1; done";
    let stubborn = "trap '' TERM; echo up; while :; do sleep 0.1; done";
    for (name, script) in [("polite", polite), ("stubborn", stubborn)] {
        group
            .start(&shell(name, script), &fixture.rootfs)
            .await
            .expect("starts");
        wait_for_line(&group, name, "up").await;
    }
    let grace = Duration::from_secs(2);
    let polite_exit = group.stop("polite", PATIENCE).await.expect("stops");
    assert_eq!(polite_exit.code, 0, "it exited on SIGTERM by itself");
    assert_eq!(log_texts(&group, "polite"), ["up", "bye"]);

    let start = Instant::now();
    let stubborn_exit = group.stop("stubborn", grace).await.expect("stops");
    assert_eq!(stubborn_exit.code, 128 + 9, "killed by SIGKILL");
    assert!(start.elapsed() >= grace, "it had its grace period");

    let failing = shell("failing", "exit 7");
    group
        .start(&failing, &fixture.rootfs)
        .await
        .expect("starts");
    assert_eq!(group.wait("failing").await.expect("ends").code, 7);
    group.delete(grace).await.expect("delete");
    fixture.finish().await;
}

#[tokio::test]
async fn deleting_a_group_leaves_no_process_mount_namespace_interface_or_cgroup() {
    let fixture = Fixture::new(5).await;
    let before = fixture.residue();
    assert_eq!(before.links.len(), 1, "only the bridge: {before:?}");
    let mut group = fixture.group("eci-leak", "leak", 2).await;
    let stubborn = "trap '' TERM; echo up; while :; do sleep 0.1; done";
    for (name, script) in [
        ("stubborn", stubborn),
        ("plain", "echo up; exec sleep 3600"),
    ] {
        group
            .start(&shell(name, script), &fixture.rootfs)
            .await
            .expect("starts");
        wait_for_line(&group, name, "up").await;
    }
    let during = fixture.residue();
    assert_eq!(during.netns.len(), 1, "{during:?}");
    assert_eq!(during.links.len(), 2, "bridge and veth: {during:?}");
    assert_eq!(
        during.mounts.len(),
        3,
        "two roots and the IPC namespace: {during:?}"
    );
    assert!(!during.cgroups.is_empty(), "{during:?}");
    assert!(during.processes.len() >= 2, "{during:?}");

    group.delete(Duration::from_secs(1)).await.expect("delete");
    let after = fixture.residue();
    assert_eq!(after, before, "left behind by the group");
    for pid in &during.processes {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived its group"
        );
    }
    let prefix = fixture.sandbox.prefix().clone();
    let state_dir = fixture.config.state_dir.clone();
    fixture.finish().await;
    let closed = Residue::list(&prefix, &state_dir);
    assert!(closed.is_empty(), "left behind by the sandbox: {closed:?}");
}

#[tokio::test]
async fn reopening_after_a_crash_removes_what_the_last_run_left() {
    let fixture = Fixture::new(6).await;
    let mut group = fixture.group("eci-crash", "crash", 2).await;
    let stubborn = "trap '' TERM; echo up; while :; do sleep 0.1; done";
    group
        .start(&shell("stubborn", stubborn), &fixture.rootfs)
        .await
        .expect("starts");
    wait_for_line(&group, "stubborn", "up").await;
    let during = fixture.residue();
    assert_eq!(during.netns.len(), 1, "{during:?}");
    assert!(!during.processes.is_empty(), "{during:?}");

    // The crash: nothing is deleted, the handles are just gone.
    let Fixture {
        sandbox,
        config,
        rootfs: _rootfs,
        base,
        subnet: _,
    } = fixture;
    drop(group);
    drop(sandbox);
    let reopened = Sandbox::open(config.clone()).await.expect("reopens");
    let after = Residue::list(reopened.prefix(), &config.state_dir);
    let bridge_only: BTreeSet<String> = ["vt60".to_owned()].into();
    assert_eq!(after.links, bridge_only, "{after:?}");
    assert!(after.netns.is_empty(), "{after:?}");
    assert!(after.mounts.is_empty(), "{after:?}");
    assert!(after.cgroups.is_empty(), "{after:?}");
    assert!(after.processes.is_empty(), "{after:?}");
    for pid in &during.processes {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived the crash clean-up"
        );
    }
    reopened.close().await.expect("close");
    std::fs::remove_dir_all(&base).expect("state directory removed");
}

/// The cgroup files holding a container's memory and CPU limits, in whichever hierarchy the
/// machine mounts (v1 controllers or the unified one).
fn limit_files(id: &str) -> (PathBuf, PathBuf) {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("memory").is_dir() {
        (
            root.join("memory").join(id).join("memory.limit_in_bytes"),
            root.join("cpu").join(id).join("cpu.cfs_quota_us"),
        )
    } else {
        (
            root.join(id).join("memory.max"),
            root.join(id).join("cpu.max"),
        )
    }
}

#[tokio::test]
async fn memory_and_cpu_limits_reach_the_cgroup_and_memory_is_enforced() {
    let fixture = Fixture::new(7).await;
    let limits = fixture.sandbox.limits();
    let mut group = fixture.group("eci-limits", "limits", 2).await;
    let idle = shell("idle", "echo up; exec sleep 3600");
    group.start(&idle, &fixture.rootfs).await.expect("starts");
    wait_for_line(&group, "idle", "up").await;
    let (memory, cpu) = limit_files("vt7-eci-limits-idle");
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    if limits.memory {
        assert_eq!(
            read(&memory).trim(),
            (64u64 << 20).to_string(),
            "{memory:?}"
        );
    } else {
        assert!(!read(&memory).contains(&(64u64 << 20).to_string()));
    }
    if limits.cpu {
        // 500 millicores: 50 ms in every 100 ms period.
        assert!(read(&cpu).starts_with("50000"), "{cpu:?}: {}", read(&cpu));
    }
    if limits.memory {
        // 128 MiB in one buffer, under a 64 MiB limit: the kernel's OOM killer ends it.
        let hungry = shell(
            "hungry",
            "exec dd if=/dev/zero of=/dev/null bs=128M count=1",
        );
        group.start(&hungry, &fixture.rootfs).await.expect("starts");
        assert_eq!(group.wait("hungry").await.expect("ends").code, 128 + 9);
    }
    group.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}

#[tokio::test]
async fn bad_input_is_refused_and_leaves_nothing() {
    let fixture = Fixture::new(9).await;
    let before = fixture.residue();
    let good = GroupSpec {
        id: "eci-bad".to_owned(),
        hostname: "bad".to_owned(),
        ip: fixture.ip(2),
        dns: Dns::default(),
        host_aliases: Vec::new(),
        volumes: Vec::new(),
        sysctls: Vec::new(),
    };
    let alias = mock_eci::sandbox::HostAlias {
        ip: Ipv4Addr::new(10, 0, 0, 1),
        hostnames: vec!["db\n10.0.0.2 evil".to_owned()],
    };
    let cases = [
        GroupSpec {
            id: "../../etc".to_owned(),
            ..good.clone()
        },
        GroupSpec {
            hostname: "a;reboot".to_owned(),
            ..good.clone()
        },
        GroupSpec {
            ip: Ipv4Addr::new(127, 0, 0, 2),
            ..good.clone()
        },
        GroupSpec {
            dns: Dns {
                searches: vec!["x\nnameserver 1.2.3.4".to_owned()],
                ..Dns::default()
            },
            ..good.clone()
        },
        GroupSpec {
            host_aliases: vec![alias],
            ..good.clone()
        },
    ];
    for spec in &cases {
        let refused = fixture.sandbox.create_group(spec).await;
        assert!(refused.is_err(), "{spec:?} was accepted");
        assert_eq!(fixture.residue(), before, "{spec:?} left something");
    }
    let mut group = fixture.sandbox.create_group(&good).await.expect("group");
    let mut relative = shell("app", "true");
    relative.working_dir = Some("srv".to_owned());
    assert!(group.start(&relative, &fixture.rootfs).await.is_err());
    assert!(
        !group.dir().join("containers/app").exists(),
        "nothing of it is left"
    );
    let missing_root = fixture.rootfs.join("missing");
    assert!(
        group
            .start(&shell("app", "true"), &missing_root)
            .await
            .is_err()
    );
    assert!(
        !group.dir().join("containers/app").exists(),
        "nor of the unmountable one"
    );
    let during = fixture.residue();
    assert_eq!(during.mounts.len(), 1, "the IPC namespace only: {during:?}");
    let mut traversal = shell("../app", "true");
    traversal.working_dir = None;
    assert!(group.start(&traversal, &fixture.rootfs).await.is_err());
    group.delete(Duration::from_secs(1)).await.expect("delete");
    assert_eq!(
        fixture.residue(),
        before,
        "left behind by a refused container"
    );
    fixture.finish().await;
}

/// A tenant's container plants a symbolic link to / in a shared volume; another container of
/// the group mounts it as its SubPath. The link is refused, nothing of the host is mounted, and
/// a plain sub path still mounts.
#[tokio::test]
async fn a_sub_path_cannot_follow_a_link_out_of_its_volume() {
    let fixture = Fixture::new(8).await;
    let before = fixture.residue();
    let spec = GroupSpec {
        id: "eci-subpath".to_owned(),
        hostname: "subpath".to_owned(),
        ip: fixture.ip(2),
        dns: Dns::default(),
        host_aliases: Vec::new(),
        volumes: vec![VolumeSpec {
            name: "shared".to_owned(),
            source: VolumeSource::EmptyDir {
                memory: false,
                size_limit: None,
            },
        }],
        sysctls: Vec::new(),
    };
    let mut group = fixture.sandbox.create_group(&spec).await.expect("group");
    let mount = |sub_path: &str| MountSpec {
        volume: "shared".to_owned(),
        path: "/data".to_owned(),
        sub_path: sub_path.to_owned(),
        read_only: false,
    };
    let mut planter = shell(
        "planter",
        "ln -s / /data/escape; mkdir -p /data/real; echo inside > /data/real/note; echo planted",
    );
    planter.mounts = vec![mount("")];
    group
        .start(&planter, &fixture.rootfs)
        .await
        .expect("planter starts");
    assert_eq!(group.wait("planter").await.expect("planter ends").code, 0);

    let mut escaper = shell("escaper", "ls /data/etc/passwd && echo escaped");
    escaper.mounts = vec![mount("escape")];
    let refused = group.start(&escaper, &fixture.rootfs).await;
    let message = format!("{:?}", refused.expect_err("the link is refused"));
    assert!(message.contains("no links"), "{message}");
    let escape_mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|line| line.contains("escaper"))
        .map(str::to_owned)
        .collect();
    assert!(escape_mounts.is_empty(), "{escape_mounts:?}");

    let mut reader = shell("reader", "cat /data/note");
    reader.mounts = vec![mount("real")];
    group
        .start(&reader, &fixture.rootfs)
        .await
        .expect("reader starts");
    assert_eq!(group.wait("reader").await.expect("reader ends").code, 0);
    assert_eq!(log_texts(&group, "reader"), ["inside"]);

    group.delete(Duration::from_secs(1)).await.expect("delete");
    assert_eq!(fixture.residue(), before, "nothing left but the bridge");
    fixture.finish().await;
}

#[tokio::test]
async fn an_exit_is_seen_only_once_the_log_holds_all_of_the_output() {
    let fixture = Fixture::new(10).await;
    let mut group = fixture.group("eci-chatty", "chatty", 2).await;
    group
        .start(&shell("main", "seq 1 100000"), &fixture.rootfs)
        .await
        .expect("main starts");
    // Waits cut short again and again, as the runtime's worker cuts them when its plan
    // changes: whenever the exit shows, the whole output is in the log.
    let start = Instant::now();
    while group.exited().is_empty() {
        assert!(start.elapsed() < PATIENCE, "main never ended");
        let _ = tokio::time::timeout(Duration::from_millis(1), group.wait_any()).await;
    }
    let lines = log_texts(&group, "main");
    assert_eq!(
        (lines.len(), lines.last().map(String::as_str)),
        (100_000, Some("100000"))
    );
    group.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}

#[tokio::test]
async fn a_non_root_run_leaves_its_termination_message_and_a_new_run_starts_without_it() {
    let fixture = Fixture::new(11).await;
    let mut group = fixture.group("eci-message", "message", 2).await;
    let mut writer = shell(
        "writer",
        "echo line one; echo -n DONE > /dev/termination-custom-log",
    );
    writer.user = (65534, 65534);
    writer.termination_message_path = "/dev/termination-custom-log".into();
    group.start(&writer, &fixture.rootfs).await.expect("starts");
    let exit = group.wait("writer").await.expect("ends");
    assert_eq!(exit.code, 0, "a non-root user can write the message file");
    assert_eq!(group.termination_message("writer", 4096), b"DONE");
    assert_eq!(
        group.termination_message("writer", 2),
        b"NE",
        "the file's tail"
    );
    assert_eq!(
        render_cri(&group.log_tail("writer", 1 << 20), 10),
        "line one\n"
    );
    // The next run of the container starts with an empty file.
    group.remove_container("writer").await.expect("removed");
    let mut silent = shell("writer", "exit 3");
    silent.termination_message_path = "/dev/termination-custom-log".into();
    group
        .start(&silent, &fixture.rootfs)
        .await
        .expect("starts again");
    assert_eq!(group.wait("writer").await.expect("ends").code, 3);
    assert!(group.termination_message("writer", 4096).is_empty());
    group.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}

/// The text of a CRI log's last `tail` lines.
fn render_cri(log: &str, tail: usize) -> String {
    mock_eci::engine::logs::render_cri(
        log,
        mock_eci::engine::logs::LogQuery {
            since: None,
            tail,
            limit_bytes: None,
            timestamps: false,
        },
    )
}

#[tokio::test]
async fn a_groups_sysctls_are_set_in_its_namespaces_and_not_the_hosts() {
    let fixture = Fixture::new(12).await;
    let host_before = std::fs::read_to_string("/proc/sys/kernel/shm_rmid_forced").expect("host");
    let spec = GroupSpec {
        id: "eci-sysctl".to_owned(),
        hostname: "sysctl".to_owned(),
        ip: fixture.ip(2),
        dns: Dns::default(),
        host_aliases: Vec::new(),
        volumes: Vec::new(),
        sysctls: vec![
            ("kernel.shm_rmid_forced".to_owned(), "1".to_owned()),
            (
                "net.ipv4.ip_unprivileged_port_start".to_owned(),
                "80".to_owned(),
            ),
        ],
    };
    let mut group = fixture.sandbox.create_group(&spec).await.expect("group");
    let reader = shell(
        "reader",
        "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/net/ipv4/ip_unprivileged_port_start",
    );
    group.start(&reader, &fixture.rootfs).await.expect("starts");
    assert_eq!(group.wait("reader").await.expect("ends").code, 0);
    assert_eq!(log_texts(&group, "reader"), ["1", "80"]);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/shm_rmid_forced").expect("host"),
        host_before,
        "the host's own value is untouched"
    );
    group.delete(Duration::from_secs(1)).await.expect("delete");
    fixture.finish().await;
}
