#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd,
# kwok) and the node lab's node components (kubelet, kube-proxy) from their Go modules at the versions pinned in versions.env, once per machine: the
# binaries are cached in a directory keyed by those versions. Prints that directory on stdout; progress goes to
# stderr.
#
#   tests/controlplane/build.sh            # build if missing, print the bin directory
#   NODEWARD_TESTBIN_CACHE=/some/dir ...   # cache root (default ~/.cache/nodeward/testbin)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

arch=$(go env GOOS)-$(go env GOARCH)
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_${arch}"
cache_root=${NODEWARD_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeward/testbin}
bin="$cache_root/$key"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd kwok)

log() { printf '[controlplane/build] %s\n' "$*" >&2; }

all_present() {
  local b
  for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

if all_present; then
  log "cached: $bin"
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed; install Go >= 1.24 (Debian: golang-go)"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
staging="$work/out"
mkdir -p "$staging" "$cache_root"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# A wrapper module per component: each upstream module is the dependency of a throwaway main
# module, so that its own replace directives (which Go ignores in dependencies) are restated
# here with published versions.
wrapper() { # dir, module path, then go.mod body
  local dir=$1
  mkdir -p "$dir"
  printf 'module nodeward.test/%s\n\ngo 1.24\n\n%s\n' "$2" "$3" >"$dir/go.mod"
}

started=$(date +%s)

# --- Kubernetes: map every k8s.io/* staging module to its published v0.x.y twin -----------
log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy ${KUBERNETES_VERSION}"
k8s_mod_file=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" |
  sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
staging_version="v0.${KUBERNETES_VERSION#v1.}"
replaces=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$k8s_mod_file")
[ -n "$replaces" ] || { log "no staging replace directives found in $k8s_mod_file"; exit 1; }
wrapper "$work/kubernetes" kubernetes "require k8s.io/kubernetes ${KUBERNETES_VERSION}

replace (
$replaces
)"
minor=${KUBERNETES_VERSION#v1.}
minor=${minor%%.*}
version_pkg=k8s.io/component-base/version
ldflags="-s -w -X ${version_pkg}.gitVersion=${KUBERNETES_VERSION} -X ${version_pkg}.gitMajor=1 -X ${version_pkg}.gitMinor=${minor} -X ${version_pkg}.gitTreeState=clean"
(
  cd "$work/kubernetes"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"\n)\n' >tools.go
  go mod tidy >&2
  # One build: the five share most of their packages. Static (no cgo), as the kubelet and
  # kube-proxy run inside the node lab's VMs.
  go build -trimpath -ldflags "$ldflags" -o "$staging/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy >&2
)

# --- etcd ----------------------------------------------------------------------------------
log "building etcd ${ETCD_VERSION}"
wrapper "$work/etcd" etcd "require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"
(
  cd "$work/etcd"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "$staging/etcd" go.etcd.io/etcd/server/v3 >&2
)

# --- kwok ----------------------------------------------------------------------------------
log "building kwok ${KWOK_VERSION}"
wrapper "$work/kwok" kwok "require sigs.k8s.io/kwok ${KWOK_VERSION}"
(
  cd "$work/kwok"
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kwok/cmd/kwok"\n' >tools.go
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    -o "$staging/kwok" sigs.k8s.io/kwok/cmd/kwok >&2
)

# Publish atomically so that an interrupted build never leaves a half-filled cache entry.
tmp_dest="$bin.partial.$$"
rm -rf "$tmp_dest"
cp -a "$staging" "$tmp_dest"
rm -rf "$bin"
mv "$tmp_dest" "$bin"
log "built in $(($(date +%s) - started)) s: $bin"
echo "$bin"
