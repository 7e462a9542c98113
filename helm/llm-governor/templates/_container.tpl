{{/*
The governor container and its volumes, shared by the standalone Deployment and the
sidecar templates. Argument: the governor chart's scope.
*/}}

{{- define "llm-governor.args" -}}
- run
- --config
- /etc/governor/config.yaml
- --grpc-listen
- {{ printf "0.0.0.0:%d" (int .Values.ports.grpc) | quote }}
- --metrics-listen
- {{ printf "0.0.0.0:%d" (int .Values.ports.metrics) | quote }}
{{- /* Targets and state persist in ConfigMaps of the release namespace, so a restarted or
new instance continues the stabilization windows instead of starting over. */}}
- --store
- configmap
- --configmap
- {{ include "llm-governor.targetsConfigMap" . | quote }}
- --namespace
- {{ .Release.Namespace | quote }}
- --leader-election
- {{ ternary "on" "off" .Values.leaderElection.enabled | quote }}
- --lease
- {{ include "llm-governor.leaseName" . | quote }}
- --scale-via
- {{ include "llm-governor.scaleVia" . | quote }}
- --hpa-conflict-check
- {{ ternary "on" "off" .Values.rbac.hpaConflictCheck | quote }}
- --knob-rollouts
- {{ ternary "on" "off" .Values.actuation.knobRollouts | quote }}
- --drain-scale-in
- {{ ternary "on" "off" .Values.actuation.drainScaleIn | quote }}
- --shutdown-grace-s
- {{ .Values.governor.shutdownGraceSeconds | toString | quote }}
- --max-concurrent-rpcs
- {{ int .Values.governor.maxConcurrentRpcs | toString | quote }}
{{- /* Watch-stream limits: left out when null, so the governor's defaults apply. */}}
{{- if not (kindIs "invalid" .Values.governor.maxWatchStreams) }}
- --max-watch-streams
- {{ int .Values.governor.maxWatchStreams | toString | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.governor.maxWatchStreamsPerClient) }}
- --max-watch-streams-per-client
- {{ int .Values.governor.maxWatchStreamsPerClient | toString | quote }}
{{- end }}
- --log-level
- {{ .Values.governor.logLevel | quote }}
{{- /* Sidecar mode: the supervisor drops --admin-token-file while the (optional) Secret's
file is missing. */}}
{{- if .Values.adminToken.existingSecret }}
- --admin-token-file
- /etc/governor-admin/token
{{- end }}
{{- with .Values.governor.adminListen }}
- --admin-listen
- {{ . | quote }}
{{- end }}
{{- if .Values.tls.existingSecret }}
- --tls-cert-file
- /etc/governor-tls/tls.crt
- --tls-key-file
- /etc/governor-tls/tls.key
{{- if .Values.tls.clientCA }}
- --tls-client-ca-file
- /etc/governor-tls/ca.crt
{{- end }}
{{- end }}
{{- range .Values.governor.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* A gRPC health probe; with tls.existingSecret a TCP connect instead: the kubelet's gRPC
probe speaks plaintext only, and a TLS server would fail it forever. */}}
{{- define "llm-governor.grpcProbe" -}}
{{- if .root.Values.tls.existingSecret }}
tcpSocket:
  port: {{ int .root.Values.ports.grpc }}
{{- else }}
grpc:
  port: {{ int .root.Values.ports.grpc }}
  {{- if .probe.service }}
  service: {{ .probe.service | quote }}
  {{- end }}
{{- end }}
{{- with .probe.periodSeconds }}
periodSeconds: {{ int . }}
{{- end }}
{{- with .probe.failureThreshold }}
failureThreshold: {{ int . }}
{{- end }}
{{- with .probe.initialDelaySeconds }}
initialDelaySeconds: {{ int . }}
{{- end }}
timeoutSeconds: {{ int (default 2 .probe.timeoutSeconds) }}
{{- end -}}

{{/* Sidecar mode: the governor runs under this supervisor instead of the kubelet's probes.
Kubernetes counts a sidecar's readiness, and a crashed or restarting container's, into the
Pod's Ready condition, and holds the engine back until a native sidecar has started: so
the container must stay running whatever the governor does. The shell restarts `governor
run` when it exits (1 s, doubling to 60 s, back to 1 s after a minute of running),
forwards SIGTERM to it and exits 0 after it. --admin-token-file is dropped while its
(optional) Secret is not mounted: the admin API stays off and scaling goes on. */}}
{{- define "llm-governor.supervisor" -}}
token=/etc/governor-admin/token
delay=1
pid=
trap 'trap - TERM INT; if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid"; fi; exit 0' TERM INT
start_without_token() {
  skip=
  for a do
    shift
    if [ -n "$skip" ]; then skip=; continue; fi
    if [ "$a" = --admin-token-file ]; then skip=1; continue; fi
    set -- "$@" "$a"
  done
  governor "$@" &
}
while :; do
  started=$(date +%s)
  case " $* " in
    *" --admin-token-file "*)
      if [ -s "$token" ]; then
        governor "$@" &
      else
        echo "governor-supervisor: $token is missing (Secret ${ADMIN_TOKEN_SECRET:-?} not found or without the key): admin API off" >&2
        start_without_token "$@"
      fi ;;
    *) governor "$@" & ;;
  esac
  pid=$!
  wait "$pid"
  rc=$?
  pid=
  if [ $(( $(date +%s) - started )) -ge 60 ]; then delay=1; fi
  echo "governor-supervisor: governor exited with status $rc; restarting in ${delay}s" >&2
  sleep "$delay" &
  pid=$!
  wait "$pid"
  pid=
  delay=$(( delay * 2 ))
  if [ "$delay" -gt 60 ]; then delay=60; fi
done
{{- end -}}

{{/* Argument: dict "root" <governor scope> "native" <bool: a native sidecar>. */}}
{{- define "llm-governor.container" -}}
{{- $v := .root.Values -}}
{{- $sidecar := eq $v.mode "sidecar" -}}
- name: governor
  image: {{ include "llm-governor.image" .root | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .native }}
  # Native sidecar: runs for the pod's lifetime, started before the regular init containers
  # (so `governor engine-args` can reach it on localhost) and stopped after the engine.
  restartPolicy: Always
  {{- end }}
  {{- if $sidecar }}
  # Supervised, without probes: nothing the governor does can hold the engine back or
  # make its pod NotReady (see llm-governor.supervisor).
  command:
    - /bin/sh
    - -c
    - |
      {{- include "llm-governor.supervisor" .root | nindent 6 }}
    - governor-supervisor
  {{- end }}
  args:
    {{- include "llm-governor.args" .root | nindent 4 }}
  env:
    # --identity defaults to $POD_NAME: the Lease holder names the pod.
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- if and $sidecar $v.adminToken.existingSecret }}
    - name: ADMIN_TOKEN_SECRET
      value: {{ $v.adminToken.existingSecret | quote }}
    {{- end }}
    {{- with $v.governor.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: grpc
      containerPort: {{ int $v.ports.grpc }}
      protocol: TCP
    - name: metrics
      containerPort: {{ int $v.ports.metrics }}
      protocol: TCP
  {{- if not $sidecar }}
  # gRPC probes (grpc.health.v1, which the governor serves): no exec binary in the image.
  startupProbe:
    {{- include "llm-governor.grpcProbe" (dict "root" .root "probe" $v.probes.startup) | nindent 4 }}
  livenessProbe:
    {{- include "llm-governor.grpcProbe" (dict "root" .root "probe" $v.probes.liveness) | nindent 4 }}
  readinessProbe:
    {{- include "llm-governor.grpcProbe" (dict "root" .root "probe" $v.probes.readiness) | nindent 4 }}
  {{- end }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: governor-config
      mountPath: /etc/governor
      readOnly: true
    # The root filesystem is read-only; Python and grpc may still want a scratch directory.
    - name: governor-tmp
      mountPath: /tmp
    {{- if $v.adminToken.existingSecret }}
    - name: governor-admin-token
      mountPath: /etc/governor-admin
      readOnly: true
    {{- end }}
    {{- if $v.tls.existingSecret }}
    - name: governor-tls
      mountPath: /etc/governor-tls
      readOnly: true
    {{- end }}
    {{- if $sidecar }}
    # The ServiceAccount token, in this container only (the pod does not automount it, so
    # the engine's processes cannot use the governor's RBAC).
    - name: governor-sa-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- end }}
{{- end -}}

{{- define "llm-governor.volumes" -}}
- name: governor-config
  configMap:
    name: {{ include "llm-governor.configMapName" . | quote }}
- name: governor-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- include "llm-governor.adminTokenVolume" . }}
{{- include "llm-governor.tlsVolume" . }}
{{- end -}}

{{/* The governor's ServiceAccount credentials as a projected volume (what the kubelet's
automount would add, but mounted into the governor container alone): a bound, expiring
token the kubelet rotates, the cluster CA and the namespace. */}}
{{- define "llm-governor.saTokenVolume" -}}
- name: governor-sa-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- end -}}

{{/* The gRPC server certificate (tls.existingSecret: a kubernetes.io/tls Secret; ca.crt
too when tls.clientCA requires client certificates). */}}
{{- define "llm-governor.tlsVolume" -}}
{{- if .Values.tls.existingSecret }}
- name: governor-tls
  secret:
    secretName: {{ .Values.tls.existingSecret | quote }}
    defaultMode: 0444
{{- end }}
{{- end -}}

{{/* The admin bearer token's volume (only its key, as the file `token`), when a Secret is
given. Mounted into the governor container alone; world-readable inside it because in
sidecar mode the pod may have no fsGroup to give uid 10001 the group bit. Optional: in
standalone mode a missing Secret stops `governor run` with a message naming the file;
in sidecar mode the supervisor runs the governor without the admin API. */}}
{{- define "llm-governor.adminTokenVolume" -}}
{{- if .Values.adminToken.existingSecret }}
- name: governor-admin-token
  secret:
    secretName: {{ .Values.adminToken.existingSecret | quote }}
    # A missing Secret must not keep the pod (in sidecar mode: the engine) from starting.
    optional: true
    items:
      - key: {{ .Values.adminToken.key | quote }}
        path: token
    defaultMode: 0444
{{- end }}
{{- end -}}
