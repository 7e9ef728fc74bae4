#!/usr/bin/env python3
"""The official ECI SDK for Python (alibabacloud-eci20180808) against mock-eci's OpenAPI front.

Run by mock-eci/tests/sdk_conformance.rs, which starts mock-eci and passes the endpoint, its CA
and the AccessKey; and, against mock-eci in real mode, by integration/tests/real_runtime.rs,
which adds --image, --second-image and --plain-http-registry so that every container runs
busybox from its registry. Every action the product uses is called through the SDK's own client
(`Client.<action>_with_options`), signed by the SDK (signature 1.0, HMAC-SHA1: the RPC scheme
the product uses, selected with `Config.signature_algorithm = 'v2'`), over HTTPS verified
against mock-eci's CA.

A check passes when the SDK parses the answer and the values read back are the values sent.
Besides, every answer's raw JSON is held to proto/sdk/names.tsv (the names extracted from this
SDK): a field the SDK does not know is one it silently drops, so it is a failure, and so is a
value of the wrong JSON type.

Prints one row per check (PASS/FAIL, action, check, why) and exits 1 when any check failed,
2 when the SDK is missing.
"""

from __future__ import annotations

import argparse
import base64
import copy
import datetime
import json
import sys
import time
import traceback
import uuid
from pathlib import Path

try:
    from alibabacloud_eci20180808 import models as m
    from alibabacloud_eci20180808.client import Client
    from alibabacloud_tea_openapi import utils as openapi_utils
    from alibabacloud_tea_openapi import utils_models as openapi_models
    from darabonba.core import DaraCore
    from darabonba.runtime import RuntimeOptions
except ImportError as error:  # the Rust test checks this first; a direct run gets told too
    print(
        f"the official ECI SDK is not installed ({error}): "
        "python3 -m pip install -r proto/sdk/requirements.txt",
        file=sys.stderr,
    )
    sys.exit(2)

WAIT_SECONDS = 90
# Above what a group of busybox shells and sleeps uses, far below the simulator's working sets
# (a fifth to two fifths of each container's memory, hundreds of MiB for the rich group).
REAL_WORKING_SET_MAX = 64 << 20

# Answer fields whose SDK name is a generator defect, so that no answer can fill them: a server
# sending the natural name is not at fault. Shown as INFO rows.
SDK_NAME_DEFECTS = {
    ("DescribeContainerGroupStatus", f"Data[].PodStatus.ContainerStatuses[].{state}.Running.StartedAt"): (
        "the SDK reads this as StartedAtstartedAt (a defect of its generator), so it drops it"
    )
    for state in ("State", "LastState")
}


# ---------------------------------------------------------------------------------------------
# Results


class Results:
    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, status: str, action: str, check: str, detail: str = ""):
        self.rows.append((status, action, check, detail))

    def ok(self, action, check, detail=""):
        self.add("PASS", action, check, detail)

    def fail(self, action, check, detail):
        self.add("FAIL", action, check, detail)

    def expect(self, action, check, condition, detail):
        (self.ok if condition else self.fail)(action, check, "" if condition else detail)
        return condition

    def failures(self):
        return [row for row in self.rows if row[0] == "FAIL"]

    def print(self):
        width = max((len(r[1]) for r in self.rows), default=6)
        for status, action, check, detail in self.rows:
            line = f"{status:4}  {action:<{width}}  {check}"
            if detail:
                line += f"  --  {detail}"
            print(line)
        failed = len(self.failures())
        infos = sum(1 for r in self.rows if r[0] == "INFO")
        print(
            f"SUMMARY: {len(self.rows) - infos} checks, {len(self.rows) - infos - failed} passed, "
            f"{failed} failed ({infos} informational rows)"
        )


# ---------------------------------------------------------------------------------------------
# The documented names (proto/sdk/names.tsv)


class Names:
    def __init__(self, path: Path):
        self.response: dict[str, dict[str, str]] = {}
        for line in path.read_text().splitlines():
            if line.startswith("#") or line.startswith("action\t"):
                continue
            action, direction, name, kind = line.split("\t")
            if direction == "response":
                self.response.setdefault(action, {})[name] = kind


def json_kind_ok(kind: str, value) -> bool:
    if value is None:
        return True
    return {
        "string": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
    }.get(kind, lambda v: True)(value)


def raw_paths(value, path=""):
    """(path, value) for every member of a JSON document; list elements as `X[]`."""
    if isinstance(value, dict):
        if path:
            yield path, value
        for key, member in value.items():
            yield from raw_paths(member, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        yield path, value
        for item in value:
            yield from raw_paths(item, path + "[]")
    else:
        yield path, value


# ---------------------------------------------------------------------------------------------
# The SDK, with the wire in view


class Wire:
    """Keeps the last request's parameters and the last answer's raw body, around the SDK's own
    transport (nothing is changed on the way)."""

    def __init__(self):
        self.query = {}
        self.body = b""
        self.status = 0
        original = DaraCore.do_action

        def do_action(request, runtime_option=None):
            self.query = dict(request.query or {})
            response = original(request, runtime_option)
            self.body = response.body if isinstance(response.body, bytes) else b""
            self.status = response.status_code
            return response

        DaraCore.do_action = staticmethod(do_action)


def snake(action: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")


class Sdk:
    def __init__(self, args, results: Results, names: Names, wire: Wire):
        self.args = args
        self.results = results
        self.names = names
        self.wire = wire
        self.client = self.make_client(args.access_key_secret)
        self.reported_shape: set[tuple[str, str]] = set()

    def make_client(self, secret: str, signature_algorithm: str | None = "v2") -> Client:
        config = openapi_models.Config(
            access_key_id=self.args.access_key_id,
            access_key_secret=secret,
            endpoint=self.args.endpoint,
            protocol="HTTPS",
            region_id=self.args.region,
            ca=self.args.ca,
            read_timeout=30000,
            connect_timeout=5000,
        )
        if signature_algorithm:
            config.signature_algorithm = signature_algorithm
        if self.args.diagnose_upper_format:
            # Diagnosis only (never in the test): override the SDK's `Format=json`.
            config.global_parameters = openapi_models.GlobalParameters(queries={"Format": "JSON"})
        return Client(config)

    def call(self, action: str, request, check: str, client: Client | None = None):
        """The SDK's parsed answer, or None after recording why the call failed."""
        try:
            response = self.raw_call(action, request, client)
        except Exception as error:  # noqa: BLE001 - every SDK failure is a result
            self.results.fail(action, check, describe_error(error))
            return None
        self.check_shape(action)
        return response

    def raw_call(self, action: str, request, client: Client | None = None):
        client = client or self.client
        return getattr(client, f"{snake(action)}_with_options")(request, RuntimeOptions())

    def check_shape(self, action: str):
        """The raw answer against the SDK's names: unknown fields are dropped by the SDK."""
        try:
            body = json.loads(self.wire.body or b"{}")
        except ValueError:
            self.results.fail(action, "answer is JSON", repr(self.wire.body[:200]))
            return
        documented = self.names.response.get(action, {})
        unknown_parents: list[str] = []
        for path, value in raw_paths(body):
            if any(path.startswith(parent + ".") or path.startswith(parent + "[]") for parent in unknown_parents):
                continue  # reported with its unknown parent
            kind = documented.get(path)
            if kind is None and (action, path) in SDK_NAME_DEFECTS:
                if (action, path) not in self.reported_shape:
                    self.reported_shape.add((action, path))
                    self.results.add("INFO", action, f"answer field {path}", SDK_NAME_DEFECTS[(action, path)])
            elif kind is None:
                key = (action, path)
                if isinstance(value, (dict, list)):
                    unknown_parents.append(path)
                if key not in self.reported_shape:
                    self.reported_shape.add(key)
                    shown = json.dumps(value)[:80] if not isinstance(value, (dict, list)) else summary(value)
                    self.results.fail(
                        action,
                        f"answer field {path}",
                        f"mock-eci sent it ({shown}); the SDK has no such field and drops it",
                    )
            elif not json_kind_ok(kind, value):
                key = (action, path + "#kind")
                if key not in self.reported_shape:
                    self.reported_shape.add(key)
                    self.results.fail(
                        action,
                        f"answer field {path} type",
                        f"mock-eci sent {json.dumps(value)[:60]}; the SDK types it {kind}",
                    )


def summary(value) -> str:
    """`{Path, Server}` for an object, `[3 items]` for a list."""
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(value)) + "}"
    return f"[{len(value)} items: {json.dumps(value)[:60]}]"


def describe_error(error: Exception) -> str:
    inner = getattr(error, "inner_exception", None) or error
    code = getattr(inner, "code", None)
    message = getattr(inner, "message", None) or str(inner)
    status = getattr(inner, "status_code", None)
    text = f"{type(inner).__name__}"
    if status:
        text += f" HTTP {status}"
    if code:
        text += f" {code}"
    return f"{text}: {message}"[:600]


def error_code(error: Exception) -> str:
    inner = getattr(error, "inner_exception", None) or error
    return str(getattr(inner, "code", "") or "")


# ---------------------------------------------------------------------------------------------
# The rich CreateContainerGroup, feature by feature


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def base_request(args, name: str, run_tag: str) -> m.CreateContainerGroupRequest:
    return m.CreateContainerGroupRequest(
        region_id=args.region,
        security_group_id="sg-conformance",
        v_switch_id="vsw-conformance-a",
        container_group_name=name,
        restart_policy="Always",
        cpu=2.0,
        memory=4.0,
        client_token=name,
        tag=[m.CreateContainerGroupRequestTag(key="conformance-run", value=run_tag)],
        container=[
            m.CreateContainerGroupRequestContainer(
                name="app",
                image="registry.example.com/team/app:1.0",
                environment_var=[],
                volume_mount=[],
                port=[],
            )
        ],
        volume=[],
    )


def app(request):
    return request.container[0]


# A shell as PID 1 that stops on SIGTERM (a bare `sleep` as PID 1 would ignore it); it prints
# $MODE and its host name first, so a log shows which group it is.
LONG_RUNNING = 'echo "started $MODE on $(hostname)"; trap "exit 0" TERM; while true; do sleep 1; done'


def probe_ports(container) -> list[int]:
    """The ports the container's HttpGet and TcpSocket probes connect to."""
    ports = set()
    for probe in (container.readiness_probe, container.liveness_probe):
        for target in (probe and probe.http_get, probe and probe.tcp_socket):
            if target and target.port:
                ports.add(target.port)
    return sorted(ports)


def runnable(args, request) -> None:
    """In real mode (`--image` given), makes `request` something a sandbox can run: every
    container and init container uses the run's images, pulled over plain HTTP from its registry
    (the sidecar the second one, so a group pulls two references); a regular container runs
    LONG_RUNNING in place of its command and args (the made-up `/bin/app serve` exists in no
    image), an init container keeps its own short command. In simulated mode nothing changes:
    the simulator runs no image."""
    if not args.image:
        return
    request.plain_http_registry = args.plain_http_registry
    for container in request.container or []:
        container.image = args.second_image if container.name == "sidecar" and args.second_image else args.image
        # Something listens where a probe connects (busybox's httpd, which goes to the
        # background), so a TcpSocket liveness probe passes rather than restarting the container
        # in the middle of the checks.
        servers = "".join(f"httpd -p {port} -h /; " for port in probe_ports(container))
        container.command = ["sh", "-c", servers + LONG_RUNNING]
        container.arg = None
    for container in request.init_container or []:
        container.image = args.image


def sidecar(request):
    for container in request.container:
        if container.name == "sidecar":
            return container
    container = m.CreateContainerGroupRequestContainer(
        name="sidecar", image="registry.example.com/team/sidecar:2.1", environment_var=[], volume_mount=[], port=[]
    )
    request.container.append(container)
    return container


def add_volume(request, volume, mount_path=None, **mount):
    request.volume.append(volume)
    if mount_path:
        app(request).volume_mount.append(
            m.CreateContainerGroupRequestContainerVolumeMount(name=volume.name, mount_path=mount_path, **mount)
        )


def f_container_basics(r):
    c = app(r)
    c.image_pull_policy = "IfNotPresent"
    c.cpu, c.memory = 0.5, 1.0
    c.command = ["/bin/app", "serve"]
    c.arg = ["--port", "8080"]
    c.working_dir = "/srv/app"


def f_env(r):
    app(r).environment_var += [
        m.CreateContainerGroupRequestContainerEnvironmentVar(key="MODE", value="conformance"),
        m.CreateContainerGroupRequestContainerEnvironmentVar(
            key="MY_POD_IP",
            field_ref=m.CreateContainerGroupRequestContainerEnvironmentVarFieldRef(field_path="status.podIP"),
        ),
    ]


def f_ports(r):
    app(r).port.append(m.CreateContainerGroupRequestContainerPort(port=8080, protocol="TCP"))


def f_http_readiness(r):
    app(r).readiness_probe = m.CreateContainerGroupRequestContainerReadinessProbe(
        http_get=m.CreateContainerGroupRequestContainerReadinessProbeHttpGet(path="/healthz", port=8080, scheme="HTTP"),
        initial_delay_seconds=1,
        period_seconds=5,
        timeout_seconds=2,
        success_threshold=1,
        failure_threshold=3,
    )


def f_tcp_liveness(r):
    app(r).liveness_probe = m.CreateContainerGroupRequestContainerLivenessProbe(
        tcp_socket=m.CreateContainerGroupRequestContainerLivenessProbeTcpSocket(port=8080),
        initial_delay_seconds=10,
        period_seconds=10,
        timeout_seconds=1,
        success_threshold=1,
        failure_threshold=3,
    )


def f_exec_probes(r):
    s = sidecar(r)
    s.readiness_probe = m.CreateContainerGroupRequestContainerReadinessProbe(
        exec=m.CreateContainerGroupRequestContainerReadinessProbeExec(command=["cat", "/tmp/ready"]),
        initial_delay_seconds=0,
        period_seconds=3,
    )
    s.liveness_probe = m.CreateContainerGroupRequestContainerLivenessProbe(
        # A command any shell image has: in real mode it runs, and a probe that failed for
        # want of an applet would restart the sidecar mid-run on a slow machine.
        exec=m.CreateContainerGroupRequestContainerLivenessProbeExec(command=["sh", "-c", "kill -0 1"]),
        period_seconds=20,
        failure_threshold=5,
    )


def security_context(r):
    c = app(r)
    if c.security_context is None:
        c.security_context = m.CreateContainerGroupRequestContainerSecurityContext()
    return c.security_context


def f_security_context(r):
    context = security_context(r)
    context.capability = m.CreateContainerGroupRequestContainerSecurityContextCapability(add=["NET_ADMIN"])
    context.run_as_user = 1000


def f_read_only_root(r):
    security_context(r).read_only_root_filesystem = True


def f_privileged(r):
    sidecar(r).security_context_privileged = True


def f_run_as_group(r):
    app(r).security_context_run_as_group = 3000


def f_run_as_non_root(r):
    app(r).security_context_run_as_non_root = True


def f_lifecycle_exec(r):
    app(r).lifecycle_post_start_handler_exec = ["sh", "-c", "echo started"]


def f_lifecycle_http(r):
    c = app(r)
    c.lifecycle_pre_stop_handler_http_get_path = "/quit"
    c.lifecycle_pre_stop_handler_http_get_port = 8080
    c.lifecycle_pre_stop_handler_http_get_scheme = "HTTP"
    c.lifecycle_pre_stop_handler_http_get_host = "127.0.0.1"
    c.lifecycle_pre_stop_handler_http_get_http_header = [
        m.CreateContainerGroupRequestContainerLifecyclePreStopHandlerHttpGetHttpHeader(name="X-Reason", value="stop")
    ]


def f_lifecycle_tcp(r):
    sidecar(r).lifecycle_pre_stop_handler_tcp_socket_port = 9000


def f_tty(r):
    s = sidecar(r)
    s.stdin, s.stdin_once, s.tty = True, True, True


def f_termination_message(r):
    c = app(r)
    c.termination_message_path = "/dev/termination-log"
    c.termination_message_policy = "FallbackToLogsOnError"


def f_init_container(r):
    r.init_container = [
        m.CreateContainerGroupRequestInitContainer(
            name="init",
            image="registry.example.com/team/init:1.0",
            image_pull_policy="Always",
            command=["sh", "-c"],
            arg=["echo init"],
            working_dir="/work",
            cpu=0.25,
            memory=0.5,
            environment_var=[
                m.CreateContainerGroupRequestInitContainerEnvironmentVar(key="STEP", value="1"),
                m.CreateContainerGroupRequestInitContainerEnvironmentVar(
                    key="MY_NAME",
                    field_ref=m.CreateContainerGroupRequestInitContainerEnvironmentVarFieldRef(field_path="metadata.name"),
                ),
            ],
            security_context=m.CreateContainerGroupRequestInitContainerSecurityContext(
                capability=m.CreateContainerGroupRequestInitContainerSecurityContextCapability(add=["CHOWN"]),
                run_as_user=0,
            ),
        )
    ]


def f_empty_dir(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="cache",
            type="EmptyDirVolume",
            empty_dir_volume=m.CreateContainerGroupRequestVolumeEmptyDirVolume(medium="Memory", size_limit="256Mi"),
        ),
        "/cache",
    )


def config_volume(text: str, default_mode=None):
    """A ConfigFileVolume `config` holding `app.conf` (mode 0640) with `text`."""
    return m.CreateContainerGroupRequestVolume(
        name="config",
        type="ConfigFileVolume",
        config_file_volume=m.CreateContainerGroupRequestVolumeConfigFileVolume(
            config_file_to_path=[
                m.CreateContainerGroupRequestVolumeConfigFileVolumeConfigFileToPath(
                    path="app.conf", content=b64(text), mode=0o640
                )
            ],
            default_mode=default_mode,
        ),
    )


def f_config_file(r):
    add_volume(r, config_volume("mode=conformance\n", default_mode=0o644), "/etc/app")


def f_read_only_mount(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="scratch",
            type="EmptyDirVolume",
            empty_dir_volume=m.CreateContainerGroupRequestVolumeEmptyDirVolume(),
        ),
        "/scratch",
        read_only=True,
    )


def f_nfs(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="shared",
            type="NFSVolume",
            nfsvolume=m.CreateContainerGroupRequestVolumeNFSVolume(server="nas.example.com", path="/share"),
        ),
        "/shared",
        sub_path="app",
        mount_propagation="HostToContainer",
    )


def f_nfs_read_only(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="shared-ro",
            type="NFSVolume",
            nfsvolume=m.CreateContainerGroupRequestVolumeNFSVolume(server="nas.example.com", path="/archive", read_only=True),
        ),
    )


def f_disk(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="data",
            type="DiskVolume",
            disk_volume=m.CreateContainerGroupRequestVolumeDiskVolume(disk_id="d-conformance", fs_type="ext4", disk_size=20),
        ),
        "/data",
    )


def f_flex(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="flex",
            type="FlexVolume",
            flex_volume=m.CreateContainerGroupRequestVolumeFlexVolume(
                driver="alicloud/disk", fs_type="ext4", options='{"volumeId":"d-flex"}'
            ),
        ),
    )


def f_host_path(r):
    add_volume(
        r,
        m.CreateContainerGroupRequestVolume(
            name="host-logs",
            type="HostPathVolume",
            host_path_volume=m.CreateContainerGroupRequestVolumeHostPathVolume(type="Directory", path="/var/log"),
        ),
    )


def f_dns_policy(r):
    r.dns_policy = "None"


def f_dns_config(r):
    r.dns_config = m.CreateContainerGroupRequestDnsConfig(
        name_server=["10.0.0.10"],
        search=["default.svc.cluster.local", "svc.cluster.local"],
        option=[m.CreateContainerGroupRequestDnsConfigOption(name="ndots", value="5")],
    )


def f_host_aliases(r):
    r.host_aliase = [m.CreateContainerGroupRequestHostAliase(ip="10.1.1.1", hostname=["db", "db.local"])]


def f_registry_credentials(r):
    r.image_registry_credential = [
        m.CreateContainerGroupRequestImageRegistryCredential(server="registry.example.com", user_name="puller", password="pull-secret")
    ]


def f_sysctls(r):
    r.security_context = m.CreateContainerGroupRequestSecurityContext(
        sysctl=[m.CreateContainerGroupRequestSecurityContextSysctl(name="net.core.somaxconn", value="1024")]
    )


def f_host_name(r):
    r.host_name = "web-0"


def f_share_process_namespace(r):
    r.share_process_namespace = True


def f_group_lifetimes(r):
    r.termination_grace_period_seconds = 5
    r.active_deadline_seconds = 86400


def f_placement(r):
    r.v_switch_id = "vsw-conformance-a,vsw-conformance-b"
    r.schedule_strategy = "VSwitchOrdered"


def f_spot(r):
    r.spot_strategy = "SpotAsPriceGo"


def f_more_tags(r):
    r.tag.append(m.CreateContainerGroupRequestTag(key="app", value="web"))


FEATURES = [
    ("container command, args, working dir, pull policy, cpu, memory", f_container_basics),
    ("container env (value and FieldRef)", f_env),
    ("container ports", f_ports),
    ("HttpGet readiness probe", f_http_readiness),
    ("TcpSocket liveness probe", f_tcp_liveness),
    ("Exec probes", f_exec_probes),
    ("container SecurityContext (Capability.Add, RunAsUser)", f_security_context),
    ("container SecurityContext.ReadOnlyRootFilesystem=True", f_read_only_root),
    ("SecurityContextPrivileged=True", f_privileged),
    ("SecurityContextRunAsGroup", f_run_as_group),
    ("SecurityContextRunAsNonRoot=True", f_run_as_non_root),
    ("lifecycle PostStart Exec", f_lifecycle_exec),
    ("lifecycle PreStop HttpGet (Path, Port, Scheme, Host, HttpHeader)", f_lifecycle_http),
    ("lifecycle PreStop TcpSocket", f_lifecycle_tcp),
    ("Stdin, StdinOnce, Tty =True", f_tty),
    ("TerminationMessagePath/Policy", f_termination_message),
    ("init container (command, args, env with FieldRef, SecurityContext)", f_init_container),
    ("EmptyDirVolume", f_empty_dir),
    ("ConfigFileVolume (Mode, DefaultMode)", f_config_file),
    ("VolumeMount.ReadOnly=True", f_read_only_mount),
    ("NFSVolume (mounted with SubPath, MountPropagation)", f_nfs),
    ("NFSVolume.ReadOnly=True", f_nfs_read_only),
    ("DiskVolume", f_disk),
    ("FlexVolume", f_flex),
    ("HostPathVolume", f_host_path),
    ("DnsPolicy", f_dns_policy),
    ("DnsConfig (NameServer, Search, Option)", f_dns_config),
    ("HostAliase", f_host_aliases),
    ("ImageRegistryCredential", f_registry_credentials),
    ("SecurityContext.Sysctl", f_sysctls),
    ("HostName", f_host_name),
    ("ShareProcessNamespace=True", f_share_process_namespace),
    ("TerminationGracePeriodSeconds, ActiveDeadlineSeconds", f_group_lifetimes),
    ("two VSwitchIds with ScheduleStrategy", f_placement),
    ("SpotStrategy", f_spot),
    ("several tags", f_more_tags),
]


# ---------------------------------------------------------------------------------------------
# Comparing what was sent with what Describe shows


class Compare:
    def __init__(self, results: Results, action: str):
        self.results = results
        self.action = action
        self.mismatches: list[str] = []

    def eq(self, path: str, sent, shown):
        if sent is None:
            return
        if isinstance(sent, float) or isinstance(shown, float):
            same = shown is not None and not isinstance(shown, str) and abs(float(sent) - float(shown)) < 1e-9
        else:
            same = sent == shown
        if not same:
            self.mismatches.append(f"{path}: sent {sent!r}, Describe shows {shown!r}")

    def done(self, check: str):
        if self.mismatches:
            for mismatch in self.mismatches:
                self.results.fail(self.action, check, mismatch)
        else:
            self.results.ok(self.action, check)


def by_name(items, name, attr="name"):
    for item in items or []:
        if getattr(item, attr, None) == name:
            return item
    return None


def compare_probe(c: Compare, path: str, sent, shown):
    if sent is None:
        return
    if shown is None:
        c.mismatches.append(f"{path}: sent a probe, Describe shows none")
        return
    if sent.http_get:
        hg = shown.http_get
        c.eq(f"{path}.HttpGet.Path", sent.http_get.path, hg and hg.path)
        c.eq(f"{path}.HttpGet.Port", sent.http_get.port, hg and hg.port)
        c.eq(f"{path}.HttpGet.Scheme", sent.http_get.scheme, hg and hg.scheme)
    if sent.tcp_socket:
        c.eq(f"{path}.TcpSocket.Port", sent.tcp_socket.port, shown.tcp_socket and shown.tcp_socket.port)
    if sent.exec:
        c.eq(f"{path}.Execs", sent.exec.command, shown.execs)
    for attr, wire in [
        ("initial_delay_seconds", "InitialDelaySeconds"),
        ("period_seconds", "PeriodSeconds"),
        ("timeout_seconds", "TimeoutSeconds"),
        ("success_threshold", "SuccessThreshold"),
        ("failure_threshold", "FailureThreshold"),
    ]:
        c.eq(f"{path}.{wire}", getattr(sent, attr), getattr(shown, attr))


def compare_container(c: Compare, path: str, sent, shown, init: bool):
    if shown is None:
        c.mismatches.append(f"{path}: container {sent.name!r} missing from Describe")
        return
    c.eq(f"{path}.Image", sent.image, shown.image)
    c.eq(f"{path}.ImagePullPolicy", sent.image_pull_policy, shown.image_pull_policy)
    c.eq(f"{path}.WorkingDir", sent.working_dir, shown.working_dir)
    c.eq(f"{path}.{'Command' if init else 'Commands'}", sent.command, shown.command if init else shown.commands)
    c.eq(f"{path}.Args", sent.arg, shown.args)
    c.eq(f"{path}.Cpu", sent.cpu, shown.cpu)
    c.eq(f"{path}.Memory", sent.memory, shown.memory)
    for env in sent.environment_var or []:
        got = by_name(shown.environment_vars, env.key, "key")
        epath = f"{path}.EnvironmentVars[{env.key}]"
        if got is None:
            c.mismatches.append(f"{epath}: sent, missing from Describe")
            continue
        c.eq(f"{epath}.Value", env.value, got.value)
        if env.field_ref:
            shown_path = got.value_from and got.value_from.field_ref and got.value_from.field_ref.field_path
            c.eq(f"{epath}.ValueFrom.FieldRef.FieldPath", env.field_ref.field_path, shown_path)
    for port in sent.port or []:
        got = [p for p in shown.ports or [] if p.port == port.port]
        c.eq(f"{path}.Ports[{port.port}].Protocol", port.protocol, got[0].protocol if got else None)
    for mount in sent.volume_mount or []:
        got = by_name(shown.volume_mounts, mount.name)
        mpath = f"{path}.VolumeMounts[{mount.name}]"
        if got is None:
            c.mismatches.append(f"{mpath}: sent, missing from Describe")
            continue
        c.eq(f"{mpath}.MountPath", mount.mount_path, got.mount_path)
        c.eq(f"{mpath}.SubPath", mount.sub_path, got.sub_path)
        c.eq(f"{mpath}.ReadOnly", mount.read_only, got.read_only)
        c.eq(f"{mpath}.MountPropagation", mount.mount_propagation, got.mount_propagation)
    context = sent.security_context
    if context:
        got = shown.security_context
        if got is None:
            c.mismatches.append(f"{path}.SecurityContext: sent, Describe shows none")
        else:
            c.eq(f"{path}.SecurityContext.Capability.Adds", context.capability and context.capability.add, got.capability and got.capability.adds)
            c.eq(f"{path}.SecurityContext.ReadOnlyRootFilesystem", context.read_only_root_filesystem, got.read_only_root_filesystem)
            c.eq(f"{path}.SecurityContext.RunAsUser", context.run_as_user, got.run_as_user)
    if not init:
        compare_probe(c, f"{path}.ReadinessProbe", sent.readiness_probe, shown.readiness_probe)
        compare_probe(c, f"{path}.LivenessProbe", sent.liveness_probe, shown.liveness_probe)
        c.eq(f"{path}.Stdin", sent.stdin, shown.stdin)
        c.eq(f"{path}.StdinOnce", sent.stdin_once, shown.stdin_once)
        c.eq(f"{path}.Tty", sent.tty, shown.tty)


def compare_volume(c: Compare, sent, shown):
    path = f"ContainerGroups[].Volumes[{sent.name}]"
    if shown is None:
        c.mismatches.append(f"{path}: sent, missing from Describe")
        return
    c.eq(f"{path}.Type", sent.type, shown.type)
    if sent.empty_dir_volume:
        c.eq(f"{path}.EmptyDirVolumeMedium", sent.empty_dir_volume.medium, shown.empty_dir_volume_medium)
        c.eq(f"{path}.EmptyDirVolumeSizeLimit", sent.empty_dir_volume.size_limit, shown.empty_dir_volume_size_limit)
    if sent.nfsvolume:
        c.eq(f"{path}.NFSVolumeServer", sent.nfsvolume.server, shown.nfsvolume_server)
        c.eq(f"{path}.NFSVolumePath", sent.nfsvolume.path, shown.nfsvolume_path)
        c.eq(f"{path}.NFSVolumeReadOnly", sent.nfsvolume.read_only, shown.nfsvolume_read_only)
    if sent.config_file_volume:
        files = {f.path: f.content for f in shown.config_file_volume_config_file_to_paths or []}
        for f in sent.config_file_volume.config_file_to_path:
            c.eq(f"{path}.ConfigFileVolumeConfigFileToPaths[{f.path}].Content", f.content, files.get(f.path))
    if sent.disk_volume:
        c.eq(f"{path}.DiskVolumeDiskId", sent.disk_volume.disk_id, shown.disk_volume_disk_id)
        c.eq(f"{path}.DiskVolumeFsType", sent.disk_volume.fs_type, shown.disk_volume_fs_type)
    if sent.flex_volume:
        c.eq(f"{path}.FlexVolumeDriver", sent.flex_volume.driver, shown.flex_volume_driver)
        c.eq(f"{path}.FlexVolumeFsType", sent.flex_volume.fs_type, shown.flex_volume_fs_type)
        c.eq(f"{path}.FlexVolumeOptions", sent.flex_volume.options, shown.flex_volume_options)


def compare_group(results: Results, sent: m.CreateContainerGroupRequest, shown):
    c = Compare(results, "DescribeContainerGroups")
    g = "ContainerGroups[]"
    c.eq(f"{g}.ContainerGroupName", sent.container_group_name, shown.container_group_name)
    c.eq(f"{g}.RestartPolicy", sent.restart_policy, shown.restart_policy)
    c.eq(f"{g}.Cpu", sent.cpu, shown.cpu)
    c.eq(f"{g}.Memory", sent.memory, shown.memory)
    c.eq(f"{g}.SecurityGroupId", sent.security_group_id, shown.security_group_id)
    c.eq(f"{g}.SpotStrategy", sent.spot_strategy, shown.spot_strategy)
    shown_vsw = shown.v_switch_id
    if shown_vsw not in (sent.v_switch_id.split(",")):
        c.mismatches.append(f"{g}.VSwitchId: sent {sent.v_switch_id!r}, Describe shows {shown_vsw!r} (expected one of them)")
    shown_tags = {(t.key, t.value) for t in shown.tags or []}
    for tag in sent.tag:
        if (tag.key, tag.value) not in shown_tags:
            c.mismatches.append(f"{g}.Tags: sent {tag.key}={tag.value}, Describe shows {sorted(shown_tags)}")
    if sent.dns_config:
        dns = shown.dns_config
        c.eq(f"{g}.DnsConfig.NameServers", sent.dns_config.name_server, dns and dns.name_servers)
        c.eq(f"{g}.DnsConfig.Searches", sent.dns_config.search, dns and dns.searches)
        c.eq(
            f"{g}.DnsConfig.Options",
            [(o.name, o.value) for o in sent.dns_config.option],
            dns and dns.options and [(o.name, o.value) for o in dns.options],
        )
    if sent.host_aliase:
        c.eq(
            f"{g}.HostAliases",
            [(a.ip, a.hostname) for a in sent.host_aliase],
            shown.host_aliases and [(a.ip, a.hostnames) for a in shown.host_aliases],
        )
    if sent.security_context:
        context = shown.eci_security_context
        c.eq(
            f"{g}.EciSecurityContext.Sysctls",
            [(s.name, s.value) for s in sent.security_context.sysctl],
            context and context.sysctls and [(s.name, s.value) for s in context.sysctls],
        )
    for container in sent.container:
        compare_container(c, f"{g}.Containers[{container.name}]", container, by_name(shown.containers, container.name), False)
    for container in sent.init_container or []:
        compare_container(c, f"{g}.InitContainers[{container.name}]", container, by_name(shown.init_containers, container.name), True)
    for volume in sent.volume or []:
        compare_volume(c, volume, by_name(shown.volumes, volume.name))
    c.done("what CreateContainerGroup sent is what Describe shows")


# ---------------------------------------------------------------------------------------------
# The run


class Run:
    def __init__(self, args):
        self.args = args
        self.results = Results()
        self.wire = Wire()
        self.names = Names(Path(args.names))
        self.sdk = Sdk(args, self.results, self.names, self.wire)
        self.run_id = uuid.uuid4().hex[:8]
        self.run_tag = f"run-{self.run_id}"
        self.created: list[str] = []

    # -- helpers --------------------------------------------------------------------------

    def describe(self, ids=None, tag=None, limit=None, next_token=None, check="DescribeContainerGroups"):
        request = m.DescribeContainerGroupsRequest(region_id=self.args.region)
        if ids is not None:
            request.container_group_ids = json.dumps(ids)
        if tag is not None:
            request.tag = [m.DescribeContainerGroupsRequestTag(key="conformance-run", value=tag)]
        request.limit = limit
        request.next_token = next_token
        return self.sdk.call("DescribeContainerGroups", request, check)

    def wait_status(self, group_id: str, wanted: set[str], check: str):
        deadline = time.monotonic() + WAIT_SECONDS
        status = None
        while time.monotonic() < deadline:
            try:
                answer = self.sdk.raw_call(
                    "DescribeContainerGroups",
                    m.DescribeContainerGroupsRequest(region_id=self.args.region, container_group_ids=json.dumps([group_id])),
                )
            except Exception as error:  # noqa: BLE001
                self.results.fail("DescribeContainerGroups", check, describe_error(error))
                return None
            groups = answer.body.container_groups or []
            status = groups[0].status if groups else None
            if status in wanted:
                return groups[0]
            time.sleep(0.25)
        self.results.fail("DescribeContainerGroups", check, f"status {status!r} after {WAIT_SECONDS} s, wanted {sorted(wanted)}")
        return None

    def create(self, request, check: str, record_failure=True):
        runnable(self.args, request)
        if record_failure:
            response = self.sdk.call("CreateContainerGroup", request, check)
        else:
            try:
                response = self.sdk.raw_call("CreateContainerGroup", request)
                self.sdk.check_shape("CreateContainerGroup")
            except Exception as error:  # noqa: BLE001
                return None, describe_error(error)
        if response is None:
            return None, "refused"
        group_id = response.body.container_group_id
        if not group_id:
            self.results.fail("CreateContainerGroup", check, f"the SDK read no ContainerGroupId from {self.wire.body[:200]!r}")
            return None, "no id"
        self.created.append(group_id)
        return group_id, ""

    def delete_quietly(self, group_id):
        try:
            self.sdk.raw_call(
                "DeleteContainerGroup",
                m.DeleteContainerGroupRequest(region_id=self.args.region, container_group_id=group_id),
            )
        except Exception:  # noqa: BLE001 - cleanup of probe groups only
            pass

    # -- the checks -----------------------------------------------------------------------

    def features(self):
        """Each feature alone on a minimal group: which documented parameters are refused."""
        base_id, why = self.create(base_request(self.args, f"conf-{self.run_id}-base", f"{self.run_tag}-probe"), "minimal group", record_failure=False)
        if base_id is None:
            self.results.fail("CreateContainerGroup", "minimal group (one container)", why)
            return []
        self.results.ok("CreateContainerGroup", "minimal group (one container)")
        self.delete_quietly(base_id)
        accepted = []
        for index, (name, apply) in enumerate(FEATURES):
            request = base_request(self.args, f"conf-{self.run_id}-f{index}", f"{self.run_tag}-probe")
            apply(request)
            group_id, why = self.create(request, name, record_failure=False)
            if group_id is None:
                sent = sorted(k for k in self.wire.query if k not in BASE_KEYS)
                self.results.fail("CreateContainerGroup", f"accepts {name}", f"{why} [sent {', '.join(sent)}]")
            else:
                self.results.ok("CreateContainerGroup", f"accepts {name}")
                accepted.append((name, apply))
                self.delete_quietly(group_id)
        return accepted

    def rich_request(self, features, suffix):
        request = base_request(self.args, f"conformance-{self.run_id}{suffix}", self.run_tag)
        request.zone_id = self.args.zone
        for _, apply in features:
            apply(request)
        return request

    def run(self):
        accepted = self.features()
        rich = self.rich_request(FEATURES, "")
        rich_id, _ = self.create(rich, "rich group (every feature at once)")
        if rich_id:
            self.results.ok("CreateContainerGroup", "rich group (every feature at once)")
            sent = rich
        else:
            sent = self.rich_request(accepted, "-r")
            rich_id, _ = self.create(sent, "rich group without the refused features")
            if rich_id:
                self.results.add("INFO", "CreateContainerGroup", "later checks use the rich group without the refused features")
        others = []
        for suffix in ("b", "c"):
            group_id, _ = self.create(base_request(self.args, f"conformance-{self.run_id}-{suffix}", self.run_tag), f"small group {suffix}")
            if group_id:
                others.append(group_id)
        self.bad_calls()
        ImageCacheChecks(self).run_all()
        if not rich_id:
            self.results.fail("*", "later actions", "skipped: no rich group could be created")
            return
        self.describe_checks(sent, rich_id, others)
        group = self.wait_status(rich_id, {"Running"}, "rich group reaches Running")
        if group is None:
            return
        self.results.ok("DescribeContainerGroups", "rich group reaches Running")
        self.container_state_checks(sent, rich_id)
        self.status_checks(rich_id, others, group)
        self.exec_checks(sent, rich_id, group)
        self.log_checks(rich_id)
        self.metric_checks(rich_id, others, sent)
        self.update_checks(sent, rich_id)
        self.restart_checks(rich_id)
        self.delete_checks([rich_id] + others)
        self.signature_v3_info()

    def describe_checks(self, sent, rich_id, others):
        answer = self.describe(ids=[rich_id], check="by ids (rich group)")
        if answer is not None:
            groups = answer.body.container_groups or []
            if self.results.expect("DescribeContainerGroups", "by ids finds the group", [g.container_group_id for g in groups] == [rich_id], f"got {[g.container_group_id for g in groups]}"):
                compare_group(self.results, sent, groups[0])
        mine = sorted([rich_id] + others)
        answer = self.describe(tag=self.run_tag, check="by tag")
        if answer is not None:
            found = sorted(g.container_group_id for g in answer.body.container_groups or [])
            self.results.expect("DescribeContainerGroups", "by tag finds exactly the run's groups", found == mine, f"got {found}, want {mine}")
        if len(others) == 2:
            pair = sorted(others)
            answer = self.describe(ids=pair, check="by two ids")
            if answer is not None:
                found = sorted(g.container_group_id for g in answer.body.container_groups or [])
                self.results.expect("DescribeContainerGroups", "by two ids finds exactly those", found == pair, f"got {found}, want {pair}")
        seen, token, pages = [], None, 0
        while pages < 10:
            answer = self.describe(tag=self.run_tag, limit=1, next_token=token, check="paged (Limit=1)")
            if answer is None:
                return
            pages += 1
            body = answer.body
            seen += [g.container_group_id for g in body.container_groups or []]
            if pages == 1:
                self.results.expect("DescribeContainerGroups", "paged: TotalCount", body.total_count == len(mine), f"TotalCount {body.total_count!r}, want {len(mine)}")
            token = body.next_token
            if not token:
                break
        self.results.expect(
            "DescribeContainerGroups",
            "paged (Limit=1): every group once, NextToken empty at the end",
            sorted(seen) == mine and pages == len(mine),
            f"{pages} pages gave {seen}, want {mine} on {len(mine)} pages",
        )

    def container_state_checks(self, sent, rich_id):
        """Every container runs and every init container ended with exit code 0 (in real mode
        the processes' own states); polled, as the group shows Running from its first
        container's start."""
        want = {c.name: ("Running", None) for c in sent.container} | {
            c.name: ("Terminated", 0) for c in sent.init_container or []
        }
        deadline = time.monotonic() + WAIT_SECONDS
        states = None
        while time.monotonic() < deadline:
            try:
                answer = self.sdk.raw_call(
                    "DescribeContainerGroups",
                    m.DescribeContainerGroupsRequest(region_id=self.args.region, container_group_ids=json.dumps([rich_id])),
                )
            except Exception as error:  # noqa: BLE001
                self.results.fail("DescribeContainerGroups", "every container Running, init containers exited 0", describe_error(error))
                return
            groups = answer.body.container_groups or []
            containers = (groups[0].containers or []) + (groups[0].init_containers or []) if groups else []
            states = {}
            for c in containers:
                state = c.current_state
                states[c.name] = (state.state, state.exit_code if state.state == "Terminated" else None) if state else None
            if states == want:
                self.results.ok("DescribeContainerGroups", "every container Running, init containers exited 0")
                return
            time.sleep(0.25)
        self.results.fail("DescribeContainerGroups", "every container Running, init containers exited 0", f"{states}, want {want}")

    def status_checks(self, rich_id, others, group):
        request = m.DescribeContainerGroupStatusRequest(
            region_id=self.args.region, container_group_ids=json.dumps([rich_id] + others), since_second=600
        )
        answer = self.sdk.call("DescribeContainerGroupStatus", request, "by ids with SinceSecond=600")
        if answer is not None:
            data = {d.container_group_id: d for d in answer.body.data or []}
            self.results.expect("DescribeContainerGroupStatus", "SinceSecond=600 lists the groups just created", set(data) == set([rich_id] + others), f"got {sorted(data)}")
            entry = data.get(rich_id)
            if entry is not None:
                self.results.expect("DescribeContainerGroupStatus", "Status matches Describe", entry.status == group.status, f"{entry.status!r} vs Describe {group.status!r}")
                self.results.expect("DescribeContainerGroupStatus", "Name is the group name", entry.name == group.container_group_name, f"{entry.name!r}")
                statuses = entry.pod_status and entry.pod_status.container_statuses or []
                names = sorted(s.name for s in statuses)
                want = sorted(c.name for c in group.containers or [])
                self.results.expect("DescribeContainerGroupStatus", "PodStatus.ContainerStatuses name the containers", names == want, f"got {names}, want {want}")
        request = m.DescribeContainerGroupStatusRequest(
            region_id=self.args.region, tag=[m.DescribeContainerGroupStatusRequestTag(key="conformance-run", value=self.run_tag)]
        )
        answer = self.sdk.call("DescribeContainerGroupStatus", request, "by tag")
        if answer is not None:
            found = sorted(d.container_group_id for d in answer.body.data or [])
            want = sorted([rich_id] + others)
            self.results.expect("DescribeContainerGroupStatus", "by tag finds the run's groups", found == want, f"got {found}, want {want}")

    def exec_checks(self, sent, rich_id, group):
        def run(command, check):
            request = m.ExecContainerCommandRequest(
                region_id=self.args.region, container_group_id=rich_id, container_name="app",
                command=json.dumps(command), sync=True, tty=False, stdin=False,
            )
            return self.sdk.call("ExecContainerCommand", request, check)

        request = m.ExecContainerCommandRequest(
            region_id=self.args.region, container_group_id=rich_id, container_name="app", command=json.dumps(["/bin/sh"]),
        )
        answer = self.sdk.call("ExecContainerCommand", request, "no flags (the service's defaults)")
        if answer is not None:
            self.results.expect("ExecContainerCommand", "no flags: WebSocketUri", bool(answer.body.web_socket_uri), f"WebSocketUri {answer.body.web_socket_uri!r}")
        answer = run(["echo", "conformance"], "Sync echo")
        if answer is not None:
            self.results.expect("ExecContainerCommand", "Sync: SyncResponse is the output", (answer.body.sync_response or "").strip() == "conformance", f"SyncResponse {answer.body.sync_response!r}")
        if sent.host_name:
            answer = run(["hostname"], "hostname")
            if answer is not None:
                self.results.expect("ExecContainerCommand", "HostName is the group's hostname", (answer.body.sync_response or "").strip() == sent.host_name, f"hostname {answer.body.sync_response!r}, sent HostName {sent.host_name!r}")
        if any(e.field_ref for e in app(sent).environment_var or []):
            # `env`, not `printenv NAME`: busybox images need not have the printenv applet.
            answer = run(["env"], "env FieldRef status.podIP")
            if answer is not None:
                lines = (answer.body.sync_response or "").splitlines()
                self.results.expect("ExecContainerCommand", "FieldRef status.podIP is the IntranetIp", f"MY_POD_IP={group.intranet_ip}" in lines, f"{answer.body.sync_response!r} vs IntranetIp {group.intranet_ip!r}")
        request = m.ExecContainerCommandRequest(
            region_id=self.args.region, container_group_id=rich_id, container_name="app",
            command=json.dumps(["/bin/sh"]), tty=True, stdin=True,
        )
        answer = self.sdk.call("ExecContainerCommand", request, "TTY=True, Stdin=True")
        if answer is not None:
            self.results.expect("ExecContainerCommand", "TTY, Stdin: WebSocketUri", bool(answer.body.web_socket_uri), f"WebSocketUri {answer.body.web_socket_uri!r}")

    def log_checks(self, rich_id):
        request = m.DescribeContainerLogRequest(
            region_id=self.args.region, container_group_id=rich_id, container_name="app",
            tail=10, since_seconds=600, limit_bytes=65536,
        )
        answer = self.sdk.call("DescribeContainerLog", request, "Tail, SinceSeconds, LimitBytes")
        if answer is not None:
            self.results.expect("DescribeContainerLog", "ContainerName echoes the container", answer.body.container_name == "app", f"{answer.body.container_name!r}")
            self.results.expect("DescribeContainerLog", "Content is text", isinstance(answer.body.content, str), f"{answer.body.content!r}")
        request = m.DescribeContainerLogRequest(
            region_id=self.args.region, container_group_id=rich_id, container_name="app", tail=5, timestamps=True,
        )
        if self.sdk.call("DescribeContainerLog", request, "Timestamps=True") is not None:
            self.results.ok("DescribeContainerLog", "Timestamps=True")

    def check_record(self, action, where, record, containers):
        problems = []
        if record.cpu is None or record.cpu.usage_nano_cores is None:
            problems.append("CPU.UsageNanoCores missing")
        if record.memory is None or record.memory.working_set is None or record.memory.usage_bytes is None:
            problems.append("Memory.WorkingSet/UsageBytes missing")
        if not record.filesystem:
            problems.append("Filesystem empty")
        for fs in record.filesystem or []:
            if fs.usage is None or fs.capacity is None or fs.available is None:
                problems.append(f"Filesystem[{fs.fs_name}] Usage/Capacity/Available missing")
        if record.network is None or not record.network.interfaces:
            problems.append("Network.Interfaces missing")
        if not record.timestamp:
            problems.append("Timestamp missing")
        if containers is not None:
            names = sorted(c.name for c in record.containers or [])
            if names != containers:
                problems.append(f"Containers {names}, want {containers}")
            for c in record.containers or []:
                if c.cpu is None or c.cpu.usage_nano_cores is None:
                    problems.append(f"Containers[{c.name}].CPU missing")
        self.results.expect(action, f"{where}: the SDK reads every figure", not problems, "; ".join(problems))

    def check_figures(self, action, where, record):
        """What each mode guarantees of the CPU and memory figures. Simulated: they follow the
        load rules, a share of what the group asked for. Real: they are read from the sandbox's
        cgroups, so none is negative and the group's working set is what its shells and sleeps
        use: more than nothing, and far below the simulator's hundreds of MiB per container."""
        figures = []
        for name, cpu, memory in [("group", record.cpu, record.memory)] + [
            (c.name, c.cpu, c.memory) for c in record.containers or []
        ]:
            figures += [(f"{name} CPU {k}", v) for k, v in (cpu.to_map() if cpu else {}).items()]
            figures += [(f"{name} Memory {k}", v) for k, v in (memory.to_map() if memory else {}).items()]
        negative = [f"{k}={v}" for k, v in figures if isinstance(v, (int, float)) and v < 0]
        if not self.args.image:
            self.results.expect(action, f"{where}: simulated mode: no figure is negative", not negative, ", ".join(negative))
            return
        self.results.expect(action, f"{where}: real mode: no measured figure is negative", not negative, ", ".join(negative))
        working_set = record.memory.working_set if record.memory else None
        self.results.expect(
            action, f"{where}: real mode: the working set is measured (0 < it < {REAL_WORKING_SET_MAX >> 20} MiB)",
            working_set is not None and 0 < working_set < REAL_WORKING_SET_MAX, f"WorkingSet {working_set!r}",
        )

    def metric_checks(self, rich_id, others, sent):
        request = m.DescribeContainerGroupMetricRequest(region_id=self.args.region, container_group_id=rich_id, period="15")
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            answer = self.sdk.call("DescribeContainerGroupMetric", request, "Period=15")
            if answer is None or time.monotonic() > deadline:
                break
            records = answer.body.records or []
            # A record lists the containers running at its time. Records start with the group's
            # provisioning, which comes before the init container has finished and the regular
            # ones have started, so wait for a record taken after every container's current run
            # began (times are whole seconds, hence strictly after).
            started = self.containers_started(rich_id)
            if records and started is not None and parse_time(records[-1].timestamp) > started:
                break
            time.sleep(0.5)  # a new record comes at each 15 s period boundary
        if answer is not None:
            records = answer.body.records or []
            self.results.expect("DescribeContainerGroupMetric", "ContainerGroupId echoed", answer.body.container_group_id == rich_id, f"{answer.body.container_group_id!r}")
            if self.results.expect("DescribeContainerGroupMetric", "has records", bool(records), "no Records"):
                self.check_record("DescribeContainerGroupMetric", "last record", records[-1], sorted(c.name for c in sent.container))
                self.check_figures("DescribeContainerGroupMetric", "last record", records[-1])
        ids = [rich_id] + others[:1]
        request = m.DescribeMultiContainerGroupMetricRequest(region_id=self.args.region, container_group_ids=json.dumps(ids), metric_type="summary")
        answer = self.sdk.call("DescribeMultiContainerGroupMetric", request, "two groups, summary")
        if answer is not None:
            datas = {d.container_group_id: d for d in answer.body.monitor_datas or []}
            self.results.expect("DescribeMultiContainerGroupMetric", "one MonitorData per group", sorted(datas) == sorted(ids), f"got {sorted(datas)}")
            data = datas.get(rich_id)
            if data is not None and self.results.expect("DescribeMultiContainerGroupMetric", "has records", bool(data.records), "no Records"):
                self.check_record("DescribeMultiContainerGroupMetric", "record", data.records[-1], None)
                self.check_figures("DescribeMultiContainerGroupMetric", "record", data.records[-1])

    def containers_started(self, group_id):
        """When the last of the group's regular containers began its current run, if all have."""
        try:
            answer = self.sdk.raw_call(
                "DescribeContainerGroups",
                m.DescribeContainerGroupsRequest(region_id=self.args.region, container_group_ids=json.dumps([group_id])),
            )
        except Exception:  # noqa: BLE001 - the caller keeps polling until its deadline
            return None
        groups = answer.body.container_groups or []
        containers = groups[0].containers or [] if groups else []
        starts = [c.current_state.start_time if c.current_state else None for c in containers]
        if not starts or not all(starts):
            return None
        return max(parse_time(start) for start in starts)

    def update_checks(self, sent, rich_id):
        configs = [v for v in sent.volume or [] if v.config_file_volume]
        if not configs:
            self.results.fail("UpdateContainerGroup", "refresh a ConfigFileVolume", "the rich group has no ConfigFileVolume")
            return
        content = b64("mode=updated\n")
        request = m.UpdateContainerGroupRequest(
            region_id=self.args.region,
            container_group_id=rich_id,
            update_type="IncrementalUpdate",
            client_token=f"update-{self.run_id}",
            volume=[
                m.UpdateContainerGroupRequestVolume(
                    name=configs[0].name,
                    type="ConfigFileVolume",
                    config_file_volume=m.UpdateContainerGroupRequestVolumeConfigFileVolume(
                        config_file_to_path=[m.UpdateContainerGroupRequestVolumeConfigFileVolumeConfigFileToPath(path="app.conf", content=content)]
                    ),
                )
            ],
        )
        if self.sdk.call("UpdateContainerGroup", request, "IncrementalUpdate of a ConfigFileVolume") is None:
            return
        self.results.ok("UpdateContainerGroup", "IncrementalUpdate of a ConfigFileVolume")
        group = self.wait_status(rich_id, {"Running"}, "Running again after the update")
        if group is None:
            return
        volume = by_name(group.volumes, configs[0].name)
        files = {f.path: f.content for f in (volume and volume.config_file_volume_config_file_to_paths) or []}
        self.results.expect("UpdateContainerGroup", "Describe shows the new file content", files.get("app.conf") == content, f"app.conf content {files.get('app.conf')!r}, sent {content!r}")
        kept = sorted(v.name for v in group.volumes or [])
        want = sorted(v.name for v in sent.volume)
        self.results.expect("UpdateContainerGroup", "IncrementalUpdate keeps the other volumes", kept == want, f"volumes {kept}, want {want}")

    def restart_checks(self, rich_id):
        request = m.RestartContainerGroupRequest(region_id=self.args.region, container_group_id=rich_id, client_token=f"restart-{self.run_id}")
        if self.sdk.call("RestartContainerGroup", request, "restart") is None:
            return
        self.results.ok("RestartContainerGroup", "restart")
        if self.wait_status(rich_id, {"Running"}, "Running again after the restart") is not None:
            self.results.ok("RestartContainerGroup", "Running again after the restart")

    def delete_checks(self, ids):
        for group_id in ids:
            request = m.DeleteContainerGroupRequest(region_id=self.args.region, container_group_id=group_id, client_token=f"delete-{group_id}")
            if self.sdk.call("DeleteContainerGroup", request, f"delete {group_id}") is None:
                continue
            gone = self.wait_gone(group_id)
            self.results.expect("DeleteContainerGroup", "the group ends (gone or finished)", gone is True, gone if gone is not True else "")

    def wait_gone(self, group_id):
        deadline = time.monotonic() + WAIT_SECONDS
        status = None
        while time.monotonic() < deadline:
            try:
                answer = self.sdk.raw_call(
                    "DescribeContainerGroups",
                    m.DescribeContainerGroupsRequest(region_id=self.args.region, container_group_ids=json.dumps([group_id])),
                )
            except Exception as error:  # noqa: BLE001
                return describe_error(error)
            groups = answer.body.container_groups or []
            if not groups:
                return True
            status = groups[0].status
            if status in ("Succeeded", "Failed", "Expired"):
                return True
            time.sleep(0.25)
        return f"{group_id} still {status!r} after {WAIT_SECONDS} s"

    def bad_calls(self):
        action = "CreateContainerGroup"
        name = f"conformance-{self.run_id}-bad"
        request = base_request(self.args, name, f"{self.run_tag}-bad")
        request.v_switch_id = None
        try:
            self.sdk.raw_call(action, request)
            self.results.fail(action, "missing VSwitchId is refused", "accepted")
        except Exception as error:  # noqa: BLE001
            text = describe_error(error)
            self.results.expect(action, "missing VSwitchId is refused", error_code(error).startswith("Missing") and "VSwitchId" in text, text)
        answer = self.describe(tag=f"{self.run_tag}-bad", check="after the refused create")
        if answer is not None:
            self.results.expect(action, "the refused create left no group", not answer.body.container_groups, f"{len(answer.body.container_groups or [])} groups")

        describe = m.DescribeContainerGroupsRequest(region_id=self.args.region, limit=1)
        wrong = self.sdk.make_client("not-the-secret")
        try:
            self.sdk.raw_call("DescribeContainerGroups", describe, wrong)
            self.results.fail("DescribeContainerGroups", "wrong AccessKey secret is refused", "accepted")
        except Exception as error:  # noqa: BLE001
            self.results.expect("DescribeContainerGroups", "wrong AccessKey secret is refused", error_code(error) == "SignatureDoesNotMatch", describe_error(error))

        original_timestamp = openapi_utils.Utils.get_timestamp
        stale = (datetime.datetime.utcnow() - datetime.timedelta(minutes=40)).strftime("%Y-%m-%dT%H:%M:%SZ")
        openapi_utils.Utils.get_timestamp = staticmethod(lambda: stale)
        try:
            self.sdk.raw_call("DescribeContainerGroups", describe)
            self.results.fail("DescribeContainerGroups", "a 40-minute-old Timestamp is refused", "accepted")
        except Exception as error:  # noqa: BLE001
            self.results.expect("DescribeContainerGroups", "a 40-minute-old Timestamp is refused", error_code(error).startswith("InvalidTimeStamp"), describe_error(error))
        finally:
            openapi_utils.Utils.get_timestamp = original_timestamp

        original_nonce = openapi_utils.Utils.get_nonce
        nonce = f"conformance-nonce-{self.run_id}"
        openapi_utils.Utils.get_nonce = staticmethod(lambda: nonce)
        try:
            try:
                self.sdk.raw_call("DescribeContainerGroups", describe)
            except Exception as error:  # noqa: BLE001
                self.results.fail("DescribeContainerGroups", "a reused SignatureNonce is refused", f"the first use already failed: {describe_error(error)}")
                return
            try:
                self.sdk.raw_call("DescribeContainerGroups", describe)
                self.results.fail("DescribeContainerGroups", "a reused SignatureNonce is refused", "accepted twice")
            except Exception as error:  # noqa: BLE001
                self.results.expect("DescribeContainerGroups", "a reused SignatureNonce is refused", error_code(error) == "SignatureNonceUsed", describe_error(error))
        finally:
            openapi_utils.Utils.get_nonce = original_nonce

    def signature_v3_info(self):
        """The SDK's default signing (ACS3-HMAC-SHA256 in headers) is not what the product
        uses; shown for information, not counted."""
        client = self.sdk.make_client(self.args.access_key_secret, signature_algorithm=None)
        try:
            self.sdk.raw_call("DescribeContainerGroups", m.DescribeContainerGroupsRequest(region_id=self.args.region, limit=1), client)
            outcome = "accepted"
        except Exception as error:  # noqa: BLE001
            outcome = describe_error(error)
        self.results.add("INFO", "DescribeContainerGroups", "SDK default signing ACS3-HMAC-SHA256 (not required)", outcome)


class ImageCacheChecks:
    """CreateImageCache, DescribeImageCaches, UpdateImageCache and DeleteImageCache through the
    SDK, and container groups created from a cache (`ImageSnapshotId`, `AutoMatchImageCache`).
    mock-eci is started with a short `--image-cache-creation-delay`."""

    IMAGES = ["registry.example.com/team/app:1.0", "registry.example.com/team/sidecar:2.1"]
    UNPULLABLE = "pull-fail.mock-eci.invalid/app:1"

    def __init__(self, run: Run):
        self.run = run
        self.args = run.args
        if self.args.image:
            # The groups made from a cache run the run's images, so the cache holds those.
            self.IMAGES = [self.args.image, self.args.second_image]
        self.results = run.results
        self.sdk = run.sdk
        self.name = f"imc-{run.run_id}"
        self.tag = f"{run.run_tag}-imc"
        self.groups: list[str] = []

    def create(self, name, images, check, **extra):
        request = m.CreateImageCacheRequest(
            region_id=self.args.region,
            image_cache_name=name,
            image=images,
            security_group_id="sg-conformance",
            v_switch_id="vsw-conformance-a",
            tag=[m.CreateImageCacheRequestTag(key="conformance-run", value=self.tag)],
            **extra,
        )
        answer = self.sdk.call("CreateImageCache", request, check)
        if answer is None:
            return None, request
        cache_id = answer.body.image_cache_id
        self.results.expect("CreateImageCache", f"{check}: ImageCacheId", bool(cache_id) and cache_id.startswith("imc-"), f"{cache_id!r}")
        return cache_id, request

    def describe(self, check, **filters):
        request = m.DescribeImageCachesRequest(region_id=self.args.region, **filters)
        answer = self.sdk.call("DescribeImageCaches", request, check)
        return None if answer is None else answer.body

    def names(self, body):
        return sorted(c.image_cache_name for c in (body.image_caches or [])) if body else None

    def wait(self, cache_id, wanted, check):
        deadline = time.monotonic() + WAIT_SECONDS
        status = None
        while time.monotonic() < deadline:
            try:
                answer = self.sdk.raw_call("DescribeImageCaches", m.DescribeImageCachesRequest(region_id=self.args.region, image_cache_id=cache_id))
            except Exception as error:  # noqa: BLE001
                self.results.fail("DescribeImageCaches", check, describe_error(error))
                return None
            caches = answer.body.image_caches or []
            status = caches[0].status if caches else None
            if status in wanted:
                self.results.ok("DescribeImageCaches", check)
                return caches[0]
            time.sleep(0.1)
        self.results.fail("DescribeImageCaches", check, f"status {status!r} after {WAIT_SECONDS} s, wanted {sorted(wanted)}")
        return None

    def run_all(self):
        if self.args.image:
            self.results.add(
                "INFO", "CreateImageCache", "real mode: a cache is mock-eci's record, not a pull",
                "no image is pulled into a cache, so Ready and Failed follow the image names as in "
                f"simulated mode ({self.UNPULLABLE} fails); the groups made from a cache really pull and run",
            )
        ready_id, sent = self.create(
            self.name, list(self.IMAGES), "two images, size, retention, token",
            image_cache_size=25, retention_days=7, client_token=f"imc-token-{self.run.run_id}",
        )
        if ready_id is None:
            return
        again = self.sdk.call("CreateImageCache", sent, "the same ClientToken again")
        if again is not None:
            self.results.expect("CreateImageCache", "the same ClientToken returns the same cache", again.body.image_cache_id == ready_id, f"{again.body.image_cache_id!r}, first {ready_id!r}")
        failed_id, _ = self.create(f"{self.name}-bad", [self.UNPULLABLE], "an image that cannot be pulled")
        cache = self.wait(ready_id, {"Ready"}, "Creating, then Ready")
        if cache is not None:
            self.read_back(cache, sent)
        failed = self.wait(failed_id, {"Failed"}, "an unpullable image: Failed") if failed_id else None
        if failed is not None:
            warnings = [e for e in failed.events or [] if e.type == "Warning"]
            self.results.expect("DescribeImageCaches", "Failed: a Warning event names the image", any(self.UNPULLABLE in (e.message or "") for e in warnings), f"events {[(e.type, e.reason, e.message) for e in failed.events or []]}")
        self.filters(ready_id, failed_id)
        if cache is not None:
            self.groups_from(ready_id, failed_id)
        self.update(ready_id)
        self.delete([ready_id] + ([failed_id] if failed_id else []))
        for group_id in self.groups:
            self.run.delete_quietly(group_id)

    def read_back(self, cache, sent):
        action = "DescribeImageCaches"
        checks = [
            ("ImageCacheName", cache.image_cache_name, sent.image_cache_name),
            ("Images", sorted(cache.images or []), sorted(sent.image)),
            ("ImageCacheSize", cache.image_cache_size, sent.image_cache_size),
            ("Tags", [(t.key, t.value) for t in cache.tags or []], [(t.key, t.value) for t in sent.tag]),
            ("RegionId", cache.region_id, self.args.region),
            ("Progress", cache.progress, "100%"),
        ]
        for field, shown, want in checks:
            self.results.expect(action, f"reads back {field}", shown == want, f"{shown!r}, sent {want!r}")
        self.results.expect(action, "SnapshotId set", bool(cache.snapshot_id), f"{cache.snapshot_id!r}")
        try:
            lifetime = parse_time(cache.expire_date_time) - parse_time(cache.creation_time)
            self.results.expect(action, "ExpireDateTime is CreationTime + RetentionDays", lifetime == datetime.timedelta(days=7), f"{lifetime}")
        except (TypeError, ValueError) as error:
            self.results.fail(action, "ExpireDateTime is CreationTime + RetentionDays", f"{error}: {cache.creation_time!r} {cache.expire_date_time!r}")
        reasons = [e.reason for e in cache.events or []]
        self.results.expect(action, "events of the build", "Ready" in reasons and all(e.first_timestamp and e.count for e in cache.events), f"{reasons}")

    def filters(self, ready_id, failed_id):
        both = sorted([self.name, f"{self.name}-bad"])
        checks = [
            ("ImageCacheId, two ids", {"image_cache_id": f"{ready_id},{failed_id}"}, both),
            ("ImageCacheName", {"image_cache_name": self.name}, [self.name]),
            ("Image", {"image": self.IMAGES[1]}, [self.name]),
            ("Tag", {"tag": [m.DescribeImageCachesRequestTag(key="conformance-run", value=self.tag)]}, both),
            ("MatchImage, ImageFullMatch", {"match_image": list(self.IMAGES), "image_full_match": True}, [self.name]),
            ("MatchImage, ImageMatchCountRequest", {"match_image": [self.IMAGES[0]], "image_match_count_request": 1}, [self.name]),
        ]
        for check, filters, want in checks:
            shown = self.names(self.describe(check, **filters))
            self.results.expect("DescribeImageCaches", f"filter {check}", shown == want, f"got {shown}, want {want}")
        tag = [m.DescribeImageCachesRequestTag(key="conformance-run", value=self.tag)]
        first = self.describe("Limit=1, page 1", tag=tag, limit=1)
        if first is None:
            return
        second = self.describe("Limit=1, page 2", tag=tag, limit=1, next_token=first.next_token)
        pages = self.names(first) + (self.names(second) or [])
        self.results.expect("DescribeImageCaches", "Limit and NextToken page through both", sorted(pages) == both and first.total_count == 2 and not (second and second.next_token), f"pages {pages}, TotalCount {first.total_count}")

    def group(self, suffix, check, **extra):
        request = base_request(self.args, f"conformance-{self.run.run_id}-{suffix}", self.tag)
        for key, value in extra.items():
            setattr(request, key, value)
        return request

    def groups_from(self, ready_id, failed_id):
        for suffix, extra in (("named", {"image_snapshot_id": ready_id}), ("auto", {"auto_match_image_cache": True})):
            check = "ImageSnapshotId" if suffix == "named" else "AutoMatchImageCache"
            group_id, why = self.run.create(self.group(f"imc-{suffix}", check, **extra), f"a group with {check}")
            if group_id is None:
                continue
            self.groups.append(group_id)
            if self.run.wait_status(group_id, {"Running"}, f"a group with {check} reaches Running") is None:
                continue
            request = m.DescribeContainerGroupsRequest(region_id=self.args.region, container_group_ids=json.dumps([group_id]), with_event=True)
            answer = self.sdk.call("DescribeContainerGroups", request, f"{check}: WithEvent")
            groups = (answer.body.container_groups or []) if answer else []
            events = [(e.reason, e.message) for e in (groups[0].events or [])] if groups else []
            self.results.expect("CreateContainerGroup", f"{check}: ECI's SuccessfulHitImageCache event names the cache", any(reason == "SuccessfulHitImageCache" and f"Successfully hit image cache {ready_id}" in (msg or "") for reason, msg in events), f"events {events}")
        for check, cache_id, code in (("a Failed cache", failed_id, "IncorrectStatus"), ("an unknown cache", "imc-conformance-none", "InvalidImageCache.NotFound")):
            if not cache_id:
                continue
            try:
                group_id = self.sdk.raw_call("CreateContainerGroup", self.group("imc-refused", check, image_snapshot_id=cache_id)).body.container_group_id
                self.groups.append(group_id)
                self.results.fail("CreateContainerGroup", f"ImageSnapshotId of {check} is refused", f"accepted: {group_id}")
            except Exception as error:  # noqa: BLE001
                self.results.expect("CreateContainerGroup", f"ImageSnapshotId of {check} is refused", error_code(error) == code, describe_error(error))

    def update(self, cache_id):
        renamed = f"{self.name}-renamed"
        images = [self.IMAGES[0]]
        request = m.UpdateImageCacheRequest(
            region_id=self.args.region, image_cache_id=cache_id, image_cache_name=renamed, image=images,
            retention_days=3, client_token=f"imc-update-{self.run.run_id}",
        )
        if self.sdk.call("UpdateImageCache", request, "rename, new images, retention") is None:
            return
        cache = self.wait(cache_id, {"Ready"}, "Updating, then Ready again")
        if cache is not None:
            self.results.expect("UpdateImageCache", "Describe shows the new name and images", (cache.image_cache_name, cache.images) == (renamed, images), f"{cache.image_cache_name!r} {cache.images!r}")
        missing = m.UpdateImageCacheRequest(region_id=self.args.region, image_cache_id="imc-conformance-none", image_cache_name=renamed)
        try:
            self.sdk.raw_call("UpdateImageCache", missing)
            self.results.fail("UpdateImageCache", "an unknown id is refused", "accepted")
        except Exception as error:  # noqa: BLE001
            self.results.expect("UpdateImageCache", "an unknown id is refused", error_code(error) == "InvalidImageCache.NotFound", describe_error(error))

    def delete(self, ids):
        for cache_id in ids:
            request = m.DeleteImageCacheRequest(region_id=self.args.region, image_cache_id=cache_id, client_token=f"imc-delete-{cache_id}")
            if self.sdk.call("DeleteImageCache", request, f"delete {cache_id}") is None:
                continue
            body = self.describe(f"after deleting {cache_id}", image_cache_id=cache_id)
            self.results.expect("DeleteImageCache", "the cache is gone", body is not None and not body.image_caches, f"{self.names(body)}")
            try:
                self.sdk.raw_call("DeleteImageCache", request)
                self.results.fail("DeleteImageCache", "deleting it again is refused", "accepted")
            except Exception as error:  # noqa: BLE001
                self.results.expect("DeleteImageCache", "deleting it again is refused", error_code(error) == "InvalidImageCache.NotFound", describe_error(error))


BASE_KEYS = {
    "Action", "Format", "Version", "Timestamp", "SignatureNonce", "SignatureMethod", "SignatureVersion",
    "AccessKeyId", "Signature", "RegionId", "SecurityGroupId", "VSwitchId", "ContainerGroupName",
    "RestartPolicy", "Cpu", "Memory", "ClientToken", "Tag.1.Key", "Tag.1.Value", "Container.1.Name",
    "Container.1.Image",
}


def front_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments every driver of mock-eci's OpenAPI front takes (real.py's too)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--endpoint", required=True, help="host:port of mock-eci's OpenAPI front")
    parser.add_argument("--ca", required=True, help="PEM file of the CA that signed its certificate")
    parser.add_argument("--access-key-id", required=True)
    parser.add_argument("--access-key-secret", required=True)
    parser.add_argument("--region", default="cn-hangzhou")
    parser.add_argument("--zone", default="cn-hangzhou-k")
    parser.add_argument("--names", required=True, help="proto/sdk/names.tsv")
    return parser


def image_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    """The image the groups run and the registry serving it, for mock-eci in real mode
    (`--runtime real`); conformance.py runs without them against the simulator."""
    parser.add_argument("--image", required=required, help="an image with a shell (busybox) in the run's registry")
    parser.add_argument("--plain-http-registry", required=required, help="that registry's host:port, spoken to over plain HTTP")
    parser.add_argument("--second-image", help="another name of an image with a shell in that registry")


def run_and_report(run) -> int:
    """Runs the checks, prints one row each; 1 when any failed."""
    try:
        run.run()
    except Exception:  # noqa: BLE001 - a bug here is reported, with the results so far
        run.results.fail("*", "driver crashed", traceback.format_exc().replace("\n", " | "))
    run.results.print()
    return 1 if run.results.failures() else 0


def main() -> int:
    parser = front_arguments(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--diagnose-upper-format",
        action="store_true",
        help="diagnosis only: send Format=JSON instead of the SDK's json, to see what lies beyond",
    )
    image_arguments(parser, required=False)
    args = parser.parse_args()
    if args.image and not (args.plain_http_registry and args.second_image):
        parser.error("--image (real mode) needs --plain-http-registry and --second-image")
    return run_and_report(Run(args))


if __name__ == "__main__":
    sys.exit(main())
