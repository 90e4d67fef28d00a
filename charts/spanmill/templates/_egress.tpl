{{/*
Egress: what each component may reach (networkpolicy.yaml). Everything else is denied
by the release's default-deny policy.
*/}}

{{- /* The port of an address ("http://h:9000/x", "h:9092", "https://h"), as JSON {"port": N}. */ -}}
{{- define "spanmill.addressPort" -}}
{{- $rest := . -}}
{{- $port := 80 -}}
{{- if contains "://" $rest -}}
{{- $port = ternary 443 80 (hasPrefix "https://" $rest) -}}
{{- $rest = splitList "://" $rest | last -}}
{{- end -}}
{{- $authority := splitList "/" $rest | first -}}
{{- $parts := splitList ":" $authority -}}
{{- if gt (len $parts) 1 -}}
{{- $port = last $parts | int -}}
{{- end -}}
{{- toJson (dict "port" $port) -}}
{{- end -}}

{{- /* One rule to release pods of a component on named ports. */ -}}
{{- define "spanmill.egressToComponent" -}}
- to:
    - podSelector:
        matchLabels:
          {{- include "spanmill.selectorLabels" (dict "root" .root "component" .component) | nindent 10 }}
  ports:
    {{- range .ports }}
    - port: {{ . }}
    {{- end }}
{{- end -}}

{{- /* One rule to addresses outside the release: their ports, to the peers given (none: any address). */ -}}
{{- define "spanmill.egressToAddresses" -}}
{{- $ports := list -}}
{{- range .addresses -}}
{{- $ports = append $ports (include "spanmill.addressPort" (trim .) | fromJson).port -}}
{{- end -}}
- ports:
    {{- range $ports | uniq }}
    - port: {{ int . }}
      protocol: TCP
    {{- end }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- /*
The egress rules of a component: (dict "root" $ "needs" (list "dns" "kafka" ...)).
Needs: dns, kafka, objectStore, triton, mlflow, gateway, kubernetesApi, database, modelHub,
kfp.
*/ -}}
{{- define "spanmill.egress" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $to := $v.networkPolicy.egress -}}
egress:
{{- range .needs }}
{{- if eq . "dns" }}
  # Name lookups.
  - to:
      {{- toYaml $v.networkPolicy.dns | nindent 6 }}
    ports:
      - port: 53
        protocol: UDP
      - port: 53
        protocol: TCP
{{- else if eq . "kafka" }}
  {{- if $v.kafka.strimzi.enabled }}
  # The chart's Kafka brokers (Strimzi), plain and TLS listeners.
  - to:
      - podSelector:
          matchLabels:
            strimzi.io/cluster: {{ include "spanmill.fullname" $root }}
            strimzi.io/kind: Kafka
    ports:
      - port: 9092
      - port: 9093
  {{- else }}
  # The brokers of kafka.bootstrapServers.
  {{- include "spanmill.egressToAddresses" (dict "addresses" (splitList "," $v.kafka.bootstrapServers) "to" $to.kafka) | nindent 2 }}
  {{- end }}
{{- else if eq . "objectStore" }}
  # The object store (objectStore.endpoint; AWS S3 when empty).
  {{- include "spanmill.egressToAddresses" (dict "addresses" (list ($v.objectStore.endpoint | default "https://s3.amazonaws.com")) "to" $to.objectStore) | nindent 2 }}
{{- else if eq . "triton" }}
  {{- if $v.triton.enabled }}
  # Triton: inference and its repository API.
  {{- include "spanmill.egressToComponent" (dict "root" $root "component" "triton" "ports" (list "http" "grpc")) | nindent 2 }}
  {{- else }}
  # Triton outside the release (triton.external).
  {{- include "spanmill.egressToAddresses" (dict "addresses" (compact (list $v.triton.external.httpUrl $v.triton.external.grpcUrl)) "to" $to.triton) | nindent 2 }}
  {{- end }}
{{- else if eq . "mlflow" }}
  {{- if $v.mlflow.server.enabled }}
  # The release's MLflow.
  {{- include "spanmill.egressToComponent" (dict "root" $root "component" "mlflow" "ports" (list "http")) | nindent 2 }}
  {{- else }}
  # MLflow outside the release (mlflow.trackingUri).
  {{- include "spanmill.egressToAddresses" (dict "addresses" (list $v.mlflow.trackingUri) "to" $to.mlflow) | nindent 2 }}
  {{- end }}
{{- else if eq . "gateway" }}
  # The gateways' metrics, which judge a canary.
  {{- include "spanmill.egressToComponent" (dict "root" $root "component" "gateway" "ports" (list "http")) | nindent 2 }}
{{- else if eq . "kubernetesApi" }}
  # The Kubernetes API server (its Service's port and the servers' own).
  - ports:
      {{- range $v.networkPolicy.kubernetesApiPorts }}
      - port: {{ . }}
        protocol: TCP
      {{- end }}
    {{- with $to.kubernetesApi }}
    to:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- else if eq . "database" }}
  # MLflow's database (mlflow.server.backendStore).
  - ports:
      - port: {{ $v.networkPolicy.databasePort }}
        protocol: TCP
    {{- with $to.database }}
    to:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- else if eq . "modelHub" }}
  {{- with $v.networkPolicy.modelHubPorts }}
  # The model hub a base model named by its id is fetched from (pipelineSettings.baseModel,
  # a Hugging Face id by default): weights for Triton, tokenizers for the gateway.
  - ports:
      {{- range . }}
      - port: {{ . }}
        protocol: TCP
      {{- end }}
    {{- with $to.modelHub }}
    to:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  {{- end }}
{{- else if eq . "kfp" }}
  # The Kubeflow Pipelines API (pipelineUpload.endpoint), in Kubeflow's own namespace.
  {{- include "spanmill.egressToAddresses" (dict "addresses" (list $v.pipelineUpload.endpoint) "to" $to.kubeflowPipelines) | nindent 2 }}
{{- else }}
{{- fail (printf "spanmill.egress: unknown need %s" .) }}
{{- end }}
{{- end }}
{{- end -}}
