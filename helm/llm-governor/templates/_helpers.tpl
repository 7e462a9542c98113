{{/*
Names, labels and shared fragments. Every helper takes the governor chart's scope (.Values
are this chart's values): from this chart that is `$`; from an engine chart that has this
chart as a dependency it is `.Subcharts.<name or alias>` (see _sidecar.tpl). Helpers never
use .Chart.Name, so names come out the same from either scope.
*/}}

{{- define "llm-governor.name" -}}
{{- default "llm-governor" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* At most 40 characters, so every derived name (-targets-state, -leader) stays a valid
DNS label (63). */}}
{{- define "llm-governor.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "llm-governor.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-governor.labels" -}}
helm.sh/chart: {{ printf "llm-governor-%s" .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "llm-governor.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llm-governor
{{- end -}}

{{/* The one label that selects governor pods, in both modes: in sidecar mode the pods belong
to the engine's Deployment, whose own app.kubernetes.io/* labels must stay the engine's. */}}
{{- define "llm-governor.selectorLabels" -}}
llm-governor.io/instance: {{ include "llm-governor.fullname" . | quote }}
{{- end -}}

{{- define "llm-governor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llm-governor.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: required when serviceAccount.create=false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "llm-governor.configMapName" -}}
{{- printf "%s-config" (include "llm-governor.fullname" .) -}}
{{- end -}}

{{/* The store: targets in <name>, state in <name>-state (service/store.py ConfigMapStore). */}}
{{- define "llm-governor.targetsConfigMap" -}}
{{- printf "%s-targets" (include "llm-governor.fullname" .) -}}
{{- end -}}
{{- define "llm-governor.stateConfigMap" -}}
{{- printf "%s-state" (include "llm-governor.targetsConfigMap" .) -}}
{{- end -}}

{{- define "llm-governor.leaseName" -}}
{{- default (printf "%s-leader" (include "llm-governor.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "llm-governor.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The address KEDA and engines in other namespaces use: fully qualified, because
ScaledObjects and engines live in the models' namespaces. */}}
{{- define "llm-governor.grpcAddress" -}}
{{- printf "%s:%d" (include "llm-governor.grpcHost" .) (int .Values.ports.grpc) -}}
{{- end -}}

{{/* The governor Service's DNS name (the name a TLS certificate must carry). */}}
{{- define "llm-governor.grpcHost" -}}
{{- printf "%s.%s.svc.%s" (include "llm-governor.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* The values' models, each with its namespace filled in: a model without one runs in
the release namespace (the governor's own default, `default`, would put a sidecar
release's ScaledObject and RBAC somewhere the install never meant). A model whose engines
the chart starts (every model in sidecar mode; exampleEngine's model) with engine.liveKnobs
gets `policy.knobs_live: true` unless its entry sets it: the governor then asks for no
roll-out and counts the new knobs on every replica at once. YAML `models: [...]`; read it
with (include "llm-governor.models" . | fromYaml).models. */}}
{{- define "llm-governor.models" -}}
{{- $out := list -}}
{{- $live := eq (include "llm-governor.liveKnobs" .) "true" -}}
{{- $ex := default dict .Values.exampleEngine -}}
{{- $exampleFound := false -}}
{{- range .Values.models -}}
{{- if kindIs "map" . -}}
{{- $m := deepCopy . -}}
{{- if not $m.namespace }}{{ $_ := set $m "namespace" $.Release.Namespace }}{{ end -}}
{{- $chartEngine := eq $.Values.mode "sidecar" -}}
{{- if and $ex.enabled (not $exampleFound) (or (not $ex.model) (eq $m.name $ex.model)) -}}
{{- $chartEngine = true }}{{ $exampleFound = true -}}
{{- end -}}
{{- $pol := default dict $m.policy -}}
{{- if and $live $chartEngine (kindIs "map" $pol) (not (hasKey $pol "knobs_live")) -}}
{{- $_ := set $pol "knobs_live" true }}{{ $_ := set $m "policy" $pol -}}
{{- end -}}
{{- $out = append $out $m -}}
{{- else -}}
{{- $out = append $out . -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "models" $out) -}}
{{- end -}}

{{/* The governor config file: the values' models (namespaces filled in), policy and
prometheus. */}}
{{- define "llm-governor.config" -}}
{{- $cfg := include "llm-governor.models" . | fromYaml -}}
{{- if .Values.policy }}{{ $_ := set $cfg "policy" .Values.policy }}{{ end -}}
{{- $prom := include "llm-governor.prometheusConfig" . | fromYaml -}}
{{- if $prom }}{{ $_ := set $cfg "prometheus" $prom }}{{ end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The label holding each engine series' namespace, as the governor reads
prometheus.namespace_label (estimators/promql.py "Namespaces"): unset, `namespace`; null,
empty (no scoping: a model's name summed over every namespace). The recording rules and
the dashboard group by it. */}}
{{/* The selectors of one model's own engine series in the alerts (a JSON list; dict
"sel": the model label matcher, "nsLabel": llm-governor.namespaceLabel, "m": the
model), as the governor reads them (estimators/answers.py ScopeKeys): its namespace's
series, then series without the namespace label (engines scraped without the relabel),
which llm-governor.modelQuantile joins with `or`, so they count only for the buckets
the first lack. Another namespace's model of this name never counts. */}}
{{- define "llm-governor.modelScopes" -}}
{{- if eq .nsLabel "" -}}
{{- list .sel | toJson -}}
{{- else -}}
{{- list (printf "%s, %s=%q" .sel .nsLabel (include "llm-governor.modelNamespace" .m)) (printf "%s, %s=\"\"" .sel .nsLabel) | toJson -}}
{{- end -}}
{{- end -}}

{{/* One model's counter rates summed by a label (dict "by": the label, e.g. le or
instance; "metrics": series names, deprecated ones after, joined with `or` per series as
the estimators do; "suffix": appended to each name, e.g. _sum (optional); "window";
"scopes": llm-governor.modelScopes, joined with `or`). */}}
{{- define "llm-governor.modelSum" -}}
{{- range $k, $scope := .scopes }}{{ if $k }} or {{ end }}sum by ({{ $.by }}) (
{{- range $j, $name := $.metrics }}{{ if $j }} or {{ end }}rate({{ $name }}{{ $.suffix | default "" }}{ {{- $scope -}} }[{{ $.window }}]){{ end -}}
){{ end }}
{{- end -}}

{{/* A histogram quantile over one model's series (dict "q", "metrics": bucket series
names, "window", "scopes": as llm-governor.modelSum sums them by `le`). */}}
{{- define "llm-governor.modelQuantile" -}}
histogram_quantile({{ .q }}, {{ include "llm-governor.modelSum" (dict "by" "le" "metrics" .metrics "window" .window "scopes" .scopes) }})
{{- end -}}

{{- define "llm-governor.namespaceLabel" -}}
{{- $prom := .Values.prometheus | default dict -}}
{{- if hasKey $prom "namespace_label" -}}
{{- $prom.namespace_label | default "" -}}
{{- else -}}
namespace
{{- end -}}
{{- end -}}

{{/* A Prometheus duration ("15s", "1m30s", "500ms") in seconds. */}}
{{- define "llm-governor.durationSeconds" -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" . -1 -}}
{{- $n := regexFind "^[0-9]+" . -}}
{{- $total = addf $total (mulf (float64 $n) (get $units (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The config's `prometheus` section. With the chart's ServiceMonitor/PodMonitor
(monitoring.serviceMonitor.enabled), scrape_interval_s is their interval, so the decider's
short window (at least two scrape intervals) matches how often the engines are scraped; a
prometheus.scrape_interval_s that disagrees is refused. */}}
{{- define "llm-governor.prometheusConfig" -}}
{{- $prom := deepCopy (default dict .Values.prometheus) -}}
{{- $sm := .Values.monitoring.serviceMonitor -}}
{{- if $sm.enabled -}}
{{- $every := include "llm-governor.durationSeconds" $sm.interval | float64 -}}
{{- if and (hasKey $prom "scrape_interval_s") (ne (float64 $prom.scrape_interval_s) $every) -}}
{{- fail (printf "prometheus.scrape_interval_s (%v) disagrees with monitoring.serviceMonitor.interval (%s = %v s), the interval the chart's ServiceMonitor and PodMonitor scrape at: the decider's short window must span two real scrapes. Leave prometheus.scrape_interval_s unset (the chart sets it from the interval) or make the two equal" $prom.scrape_interval_s $sm.interval $every) -}}
{{- end -}}
{{- $_ := set $prom "scrape_interval_s" $every -}}
{{- /* The governor's own start checks (controller/config.py GovernorConfig; defaults
window_s 60, max_staleness_s 90), at install instead of a crash-looping governor. */ -}}
{{- $pol := default dict .Values.policy -}}
{{- if le $every 0.0 }}{{ fail (printf "monitoring.serviceMonitor.interval (%s) must be longer than zero: it is the governor's prometheus.scrape_interval_s, which must be > 0" $sm.interval) }}{{ end -}}
{{- if gt $every 300.0 }}{{ fail (printf "monitoring.serviceMonitor.interval (%s) is over 300 s, the most prometheus.scrape_interval_s allows" $sm.interval) }}{{ end -}}
{{- range $key, $dflt := dict "window_s" 60.0 "max_staleness_s" 90.0 -}}
{{- $have := float64 (ternary (get $pol $key) $dflt (hasKey $pol $key)) -}}
{{- if lt $have (mulf 2.0 $every) -}}
{{- fail (printf "policy.%s (%v) must be >= 2 x monitoring.serviceMonitor.interval (%s): a rate needs two scrapes; raise policy.%s to at least %v or scrape more often" $key $have $sm.interval $key (mulf 2.0 $every)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $prom }}{{ toYaml $prom }}{{ end -}}
{{- end -}}

{{/* Checksum of what a running governor reads only at start. Not the models, on
purpose, whatever targets.managedByHelm says:
- true: their targets (SLAs, replica bounds, knobs) reach the governor live through the
  targets ConfigMap it watches (controller/targets.py build_config replaces the file's
  models with them), so an SLA-only `helm upgrade` restarts no pod, least of all a GPU
  engine that carries the sidecar;
- false: the store owns the targets after the first start, and a restarted governor
  applies the stored ones, not the file's: a restart would apply nothing.
The file's models still matter to a governor that starts later (its config file is
refreshed in place), so values it would refuse are stopped at install and upgrade by the
config check (templates/config-check.yaml) rather than by a restart. */}}
{{- define "llm-governor.restartChecksum" -}}
{{- $cfg := dict -}}
{{- if .Values.policy }}{{ $_ := set $cfg "policy" .Values.policy }}{{ end -}}
{{- $prom := include "llm-governor.prometheusConfig" . | fromYaml -}}
{{- if $prom }}{{ $_ := set $cfg "prometheus" $prom }}{{ end -}}
{{- toYaml $cfg | sha256sum -}}
{{- end -}}

{{/* A model's namespace; `.` is an entry of llm-governor.models (namespace filled in). */}}
{{- define "llm-governor.modelNamespace" -}}
{{- .namespace -}}
{{- end -}}
{{- define "llm-governor.minReplicas" -}}
{{- $r := default dict .replicas -}}
{{- if hasKey $r "min_replicas" }}{{ int $r.min_replicas }}{{ else }}1{{ end -}}
{{- end -}}
{{- define "llm-governor.maxReplicas" -}}
{{- $r := default dict .replicas -}}
{{- if hasKey $r "max_replicas" }}{{ int $r.max_replicas }}{{ else }}10{{ end -}}
{{- end -}}

{{/* Name of the per-model ScaledObject or HPA (in the model's namespace). */}}
{{- define "llm-governor.scalerName" -}}
{{- printf "%s-governor" .deployment | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Which Python-side actuator runs: only `kubernetes` patches Deployments itself. With
via=hpa the governor only exports the metric (and serves the KEDA scaler, unused). */}}
{{- define "llm-governor.scaleVia" -}}
{{- if eq .Values.scaling.via "kubernetes" }}kubernetes{{ else }}keda{{ end -}}
{{- end -}}

{{/* Whether the HPA behavior carries `tolerance: "0"` (scaling.zeroTolerance).
true / false: as set. auto: what the cluster accepts. The field exists from Kubernetes
1.33 (HPAScalingRules.tolerance; honoured only with the HPAConfigurableTolerance feature
gate, otherwise dropped). Through KEDA it must also be in the ScaledObject CRD: KEDA 2.18's
has it, 2.17's does not, and Helm 4 applies with strict field validation, so an unknown
field fails the install. auto therefore reads the installed CRD (lookup) and renders the
field only when its schema has it; without cluster access (`helm template`, --dry-run)
lookup finds nothing, and with scaling.keda.lookupCRD=false nothing is looked up: the
field is left out, the safe side. A forbidden lookup fails the render (Helm returns empty
only for NotFound).
Argument: dict "root" $ "keda" <bool>. Renders "true" or nothing. */}}
{{- define "llm-governor.renderTolerance" -}}
{{- $want := .root.Values.scaling.zeroTolerance -}}
{{- if kindIs "bool" $want -}}
{{- if $want }}true{{ end -}}
{{- else if semverCompare ">=1.33.0-0" .root.Capabilities.KubeVersion.Version -}}
{{- if not .keda -}}
true
{{- else if .root.Values.scaling.keda.lookupCRD -}}
{{- include "llm-governor.crdHasTolerance" (lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "scaledobjects.keda.sh") -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when `.`, the scaledobjects.keda.sh CRD object (empty when not installed or not
looked up), has `tolerance` in its v1alpha1 HPA scaling rules. */}}
{{- define "llm-governor.crdHasTolerance" -}}
{{- range (dig "spec" "versions" list (default dict .)) -}}
{{- if eq .name "v1alpha1" -}}
{{- $rules := dig "schema" "openAPIV3Schema" "properties" "spec" "properties" "advanced" "properties" "horizontalPodAutoscalerConfig" "properties" "behavior" "properties" "scaleUp" "properties" dict . -}}
{{- if hasKey $rules "tolerance" }}true{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* HPA behavior without damping of its own (KEDA copies it into the HPA it creates).
Scale up: no window, up to max replicas in one period. Scale down: no window, -100 % per
period. Tolerance 0 where the cluster accepts it (llm-governor.renderTolerance): without
it the default 10 % band swallows a step from 10 to 11 replicas.
Argument: dict "root" $ "max" <max replicas> "keda" <bool>. */}}
{{- define "llm-governor.hpaBehavior" -}}
{{- $period := int .root.Values.scaling.hpaPeriodSeconds -}}
{{- $tolerance := include "llm-governor.renderTolerance" . -}}
scaleUp:
  stabilizationWindowSeconds: 0
  selectPolicy: Max
  policies:
    - type: Pods
      value: {{ .max }}
      periodSeconds: {{ $period }}
    - type: Percent
      value: 1000
      periodSeconds: {{ $period }}
  {{- if $tolerance }}
  tolerance: "0"
  {{- end }}
scaleDown:
  stabilizationWindowSeconds: 0
  selectPolicy: Max
  policies:
    - type: Percent
      value: 100
      periodSeconds: {{ $period }}
  {{- if $tolerance }}
  tolerance: "0"
  {{- end }}
{{- end -}}

{{/* KEDA fallback replicas: the model's fallback_replicas, else min_replicas, at least 1. */}}
{{- define "llm-governor.fallbackReplicas" -}}
{{- if hasKey . "fallback_replicas" -}}
{{- max (int .fallback_replicas) 1 -}}
{{- else -}}
{{- max (int (include "llm-governor.minReplicas" .)) 1 -}}
{{- end -}}
{{- end -}}

{{/* Labels of a model's desired-replicas series for the HPA (valid label values: the
Deployment and its namespace, not the model name). */}}
{{- define "llm-governor.targetLabels" -}}
target_namespace: {{ include "llm-governor.modelNamespace" . | quote }}
target_deployment: {{ .deployment | quote }}
{{- end -}}
