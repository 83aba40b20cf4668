#!/usr/bin/env bash
# Starts the node lab: N Debian VMs under QEMU (systemd as PID 1, containerd, a real kubelet
# and kube-proxy) joined to the test control plane as real Nodes, and keeps them running.
#
#   tests/nodelab/start.sh STATE_DIR --controlplane CP_STATE_DIR [--nodes 3] [--parent-pid PID]
#                          [--images DIR]   # nodeward's amd64 image archives (default target/images)
#
# Networking reaches only what the test owns:
# - NIC 1: QEMU user networking with restrict=on; its only ways out are a guestfwd of
#   10.0.2.100:PORT to the API server on this machine's loopback (a socat per connection), and
#   one of 10.0.2.101:80 to STATE_DIR/metadata.sock, where a test may serve an EC2-compatible
#   instance metadata service (the address is in the user network, as guestfwd needs; nothing
#   answers while no test listens).
# - NIC 2: the lab network, a bridge (nwlab0, 10.77.0.1/24) with one tap per VM: the nodes
#   (10.77.0.11, .12, ...) reach each other, and this machine reaches them and their pods
#   (10.88.N.0/24, routed here), e.g. the API server calling a webhook served by a pod. An
#   nftables table drops whatever a VM starts towards this machine on that bridge.
#
# Each node has its own client certificate (CN system:node:NAME, O system:nodes) signed by the
# control plane's CA, so the Node authorizer and NodeRestriction apply as in production. The
# lab's images (pause, busybox) and nodeward's (target/images, amd64) are imported into each
# node's containerd at boot.
#
# STATE_DIR/env names the nodes; STATE_DIR/NODE/ holds qga.sock (QEMU guest agent), qmp.sock,
# console.sock and console.log (the serial console, logged in as root). A VM that powers off
# stays off until STATE_DIR/NODE/power-on is created. STATE_DIR/ready appears once every node
# is Ready. Runs until SIGTERM/SIGINT or until PID exits; then stops the VMs, removes the
# network and deletes the Nodes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root_dir=$(cd "$here/../.." && pwd)
state=${1:?usage: start.sh STATE_DIR --controlplane CP_STATE_DIR [--nodes N] [--parent-pid PID] [--images DIR]}
shift
cp_state= nodes=3 parent=$PPID images_dir="$root_dir/target/images"
while [ $# -gt 0 ]; do
  case $1 in
    --controlplane) cp_state=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --parent-pid) parent=$2; shift 2 ;;
    --images) images_dir=$2; shift 2 ;;
    *) echo "start.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$cp_state" ] && [ -e "$cp_state/ready" ] || { echo "start.sh: --controlplane must name a running control plane's state directory" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "start.sh: the node lab needs root (bridge, taps, nftables)" >&2; exit 2; }

log() { printf '[nodelab %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
started=$(date +%s)
mkdir -p "$state"
state=$(cd "$state" && pwd)
exec 9>"$state/lock"
flock -n 9 || { log "another node lab runs in $state"; exit 1; }
rm -f "$state/ready"

missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v qemu-img >/dev/null || missing+=(qemu-utils)
command -v socat >/dev/null || missing+=(socat)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

image=$("$here/image.sh")
# shellcheck source=/dev/null
source "$cp_state/env"
api_port=${NODEWARD_API_SERVER##*:}
pki="$cp_state/pki"
bridge=nwlab0
lab_net=10.77.0
table=nodeward_lab

# --- cleanup: VMs, taps, bridge, routes, firewall ------------------------------------------
vm_pids=()
names=()
teardown_network() {
  local i
  for ((i = 1; i <= nodes; i++)); do
    ip link del "nwlab-lab$i" 2>/dev/null || true
    ip route del "10.88.$i.0/24" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  nft delete table inet "$table" 2>/dev/null || true
}
stop_all() {
  local status=$?
  trap - EXIT INT TERM
  rm -f "$state/ready"
  touch "$state/stopping"
  if [ ${#vm_pids[@]} -gt 0 ]; then
    log "stopping the VMs"
    for pid in "${vm_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    pkill -TERM -f "qemu-system-x86_64 -name nodelab-" 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  teardown_network
  # Their Nodes go too: a NotReady node left behind would count in later tests' policies.
  for name in "${names[@]}"; do
    curl -fsS -o /dev/null --max-time 10 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" \
      --key "$pki/admin.key" -X DELETE "$NODEWARD_API_SERVER/api/v1/nodes/$name" 2>/dev/null || true
  done
  exit "$status"
}
trap stop_all EXIT
trap 'exit 0' INT TERM
rm -f "$state/stopping"

# --- the lab network ------------------------------------------------------------------------
teardown_network # what an earlier, killed run may have left
ip link add "$bridge" type bridge
ip addr add "$lab_net.1/24" dev "$bridge"
ip link set "$bridge" up
nft -f - <<EOF
table inet $table {
  chain input {
    type filter hook input priority -10; policy accept;
    iifname "$bridge" ct state established,related accept
    iifname "$bridge" drop
  }
}
EOF

# --- per node: certificates, config disk, disk overlay, tap ----------------------------------
openssl_quiet() { openssl "$@" 2>>"$state/openssl.log"; }
sign() { # name, subject (a client certificate from the control plane's CA)
  openssl_quiet req -new -newkey rsa:2048 -nodes -keyout "$2.key" -subj "$1" -out "$2.csr"
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$2.ext"
  openssl_quiet x509 -req -in "$2.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 7 -sha256 -extfile "$2.ext" -out "$2.crt"
  rm -f "$2.csr" "$2.ext"
}
source "$(dirname "${BASH_SOURCE[0]}")/../kubeconfig.sh"
kubeconfig() { # file, certificate base name (relative to /etc/kubernetes/pki in the guest)
  local guest_pki=/etc/kubernetes/pki
  write_kubeconfig "$1" "https://10.0.2.100:$api_port" "$guest_pki/ca.crt" node "$guest_pki/$2"
}

for ((i = 1; i <= nodes; i++)); do
  name="lab$i"
  names+=("$name")
  dir="$state/$name"
  rm -rf "$dir" && mkdir -p "$dir/config/pki" "$dir/config/images"
  routes=""
  for ((j = 1; j <= nodes; j++)); do
    [ "$j" -eq "$i" ] || routes+="10.88.$j.0/24 via $lab_net.$((10 + j));"
  done
  cat >"$dir/config/node.env" <<EOF
NODE_NAME=$name
LAB_IP=$lab_net.$((10 + i))
POD_CIDR=10.88.$i.0/24
ROUTES="$routes"
EOF
  cp "$pki/ca.crt" "$dir/config/pki/ca.crt"
  sign "/O=system:nodes/CN=system:node:$name" "$dir/config/pki/kubelet"
  # kube-proxy's own identity (bound to system:node-proxier by default RBAC).
  sign "/CN=system:kube-proxy" "$dir/config/pki/kube-proxy"
  kubeconfig "$dir/config/kubelet.kubeconfig" kubelet
  kubeconfig "$dir/config/kube-proxy.kubeconfig" kube-proxy
  cp "$image"/images/*.oci.tar "$dir/config/images/"
  for f in "$images_dir"/nodeward-*_linux-amd64.oci.tar; do
    [ -e "$f" ] && cp "$f" "$dir/config/images/"
  done
  for f in "$dir/config/images/"*.oci.tar; do mv "$f" "${f%.oci.tar}.tar"; done
  [ -x "$here/setup-$name.sh" ] && cp "$here/setup-$name.sh" "$dir/config/setup.sh"
  mkfs.ext4 -q -d "$dir/config" -L NODELAB "$dir/config.img" 64M >&2
  qemu-img create -q -f qcow2 -b "$image/disk.img" -F raw "$dir/disk.qcow2"
  ip tuntap add "nwlab-$name" mode tap
  ip link set "nwlab-$name" master "$bridge" up
  ip route replace "10.88.$i.0/24" via "$lab_net.$((10 + i))" dev "$bridge"
done

# The API server's Service: guests reach it where their guestfwd listens.
endpointslice=$(cat <<EOF
{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
 "metadata":{"name":"kubernetes-nodelab","namespace":"default","labels":{"kubernetes.io/service-name":"kubernetes"}},
 "addressType":"IPv4","endpoints":[{"addresses":["10.0.2.100"],"conditions":{"ready":true}}],
 "ports":[{"name":"https","port":$api_port,"protocol":"TCP"}]}
EOF
)
curl -fsS -o /dev/null --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  -X PUT -H 'Content-Type: application/json' --data "$endpointslice" \
  "$NODEWARD_API_SERVER/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes-nodelab" ||
  curl -fsS -o /dev/null --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    -X POST -H 'Content-Type: application/json' --data "$endpointslice" \
    "$NODEWARD_API_SERVER/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"

# --- the VMs ----------------------------------------------------------------------------------
# KVM is present on these machines but a KVM guest did not progress: software emulation. One
# host thread per VM (thread=single): with a thread per vCPU a guest's live kernel patching
# (int3 text pokes) raced the other vCPU and panicked the guest at boot, and six busy threads
# on two cores only thrashed. One vCPU each: two took turns on that one thread, and every
# wake-up or TLB flush sent to the other waited for its turn; beside a build, the agent's
# checks of a unit took 3.7 to 4.7 s on two vCPUs against 1.5 to 1.7 s on one, and an idle VM
# 26 % of a host core against 23 % (BENCHMARKS.md, "Build and node lab"). (Two vCPUs were chosen
# when a node with one took minutes to start pods: the sandboxes' runtime request timeout,
# since raised in rootfs/etc/kubernetes/kubelet.yaml.) A guest that
# panics all the same restarts (panic=10) instead of hanging until the lab's deadline. Each has
# a hardware watchdog (an emulated Intel 6300ESB) that resets it, for the agents' fencing.
accel=tcg,thread=single
# Emulated instructions are the lab's cost, so the guests' kernels skip what only guards against
# other tenants' code (the lab runs only its tests): Spectre's retpolines and return-stack
# refills on every indirect call and context switch, the crypto self-tests at boot. The CPU has
# no SVM, so no guest loads KVM's modules for a nested hypervisor it cannot use.
cpu=qemu64,-svm
speed="mitigations=off cryptomgr.notests"
run_vm() { # index: runs the VM, powers it on again when asked, until the lab stops
  local i=$1 name="lab$1" dir="$state/lab$1"
  local mac_n
  mac_n=$(printf '%02x' "$i")
  while [ ! -e "$state/stopping" ]; do
    rm -f "$dir/power-on"
    echo "$(date +%s) start" >>"$dir/power.log"
    qemu-system-x86_64 -name "nodelab-$name" -accel "$accel" -cpu "$cpu" -m 1536 -smp 1 \
      -nographic -no-user-config -nodefaults \
      -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
      -append "root=/dev/vda rw console=ttyS0 loglevel=4 systemd.show_status=auto panic=10 $speed" \
      -drive "file=$dir/disk.qcow2,if=virtio,format=qcow2" \
      -drive "file=$dir/config.img,if=virtio,format=raw,readonly=on" \
      -netdev "user,id=uplink,restrict=on,guestfwd=tcp:10.0.2.100:$api_port-cmd:socat STDIO TCP:127.0.0.1:$api_port,guestfwd=tcp:10.0.2.101:80-cmd:socat STDIO UNIX-CONNECT:$state/metadata.sock" \
      -device "virtio-net-pci,netdev=uplink,addr=0x3,mac=52:54:00:12:34:$mac_n" \
      -netdev "tap,id=lab,ifname=nwlab-$name,script=no,downscript=no" \
      -device "virtio-net-pci,netdev=lab,addr=0x4,mac=52:54:00:77:00:$mac_n" \
      -chardev "socket,id=console,path=$dir/console.sock,server=on,wait=off,logfile=$dir/console.log,logappend=on" \
      -serial chardev:console \
      -chardev "socket,id=qga,path=$dir/qga.sock,server=on,wait=off" \
      -device virtio-serial -device "virtserialport,chardev=qga,name=org.qemu.guest_agent.0" \
      -qmp "unix:$dir/qmp.sock,server=on,wait=off" \
      -device i6300esb -action watchdog=reset \
      >>"$dir/qemu.log" 2>&1 || true
    echo "$(date +%s) off" >>"$dir/power.log"
    # Powered off: stays off until a test powers it on again.
    while [ ! -e "$dir/power-on" ] && [ ! -e "$state/stopping" ]; do sleep 0.5; done
  done
}
for ((i = 1; i <= nodes; i++)); do
  run_vm "$i" &
  vm_pids+=($!)
done

cat >"$state/env" <<EOF
NODEWARD_NODELAB_NODES="${names[*]}"
NODEWARD_NODELAB_NETWORK=$lab_net.0/24
NODEWARD_NODELAB_IMAGE=$image
EOF

# --- wait for every node to be Ready -----------------------------------------------------------
# Ready, and reporting its address on the lab network (a node whose lab NIC came up
# unconfigured is Ready too, but no peer or pod on another node can reach it).
node_ready() { # name, lab address
  local node
  node=$(curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "$NODEWARD_API_SERVER/api/v1/nodes/$1" 2>/dev/null | tr -d ' \n')
  grep -q '"type":"Ready","status":"True"' <<<"$node" &&
    grep -q "\"address\":\"$2\"" <<<"$node"
}
deadline=$(($(date +%s) + ${NODEWARD_NODELAB_BOOT_TIMEOUT:-1800}))
for ((i = 1; i <= nodes; i++)); do
  name="lab$i"
  until node_ready "$name" "$lab_net.$((10 + i))"; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
      log "$name is not Ready in time; the end of its console:"
      tail -n 40 "$state/$name/console.log" >&2 || true
      exit 1
    fi
    sleep 2
  done
  log "$name Ready after $(($(date +%s) - started)) s"
done
touch "$state/ready"
log "ready in $(($(date +%s) - started)) s: ${names[*]} ($state)"

while kill -0 "$parent" 2>/dev/null; do sleep 1; done
log "parent $parent is gone"
