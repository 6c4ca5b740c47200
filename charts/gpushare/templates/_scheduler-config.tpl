{{/*
The KubeSchedulerConfiguration kube-scheduler starts from. Keep it in step with
`share-scheduler print-config` (tests/unit/chart compares the two):
  - profile gpushare-scheduler, the extender for filter and bind (and prioritize with
    filterKeeps fitting; with best its filter already kept only the policy's best nodes); in mode dra
    alone no bind: kube-scheduler's DefaultBinder binds after its DynamicResources PreBind wrote the
    claims (the extender chose the node; share-dra's device order, the GPU);
  - percentageOfNodesToScore 100: by default kube-scheduler stops looking after a sample of the
    nodes in a large cluster, so the extender would never see the best-fitting GPU; in mode dra
    kube-scheduler's adaptive default (0) unless scheduler.percentageOfNodesToScore says otherwise:
    there its DynamicResources Filter allocates on every node it looks at, the cost of a cycle;
  - (fitting) a dominant extender weight; the score plugins that fight packing turned off: kube-scheduler
    adds its own scores (least-allocated, balanced allocation, topology spread, image locality)
    to ours, and those push pods apart while binpack wants them together.
  - no managedResources: kube-scheduler calls the extender for every pod of the profile
    (HTTPExtender.IsInterested), so pods that ask no GPU are placed by the policy as well.
kube-scheduler reaches the extender on 127.0.0.1: they share the pod's network namespace.
*/}}
{{- define "gpushare.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ .Values.scheduler.leaderElection.enabled }}
  {{- if .Values.scheduler.leaderElection.enabled }}
  resourceLock: leases
  resourceName: {{ include "gpushare.leaseName" . }}
  resourceNamespace: {{ .Release.Namespace }}
  leaseDuration: {{ .Values.scheduler.leaderElection.leaseDuration }}
  renewDeadline: {{ .Values.scheduler.leaderElection.renewDeadline }}
  retryPeriod: {{ .Values.scheduler.leaderElection.retryPeriod }}
  {{- end }}
{{- $pct := .Values.scheduler.percentageOfNodesToScore }}
percentageOfNodesToScore: {{ if kindIs "invalid" $pct }}{{ ternary 0 100 (eq .Values.mode "dra") }}{{ else }}{{ $pct }}{{ end }}
profiles:
  - schedulerName: gpushare-scheduler
    plugins:
      score:
        disabled:
          - name: NodeResourcesBalancedAllocation
          - name: NodeResourcesFit
          - name: PodTopologySpread
          - name: ImageLocality
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.scheduler.port }}/gpushare-scheduler
    filterVerb: filter
    {{- if eq .Values.scheduler.filterKeeps "fitting" }}
    prioritizeVerb: prioritize
    weight: {{ .Values.scheduler.extenderWeight }}
    {{- end }}
    {{- if include "gpushare.devicePluginOn" . }}
    bindVerb: bind
    preemptVerb: preempt
    {{- end }}
    nodeCacheCapable: true
    httpTimeout: {{ .Values.scheduler.httpTimeout }}
    ignorable: false
    {{- /* No managedResources: HTTPExtender.IsInterested then calls the extender for every pod of
    the profile, CPU-only pods included, and the policy places them by the whole node. */}}
{{- end }}
