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

{{/* ---- The cluster KV store (kv-store.yaml; workers.yaml reads its address list). ---- */}}

{{- define "kvmesh.kvStore.name" -}}
{{- printf "%s-kv-store" (include "kvmesh.fullname" .) -}}
{{- end -}}

{{- define "kvmesh.kvStore.apiKeySecretName" -}}
{{- default (printf "%s-kv-store-api-key" (include "kvmesh.fullname" .)) .Values.kvStore.apiKey.existingSecret -}}
{{- end -}}

{{/* The workers' --kv-store list: every store pod's stable DNS name (StatefulSet +
     headless Service), in ordinal order. Rendezvous hashing homes each block on one of
     them, so the list is the same on every worker and does not follow readiness. */}}
{{- define "kvmesh.kvStore.addresses" -}}
{{- $name := include "kvmesh.kvStore.name" . -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.kvStore.replicas) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc.cluster.local:%d" $name $i $name $.Release.Namespace (int $.Values.kvStore.grpcPort)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{/* The model's KV shape as JSON: model.kvShape, or the shape of the tiny model the image
     ships (tools/make-tiny-model's defaults: 8 layers, 2 KV heads, head_dim 64, bf16
     weights, so bf16 KV) when model.path is that model and kvShape is not given; {} when
     unknown. */}}
{{- define "kvmesh.kvShape" -}}
{{- $s := .Values.model.kvShape -}}
{{- $given := list (int $s.numLayers) (int $s.numKeyValueHeads) (int $s.headDim) (int $s.kvCacheDtypeBytes) -}}
{{- if and (has 0 $given) (not (eq (without $given 0 | len) 0)) -}}
{{- fail (printf "model.kvShape is incomplete (%v): give numLayers, numKeyValueHeads, headDim and kvCacheDtypeBytes, or none" $s) -}}
{{- end -}}
{{- if not (has 0 $given) -}}
{{- toJson (dict "numLayers" (int $s.numLayers) "numKeyValueHeads" (int $s.numKeyValueHeads) "headDim" (int $s.headDim) "kvCacheDtypeBytes" (int $s.kvCacheDtypeBytes) "source" "model.kvShape") -}}
{{- else if eq .Values.model.path "/opt/kvmesh/models/tiny-llama" -}}
{{- toJson (dict "numLayers" 8 "numKeyValueHeads" 2 "headDim" 64 "kvCacheDtypeBytes" 2 "source" "the image's tiny model") -}}
{{- else -}}
{{- toJson (dict) -}}
{{- end -}}
{{- end -}}

{{/* The store's slot size (--block-bytes): kvStore.blockBytes, checked against the size
     derived from the KV shape, or the derived size itself: the largest block of the
     enabled worker groups (one TP rank's shard, every layer). Fails when neither is known
     or the given size is too small. */}}
{{- define "kvmesh.kvStore.blockBytes" -}}
{{- $shape := include "kvmesh.kvShape" . | fromJson -}}
{{- $derived := int64 0 -}}
{{- if $shape -}}
{{- range $group, $w := .Values.workers -}}
{{- if $w.enabled -}}
{{- range $arg := $w.extraArgs -}}
{{- if and (eq $shape.source "the image's tiny model") (regexMatch "^--kv[-_]cache[-_]dtype" $arg) -}}
{{- fail (printf "workers.%s.extraArgs sets %s: give model.kvShape (its kvCacheDtypeBytes) or kvStore.blockBytes so that the kv-store's slots fit the blocks" $group $arg) -}}
{{- end -}}
{{- end -}}
{{- $heads := max 1 (div (int64 $shape.numKeyValueHeads) (int64 $w.tensorParallelSize)) -}}
{{- $bytes := mul (int64 $shape.numLayers) 2 (int64 $shape.kvCacheDtypeBytes) $heads (int64 $.Values.model.blockSizeTokens) (int64 $shape.headDim) -}}
{{- $derived = max $derived $bytes -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $given := int64 .Values.kvStore.blockBytes -}}
{{- if and (eq $given 0) (eq $derived 0) -}}
{{- fail (printf "kvStore.enabled needs the slot size: the chart does not know the KV shape of model.path=%s; give model.kvShape (numLayers, numKeyValueHeads, headDim, kvCacheDtypeBytes) or kvStore.blockBytes = numLayers x 2 x kvCacheDtypeBytes x max(1, numKeyValueHeads / tensorParallelSize) x model.blockSizeTokens x headDim" .Values.model.path) -}}
{{- end -}}
{{- if and (gt $given 0) (gt $derived 0) (lt $given $derived) -}}
{{- fail (printf "kvStore.blockBytes=%d is smaller than the workers' blocks (%d bytes, from %s and model.blockSizeTokens=%d): the store would refuse every put" $given $derived $shape.source (int .Values.model.blockSizeTokens)) -}}
{{- end -}}
{{- if gt $given 0 -}}{{ $given }}{{- else -}}{{ $derived }}{{- end -}}
{{- end -}}
