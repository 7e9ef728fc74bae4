#!/usr/bin/env bash
# Runs Kubernetes' conformance tests of sig-node and sig-storage (e2e.test, built by
# `build.sh e2e-test` from the Kubernetes module the control plane is built from) against a
# playground in real-runtime mode, writes the reports and prints the counts.
#
#   run-conformance.sh [OUT_DIR] [-- E2E_FLAGS...]
#
# OUT_DIR (default ./conformance-report) receives junit_01.xml (ginkgo's JUnit report),
# e2e.log (the suite's output), summary.tsv (test, result, seconds), repo-list.yaml and
# playground/ (the playground's directory: kubeconfig and every log). E2E_FLAGS go to e2e.test
# after ours, e.g. `-- --ginkgo.focus='Downward API'`. LABEL_FILTER overrides the selection
# (default: Conformance && (sig-node || sig-storage) && !Serial && !Disruptive); TIMEOUT the
# suite's overall bound (default 120m: a test whose pod never starts waits out the framework's
# own 5-minute bound).
#
# The cluster: `playground --runtime real` (needs root, runc, iproute2, busybox-static), one
# virtual node, no kwok node (the host node's NoSchedule taint leaves it out of the tests;
# --non-blocking-taints keeps it from holding up the suite's start), and the
# virtual node's taint made PreferNoSchedule: the framework picks nodes for its tests only
# among nodes without NoSchedule/NoExecute taints, so the virtual node has to be one. The
# playground pushes the images the selected tests run (agnhost built from its module, with a
# static curl; busybox built from its own source; pause) to its local registry; KUBE_TEST_REPO_LIST maps registry.k8s.io there. Test namespaces
# (labelled e2e-run by the framework) go to the virtual node and pull over plain HTTP through
# the playground's eci-profile. Images the project does not build (nginx, nonroot, kitten, ...)
# are missing: tests that need them fail pulling, and the summary counts them with the rest.
#
# E2E_SUITE=common runs e2e-common.test instead of e2e.test (`build.sh e2e-common`: the suite's
# test/e2e/common tests alone, which CI builds and runs a subset of; conformance-ci-subset.txt)
# with the same flags; the default, full, is the whole e2e.test.
#
# Exit status: 0 when every selected test passed, 1 when one did not, 2 when the run could not
# be made.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=playground.sh
. "$here/playground.sh"
report_args ./conformance-report "$@"
node=virtual-node-eci-0
filter=${LABEL_FILTER:-'Conformance && (sig-node || sig-storage) && !Serial && !Disruptive'}
timeout=${TIMEOUT:-120m}

say() { printf '[conformance] %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

export GOTOOLCHAIN=local
case ${E2E_SUITE:-full} in
  full) component=e2e-test binary=e2e.test ;;
  common) component=e2e-common binary=e2e-common.test ;;
  *) die "E2E_SUITE is full or common, not \`$E2E_SUITE'" ;;
esac
built=$("$here/build.sh" "$component")
suite=$(sed -n "s/^${binary//./\\.}=//p" <<<"$built")
agnhost=$(sed -n 's/^agnhost=//p' <<<"$built")
busybox=$(sed -n 's/^busybox=//p' <<<"$built")
curl=$(sed -n 's/^curl=//p' <<<"$built")
[ -x "$suite" ] && [ -x "$agnhost" ] && [ -x "$busybox" ] && [ -x "$curl" ] ||
  die "build.sh $component named no $binary, agnhost, busybox or curl"

playground_binary
start_playground "$out/playground" --runtime real --e2e-images "$agnhost" \
  --e2e-busybox "$busybox" --e2e-curl "$curl" --replicas 1 \
  --ecs-nodes 0 --metrics-server false --placement-extender false --audit-log false

say "making $node's taint PreferNoSchedule (the framework only picks untainted nodes)"
kubectl -n kube-system set env statefulset/virtual-node-eci VKUBELET_TAINT_EFFECT=PreferNoSchedule >/dev/null
kubectl -n kube-system rollout status statefulset/virtual-node-eci --timeout=300s >&2
kubectl wait "node/$node" --timeout=300s \
  --for=jsonpath='{.spec.taints[?(@.key=="k8s.aliyun.com/vnode")].effect}'=PreferNoSchedule >/dev/null
kubectl wait "node/$node" --for=condition=Ready --timeout=300s >/dev/null

cat >"$out/repo-list.yaml" <<EOF
gcRegistry: $REGISTRY
gcEtcdRegistry: $REGISTRY
promoterE2eRegistry: $REGISTRY/e2e-test-images
buildImageRegistry: $REGISTRY/build-image
sigStorageRegistry: $REGISTRY/sig-storage
dockerLibraryRegistry: $REGISTRY/library
EOF

say "running $binary --ginkgo.label-filter='$filter' (bound: $timeout)"
started=$SECONDS
set +e
(cd "$out" && KUBE_TEST_REPO_LIST="$out/repo-list.yaml" "$suite" \
  --kubeconfig "$KUBECONFIG" --provider skeleton --kubectl-path "$(command -v kubectl)" \
  --non-blocking-taints=node-role.kubernetes.io/control-plane,virtual-node-eci.aliyun.com/host-agent \
  --report-dir "$out" --ginkgo.label-filter="$filter" --ginkgo.timeout="$timeout" \
  --ginkgo.no-color --ginkgo.v "${rest[@]}") >"$out/e2e.log" 2>&1
rc=$?
set -e
say "e2e.test exited $rc after $((SECONDS - started)) s"

python3 - "$out" "$rc" <<'EOF'
import glob, re, sys
import xml.etree.ElementTree as ET
out, suite_rc = sys.argv[1], int(sys.argv[2])
reports = sorted(glob.glob(f"{out}/junit*.xml"))
if not reports:
    print("no JUnit report: see e2e.log")
    sys.exit(1)
rows = []
for report in reports:
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        # Ginkgo's suite-level nodes ([SynchronizedBeforeSuite], [ReportAfterSuite], ...) are
        # not tests.
        if re.match(r"\[\w*Suite\]", name):
            continue
        if case.find("skipped") is not None:
            result = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            result = "failed"
        else:
            result = "passed"
        rows.append((name, result, float(case.get("time", "0"))))
with open(f"{out}/summary.tsv", "w") as f:
    for name, result, seconds in rows:
        f.write(f"{name}\t{result}\t{seconds:.1f}\n")
ran = [r for r in rows if r[1] != "skipped"]
passed = sum(1 for r in ran if r[1] == "passed")
failed = sum(1 for r in ran if r[1] == "failed")
for name, result, seconds in ran:
    print(f"{result.upper():6} {name} ({seconds:.1f} s)")
print(f"conformance: {len(ran)} ran, {passed} passed, {failed} failed (e2e.test exit {suite_rc})")
sys.exit(0 if ran and failed == 0 and suite_rc == 0 else 1)
EOF
