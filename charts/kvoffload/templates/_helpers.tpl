{{/* The chart name, or nameOverride. */}}
{{- define "kvoffload.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The fully qualified name: the release name, with the chart name unless it already holds it. */}}
{{- define "kvoffload.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvoffload.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The chart's own labels; the schema keeps commonLabels and podLabels off these names. */}}
{{- define "kvoffload.chartLabels" -}}
helm.sh/chart: {{ include "kvoffload.chart" . }}
{{ include "kvoffload.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels every object carries: the chart's own and commonLabels (a policy engine may demand team labels). */}}
{{- define "kvoffload.labels" -}}
{{- include "kvoffload.labelsWith" (dict "root" . "extra" dict) }}
{{- end }}

{{/*
The labels of an object with labels of its own (a ServiceMonitor's, the dashboard's, the pods'): the chart's
first, then the object's, then commonLabels, as one map so no key is written twice.
Call with (dict "root" . "extra" MAP).
*/}}
{{- define "kvoffload.labelsWith" -}}
{{- $root := .root }}
{{- $labels := include "kvoffload.chartLabels" $root | fromYaml }}
{{- $labels = merge $labels (deepCopy (.extra | default dict)) (deepCopy ($root.Values.commonLabels | default dict)) }}
{{- toYaml $labels }}
{{- end }}

{{/* The labels that select the operator's pod: they never change after install. */}}
{{- define "kvoffload.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvoffload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvoffload.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvoffload.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository@digest when image.digest is set (the tag is then ignored), else repository:tag. */}}
{{- define "kvoffload.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The leader-election Lease (--lease). */}}
{{- define "kvoffload.leaseName" -}}
{{- include "kvoffload.fullname" . | trunc 56 | trimSuffix "-" }}-leader
{{- end }}

{{/* The peering object's name: kvoffload.handlers.PEERING_NAME. */}}
{{- define "kvoffload.peeringName" -}}
kvoffload
{{- end }}

{{/*
The rules the operator needs in each namespace it serves, exact verbs only:
kopf watches the policies and patches their finalizer (takes away the one an older operator left;
with peering on, adds it for its daemons) and annotations, and posts Events;
kvoffload.gateway reads and server-side applies (patch; create when the apply creates) the owned
children and deletes a canary Deployment (the garbage collector removes the rest with the policy),
writes the ConfigMap of a level's engine config files beside its Deployment and deletes it with it (an engine that
reads its options from a file: TensorRT-LLM), lists the policy's pods, reads the ConfigMap a policy refers to,
patches the policy's status, and
creates or bumps its Events. No Secret: see "kvoffload.secretRoles" (prometheusAuth).
Every rule is needed: tests/test_chart_rbac.py removes each verb in turn against the real API server.
*/}}
{{- define "kvoffload.rules" -}}
- apiGroups: ["kvoffload.io"]
  resources: ["kvoffloadpolicies"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["kvoffload.io"]
  resources: ["kvoffloadpolicies/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["get", "create", "patch"]
{{- end }}

{{/* Each analysis reads the KVOffloadAnalysisTemplates its policy names, one GET each (cluster-scoped). */}}
{{- define "kvoffload.templateRules" -}}
- apiGroups: ["kvoffload.io"]
  resources: ["kvoffloadanalysistemplates"]
  verbs: ["get"]
{{- end }}

{{/* kopf peering: read the peers, and patch its own keep-alive into the object's status. */}}
{{- define "kvoffload.peeringVerbs" -}}
verbs: ["list", "watch", "patch"]
{{- end }}

{{/*
A file written for the series labels the operator's PodMonitor gives the engines (kvoffload_io_policy,
kvoffload_io_level, kvoffload_io_config_hash), with seriesLabels in their place. Call with (dict "text" TEXT "root" .).
*/}}
{{- define "kvoffload.withSeriesLabels" -}}
{{- $labels := .root.Values.seriesLabels }}
{{- .text | replace "kvoffload_io_policy" $labels.policy | replace "kvoffload_io_level" $labels.level | replace "kvoffload_io_config_hash" $labels.configHash }}
{{- end }}

{{/* The runbook base URL written in files/prometheus-rules.yaml (the default of prometheusRule.runbookBaseUrl). */}}
{{- define "kvoffload.runbookBaseUrl" -}}
https://github.com/kvoffload/kvoffload/blob/main/docs/troubleshooting.md
{{- end }}

{{/* Where the operator reads its notification sinks (a ConfigMap), and each urlSecret's key (by the sink's index). */}}
{{- define "kvoffload.notificationsConfigDir" -}}
/etc/kvoffload/notifications/config
{{- end }}

{{- define "kvoffload.notificationsUrlDir" -}}
/etc/kvoffload/notifications/sink-{{ . }}
{{- end }}
