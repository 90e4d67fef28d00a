{{/*
Names: <fullname>-<component> for everything, so a reader can predict each name.
*/}}
{{- define "spanmill.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spanmill.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* (dict "root" $ "component" "gateway") */}}
{{- define "spanmill.componentName" -}}
{{- printf "%s-%s" (include "spanmill.fullname" .root) .component -}}
{{- end -}}

{{/* Named like the controller's own default (SPANMILL_ROLLOUT_CONFIGMAP). */}}
{{- define "spanmill.routingConfigMap" -}}
{{- printf "%s-routing" (include "spanmill.fullname" .) -}}
{{- end -}}

{{- define "spanmill.storeUrl" -}}
{{- .Values.collector.storeUrl | default (printf "s3://%s/spans" .Values.objectStore.bucket) -}}
{{- end -}}

{{- define "spanmill.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spanmill.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "spanmill.labels" -}}
{{ include "spanmill.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: spanmill
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* A spanmill image: (dict "root" $ "repository" "gateway" "tag" "") */}}
{{- define "spanmill.image" -}}
{{- $tag := .tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.image.registry) .repository $tag -}}
{{- end -}}

{{- define "spanmill.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
Pod and container security: the same for every pod, not configurable away.
*/}}
{{- define "spanmill.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.podSecurity.runAsUser }}
  runAsGroup: {{ .Values.podSecurity.runAsGroup }}
  fsGroup: {{ .Values.podSecurity.fsGroup }}
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "spanmill.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: [ALL]
{{- end -}}

{{/* Writable scratch space; the root filesystem is read-only. */}}
{{- define "spanmill.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end -}}

{{- define "spanmill.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Settings every spanmill process reads outside its settings model (spanmill.paths). */}}
{{- define "spanmill.processEnv" -}}
- name: HOME
  value: /tmp
- name: SPANMILL_HOME
  value: /tmp/spanmill
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/* ---- Kafka: KafkaSettings, env prefix SPANMILL_KAFKA_ ---- */}}
{{- define "spanmill.kafkaBootstrap" -}}
{{- if .Values.kafka.strimzi.enabled -}}
{{- /* Strimzi's plain listener is 9092, its TLS listener 9093. */ -}}
{{- $port := ternary 9092 9093 (has .Values.kafka.securityProtocol (list "PLAINTEXT" "SASL_PLAINTEXT")) -}}
{{- printf "%s-kafka-bootstrap.%s.svc:%d" (include "spanmill.fullname" .) .Release.Namespace $port -}}
{{- else -}}
{{- .Values.kafka.bootstrapServers -}}
{{- end -}}
{{- end -}}

{{- define "spanmill.kafkaEnv" -}}
{{- $k := .Values.kafka -}}
- name: SPANMILL_KAFKA_BOOTSTRAP_SERVERS
  value: {{ include "spanmill.kafkaBootstrap" . | quote }}
- name: SPANMILL_KAFKA_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
- name: SPANMILL_KAFKA_SPANS_TOPIC
  value: {{ $k.topics.spans | quote }}
- name: SPANMILL_KAFKA_DLQ_TOPIC
  value: {{ $k.topics.deadLetter | quote }}
- name: SPANMILL_KAFKA_MAX_MESSAGE_BYTES
  value: {{ $k.maxMessageBytes | int64 | quote }}
{{- if $k.sasl.mechanism }}
- name: SPANMILL_KAFKA_SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: SPANMILL_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.sasl.existingSecret is required when kafka.sasl.mechanism is set" $k.sasl.existingSecret }}
      key: {{ $k.sasl.usernameKey }}
- name: SPANMILL_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $k.sasl.existingSecret }}
      key: {{ $k.sasl.passwordKey }}
{{- end }}
{{- if $k.tls.caSecret }}
- name: SPANMILL_KAFKA_SSL_CAFILE
  value: /etc/spanmill/kafka-ca/{{ $k.tls.caKey }}
{{- end }}
{{- end -}}

{{- define "spanmill.kafkaCaVolume" -}}
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret }}
    items:
      - key: {{ .Values.kafka.tls.caKey }}
        path: {{ .Values.kafka.tls.caKey }}
{{- end }}
{{- end -}}

{{- define "spanmill.kafkaCaMount" -}}
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/spanmill/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* ---- Object store: credentials for s3fs, boto3 and Triton's S3 client ---- */}}
{{- define "spanmill.s3Env" -}}
{{- $s := .Values.objectStore -}}
{{- if $s.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ $s.existingSecret }}
      key: {{ $s.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $s.existingSecret }}
      key: {{ $s.secretAccessKeyKey }}
{{- end }}
- name: AWS_DEFAULT_REGION
  value: {{ $s.region | quote }}
{{- if $s.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ $s.endpoint | quote }}
{{- end }}
{{- end -}}

{{/* fsspec storage options of the span store, as SPANMILL_COLLECTOR_STORAGE_OPTIONS wants them. */}}
{{- define "spanmill.storageOptions" -}}
{{- $options := dict -}}
{{- if .Values.objectStore.endpoint -}}
{{- $_ := set $options "endpoint_url" .Values.objectStore.endpoint -}}
{{- end -}}
{{- $_ := set $options "client_kwargs" (dict "region_name" .Values.objectStore.region) -}}
{{- toJson $options -}}
{{- end -}}

{{/* ---- MLflow: MLflowSettings, env prefix SPANMILL_MLFLOW_ ---- */}}
{{- define "spanmill.mlflowUri" -}}
{{- if .Values.mlflow.server.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "spanmill.componentName" (dict "root" . "component" "mlflow")) .Release.Namespace (int .Values.mlflow.server.port) -}}
{{- else -}}
{{- required "mlflow.trackingUri is required when mlflow.server.enabled is false" .Values.mlflow.trackingUri -}}
{{- end -}}
{{- end -}}

{{/* ---- Triton: TritonSettings, env prefix SPANMILL_TRITON_ ---- */}}
{{- define "spanmill.tritonHost" -}}
{{- printf "%s.%s.svc" (include "spanmill.componentName" (dict "root" . "component" "triton")) .Release.Namespace -}}
{{- end -}}

{{/* The model repository as spanmill (fsspec) names it. */}}
{{- define "spanmill.modelRepository" -}}
{{- if eq .Values.triton.modelRepository.type "s3" -}}
{{- printf "s3://%s/%s" .Values.objectStore.bucket (trimAll "/" .Values.triton.modelRepository.s3Prefix) -}}
{{- else -}}
/models
{{- end -}}
{{- end -}}

{{/*
The model repository as tritonserver names it: a custom S3 endpoint goes between
s3:// and the bucket, with the scheme kept only for https.
*/}}
{{- define "spanmill.tritonModelRepository" -}}
{{- $r := .Values.triton.modelRepository -}}
{{- if eq $r.type "s3" -}}
{{- $endpoint := .Values.objectStore.endpoint -}}
{{- if $endpoint -}}
{{- $host := trimPrefix "http://" $endpoint | trimSuffix "/" -}}
{{- printf "s3://%s/%s/%s" $host .Values.objectStore.bucket (trimAll "/" $r.s3Prefix) -}}
{{- else -}}
{{- include "spanmill.modelRepository" . -}}
{{- end -}}
{{- else -}}
/models
{{- end -}}
{{- end -}}

{{- define "spanmill.modelRepositoryClaim" -}}
{{- .Values.triton.modelRepository.pvc.existingClaim | default (include "spanmill.componentName" (dict "root" . "component" "models")) -}}
{{- end -}}

{{- define "spanmill.tritonEnv" -}}
- name: SPANMILL_TRITON_HTTP_URL
  value: {{ printf "%s:8000" (include "spanmill.tritonHost" .) | quote }}
- name: SPANMILL_TRITON_GRPC_URL
  value: {{ printf "%s:8001" (include "spanmill.tritonHost" .) | quote }}
- name: SPANMILL_TRITON_MODEL_REPOSITORY
  value: {{ include "spanmill.modelRepository" . | quote }}
{{- end -}}

{{/* Checks across values that a JSON schema cannot express. */}}
{{- define "spanmill.validate" -}}
{{- $partitions := int .Values.kafka.topics.partitions -}}
{{- if and .Values.collector.enabled .Values.collector.autoscaling.enabled (gt (int .Values.collector.autoscaling.maxReplicas) $partitions) -}}
{{- fail (printf "collector.autoscaling.maxReplicas (%d) exceeds kafka.topics.partitions (%d): extra collectors would own no partition" (int .Values.collector.autoscaling.maxReplicas) $partitions) -}}
{{- end -}}
{{- if and .Values.collector.enabled (not .Values.collector.autoscaling.enabled) (gt (int .Values.collector.replicas) $partitions) -}}
{{- fail (printf "collector.replicas (%d) exceeds kafka.topics.partitions (%d): extra collectors would own no partition" (int .Values.collector.replicas) $partitions) -}}
{{- end -}}
{{- if and .Values.collector.autoscaling.enabled (gt (int .Values.collector.autoscaling.minReplicas) (int .Values.collector.autoscaling.maxReplicas)) -}}
{{- fail "collector.autoscaling.minReplicas exceeds collector.autoscaling.maxReplicas" -}}
{{- end -}}
{{- if and .Values.gateway.autoscaling.enabled (gt (int .Values.gateway.autoscaling.minReplicas) (int .Values.gateway.autoscaling.maxReplicas)) -}}
{{- fail "gateway.autoscaling.minReplicas exceeds gateway.autoscaling.maxReplicas" -}}
{{- end -}}
{{- if and (eq .Values.triton.flavour "vllm") (eq (int .Values.triton.gpu.count) 0) -}}
{{- fail "triton.flavour vllm needs triton.gpu.count of at least 1" -}}
{{- end -}}
{{- if and (hasPrefix "SASL" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.mechanism) -}}
{{- fail (printf "kafka.sasl.mechanism is required with kafka.securityProtocol %s" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- if and .Values.kafka.sasl.mechanism (not .Values.kafka.sasl.existingSecret) -}}
{{- fail "kafka.sasl.existingSecret is required when kafka.sasl.mechanism is set" -}}
{{- end -}}
{{- if and .Values.rollout.enabled (eq .Values.rollout.signals "gateway") (or .Values.gateway.autoscaling.enabled (gt (int .Values.gateway.replicas) 1)) -}}
{{- fail "rollout.signals gateway reads the counters of one gateway replica; with gateway.autoscaling.enabled or gateway.replicas above 1 use rollout.signals spans" -}}
{{- end -}}
{{- if and .Values.kafka.strimzi.enabled (hasPrefix "SASL" .Values.kafka.securityProtocol) -}}
{{- fail "kafka.securityProtocol SASL_* needs external brokers: the chart's Strimzi cluster (kafka.strimzi.enabled) listens with PLAINTEXT (9092) and SSL (9093)" -}}
{{- end -}}
{{- if and (eq .Values.triton.modelRepository.type "pvc") .Values.rollout.enabled (not .Values.triton.enabled) (not .Values.triton.modelRepository.pvc.existingClaim) -}}
{{- fail "triton.modelRepository.pvc.existingClaim is required when Triton runs outside the release" -}}
{{- end -}}
{{- end -}}

{{/* A component's ServiceAccount; tokens are mounted by the pods that need one. */}}
{{- define "spanmill.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "spanmill.componentName" . }}
  labels:
    {{- include "spanmill.labels" . | nindent 4 }}
  {{- with .root.Values.serviceAccountAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: false
{{- end -}}
