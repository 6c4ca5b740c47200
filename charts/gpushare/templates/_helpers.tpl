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

{{/* Modes (values "mode"): which parts this release installs. Each helper prints "true" or nothing,
     so `if (include ...)` reads naturally. deviceplugin: device plugin + extender; dra: the DRA driver
     only; both: all of it, each node served by one of the two (label gpushare.io/mode, see values.yaml). */}}
{{- define "gpushare.devicePluginOn" -}}
{{- if and (ne .Values.mode "dra") .Values.devicePlugin.enabled }}true{{ end }}
{{- end }}
{{- define "gpushare.schedulerOn" -}}
{{- if and .Values.scheduler.enabled (or (ne .Values.mode "dra") (eq .Values.dra.placement "policy")) }}true{{ end }}
{{- end }}
{{- /* DRA claims placed by the policy: the extender reads slices and claims, share-dra orders its devices. */}}
{{- define "gpushare.draPlacementOn" -}}
{{- if and (ne .Values.mode "deviceplugin") .Values.scheduler.enabled (eq .Values.dra.placement "policy") }}true{{ end }}
{{- end }}
{{- define "gpushare.draOn" -}}
{{- if ne .Values.mode "deviceplugin" }}true{{ end }}
{{- end }}

{{/* The node label that picks a node's mode when both run, and the affinity term each DaemonSet adds.
     include with (dict "affinity" <values affinity> "operator" "In"|"NotIn"). Every required
     nodeSelectorTerm (they are ORed) gets the expression, so the user's own terms still hold. */}}
{{- define "gpushare.modeLabel" -}}gpushare.io/mode{{- end }}
{{- define "gpushare.modeAffinity" -}}
{{- $aff := deepCopy (default dict .affinity) }}
{{- $expr := dict "key" (include "gpushare.modeLabel" .) "operator" .operator "values" (list "dra") }}
{{- $na := deepCopy (default dict (get $aff "nodeAffinity")) }}
{{- $req := deepCopy (default dict (get $na "requiredDuringSchedulingIgnoredDuringExecution")) }}
{{- $terms := list }}
{{- range (default (list dict) (get $req "nodeSelectorTerms")) }}
{{- $t := deepCopy . }}
{{- $_ := set $t "matchExpressions" (append (default list (get $t "matchExpressions")) $expr) }}
{{- $terms = append $terms $t }}
{{- end }}
{{- $_ := set $req "nodeSelectorTerms" $terms }}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req }}
{{- $_ := set $aff "nodeAffinity" $na }}
{{- toYaml $aff }}
{{- end }}

{{- define "gpushare.dra.fullname" -}}
{{- printf "%s-dra-plugin" (include "gpushare.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* DRA needs resource.k8s.io/v1 (Kubernetes 1.34); sharing one GPU between claims needs consumable
     capacity (gate DRAConsumableCapacity: alpha and off in 1.34-1.35, beta and on from 1.36). Without the
     gate the API server drops the devices' shared capacity and each GPU goes whole to one claim. */}}
{{- define "gpushare.dra.checkVersion" -}}
{{- $v := .Capabilities.KubeVersion.Version }}
{{- if not (semverCompare ">=1.34.0-0" $v) }}
{{- fail (printf "mode=%s needs Kubernetes 1.34 or newer (DRA, resource.k8s.io/v1); this cluster is %s. Use mode=deviceplugin on this cluster." .Values.mode $v) }}
{{- end }}
{{- if and (not (semverCompare ">=1.36.0-0" $v)) (not .Values.dra.consumableCapacityGate) }}
{{- fail (printf "mode=%s on Kubernetes %s: GPU sharing through DRA needs the DRAConsumableCapacity feature gate (off by default before 1.36). Turn it on for kube-apiserver and kube-scheduler (--feature-gates=DRAConsumableCapacity=true), then set dra.consumableCapacityGate=true; or upgrade to 1.36+." .Values.mode $v) }}
{{- end }}
{{- end }}

{{- /*
The programs' configuration file (share_core/config.py: apiVersion gpushare.io/v1, kind Configuration):
one section per program, each field a long flag in camelCase. Rendered into the ConfigMap
<fullname>-config and read with --config; extraArgs still go on the command line and win over it.
*/}}
{{- define "gpushare.configPath" -}}/etc/gpushare/config.yaml{{- end }}

{{- define "gpushare.config.scheduler" -}}
{{- $s := .Values.scheduler }}
# All addresses: kube-scheduler calls 127.0.0.1, the Service reaches inspect and /metrics on the pod IP.
bindAddress: 0.0.0.0
port: {{ $s.port }}
policy: {{ $s.policy }}
filterKeeps: {{ $s.filterKeeps }}
bindEvents: {{ $s.bindEvents }}
threads: {{ $s.threads }}
{{- if $s.leaderElection.enabled }}
# Only the extender beside the leading kube-scheduler acts on its own (evictions, reservations).
leaderLease: {{ .Release.Namespace }}/{{ include "gpushare.leaseName" . }}
{{- end }}
memoryUnit: {{ .Values.memoryUnit }}
{{- if include "gpushare.draPlacementOn" . }}
dra: true
{{- end }}
{{- $r := .Values.reservations }}
{{- $c := .Values.consolidation }}
# Pods that waited too long: reservations and consolidation (docs/operations.md).
reservations: {{ $r.enabled }}
reserveAfter: {{ $r.waitSeconds }}
remedyMinGpus: {{ $r.minGpus }}
maxReservations: {{ $r.maxPods }}
reservationShare: {{ $r.maxShare }}
holdSeconds: {{ $r.holdSeconds }}
{{- if not (kindIs "invalid" $r.yieldAfterSeconds) }}
holdYieldAfter: {{ $r.yieldAfterSeconds }}
{{- end }}
# Room for what waits: the policy leaves the room waiting multi-GPU pods need (quoted: YAML reads on as true).
leaveRoom: {{ ternary "on" "off" $r.leaveRoom | quote }}
consolidation: {{ $c.enabled }}
consolidationMaxMoves: {{ $c.maxMoves }}
evictionsPerMinute: {{ $c.evictionsPerMinute }}
logLevel: {{ upper .Values.logLevel }}
{{- end }}

{{- define "gpushare.config.plugin" -}}
{{- $dp := .Values.devicePlugin }}
{{- $root := trimSuffix "/" $dp.kubeletRootDir }}
{{- $dpdir := trimSuffix "/" (default (printf "%s/device-plugins" $root) $dp.devicePluginDir) }}
{{- $mon := $dp.monitor }}
{{- $mps := trimSuffix "/" $dp.mpsRoot }}
backend: {{ $dp.backend }}
{{- if eq $dp.backend "sim" }}
simGpus: {{ $dp.simGpus | quote }}
{{- end }}
memoryUnit: {{ .Values.memoryUnit }}
devicePluginDir: {{ $dpdir }}
podResourcesSocket: {{ $root }}/pod-resources/kubelet.sock
deviceIdStrategy: {{ $dp.deviceIdStrategy }}
deviceListStrategy: {{ $dp.deviceListStrategy }}
{{- /* an unquoted `off` in values.yaml is YAML's false */}}
{{- $hl := ternary "off" (toString $dp.hardLimit) (eq (toString $dp.hardLimit) "false") }}
hardLimit: {{ $hl | quote }}
{{- if ne $hl "off" }}
cgroupRoot: {{ trimSuffix "/" $dp.cgroupRoot }}
{{- end }}
healthCheck: {{ $dp.healthCheck }}
{{- if $dp.mps }}
mps: true
mpsPipeDir: {{ $mps }}/pipe
mpsShmDir: {{ $mps }}/shm
{{- end }}
{{- if $mon.enabled }}
monitorInterval: {{ $mon.interval }}
metricsPort: {{ $mon.metricsPort }}
overLimit: {{ $mon.overLimit }}
overLimitGrace: {{ $mon.overLimitGrace }}
usageAnnotationInterval: {{ $mon.usageAnnotationInterval }}
{{- else }}
monitorInterval: 0
{{- end }}
logLevel: {{ upper .Values.logLevel }}
{{- end }}

{{- define "gpushare.config.dra" -}}
{{- $d := .Values.dra }}
{{- $root := trimSuffix "/" $d.kubeletRootDir }}
{{- $specDirs := list }}
{{- range $d.nvidiaCdiSpecDirs }}{{ $specDirs = append $specDirs (trimSuffix "/" .) }}{{ end }}
backend: {{ $d.backend }}
{{- if eq $d.backend "sim" }}
simGpus: {{ $d.simGpus | quote }}
{{- end }}
pluginsRegistryDir: {{ $root }}/plugins_registry
pluginDir: {{ $root }}/plugins/gpushare.io
cdiDir: {{ trimSuffix "/" $d.cdiDir }}
cdiSpecDirs: {{ join "," $specDirs | quote }}
memoryUnit: {{ .Values.memoryUnit }}
deviceIdStrategy: {{ $d.deviceIdStrategy }}
healthCheck: {{ $d.healthCheck }}
unhealthy: {{ $d.unhealthy }}
{{- $hl := ternary "off" (toString $d.hardLimit) (eq (toString $d.hardLimit) "false") }}
hardLimit: {{ $hl | quote }}
{{- if ne $hl "off" }}
cgroupRoot: {{ trimSuffix "/" $d.cgroupRoot }}
{{- end }}
{{- if include "gpushare.draPlacementOn" . }}
policy: {{ .Values.scheduler.policy }}
{{- end }}
logLevel: {{ upper .Values.logLevel }}
{{- end }}

{{- define "gpushare.config" -}}
apiVersion: gpushare.io/v1
kind: Configuration
{{- if include "gpushare.schedulerOn" . }}
scheduler:
  {{- include "gpushare.config.scheduler" . | nindent 2 }}
{{- end }}
{{- if include "gpushare.devicePluginOn" . }}
plugin:
  {{- include "gpushare.config.plugin" . | nindent 2 }}
{{- end }}
{{- if include "gpushare.draOn" . }}
dra:
  {{- include "gpushare.config.dra" . | nindent 2 }}
{{- end }}
{{- if include "gpushare.webhookOn" . }}
webhook:
  {{- include "gpushare.config.webhook" . | nindent 2 }}
{{- end }}
{{- end }}

{{- /* The admission webhook (share-webhook): on with the scheduler and webhook.enabled. */}}
{{- define "gpushare.webhookOn" -}}
{{- if and (include "gpushare.schedulerOn" .) .Values.webhook.enabled }}true{{ end }}
{{- end }}
{{- define "gpushare.webhook.fullname" -}}
{{- printf "%s-webhook" (include "gpushare.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpushare.webhook.secret" -}}
{{- printf "%s-tls" (include "gpushare.webhook.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* CEL (matchConditions): the pod names nvidia.com/gpu-mem in any container's limits or requests,
     init containers and sidecars included: share_core.admission.asks_gpu_mem, the same test. */}}
{{- /* The pods the scheduler webhook is called for: those asking gpu-mem, and with DRA placement by the
     policy those naming any ResourceClaim (the webhook reads them: gpushare.io or not). */}}
{{- define "gpushare.webhook.ours" -}}
{{- if include "gpushare.draPlacementOn" . -}}
{{ include "gpushare.webhook.asksGpuMem" . }} || has(object.spec.resourceClaims)
{{- else -}}
{{ include "gpushare.webhook.asksGpuMem" . }}
{{- end }}
{{- end }}
{{- /* How pods get gpushare-scheduler: "policy", a MutatingAdmissionPolicy that kube-apiserver applies
     itself (admissionregistration.k8s.io/v1, Kubernetes 1.36+: no call out, no outage), or "webhook", share-webhook's
     /mutate. auto: policy where the cluster serves it. */}}
{{- define "gpushare.webhook.mutation" -}}
{{- $m := .Values.webhook.mutation }}
{{- if not (has $m (list "auto" "policy" "webhook")) }}
{{- fail (printf "webhook.mutation must be auto, policy or webhook, not %q" $m) }}
{{- end }}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- if and (eq $m "policy") (not $served) }}
{{- fail "webhook.mutation=policy needs admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.36+); leave it auto (the webhook sets the scheduler where the cluster lacks it)" }}
{{- end }}
{{- if or (eq $m "policy") (and (eq $m "auto") $served) }}policy{{ else }}webhook{{ end }}
{{- end }}
{{- /* A pod that names no scheduler (or the default one): the one the mutation gives ours. */}}
{{- define "gpushare.webhook.namesDefault" -}}
(!has(object.spec.schedulerName) || object.spec.schedulerName == '' || object.spec.schedulerName == 'default-scheduler')
{{- end }}
{{- /* The pods the mutation (webhook or policy) gives our scheduler: asking gpu-mem, naming none. */}}
{{- define "gpushare.webhook.needsScheduler" -}}
{{ include "gpushare.webhook.namesDefault" . }} && ({{ include "gpushare.webhook.asksGpuMem" . }})
{{- end }}
{{- define "gpushare.webhook.asksGpuMem" -}}
{{- $c := "has(c.resources) && ((has(c.resources.limits) && 'nvidia.com/gpu-mem' in c.resources.limits) || (has(c.resources.requests) && 'nvidia.com/gpu-mem' in c.resources.requests))" -}}
object.spec.containers.exists(c, {{ $c }}) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $c }}))
{{- end }}

{{- define "gpushare.config.webhook" -}}
{{- $w := .Values.webhook }}
port: {{ $w.port }}
schedulerName: gpushare-scheduler
memoryUnit: {{ .Values.memoryUnit }}
service: {{ include "gpushare.webhook.fullname" . }}
certSecret: {{ include "gpushare.webhook.secret" . }}
{{- if include "gpushare.draPlacementOn" . }}
dra: true
{{- end }}
{{- if $w.certManager.enabled }}
tlsCertFile: /etc/gpushare-webhook-tls/tls.crt
tlsKeyFile: /etc/gpushare-webhook-tls/tls.key
{{- else }}
mutatingConfig: {{ include "gpushare.webhook.fullname" . }}
validatingConfig: {{ include "gpushare.webhook.fullname" . }}
{{- end }}
logLevel: {{ upper .Values.logLevel }}
{{- end }}
