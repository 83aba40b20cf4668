#!/usr/bin/env bash
# Installs a Rust tool from crates.io once per machine and version (`cargo install --locked`,
# cached), and prints the binary's path. Built without the tools' own fat LTO and single codegen
# unit: they check this workspace in seconds either way, and on a cold machine that LTO was
# most of the build (cargo-deny: 240 s).
#
#   tests/tools/cargo-tool.sh cargo-deny        # the version pinned below
set -euo pipefail
declare -A pinned=(
  [cargo-deny]=0.20.2      # ./tests/run: licenses, bans, sources
  [cargo-cyclonedx]=0.5.9  # dist/release: the SBOM
  [cargo-fuzz]=0.13.2      # fuzz/run
)
name=${1:?usage: cargo-tool.sh NAME}
version=${pinned[$name]:?no version pinned for $name}
root=${NODEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeward}/tools/$name-$version
if [ ! -x "$root/bin/$name" ]; then
  echo "building $name $version from crates.io (once per machine)" >&2
  # A package cache of the tools' own: ./tests/run builds them at the lowest priority beside
  # the workspace's builds, and a download of theirs starved of CPU while holding cargo's lock on
  # a shared cache would hold up the test build.
  CARGO_HOME="${root%/*}/cargo-home" \
    CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo install --quiet --locked --root "$root.tmp" "$name@$version" >&2
  rm -rf "$root" && mv "$root.tmp" "$root"
fi
echo "$root/bin/$name"
