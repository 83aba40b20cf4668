#!/usr/bin/env bash
# Builds the node lab's VM image from Debian packages, once per set of inputs, and prints the
# directory holding it:
#
#   disk.img      raw ext4 root filesystem: Debian trixie (systemd as PID 1, dbus, udev,
#                 containerd, runc, CNI plugins, nftables, qemu-guest-agent, polkitd), the
#                 kubelet and kube-proxy built by tests/controlplane/build.sh (the control plane's
#                 version), and tests/nodelab/rootfs/ (units, containerd and kubelet configs)
#   vmlinuz, initrd.img   the image's kernel and the lab's own small initramfs (initramfs-init),
#                 which QEMU boots directly
#   images/       the lab's own container images as OCI archives: nodeward.test/pause:1 (the
#                 pod sandbox, tests/nodelab/images/pause.c) and nodeward.test/busybox:1
#
# The cache key is a hash of every input (this script, rootfs/, images/, the package list, the
# kubelet and kube-proxy binaries, the host's busybox). Needs root (mmdebstrap, chroot).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root_dir=$(cd "$here/../.." && pwd)
# shellcheck source=../../dist/lib.sh
. "$root_dir/dist/lib.sh" # cache_root, cache_prune
suite=trixie
packages=(
  systemd systemd-sysv dbus udev kmod iproute2 linux-image-cloud-amd64
  containerd runc containernetworking-plugins iptables nftables conntrack
  ca-certificates procps qemu-guest-agent polkitd util-linux dnsmasq-base
)
disk_size=4G

log() { printf '[nodelab/image] %s\n' "$*" >&2; }

bin=$("$root_dir/tests/controlplane/build.sh")
busybox=/bin/busybox
if ! file_is_static=$(LC_ALL=C readelf -lW "$busybox" 2>/dev/null) ||
  grep -q 'Requesting program interpreter' <<<"$file_is_static"; then
  busybox=
fi

# What the build needs, installed before the key is taken: the key hashes the host's static
# busybox, so that a fresh machine's first run and its later ones agree on the key.
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v buildah >/dev/null || need+=(buildah)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[ -n "$busybox" ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { log "installing ${need[*]} needs root"; exit 1; }
  log "installing Debian packages: ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  busybox=/bin/busybox
fi

key=$(
  {
    echo "$suite ${packages[*]} $disk_size"
    sha256sum "$bin/kubelet" "$bin/kube-proxy" "$here/image.sh" "$here/initramfs-init" | cut -d' ' -f1
    [ -n "$busybox" ] && sha256sum "$busybox" | cut -d' ' -f1
    (cd "$here" && find rootfs images -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    (cd "$here" && find rootfs -printf '%p %m\n' | LC_ALL=C sort)
  } | sha256sum | cut -c1-16
)
out="$cache_root/nodelab/image-$key"
if [ -e "$out/done" ]; then
  touch "$out"
  log "cached: $out"
  echo "$out"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || { log "building the node image needs root (mmdebstrap, chroot)"; exit 1; }
started=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/nodelab-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs="$work/root"
mkdir -p "$rootfs"

log "mmdebstrap $suite (${#packages[@]} packages and their dependencies)"
mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  "$suite" "$work/rootfs.tar" >&2
tar -C "$rootfs" -xf "$work/rootfs.tar"
rm "$work/rootfs.tar"

cp -a "$here/rootfs/." "$rootfs/"
install -m 0755 "$bin/kubelet" "$bin/kube-proxy" "$rootfs/usr/local/bin/"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$rootfs/etc/fstab"
echo nodelab >"$rootfs/etc/hostname"
# Every VM makes its own machine id on its first boot.
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/var/lib/dbus/machine-id"
chroot "$rootfs" systemctl enable --quiet systemd-networkd.service nodelab-config.service \
  nodelab-images.service nodelab-dns.service kubelet.service kube-proxy.service
# Nothing waits for "network online" longer than the lab needs, and none of Debian's daily and
# weekly timers (apt, the dpkg database's backup, the disk's scrub and trim) wakes in a test: the
# patching tests run apt and dpkg themselves, and a VM has no CPU to spare.
chroot "$rootfs" systemctl mask --quiet systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer 2>/dev/null || true

mkdir -p "$work/out/images"
cp "$rootfs"/boot/vmlinuz-* "$work/out/vmlinuz"
# The lab's own initramfs in place of Debian's: the root disk's driver (virtio_blk is a module in
# Debian's cloud kernel), a static busybox and an /init that mounts /dev/vda and hands over to
# systemd. Debian's ran udev and its scripts for 10 s of every boot under emulation; this one
# takes well under a second.
initramfs="$work/initramfs"
mkdir -p "$initramfs/bin" "$initramfs/dev" "$initramfs/proc" "$initramfs/root"
cp "$busybox" "$initramfs/bin/busybox"
virtio_blk=$(find "$rootfs/usr/lib/modules" -name 'virtio_blk.ko*' | head -n1)
[ -n "$virtio_blk" ] || { log "the image's kernel has no virtio_blk module"; exit 1; }
case $virtio_blk in
  *.xz) "$busybox" unxz -c "$virtio_blk" >"$initramfs/virtio_blk.ko" ;;
  *) cp "$virtio_blk" "$initramfs/virtio_blk.ko" ;;
esac
cp "$here/initramfs-init" "$initramfs/init"
chmod 0755 "$initramfs/init"
(cd "$initramfs" && find . -print | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) \
  >"$work/out/initrd.img"
log "mkfs.ext4 ($disk_size, sparse)"
mkfs.ext4 -q -d "$rootfs" -L root "$work/out/disk.img" "$disk_size" >&2

log "container images: nodeward.test/pause:1, nodeward.test/busybox:1"
context="$work/context"
mkdir -p "$context"
gcc -static -Os -Wall -Werror -o "$context/pause" "$here/images/pause.c"
strip "$context/pause"
cp "$busybox" "$context/busybox"
store="$work/buildah"
bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }
for image in pause busybox; do
  bah bud --quiet --isolation chroot --format oci --layers=false --timestamp 0 \
    --target "$image" -f "$here/images/Dockerfile" -t "localhost/$image" "$context" >/dev/null
  bah push --quiet --format oci "localhost/$image" \
    "oci-archive:$work/out/images/$image.oci.tar:nodeward.test/$image:1" >/dev/null
done
bah rm --all >/dev/null 2>&1 || true

mkdir -p "$(dirname "$out")"
rm -rf "$out"
mv "$work/out" "$out"
touch "$out/done"
cache_prune "$cache_root/nodelab" image- 2
log "built in $(($(date +%s) - started)) s: $out"
echo "$out"
