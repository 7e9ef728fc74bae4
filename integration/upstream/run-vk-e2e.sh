#!/usr/bin/env bash
# Runs virtual-kubelet's provider e2e suite (github.com/virtual-kubelet/virtual-kubelet,
# internal/test/e2e, built by `build.sh vk-e2e`) against a playground's virtual node
# `virtual-node-eci-0`, writes its report and prints one line per test.
#
#   run-vk-e2e.sh [OUT_DIR] [-- SUITE_FLAGS...]
#
# OUT_DIR (default ./vk-e2e-report) receives report.json (`go test -json` events, from
# test2json), report.txt (the suite's -v output), summary.tsv (test, result, seconds) and
# playground/ (the playground's directory: kubeconfig and every log). SUITE_FLAGS go to the
# test binary, e.g. `-- -test.run 'TestEndToEnd/TestGetPods$'`.
#
# The playground: one virtual node, one kwok node, no metrics-server, no placement extender
# (`PLAYGROUND=<binary>` runs another build of it; by default cargo builds it here). Every
# address of the playground is on loopback, and kube-apiserver refuses to proxy to loopback
# ("address not allowed"), which is how the suite reaches the node (nodes/<n>/proxy/pods,
# /runningpods/). So the daemon's pod is moved onto this machine's first non-loopback IPv4
# address (POD_IP, the node's InternalIP, and its kubelet API listen there; the webhook and
# health listeners on 0.0.0.0 so the Service and the probes still reach them).
# VK_E2E_NODE_ADDRESS=<ip> picks the address, VK_E2E_NODE_ADDRESS=none keeps loopback.
#
# Namespace kube-system: the stats and metrics tests go through the apiserver's *pod* proxy to
# a pod named like the node in the suite's namespace, which is the daemon's own pod there.
#
# Exit status: 0 when every test passed, 1 when one did not, 2 when the run could not be made.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=playground.sh
. "$here/playground.sh"
report_args ./vk-e2e-report "$@"
node=virtual-node-eci-0
namespace=kube-system

say() { printf '[vk-e2e] %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

export GOTOOLCHAIN=local
suite=$("$here/build.sh" vk-e2e | sed -n 's/^vk-e2e\.test=//p')
[ -x "$suite" ] || die "build.sh vk-e2e named no test binary"

playground_binary
start_playground "$out/playground" --runtime simulated --replicas 1 --ecs-nodes 1 --metrics-server false \
  --placement-extender false --audit-log false

address=${VK_E2E_NODE_ADDRESS-$(ip -4 -o addr show scope global 2>/dev/null |
  awk '{ split($4, a, "/"); print a[1]; exit }')}
if [ -n "$address" ] && [ "$address" != none ]; then
  say "moving $node's kubelet API to $address (the apiserver does not proxy to loopback)"
  kubectl -n kube-system set env statefulset/virtual-node-eci "POD_IP=$address" \
    WEBHOOK_ADDR=0.0.0.0:9443 HEALTH_ADDR=0.0.0.0:10248 >/dev/null
  kubectl -n kube-system rollout status statefulset/virtual-node-eci --timeout=300s >&2
  kubectl wait "node/$node" --timeout=300s \
    --for=jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}'="$address" >/dev/null
else
  say "no non-loopback address: the tests through the node proxy will fail with \"address not allowed\""
fi
kubectl wait "node/$node" --for=condition=Ready --timeout=300s >/dev/null

say "running the suite (the missing-reference tests each wait up to 2 minutes for an Event)"
set +e
(cd "$out" && go tool test2json -t -p vk-e2e "$suite" -test.v=test2json -test.timeout=40m \
  -kubeconfig "$KUBECONFIG" -namespace "$namespace" -node-name "$node" "${rest[@]}") >"$out/report.json"
set -e

python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
results, text = {}, []
with open(f"{out}/report.json") as events:
    for line in events:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("Action") == "output":
            text.append(event["Output"])
        test = event.get("Test")
        if test and "/" in test and event.get("Action") in ("pass", "fail", "skip"):
            results[test] = (event["Action"], event.get("Elapsed", 0))
with open(f"{out}/report.txt", "w") as f:
    f.write("".join(text))
with open(f"{out}/summary.tsv", "w") as f:
    for test, (result, elapsed) in results.items():
        f.write(f"{test}\t{result}\t{elapsed}\n")
for test, (result, elapsed) in results.items():
    print(f"{result.upper():4} {test} ({elapsed:.1f} s)")
passed = sum(1 for r, _ in results.values() if r == "pass")
failed = sum(1 for r, _ in results.values() if r == "fail")
print(f"vk-e2e: {passed} passed, {failed} failed")
sys.exit(0 if results and failed == 0 else 1)
EOF
