#!/usr/bin/env python3
"""The official ECI SDK for Python against mock-eci in real-runtime mode (`--runtime real`).

Run by integration/tests/real_runtime.rs (`the_official_sdk_drives_a_group_that_really_runs`),
which starts mock-eci with its OpenAPI front, a registry holding busybox and a network of its
own. Where conformance.py holds every name and value the SDK reads to what was sent, this
driver holds what the SDK reads to what the group's processes really did: the log is what the
container printed, an exec's output is what the command printed inside the sandbox (its host
name, its files, its environment, its processes), the address is one of the run's network, the
metrics are the sandbox's own, and a ConfigFileVolume update reaches the running container.
Every answer's raw JSON is held to proto/sdk/names.tsv as in conformance.py.

Prints one row per check and exits 1 when any check failed, 2 when the SDK is missing.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conformance import (  # noqa: E402 - after the path the module is found on
    LONG_RUNNING,
    REAL_WORKING_SET_MAX,
    Run,
    app,
    b64,
    base_request,
    config_volume,
    describe_error,
    front_arguments,
    image_arguments,
    m,
    run_and_report,
)

HOST_NAME = "sdk-real-0"
# PID 1's start time (clock ticks after boot): a new process has another.
PID1_START = ["cut", "-d", " ", "-f22", "/proc/1/stat"]
# How long a change made inside the sandbox may take to show (a file update, a log line).
SHOW_SECONDS = 60


def real_request(args, run_id: str) -> m.CreateContainerGroupRequest:
    """One group using what a real sandbox must honour: an init container writing to a shared
    EmptyDir, a ConfigFileVolume, env with a FieldRef, a host name."""
    request = base_request(args, f"sdk-real-{run_id}", f"real-{run_id}")
    request.plain_http_registry = args.plain_http_registry
    request.host_name = HOST_NAME
    request.termination_grace_period_seconds = 5
    container = app(request)
    container.image = args.image
    container.command = ["sh", "-c", LONG_RUNNING]
    container.environment_var = [
        m.CreateContainerGroupRequestContainerEnvironmentVar(key="MODE", value="real"),
        m.CreateContainerGroupRequestContainerEnvironmentVar(
            key="MY_POD_IP",
            field_ref=m.CreateContainerGroupRequestContainerEnvironmentVarFieldRef(field_path="status.podIP"),
        ),
    ]
    request.volume = [
        config_volume("mode=real\n"),
        m.CreateContainerGroupRequestVolume(
            name="work", type="EmptyDirVolume", empty_dir_volume=m.CreateContainerGroupRequestVolumeEmptyDirVolume()
        ),
    ]
    container.volume_mount = [
        m.CreateContainerGroupRequestContainerVolumeMount(name="config", mount_path="/etc/app"),
        m.CreateContainerGroupRequestContainerVolumeMount(name="work", mount_path="/work"),
    ]
    request.init_container = [
        m.CreateContainerGroupRequestInitContainer(
            name="init",
            image=args.image,
            command=["sh", "-c", "echo init-ran > /work/init"],
            volume_mount=[m.CreateContainerGroupRequestInitContainerVolumeMount(name="work", mount_path="/work")],
        )
    ]
    return request


class RealRun(Run):
    def exec_sync(self, group_id: str, command: list[str], check: str, record: bool = True) -> str | None:
        """The command's output; a failed call is a FAIL row, or only `None` when polled."""
        request = m.ExecContainerCommandRequest(
            region_id=self.args.region, container_group_id=group_id, container_name="app",
            command=json.dumps(command), sync=True, tty=False, stdin=False,
        )
        if record:
            answer = self.sdk.call("ExecContainerCommand", request, check)
        else:
            try:
                answer = self.sdk.raw_call("ExecContainerCommand", request)
                self.sdk.check_shape("ExecContainerCommand")
            except Exception:  # noqa: BLE001 - polled again until the deadline
                answer = None
        return None if answer is None else (answer.body.sync_response or "")

    def log(self, group_id: str) -> str | None:
        request = m.DescribeContainerLogRequest(region_id=self.args.region, container_group_id=group_id, container_name="app")
        answer = self.sdk.call("DescribeContainerLog", request, "the container's log")
        return None if answer is None else (answer.body.content or "")

    def until(self, check_action: str, check: str, read, want) -> None:
        """Polls `read()` until `want(value)`, within SHOW_SECONDS; one row either way."""
        deadline = time.monotonic() + SHOW_SECONDS
        value = None
        while time.monotonic() < deadline:
            value = read()
            if value is not None and want(value):
                self.results.ok(check_action, check)
                return
            time.sleep(0.5)
        self.results.fail(check_action, check, f"last read {value!r} after {SHOW_SECONDS} s")

    def run(self):
        request = real_request(self.args, self.run_id)
        group_id, _ = self.create(request, "a busybox group with an init container and two volumes")
        if group_id is None:
            return
        group = self.wait_status(group_id, {"Running"}, "the group reaches Running")
        if group is None:
            return
        self.results.ok("DescribeContainerGroups", "the group reaches Running")
        self.address_checks(group)
        self.init_checks(group_id)
        self.sandbox_checks(group_id, group)
        self.metric_checks_real(group_id)
        self.update_checks_real(group_id)
        self.restart_checks_real(group_id)
        self.delete_checks_real(group_id)

    def address_checks(self, group):
        network = ipaddress.ip_network(self.args.network, strict=False)
        try:
            address = ipaddress.ip_address(group.intranet_ip or "")
        except ValueError:
            self.results.fail("DescribeContainerGroups", "IntranetIp is an address", f"{group.intranet_ip!r}")
            return
        self.results.expect(
            "DescribeContainerGroups", "IntranetIp is in the run's network, not loopback",
            address in network and not address.is_loopback, f"{address} (network {network})",
        )

    def init_checks(self, group_id):
        """The init container ends with code 0. Polled: the group shows Running from the first
        container's start on, which may be the init container's."""

        def read():
            answer = self.describe(ids=[group_id])
            groups = (answer.body.container_groups or []) if answer else []
            init = (groups[0].init_containers or [None])[0] if groups else None
            state = init.current_state if init else None
            return state and (state.state, state.exit_code)

        self.until("DescribeContainerGroups", "the init container Terminated with exit code 0",
                   read, lambda state: state == ("Terminated", 0))

    def sandbox_checks(self, group_id, group):
        self.until("DescribeContainerLog", "the log is what the container printed",
                   lambda: self.log(group_id), lambda text: f"started real on {HOST_NAME}" in text)

        def app_state():
            answer = self.describe(ids=[group_id])
            groups = (answer.body.container_groups or []) if answer else []
            apps = [c for c in (groups[0].containers or []) if c.name == "app"] if groups else []
            return apps[0].current_state.state if apps and apps[0].current_state else None

        # A client execs into a container it sees Running: its output can reach the log before
        # the service reports the state it is in.
        self.until("DescribeContainerGroups", "the container app shows Running",
                   app_state, lambda state: state == "Running")
        expectations = [
            (["cat", "/etc/hostname"], "the sandbox's host name is HostName", HOST_NAME),
            (["cat", "/etc/app/app.conf"], "the ConfigFileVolume's file is mounted", "mode=real"),
            (["cat", "/work/init"], "the init container's file is in the shared EmptyDir", "init-ran"),
            (["sh", "-c", "echo $MY_POD_IP"], "FieldRef status.podIP is the IntranetIp", group.intranet_ip),
            (["stat", "-c", "%a", "/etc/app/app.conf"], "the file has its Mode", "640"),
        ]
        for command, check, want in expectations:
            shown = self.exec_sync(group_id, command, check)
            if shown is not None:
                self.results.expect("ExecContainerCommand", check, shown.strip() == want, f"{shown!r}, want {want!r}")
        shown = self.exec_sync(group_id, ["ps", "-o", "comm"], "the processes the container sees")
        if shown is not None:
            names = [line.strip() for line in shown.splitlines()[1:] if line.strip()]
            self.results.expect(
                "ExecContainerCommand", "the container sees only its own processes",
                set(names) <= {"sh", "sleep", "ps"} and "sh" in names, f"{names}",
            )

    def metric_checks_real(self, group_id):
        request = m.DescribeContainerGroupMetricRequest(region_id=self.args.region, container_group_id=group_id, period="15")

        def read():
            answer = self.sdk.call("DescribeContainerGroupMetric", request, "Period=15")
            records = (answer.body.records or []) if answer else []
            return records[-1] if records else None

        def measured(record):
            memory = record.memory.working_set if record.memory else None
            return memory is not None and 0 < memory < REAL_WORKING_SET_MAX

        self.until("DescribeContainerGroupMetric",
                   f"the sandbox's working set is measured (0 < it < {REAL_WORKING_SET_MAX >> 20} MiB, not simulated)",
                   read, measured)

    def update_checks_real(self, group_id):
        request = m.UpdateContainerGroupRequest(
            region_id=self.args.region, container_group_id=group_id, update_type="IncrementalUpdate",
            client_token=f"real-update-{self.run_id}",
            volume=[
                m.UpdateContainerGroupRequestVolume(
                    name="config", type="ConfigFileVolume",
                    config_file_volume=m.UpdateContainerGroupRequestVolumeConfigFileVolume(
                        config_file_to_path=[
                            m.UpdateContainerGroupRequestVolumeConfigFileVolumeConfigFileToPath(
                                path="app.conf", content=b64("mode=updated\n")
                            )
                        ]
                    ),
                )
            ],
        )
        if self.sdk.call("UpdateContainerGroup", request, "IncrementalUpdate of the ConfigFileVolume") is None:
            return
        self.until("UpdateContainerGroup", "the running container reads the new file",
                   lambda: self.exec_sync(group_id, ["cat", "/etc/app/app.conf"], "read the updated file", record=False),
                   lambda text: text.strip() == "mode=updated")
        if self.wait_status(group_id, {"Running"}, "Running again after the update") is not None:
            self.results.ok("UpdateContainerGroup", "Running again after the update")

    def restart_checks_real(self, group_id):
        before = self.exec_sync(group_id, PID1_START, "PID 1's start time")
        request = m.RestartContainerGroupRequest(region_id=self.args.region, container_group_id=group_id, client_token=f"real-restart-{self.run_id}")
        if self.sdk.call("RestartContainerGroup", request, "restart") is None:
            return
        if self.wait_status(group_id, {"Running"}, "Running again after the restart") is None:
            return
        self.until("RestartContainerGroup", "the container's PID 1 is a new process",
                   lambda: self.exec_sync(group_id, PID1_START, "PID 1's start time", record=False),
                   lambda text: before is not None and text.strip() != before.strip())

    def delete_checks_real(self, group_id):
        request = m.DeleteContainerGroupRequest(region_id=self.args.region, container_group_id=group_id, client_token=f"real-delete-{group_id}")
        if self.sdk.call("DeleteContainerGroup", request, "delete") is None:
            return
        gone = self.wait_gone(group_id)
        self.results.expect("DeleteContainerGroup", "the group ends (gone or finished)", gone is True, gone if gone is not True else "")
        try:
            self.sdk.raw_call("ExecContainerCommand", m.ExecContainerCommandRequest(
                region_id=self.args.region, container_group_id=group_id, container_name="app",
                command=json.dumps(["true"]), sync=True,
            ))
            self.results.fail("ExecContainerCommand", "an exec into the deleted group is refused", "accepted")
        except Exception as error:  # noqa: BLE001
            self.results.ok("ExecContainerCommand", "an exec into the deleted group is refused", describe_error(error))


def main() -> int:
    parser = front_arguments(__doc__.split("\n\n")[0])
    image_arguments(parser, required=True)
    parser.add_argument("--network", required=True, help="mock-eci's --runtime-network")
    args = parser.parse_args()
    args.diagnose_upper_format = False
    return run_and_report(RealRun(args))


if __name__ == "__main__":
    sys.exit(main())
