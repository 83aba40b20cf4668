#!/usr/bin/env bash
# The node lab's cost at rest, and what the agent's checks take there: for a running lab (its
# VMs Ready, the chart installed by a lab test), over one window of SECONDS:
# - each VM's host CPU (its QEMU process, % of one host core);
# - in each guest, the CPU of the agent, the bus daemon, systemd, journald, the kubelet and
#   containerd (% of the VM's one vCPU), read from /proc through the guest agent;
# - each of the agent's checks: how many ran and their mean duration
#   (nodeward_check_duration_seconds from the agent's /metrics on the lab network).
#
#   bench/lab_footprint.sh LAB_DIR [SECONDS]      # default 90
#   LOAD=2 bench/lab_footprint.sh LAB_DIR         # the same beside 2 busy host threads (a build)
#
# LAB_DIR is tests/nodelab/start.sh's state directory. Not beside the lab's tests: a VM's guest
# agent socket takes one client at a time, and theirs would wait for this one. Figures in BENCHMARKS.md, "Build and node
# lab".
set -euo pipefail
export LC_ALL=C # sort and join agree on the order
lab=${1:?usage: lab_footprint.sh LAB_DIR [SECONDS]}
window=${2:-90}
load=${LOAD:-0}
# shellcheck source=/dev/null
source "$lab/env"
read -r -a vms <<<"$NODEWARD_NODELAB_NODES"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
metrics() { # vm: the agent's check durations, "DETECTOR:count N" and "DETECTOR:sum S" lines
  local n=${1#lab}
  { curl -fsS --max-time 20 "http://10.77.0.$((10 + n)):9470/metrics" || echo "$1: no agent answered" >&2; } |
    sed -n 's/^nodeward_check_duration_seconds_\(sum\|count\){detector="\([^"]*\)"} \(.*\)/\2:\1 \3/p' |
    sort
}
# Runs a shell script in VM through QEMU's guest agent and prints its output.
guest() { # vm, script
  python3 - "$lab/$1/qga.sock" "$2" "$((window + 60))" <<'EOF'
import base64, json, socket, sys, time
sock = socket.socket(socket.AF_UNIX)
sock.settimeout(float(sys.argv[3]))  # a guest that is rebooting does not answer
sock.connect(sys.argv[1])
stream = sock.makefile("rw")
def call(command, arguments=None):
    stream.write(json.dumps({"execute": command, "arguments": arguments or {}}) + "\n")
    stream.flush()
    while True:
        reply = json.loads(stream.readline())
        if "return" in reply or "error" in reply:
            return reply
# The answer to this sync, not one left over from an earlier client, starts this client's part.
token = int(time.time() * 1000) % 2**31
while call("guest-sync", {"id": token}).get("return") != token:
    pass
pid = call("guest-exec", {"path": "/bin/sh", "arg": ["-c", sys.argv[2]], "capture-output": True})["return"]["pid"]
while True:
    status = call("guest-exec-status", {"pid": pid})["return"]
    if status["exited"]:
        break
    time.sleep(2)
sys.stdout.write(base64.b64decode(status.get("out-data", "")).decode(errors="replace"))
EOF
}
# In the guest: each daemon's CPU over the window, % of one vCPU.
in_guest="t=\$(getconf CLK_TCK)
s() { for c in nodeward-agent dbus-daemon systemd systemd-journal kubelet containerd; do
  p=\$(pgrep -o -x \$c) && echo \$c \$(awk '{print \$14 + \$15}' /proc/\$p/stat); done; }
s >/tmp/lab_footprint.a; sleep $window; s >/tmp/lab_footprint.b
awk -v t=\$t -v w=$window 'NR == FNR { a[\$1] = \$2; next } \$1 in a { printf \"  %s %.1f %%\\n\", \$1, (\$2 - a[\$1]) / t / w * 100 }' /tmp/lab_footprint.a /tmp/lab_footprint.b"

hogs=()
for ((i = 0; i < load; i++)); do
  sh -c 'while :; do :; done' &
  hogs+=($!)
done
trap '[ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null' EXIT

declare -A before qemu
start=$(date +%s.%N)
for vm in "${vms[@]}"; do
  metrics "$vm" >"$lab/$vm/footprint.before"
  qemu[$vm]=$(pgrep -f "qemu-system-x86_64 -name nodelab-$vm ")
  before[$vm]=$(ticks "${qemu[$vm]}")
  { guest "$vm" "$in_guest" || echo "  (its guest agent did not answer)"; } >"$lab/$vm/footprint.guest" &
done
wait
elapsed=$(echo "$(date +%s.%N) - $start" | bc -l)
hz=$(getconf CLK_TCK)

echo "window ${elapsed%.*} s, $load busy host threads beside"
for vm in "${vms[@]}"; do
  used=$(echo "($(ticks "${qemu[$vm]}") - ${before[$vm]}) / $hz / $elapsed * 100" | bc -l)
  printf '%s: %.1f %% of a host core\n' "$vm" "$used"
  cat "$lab/$vm/footprint.guest"
  metrics "$vm" | join - "$lab/$vm/footprint.before" | awk '
    { split($1, key, ":"); change[key[1], key[2]] = $2 - $3; names[key[1]] = 1 }
    END {
      for (name in names) {
        runs = change[name, "count"]
        if (runs > 0) printf "  check %s: %d runs, mean %.3f s\n", name, runs, change[name, "sum"] / runs
      }
    }' | sort
done
