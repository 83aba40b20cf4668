#!/usr/bin/env bash
# Starts a real Kubernetes control plane on loopback for the tests: etcd, kube-apiserver (TLS,
# authorization by Node, RBAC and nodeward's pod-reads webhook, service-account issuer and
# keys), kube-controller-manager with the controllers nodeward's tests rely on, kube-scheduler,
# and kwok simulating the nodes annotated `kwok.x-k8s.io/node=fake` and the pods bound to them.
#
#   tests/controlplane/start.sh STATE_DIR [--parent-pid PID]
#
# Writes STATE_DIR/admin.kubeconfig and, once the API server is ready and kwok runs,
# STATE_DIR/ready; every write request is audited to STATE_DIR/logs/audit.log (JSON lines).
# Runs in the foreground until SIGTERM/SIGINT, or until PID (default: the caller) exits; on
# the way out it stops everything it started. Exits non-zero if any component dies.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state=${1:?usage: start.sh STATE_DIR [--parent-pid PID]}
shift
parent=$PPID
while [ $# -gt 0 ]; do
  case $1 in
    --parent-pid) parent=$2; shift 2 ;;
    *) echo "start.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[controlplane %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

bin=$("$here/build.sh")
started=$(date +%s%N)
mkdir -p "$state"
state=$(cd "$state" && pwd)
# One control plane per state directory: a second one would overwrite the first's files.
exec 9>"$state/lock"
flock -n 9 || { log "another control plane is running in $state"; exit 1; }
rm -f "$state/ready"
logs="$state/logs"
pki="$state/pki"
mkdir -p "$logs" "$pki"

pids=()
stop_all() {
  local status=$?
  trap - EXIT INT TERM
  rm -f "$state/ready"
  if [ ${#pids[@]} -gt 0 ]; then
    log "stopping control plane (pids ${pids[*]})"
    # Reverse order: kwok and controllers first, etcd last.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
  fi
  exit "$status"
}
trap stop_all EXIT
trap 'exit 0' INT TERM

taken_ports=" "
free_port() { # VAR: set VAR to a loopback TCP port no socket uses, not handed out before
  local port
  while :; do
    # Below Linux's ephemeral range (32768-60999): an outgoing connection cannot take the port
    # between this check and the bind (it happened: etcd "bind: address already in use").
    port=$((20000 + RANDOM % 12768))
    case $taken_ports in *" $port "*) continue ;; esac
    if [ -z "$(ss -Htan "sport = :$port")" ]; then
      taken_ports+="$port "
      printf -v "$1" '%s' "$port"
      return
    fi
  done
}

# --- PKI -------------------------------------------------------------------------------------
openssl_quiet() { openssl "$@" 2>>"$logs/openssl.log"; }
new_cert() { # name, subject, extensions (for the CSR's signing)
  local name=$1 subj=$2 ext=$3
  openssl_quiet req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr"
  printf '%s\n' "$ext" >"$pki/$name.ext"
  openssl_quiet x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
}
# Fresh certificates every start: cheap, and never a stale or half-written set.
rm -rf "$pki" && mkdir -p "$pki"
openssl_quiet req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -subj "/CN=nodeward-test-ca" \
  -days 30 -sha256 -out "$pki/ca.crt"
# 10.0.2.100: where the node lab's VMs reach it (tests/nodelab/start.sh).
new_cert apiserver "/CN=kube-apiserver" \
  "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:10.0.2.100,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth
keyUsage=digitalSignature,keyEncipherment"
new_cert admin "/O=system:masters/CN=nodeward-test-admin" "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
new_cert controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
new_cert scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
# The API server's own client for kubelets (`kubectl logs`, `exec`, `port-forward` on the node
# lab's VMs, whose kubelets trust this CA and allow every authenticated client).
new_cert kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
# kwok has its own user so that the audit log can leave out its heartbeats and lease renewals.
new_cert kwok "/O=system:masters/CN=kwok" "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
# The pod-reads authorization webhook a test's coordinator serves (nodeward's
# agent.podReads: authorizationWebhook) on a port fixed for this control plane's life.
new_cert pod-reads-webhook "/CN=nodeward-pod-reads-webhook" "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth
keyUsage=digitalSignature,keyEncipherment"
mkdir -p "$pki/pod-reads-webhook"
cp "$pki/pod-reads-webhook.crt" "$pki/pod-reads-webhook/tls.crt"
cp "$pki/pod-reads-webhook.key" "$pki/pod-reads-webhook/tls.key"
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

free_port etcd_port
free_port etcd_peer_port
free_port api_port
free_port kwok_port
free_port pod_reads_port
server="https://127.0.0.1:$api_port"

source "$(dirname "${BASH_SOURCE[0]}")/../kubeconfig.sh"
kubeconfig() { write_kubeconfig "$1" "$server" "$pki/ca.crt" "$2" "$pki/$3"; } # file, user, cert
kubeconfig "$state/admin.kubeconfig.tmp" admin admin
kubeconfig "$state/controller-manager.kubeconfig" controller-manager controller-manager
kubeconfig "$state/scheduler.kubeconfig" scheduler scheduler
kubeconfig "$state/kwok.kubeconfig" kwok kwok

# Authorization as a cluster that runs nodeward's pod-reads webhook configures it: Node, RBAC,
# then the webhook, asked only about the agents' reads of pods that RBAC did not allow (no
# coordinator answers it but in the test that starts one).
cat >"$state/pod-reads-webhook.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodeward-pod-reads
  cluster:
    server: https://127.0.0.1:$pod_reads_port/authorize/pod-reads
    certificate-authority: $pki/ca.crt
users:
- name: kube-apiserver
  user: {}
contexts:
- name: nodeward-pod-reads
  context: {cluster: nodeward-pod-reads, user: kube-apiserver}
current-context: nodeward-pod-reads
EOF
cat >"$state/authorization.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AuthorizationConfiguration
authorizers:
- type: Node
  name: node
- type: RBAC
  name: rbac
- type: Webhook
  name: nodeward-pod-reads
  webhook:
    timeout: 3s
    authorizedTTL: 10s
    unauthorizedTTL: 1s
    subjectAccessReviewVersion: v1
    matchConditionSubjectAccessReviewVersion: v1
    failurePolicy: NoOpinion
    connectionInfo:
      type: KubeConfigFile
      kubeConfigFile: $state/pod-reads-webhook.kubeconfig
    # Only the agents' reads: while no coordinator answers, the API server answers what it
    # asks the webhook about with 500, not 403 (a test's chart names its agent <release>-nodeward-agent).
    matchConditions:
    - expression: has(request.resourceAttributes) && request.resourceAttributes.resource == 'pods' && request.resourceAttributes.verb in ['list', 'watch']
    - expression: (request.user.startsWith('system:serviceaccount:') && request.user.endsWith('-nodeward-agent')) || request.groups.exists(g, g.startsWith('nodeward:agents'))
EOF

wait_for() { # description, deadline seconds, pid, command...
  local what=$1 deadline=$(($(date +%s) + $2)) pid=$3
  shift 3
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { log "$what exited; its log:"; tail -n 30 "$logs/$what.log" >&2; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { log "$what not ready in time; its log:"; tail -n 30 "$logs/$what.log" >&2; return 1; }
    sleep 0.2
  done
}

# --- etcd --------------------------------------------------------------------------------------
rm -rf "$state/etcd"
start_etcd() { # keeps its data directory: a restart finds the cluster as it left it
  "$bin/etcd" --name nodeward-test --data-dir "$state/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "nodeward-test=http://127.0.0.1:$etcd_peer_port" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn \
    >>"$logs/etcd.log" 2>&1 &
  etcd_pid=$!
  wait_for etcd 30 "$etcd_pid" curl -fsS "http://127.0.0.1:$etcd_port/health"
}
start_etcd
pids+=("$etcd_pid")

# --- kube-apiserver ----------------------------------------------------------------------------
# Aggregator routing: webhooks behind a Service are called at an endpoint's address (the node
# lab's pod subnets are routed from this machine; there is no kube-proxy here).
start_apiserver() {
  "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/kubelet-client.crt" --kubelet-client-key "$pki/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --authorization-config "$state/authorization.yaml" \
    --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc \
    --api-audiences https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged=true \
    --profiling=false \
    --endpoint-reconciler-type none \
    --enable-aggregator-routing=true \
    --audit-policy-file "$here/audit-policy.yaml" \
    --audit-log-path "$logs/audit.log" --audit-log-format json --audit-log-mode blocking \
    >>"$logs/kube-apiserver.log" 2>&1 &
  apiserver_pid=$!
  wait_for kube-apiserver 90 "$apiserver_pid" api_ready
}
api_ready() {
  curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server/readyz"
}
start_apiserver
pids+=("$apiserver_pid")
mv "$state/admin.kubeconfig.tmp" "$state/admin.kubeconfig"

# --- kube-controller-manager -------------------------------------------------------------------
"$bin/kube-controller-manager" \
  --kubeconfig "$state/controller-manager.kubeconfig" \
  --controllers disruption-controller,replicaset-controller,deployment-controller,daemonset-controller,statefulset-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,node-lifecycle-controller,certificatesigningrequest-signing-controller,taint-eviction-controller,pod-garbage-collector-controller,clusterrole-aggregation-controller,root-ca-certificate-publisher-controller,endpoints-controller,endpointslice-controller,job-controller \
  --use-service-account-credentials \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --leader-elect=false --secure-port 0 \
  --node-monitor-grace-period 50s --node-monitor-period 2s \
  --concurrent-gc-syncs 5 \
  >"$logs/kube-controller-manager.log" 2>&1 &
pids+=($!)

# --- kube-scheduler (DaemonSet pods are bound by the scheduler, not by their controller) ----
"$bin/kube-scheduler" \
  --kubeconfig "$state/scheduler.kubeconfig" \
  --leader-elect=false --secure-port 0 \
  >"$logs/kube-scheduler.log" 2>&1 &
pids+=($!)

# --- kwok --------------------------------------------------------------------------------------
"$bin/kwok" \
  --kubeconfig "$state/kwok.kubeconfig" \
  --config "$here/kwok-stages.yaml" \
  -v WARN \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds 40 \
  --cidr 10.244.0.0/16 --node-ip 10.250.0.1 \
  --server-address "127.0.0.1:$kwok_port" \
  >"$logs/kwok.log" 2>&1 &
pids+=($!)
wait_for kwok 30 "${pids[-1]}" curl -fsS "http://127.0.0.1:$kwok_port/healthz"

elapsed_ms=$((($(date +%s%N) - started) / 1000000))
cat >"$state/env" <<EOF
KUBECONFIG=$state/admin.kubeconfig
NODEWARD_API_SERVER=$server
NODEWARD_CONTROLPLANE_BIN=$bin
NODEWARD_ETCD=http://127.0.0.1:$etcd_port
NODEWARD_POD_READS_WEBHOOK_LISTEN=127.0.0.1:$pod_reads_port
NODEWARD_POD_READS_WEBHOOK_CERT_DIR=$pki/pod-reads-webhook
NODEWARD_CONTROLPLANE_START_MS=$elapsed_ms
EOF
touch "$state/ready"
log "ready in ${elapsed_ms} ms: $server (kubeconfig $state/admin.kubeconfig)"

# A crash of the API server and etcd, on request (the chaos soak): `touch STATE_DIR/restart`.
# Both are killed (SIGKILL) and started again on the same ports and data; each restart that
# completed appends a line to STATE_DIR/restarts.
restart_api_and_etcd() {
  log "restart requested: killing kube-apiserver and etcd"
  kill -KILL "${pids[1]}" "${pids[0]}" 2>/dev/null || true
  wait "${pids[1]}" "${pids[0]}" 2>/dev/null || true
  start_etcd
  pids[0]=$etcd_pid
  start_apiserver
  pids[1]=$apiserver_pid
  rm -f "$state/restart"
  date +%s%N >>"$state/restarts"
  log "kube-apiserver and etcd are back"
}

names=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
while kill -0 "$parent" 2>/dev/null; do
  [ -e "$state/restart" ] && restart_api_and_etcd
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[i]}" 2>/dev/null; then
      log "${names[i]} died; its log:"
      tail -n 30 "$logs/${names[i]}.log" >&2
      exit 1
    fi
  done
  sleep 1
done
log "parent $parent is gone"
