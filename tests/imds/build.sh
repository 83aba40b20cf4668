#!/usr/bin/env bash
# Builds amazon-ec2-metadata-mock (AWS's emulator of the EC2 instance metadata service, IMDSv1
# and IMDSv2) from its Go module at AEMM_VERSION (tests/controlplane/versions.env), once per
# machine: the binary is cached in a directory keyed by that version. Prints the binary's path
# on stdout; progress goes to stderr.
#
#   tests/imds/build.sh                    # build if missing, print the binary's path
#   NODEWARD_TESTBIN_CACHE=/some/dir ...   # cache root (default ~/.cache/nodeward/testbin)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../controlplane/versions.env
source "$here/../controlplane/versions.env"

arch=$(go env GOOS)-$(go env GOARCH)
cache_root=${NODEWARD_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeward/testbin}
bin="$cache_root/aemm-${AEMM_VERSION}_${arch}/ec2-metadata-mock"

log() { printf '[imds/build] %s\n' "$*" >&2; }

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { log "go is not installed; install Go >= 1.24 (Debian: golang-go)"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A throwaway main module requiring the emulator's, so that its go.sum pins what it builds.
printf 'module nodeward.test/aemm\n\ngo 1.24\n\nrequire github.com/aws/amazon-ec2-metadata-mock %s\n' \
  "$AEMM_VERSION" >"$work/go.mod"
log "building amazon-ec2-metadata-mock ${AEMM_VERSION}"
mkdir -p "$(dirname "$bin")"
(cd "$work" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" \
  go build -o "$bin.tmp.$$" github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock)
# Two test processes may build at once (the crate tests' and the node lab's): each its own file.
mv "$bin.tmp.$$" "$bin"
log "built $bin"
echo "$bin"
