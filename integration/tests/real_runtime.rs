//! mock-eci with `--runtime real`, through its gRPC API: container groups really run, from the
//! busybox image the project builds offline, pulled from a real registry on loopback. A
//! container's exit code, host name, environment and output come back as ECI reports them; a
//! missing image is ErrImagePull with a Failed event; exec runs in the container (its host
//! name, processes and files; stdin, TTY, exit code); volumes are mounted (ConfigFileVolume
//! files with their modes, a shared EmptyDir, a tmpfs; an UpdateContainerGroup of the files
//! reaches the running container without a restart); containers run as their
//! SecurityContext or their image's User; probes run (a failing liveness probe restarts the
//! container, a readiness probe gates `Ready`) and lifecycle hooks too (preStop before the
//! stop, a failing postStart kills the container); a cloud disk's and a NAS path's content
//! outlives the group that wrote it; the official Python SDK reads back, through the OpenAPI
//! front, what a group's processes did, and its whole conformance run passes; a deleted group, a crash loop and a mock-eci killed
//! with -9 then started again leave no process, network namespace, interface, mount or cgroup
//! behind.
//!
//! Needs root and runc (as the sandbox tests of mock-eci do). Each test runs its own mock-eci
//! with its own object prefix and network, so they may run in parallel.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eci_proto::v20180808::eci_client::EciClient;
use eci_proto::v20180808::{
    ConfigFileToPath, ConfigFileVolume, Container, ContainerGroup, ContainerSecurityContext,
    CreateContainerGroupRequest, DeleteContainerGroupRequest, DescribeContainerGroupsRequest,
    DescribeContainerLogRequest, EmptyDirVolume, EnvironmentVar, ExecAction,
    ExecContainerCommandRequest, LifecycleHandler, Probe, UpdateContainerGroupRequest, Volume,
    VolumeMount,
};
use integration::images;
use integration::process::{Process, binary, free_port};
use integration::registry::TestRegistry;
use tonic::transport::Channel;

const REGION: &str = "cn-hangzhou";
/// The AccessKey of the OpenAPI front, when a test serves one.
const ACCESS_KEY: (&str, &str) = ("real-runtime-id", "real-runtime-secret");

/// What a test adds to mock-eci's usual flags.
#[derive(Debug, Default, Clone, Copy)]
struct Extras {
    /// Keep the groups in `<dir>/state.json` across restarts.
    state_file: bool,
    /// Serve the OpenAPI (HTTPS, signed) too, its CA written to `<dir>/openapi-tls/ca.pem`.
    openapi: bool,
}

/// A registry holding busybox and a mock-eci in real mode pulling from it.
struct RealMock {
    client: EciClient<Channel>,
    registry: TestRegistry,
    busybox: String,
    prefix: &'static str,
    runtime_dir: PathBuf,
    /// The admin listener, which serves the exec sessions.
    admin: String,
    process: Process,
    /// Its flags and gRPC address, to start it again.
    args: Vec<String>,
    listen: String,
    /// The OpenAPI front's address and CA file, when it serves one.
    openapi: Option<(String, PathBuf)>,
    _dir: tempfile::TempDir,
}

impl RealMock {
    async fn start(prefix: &'static str, network: &str) -> Self {
        Self::start_with(prefix, network, Extras::default()).await
    }

    async fn start_with(prefix: &'static str, network: &str, extras: Extras) -> Self {
        let registry = TestRegistry::start(None)
            .await
            .expect("the registry starts");
        let busybox = format!("{}/library/busybox:1.35", registry.host());
        images::push(&images::busybox().expect("busybox builds"), &busybox, None)
            .await
            .expect("busybox is pushed");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let runtime_dir = dir.path().join("runtime");
        let port = free_port().expect("a free port");
        let listen = format!("127.0.0.1:{port}");
        let admin = format!("127.0.0.1:{}", free_port().expect("a free port"));
        let mut args: Vec<String> = [
            "--listen",
            &listen,
            "--admin-listen",
            &admin,
            "--no-rate-limits",
            "--scheduling-delay",
            "100ms",
            "--provisioning-delay",
            "300ms",
            "--restart-backoff",
            "1s",
            "--runtime",
            "real",
            "--runtime-network",
            network,
            "--runtime-prefix",
            prefix,
            "--runtime-dir",
            runtime_dir.to_str().expect("utf-8 path"),
        ]
        .map(str::to_owned)
        .to_vec();
        if extras.state_file {
            args.push("--state-file".into());
            let path = dir.path().join("state.json");
            args.push(path.to_str().expect("utf-8 path").to_owned());
        }
        let openapi = extras.openapi.then(|| {
            let addr = format!("127.0.0.1:{}", free_port().expect("a free port"));
            let tls = dir.path().join("openapi-tls");
            args.extend([
                "--openapi-listen".into(),
                addr.clone(),
                "--openapi-tls-dir".into(),
                tls.to_str().expect("utf-8 path").to_owned(),
                "--openapi-access-key-id".into(),
                ACCESS_KEY.0.into(),
                "--openapi-access-key-secret".into(),
                ACCESS_KEY.1.into(),
            ]);
            (addr, tls.join("ca.pem"))
        });
        let (process, client) = Self::spawn("mock-eci", &args, dir.path(), &listen).await;
        Self {
            client,
            registry,
            busybox,
            prefix,
            runtime_dir,
            admin,
            process,
            args,
            listen,
            openapi,
            _dir: dir,
        }
    }

    async fn spawn(
        name: &str,
        args: &[String],
        dir: &Path,
        listen: &str,
    ) -> (Process, EciClient<Channel>) {
        let mut process = Process::spawn(
            name,
            &binary("mock-eci", "mock-eci").expect("the mock-eci binary"),
            args,
            &[("RUST_LOG".into(), "info".into())],
            dir,
        )
        .expect("mock-eci starts");
        let endpoint = format!("http://{listen}");
        // Generous: a start after a crash first sweeps what the crashed run left.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(client) = EciClient::connect(endpoint.clone()).await {
                return (process, client);
            }
            // A start that failed says why in its log; waiting on would only hide it.
            if let Some(status) = process.exit_status() {
                panic!(
                    "{name} exited ({status}) before answering:\n{}",
                    process.tail(40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not answer within 120 s:\n{}",
                process.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts mock-eci again, with the same flags, after [`Process::kill`].
    async fn restart(&mut self) {
        let dir = self._dir.path().to_owned();
        let (process, client) =
            Self::spawn("mock-eci-restarted", &self.args, &dir, &self.listen).await;
        self.process = process;
        self.client = client;
    }

    fn request(&self, name: &str, container: Container) -> CreateContainerGroupRequest {
        CreateContainerGroupRequest {
            region_id: REGION.into(),
            security_group_id: "sg-test".into(),
            v_switch_id: "vsw-test".into(),
            container_group_name: name.into(),
            restart_policy: "Never".into(),
            plain_http_registry: self.registry.host().into(),
            container: vec![container],
            ..CreateContainerGroupRequest::default()
        }
    }

    fn busybox(&self, name: &str, script: &str) -> Container {
        Container {
            name: name.into(),
            image: self.busybox.clone(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..Container::default()
        }
    }

    async fn create(&mut self, request: CreateContainerGroupRequest) -> String {
        self.client
            .create_container_group(request)
            .await
            .expect("create succeeds")
            .into_inner()
            .container_group_id
    }

    async fn describe(&mut self, id: &str) -> Option<ContainerGroup> {
        let request = DescribeContainerGroupsRequest {
            region_id: REGION.into(),
            container_group_ids: vec![id.to_owned()],
            with_event: true,
            ..DescribeContainerGroupsRequest::default()
        };
        self.client
            .describe_container_groups(request)
            .await
            .expect("describe succeeds")
            .into_inner()
            .container_groups
            .into_iter()
            .next()
    }

    async fn delete(&mut self, id: &str) {
        self.client
            .delete_container_group(DeleteContainerGroupRequest {
                region_id: REGION.into(),
                container_group_id: id.to_owned(),
                ..DeleteContainerGroupRequest::default()
            })
            .await
            .expect("delete succeeds");
    }

    /// Waits until the group is no longer listed (90 s at most).
    async fn wait_gone(&mut self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while self.describe(id).await.is_some() {
            assert!(Instant::now() < deadline, "{id} is still listed after 90 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the group satisfies `check`, describing it every 200 ms.
    async fn wait_group(
        &mut self,
        what: &str,
        id: &str,
        check: impl Fn(&ContainerGroup) -> bool,
    ) -> ContainerGroup {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let group = self.describe(id).await;
            if let Some(group) = group.as_ref().filter(|group| check(group)) {
                return group.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 90 s; last seen {group:#?}\nmock-eci's log:\n{}",
                self.process.tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn log(&mut self, id: &str, container: &str, timestamps: bool) -> String {
        self.log_of(id, container, timestamps, false).await
    }

    async fn log_of(&mut self, id: &str, container: &str, timestamps: bool, last: bool) -> String {
        let request = DescribeContainerLogRequest {
            region_id: REGION.into(),
            container_group_id: id.into(),
            container_name: container.into(),
            timestamps,
            last_time: last,
            ..DescribeContainerLogRequest::default()
        };
        self.client
            .describe_container_log(request)
            .await
            .expect("describe log succeeds")
            .into_inner()
            .content
    }

    fn exec_request(
        id: &str,
        container: &str,
        command: &[&str],
        tty: bool,
        sync: bool,
    ) -> ExecContainerCommandRequest {
        ExecContainerCommandRequest {
            region_id: REGION.into(),
            container_group_id: id.into(),
            container_name: container.into(),
            command: command.iter().map(|word| (*word).to_owned()).collect(),
            tty,
            stdin: Some(true),
            sync,
        }
    }

    /// ExecContainerCommand with `Sync`: the command's output.
    async fn exec_sync(&mut self, id: &str, container: &str, command: &[&str]) -> String {
        self.client
            .exec_container_command(Self::exec_request(id, container, command, false, true))
            .await
            .expect("exec succeeds")
            .into_inner()
            .sync_response
    }

    /// Waits until `command` run in the container prints `expected`, running it every 200 ms.
    async fn wait_output(
        &mut self,
        what: &str,
        id: &str,
        container: &str,
        command: &[&str],
        expected: &str,
    ) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let output = self.exec_sync(id, container, command).await;
            if output == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 90 s; last printed {output:?}\nmock-eci's log:\n{}",
                self.process.tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// An interactive exec: sends `input` (then closes stdin), and a terminal size first
    /// with `tty`; returns what came back.
    async fn exec_session(
        &mut self,
        id: &str,
        container: &str,
        command: &[&str],
        tty: bool,
        input: &[u8],
    ) -> Session {
        use futures::{SinkExt as _, StreamExt as _};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let uri = self
            .client
            .exec_container_command(Self::exec_request(id, container, command, tty, false))
            .await
            .expect("exec succeeds")
            .into_inner()
            .web_socket_uri;
        assert!(
            uri.starts_with(&format!("ws://{}/exec/", self.admin)),
            "{uri}"
        );
        let mut request = uri.into_client_request().expect("a WebSocket request");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "v5.channel.k8s.io".parse().expect("a header value"),
        );
        let (mut socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .expect("the session connects");
        let mut frames = Vec::new();
        if tty {
            frames.push([&[4u8][..], br#"{"Width":100,"Height":30}"#].concat());
        }
        if !input.is_empty() {
            frames.push([&[0u8][..], input].concat());
        }
        frames.push(vec![255, 0]);
        for frame in frames {
            socket
                .send(Message::Binary(frame.into()))
                .await
                .expect("the frame is sent");
        }
        let mut session = Session::default();
        let read = async {
            while let Some(Ok(message)) = socket.next().await {
                let Message::Binary(data) = message else {
                    continue;
                };
                match data.split_first() {
                    Some((1, rest)) => session.stdout.push_str(&String::from_utf8_lossy(rest)),
                    Some((2, rest)) => session.stderr.push_str(&String::from_utf8_lossy(rest)),
                    Some((3, rest)) => {
                        session.status = serde_json::from_slice(rest).expect("a JSON status");
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the session ends within 60 s");
        session
    }

    /// Stops mock-eci with SIGTERM: it stops every group and removes its bridge; nothing of
    /// its runtime is left on the machine.
    async fn stop(mut self) {
        let status = self.process.terminate(Duration::from_secs(60)).await;
        assert!(
            status.is_some_and(|status| status.success()),
            "mock-eci stops cleanly: {status:?}\n{}",
            self.process.tail(40)
        );
        assert_eq!(
            self.residue(),
            Residue::none(),
            "nothing is left after a stop"
        );
        let bridge = format!("{}0", self.prefix);
        assert!(
            command_lines("ip", &["-o", "link", "show"])
                .iter()
                .all(|line| !line.contains(&format!(": {bridge}:"))),
            "the bridge {bridge} is removed"
        );
    }

    /// What of this mock-eci's runtime exists on the machine now.
    fn residue(&self) -> Residue {
        Residue::list(self.prefix, &self.runtime_dir)
    }
}

/// What an interactive exec sent back.
#[derive(Debug, Default)]
struct Session {
    stdout: String,
    stderr: String,
    status: serde_json::Value,
}

impl Session {
    /// The exit code the final status carries (0 for `Success`).
    fn exit_code(&self) -> Option<i32> {
        if self.status["status"] == "Success" {
            return Some(0);
        }
        self.status["details"]["causes"][0]["message"]
            .as_str()?
            .parse()
            .ok()
    }
}

/// The machine objects a prefix names (besides its bridge) and the mounts under a directory.
#[derive(Debug, PartialEq, Eq)]
struct Residue {
    processes: Vec<String>,
    netns: Vec<String>,
    links: Vec<String>,
    mounts: Vec<String>,
    cgroups: Vec<String>,
}

impl Residue {
    fn list(prefix: &str, dir: &Path) -> Self {
        let netns = command_lines("ip", &["netns", "list"])
            .into_iter()
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .filter(|name| name.starts_with(&format!("{prefix}-")))
            .collect();
        let bridge = format!("{prefix}0");
        let links = command_lines("ip", &["-o", "link", "show"])
            .into_iter()
            .filter_map(|line| {
                let name = line.split(": ").nth(1)?.split('@').next()?.to_owned();
                (name.starts_with(prefix) && name != bridge).then_some(name)
            })
            .collect();
        let dir = dir.to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .filter(|line| line.contains(&dir))
            .map(str::to_owned)
            .collect();
        let cgroups = command_lines(
            "find",
            &[
                "/sys/fs/cgroup",
                "-maxdepth",
                "3",
                "-name",
                &format!("{prefix}-*"),
            ],
        );
        Self {
            processes: processes_with(&format!("MARKER=leak-{prefix}")),
            netns,
            links,
            mounts,
            cgroups,
        }
    }

    fn none() -> Self {
        Self {
            processes: Vec::new(),
            netns: Vec::new(),
            links: Vec::new(),
            mounts: Vec::new(),
            cgroups: Vec::new(),
        }
    }
}

fn command_lines(program: &str, args: &[&str]) -> Vec<String> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("{program} runs: {error}"));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Command lines of the processes whose environment holds `marker` (`NAME=value`).
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|byte| *byte == 0)
            .any(|var| var == marker.as_bytes())
        {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

async fn wait_for<T, F>(what: &str, limit: Duration, mut attempt: impl FnMut() -> F) -> T
where
    F: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn container_state(group: &ContainerGroup) -> (String, Option<i32>, String) {
    let state = group.containers[0]
        .current_state
        .clone()
        .unwrap_or_default();
    (state.state, state.exit_code, state.reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_runs_with_the_group_s_host_name_and_env_and_its_exit_code_and_output_come_back()
 {
    let mut mock = RealMock::start("rra", "10.215.1.1/24").await;
    let mut container = mock.busybox(
        "main",
        "hostname; echo hello $FOO; echo to-stderr >&2; exit 3",
    );
    container.environment_var = vec![EnvironmentVar {
        key: "FOO".into(),
        value: "bar".into(),
        field_ref: None,
    }];
    let mut request = mock.request("exits", container);
    request.host_name = "web-0".into();
    let id = mock.create(request).await;

    let group = mock
        .wait_group("the container terminates", &id, |group| {
            container_state(group).0 == "Terminated"
        })
        .await;
    assert_eq!(
        container_state(&group),
        ("Terminated".into(), Some(3), "Error".into())
    );
    assert_eq!(group.status, "Failed", "restart policy Never, exit 3");
    let ip: std::net::Ipv4Addr = group.intranet_ip.parse().expect("an IPv4 IntranetIp");
    assert!(
        ip.octets()[..3] == [10, 215, 1] && ip.octets()[3] > 1,
        "the IntranetIp {ip} comes from the sandbox network, not the bridge's address"
    );
    let state = group.containers[0].current_state.clone().unwrap();
    assert!(
        !state.start_time.is_empty() && !state.finish_time.is_empty(),
        "{state:?}"
    );
    assert!(
        group.events.iter().any(|e| e.reason == "Started"),
        "{:?}",
        group.events
    );

    let log = mock.log(&id, "main", false).await;
    // stdout and stderr are read apart, so only each stream's own order is kept.
    let stdout: Vec<&str> = log.lines().filter(|line| *line != "to-stderr").collect();
    assert_eq!(
        stdout,
        ["web-0", "hello bar"],
        "the container's own output: {log:?}"
    );
    assert_eq!(log.lines().count(), 3, "and its stderr: {log:?}");
    let stamped = mock.log(&id, "main", true).await;
    for line in stamped.lines() {
        let (time, text) = line.split_once(' ').expect("a timestamp, then the line");
        assert!(humantime::parse_rfc3339_weak(time).is_ok(), "{line:?}");
        assert!(log.lines().any(|plain| plain == text), "{line:?}");
    }
    assert_eq!(stamped.lines().count(), 3, "{stamped:?}");
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_does_not_exist_is_err_image_pull_with_a_failed_event() {
    let mut mock = RealMock::start("rrb", "10.215.2.1/24").await;
    let mut container = mock.busybox("main", "true");
    container.image = format!("{}/library/nothing-here:1", mock.registry.host());
    let request = mock.request("no-image", container);
    let id = mock.create(request).await;

    let group = mock
        .wait_group("the pull fails", &id, |group| {
            group.events.iter().any(|e| e.reason == "Failed")
        })
        .await;
    let event = group
        .events
        .iter()
        .find(|e| e.reason == "Failed")
        .expect("a Failed event");
    assert_eq!(event.r#type, "Warning");
    assert!(
        event.message.contains("Failed to pull image") && event.message.contains("not found"),
        "{event:?}"
    );
    let (state, _, reason) = container_state(&group);
    assert_eq!(state, "Waiting");
    assert!(
        reason == "ErrImagePull" || reason == "ImagePullBackOff",
        "{reason}"
    );
    assert_eq!(group.status, "Pending");
    mock.wait_group("ErrImagePull turns ImagePullBackOff", &id, |group| {
        container_state(group).2 == "ImagePullBackOff"
    })
    .await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_group_leaves_nothing_behind() {
    let mut mock = RealMock::start("rrc", "10.215.3.1/24").await;
    assert_eq!(mock.residue(), Residue::none(), "a clean start");
    // The container ignores SIGTERM: the grace period ends in SIGKILL.
    let script = "trap '' TERM; sleep 1000 & sleep 1000; wait";
    let mut container = mock.busybox("main", script);
    container.environment_var = vec![EnvironmentVar {
        key: "MARKER".into(),
        value: "leak-rrc".into(),
        field_ref: None,
    }];
    let mut request = mock.request("sleeper", container);
    request.termination_grace_period_seconds = Some(2);
    let id = mock.create(request).await;
    mock.wait_group("the container runs", &id, |group| {
        group.status == "Running" && container_state(group).0 == "Running"
    })
    .await;
    // `Running` is reported once the runtime runs; the shell forks its sleeps just after.
    let prefix = mock.prefix;
    let running = wait_for(
        "the shell and its two sleeps",
        Duration::from_secs(30),
        || {
            let residue = Residue::list(prefix, &mock.runtime_dir);
            async move { (residue.processes.len() == 3).then_some(residue) }
        },
    )
    .await;
    assert_eq!(running.netns.len(), 1, "{running:#?}");
    assert_eq!(running.links.len(), 1, "the host veth: {running:#?}");
    assert!(!running.mounts.is_empty(), "{running:#?}");

    let started = Instant::now();
    mock.delete(&id).await;
    mock.wait_gone(&id).await;
    let gone_after = started.elapsed();
    assert!(
        gone_after >= Duration::from_secs(2),
        "SIGTERM was ignored: the group lasts its grace period ({gone_after:?})"
    );
    let mut residue = mock.residue();
    let deadline = Instant::now() + Duration::from_secs(30);
    while residue != Residue::none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        residue = mock.residue();
    }
    assert_eq!(residue, Residue::none(), "nothing is left");
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_container_restarts_under_on_failure_with_its_previous_log() {
    let mut mock = RealMock::start("rrd", "10.215.4.1/24").await;
    let script = "echo run $(cat /proc/self/cgroup | wc -l); exit 1";
    let mut request = mock.request("crashes", mock.busybox("main", script));
    request.restart_policy = "OnFailure".into();
    let id = mock.create(request).await;

    let group = mock
        .wait_group("the container restarted once", &id, |group| {
            group.containers[0].restart_count >= 1
                && group.containers[0]
                    .previous_state
                    .as_ref()
                    .is_some_and(|state| state.state == "Terminated")
        })
        .await;
    let previous = group.containers[0].previous_state.clone().unwrap();
    assert_eq!(previous.exit_code, Some(1), "{previous:?}");
    assert_eq!(group.status, "Running", "OnFailure keeps it going");
    assert!(
        group.events.iter().any(|e| e.reason == "BackOff"),
        "{:?}",
        group.events
    );
    let previous_log = mock.log_of(&id, "main", false, true).await;
    assert_eq!(
        previous_log.lines().count(),
        1,
        "one run's output: {previous_log:?}"
    );
    assert!(previous_log.starts_with("run "), "{previous_log:?}");
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_mode_refuses_to_start_without_root_and_says_so() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mock_eci = binary("mock-eci", "mock-eci").expect("the mock-eci binary");
    let listen = format!("127.0.0.1:{}", free_port().expect("a free port"));
    let runtime_dir = dir.path().join("runtime");
    let args = [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        mock_eci.to_str().expect("utf-8 path"),
        "--listen",
        &listen,
        "--runtime",
        "real",
        "--runtime-prefix",
        "rre",
        "--runtime-dir",
        runtime_dir.to_str().expect("utf-8 path"),
    ];
    let mut process = Process::spawn(
        "mock-eci-unprivileged",
        Path::new("/usr/bin/setpriv"),
        args,
        &[],
        dir.path(),
    )
    .expect("setpriv starts");
    let status = process
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("mock-eci exits");
    assert!(!status.success(), "{status:?}");
    let output = process.output();
    assert!(
        output.contains("--runtime real needs root") && output.contains("uid 65534"),
        "{output}"
    );

    // As root, but without the OCI runtime it names.
    let args = [
        "--listen",
        &listen,
        "--runtime",
        "real",
        "--runtime-prefix",
        "rre",
        "--runtime-dir",
        runtime_dir.to_str().expect("utf-8 path"),
        "--oci-runtime",
        "/nonexistent/runc",
    ];
    let mut process = Process::spawn("mock-eci-no-runc", &mock_eci, args, &[], dir.path())
        .expect("mock-eci starts");
    let status = process
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("mock-eci exits");
    assert!(!status.success(), "{status:?}");
    let output = process.output();
    assert!(
        output.contains("needs an OCI runtime: /nonexistent/runc was not found"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_in_the_container_with_its_host_name_processes_files_stdin_and_exit_code() {
    let mut mock = RealMock::start("rrf", "10.215.5.1/24").await;
    let mut alpha = mock.request("alpha", mock.busybox("main", "exec sleep 1000"));
    alpha.host_name = "web-0".into();
    let alpha = mock.create(alpha).await;
    let beta = mock.request("beta", mock.busybox("main", "exec sleep 1000"));
    let beta = mock.create(beta).await;
    for id in [&alpha, &beta] {
        mock.wait_group("the container runs", id, |group| {
            container_state(group).0 == "Running"
        })
        .await;
    }

    // The group's host name, from the kernel and from the file.
    assert_eq!(
        mock.exec_sync(&alpha, "main", &["hostname"]).await,
        "web-0\n"
    );
    let file = mock
        .exec_sync(&alpha, "main", &["cat", "/etc/hostname"])
        .await;
    assert_eq!(file, "web-0\n");
    assert_eq!(mock.exec_sync(&beta, "main", &["hostname"]).await, "beta\n");

    // The container's processes only: its init (the sleep) and ps itself.
    let ps = mock
        .exec_sync(&alpha, "main", &["ps", "-o", "pid,args"])
        .await;
    let processes: Vec<&str> = ps.lines().skip(1).map(str::trim).collect();
    assert_eq!(processes.len(), 2, "{ps}");
    assert!(
        processes[0].starts_with("1 ") && processes[0].ends_with("sleep 1000"),
        "{ps}"
    );
    assert!(processes[1].ends_with("ps -o pid,args"), "{ps}");

    // Files: what one group writes, another does not see; nor does any see the host's.
    let write = [
        "sh",
        "-c",
        "echo secret > /tmp/alpha-file && cat /tmp/alpha-file",
    ];
    assert_eq!(mock.exec_sync(&alpha, "main", &write).await, "secret\n");
    let other = mock
        .exec_sync(&beta, "main", &["cat", "/tmp/alpha-file"])
        .await;
    assert!(other.contains("No such file"), "{other}");
    assert_eq!(
        mock.exec_sync(&alpha, "main", &["cat", "/tmp/alpha-file"])
            .await,
        "secret\n",
        "the container keeps its files between execs"
    );
    let host_file = mock.runtime_dir.with_file_name("host-secret");
    std::fs::write(&host_file, "the host's").expect("a host file");
    let host_path = host_file.to_str().expect("utf-8 path");
    let host = mock.exec_sync(&alpha, "main", &["cat", host_path]).await;
    assert!(host.contains("No such file"), "{host}");
    assert!(
        !Path::new("/tmp/alpha-file").exists(),
        "nothing was written on the host"
    );

    // Interactive: exit code and streams apart, stdin to its end, a terminal of the size asked.
    let script = ["sh", "-c", "echo out; echo err >&2; exit 3"];
    let exit = mock.exec_session(&alpha, "main", &script, false, b"").await;
    assert_eq!(
        (exit.stdout.as_str(), exit.stderr.as_str(), exit.exit_code()),
        ("out\n", "err\n", Some(3)),
        "{exit:?}"
    );
    let cat = mock
        .exec_session(&alpha, "main", &["cat"], false, b"typed in\n")
        .await;
    assert_eq!(
        (cat.stdout.as_str(), cat.exit_code()),
        ("typed in\n", Some(0)),
        "{cat:?}"
    );
    let hostname = mock
        .exec_session(&alpha, "main", &["hostname"], false, b"")
        .await;
    assert_eq!(hostname.stdout, "web-0\n", "{hostname:?}");
    let ps = mock
        .exec_session(&beta, "main", &["ps", "-o", "pid,args"], false, b"")
        .await;
    assert_eq!(ps.stdout.lines().count(), 3, "{ps:?}");
    // The runtime relays the size just after the command started: wait for it (bounded by the
    // session's own timeout).
    let script =
        "test -t 0 && echo TTY; until stty size | grep -q '30 100'; do sleep 0.1; done; stty size";
    let tty = ["sh", "-c", script];
    let tty = mock.exec_session(&alpha, "main", &tty, true, b"").await;
    assert!(
        tty.stdout.contains("TTY") && tty.stdout.contains("30 100"),
        "{tty:?}"
    );
    assert_eq!(tty.exit_code(), Some(0), "{tty:?}");
    let missing = mock
        .exec_session(&alpha, "main", &["no-such-program"], false, b"")
        .await;
    assert_ne!(missing.exit_code(), Some(0), "{missing:?}");
    assert!(missing.stderr.contains("no-such-program"), "{missing:?}");
    mock.stop().await;
}

fn volume(name: &str, kind: &str) -> Volume {
    Volume {
        name: name.into(),
        r#type: kind.into(),
        ..Volume::default()
    }
}

/// A `ConfigFileVolume` file: its text base64-encoded, as ECI takes it.
fn config_file(path: &str, text: &str, mode: Option<i32>) -> ConfigFileToPath {
    use base64::Engine as _;
    ConfigFileToPath {
        path: path.into(),
        content: base64::engine::general_purpose::STANDARD.encode(text),
        mode,
    }
}

fn config_volume(name: &str, files: Vec<ConfigFileToPath>, default_mode: Option<i32>) -> Volume {
    Volume {
        config_file_volume: Some(ConfigFileVolume {
            config_file_to_path: files,
            default_mode,
        }),
        ..volume(name, "ConfigFileVolume")
    }
}

fn mount(name: &str, path: &str, sub_path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path: sub_path.into(),
        read_only,
        ..VolumeMount::default()
    }
}

/// A cloud disk's content outlives the group that wrote it: once that group is deleted (the
/// disk is attached to one group at a time), the next group naming the same DiskId reads it.
/// A NAS path marked `ReadOnly` refuses writes; one that is not is shared between groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_outlives_its_group_and_a_read_only_nas_path_refuses_writes() {
    use eci_proto::v20180808::{DiskVolume, NfsVolume};
    let mut mock = RealMock::start("rrv", "10.215.23.1/24").await;
    let disk = Volume {
        disk_volume: Some(DiskVolume {
            disk_id: "d-rrv".into(),
            fs_type: "ext4".into(),
            disk_size: 20,
        }),
        ..volume("data", "DiskVolume")
    };
    let nas = |name: &str, read_only| Volume {
        nfs_volume: Some(NfsVolume {
            server: "nas.example.com".into(),
            path: format!("/{name}"),
            read_only,
        }),
        ..volume(name, "NFSVolume")
    };
    let group = |mock: &RealMock, name: &str, script: &str| {
        let mut container = mock.busybox("main", script);
        container.volume_mount = vec![
            mount("data", "/data", "", false),
            mount("frozen", "/frozen", "", false),
            mount("shared", "/shared", "", false),
        ];
        let mut request = mock.request(name, container);
        request.volume = vec![disk.clone(), nas("frozen", true), nas("shared", false)];
        request
    };
    let writer = group(
        &mock,
        "rrv-writer",
        "echo kept > /data/file && echo nas > /shared/file && \
         if touch /frozen/x 2>/dev/null; then echo frozen-writable; else echo frozen-read-only; fi",
    );
    let first = mock.create(writer).await;
    mock.wait_group("the writer to finish", &first, |g| g.status == "Succeeded")
        .await;
    assert_eq!(
        mock.log(&first, "main", false).await.trim(),
        "frozen-read-only"
    );
    mock.delete(&first).await;
    mock.wait_gone(&first).await;
    let reader = group(&mock, "rrv-reader", "cat /data/file /shared/file");
    let second = mock.create(reader).await;
    mock.wait_group("the reader to finish", &second, |g| g.status == "Succeeded")
        .await;
    assert_eq!(
        mock.log(&second, "main", false).await,
        "kept\nnas\n",
        "the disk and the NAS path keep what the deleted group wrote"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_mounted_config_files_with_their_modes_and_an_empty_dir_shared() {
    let mut mock = RealMock::start("rrg", "10.215.6.1/24").await;
    let config = config_volume(
        "config",
        vec![
            config_file("app/settings.conf", "key=value\n", Some(0o400)),
            config_file("other.txt", "other\n", None),
        ],
        Some(0o440),
    );
    let scratch = volume("scratch", "EmptyDirVolume");
    let mut ram = volume("ram", "EmptyDirVolume");
    ram.empty_dir_volume = Some(EmptyDirVolume {
        medium: "Memory".into(),
        size_limit: "16Mi".into(),
    });
    let mut writer = mock.busybox("writer", "exec sleep 1000");
    writer.volume_mount = vec![
        mount("config", "/etc/app", "", true),
        mount("scratch", "/shared", "", false),
        mount("ram", "/ram", "", false),
    ];
    let mut reader = mock.busybox("reader", "exec sleep 1000");
    reader.volume_mount = vec![
        mount("scratch", "/data", "", false),
        mount("config", "/cfg", "app", false),
    ];
    let mut request = mock.request("volumes", writer);
    request.container.push(reader);
    request.volume = vec![config, scratch, ram];
    let id = mock.create(request).await;
    mock.wait_group("both containers run", &id, |group| {
        group.containers.iter().all(|c| {
            c.current_state
                .as_ref()
                .is_some_and(|state| state.state == "Running")
        })
    })
    .await;

    let settings = "/etc/app/app/settings.conf";
    assert_eq!(
        mock.exec_sync(&id, "writer", &["stat", "-c", "%a", settings])
            .await,
        "400\n"
    );
    assert_eq!(
        mock.exec_sync(&id, "writer", &["cat", settings]).await,
        "key=value\n"
    );
    let other = ["stat", "-c", "%a", "/etc/app/other.txt"];
    assert_eq!(
        mock.exec_sync(&id, "writer", &other).await,
        "440\n",
        "DefaultMode"
    );
    let written = mock
        .exec_sync(&id, "writer", &["sh", "-c", "echo no > /etc/app/new"])
        .await;
    assert!(written.contains("Read-only file system"), "{written}");
    assert_eq!(
        mock.exec_sync(&id, "reader", &["cat", "/cfg/settings.conf"])
            .await,
        "key=value\n",
        "a SubPath of the volume"
    );

    let share = ["sh", "-c", "echo from-writer > /shared/note"];
    assert_eq!(mock.exec_sync(&id, "writer", &share).await, "");
    assert_eq!(
        mock.exec_sync(&id, "reader", &["cat", "/data/note"]).await,
        "from-writer\n",
        "the EmptyDir is the group's, shared"
    );
    let tmpfs = mock
        .exec_sync(&id, "writer", &["grep", " /ram ", "/proc/mounts"])
        .await;
    assert!(
        tmpfs.starts_with("tmpfs /ram tmpfs") && tmpfs.contains("size=16384k"),
        "{tmpfs}"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_config_files_reaches_the_running_container_without_a_restart() {
    let mut mock = RealMock::start("rru", "10.215.21.1/24").await;
    let config = config_volume(
        "podinfo",
        vec![
            config_file("labels", "tier=a\n", Some(0o400)),
            config_file("gone", "bye\n", None),
            config_file("nested/name", "one\n", None),
        ],
        Some(0o440),
    );
    let mut container = mock.busybox("main", "trap 'exit 0' TERM; while true; do sleep 1; done");
    container.volume_mount = vec![
        mount("podinfo", "/etc/podinfo", "", true),
        mount("podinfo", "/nested", "nested", true),
    ];
    let mut request = mock.request("podinfo", container);
    request.volume = vec![config];
    let id = mock.create(request).await;
    mock.wait_group("the container runs", &id, |group| {
        container_state(group).0 == "Running"
    })
    .await;
    assert_eq!(
        mock.exec_sync(&id, "main", &["cat", "/etc/podinfo/labels"])
            .await,
        "tier=a\n"
    );

    // What the daemon sends when a pod's labels change: the volume's files, without modes.
    let update = UpdateContainerGroupRequest {
        region_id: REGION.into(),
        container_group_id: id.clone(),
        update_type: "IncrementalUpdate".into(),
        volume: vec![config_volume(
            "podinfo",
            vec![
                config_file("labels", "tier=b\n", None),
                config_file("nested/name", "two\n", None),
                config_file("added", "new\n", None),
            ],
            None,
        )],
        ..UpdateContainerGroupRequest::default()
    };
    mock.client
        .update_container_group(update)
        .await
        .expect("the update is accepted");
    let labels = ["cat", "/etc/podinfo/labels"];
    mock.wait_output(
        "the new labels in the container",
        &id,
        "main",
        &labels,
        "tier=b\n",
    )
    .await;

    let listing = mock
        .exec_sync(&id, "main", &["sh", "-c", "cd /etc/podinfo && ls"])
        .await;
    assert_eq!(
        listing, "added\nlabels\nnested\n",
        "the removed key is gone"
    );
    let modes = [
        "stat",
        "-c",
        "%n %a",
        "/etc/podinfo/labels",
        "/etc/podinfo/added",
        "/nested/name",
    ];
    assert_eq!(
        mock.exec_sync(&id, "main", &modes).await,
        "/etc/podinfo/labels 400\n/etc/podinfo/added 440\n/nested/name 440\n",
        "a rewritten file keeps its mode, a new one gets the volume's default"
    );
    assert_eq!(
        mock.exec_sync(&id, "main", &["cat", "/etc/podinfo/added", "/nested/name"])
            .await,
        "new\ntwo\n",
        "a new file, and a directory mounted by SubPath, show the update too"
    );
    let group = mock
        .wait_group("the group runs again after the update", &id, |group| {
            group.status == "Running"
        })
        .await;
    assert_eq!(group.containers[0].restart_count, 0, "{group:#?}");
    assert_eq!(container_state(&group).0, "Running");
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_as_their_security_context_or_their_image_s_user() {
    let mut mock = RealMock::start("rrh", "10.215.7.1/24").await;
    // The busybox image, its config saying `User: nobody`.
    let mut nobody = images::busybox().expect("busybox builds");
    let mut config: serde_json::Value =
        serde_json::from_slice(&nobody.config).expect("the image config");
    config["config"]["User"] = "nobody".into();
    nobody.config = serde_json::to_vec(&config).expect("JSON");
    let nobody_image = format!("{}/library/busybox-nobody:1", mock.registry.host());
    images::push(&nobody, &nobody_image, None)
        .await
        .expect("the image is pushed");

    let mut confined = mock.busybox("confined", "exec sleep 1000");
    confined.security_context = Some(ContainerSecurityContext {
        run_as_user: Some(1234),
        read_only_root_filesystem: true,
        ..ContainerSecurityContext::default()
    });
    confined.security_context_run_as_group = Some(5678);
    let mut image_user = mock.busybox("image-user", "exec sleep 1000");
    image_user.image = nobody_image;
    let mut request = mock.request("users", confined);
    request.container.push(image_user);
    request
        .container
        .push(mock.busybox("plain", "exec sleep 1000"));
    let id = mock.create(request).await;
    mock.wait_group("every container runs", &id, |group| {
        group.containers.iter().all(|c| {
            c.current_state
                .as_ref()
                .is_some_and(|state| state.state == "Running")
        })
    })
    .await;

    let ids = ["sh", "-c", "id -u; id -g"];
    assert_eq!(mock.exec_sync(&id, "confined", &ids).await, "1234\n5678\n");
    let write = ["sh", "-c", "touch /new-file"];
    let refused = mock.exec_sync(&id, "confined", &write).await;
    assert!(refused.contains("Read-only file system"), "{refused}");
    let tmp = mock
        .exec_sync(&id, "confined", &["sh", "-c", "touch /tmp/x"])
        .await;
    assert!(
        tmp.contains("Read-only file system"),
        "/tmp is the root's too: {tmp}"
    );
    assert_eq!(
        mock.exec_sync(&id, "image-user", &ids).await,
        "65534\n65534\n",
        "the image's User, resolved in its /etc/passwd"
    );
    assert_eq!(mock.exec_sync(&id, "plain", &ids).await, "0\n0\n");
    assert_eq!(
        mock.exec_sync(&id, "plain", &write).await,
        "",
        "a writable root"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_leaks_from_a_crash_loop_or_from_mock_eci_killed_with_sigkill_and_restarted() {
    let mut mock = RealMock::start_with(
        "rri",
        "10.215.8.1/24",
        Extras {
            state_file: true,
            ..Extras::default()
        },
    )
    .await;
    assert_eq!(mock.residue(), Residue::none(), "a clean start");
    let marker = EnvironmentVar {
        key: "MARKER".into(),
        value: "leak-rri".into(),
        field_ref: None,
    };
    let mut crasher = mock.busybox("main", "sleep 0.2; exit 1");
    crasher.environment_var = vec![marker.clone()];
    let mut crashing = mock.request("crasher", crasher);
    crashing.restart_policy = "Always".into();
    let crashing = mock.create(crashing).await;
    // Ignores SIGTERM, with a child of its own.
    let mut sleeper = mock.busybox("main", "trap '' TERM; sleep 1000 & sleep 1000; wait");
    sleeper.environment_var = vec![marker];
    // A tmpfs volume and a SubPath of it: mounts of their own to be removed.
    sleeper.volume_mount = vec![VolumeMount {
        name: "ram".into(),
        mount_path: "/ram".into(),
        sub_path: "part".into(),
        ..VolumeMount::default()
    }];
    let mut sleeping = mock.request("sleeper", sleeper);
    sleeping.termination_grace_period_seconds = Some(2);
    sleeping.volume = vec![Volume {
        name: "ram".into(),
        r#type: "EmptyDirVolume".into(),
        empty_dir_volume: Some(EmptyDirVolume {
            medium: "Memory".into(),
            size_limit: "8Mi".into(),
        }),
        ..Volume::default()
    }];
    let sleeping = mock.create(sleeping).await;
    mock.wait_group("the crash loop restarted twice", &crashing, |group| {
        group.containers[0].restart_count >= 2
    })
    .await;
    mock.wait_group("the sleeper runs", &sleeping, |group| {
        container_state(group).0 == "Running"
    })
    .await;
    let sleeps = || {
        processes_with("MARKER=leak-rri")
            .into_iter()
            .filter(|command| command.starts_with("sleep 1000"))
            .count()
    };
    wait_for(
        "the sleeper's two sleeps",
        Duration::from_secs(30),
        || async { (sleeps() == 2).then_some(()) },
    )
    .await;

    // kill -9: mock-eci's containers, namespaces and interfaces outlive it ...
    mock.process.kill().await;
    let left = mock.residue();
    assert_eq!(left.netns.len(), 2, "{left:#?}");
    assert!(
        !left.processes.is_empty() && !left.mounts.is_empty(),
        "{left:#?}"
    );
    // ... until it starts again on the same prefix, runtime directory and state file.
    mock.restart().await;
    wait_for(
        "the killed run's processes are gone",
        Duration::from_secs(60),
        || async { (sleeps() == 0).then_some(()) },
    )
    .await;
    for id in [&crashing, &sleeping] {
        assert!(
            mock.describe(id).await.is_some(),
            "{id} is kept in the state file"
        );
        mock.delete(id).await;
    }
    for id in [&crashing, &sleeping] {
        mock.wait_gone(id).await;
    }
    let mut residue = mock.residue();
    let deadline = Instant::now() + Duration::from_secs(30);
    while residue != Residue::none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        residue = mock.residue();
    }
    assert_eq!(residue, Residue::none(), "nothing is left");
    mock.stop().await;
}

/// An exec probe or hook action: `sh -c script`.
fn shell(script: &str) -> Option<ExecAction> {
    Some(ExecAction {
        command: vec!["sh".into(), "-c".into(), script.into()],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_kills_the_container_and_it_restarts() {
    let mut mock = RealMock::start("rrj", "10.215.10.1/24").await;
    // Ends at once on SIGTERM, so each kill takes no grace period.
    let mut container = mock.busybox("main", "trap 'exit 143' TERM; while true; do sleep 1; done");
    container.liveness_probe = Some(Probe {
        exec: shell("echo not alive; exit 1"),
        period_seconds: 1,
        // The probe's own failure is what is checked, not a timeout: under load (CI's four
        // lanes on two cores) a `runc exec` alone can take longer than the default 1 s.
        timeout_seconds: 10,
        failure_threshold: 2,
        ..Probe::default()
    });
    let mut request = mock.request("unhealthy", container);
    request.restart_policy = "Always".into();
    let id = mock.create(request).await;

    let group = mock
        .wait_group("the container was killed and restarted", &id, |group| {
            group.containers[0].restart_count >= 1
        })
        .await;
    let unhealthy = group
        .events
        .iter()
        .find(|e| e.reason == "Unhealthy")
        .expect("an Unhealthy event");
    assert_eq!(unhealthy.r#type, "Warning");
    assert_eq!(unhealthy.message, "Liveness probe failed: not alive");
    assert!(
        group.events.iter().any(|e| e.reason == "Killing"
            && e.message == "Container main failed liveness probe, will be restarted"),
        "{:?}",
        group.events
    );
    let previous = group.containers[0]
        .previous_state
        .clone()
        .unwrap_or_default();
    assert_eq!(previous.state, "Terminated", "{previous:?}");
    assert_eq!(group.status, "Running", "restart policy Always");
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_probe_keeps_the_container_unready_until_it_passes() {
    let mut mock = RealMock::start("rrk", "10.215.11.1/24").await;
    let mut container = mock.busybox("main", "trap 'exit 0' TERM; while true; do sleep 1; done");
    container.readiness_probe = Some(Probe {
        exec: shell("cat /tmp/ready"),
        period_seconds: 1,
        // Under load a `runc exec` alone can take longer than the default 1 s.
        timeout_seconds: 10,
        ..Probe::default()
    });
    let id = mock.create(mock.request("gated", container)).await;

    // The probe ran and failed: the running container is not ready.
    let group = mock
        .wait_group("the readiness probe failed once", &id, |group| {
            group.events.iter().any(|e| e.reason == "Unhealthy")
        })
        .await;
    assert_eq!(container_state(&group).0, "Running");
    assert!(!group.containers[0].ready, "{group:#?}");
    let event = group
        .events
        .iter()
        .find(|e| e.reason == "Unhealthy")
        .unwrap();
    assert!(
        event.message.starts_with("Readiness probe failed"),
        "{event:?}"
    );

    mock.exec_sync(&id, "main", &["touch", "/tmp/ready"]).await;
    let group = mock
        .wait_group("the container turns ready", &id, |group| {
            group.containers[0].ready
        })
        .await;
    assert_eq!(
        group.containers[0].restart_count, 0,
        "readiness kills nothing"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_stop_hook_runs_before_the_container_is_stopped_on_deletion() {
    let mut mock = RealMock::start("rrl", "10.215.12.1/24").await;
    let mut container = mock.busybox("main", "trap 'exit 0' TERM; while true; do sleep 1; done");
    // Writes into the container's own output (its log), then takes its time: the container
    // is stopped only once the hook is done.
    container.lifecycle_pre_stop_handler = Some(LifecycleHandler {
        exec: shell("echo pre-stop ran > /proc/1/fd/1; sleep 3"),
        ..LifecycleHandler::default()
    });
    let mut request = mock.request("hooked", container);
    request.termination_grace_period_seconds = Some(30);
    let id = mock.create(request).await;
    mock.wait_group("the container runs", &id, |group| {
        container_state(group).0 == "Running"
    })
    .await;
    assert!(
        !mock.log(&id, "main", false).await.contains("pre-stop ran"),
        "not before the deletion"
    );

    mock.delete(&id).await;
    let id_ref = &id;
    let mock_ref = &mut mock;
    let mut seen = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen && mock_ref.describe(id_ref).await.is_some() {
        seen = mock_ref
            .log(id_ref, "main", false)
            .await
            .contains("pre-stop ran");
        assert!(
            Instant::now() < deadline,
            "the group is still listed after 60 s"
        );
        if !seen {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(
        seen,
        "the preStop hook's output is in the log while the group is stopping"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_post_start_hook_kills_the_container() {
    let mut mock = RealMock::start("rrm", "10.215.13.1/24").await;
    let mut container = mock.busybox("main", "trap 'exit 143' TERM; while true; do sleep 1; done");
    container.lifecycle_post_start_handler = Some(LifecycleHandler {
        exec: shell("echo no such setup; exit 2"),
        ..LifecycleHandler::default()
    });
    let id = mock.create(mock.request("post-start", container)).await;
    let group = mock
        .wait_group("the container ends", &id, |group| {
            container_state(group).0 == "Terminated"
        })
        .await;
    assert_eq!(group.status, "Failed", "restart policy Never: {group:#?}");
    let event = group
        .events
        .iter()
        .find(|e| e.reason == "FailedPostStartHook")
        .expect("a FailedPostStartHook event");
    assert_eq!(event.r#type, "Warning");
    assert!(event.message.contains("no such setup"), "{event:?}");
    mock.stop().await;
}

/// Runs one of mock-eci's SDK drivers (`mock-eci/tests/sdk/<script>`) against `mock`'s
/// OpenAPI front, its groups running the registry's busybox; `extra` adds to the arguments
/// every driver takes. Fails the test, with the driver's rows and mock-eci's log, when any
/// check failed.
// The driver's rows are the test's report (shown with --nocapture), as a test's own output
// is; clippy allows printing in tests but not in a helper of them.
#[allow(clippy::print_stdout)]
async fn run_sdk_driver(mock: &RealMock, script: &str, extra: &[&str], what_failed: &str) {
    let (endpoint, ca) = mock.openapi.clone().expect("the OpenAPI front");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let started = Instant::now();
    let run = tokio::process::Command::new("python3")
        .arg(root.join("mock-eci/tests/sdk").join(script))
        .args(["--endpoint", &endpoint, "--ca"])
        .arg(&ca)
        .args([
            "--access-key-id",
            ACCESS_KEY.0,
            "--access-key-secret",
            ACCESS_KEY.1,
        ])
        .arg("--names")
        .arg(root.join("proto/sdk/names.tsv"))
        .args([
            "--image",
            &mock.busybox,
            "--plain-http-registry",
            mock.registry.host(),
        ])
        .args(extra)
        .output()
        .await
        .expect("python3 runs the driver");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}\n{script} took {:?}", started.elapsed());
    assert!(
        run.status.success(),
        "{what_failed}; the FAIL rows say where:\n{stdout}\n{stderr}\nmock-eci:\n{}",
        mock.process.tail(60)
    );
}

/// The official ECI SDK for Python (`mock-eci/tests/sdk/real.py`) drives a group that really
/// runs, through the OpenAPI front: what it reads back — the log, exec output (host name,
/// mounted files and their modes, env, processes), the address, the metrics, a volume update
/// reaching the running container, a restart — is what the sandbox's processes did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_drives_a_group_that_really_runs() {
    let network = "10.215.22.1/24";
    let mock = RealMock::start_with(
        "rrs",
        network,
        Extras {
            openapi: true,
            ..Extras::default()
        },
    )
    .await;
    run_sdk_driver(
        &mock,
        "real.py",
        &["--network", network],
        "the SDK's view of a real group differs from what ran",
    )
    .await;
    mock.stop().await;
}

/// The whole of `mock-eci/tests/sdk/conformance.py` — every action the product uses, through
/// the official SDK, every answer held to the SDK's names — against mock-eci in real mode, its
/// groups running busybox for real. What holds only for the simulator's invented figures is
/// held, in this mode, to what a real sandbox guarantees; the driver's rows name the variant.
/// The driver deletes every group it made; none is left listed, and stopping mock-eci leaves
/// nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_conformance_run_passes_in_real_mode() {
    let mut mock = RealMock::start_with(
        "rrx",
        "10.215.24.1/24",
        Extras {
            openapi: true,
            ..Extras::default()
        },
    )
    .await;
    // The same busybox under a second name: the rich group's sidecar pulls it, and image
    // caches hold both names.
    let second = format!("{}/team/sidecar:2.1", mock.registry.host());
    images::push(&images::busybox().expect("busybox builds"), &second, None)
        .await
        .expect("the second name is pushed");
    run_sdk_driver(
        &mock,
        "conformance.py",
        &["--second-image", &second],
        "the official SDK does not get through a real-mode mock-eci as it would through the service",
    )
    .await;
    let left = mock
        .client
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: REGION.into(),
            ..DescribeContainerGroupsRequest::default()
        })
        .await
        .expect("describe succeeds")
        .into_inner()
        .container_groups;
    assert!(
        left.is_empty(),
        "the driver deleted every group it made, yet these are listed: {:?}",
        left.iter()
            .map(|group| (&group.container_group_id, &group.status))
            .collect::<Vec<_>>()
    );
    mock.stop().await;
}
