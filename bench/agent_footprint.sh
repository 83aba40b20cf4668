#!/usr/bin/env bash
# Agent footprint in steady state: RSS, CPU and API writes per minute of one
# `nodeward-agent run` with every detector on, against the real test control plane, for a kwok
# node. Prints one line of figures per run, with the RSS split into the binary's mapped code
# (file) and the heap (anonymous).
#
#   bench/agent_footprint.sh [SECONDS]        # default 600 (the issue's 10 minutes)
#
# The agent measured is the one the images ship: the static musl build of dist/binaries
# (profile `dist`). NODEWARD_AGENT_BINARY=PATH measures another build, e.g. the glibc one of
# `cargo build --profile dist -p nodeward-agent` (target/dist/nodeward-agent).
# Uses the control plane in $NODEWARD_TEST_CONTROLPLANE if set, else starts one; the CRDs are
# created if it has none.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
duration=${1:-600}

agent=${NODEWARD_AGENT_BINARY:-}
if [ -z "$agent" ]; then
  agent="$(dist/binaries "$(dpkg --print-architecture)")/$(dpkg --print-architecture)/nodeward-agent"
fi

state=${NODEWARD_TEST_CONTROLPLANE:-}
if [ -z "$state" ]; then
  state="$root/target/bench-controlplane"
  rm -rf "$state"
  tests/controlplane/start.sh "$state" --parent-pid $$ >"$root/target/bench-controlplane.log" 2>&1 &
  until [ -e "$state/ready" ]; do sleep 0.2; done
fi
# shellcheck source=/dev/null
source "$state/env"
api() { curl -fsS --cacert "$state/pki/ca.crt" --cert "$state/pki/admin.crt" --key "$state/pki/admin.key" "$@"; }
for crd in charts/nodeward/files/crds/*.yaml; do
  name=$(basename "$crd" .yaml)
  api -o /dev/null "$NODEWARD_API_SERVER/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" 2>/dev/null ||
    api -o /dev/null -X POST -H 'Content-Type: application/yaml' --data-binary "@$crd" \
      "$NODEWARD_API_SERVER/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
done

node="bench-agent-$$"
api -X POST -H 'Content-Type: application/json' "$NODEWARD_API_SERVER/api/v1/nodes" \
  -d "{\"metadata\":{\"name\":\"$node\",\"annotations\":{\"kwok.x-k8s.io/node\":\"fake\"}}}" >/dev/null
# nodeward's namespace, where the agent keeps its Lease (without it every renewal would fail
# and be retried, and that is what would be measured).
namespace="bench-agent-$$"
api -X POST -H 'Content-Type: application/json' "$NODEWARD_API_SERVER/api/v1/namespaces" \
  -d "{\"metadata\":{\"name\":\"$namespace\"}}" >/dev/null

work=$(mktemp -d)
cat >"$work/agent.yaml" <<EOF
detectors:
  network:
    dns: {names: [localhost]}
  peers: {port: 19471}
  kernelLog: {}
  custom:
  - {name: true-check, condition: BenchProblem, reason: Bench, command: [/bin/true], interval: 60s}
EOF
port=$((20000 + RANDOM % 20000))
"$agent" run --node-name "$node" --namespace "$namespace" --kubeconfig "$state/admin.kubeconfig" \
  --config "$work/agent.yaml" --listen "127.0.0.1:$port" >"$work/agent.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$work"; api -X DELETE "$NODEWARD_API_SERVER/api/v1/nodes/$node" >/dev/null 2>&1 || true; api -X DELETE "$NODEWARD_API_SERVER/api/v1/namespaces/$namespace" >/dev/null 2>&1 || true' EXIT

writes() {
  curl -fsS "http://127.0.0.1:$port/metrics" |
    awk '/^nodeward_api_writes_total\{.*result="ok"/ {s += $NF} END {print s + 0}'
}
# "verb resource count" for every request the agent sent.
requests() {
  curl -fsS "http://127.0.0.1:$port/metrics" |
    sed -n 's/^nodeward_api_requests_total{\(.*\)} \([0-9.]*\)$/\1 \2/p' |
    sed 's/verb="\([^"]*\)",resource="\([^"]*\)"/\1 \2/; s/resource="\([^"]*\)",verb="\([^"]*\)"/\2 \1/'
}
# Settle: the first round, and the findings that hold for their `for` (up to 60 s by default)
# before they are reported: steady state starts after that.
until curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; do sleep 0.5; done
sleep "${SETTLE_SECONDS:-120}"
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
start_cpu=$(cpu) start_writes=$(writes) start=$(date +%s.%N)
requests >"$work/requests.before"
rss=() anon=() file=()
end=$(($(date +%s) + duration))
while [ "$(date +%s)" -lt "$end" ]; do
  rss+=("$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")")
  anon+=("$(awk '/^RssAnon/ {print $2}' "/proc/$pid/status")")
  file+=("$(awk '/^RssFile/ {print $2}' "/proc/$pid/status")")
  sleep 5
done
median_mib() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)] / 1024}'; }
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
used=$(($(cpu) - start_cpu))
writes_done=$(($(writes) - start_writes))
requests >"$work/requests.after"
median_rss=$(printf '%s\n' "${rss[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
max_rss=$(printf '%s\n' "${rss[@]}" | sort -n | tail -n1)
printf 'agent steady state over %.0f s (%d cores): RSS median %.1f MiB (the mapped binary %s, anonymous %s), max %.1f MiB; CPU %.2f millicores; API writes %.2f per minute\n' \
  "$elapsed" "$(nproc)" "$(echo "$median_rss / 1024" | bc -l)" "$(median_mib "${file[@]}")" "$(median_mib "${anon[@]}")" "$(echo "$max_rss / 1024" | bc -l)" \
  "$(echo "$used / $ticks / $elapsed * 1000" | bc -l)" "$(echo "$writes_done / $elapsed * 60" | bc -l)"
# Requests per minute by verb and resource over the window (watches count when opened).
awk -v elapsed="$elapsed" '
  FNR == NR { before[$1 " " $2] = $3; next }
  { d = $3 - before[$1 " " $2]; if (d > 0) { by[$1] += d; line = line sprintf(" %s %s %.2f;", $1, $2, d / elapsed * 60) } }
  END {
    printf "API requests per minute by verb:"
    for (v in by) printf " %s %.2f", v, by[v] / elapsed * 60
    printf "\n  by verb and resource:%s\n", line
  }' "$work/requests.before" "$work/requests.after"
