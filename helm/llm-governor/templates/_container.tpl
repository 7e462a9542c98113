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
- {{ include "llm-governor.targetsConfigMap" . }}
- --namespace
- {{ .Release.Namespace }}
- --leader-election
- {{ ternary "on" "off" .Values.leaderElection.enabled | quote }}
- --lease
- {{ include "llm-governor.leaseName" . }}
- --scale-via
- {{ include "llm-governor.scaleVia" . }}
- --shutdown-grace-s
- {{ .Values.governor.shutdownGraceSeconds | toString | quote }}
- --max-concurrent-rpcs
- {{ int .Values.governor.maxConcurrentRpcs | toString | quote }}
- --log-level
- {{ .Values.governor.logLevel }}
{{- if .Values.adminToken.existingSecret }}
- --admin-token-file
- /etc/governor-admin/token
{{- end }}
{{- range .Values.governor.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "llm-governor.grpcProbe" -}}
grpc:
  port: {{ int .root.Values.ports.grpc }}
  {{- if .probe.service }}
  service: {{ .probe.service | quote }}
  {{- end }}
{{- with .probe.periodSeconds }}
periodSeconds: {{ int . }}
{{- end }}
{{- with .probe.failureThreshold }}
failureThreshold: {{ int . }}
{{- end }}
timeoutSeconds: 2
{{- end -}}

{{/* Argument: dict "root" <governor scope> "native" <bool: a native sidecar>. */}}
{{- define "llm-governor.container" -}}
{{- $v := .root.Values -}}
- name: governor
  image: {{ include "llm-governor.image" .root | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .native }}
  # Native sidecar: runs for the pod's lifetime, started before the regular init containers
  # (so `governor engine-args` can reach it on localhost) and stopped after the engine.
  restartPolicy: Always
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
  # gRPC probes (grpc.health.v1, which the governor serves): no exec binary in the image.
  startupProbe:
    {{- include "llm-governor.grpcProbe" (dict "root" .root "probe" $v.probes.startup) | nindent 4 }}
  livenessProbe:
    {{- include "llm-governor.grpcProbe" (dict "root" .root "probe" $v.probes.liveness) | nindent 4 }}
  readinessProbe:
    {{- include "llm-governor.grpcProbe" (dict "root" .root "probe" $v.probes.readiness) | nindent 4 }}
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
{{- end -}}

{{- define "llm-governor.volumes" -}}
- name: governor-config
  configMap:
    name: {{ include "llm-governor.configMapName" . }}
- name: governor-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- include "llm-governor.adminTokenVolume" . }}
{{- end -}}

{{/* The admin bearer token's volume (only its key, as the file `token`), when a Secret is
given. Mounted into the governor container alone; world-readable inside it because in
sidecar mode the pod may have no fsGroup to give uid 10001 the group bit. */}}
{{- define "llm-governor.adminTokenVolume" -}}
{{- if .Values.adminToken.existingSecret }}
- name: governor-admin-token
  secret:
    secretName: {{ .Values.adminToken.existingSecret | quote }}
    items:
      - key: {{ .Values.adminToken.key | quote }}
        path: token
    defaultMode: 0444
{{- end }}
{{- end -}}
