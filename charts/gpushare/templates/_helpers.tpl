{{/* Chart name, truncated for label values. */}}
{{- define "gpushare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or the release name alone when it already contains the chart name. */}}
{{- define "gpushare.fullname" -}}
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

{{- define "gpushare.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "gpushare.labels" -}}
helm.sh/chart: {{ include "gpushare.chart" . }}
app.kubernetes.io/name: {{ include "gpushare.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpushare
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "scheduler"). */}}
{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpushare.componentLabels" -}}
{{ include "gpushare.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Object names. */}}
{{- define "gpushare.plugin.fullname" -}}
{{- printf "%s-device-plugin" (include "gpushare.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpushare.scheduler.fullname" -}}
{{- printf "%s-scheduler" (include "gpushare.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpushare.kubeScheduler.fullname" -}}
{{- printf "%s-kube-scheduler" (include "gpushare.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpushare.extender.fullname" -}}
{{- printf "%s-extender" (include "gpushare.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpushare.leaseName" -}}
{{- default (include "gpushare.scheduler.fullname" .) .Values.scheduler.leaderElection.leaseName }}
{{- end }}

{{/* Images. */}}
{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* kube-scheduler: the cluster's own version unless pinned (vX.Y.Z, without +k3s1, -gke.N...). */}}
{{- define "gpushare.kubeScheduler.tag" -}}
{{- $img := .Values.scheduler.kubeScheduler.image }}
{{- if $img.tag }}
{{- $img.tag }}
{{- else }}
{{- $v := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- if not $v }}
{{- fail (printf "cannot derive a kube-scheduler tag from the cluster version %q: set scheduler.kubeScheduler.image.tag" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if hasPrefix "v" $v }}{{ $v }}{{ else }}v{{ $v }}{{ end }}
{{- end }}
{{- end }}
{{- define "gpushare.kubeScheduler.image" -}}
{{- printf "%s:%s" .Values.scheduler.kubeScheduler.image.repository (include "gpushare.kubeScheduler.tag" .) }}
{{- end }}

{{- define "gpushare.logLevel" -}}
{{- .Values.logLevel }}
{{- end }}
