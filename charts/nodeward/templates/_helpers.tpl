{{/* Names, labels and images shared by the templates. */}}

{{- define "nodeward.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeward.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "nodeward.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "nodeward.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nodeward.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "nodeward.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "nodeward.agent.name" -}}
{{- printf "%s-agent" (include "nodeward.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeward.coordinator.name" -}}
{{- printf "%s-coordinator" (include "nodeward.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeward.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodeward.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "nodeward.coordinator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodeward.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{/* The user name of the agent's service account, as the API server sees it. */}}
{{- define "nodeward.agent.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "nodeward.agent.name" .) -}}
{{- end -}}

{{/*
A host-mode agent's certificate user, nodeward:agent:<node> (nodeward_api::labels::
AGENT_USER_PREFIX), in agent.hostCertificates.group, when agent.hostCertificates is enabled.
*/}}
{{- define "nodeward.agent.userPrefix" -}}nodeward:agent:{{- end -}}

{{/* A CEL condition: the request is an agent's (its service account, or a certificate user). */}}
{{- define "nodeward.agent.isAgent" -}}
request.userInfo.username == '{{ include "nodeward.agent.username" . }}'
{{- with .Values.agent.hostCertificates }}{{ if .enabled }} || ('{{ .group }}' in request.userInfo.groups && request.userInfo.username.startsWith('{{ include "nodeward.agent.userPrefix" $ }}')){{ end }}{{ end }}
{{- end -}}

{{/* The agent's RBAC subjects: its service account, and the certificate users' group. */}}
{{- define "nodeward.agent.subjects" -}}
- kind: ServiceAccount
  name: {{ include "nodeward.agent.name" . }}
  namespace: {{ .Release.Namespace }}
{{- if .Values.agent.hostCertificates.enabled }}
- kind: Group
  apiGroup: rbac.authorization.k8s.io
  name: {{ .Values.agent.hostCertificates.group }}
{{- end }}
{{- end -}}

{{/* The eviction webhook's Service, certificate Secret, configuration and webhook name. */}}
{{- define "nodeward.coordinator.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "nodeward.coordinator.name" .) -}}
{{- end -}}

{{- define "nodeward.webhook.service" -}}
{{- printf "%s-webhook" (include "nodeward.coordinator.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeward.webhook.secret" -}}
{{- printf "%s-webhook-tls" (include "nodeward.coordinator.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeward.webhook.configuration" -}}
{{- printf "%s-evictions" (include "nodeward.agent.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeward.webhook.name" -}}
evictions.agent.nodeward.io
{{- end -}}

{{- define "nodeward.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{/*
The Node condition types the agent writes, as a YAML list: its detectors' (nodeward_api's
conditions::node::WRITTEN_BY_AGENT), those the agent.config of these values adds, and the
conditions of the node-problem-detector monitor files in agent.npd.configs.
*/}}
{{- define "nodeward.agent.conditionTypes" -}}
{{- $types := list "NetworkProblem" "PeerConnectivityProblem" "SecurityGroupProblem" "KubeletProblem" "RebootRequired" "ReadonlyFilesystem" "KernelDeadlock" "XfsShutdown" "CperHardwareErrorFatal" "ContainerRuntimeUnhealthy" "FrequentContainerdRestart" "CloudDisruptionScheduled" }}
{{- $detectors := (.Values.agent.config | default dict).detectors | default dict }}
{{- range ($detectors.custom | default list) }}
{{- $types = append $types .condition }}
{{- end }}
{{- range (($detectors.kernelLog | default dict).patterns | default list) }}
{{- if .condition }}{{ $types = append $types .condition }}{{ end }}
{{- end }}
{{- range $file, $json := ((.Values.agent.npd | default dict).configs | default dict) }}
{{- range ((fromJson $json).conditions | default list) }}
{{- $types = append $types .type }}
{{- end }}
{{- end }}
{{- $types | uniq | toYaml }}
{{- end }}

{{/*
The Node condition types the agents may still remove though they write them no more: those of
agent.retiredConditionTypes, and, on an upgrade that removes a check (a custom check, a
kernel-log pattern, a node-problem-detector condition), the types the release's policy in the
cluster allowed that this one does not (read with `lookup`, which `helm template` cannot: list
them in agent.retiredConditionTypes then). A restarted agent removes the conditions it applied
for a check it no longer runs; they stay allowed for that until the next upgrade.
*/}}
{{- define "nodeward.agent.retiredConditionTypes" -}}
{{- $current := include "nodeward.agent.conditionTypes" . | fromYamlArray }}
{{- $retired := list }}
{{- range (.Values.agent.retiredConditionTypes | default list) }}
{{- $retired = append $retired . }}
{{- end }}
{{- $live := lookup "admissionregistration.k8s.io/v1" "ValidatingAdmissionPolicy" "" (printf "%s-own-node" (include "nodeward.agent.name" .)) }}
{{- range (($live | default dict).spec | default dict).variables | default list }}
{{- if eq .name "agentConditions" }}
{{- range (.expression | fromJsonArray) }}
{{- if not (has . $current) }}{{ $retired = append $retired . }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- $retired | uniq | toYaml }}
{{- end }}

{{/*
The annotations of the agent admission policy's first-install copy (its hook weight as the
argument): created before every other object of a first install, replaced on a reinstall.
*/}}
{{- define "nodeward.agent.policyCopyHook" -}}
helm.sh/hook: pre-install
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation
{{- end -}}
