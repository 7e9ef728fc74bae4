#!/usr/bin/env python3
"""Runs the workspace's test binaries side by side, as `cargo test --workspace` would one by one.

    .ci/test-lanes.py LANES [--alone BINARY:TEST ...] [--solo BINARY[:TEST] ...] [--report FILE]

Why: most of the suite's time is end-to-end binaries waiting on a control plane of their own
(an apiserver's watch, a scheduler's turn, a grace period), not using the CPU; one after another
they took ~32 minutes on CI's two cores. Each binary already owns its control plane, ports and
temporary directories, so binaries are independent of each other and can share the machine.

Rules:
- The binaries are the ones `cargo test --workspace --no-run` builds (read from its JSON
  messages), each run from its package's directory with the environment cargo gives a test.
- Longest first (durations of the last run on this machine, `~/.cache/virtual-node-eci/
  test-durations.json`, else `test-durations.json` beside this script; unknown ones count as
  long), over LANES lanes: a long binary started last would otherwise set the end.
- `--alone BINARY:TEST` runs that one test of that binary by itself in a lane of its own, from
  the start (the projected token test waits out 80 % of a real 600 s token), and skips it in
  the binary's main run.
- `--solo BINARY:TEST` runs that test after everything else, with nothing beside it (`--solo
  BINARY`, the whole binary): a binary that starts whole clusters of its own (the suites others
  wrote, each against a playground) would crowd the lanes' control planes off two cores; a test
  that holds a bound the issues set on response times (another namespace's logs within 2 s
  while one floods exec) measures the product, not the neighbours sharing two cores.
- A binary's output is printed whole when it ends, never interleaved; every failure is named
  again at the end, and the exit status is 1 if any binary failed.
- Doc tests run too (`cargo test --workspace --doc`), as one more item.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# Durations measured on this machine, and the ones committed beside this script (CI's two cores),
# which order a first run.
DURATIONS = Path.home() / ".cache/virtual-node-eci/test-durations.json"
COMMITTED = Path(__file__).with_name("test-durations.json")


def test_binaries():
    """(name, executable, package directory, package name) of every test binary, built now."""
    build = subprocess.run(
        ["cargo", "test", "--workspace", "--locked", "--no-run", "--message-format=json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    messages = [json.loads(line) for line in build.stdout.splitlines() if line.startswith("{")]
    for message in messages:
        if message.get("reason") == "compiler-message":
            print(message["message"].get("rendered", ""), file=sys.stderr)
    if build.returncode != 0:
        print(f"the test build failed (exit {build.returncode})", file=sys.stderr)
        sys.exit(1)
    found = []
    for message in messages:
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue
        target = message["target"]
        package_dir = str(Path(message["manifest_path"]).parent)
        package = package_name(message["package_id"], package_dir)
        kind = target["kind"][0]
        name = f"{package}/{target['name']}" if kind == "test" else f"{package}/{kind}:{target['name']}"
        found.append((name, message["executable"], package_dir, message["package_id"]))
    return found


def package_name(package_id, package_dir):
    """package_id is "path+file:///…/dir#name@version", or "…/name#version" when the directory
    has the package's name."""
    tail = package_id.rsplit("#", 1)[-1]
    return tail.split("@")[0] if "@" in tail else Path(package_dir).name


def cargo_env(package_dir, package_id):
    env = dict(os.environ)
    env.setdefault("CARGO", "cargo")
    if package_id:
        env["CARGO_MANIFEST_DIR"] = package_dir
        env["CARGO_PKG_NAME"] = package_name(package_id, package_dir)
    return env


def main():
    args = sys.argv[1:]
    if not args or not args[0].isdigit():
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    lanes = int(args.pop(0))
    alone, solo = [], []
    report = None
    while args:
        flag = args.pop(0)
        if flag == "--alone":
            binary, test = args.pop(0).split(":", 1)
            alone.append((binary, test))
        elif flag == "--solo":
            binary, _, test = args.pop(0).partition(":")
            solo.append((binary, test or None))
        elif flag == "--report":
            report = args.pop(0)
        else:
            print(f"unknown argument {flag}", file=sys.stderr)
            sys.exit(2)

    start = time.monotonic()
    binaries = test_binaries()
    print(f"built {len(binaries)} test binaries in {time.monotonic() - start:.0f} s", flush=True)
    known = {}
    for source in (COMMITTED, DURATIONS):
        if source.exists():
            known.update(json.loads(source.read_text()))

    first, items, last = [], [], []
    for name, exe, package_dir, package_id in binaries:
        if (name, None) in solo:
            last.append((f"{name} (solo)", [exe], package_dir, package_id))
            continue
        skips = []
        for binary, test in alone + solo:
            if binary != name or test is None:
                continue
            skips.append(test)
            kind, into = ("alone", first) if (binary, test) in alone else ("solo", last)
            into.append((f"{name} ({test} {kind})", [exe, "--exact", test], package_dir, package_id))
        command = [exe] + [arg for test in skips for arg in ("--skip", test)]
        items.append((name, command, package_dir, package_id))
    unknown = [binary for binary, _ in alone + solo if binary not in {b[0] for b in binaries}]
    if unknown:
        print(f"--alone/--solo name binaries that were not built: {unknown}", file=sys.stderr)
        sys.exit(2)
    items.sort(key=lambda item: known.get(item[0], 10_000), reverse=True)
    doc = ("doc tests", ["cargo", "test", "--workspace", "--locked", "--doc"], os.getcwd(), "")
    queue = first + items + [doc]

    lock = threading.Lock()
    durations, failures, results = {}, [], []

    def run(item):
        name, command, package_dir, package_id = item
        began = time.monotonic()
        done = subprocess.run(
            command,
            cwd=package_dir,
            env=cargo_env(package_dir, package_id),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        took = time.monotonic() - began
        with lock:
            durations[name] = round(took)
            verdict = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
            summary = [l for l in done.stdout.splitlines() if l.startswith("test result:")]
            results.extend(summary)
            print(f"\n--- [{time.monotonic() - start:.0f} s] {name}: {verdict} in {took:.0f} s", flush=True)
            print(done.stdout, flush=True)
            if done.returncode != 0:
                failures.append(name)

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop(0)
            run(item)

    threads = [threading.Thread(target=lane) for _ in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for item in last:
        run(item)

    DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    DURATIONS.write_text(json.dumps({**known, **durations}, indent=1, sort_keys=True))
    passed = sum(int(l.split("passed")[0].split()[-1]) for l in results if "passed" in l)
    lines = [f"{seconds:>6} s  {name}" for name, seconds in sorted(durations.items(), key=lambda kv: -kv[1])]
    table = "\n".join(lines)
    print(f"\n==> {len(durations)} items in {time.monotonic() - start:.0f} s over {lanes} lanes; {passed} tests passed")
    print(table)
    if report:
        Path(report).write_text(table + "\n")
    if failures:
        print("\nfailed: " + ", ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
