#!/usr/bin/env bash
# Builds the real Kubernetes components the end-to-end suite, the benchmarks and the playground
# run: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes),
# etcd, kwok and metrics-server, the chart tests' helm (helm.sh/helm/v3) and the image tests' OCI
# registry (github.com/distribution/distribution/v3), each from its
# upstream Go module pinned by the go.mod/go.sum beside this script. Go is test infrastructure
# only; the product is Rust. (promtool, for the alert tests, comes from Debian's `prometheus`
# package instead: building it from its module took longer than the rest together.)
#
#   build.sh [component...]    components: kubernetes etcd kwok metrics-server helm registry
#                              e2e-common vk-e2e (none named: all of them), and e2e-test
#                              (only when named)
#
# vk-e2e, e2e-common and e2e-test are not binaries the tests run but other projects' test
# suites that judge ours (docs/conformance.md). vk-e2e: virtual-kubelet's provider e2e suite,
# compiled with `go test -c -tags e2e` from its module (run-vk-e2e.sh runs it against a
# playground). e2e-test: Kubernetes' own end-to-end suite, `e2e.test`
# (k8s.io/kubernetes/test/e2e, whose conformance tests run-conformance.sh runs), from the
# Kubernetes module the control plane is built from, with the test-only requirements (ginkgo,
# gomega, ...) in e2e-test/go.mod. e2e-common: the same suite's tests of test/e2e/common only
# (e2e-test/common), `e2e-common.test`, which CI runs a subset of. Both e2e components come with
# `agnhost` (test/images/agnhost, the program most of those tests run in their containers) and,
# from C sources, the static busybox and curl the suite's images carry.
#
# CI builds everything in one run, and the suites after the control plane: they share one build
# cache, and e2e-common and vk-e2e (whose modules vk-e2e/go.mod aligns with the control plane's)
# compile only a few hundred packages of their own. The full e2e.test links every SIG's tests and
# the cloud providers' SDKs, too long a build for CI's budget: built only when named.
#
# The control plane names the first four, the chart tests helm alone, the image tests registry
# alone: each builds only what it runs. Binaries are cached outside the work tree, one directory per component and version
# (default ~/.cache/virtual-node-eci/<component>-<version>/bin; UPSTREAM_CACHE overrides), so
# only a version bump rebuilds. Progress goes to stderr; stdout gets one `name=path` line per
# binary (and `kwok-stages=<dir>`), which is what integration/'s fixture reads.
set -euo pipefail

# In this order: the suites last, after the control plane whose compiled packages they share.
all=(kubernetes etcd kwok metrics-server helm registry e2e-common vk-e2e)
# Built only when named.
extra=(e2e-test)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${all[@]}")
for c in "${wanted[@]}"; do
  case " ${all[*]} ${extra[*]} " in
    *" $c "*) ;;
    *) echo "build.sh: unknown component \`$c' (known: ${all[*]} ${extra[*]})" >&2; exit 2 ;;
  esac
done
# wants COMPONENT: true when the caller asked for it.
wants() { case " ${wanted[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

here=$(cd "$(dirname "$0")" && pwd)
cache=${UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/virtual-node-eci}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
# A build cache of our own (~6 GB after a cold build), removed once the binaries are in place:
# only a version bump builds again, and a bump recompiles nearly everything anyway, while CI
# machines can be short of disk.
export GOCACHE="$cache/go-build"
built=0

say() { printf '[upstream] %s\n' "$*" >&2; }

command -v go >/dev/null || { say "go is not installed: it is needed to build the test control plane"; exit 1; }

# version MODULE_DIR MODULE: the version of MODULE that the go.mod in MODULE_DIR pins.
version() { (cd "$here/$1" && go list -m -f '{{.Version}}' "$2"); }

# build COMPONENT_DIR OUT_DIR LDFLAGS PACKAGE...: one `go build` for all packages (shared
# parallelism), printing a progress line every 100 packages compiled and every 30 s, so a
# cold build of Kubernetes (tens of minutes on 2 cores) is never silent.
build() {
  local dir=$1 out=$2 ldflags=$3
  shift 3
  local tmp="$out.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  local started=$SECONDS
  compile "$dir" "$started" build -v -ldflags "$ldflags" -o "$tmp/" "$@" || {
    local rc=$?
    rm -rf "$tmp"
    exit "$rc"
  }
  rm -rf "$out" && mv "$tmp" "$out"
  built=1
  say "  $dir built in $((SECONDS - started)) s"
}

# compile COMPONENT_DIR STARTED GO_ARGS...: runs `go GO_ARGS...` in the component's module,
# counting the package names `-v` prints into progress lines; fails with go's exit status.
compile() {
  local dir=$1 started=$2
  shift 2
  (
    cd "$here/$dir"
    go "$@" 2>&1
  ) | {
    # `read -t` wakes up every 5 s even while one big package compiles for minutes, so a
    # progress line comes at least every 30 s.
    local n=0 last=$SECONDS line rc partial=""
    while true; do
      if IFS= read -r -t 5 line; then
        line="$partial$line" partial=""
        # A package name is one word; anything else is go saying what went wrong.
        case "$line" in
          "#"* | *" "* | *.go:*) printf '%s\n' "$line" >&2 ;;
          *) n=$((n + 1)) ;;
        esac
        if (( n % 100 == 0 && n > 0 )); then
          say "  $dir: $n packages compiled, $((SECONDS - started)) s"
          last=$SECONDS
        fi
      else
        rc=$?
        (( rc > 128 )) || break # end of output (a timeout is > 128)
        partial="$partial$line" # a timeout keeps what it read of an unfinished line
      fi
      if (( SECONDS - last >= 30 )); then
        say "  $dir: $n packages compiled, $((SECONDS - started)) s"
        last=$SECONDS
      fi
    done
  }
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    say "building $dir failed (exit $rc); the lines above say why"
    return "$rc"
  fi
}

# emit BIN_DIR BINARY...: the stdout lines; missing BIN_DIR BINARY...: true when one is absent.
emit() { local bin=$1; shift; for b in "$@"; do printf '%s=%s\n' "$b" "$bin/$b"; done; }
missing() { local bin=$1; shift; for b in "$@"; do [ -x "$bin/$b" ] || return 0; done; return 1; }

# Kubernetes: version-stamped like a release build, so `kubectl version` shows it.
if wants kubernetes; then
  k8s=$(version kubernetes k8s.io/kubernetes)
  k8s_bin="$cache/k8s-$k8s/bin"
  k8s_tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  if missing "$k8s_bin" "${k8s_tools[@]}"; then
    say "building Kubernetes $k8s (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) into $k8s_bin"
    say "a cold cache builds each component once (Kubernetes ~2,000 packages, minutes on 2 cores), then it is cached"
    minor=${k8s#v1.}
    minor=${minor%%.*}
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    build kubernetes "$k8s_bin" "$ldflags" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  fi
  emit "$k8s_bin" "${k8s_tools[@]}"
fi

if wants etcd; then
  etcd=$(version etcd go.etcd.io/etcd/server/v3)
  etcd_bin="$cache/etcd-$etcd/bin"
  if missing "$etcd_bin" etcd; then
    say "building etcd $etcd into $etcd_bin"
    build etcd "$etcd_bin" "-s -w" .
  fi
  emit "$etcd_bin" etcd
fi

if wants kwok; then
  kwok=$(version kwok sigs.k8s.io/kwok)
  kwok_bin="$cache/kwok-$kwok/bin"
  if missing "$kwok_bin" kwok; then
    say "building kwok $kwok into $kwok_bin"
    build kwok "$kwok_bin" "-s -w" sigs.k8s.io/kwok/cmd/kwok
  fi
  emit "$kwok_bin" kwok
  # kwok's Stage definitions (how simulated nodes and pods move through their lifecycle) ship in
  # its module; the fixture passes the ones it needs with --config.
  kwok_dir=$(cd "$here/kwok" && go mod download -json sigs.k8s.io/kwok | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  printf 'kwok-stages=%s\n' "$kwok_dir/kustomize/stage"
fi

if wants metrics-server; then
  ms=$(version metrics-server sigs.k8s.io/metrics-server)
  ms_bin="$cache/metrics-server-$ms/bin"
  if missing "$ms_bin" metrics-server; then
    say "building metrics-server $ms into $ms_bin"
    build metrics-server "$ms_bin" "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$ms" \
      sigs.k8s.io/metrics-server/cmd/metrics-server
  fi
  emit "$ms_bin" metrics-server
fi

# helm: the chart's lint, template and install tests.
if wants helm; then
  helm=$(version helm helm.sh/helm/v3)
  helm_bin="$cache/helm-$helm/bin"
  if missing "$helm_bin" helm; then
    say "building helm $helm into $helm_bin"
    # As helm's Makefile: the Kubernetes version `helm template` and `helm lint` assume is the
    # one its client-go module speaks (v0.N -> 1.N).
    kminor=$(cd "$here/helm" && go list -m -f '{{.Version}}' k8s.io/client-go)
    kminor=${kminor#v0.}
    kminor=${kminor%%.*}
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm"
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
    done
    build helm "$helm_bin" "$ldflags" helm.sh/helm/v3/cmd/helm
  fi
  emit "$helm_bin" helm
fi

# The CNCF distribution registry: a real OCI registry on loopback for the image tests. Built from
# a main of our own beside its go.mod that registers only the filesystem and in-memory storage
# drivers and htpasswd auth, so the cloud storage SDKs upstream's cmd/registry links are not built.
if wants registry; then
  registry=$(version registry github.com/distribution/distribution/v3)
  registry_bin="$cache/registry-$registry/bin"
  if missing "$registry_bin" registry; then
    say "building the distribution registry $registry into $registry_bin"
    build registry "$registry_bin" "-s -w -X github.com/distribution/distribution/v3/version.version=$registry" .
  fi
  emit "$registry_bin" registry
fi

# virtual-kubelet's provider e2e suite: a test binary of a dependency's package (the `internal`
# rule limits imports, not builds). `go test -c` prints no package names, so a `go build -v` of
# the suite's dependencies comes first for the progress lines; the test build then finds them
# in the build cache.
if wants vk-e2e; then
  vk=$(version vk-e2e github.com/virtual-kubelet/virtual-kubelet)
  vk_bin="$cache/vk-e2e-$vk/bin"
  if missing "$vk_bin" vk-e2e.test; then
    say "building virtual-kubelet's provider e2e suite $vk into $vk_bin"
    suite=github.com/virtual-kubelet/virtual-kubelet/internal/test/e2e
    started=$SECONDS
    tmp="$vk_bin.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    deps=$(cd "$here/vk-e2e" && go list -tags e2e -deps -test \
      -f '{{if and (not .Standard) (not .ForTest) (ne .Name "main") .GoFiles}}{{.ImportPath}}{{end}}' "$suite")
    # shellcheck disable=SC2086 # one package per word
    if ! compile vk-e2e "$started" build -v -tags e2e $deps ||
      ! compile vk-e2e "$started" test -c -tags e2e -ldflags "-s -w" -o "$tmp/vk-e2e.test" "$suite"; then
      rm -rf "$tmp"
      exit 1
    fi
    rm -rf "$vk_bin" && mv "$tmp" "$vk_bin"
    built=1
    say "  vk-e2e built in $((SECONDS - started)) s"
  fi
  emit "$vk_bin" vk-e2e.test
fi

# e2e_tools: builds (once) and names the userland of the suite's images.
e2e_tools() {
  # The userland of the suite's images, which the playground builds offline: busybox from its
  # upstream source with its default configuration, as the suite's busybox image has it (Debian's
  # package patches ash to drop environment variables whose names are not shell identifiers,
  # which the suite's env tests print), and a static curl for the agnhost image (upstream's is
  # Alpine with curl; the lifecycle-hook tests run it). The sources are Debian's copies of the
  # upstream tarballs, pinned by digest.
  busybox_version=1.37.0 curl_version=8.14.1
  tools_bin="$cache/e2e-tools-busybox-$busybox_version-curl-$curl_version/bin"
  if missing "$tools_bin" busybox curl; then
    say "building busybox $busybox_version and curl $curl_version (static) into $tools_bin"
    command -v make >/dev/null && command -v cc >/dev/null || { say "make and a C compiler are needed"; exit 1; }
    started=$SECONDS
    tmp="$tools_bin.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp/src"
    # fetch FILE SHA256: a tarball from Debian's archive into $tmp/src, checked.
    fetch() {
      local url="http://deb.debian.org/debian/pool/main/${1:0:1}/${1%%_*}/$1"
      curl -fsS --retry 3 -o "$tmp/src/$1" "$url" || { say "cannot download $url"; return 1; }
      echo "$2  $tmp/src/$1" | sha256sum -c --quiet - || { say "$1 does not match its pinned digest"; return 1; }
    }
    fetch "busybox_$busybox_version.orig.tar.bz2" 3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4 &&
      fetch "curl_$curl_version.orig.tar.gz" 6766ada7101d292b42b8b15681120acd68effa4a9660935853cf6d61f0d984d4 ||
      { rm -rf "$tmp"; exit 1; }
    (
      cd "$tmp/src"
      tar xjf "busybox_$busybox_version.orig.tar.bz2"
      cd "busybox-$busybox_version"
      make defconfig >/dev/null
      # Static; tc left out: it does not compile against current kernel headers.
      sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config
      make -j"$(nproc)" >build.log 2>&1 || { tail -n 20 build.log >&2; exit 1; }
      cp busybox "$tmp/busybox"
    ) || { rm -rf "$tmp"; exit 1; }
    (
      cd "$tmp/src"
      tar xzf "curl_$curl_version.orig.tar.gz"
      cd "curl-$curl_version"
      # HTTP alone: no TLS or compression libraries to link statically.
      ./configure --disable-shared --enable-static --without-ssl --without-libpsl --without-zlib \
        --without-brotli --without-zstd --without-nghttp2 --without-libidn2 --without-librtmp \
        --without-libssh2 --disable-ldap --disable-ldaps --disable-manual --disable-docs \
        --disable-threaded-resolver >configure.log 2>&1 || { tail -n 20 configure.log >&2; exit 1; }
      make -j"$(nproc)" LDFLAGS=-all-static >build.log 2>&1 || { tail -n 20 build.log >&2; exit 1; }
      cp src/curl "$tmp/curl"
    ) || { rm -rf "$tmp"; exit 1; }
    rm -rf "$tmp/src" "$tools_bin" && mv "$tmp" "$tools_bin"
    say "  busybox and curl built in $((SECONDS - started)) s"
  fi
  emit "$tools_bin" busybox curl
}

# The e2e suite's tests of test/e2e/common alone (e2e-test/common) and agnhost, at the control
# plane's version: in CI's run, most of their packages are the control plane's, compiled already.
if wants e2e-common; then
  e2e=$(version e2e-test k8s.io/kubernetes)
  common_bin="$cache/e2e-common-$e2e/bin"
  if missing "$common_bin" e2e-common.test agnhost; then
    say "building the e2e suite's common tests (e2e-common.test) and agnhost $e2e into $common_bin"
    started=$SECONDS
    tmp="$common_bin.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    deps=$(cd "$here/e2e-test" && go list -deps -test \
      -f '{{if and (not .Standard) (not .ForTest) (ne .Name "main") .GoFiles}}{{.ImportPath}}{{end}}' ./common)
    # shellcheck disable=SC2086 # one package per word
    if ! compile e2e-test "$started" build -v $deps ||
      ! compile e2e-test "$started" build -v -ldflags "-s -w" -o "$tmp/" k8s.io/kubernetes/test/images/agnhost ||
      ! compile e2e-test "$started" test -c -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$e2e" \
        -o "$tmp/e2e-common.test" ./common; then
      rm -rf "$tmp"
      exit 1
    fi
    rm -rf "$common_bin" && mv "$tmp" "$common_bin"
    built=1
    say "  e2e-common built in $((SECONDS - started)) s"
  fi
  emit "$common_bin" e2e-common.test agnhost
  e2e_tools
fi

# Kubernetes' end-to-end suite and its agnhost image program, at the control plane's version.
# As for vk-e2e, a `go build -v` of the suite's dependencies first gives progress lines.
if wants e2e-test; then
  e2e=$(version e2e-test k8s.io/kubernetes)
  e2e_bin="$cache/e2e-test-$e2e/bin"
  if missing "$e2e_bin" e2e.test agnhost; then
    say "building Kubernetes' e2e.test and agnhost $e2e into $e2e_bin (~3,000 packages: long on a cold cache)"
    suite=k8s.io/kubernetes/test/e2e
    started=$SECONDS
    tmp="$e2e_bin.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    deps=$(cd "$here/e2e-test" && go list -deps -test \
      -f '{{if and (not .Standard) (not .ForTest) (ne .Name "main") .GoFiles}}{{.ImportPath}}{{end}}' "$suite")
    # shellcheck disable=SC2086 # one package per word
    if ! compile e2e-test "$started" build -v $deps ||
      ! compile e2e-test "$started" build -v -ldflags "-s -w" -o "$tmp/" k8s.io/kubernetes/test/images/agnhost ||
      ! compile e2e-test "$started" test -c -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$e2e" \
        -o "$tmp/e2e.test" "$suite"; then
      rm -rf "$tmp"
      exit 1
    fi
    rm -rf "$e2e_bin" && mv "$tmp" "$e2e_bin"
    built=1
    say "  e2e-test built in $((SECONDS - started)) s"
  fi
  emit "$e2e_bin" e2e.test agnhost

  e2e_tools
fi

if [ "$built" = 1 ]; then
  rm -rf "$GOCACHE"
fi
