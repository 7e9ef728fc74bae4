# Starting and stopping a playground for the upstream suites' runners (run-conformance.sh,
# run-vk-e2e.sh), sourced by them. The sourcing script defines `say` and `die`, sets `root` (the
# repository) and reads its arguments with `report_args` (which sets `out`, its report
# directory) before it starts a playground.

# Sets `playground` to $PLAYGROUND, or builds the playground, virtual-node-eci and mock-eci with
# cargo and takes the playground from the target directory.
playground_binary() {
  playground=${PLAYGROUND:-}
  if [ -n "$playground" ]; then
    return
  fi
  say "building the playground, virtual-node-eci and mock-eci"
  (cd "$root" && cargo build --quiet -p integration --bin playground \
    -p virtual-node-eci --bin virtual-node-eci -p mock-eci --bin mock-eci) || die "cargo build failed"
  local target
  target=$(cd "$root" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  playground=$target/debug/playground
}

# start_playground DIR FLAGS...: starts `$playground FLAGS...` in DIR (emptied first; its log in
# $out/playground.log), waits until it is ready and sources the environment it writes there
# (KUBECONFIG, REGISTRY, ...). It stops when the sourcing script exits.
start_playground() {
  local dir=$1
  shift
  rm -rf "$dir"
  mkdir -p "$dir"
  say "starting the playground in $dir (log: $out/playground.log)"
  # Its standard input is a pipe this script holds: however the script ends, the pipe closes
  # and the playground stops everything it started (--stop-on-stdin-eof), its network included.
  exec {hold}> >(exec "$playground" "$@" --dir "$dir" --stop-on-stdin-eof \
    >"$out/playground.log" 2>&1)
  playground_pid=$!
  trap stop_playground EXIT

  for _ in $(seq 1 1800); do
    [ -f "$dir/env" ] && break
    kill -0 "$playground_pid" 2>/dev/null || die "the playground stopped; see $out/playground.log"
    sleep 1
  done
  [ -f "$dir/env" ] || die "the playground was not ready within 30 minutes"
  # shellcheck disable=SC1091 # written by the playground
  . "$dir/env"
}

stop_playground() {
  exec {hold}>&-
  say "stopping the playground"
  while kill -0 "$playground_pid" 2>/dev/null; do sleep 1; done
}

# Reads a runner's `[OUT_DIR] [-- FLAGS...]`: sets `out` (the report directory, made and
# absolute; $1 when the caller names none) and `rest` (the flags after `--`, for the suite).
report_args() {
  out=$1
  shift
  if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    out=$1
    shift
  fi
  if [ $# -gt 0 ] && [ "$1" = "--" ]; then
    shift
  fi
  rest=("$@")
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
}
