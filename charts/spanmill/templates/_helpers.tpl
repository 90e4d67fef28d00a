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
{{- /* "true" when the chart's Strimzi cluster asks SCRAM credentials of every client. */ -}}
{{- define "spanmill.kafkaScram" -}}
{{- if and .Values.kafka.strimzi.enabled (eq .Values.kafka.strimzi.authentication.type "scram") -}}true{{- end -}}
{{- end -}}

{{- /* The clients' security protocol: kafka.securityProtocol, with SASL on top of it when
the chart's Strimzi cluster asks SCRAM credentials. */ -}}
{{- define "spanmill.kafkaProtocol" -}}
{{- if include "spanmill.kafkaScram" . -}}
{{- ternary "SASL_SSL" "SASL_PLAINTEXT" (eq .Values.kafka.securityProtocol "SSL") -}}
{{- else -}}
{{- .Values.kafka.securityProtocol -}}
{{- end -}}
{{- end -}}

{{- /* The KafkaUser (and Secret) name of one writer: dict "root" . "user" "gateway". The
pipeline's is fixed, like its ConfigMap, because the compiled pipeline names its Secret. */ -}}
{{- define "spanmill.kafkaUser" -}}
{{- if eq .user "pipeline" -}}
spanmill-pipeline-kafka
{{- else -}}
{{- printf "%s-%s" (include "spanmill.fullname" .root) .user | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "spanmill.kafkaBootstrap" -}}
{{- if .Values.kafka.strimzi.enabled -}}
{{- /* Strimzi's plain listener is 9092, its TLS listener 9093. */ -}}
{{- $port := ternary 9092 9093 (has (include "spanmill.kafkaProtocol" .) (list "PLAINTEXT" "SASL_PLAINTEXT")) -}}
{{- printf "%s-kafka-bootstrap.%s.svc:%d" (include "spanmill.fullname" .) .Release.Namespace $port -}}
{{- else -}}
{{- .Values.kafka.bootstrapServers -}}
{{- end -}}
{{- end -}}

{{- /* dict "root" . "user" "gateway": the user names the writer's KafkaUser. */ -}}
{{- define "spanmill.kafkaEnv" -}}
{{- $root := .root -}}
{{- $k := $root.Values.kafka -}}
- name: SPANMILL_KAFKA_BOOTSTRAP_SERVERS
  value: {{ include "spanmill.kafkaBootstrap" $root | quote }}
- name: SPANMILL_KAFKA_SECURITY_PROTOCOL
  value: {{ include "spanmill.kafkaProtocol" $root | quote }}
- name: SPANMILL_KAFKA_SPANS_TOPIC
  value: {{ $k.topics.spans | quote }}
- name: SPANMILL_KAFKA_DLQ_TOPIC
  value: {{ $k.topics.deadLetter | quote }}
- name: SPANMILL_KAFKA_ROLLOUTS_TOPIC
  value: {{ $k.topics.rollouts | quote }}
- name: SPANMILL_KAFKA_MAX_MESSAGE_BYTES
  value: {{ $k.maxMessageBytes | int64 | quote }}
{{- if include "spanmill.kafkaScram" $root }}
{{- $user := include "spanmill.kafkaUser" . }}
- name: SPANMILL_KAFKA_SASL_MECHANISM
  value: SCRAM-SHA-512
- name: SPANMILL_KAFKA_SASL_USERNAME
  value: {{ $user | quote }}
- name: SPANMILL_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      # Made and kept by Strimzi's User Operator for the KafkaUser of the same name.
      name: {{ $user }}
      key: password
{{- else if $k.sasl.mechanism }}
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

{{/*
The MLflow user a spanmill client signs in as: MLflow's own client variables, from
the Secret named (keys username, password). Optional, so that a server without
authentication needs no Secret. (dict "root" $ "secret" "<name>")
*/}}
{{- define "spanmill.mlflowCredentialsEnv" -}}
{{- with .secret }}
- name: MLFLOW_TRACKING_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: username
      optional: true
- name: MLFLOW_TRACKING_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: password
      optional: true
{{- end }}
{{- end -}}

{{/* ---- Triton: TritonSettings, env prefix SPANMILL_TRITON_ ---- */}}
{{/*
The Triton image. Unless triton.image.repository names one, it follows the flavour:
spanmill's own (services/triton/Dockerfile: tritonserver with spanmill.serving) for
python, NVIDIA's vLLM image for vllm. A sha256: tag is pinned as a digest.
*/}}
{{- define "spanmill.tritonImage" -}}
{{- $i := .Values.triton.image -}}
{{- $repository := $i.repository -}}
{{- $tag := $i.tag -}}
{{- if not $repository -}}
{{- if eq .Values.triton.flavour "vllm" -}}
{{- $repository = "nvcr.io/nvidia/tritonserver" -}}
{{- $tag = $tag | default "25.01-vllm-python-py3" -}}
{{- else -}}
{{- $repository = printf "%s/triton" (trimSuffix "/" .Values.image.registry) -}}
{{- $tag = $tag | default .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}
{{- end -}}
{{- $tag = required "triton.image.tag is required when triton.image.repository is set" $tag -}}
{{- printf "%s%s%s" $repository (ternary "@" ":" (hasPrefix "sha256:" $tag)) $tag -}}
{{- end -}}

{{- define "spanmill.tritonHost" -}}
{{- printf "%s.%s.svc" (include "spanmill.componentName" (dict "root" . "component" "triton")) .Release.Namespace -}}
{{- end -}}

{{/* The headless Service listing every Triton pod, ready or not (spanmill.rollout.fleet). */}}
{{- define "spanmill.tritonPodsService" -}}
{{- include "spanmill.componentName" (dict "root" . "component" "triton-pods") -}}
{{- end -}}

{{/* Triton's HTTP and gRPC endpoints: the release's Service, or triton.external's. */}}
{{- define "spanmill.tritonHttpUrl" -}}
{{- if .Values.triton.enabled -}}
{{- printf "%s:8000" (include "spanmill.tritonHost" .) -}}
{{- else -}}
{{- required "triton.external.httpUrl is required when triton.enabled is false" .Values.triton.external.httpUrl -}}
{{- end -}}
{{- end -}}

{{- define "spanmill.tritonGrpcUrl" -}}
{{- if .Values.triton.enabled -}}
{{- printf "%s:8001" (include "spanmill.tritonHost" .) -}}
{{- else -}}
{{- required "triton.external.grpcUrl is required when triton.enabled is false" .Values.triton.external.grpcUrl -}}
{{- end -}}
{{- end -}}

{{/* The model repository as spanmill (fsspec) names it. */}}
{{- define "spanmill.modelRepository" -}}
{{- if eq .Values.triton.modelRepository.type "s3" -}}
{{- printf "s3://%s/%s" .Values.objectStore.bucket (trimAll "/" .Values.triton.modelRepository.s3Prefix) -}}
{{- else -}}
{{- .Values.triton.modelRepository.pvc.mountPath -}}
{{- end -}}
{{- end -}}

{{/*
The model repository as tritonserver names it: a custom S3 endpoint goes between
s3:// and the bucket, with the scheme kept only for https and its port always named.
*/}}
{{- define "spanmill.tritonModelRepository" -}}
{{- $r := .Values.triton.modelRepository -}}
{{- if eq $r.type "s3" -}}
{{- $endpoint := .Values.objectStore.endpoint -}}
{{- if $endpoint -}}
{{- /* tritonserver reads s3://[https://]host:port/bucket/path: the port is not optional. */ -}}
{{- $https := hasPrefix "https://" $endpoint -}}
{{- $authority := trimPrefix "https://" (trimPrefix "http://" $endpoint) | splitList "/" | first -}}
{{- if not (contains ":" $authority) -}}
{{- $authority = printf "%s:%d" $authority (ternary 443 80 $https) -}}
{{- end -}}
{{- printf "s3://%s%s/%s/%s" (ternary "https://" "" $https) $authority .Values.objectStore.bucket (trimAll "/" $r.s3Prefix) -}}
{{- else -}}
{{- include "spanmill.modelRepository" . -}}
{{- end -}}
{{- else -}}
{{- .Values.triton.modelRepository.pvc.mountPath -}}
{{- end -}}
{{- end -}}

{{- define "spanmill.modelRepositoryClaim" -}}
{{- .Values.triton.modelRepository.pvc.existingClaim | default (include "spanmill.componentName" (dict "root" . "component" "models")) -}}
{{- end -}}

{{- define "spanmill.tritonEnv" -}}
- name: SPANMILL_TRITON_HTTP_URL
  value: {{ include "spanmill.tritonHttpUrl" . | quote }}
- name: SPANMILL_TRITON_GRPC_URL
  value: {{ include "spanmill.tritonGrpcUrl" . | quote }}
- name: SPANMILL_TRITON_MODEL_REPOSITORY
  value: {{ include "spanmill.modelRepository" . | quote }}
{{- end -}}

{{/*
Settings shared by everything that writes and loads model versions (the rollout
controller and the pipeline's evaluation): TritonSettings (the
repository, and every Triton pod through the headless Service's EndpointSlices when
Triton runs in the release) and ServingSettings. A dict of environment variable to value; the Deployment renders it
as env, the pipeline ConfigMap as data. Base weights always go into each version
folder: no pod sees another pod's files.
*/}}
{{- define "spanmill.servingSettings" -}}
{{- $settings := dict
  "SPANMILL_TRITON_HTTP_URL" (include "spanmill.tritonHttpUrl" .)
  "SPANMILL_TRITON_MODEL_REPOSITORY" (include "spanmill.modelRepository" .)
  "SPANMILL_TRITON_REPOSITORY_OPTIONS" (ternary (include "spanmill.storageOptions" .) "{}" (eq .Values.triton.modelRepository.type "s3"))
  "SPANMILL_TRITON_SERVER_REPOSITORY" (include "spanmill.tritonModelRepository" .)
  "SPANMILL_TRITON_DISCOVERY" (ternary "endpointslices" "none" .Values.triton.enabled)
  "SPANMILL_TRITON_PODS_SERVICE" (include "spanmill.tritonPodsService" .)
  "SPANMILL_TRITON_NAMESPACE" .Release.Namespace
  "SPANMILL_SERVING_FLAVOUR" .Values.triton.flavour
  "SPANMILL_SERVING_DTYPE" .Values.rollout.dtype
  "SPANMILL_SERVING_GPU" (gt (int .Values.triton.gpu.count) 0 | toString)
  "SPANMILL_SERVING_COPY_BASE" "true"
  "SPANMILL_SERVING_VLLM_GPU_MEMORY_UTILIZATION" (.Values.triton.vllm.gpuMemoryUtilization | toString)
  "SPANMILL_SERVING_VLLM_MAX_MODEL_LEN" (int .Values.triton.vllm.maxModelLen | toString)
  "SPANMILL_SERVING_VLLM_MAX_LORA_RANK" (int .Values.triton.vllm.maxLoraRank | toString)
  "SPANMILL_SERVING_VLLM_TENSOR_PARALLEL_SIZE" (max 1 (int .Values.triton.gpu.count) | toString)
-}}
{{- toJson $settings -}}
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
{{- if and .Values.triton.evaluation.enabled (not .Values.triton.enabled) -}}
{{- fail "triton.evaluation.enabled needs triton.enabled: the evaluation's Triton is run beside the release's" -}}
{{- end -}}
{{- if and .Values.triton.enabled (eq .Values.triton.flavour "vllm") (not .Values.triton.evaluation.enabled) -}}
{{- fail "triton.flavour vllm needs triton.evaluation.enabled: an evaluation stages its candidates in a vLLM engine of their own, and a serving pod's GPU memory is its serving engine's" -}}
{{- end -}}
{{- if and (eq .Values.triton.flavour "vllm") (eq (int .Values.triton.gpu.count) 0) -}}
{{- fail "triton.flavour vllm needs triton.gpu.count of at least 1" -}}
{{- end -}}
{{- if and (eq .Values.triton.flavour "vllm") (ne .Values.triton.modelRepository.type "pvc") -}}
{{- fail "triton.flavour vllm needs triton.modelRepository.type pvc: the vLLM backend opens LoRA adapters from local paths, which an s3 repository does not give it" -}}
{{- end -}}
{{- $runs := .Values.pipelineSettings.namespace | default .Release.Namespace -}}
{{- if and .Values.pipelineSettings.enabled (eq .Values.triton.modelRepository.type "pvc") (ne $runs .Release.Namespace) (not .Values.triton.modelRepository.pvc.existingClaim) -}}
{{- fail (printf "triton.modelRepository.type pvc: the pipeline's evaluation steps mount the repository's claim to stage their candidates, and pipeline runs in namespace %s cannot mount a claim of namespace %s; run them in the release's namespace (pipelineSettings.namespace empty: a Kubeflow profile's), or name an existingClaim that exists in both (two claims of one ReadWriteMany volume)" $runs .Release.Namespace) -}}
{{- end -}}
{{- if and (hasPrefix "SASL" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.mechanism) -}}
{{- fail (printf "kafka.sasl.mechanism is required with kafka.securityProtocol %s" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- if and .Values.kafka.sasl.mechanism (not .Values.kafka.sasl.existingSecret) -}}
{{- fail "kafka.sasl.existingSecret is required when kafka.sasl.mechanism is set" -}}
{{- end -}}
{{- if and .Values.rollout.enabled (eq .Values.rollout.signals "gateway") (not .Values.gateway.enabled) -}}
{{- fail "rollout.signals gateway reads the release's gateway pods' metrics: enable gateway, or use rollout.signals spans" -}}
{{- end -}}
{{- if and .Values.kafka.strimzi.enabled (hasPrefix "SASL" .Values.kafka.securityProtocol) -}}
{{- fail "kafka.securityProtocol SASL_* needs external brokers: with the chart's Strimzi cluster (kafka.strimzi.enabled) choose PLAINTEXT (9092) or SSL (9093), and kafka.strimzi.authentication.type scram adds SASL to it" -}}
{{- end -}}
{{- if and (include "spanmill.kafkaScram" .) .Values.kafka.sasl.mechanism -}}
{{- fail "kafka.sasl is for external brokers: with kafka.strimzi.authentication.type scram each component has its own KafkaUser, made by the chart" -}}
{{- end -}}
{{- $election := .Values.rollout.leaderElection -}}
{{- if and .Values.rollout.enabled (ge (float64 $election.renewDeadlineSeconds) (float64 $election.leaseDurationSeconds)) -}}
{{- fail (printf "rollout.leaderElection.renewDeadlineSeconds (%v) must be below rollout.leaderElection.leaseDurationSeconds (%v): a leader stops acting before a standby may take the Lease" $election.renewDeadlineSeconds $election.leaseDurationSeconds) -}}
{{- end -}}
{{- if and .Values.rollout.enabled (ge (float64 $election.retryPeriodSeconds) (float64 $election.renewDeadlineSeconds)) -}}
{{- fail (printf "rollout.leaderElection.retryPeriodSeconds (%v) must be below rollout.leaderElection.renewDeadlineSeconds (%v): a leader tries to renew at least once before it stops" $election.retryPeriodSeconds $election.renewDeadlineSeconds) -}}
{{- end -}}
{{- if and (eq .Values.triton.modelRepository.type "pvc") .Values.rollout.enabled (not .Values.triton.enabled) (not .Values.triton.modelRepository.pvc.existingClaim) -}}
{{- fail "triton.modelRepository.pvc.existingClaim is required when Triton runs outside the release" -}}
{{- end -}}
{{- $mlflow := .Values.mlflow.server -}}
{{- if and $mlflow.enabled $mlflow.ingress.enabled (not $mlflow.auth.enabled) -}}
{{- fail "mlflow.server.ingress.enabled exposes MLflow outside the cluster: it needs mlflow.server.auth.enabled" -}}
{{- end -}}
{{- if and $mlflow.enabled $mlflow.ingress.enabled .Values.networkPolicy.enabled (not .Values.networkPolicy.mlflowClients) -}}
{{- fail "mlflow.server.ingress.enabled with networkPolicy.enabled: list the ingress controller's pods in networkPolicy.mlflowClients, or the Ingress cannot reach MLflow" -}}
{{- end -}}
{{- if and $mlflow.enabled $mlflow.auth.enabled .Values.rollout.enabled (not .Values.mlflow.auth.controllerSecret) -}}
{{- fail "mlflow.server.auth.enabled refuses anonymous requests: the rollout controller needs mlflow.auth.controllerSecret" -}}
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
