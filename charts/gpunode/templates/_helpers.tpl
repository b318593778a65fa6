{{/*
Names. Every cluster-scoped object (ClusterRoles, bindings, the admission policy) carries the
release's fullname, so two releases in one cluster do not collide.
*/}}
{{- define "gpunode.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpunode.fullname" -}}
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

{{- define "gpunode.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; `app.kubernetes.io/instance` finds a release's leftovers. */}}
{{- define "gpunode.labels" -}}
helm.sh/chart: {{ include "gpunode.chart" . }}
app.kubernetes.io/name: {{ include "gpunode.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpunode
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component ("operator" or "node-probe"). */}}
{{- define "gpunode.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpunode.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpunode.componentLabels" -}}
{{ include "gpunode.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpunode.operator.fullname" -}}
{{- printf "%s-operator" (include "gpunode.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpunode.probe.fullname" -}}
{{- printf "%s-node-probe" (include "gpunode.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpunode.reset.fullname" -}}
{{- printf "%s-gpu-reset" (include "gpunode.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpunode.operator.serviceAccountName" -}}
{{- default (include "gpunode.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "gpunode.probe.serviceAccountName" -}}
{{- default (include "gpunode.probe.fullname" .) .Values.nodeProbe.serviceAccount.name }}
{{- end }}

{{- define "gpunode.reset.serviceAccountName" -}}
{{- default (include "gpunode.reset.fullname" .) .Values.nodeProbe.gpuReset.serviceAccount.name }}
{{- end }}

{{/* The username the API server gives the reset DaemonSet's ServiceAccount tokens. */}}
{{- define "gpunode.reset.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpunode.reset.serviceAccountName" .) }}
{{- end }}

{{/* Whether the reset DaemonSet is rendered: the probe and its gpuReset both enabled. */}}
{{- define "gpunode.reset.enabled" -}}
{{- if and .Values.nodeProbe.enabled .Values.nodeProbe.gpuReset.enabled -}}
true
{{- end }}
{{- end }}

{{/* The username the API server gives the probe's ServiceAccount tokens. */}}
{{- define "gpunode.operator.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpunode.operator.serviceAccountName" .) }}
{{- end }}

{{- define "gpunode.probe.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpunode.probe.serviceAccountName" .) }}
{{- end }}

{{/* The admission policy needs ValidatingAdmissionPolicy v1 (GA in 1.30). */}}
{{- define "gpunode.admissionPolicy.enabled" -}}
{{- if and .Values.nodeProbe.admissionPolicy.enabled (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end }}
{{- end }}

{{- define "gpunode.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag }}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount the chart creates in each validation namespace whose entry names none: no
RBAC, no token mounted.
*/}}
{{- define "gpunode.validation.serviceAccountName" -}}
{{- printf "%s-validation" (include "gpunode.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
operator.validation.namespaces as the operator reads it (--validation-namespaces): a JSON list
of {name, serviceAccounts, allowPrivileged, allowedCapabilities, allowHostNamespaces,
allowHostPath}. An entry may be a namespace's name alone (what earlier charts took): no
privileges, the chart's ServiceAccount only. An entry without serviceAccounts gets the chart's.
*/}}
{{- define "gpunode.validation.namespaces" -}}
{{- $root := . }}
{{- $out := list }}
{{- range $i, $e := .Values.operator.validation.namespaces }}
{{- $entry := dict }}
{{- if kindIs "string" $e }}
{{- $entry = dict "name" $e }}
{{- else if kindIs "map" $e }}
{{- $entry = deepCopy $e }}
{{- else }}
{{- fail (printf "operator.validation.namespaces[%d]: must be a namespace's name or {name, serviceAccounts, allowPrivileged, allowedCapabilities, allowHostNamespaces, allowHostPath}" $i) }}
{{- end }}
{{- if not $entry.name }}
{{- fail (printf "operator.validation.namespaces[%d].name: required (the namespace)" $i) }}
{{- end }}
{{- if not (hasKey $entry "serviceAccounts") }}
{{- $_ := set $entry "serviceAccounts" (list (include "gpunode.validation.serviceAccountName" $root)) }}
{{- end }}
{{- $out = append $out $entry }}
{{- end }}
{{- toJson $out }}
{{- end }}
