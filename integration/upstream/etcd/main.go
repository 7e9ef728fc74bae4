// Command etcd is etcd's own server entry point, built from its upstream module so the test
// control plane gets the etcd release Kubernetes expects (Debian's is too old).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
