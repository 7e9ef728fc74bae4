#!/usr/bin/env python3
"""Records a suite run's results in docs/conformance/<suite>.tsv.

    conformance-merge.py SUITE SUMMARY_TSV [--reason-on-change TEXT]

SUITE is `kubernetes` (run-conformance.sh's summary.tsv: test, passed|failed|skipped, seconds)
or `virtual-kubelet` (run-vk-e2e.sh's: TestEndToEnd/<test>, pass|fail|skip, seconds). Every test
the run reached gets its result and time; a test not recorded before is added; tests the run
did not reach keep their row. A reason is kept while the result stays; when the result changes,
the reason becomes TEXT (default: a note that the old reason no longer holds, quoting it), so
the table never explains a pass with a failure's cause or the reverse. `refused-by-design` is
never written here: a failing run leaves such a row refused, with its reason, and a passing one
makes it a pass. Afterwards, `UPDATE_GENERATED=1 cargo test -p virtual-node-eci --test docs`
regenerates docs/conformance.md's tables.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "test\tresult\tseconds\treason"
OUTCOMES = {"passed": "pass", "pass": "pass", "failed": "fail", "fail": "fail"}


def read_record(path: Path) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in path.read_text().splitlines()[1:]:
        if line:
            test, result, seconds, reason = line.split("\t")
            rows[test] = [result, seconds, reason]
    return rows


def read_run(path: Path, suite: str) -> dict[str, tuple[str, str]]:
    ran: dict[str, tuple[str, str]] = {}
    for line in path.read_text().splitlines():
        if not line:
            continue
        test, outcome, seconds = line.split("\t")
        result = OUTCOMES.get(outcome)
        if result is None:
            continue  # skipped: not selected, or not reached before the bound
        if suite == "virtual-kubelet":
            test = test.split("/", 1)[-1]
        ran[test] = (result, f"{float(seconds):.0f}")
    return ran


def merge(record: dict[str, list[str]], ran: dict[str, tuple[str, str]], on_change: str | None) -> list[str]:
    changes = []
    for test, (result, seconds) in sorted(ran.items()):
        old = record.get(test)
        if old is None:
            record[test] = [result, seconds, "" if result == "pass" else "Not analysed yet."]
            changes.append(f"new     {result:5} {test}")
            continue
        was = old[0]
        now_result = "refused-by-design" if was == "refused-by-design" and result == "fail" else result
        if now_result != was:
            quoted = old[2].replace("\t", " ")
            old[2] = on_change if on_change is not None else f"Was {was}: {quoted} (no longer holds; say why)."
            changes.append(f"changed {was} -> {now_result}: {test}")
        old[0], old[1] = now_result, seconds
    return changes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=["kubernetes", "virtual-kubelet"])
    parser.add_argument("summary", type=Path, help="the run's summary.tsv")
    parser.add_argument("--reason-on-change", help="the reason written on a row whose result changed")
    args = parser.parse_args()
    path = ROOT / "docs" / "conformance" / f"{args.suite}.tsv"
    record = read_record(path)
    changes = merge(record, read_run(args.summary, args.suite), args.reason_on_change)
    with path.open("w") as out:
        out.write(HEADER + "\n")
        for test in sorted(record):
            out.write("\t".join([test, *record[test]]) + "\n")
    for change in changes:
        print(change)
    print(f"{path.relative_to(ROOT)}: {len(changes)} rows added or changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
