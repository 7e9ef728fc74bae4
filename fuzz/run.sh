#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for a bounded time, starting from its seed corpus
# in fuzz/corpus/<target>; fails if any target crashes, printing the input that did it.
#
#   fuzz/run.sh [seconds-per-target] [target...]      (default: 60 s, every target)
#
# Needs the nightly toolchain (installed by rustup, not downloaded here) and cargo-fuzz, which
# is installed from crates.io when missing. Builds outside the work tree (FUZZ_TARGET_DIR, default
# ~/.cache/virtual-node-eci/fuzz-target), so a fresh clone, as CI's, reuses an earlier build's
# dependencies; what the fuzzer adds to a corpus goes to fuzz/target/corpus/<target> (kept
# between local runs, never committed), a crashing input to fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-60}
shift || true
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: fuzz/run.sh [seconds-per-target] [target...]" >&2
  exit 2
fi

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz/run.sh: cargo-fuzz needs the nightly toolchain (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi
cargo +nightly fuzz --version

# The build goes to its own directory whatever the caller's environment names: the product's
# target directory holds stable builds without fuzzing instrumentation.
unset CARGO_TARGET_DIR
build_dir=${FUZZ_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtual-node-eci/fuzz-target}
# Release (opt-level 1, see Cargo.toml) with debug assertions and overflow checks, and no
# sanitizer: the fuzzed code has no `unsafe` (the product denies it), so AddressSanitizer would
# only look at the standard library and dependencies (with it, and opt-level 3, the cold build
# took 1,060 s on 2 cores instead of 379 s). Panics, overflows, hangs (-timeout) and runaway memory (-rss_limit_mb) are what
# the runs catch. The same flags for the build and every run, so the runs reuse the build.
flags=(--release --debug-assertions --sanitizer none --target-dir "$build_dir")

# The lock file is committed: a dependency change must update it, not this run.
cargo +nightly metadata --locked --format-version 1 >/dev/null

if (($# > 0)); then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

start=$(date +%s)
cargo +nightly fuzz build "${flags[@]}"
echo "built ${#targets[@]} targets in $(($(date +%s) - start)) s"

logs=target/fuzz-logs
mkdir -p "$logs"

# One target's run: its summary line on stdout, or on failure the fuzzer's last words, and
# the exit status of the run.
run_target() {
  local target=$1 work=target/corpus/$1 log=$logs/$1.log
  mkdir -p "$work" "corpus/$target"
  # -timeout: an input that takes 30 s is a hang (a request the daemon would never answer).
  if cargo +nightly fuzz run "${flags[@]}" "$target" "$work" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    units=$(find "$work" -type f | wc -l)
    echo "$target: ${runs:-?} inputs in ${seconds} s (${rate:-?}/s), no crash; $units inputs in $work"
  else
    echo "$target: FAILED — the fuzzer's last words ($log):"
    grep -E 'panicked at|ERROR: |SUMMARY: ' "$log" | head -n 5 || true
    tail -n 30 "$log"
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    if [[ -n $artifact ]]; then
      echo "$target: the input is $artifact; replay from fuzz/: cargo +nightly fuzz run ${flags[*]} $target $artifact"
    fi
    return 1
  fi
}

# libFuzzer runs a target on one core: as many targets at once as there are cores, each for
# its full time. Each one's report is printed in the targets' order once all have run.
parallel=$(nproc)
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do
    wait -n || true
  done
  rm -f "$logs/$target.rc"
  {
    if run_target "$target" >"$logs/$target.summary" 2>&1; then echo 0; else echo 1; fi >"$logs/$target.rc"
  } &
done
wait
failed=()
for target in "${targets[@]}"; do
  if [[ $(cat "$logs/$target.rc" 2>/dev/null) == 0 ]]; then
    cat "$logs/$target.summary"
  else
    failed+=("$target")
    cat "$logs/$target.summary" >&2
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz targets that failed: ${failed[*]}" >&2
  exit 1
fi
