// Package common builds Kubernetes' end-to-end tests of test/e2e/common — the sig-node and
// sig-storage tests of what a pod sees (environment, volumes and their files, exit codes,
// termination messages, hostname, probes) — into a test binary of their own, e2e-common.test.
//
// The tests are upstream's, at the control plane's version; only this entry point is ours. It
// exists for CI's time budget: the full e2e.test (built by `build.sh e2e-test`) also links
// every other SIG's tests and the cloud providers' SDKs, while this binary shares nearly all of
// its packages with the control plane built just before it (the build times are in
// docs/conformance.md and docs/performance.md).
//
// The flags are the full suite's (framework.RegisterCommonFlags and RegisterClusterFlags), so
// integration/upstream/run-conformance.sh runs either binary the same way.
package common

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	// The tests.
	_ "k8s.io/kubernetes/test/e2e/common/node"
	_ "k8s.io/kubernetes/test/e2e/common/storage"

	// What the full suite loads for every test: feature and label constants, the framework's
	// debugging, node and metrics hooks, the test output's formatting.
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"

	// Logging flags on the command line, as in the full suite.
	_ "k8s.io/component-base/logs/testinit"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes e2e suite: test/e2e/common", suiteConfig, reporterConfig)
}
