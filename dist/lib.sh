# Shared by dist/binaries, dist/images and dist/release (sourced, not run).
#
# Everything they build is cached under $NODEWARD_CACHE (default ~/.cache/nodeward) by a hash
# of its inputs, so a second run with the same sources builds nothing.

set -euo pipefail

dist_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_root=${NODEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeward}

# Pinned tools (PyPI wheels carry prebuilt binaries; nothing to compile).
ZIG_VERSION=0.17.1
CARGO_ZIGBUILD_VERSION=0.24.0

dist_log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
dist_die() { dist_log "$*"; exit 1; }

# The version every artifact carries: the workspace's (Cargo.toml), which the chart's appVersion
# repeats (a test keeps them equal).
dist_version() {
  sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$dist_root/Cargo.toml"
}

# What the binaries are built from. Tests, benches and docs are left out: changing them makes no
# new binary.
dist_inputs() {
  (cd "$dist_root" && git ls-files -co --exclude-standard -- \
    Cargo.toml Cargo.lock rust-toolchain.toml \
    {api,decide,runtime,agent,coordinator}/Cargo.toml {api,decide,runtime,agent,coordinator}/build.rs \
    {api,decide,runtime,agent,coordinator}/src \
    dist/lib.sh dist/binaries | LC_ALL=C sort)
}

# sha256 over the named files' paths and contents, plus any extra words.
dist_hash() { # extra words...; file list on stdin
  local files
  files=$(cat)
  {
    printf '%s\n' "$@"
    (cd "$dist_root" && printf '%s\n' "$files" | while read -r f; do
      [ -f "$f" ] || continue
      printf '%s %s\n' "$f" "$(sha256sum <"$f" | cut -d' ' -f1)"
    done)
  } | sha256sum | cut -c1-16
}

# The revision `--version` and the image labels carry: the last commit that changed the
# inputs, `-dirty` when they have uncommitted changes.
dist_revision() {
  local files rev
  files=$(dist_inputs)
  # shellcheck disable=SC2086
  rev=$(cd "$dist_root" && git log -1 --format=%h --abbrev=12 -- $files 2>/dev/null || true)
  [ -n "$rev" ] || rev=unknown
  # shellcheck disable=SC2086
  if [ -n "$(cd "$dist_root" && git status --porcelain -- $files 2>/dev/null)" ]; then
    rev="$rev-dirty"
  fi
  echo "$rev"
}

# Seconds since the epoch of that commit: the images' creation time, so that the same sources
# give the same image digests.
dist_source_epoch() {
  local files epoch
  files=$(dist_inputs)
  # shellcheck disable=SC2086
  epoch=$(cd "$dist_root" && git log -1 --format=%ct -- $files 2>/dev/null || true)
  echo "${epoch:-0}"
}

# Every source change makes a new cache entry; without pruning they fill the disk (they did: a CI
# run failed with "No space left on device"). Keeps the KEEP most recently used entries named
# PREFIX* in DIR (a cache hit touches its entry) and removes the rest.
cache_prune() { # dir prefix keep
  local dir=$1 prefix=$2 keep=$3
  [ -d "$dir" ] || return 0
  find "$dir" -mindepth 1 -maxdepth 1 -name "$prefix*" -printf '%T@ %p\n' |
    LC_ALL=C sort -rn | tail -n +"$((keep + 1))" | cut -d' ' -f2- |
    while IFS= read -r old; do rm -rf -- "$old"; done
}

dist_rust_target() { # amd64|arm64
  case $1 in
    amd64) echo x86_64-unknown-linux-musl ;;
    arm64) echo aarch64-unknown-linux-musl ;;
    *) dist_die "unknown architecture '$1' (amd64 or arm64)" ;;
  esac
}

# cargo-zigbuild and zig (cross-compiling ring's C and linking against musl for both
# architectures without a system cross toolchain), installed once per version from PyPI.
dist_ensure_zigbuild() {
  local dir="$cache_root/tools/zigbuild-$CARGO_ZIGBUILD_VERSION-zig-$ZIG_VERSION"
  if [ ! -x "$dir/bin/cargo-zigbuild" ] || [ ! -x "$dir/ziglang/zig" ]; then
    command -v python3 >/dev/null || dist_die "python3 is needed to install cargo-zigbuild and zig from PyPI"
    dist_log "installing cargo-zigbuild $CARGO_ZIGBUILD_VERSION and zig $ZIG_VERSION from PyPI"
    python3 -m pip --version >/dev/null 2>&1 || dist_ensure_packages pip3=python3-pip
    local pip=(python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location
      --target "$dir.tmp" "cargo-zigbuild==$CARGO_ZIGBUILD_VERSION" "ziglang==$ZIG_VERSION")
    rm -rf "$dir.tmp"
    # A distribution's own Python refuses installs unless told (PEP 668); --target stays apart
    # from its packages.
    "${pip[@]}" >&2 || { rm -rf "$dir.tmp" && "${pip[@]}" --break-system-packages >&2; }
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  export PATH="$dir/bin:$dir/ziglang:$PATH"
}

dist_ensure_rust_targets() { # rust targets...
  local installed missing=()
  command -v rustup >/dev/null || dist_die "rustup is needed to add the musl targets"
  installed=$(cd "$dist_root" && rustup target list --installed)
  for t in "$@"; do
    grep -qx "$t" <<<"$installed" || missing+=("$t")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    dist_log "adding Rust targets ${missing[*]}"
    (cd "$dist_root" && rustup target add "${missing[@]}" >&2)
  fi
}

# Debian packages the dist scripts need, installed when missing (as root).
dist_ensure_packages() { # command=package...
  local pair missing=()
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || dist_die "missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]}) or run as root"
  dist_log "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}
