{{/* Names, labels and the pieces every pod shares. */}}
{{- define "kvmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvmesh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kvmesh.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kvmesh.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvmesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kvmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvmesh
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "router") */}}
{{- define "kvmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvmesh.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvmesh.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kvmesh.schedulerAddress" -}}
{{- printf "%s-scheduler.%s.svc.cluster.local:%d" (include "kvmesh.fullname" .) .Release.Namespace (int .Values.scheduler.port) -}}
{{- end -}}

{{- define "kvmesh.terminationGracePeriodSeconds" -}}
{{- add .Values.drain.preStopSleepSeconds .Values.drain.timeoutSeconds .Values.drain.marginSeconds -}}
{{- end -}}

{{- define "kvmesh.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "kvmesh.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{- define "kvmesh.apiKeysSecretName" -}}
{{- default (printf "%s-api-keys" (include "kvmesh.fullname" .)) .Values.apiKeys.existingSecret -}}
{{- end -}}

{{/* Environment every kvmesh container gets: the model settings and, with TLS, where the
     certificates are. */}}
{{- define "kvmesh.commonEnv" -}}
- name: KVMESH_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.tls.enabled }}
- name: KVMESH_TLS_CERT_FILE
  value: {{ printf "%s/tls.crt" .Values.tls.mountPath | quote }}
- name: KVMESH_TLS_KEY_FILE
  value: {{ printf "%s/tls.key" .Values.tls.mountPath | quote }}
- name: KVMESH_TLS_CA_FILE
  value: {{ printf "%s/ca.crt" .Values.tls.mountPath | quote }}
{{- end }}
{{- end -}}

{{- define "kvmesh.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- if .Values.model.volume }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "kvmesh.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "kvmesh.tlsSecretName" . }}
    defaultMode: 0440
{{- end }}
{{- if .Values.model.volume }}
- name: model
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "kvmesh.preStop" -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ .Values.drain.preStopSleepSeconds }}
{{- end -}}

{{- define "kvmesh.podSecurity" -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The series labels the dashboard and rules select on (deploy/grafana/generate-dashboard). */}}
{{- define "kvmesh.monitorRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  targetLabel: kvmesh_component
- sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: pod
{{- end -}}
