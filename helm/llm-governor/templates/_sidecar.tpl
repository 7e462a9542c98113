{{/*
Sidecar mode: named templates an engine (or router) chart includes to run the governor in
its own pods. Add this chart as a dependency (alias e.g. `governor`, values mode: sidecar),
then, in the engine's pod template, with `$gov := .Subcharts.governor`:

  metadata:
    labels:
      {{- include "llm-governor.sidecar.podLabels" $gov | nindent 8 }}
    annotations:
      {{- include "llm-governor.sidecar.podAnnotations" $gov | nindent 8 }}
  spec:
    {{- include "llm-governor.sidecar.podAccount" $gov | nindent 4 }}
    initContainers:
      {{- include "llm-governor.sidecar.initContainers" (dict "gov" $gov "model" "MODEL") | nindent 6 }}
    containers:
      - name: vllm
        command: ["/bin/sh", "-c"]
        args: ['exec vllm serve MODEL $(cat /run/governor/engine-args)']
        env:
          {{- include "llm-governor.sidecar.engineEnv" $gov | nindent 10 }}
        volumeMounts:
          {{- include "llm-governor.sidecar.engineArgsMount" $gov | nindent 10 }}
      {{- include "llm-governor.sidecar.containers" $gov | nindent 6 }}
    volumes:
      {{- include "llm-governor.sidecar.volumes" $gov | nindent 6 }}

The pods must run in the release namespace (the ServiceAccount and ConfigMaps are there).
Nothing here can hold the engine back: the governor container has no startup or readiness
probe and runs under a supervisor that keeps the container running while `governor run`
crashes (llm-governor.supervisor); engine-args waits for it at most
sidecar.engineArgsWaitSeconds and then falls back to the model's default knobs; the
admin-token Secret is optional; only the governor container gets the ServiceAccount token.
With engine.liveKnobs the engine follows the knobs live (`engine-args --live`: the
scheduler plugin and middleware, whose packages the init container copies to
/run/governor/plugin, on the engine's PYTHONPATH through llm-governor.sidecar.engineEnv);
a failed copy falls back to the start-only flags, so the engine never fails to import it.
templates/example-engine.yaml uses exactly these templates, and tests/helm renders an
engine chart that includes them through .Subcharts.
*/}}

{{- define "llm-governor.sidecar.podLabels" -}}
{{ include "llm-governor.selectorLabels" . }}
{{- end -}}

{{/* The pod template's annotations: a checksum of what the governor reads only at start
(policy, prometheus: llm-governor.restartChecksum), so changing them rolls the pods and
restarts their governors; SLA and other target changes apply live and leave it as it is.
Renders nothing outside sidecar mode (the engine then runs no governor). */}}
{{- define "llm-governor.sidecar.podAnnotations" -}}
{{- if eq .Values.mode "sidecar" -}}
llm-governor.io/config-checksum: {{ include "llm-governor.restartChecksum" . | quote }}
{{- end -}}
{{- end -}}

{{/* The pod's account: the governor's ServiceAccount (its RBAC: store ConfigMaps, Lease,
scale), with the token NOT automounted into every container: the governor container
mounts it itself (llm-governor.saTokenVolume), so the engine cannot rewrite the targets,
take the Lease or scale Deployments. */}}
{{- define "llm-governor.sidecar.podAccount" -}}
serviceAccountName: {{ include "llm-governor.serviceAccountName" . | quote }}
automountServiceAccountToken: false
{{- end -}}

{{/* Where engine-args asks: the pod's own governor when it is a native sidecar (up before
the engine-args init container runs), else the Service (standalone instances, or the
sidecars of other engine pods; with none reachable engine-args falls back to the defaults). */}}
{{- define "llm-governor.sidecar.server" -}}
{{- if and (eq .Values.mode "sidecar") .Values.sidecar.native -}}
{{- printf "127.0.0.1:%d" (int .Values.ports.grpc) -}}
{{- else -}}
{{- include "llm-governor.grpcAddress" . -}}
{{- end -}}
{{- end -}}

{{/* Argument: dict "gov" <governor scope> "model" <models[].name> ["server" <addr>].
The native governor sidecar (if sidecar.native), then an init container that runs
`governor engine-args` and leaves the flags in /run/governor/engine-args for the engine's
command. engine-args always exits 0 (it falls back to the model's default knobs), so an
engine never fails to start because of the governor. */}}
{{- define "llm-governor.sidecar.initContainers" -}}
{{- $gov := .gov -}}
{{- if and (eq $gov.Values.mode "sidecar") $gov.Values.sidecar.native -}}
{{ include "llm-governor.container" (dict "root" $gov "native" true) }}
{{ end -}}
{{ include "llm-governor.engineArgsContainer" (dict "gov" $gov "model" .model "server" (default (include "llm-governor.sidecar.server" $gov) .server)) }}
{{- end -}}

{{/* The governor as a regular container (sidecar.native false). Argument: governor scope. */}}
{{- define "llm-governor.sidecar.containers" -}}
{{- if and (eq .Values.mode "sidecar") (not .Values.sidecar.native) -}}
{{ include "llm-governor.container" (dict "root" . "native" false) }}
{{- end -}}
{{- end -}}

{{/* The governor's volumes (sidecar mode) and the engine-args hand-over directory. */}}
{{- define "llm-governor.sidecar.volumes" -}}
{{- if eq .Values.mode "sidecar" -}}
- name: governor-config
  configMap:
    name: {{ include "llm-governor.configMapName" . | quote }}
{{- include "llm-governor.adminTokenVolume" . }}
{{- include "llm-governor.tlsVolume" . }}
{{ include "llm-governor.saTokenVolume" . }}
{{ end -}}
- name: governor-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if and .Values.tls.existingSecret (ne .Values.mode "sidecar") }}
# engine-args' --tls-ca-file: the CA only (never the governor's key); optional, so that an
# engine in a namespace without the Secret still starts (engine-args then falls back to
# the default knobs)
- name: governor-tls-ca
  secret:
    secretName: {{ .Values.tls.existingSecret | quote }}
    optional: true
    defaultMode: 0444
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
- name: governor-engine-args
  emptyDir:
    medium: Memory
    {{- /* the flags; with engine.liveKnobs also the plugin's packages (about 120 KiB) */}}
    sizeLimit: {{ ternary "8Mi" "1Mi" (include "llm-governor.liveKnobs" . | eq "true") }}
{{- end -}}

{{- define "llm-governor.liveKnobs" -}}
{{- $e := default dict .Values.engine -}}
{{- if hasKey $e "liveKnobs" }}{{ $e.liveKnobs }}{{ else }}true{{ end -}}
{{- end -}}

{{/* The engine container's environment: with engine.liveKnobs, the plugin's packages
(copied by the engine-args init container) on PYTHONPATH; else nothing. Argument: the
governor scope. Renders list items, or `[]` when there are none. */}}
{{- define "llm-governor.sidecar.engineEnv" -}}
{{- if eq (include "llm-governor.liveKnobs" .) "true" -}}
- name: PYTHONPATH
  value: /run/governor/plugin
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{- define "llm-governor.sidecar.engineArgsMount" -}}
- name: governor-engine-args
  mountPath: /run/governor
  readOnly: true
{{- end -}}

{{/* Argument: dict "gov" <governor scope> "model" <name> "server" <host:port>.
The fallback knobs come from the model's values (knobs.default_*), passed as flags rather
than through the config file, because an engine in another namespace cannot mount the
governor's ConfigMap. */}}
{{- define "llm-governor.engineArgsContainer" -}}
{{- $v := .gov.Values -}}
{{- $local := hasPrefix "127.0.0.1:" .server -}}
{{- $knobs := dict -}}
{{- range $v.models }}{{ if eq .name $.model }}{{ $knobs = default dict .knobs }}{{ end }}{{ end -}}
- name: governor-engine-args
  image: {{ include "llm-governor.image" .gov | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["/bin/sh", "-c"]
  args:
    - |
      {{- if $local }}
      # The pod's own governor: wait for its port, at most sidecar.engineArgsWaitSeconds
      # (a bound, not a gate: engine-args then falls back to the default knobs).
      python - {{ int $v.sidecar.engineArgsWaitSeconds }} {{ int $v.ports.grpc }} <<'EOF'
      import socket, sys, time
      end = time.monotonic() + float(sys.argv[1])
      while time.monotonic() < end:
          try:
              socket.create_connection(("127.0.0.1", int(sys.argv[2])), 1).close()
              break
          except OSError:
              time.sleep(0.5)
      EOF
      {{- end }}
      {{- $cmd := `governor engine-args --model "$GOVERNOR_MODEL" --server "$GOVERNOR_SERVER"` }}
      {{- with $knobs.default_max_num_seqs }}{{ $cmd = printf "%s --default-max-num-seqs %d" $cmd (int .) }}{{ end }}
      {{- with $knobs.default_max_num_batched_tokens }}{{ $cmd = printf "%s --default-max-num-batched-tokens %d" $cmd (int .) }}{{ end }}
      {{- if $v.tls.existingSecret }}{{ $cmd = printf "%s --tls-ca-file /etc/governor-tls/ca.crt" $cmd }}{{ end }}
      {{- if and $v.tls.existingSecret $local }}{{ $cmd = printf "%s --tls-server-name %s" $cmd (include "llm-governor.grpcHost" .gov) }}{{ end }}
      {{- if eq (include "llm-governor.liveKnobs" .gov) "true" }}
      # engine.liveKnobs: the ceilings (without a governor: the model's knob bounds),
      # scheduler plugin, middleware and governor address;
      # the plugin's packages go to /run/governor/plugin (the engine's PYTHONPATH). Should
      # the copy fail, the start-only flags instead: the engine must not fail on an import.
      {{ $cmd }} --live --plugin-dir /run/governor/plugin
      {{- with $knobs.max_num_seqs_max }} --default-max-num-seqs-ceiling {{ int . }}{{ end }}
      {{- with $knobs.max_num_batched_tokens_max }} --default-max-num-batched-tokens-ceiling {{ int . }}{{ end }} > /run/governor/engine-args
      if [ ! -f /run/governor/plugin/governor_engine/__init__.py ] || [ ! -f /run/governor/plugin/governor_api/__init__.py ]; then
        echo "governor engine-args: plugin packages missing; the engine starts with the start-only flags" >&2
        {{ $cmd }} > /run/governor/engine-args
      fi
      {{- else }}
      {{ $cmd }} > /run/governor/engine-args
      {{- end }}
  env:
    - name: GOVERNOR_MODEL
      value: {{ .model | quote }}
    - name: GOVERNOR_SERVER
      value: {{ .server | quote }}
    # engine-args reports the engine's identity (--engine-id defaults to $POD_NAME).
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
  resources:
    requests:
      cpu: 10m
      memory: 64Mi
    limits:
      memory: 128Mi
  {{- with $v.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: governor-engine-args
      mountPath: /run/governor
    - name: governor-tmp
      mountPath: /tmp
    {{- if $v.tls.existingSecret }}
    # the CA that signed the governor's certificate (tls.existingSecret's ca.crt)
    - name: {{ ternary "governor-tls" "governor-tls-ca" (eq $v.mode "sidecar") }}
      mountPath: /etc/governor-tls
      readOnly: true
    {{- end }}
{{- end -}}
