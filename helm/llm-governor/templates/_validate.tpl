{{/*
Checks values.schema.json cannot express (min <= max, uniqueness, cross-references), and a
second line of defence for the schema's own checks when an install skips it
(--skip-schema-validation). Each failure names the value and what to change. Renders
nothing when the values are good.
*/}}
{{- define "llm-governor.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.mode (list "standalone" "sidecar")) -}}
{{- fail (printf "mode: must be standalone or sidecar (got %v)" $v.mode) -}}
{{- end -}}
{{- if not (has $v.scaling.via (list "keda" "kubernetes" "hpa")) -}}
{{- fail (printf "scaling.via: must be keda, kubernetes or hpa (got %v)" $v.scaling.via) -}}
{{- end -}}
{{- if not (has $v.scaling.keda.triggerType (list "external" "external-push")) -}}
{{- fail (printf "scaling.keda.triggerType: must be external or external-push (got %v)" $v.scaling.keda.triggerType) -}}
{{- end -}}
{{- $full := include "llm-governor.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) -}}
{{- fail (printf "the release name %q (with nameOverride/fullnameOverride) names the governor's Service %q, which is not a valid Service name: a DNS label that starts with a letter (RFC 1035: lowercase letters, digits and '-'). Use a release name that starts with a letter, or set fullnameOverride" .Release.Name $full) -}}
{{- end -}}
{{- if not $v.models -}}
{{- fail "models: at least one model is required (name, deployment, sla; see values.yaml)" -}}
{{- end -}}
{{- $names := dict -}}
{{- $targets := dict -}}
{{- range $i, $m := (include "llm-governor.models" . | fromYaml).models -}}
{{- if not (kindIs "map" $m) -}}
{{- fail (printf "models[%d]: must be a mapping with name, deployment and sla (got %v)" $i $m) -}}
{{- end -}}
{{- if not $m.name -}}
{{- fail (printf "models[%d].name: required (the model_name label vLLM exports, e.g. meta-llama/Llama-3.1-8B-Instruct)" $i) -}}
{{- end -}}
{{- $where := printf "models[%d] (%s)" $i $m.name -}}
{{- if not $m.deployment -}}
{{- fail (printf "%s: deployment is required (the engine Deployment to scale)" $where) -}}
{{- end -}}
{{- if not (and $m.sla (kindIs "map" $m.sla) $m.sla.ttft_p95_ms $m.sla.itl_p95_ms) -}}
{{- fail (printf "%s: sla.ttft_p95_ms and sla.itl_p95_ms are required" $where) -}}
{{- end -}}
{{- if hasKey $names $m.name -}}
{{- fail (printf "%s: model name appears more than once" $where) -}}
{{- end -}}
{{- $_ := set $names $m.name true -}}
{{- $ns := include "llm-governor.modelNamespace" $m -}}
{{- $key := printf "%s/%s" $ns $m.deployment -}}
{{- if hasKey $targets $key -}}
{{- fail (printf "%s: deployment %s is also scaled for model %s; two models scaling one Deployment would fight" $where $key (get $targets $key)) -}}
{{- end -}}
{{- $_ := set $targets $key $m.name -}}
{{- $min := int (include "llm-governor.minReplicas" $m) -}}
{{- $max := int (include "llm-governor.maxReplicas" $m) -}}
{{- if gt $min $max -}}
{{- fail (printf "%s: replicas.min_replicas (%d) must be <= replicas.max_replicas (%d)" $where $min $max) -}}
{{- end -}}
{{- if lt $max 1 -}}
{{- fail (printf "%s: replicas.max_replicas must be >= 1 (got %d)" $where $max) -}}
{{- end -}}
{{- if and (hasKey $m "fallback_replicas") (gt (int $m.fallback_replicas) $max) -}}
{{- fail (printf "%s: fallback_replicas (%d) must be <= replicas.max_replicas (%d)" $where (int $m.fallback_replicas) $max) -}}
{{- end -}}
{{- if and (eq $v.mode "sidecar") (eq $v.sidecar.placement "engine") (lt $min 1) -}}
{{- fail (printf "%s: replicas.min_replicas is 0, but in sidecar mode (sidecar.placement: engine) the governor runs inside the engine pods: at zero replicas nothing is left to scale them up. Set min_replicas >= 1, or run the sidecar next to a router (sidecar.placement: router), or use mode: standalone" $where) -}}
{{- end -}}
{{- if and (eq $v.scaling.via "hpa") (gt (len $m.deployment) 63) -}}
{{- fail (printf "%s: with scaling.via=hpa the deployment name is a metric label value, at most 63 characters (got %d)" $where (len $m.deployment)) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.mode "standalone") (gt (int $v.standalone.replicas) 1) (not $v.leaderElection.enabled) -}}
{{- fail (printf "leaderElection.enabled: must be true with standalone.replicas %d (without it every replica would actuate)" (int $v.standalone.replicas)) -}}
{{- end -}}
{{- $pdb := $v.standalone.podDisruptionBudget -}}
{{- if and (eq $v.mode "standalone") $pdb.enabled (ge (int $pdb.minAvailable) (int $v.standalone.replicas)) -}}
{{- fail (printf "standalone.podDisruptionBudget.minAvailable (%d) must be < standalone.replicas (%d), or no node could ever be drained; disable the PDB for a single replica" (int $pdb.minAvailable) (int $v.standalone.replicas)) -}}
{{- end -}}
{{- if and (eq $v.mode "sidecar") (not $v.leaderElection.enabled) -}}
{{- fail "leaderElection.enabled: must be true in sidecar mode (one governor per engine pod; only the leader may actuate)" -}}
{{- end -}}
{{- if and (eq $v.scaling.via "hpa") (not $v.monitoring.prometheusRule.enabled) -}}
{{- fail "scaling.via=hpa needs monitoring.prometheusRule.enabled=true: the HPA reads the recording rule governor_target_desired_replicas (one series per model, labelled with its Deployment) through prometheus-adapter" -}}
{{- end -}}
{{- if and (eq $v.scaling.via "hpa") (not $v.monitoring.serviceMonitor.enabled) -}}
{{- fail "scaling.via=hpa needs monitoring.serviceMonitor.enabled=true: the recording rule the HPAs read selects the governor's own /metrics (job=<release Service>), which only the chart's ServiceMonitor scrapes; without it the HPAs report FailedGetExternalMetric forever. With kube-prometheus-stack also set monitoring.serviceMonitor.labels and monitoring.prometheusRule.labels to its selectors (release: <its release name>)" -}}
{{- end -}}
{{- if not (or (kindIs "bool" $v.scaling.zeroTolerance) (eq (toString $v.scaling.zeroTolerance) "auto")) -}}
{{- fail (printf "scaling.zeroTolerance: must be auto, true or false (got %v)" $v.scaling.zeroTolerance) -}}
{{- end -}}
{{- if and (not $v.serviceAccount.create) (not $v.serviceAccount.name) -}}
{{- fail "serviceAccount.name: required when serviceAccount.create=false (the existing ServiceAccount the governor runs as); without it the pods would run as, and the Role would be bound to, the namespace's `default` ServiceAccount" -}}
{{- end -}}
{{- if $v.exampleEngine.enabled -}}
{{- $model := include "llm-governor.exampleModel" . | fromYaml -}}
{{- if not $model.name -}}
{{- fail (printf "exampleEngine.model: %q is not the name of a model in models" $v.exampleEngine.model) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$" $model.deployment) -}}
{{- fail (printf "exampleEngine: model %s's deployment %q names the example engine's Service and is its pods' label value, so it must be a DNS label that starts with a letter, at most 63 characters (RFC 1035); got %d characters" $model.name $model.deployment (len $model.deployment)) -}}
{{- end -}}
{{- if and (eq $v.mode "sidecar") (ne (include "llm-governor.modelNamespace" $model) .Release.Namespace) -}}
{{- fail (printf "exampleEngine: in sidecar mode the engine pods carry the governor, whose ServiceAccount and ConfigMaps are in the release namespace %s; model %s is in namespace %s. Install the release there" .Release.Namespace $model.name (include "llm-governor.modelNamespace" $model)) -}}
{{- end -}}
{{- end -}}
{{- range $key := list "grpc" "metrics" -}}
{{- $p := get $v.ports $key -}}
{{- if or (lt (int $p) 1) (gt (int $p) 65535) -}}
{{- fail (printf "ports.%s: must be a port number, 1-65535 (got %v)" $key $p) -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.ports.grpc) (int $v.ports.metrics) -}}
{{- fail (printf "ports.grpc and ports.metrics are both %d: give each its own port (the Service cannot carry one port twice)" (int $v.ports.grpc)) -}}
{{- end -}}
{{- with $v.governor.adminListen -}}
{{- /* The governor listens on 0.0.0.0 (every address) for gRPC and metrics: an admin
listener on either port, whatever its host, could not bind (service/run.py refuses it). */ -}}
{{- if not (regexMatch "^([^\\s:\\[\\]]+|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5}$" .) -}}
{{- fail (printf "governor.adminListen: must be HOST:PORT, IPv6 as [ADDR]:PORT (got %q)" .) -}}
{{- end -}}
{{- $port := int (regexFind "[0-9]+$" .) -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "governor.adminListen: the port must be 1-65535 (got %d in %q)" $port .) -}}
{{- end -}}
{{- range $key := list "grpc" "metrics" -}}
{{- if eq $port (int (get $v.ports $key)) -}}
{{- $free := add (int $v.ports.grpc) 1 -}}
{{- if eq $free (int $v.ports.metrics) }}{{ $free = add $free 1 }}{{ end -}}
{{- fail (printf "governor.adminListen (%s) is on port %d, which ports.%s already takes: the governor listens on 0.0.0.0:%d, every address (%s's host included), so the admin listener could not bind. Give it a port of its own, e.g. 127.0.0.1:%d" $v.governor.adminListen $port $key $port $v.governor.adminListen $free) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The alert rules' durations (Prometheus' grammar: units largest first, each at most
once). A window is a range selector ([5m]): a range of zero, or a duration Prometheus cannot
parse, fails to load the rule file, which drops every rule of its group. `for:` may be 0s
(the alert fires on the first evaluation that matches, Prometheus' default). */ -}}
{{- $pr := $v.monitoring.prometheusRule -}}
{{- $grammar := "^([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$" -}}
{{- range $key := list "slaShortWindow" "slaLongWindow" "actuationGapWindow" "tailWindow" "slowReplicaWindow" -}}
{{- $w := toString (get $pr $key) -}}
{{- if not (and (regexMatch $grammar $w) (regexMatch "[1-9]" $w)) -}}
{{- fail (printf "monitoring.prometheusRule.%s: must be a Prometheus duration longer than zero, units largest first (e.g. 5m, 1h30m; got %q): it is the range of the alerts' [%s] selectors, and a zero or malformed range fails to load, which drops the whole rule group" $key $w $w) -}}
{{- end -}}
{{- end -}}
{{- range $key := list "slaFor" "actuationFailingFor" "actuationGapFor" "tailFor" "plantOffProfileFor" "slowReplicaFor" -}}
{{- $w := toString (get $pr $key) -}}
{{- if not (and $w (regexMatch $grammar $w)) -}}
{{- fail (printf "monitoring.prometheusRule.%s: must be a Prometheus duration, units largest first (e.g. 10m, 1h30m; 0s fires on the first evaluation that matches; got %q): it is the alerts' for:, which Prometheus cannot load otherwise" $key $w) -}}
{{- end -}}
{{- end -}}
{{- /* Watch-stream limits, as `governor run` checks them (service/run.py _check_flags):
each >= 1; maxWatchStreams below maxConcurrentRpcs (a stream holds an RPC slot while open,
unary calls need one left); maxWatchStreamsPerClient at most maxWatchStreams, or at most
its default (the smaller of 1024 and half of maxConcurrentRpcs) when that is null. */ -}}
{{- $rpcs := int $v.governor.maxConcurrentRpcs -}}
{{- $streams := min 1024 (div $rpcs 2) -}}
{{- $streamsIs := printf "null: the governor's default is %d, the smaller of 1024 and half of governor.maxConcurrentRpcs (%d)" $streams $rpcs -}}
{{- range $key := list "maxWatchStreams" "maxWatchStreamsPerClient" -}}
{{- $n := index $v.governor $key -}}
{{- if and (not (kindIs "invalid" $n)) (lt (int64 $n) 1) -}}
{{- fail (printf "governor.%s: must be >= 1 or null (null: the governor's default; got %v)" $key $n) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.governor.maxWatchStreams) -}}
{{- $streams = int $v.governor.maxWatchStreams -}}
{{- $streamsIs = printf "%d" $streams -}}
{{- if ge $streams $rpcs -}}
{{- fail (printf "governor.maxWatchStreams (%d) must be below governor.maxConcurrentRpcs (%d): a watch stream holds an RPC slot for as long as it is open, and unary calls (engines' GetBatchingConfig, KEDA, admin, health) need one left. Lower governor.maxWatchStreams or raise governor.maxConcurrentRpcs" $streams $rpcs) -}}
{{- end -}}
{{- end -}}
{{- with $v.governor.maxWatchStreamsPerClient -}}
{{- if gt (int .) $streams -}}
{{- fail (printf "governor.maxWatchStreamsPerClient (%d) must be <= governor.maxWatchStreams (%s): one client host cannot hold more streams than every client together. Lower governor.maxWatchStreamsPerClient or raise governor.maxWatchStreams" (int .) $streamsIs) -}}
{{- end -}}
{{- end -}}
{{- if and $v.tls.clientCA (not $v.tls.existingSecret) -}}
{{- fail "tls.clientCA: true needs tls.existingSecret (the kubernetes.io/tls Secret whose ca.crt signs the client certificates); without it nothing would be checked" -}}
{{- end -}}
{{- end -}}

{{/* The model entry exampleEngine runs (YAML; empty map when not found). */}}
{{- define "llm-governor.exampleModel" -}}
{{- $want := .Values.exampleEngine.model -}}
{{- $found := dict -}}
{{- range (include "llm-governor.models" . | fromYaml).models -}}
{{- if and (not $found.name) (or (not $want) (eq .name $want)) }}{{ $found = . }}{{ end -}}
{{- end -}}
{{- toYaml $found -}}
{{- end -}}
