// Command registry is the CNCF distribution registry's own entry point, built from its upstream
// module for the image tests: a real OCI registry on loopback. It registers only what the tests
// use (filesystem and in-memory storage, htpasswd auth) instead of upstream's cmd/registry, whose
// cloud storage drivers (Azure, GCS, S3) would be most of the build.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
