#!/usr/bin/env bash
# Builds helm from its Go module once per machine and version, and prints the binary's path.
# The chart tests call it (./tests/run does, before the tests).
set -euo pipefail
HELM_VERSION=v3.21.4
cache=${NODEWARD_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeward/testbin}/helm-$HELM_VERSION
bin="$cache/helm"
if [ ! -x "$bin" ]; then
  command -v go >/dev/null 2>&1 || { echo "tests/tools/helm.sh: Go is needed to build helm" >&2; exit 1; }
  mkdir -p "$cache"
  echo "building helm $HELM_VERSION from helm.sh/helm/v3 (once per machine)" >&2
  GOBIN="$cache" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath -ldflags="-s -w" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi
echo "$bin"
