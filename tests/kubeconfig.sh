# Sourced by tests/controlplane/start.sh and tests/nodelab/start.sh.

write_kubeconfig() { # file, server URL, CA certificate, user name, client certificate base path
  cat >"$1" <<EOF_KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: nodeward-test
  cluster:
    server: $2
    certificate-authority: $3
users:
- name: $4
  user:
    client-certificate: $5.crt
    client-key: $5.key
contexts:
- name: nodeward-test
  context: {cluster: nodeward-test, user: $4}
current-context: nodeward-test
EOF_KUBECONFIG
}
