"""What every flywheel step's pod gets from the cluster: one ConfigMap and a few Secrets.

The Helm chart writes the ConfigMap :data:`CONFIGMAP` in the namespace pipeline
runs execute in, one key per setting, each key the name of the environment
variable it becomes (:data:`SETTINGS`). The compiled pipeline mounts it into
every step, and the Secrets in :data:`SECRETS` beside it, so a run started from
the Kubeflow UI needs only the agent's name: a step reads a connection from its
run parameter when a person set one, from this environment otherwise
(:mod:`spanmill.pipeline.steps`).

Declared here once: ``pipelines/flywheel.py`` compiles these names in, and the
chart's tests check that the ConfigMap it renders has exactly these keys.
"""

from __future__ import annotations

from collections.abc import Mapping

CONFIGMAP = "spanmill-pipeline"

# Keys of the ConfigMap; each becomes the environment variable of the same name.
SETTINGS: tuple[str, ...] = (
    # The span store the dataset is built from (CollectorSettings).
    "SPANMILL_COLLECTOR_STORE_URL",
    "SPANMILL_COLLECTOR_STORAGE_OPTIONS",
    # The base model training starts from when the run names none (TrainSettings): a
    # Hugging Face id or an object store folder, the same in every pod.
    "SPANMILL_TRAIN_BASE_MODEL",
    # Where the training step copies its checkpoints, for a retry on a new pod to resume
    # from (TrainSettings.checkpoint_store; empty: none).
    "SPANMILL_TRAIN_CHECKPOINT_STORE",
    # The registry (MLflowSettings); the credentials come from a Secret.
    "SPANMILL_MLFLOW_TRACKING_URI",
    # Triton and its model repository (TritonSettings).
    "SPANMILL_TRITON_HTTP_URL",
    "SPANMILL_TRITON_MODEL_REPOSITORY",
    "SPANMILL_TRITON_REPOSITORY_OPTIONS",
    "SPANMILL_TRITON_SERVER_REPOSITORY",
    # Every Triton pod, to see whether the champion serves on all of them, and to stage
    # a candidate on one of them; or the evaluation's own Triton, where the chart runs
    # one (EvalSettings.candidates_url; empty: none).
    "SPANMILL_TRITON_DISCOVERY",
    "SPANMILL_TRITON_PODS_SERVICE",
    "SPANMILL_TRITON_NAMESPACE",
    "SPANMILL_EVAL_CANDIDATES_URL",
    # How versions are written, the same as the rollout controller (ServingSettings).
    "SPANMILL_SERVING_FLAVOUR",
    "SPANMILL_SERVING_DTYPE",
    "SPANMILL_SERVING_COPY_BASE",
    "SPANMILL_SERVING_GPU",
    "SPANMILL_SERVING_VLLM_GPU_MEMORY_UTILIZATION",
    "SPANMILL_SERVING_VLLM_MAX_MODEL_LEN",
    "SPANMILL_SERVING_VLLM_MAX_LORA_RANK",
    "SPANMILL_SERVING_VLLM_TENSOR_PARALLEL_SIZE",
    # The gate's policy beside the run's margin and metric (EvalSettings.gate): how many
    # items, a significant difference, how far other rates may fall. Without these keys
    # a cluster's runs gated on the defaults, whatever the team had chosen.
    "SPANMILL_EVAL_GATE__MIN_ITEMS",
    "SPANMILL_EVAL_GATE__REQUIRE_SIGNIFICANT",
    "SPANMILL_EVAL_GATE__REGRESSION_TOLERANCE",
    "SPANMILL_EVAL_GATE__FORMAT_TOLERANCE",
    # Kafka, for RL training: its rollouts go to the rollout topic and are read back.
    "SPANMILL_KAFKA_BOOTSTRAP_SERVERS",
    "SPANMILL_KAFKA_SECURITY_PROTOCOL",
    "SPANMILL_KAFKA_ROLLOUTS_TOPIC",
    # The pipeline's own Kafka principal where the brokers ask SASL credentials (the
    # chart's KafkaUser, or pipelineSettings.kafkaUsername; empty otherwise); its
    # password comes from KAFKA_SECRET.
    "SPANMILL_KAFKA_SASL_MECHANISM",
    "SPANMILL_KAFKA_SASL_USERNAME",
    # The brokers' CA, where they are trusted by one of their own (empty otherwise): the
    # file KAFKA_CA_SECRET is mounted as.
    "SPANMILL_KAFKA_SSL_CAFILE",
    # The object store, for every other reader and writer of s3:// (base models).
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
)

# Secret -> (key -> environment variable). Optional: a cluster whose pods reach the
# object store by their own identity (IRSA, workload identity) creates no S3 Secret.
MLFLOW_SECRET = "spanmill-mlflow"
S3_SECRET = "spanmill-s3"
JUDGE_SECRET = "spanmill-judge"
# Strimzi's User Operator keeps the pipeline KafkaUser's password in a Secret of its name.
KAFKA_SECRET = "spanmill-pipeline-kafka"
# The brokers' CA certificate (key ca.crt), mounted in every step where it exists: the
# operator copies it where runs execute (charts/spanmill/README.md).
KAFKA_CA_SECRET = "spanmill-pipeline-kafka-ca"
KAFKA_CA_FOLDER = "/etc/spanmill/kafka-ca"
KAFKA_CA_KEY = "ca.crt"
SECRETS: dict[str, dict[str, str]] = {
    MLFLOW_SECRET: {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"},
    KAFKA_SECRET: {"password": "SPANMILL_KAFKA_SASL_PASSWORD"},
    S3_SECRET: {
        "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
    },
}
# The LLM judge's endpoint key, for the evaluate step only.
JUDGE_SECRETS: dict[str, dict[str, str]] = {
    JUDGE_SECRET: {"api-key": "SPANMILL_EVAL_JUDGE_API_KEY"}
}

# The hand-over of training to the Kubeflow Trainer (run parameter trainer=trainjob,
# spanmill.train.trainjob), for the training step only: the chart writes this ConfigMap
# beside the other when trainer.enabled; every key is optional (TrainJobSettings).
TRAINJOB_CONFIGMAP = "spanmill-trainjob"
TRAINJOB_SETTINGS: tuple[str, ...] = (
    "SPANMILL_TRAINJOB_RUNTIME",
    "SPANMILL_TRAINJOB_IMAGE",
    "SPANMILL_TRAINJOB_STAGING_URL",
    "SPANMILL_TRAINJOB_CPU_PER_NODE",
    "SPANMILL_TRAINJOB_MEMORY_PER_NODE",
    "SPANMILL_TRAINJOB_DEADLINE_S",
    "SPANMILL_TRAINJOB_WAIT_S",
)


class ClusterSettingsError(ValueError):
    """A ConfigMap or Secret does not hold what the pipeline's steps need."""


def step_environment(
    platform: Mapping[str, object],
    configmaps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """The environment a step's pod gets from a compiled step's Kubernetes platform spec.

    ``platform`` is one executor's entry under ``platforms.kubernetes.deploymentSpec``
    of the compiled package; ``configmaps`` and ``secrets`` are the objects' ``data``
    (Secrets already decoded) by name. As the kubelet does: a required ConfigMap or
    key that is missing is an error; an optional Secret that is missing adds nothing.
    """
    env: dict[str, str] = {}
    sources = (("ConfigMap", "configMap", configmaps), ("Secret", "secret", secrets))
    for kind, prefix, objects in sources:
        for entry in _entries(platform, f"{prefix}AsEnv"):
            name = str(entry.get(f"{prefix}Name", ""))
            data = objects.get(name)
            if data is None:
                if entry.get("optional"):
                    continue
                raise ClusterSettingsError(f"{kind} {name} is missing")
            for mapping in _entries(entry, "keyToEnv"):
                key = str(mapping[f"{prefix}Key"])
                if key not in data:
                    raise ClusterSettingsError(f"{kind} {name} has no key {key}")
                env[str(mapping["envVar"])] = data[key]
    return env


def _entries(parent: Mapping[str, object], field: str) -> list[Mapping[str, object]]:
    value = parent.get(field) or []
    if not isinstance(value, list):
        raise ClusterSettingsError(f"{field} is not a list")
    return value
