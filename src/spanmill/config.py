"""Configuration: one pydantic-settings model per service, env prefix ``SPANMILL_``.

Connections shared by several services (Kafka, MLflow, Triton) have their own
models and env prefixes, so one deployment sets ``SPANMILL_KAFKA_BOOTSTRAP_SERVERS``
once for every service. A service's model composes the ones it needs. Defaults
point at the embedded local stack (``spanmill up``), so nothing needs setting to
try spanmill on one machine.

Load settings with :func:`load_settings`: a bad value becomes a
:class:`~spanmill.errors.ConfigError` that names the environment variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from spanmill import paths, semconv
from spanmill.errors import ConfigError
from spanmill.gateway.routing import RoutingTable
from spanmill.precision import ServingDtype

LOOPBACK = "127.0.0.1"

# Ports of the embedded stack. Chosen away from the usual defaults of the same
# services (9092, 5000, 8000-8002) so that a developer's own copies can coexist.
DEFAULT_KAFKA_PORT = 19092
DEFAULT_MLFLOW_PORT = 15000
DEFAULT_TRITON_HTTP_PORT = 18000
DEFAULT_TRITON_GRPC_PORT = 18001
DEFAULT_TRITON_METRICS_PORT = 18002
DEFAULT_GATEWAY_PORT = 18080
DEFAULT_COLLECTOR_PORT = 14318
# How long the gateway and the collector's receiver keep an idle client connection open.
# Longer than clients' own idle limits (httpx's 5 s) and a load balancer's (60 s is
# common): the one that closes first must be the client, or a request sent as the
# server closes fails on a connection the client took for open.
HTTP_KEEP_ALIVE_S = 75


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, extra="ignore", validate_default=True)


class KafkaSettings(BaseSettings):
    """How to reach Kafka. Env prefix ``SPANMILL_KAFKA_``."""

    model_config = _config("SPANMILL_KAFKA_")

    bootstrap_servers: str = Field(
        f"{LOOPBACK}:{DEFAULT_KAFKA_PORT}", description="Comma-separated host:port list."
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    spans_topic: str = semconv.SPANS_TOPIC
    # RL rollouts (training traffic): read by the trainer that made them, not the collector.
    rollouts_topic: str = semconv.ROLLOUTS_TOPIC
    dlq_topic: str = semconv.DLQ_TOPIC
    max_message_bytes: int = Field(1024 * 1024, gt=0, description="Larger messages go to the DLQ.")

    @field_validator("sasl_mechanism", "sasl_username", "ssl_cafile", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        """An empty value is none: a ConfigMap key that must exist but has nothing to say."""
        return None if value == "" else value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port[,host:port...], got {server.strip()!r}")
        return value

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments shared by kafka-python's producer, consumer and admin client."""
        options: dict[str, Any] = {
            "bootstrap_servers": [s.strip() for s in self.bootstrap_servers.split(",")],
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            if self.sasl_password is not None:
                options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        if self.ssl_cafile:
            options["ssl_cafile"] = str(self.ssl_cafile)
        return options


class MLflowSettings(BaseSettings):
    """How to reach the MLflow tracking server. Env prefix ``SPANMILL_MLFLOW_``."""

    model_config = _config("SPANMILL_MLFLOW_")

    tracking_uri: str = f"http://{LOOPBACK}:{DEFAULT_MLFLOW_PORT}"
    # The client's own defaults (120 s, 7 retries with backoff up to 128 s) hold one call
    # to a quiet MLflow about 20 minutes, 3 retries about 8 (spanmill.registry.bounds);
    # the controller has its own, tighter.
    request_timeout_s: int = Field(
        120,
        gt=0,
        description="Seconds a spanmill process waits for one MLflow answer (MLflow's own "
        "default: an artifact's upload is answered once the server has stored it).",
    )
    request_retries: int = Field(3, ge=0, description="Retries of an MLflow call that failed.")

    def bound_requests(self) -> None:
        """Bound this process's MLflow calls so, where MLFLOW_HTTP_REQUEST_* are not set."""
        from spanmill.registry.bounds import bound_by_default

        bound_by_default(self.request_timeout_s, self.request_retries)


class TritonSettings(BaseSettings):
    """How to reach Triton. Env prefix ``SPANMILL_TRITON_``."""

    model_config = _config("SPANMILL_TRITON_")

    http_url: str = f"{LOOPBACK}:{DEFAULT_TRITON_HTTP_PORT}"
    grpc_url: str = f"{LOOPBACK}:{DEFAULT_TRITON_GRPC_PORT}"
    model_repository: str = Field(
        default_factory=lambda: str(paths.home() / "model-repository"),
        description="A local folder or an fsspec URL such as s3://bucket/prefix.",
    )
    repository_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options for an s3:// model repository, JSON."
    )
    server_repository: str | None = Field(
        None,
        description="The model repository as tritonserver names it, when that differs from "
        "model_repository (an S3 endpoint of its own goes into the URL).",
    )
    # Where versions are loaded: the one server at http_url, or every pod of a headless
    # Service, from its EndpointSlices (spanmill.rollout.fleet). The controller and the
    # pipeline's steps load onto every pod; requests go through http_url (the Service).
    discovery: Literal["none", "endpointslices"] = Field(
        "none", description="none: one Triton server; endpointslices: every pod of a Service."
    )
    pods_service: str = Field(
        "spanmill-triton-pods", min_length=1, description="The headless Service of Triton's pods."
    )
    namespace: str = Field("default", min_length=1, description="The namespace of that Service.")
    port_name: str = Field(
        "http", min_length=1, description="The Service's port for Triton's HTTP API."
    )


# The max_lora_rank values vLLM's engine accepts (its LoRA configuration's choices).
VLLM_LORA_RANKS: Final = (8, 16, 32, 64, 128, 256, 320, 512)


class ServingSettings(BaseSettings):
    """How versions are written into the model repository. Env prefix ``SPANMILL_SERVING_``.

    One set for everything that writes versions (the rollout controller, the pipeline's
    evaluation), so a candidate the pipeline stages is served the way the controller
    serves what it deploys.
    """

    model_config = _config("SPANMILL_SERVING_")

    flavour: Literal["python", "vllm"] = Field(
        "python", description="python: transformers in Triton's Python backend; vllm: vLLM."
    )
    dtype: ServingDtype = Field(
        "auto",
        description="The weights' format where an instance loads them; auto: bfloat16 where "
        "that device computes it natively (a GPU, a CPU with AVX512-BF16 or AMX), else float32. "
        "In the vllm flavour, the engine's dtype (auto: vLLM's choice from the model; float16 "
        "on a GPU without bfloat16).",
    )
    num_threads: int = Field(
        0,
        ge=0,
        description="torch threads per Python-backend instance; 0: as many as the CPUs "
        "it may use (its cgroup quota), or OMP_NUM_THREADS.",
    )
    copy_base: bool = Field(
        False,
        description="Copy the base model's weights into each version folder: needed wherever "
        "Triton cannot read the writer's own files (every cluster).",
    )
    gpu: bool = Field(False, description="Python-backend instances on a GPU.")
    # The vLLM flavour's engine (model.json). Adding an adapter reloads the engine, and
    # Triton loads the new engine beside the old one before it lets the old one go (a
    # reload loses no availability): both must fit on the GPU at once.
    vllm_gpu_memory_utilization: float = Field(
        0.45,
        gt=0,
        le=0.5,
        description="The share of each GPU's memory one vLLM engine takes (weights and key/value "
        "cache); at most half, so that the engine's reload when an adapter joins fits beside it.",
    )
    vllm_max_model_len: int = Field(
        4096, gt=0, description="The longest prompt and answer together, in tokens (vLLM)."
    )
    vllm_max_lora_rank: int = Field(
        64,
        description="The highest LoRA rank an adapter may have: one of "
        f"{', '.join(map(str, VLLM_LORA_RANKS))} (the values vLLM takes).",
    )
    vllm_tensor_parallel_size: int = Field(
        1, gt=0, description="GPUs one vLLM engine spreads over (the Triton pod's GPUs)."
    )

    @field_validator("vllm_max_lora_rank")
    @classmethod
    def _a_rank_vllm_takes(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"must be one of {', '.join(map(str, VLLM_LORA_RANKS))}")
        return value


class StackSettings(BaseSettings):
    """The embedded stack that ``spanmill up`` starts. Env prefix ``SPANMILL_STACK_``."""

    model_config = _config("SPANMILL_STACK_")

    host: str = LOOPBACK
    kafka_port: int = Field(DEFAULT_KAFKA_PORT, gt=0, lt=65536)
    kafka_partitions: int = Field(3, gt=0, le=64)
    mlflow_port: int = Field(DEFAULT_MLFLOW_PORT, gt=0, lt=65536)
    triton_http_port: int = Field(DEFAULT_TRITON_HTTP_PORT, gt=0, lt=65536)
    triton_grpc_port: int = Field(DEFAULT_TRITON_GRPC_PORT, gt=0, lt=65536)
    triton_metrics_port: int = Field(DEFAULT_TRITON_METRICS_PORT, gt=0, lt=65536)
    gateway_port: int = Field(DEFAULT_GATEWAY_PORT, gt=0, lt=65536)
    collector_port: int = Field(DEFAULT_COLLECTOR_PORT, gt=0, lt=65536)
    state_dir: Path = Field(default_factory=paths.state_dir)
    model_repository: Path = Field(default_factory=lambda: paths.home() / "model-repository")
    routing_file: Path = Field(default_factory=lambda: paths.state_dir() / "routes.json")
    span_store: str = Field(default_factory=lambda: str(paths.home() / "spans"))
    startup_timeout_s: float = Field(120.0, gt=0)


# The collector's built-in redaction patterns and the foreign conventions it translates.
RedactionRule = Literal["email", "api_key", "card_number"]
Convention = Literal["openllmetry", "openinference"]


def _all_redaction_rules() -> list[RedactionRule]:
    return ["email", "api_key", "card_number"]


def _all_conventions() -> list[Convention]:
    return ["openllmetry", "openinference"]


class CollectorSettings(BaseSettings):
    """The collector service. Env prefix ``SPANMILL_COLLECTOR_``."""

    model_config = _config("SPANMILL_COLLECTOR_")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    group_id: str = "spanmill-collector"
    store_url: str = Field(
        default_factory=lambda: str(paths.home() / "spans"),
        description="Span store root: a local folder or an fsspec URL such as s3://bucket/spans.",
    )
    batch_max_spans: int = Field(
        5000, gt=0, description="Records per batch (one file per hour) of one partition."
    )
    batch_max_seconds: float = Field(
        5.0, gt=0, description="Oldest a partition's unwritten records may get before a write."
    )
    http_host: str = LOOPBACK
    http_port: int = Field(
        4318, gt=0, lt=65536, description="OTLP/HTTP receiver, /metrics, /healthz and /readyz."
    )
    http_keep_alive_s: int = Field(
        HTTP_KEEP_ALIVE_S,
        gt=0,
        description="Seconds an idle client connection stays open: longer than the "
        "exporters' and any load balancer's idle timeout.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description='fsspec options for store_url, JSON; e.g. {"endpoint_url": "http://minio:9000"}.',
    )
    # 16 MiB: a batch of records of one span each is bounded by batch_max_spans (5,000
    # records of about 1.3 KB); one of records of 100 spans (about 122 KiB, as SDK
    # exporters batch) by this, about 13,000 spans, so that large records cost no more
    # memory a span than small ones (bench/collector_throughput.py measures both).
    batch_max_bytes: int = Field(16 * 1024 * 1024, gt=0, description="Bytes per batch.")
    workers: int | Literal["auto"] = Field(
        "auto",
        description="Processes that decode and write behind each consumer; 0: a thread of "
        "the consumer's own; auto: 0, or the cores the consumers leave (collector.sizing).",
    )
    processes: int | Literal["auto"] = Field(
        "auto",
        description="Consumer processes, each with its own consumer in the group and its own "
        "workers: the Kafka client parses records on one core per consumer. auto: one per "
        "core and one more, at most this collector's share of the topic's partitions "
        "(collector.sizing).",
    )
    cpus: float | None = Field(
        None,
        ge=0,
        description="CPUs the auto layout sizes for; unset or 0: this process's CPU affinity "
        "and cgroup quota.",
    )
    instances: int = Field(
        1,
        ge=1,
        le=4096,
        description="Collectors that read the topic in one consumer group at most (pods): "
        "auto gives each at most its share of the topic's partitions (collector.sizing).",
    )
    max_inflight_batches: int = Field(
        4, gt=0, description="Batches being written at once before consuming pauses."
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new consumer group starts; earliest loses nothing."
    )
    session_timeout_ms: int = Field(10_000, ge=1000)
    compression: Literal["zstd", "snappy", "gzip", "lz4", "none"] = "zstd"
    redact_rules: list[RedactionRule] = Field(
        default_factory=_all_redaction_rules,
        description="Built-in redaction patterns to apply; [] for none.",
    )
    redact_patterns: dict[str, str] = Field(
        default_factory=dict,
        description="More patterns, name to regex, JSON; each is matched against every text "
        "on its own (^...$ is a whole value), and a match becomes [REDACTED:<name>].",
    )
    attributes_allow: list[str] = Field(
        default_factory=list, description="When set, only attributes matching these globs are kept."
    )
    attributes_deny: list[str] = Field(
        default_factory=lambda: [
            "http.request.header.authorization",
            "http.request.header.cookie",
            "http.request.header.x-api-key",
            "http.response.header.set-cookie",
        ],
        description="Attributes dropped by name (shell-style globs).",
    )
    conventions: list[Convention] = Field(
        default_factory=_all_conventions,
        description="Foreign conventions translated into the GenAI ones.",
    )
    receiver_enabled: bool = Field(True, description="Serve OTLP/HTTP POST /v1/traces.")
    receiver_keys_file: Path | None = Field(
        None,
        description="Producer keys for the receiver's POST /v1/traces and /v1/feedback, in the "
        "gateway's keys-file format (spanmill gateway-key); the key's id is stored with each "
        "span as spanmill.producer. Unset: the receiver takes any caller, as 'anonymous'.",
    )
    admin_api_key: SecretStr | None = Field(
        None,
        description="Bearer token for the collector's /admin routes (erasure requests); no "
        "producer key opens them. Unset: /admin is refused.",
    )
    ledger_retention_s: float = Field(
        3600.0, ge=0, description="Age after which ledger entries of committed batches go."
    )
    shutdown_timeout_s: float = Field(30.0, gt=0, description="Time allowed to flush on SIGTERM.")
    write_retry_s: float = Field(
        30.0,
        gt=0,
        description="How long a batch the store refuses is retried before the collector stops "
        "with an error (nothing committed past it: a restart writes it again); also how long "
        "dead letters the dead-letter topic does not take are retried before they are kept "
        "in the store's _dead_letters instead.",
    )

    @field_validator("processes", "workers", mode="before")
    @classmethod
    def _count_or_auto(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        least = 1 if info.field_name == "processes" else 0
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = None
        if number is None or (number != value and str(number) != str(value).strip()):
            raise ValueError(f"must be a whole number from {least} to 64, or auto")
        if not least <= number <= 64:
            raise ValueError(f"must be from {least} to 64, or auto")
        return number

    @field_validator("redact_patterns")
    @classmethod
    def _regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {name!r} is not a valid regex: {exc}") from None
        return value


class StoreSettings(BaseSettings):
    """Upkeep of the span store: ``spanmill store compact`` (the chart's CronJob) and
    ``spanmill store erase``. Env prefix ``SPANMILL_STORE_``."""

    model_config = _config("SPANMILL_STORE_")

    url: str = Field(
        default_factory=lambda: str(paths.home() / "spans"),
        description="Span store root, as the collector's SPANMILL_COLLECTOR_STORE_URL.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options for url, JSON."
    )
    retention_days: float | None = Field(
        None, gt=0, description="Hours older than this many days are deleted; unset keeps all."
    )
    user_id_attribute: str = Field(
        "enduser.id", min_length=1, description="The span attribute that carries a user's id."
    )
    settle_seconds: float = Field(
        600.0, ge=0, description="An hour is compacted once it ended this long ago."
    )
    target_rows: int = Field(1_000_000, gt=0, description="Rows per compacted file.")
    stale_seconds: float = Field(
        3600.0,
        ge=0,
        description="Age after which a killed run's temp files and incomplete work are deleted.",
    )


class GatewaySettings(BaseSettings):
    """The OpenAI-compatible gateway. Env prefix ``SPANMILL_GATEWAY_``."""

    model_config = _config("SPANMILL_GATEWAY_")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    host: str = LOOPBACK
    port: int = Field(DEFAULT_GATEWAY_PORT, gt=0, lt=65536)
    keep_alive_s: int = Field(
        HTTP_KEEP_ALIVE_S,
        gt=0,
        description="Seconds an idle client connection stays open: longer than the clients' "
        "and any load balancer's idle timeout.",
    )
    routing_file: Path | None = None
    routing_configmap: str | None = Field(
        None,
        description="namespace/name of the ConfigMap holding the routing table (Kubernetes); "
        "watched instead of routing_file.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="One bearer token shared by every client (known as key id 'default'); "
        "client_keys_file gives each client a key of its own.",
    )
    client_keys_file: Path | None = Field(
        None,
        description="Client keys, one '<key id> sha256:<hex>' line each (spanmill gateway-key "
        "makes them); re-read on change, so deleting a line revokes a key. When set, or with "
        "api_key, every client must present a key.",
    )
    admin_api_key: SecretStr | None = Field(
        None,
        description="Bearer token for /admin (no client key opens it). Unset: /admin is refused "
        "while clients need keys, and open when they do not.",
    )
    key_requests_per_s: float | None = Field(
        None,
        gt=0,
        description="Chat completions and feedback posts a client (an API key; 'anonymous' "
        "without keys) may start per second, per gateway replica; past it 429 with "
        "Retry-After. Unset: no limit.",
    )
    key_burst: float | None = Field(
        None,
        ge=1,
        description="Requests a client may start at once within its rate (default: "
        "one second's worth).",
    )
    key_max_concurrent: int | None = Field(
        None,
        ge=1,
        description="Chat completions and feedback posts a client may have in flight at "
        "once, per gateway replica; past it 429. Unset: no limit.",
    )
    span_queue_size: int = Field(
        10_000,
        gt=0,
        description="LLM spans that wait for Kafka in the queue, and as many again unsent in "
        "the producer; past both, a span is dropped and counted.",
    )
    span_outage_s: float = Field(
        300.0,
        ge=10,
        description="How long an LLM span may wait for Kafka, unsent, before it is dropped: "
        "a shorter outage loses nothing below the bound.",
    )
    request_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Longest a chat completion may take, streamed or not; past it the "
        "generation is stopped and the client gets 504.",
    )
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        gt=0,
        description="Largest request body accepted; a larger one is refused with 413 unread.",
    )
    traffic: Literal["training"] | None = Field(
        None,
        description="training: every call is marked as RL rollout traffic (the trainer's own "
        "gateway); unset for production.",
    )


class RolloutSettings(BaseSettings):
    """The rollout controller. Env prefix ``SPANMILL_ROLLOUT_``.

    Lists and mappings are JSON: ``SPANMILL_ROLLOUT_STEPS='[5, 25, 50, 100]'``.
    """

    model_config = _config("SPANMILL_ROLLOUT_")

    mlflow: MLflowSettings = Field(default_factory=MLflowSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    interval_s: float = Field(10.0, gt=0)
    backend: Literal["local", "kubernetes"] = "local"
    agents: list[str] = Field(
        default_factory=list,
        description="Agents to manage; empty: every agent with a registered model spanmill made.",
    )

    # The policy a challenger's canary follows (see spanmill.rollout.schemas.RolloutPolicy).
    steps: list[float] = Field(
        default_factory=lambda: [5.0, 25.0, 50.0, 100.0],
        description="Percent of traffic the challenger takes at each step; ends at 100.",
    )
    bake_s: float = Field(300.0, ge=0, description="Least time spent at each step.")
    min_requests: int = Field(20, ge=0, description="Challenger requests a step needs.")
    max_error_rate: float = Field(0.05, ge=0, le=1)
    max_queue_full_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Highest share of requests Triton refused for a full queue (429), judged "
        "on a full sample; off by default (load alone fills a queue).",
    )
    max_p95_latency_s: float | None = Field(None, gt=0)
    max_latency_ratio: float | None = Field(None, gt=0, description="Of the champion's p95.")
    min_mean_reward: float | None = None
    max_reward_drop: float | None = Field(None, ge=0, description="Below the champion's mean.")
    min_rewards: int = Field(10, ge=1)
    grace_s: float = Field(300.0, ge=0, description="A replaced champion stays loaded this long.")
    drain_s: float = Field(5.0, ge=0, description="Wait after routing away before unloading.")

    # Where the health of each version is read.
    signals: Literal["gateway", "spans"] = Field(
        "gateway", description="gateway: its Prometheus metrics; spans: the span store."
    )
    gateway_urls: list[str] = Field(
        default_factory=lambda: [f"http://{LOOPBACK}:{DEFAULT_GATEWAY_PORT}"],
        description="Every gateway replica, for its /metrics (without gateway_service).",
    )
    gateway_service: str = Field(
        "",
        description="The gateway's Service in namespace: every pod behind it (its "
        "EndpointSlices, listed at each read) is read for /metrics, instead of gateway_urls.",
    )
    gateway_port_name: str = Field(
        "http", min_length=1, description="The gateway Service's port that serves /metrics."
    )
    store_url: str = Field(
        default_factory=lambda: str(paths.home() / "spans"), description="The span store."
    )
    store_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options.")
    reward_name: str | None = Field(None, description="Reward judged; default: the primary one.")

    # How versions are written into the Triton model repository and checked.
    serving: ServingSettings = Field(default_factory=ServingSettings)
    smoke_timeout_s: float = Field(120.0, gt=0)
    load_timeout_s: float = Field(600.0, gt=0)
    retry_after_s: float = Field(60.0, gt=0, description="Wait before retrying a failed deploy.")
    deploy_wait_s: float = Field(
        5.0,
        ge=0,
        description="How long a pass waits for a deployment (it runs on a thread of its own) "
        "before it holds that agent and goes on to the others.",
    )
    stall_after_s: float = Field(
        900.0,
        gt=0,
        description="A pass that has not moved on for this long (one agent's step stuck in a "
        "call) logs where it is stuck and fails /healthz, so that the kubelet restarts the "
        "controller and a standby takes the Lease.",
    )
    # MLflow's client waits 120 s for an answer and retries 7 times by default: a pass
    # would hang four minutes on an MLflow that is down. The controller asks less of it.
    mlflow_timeout_s: int = Field(
        10, gt=0, description="Seconds the controller waits for one MLflow answer."
    )
    mlflow_retries: int = Field(
        1, ge=0, description="Retries of an MLflow call that failed, within one pass."
    )

    # The local backend.
    state_file: Path = Field(default_factory=lambda: paths.state_dir() / "rollout-state.json")
    routing_file: Path = Field(default_factory=lambda: paths.state_dir() / "routes.json")
    gateway_admin_url: str | None = Field(
        None, description="Write routes through this gateway's admin API instead of the file."
    )
    gateway_admin_key: SecretStr | None = Field(
        None,
        description="The gateway's admin credential (its SPANMILL_GATEWAY_ADMIN_API_KEY), for "
        "writing routes through gateway_admin_url.",
    )

    # The Kubernetes backend.
    namespace: str = "default"
    configmap: str = Field("spanmill-routing", description="Holds the routes and the state.")
    initial_routes: RoutingTable = Field(
        default_factory=RoutingTable,
        description="The routing table (JSON) written into the ConfigMap while it holds none: "
        "the chart renders no table where the controller runs, so that a GitOps sync, which "
        "renders without the cluster, never resets live traffic.",
    )

    # Leader election, for more than one replica: only the holder of a coordination.k8s.io/v1
    # Lease in `namespace` reconciles; the others stand by (spanmill.rollout.leader).
    leader_election: bool = Field(False, description="Reconcile only while holding the Lease.")
    lease_name: str = Field("spanmill-rollout", min_length=1, description="The Lease's name.")
    lease_duration_s: int = Field(
        15, ge=1, description="How long one renewal holds the standbys off, whole seconds."
    )
    renew_deadline_s: float = Field(
        10.0, gt=0, description="A leader that could not renew for this long stops acting."
    )
    retry_period_s: float = Field(2.0, gt=0, description="Between tries to acquire or renew.")
    leader_identity: str | None = Field(
        None,
        description="Holder identity (the pod's name on a cluster); default: the host and a "
        "random suffix.",
    )

    # The controller's own /metrics, /healthz and /readyz.
    http_host: str = LOOPBACK
    http_port: int = Field(18090, gt=0, lt=65536)

    @field_validator("steps")
    @classmethod
    def _steps(cls, value: list[float]) -> list[float]:
        from spanmill.rollout.schemas import check_steps

        return check_steps(value)

    @field_validator("renew_deadline_s")
    @classmethod
    def _renew_deadline(cls, value: float, info: ValidationInfo) -> float:
        # The leader must stop acting before a standby may take the Lease over.
        duration = info.data.get("lease_duration_s")
        if duration is not None and value >= duration:
            raise ValueError(f"must be shorter than SPANMILL_ROLLOUT_LEASE_DURATION_S ({duration})")
        return value

    @field_validator("stall_after_s")
    @classmethod
    def _stall_after(cls, value: float, info: ValidationInfo) -> float:
        # A step waiting for its deployment, or for a version's load (a retirement reloads
        # a vLLM engine on the pass's thread), is not stuck.
        for name in ("deploy_wait_s", "load_timeout_s"):
            bound = info.data.get(name)
            if bound is not None and value <= bound:
                raise ValueError(f"must be longer than SPANMILL_ROLLOUT_{name.upper()} ({bound})")
        return value

    @field_validator("retry_period_s")
    @classmethod
    def _retry_period(cls, value: float, info: ValidationInfo) -> float:
        # At least one renewal is tried within the deadline.
        deadline = info.data.get("renew_deadline_s")
        if deadline is not None and value >= deadline:
            raise ValueError(f"must be shorter than SPANMILL_ROLLOUT_RENEW_DEADLINE_S ({deadline})")
        return value


S = TypeVar("S", bound=BaseSettings)

# Settings that moved: one shared set now says how versions are written and where the
# model repository is. A deployment still setting an old name would lose that setting
# without a word, so it is refused, naming the new one.
RENAMED = {
    **{f"SPANMILL_{service}_{name}": f"SPANMILL_SERVING_{name}"
       for service in ("ROLLOUT", "EVAL") for name in ("FLAVOUR", "DTYPE", "NUM_THREADS")},
    "SPANMILL_ROLLOUT_COPY_BASE": "SPANMILL_SERVING_COPY_BASE",
    "SPANMILL_ROLLOUT_GPU": "SPANMILL_SERVING_GPU",
    "SPANMILL_ROLLOUT_TRITON_ROOT": "SPANMILL_TRITON_SERVER_REPOSITORY",
    "SPANMILL_ROLLOUT_REPOSITORY_OPTIONS": "SPANMILL_TRITON_REPOSITORY_OPTIONS",
}  # fmt: skip


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build ``cls`` from the environment, turning validation errors into a ConfigError.

    The message names each bad setting by the environment variable a user sets.
    """
    moved = sorted(name for name in RENAMED if name in os.environ)
    if moved:
        raise ConfigError(
            "settings that moved are still set: "
            + ", ".join(f"{name} is now {RENAMED[name]}" for name in moved)
        )
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(cls, exc)) from None


def _env_name(cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """Map a pydantic error location to the environment variable that feeds it."""
    model: type[BaseModel] | None = cls
    prefix = str(cls.model_config.get("env_prefix", ""))
    for i, part in enumerate(loc):
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            break
        annotation = model.model_fields[part].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
            model, prefix = annotation, str(annotation.model_config.get("env_prefix", ""))
            continue
        rest = "__".join(str(p) for p in loc[i + 1 :])
        return (prefix + part).upper() + (f"__{rest}".upper() if rest else "")
    return prefix.upper() + "_".join(str(p) for p in loc).upper()


def _failing_model(cls: type[BaseModel], title: str) -> type[BaseModel]:
    """Find the (possibly nested) settings model an error came from.

    Nested connection settings are built by their own default factories, so their
    errors arrive titled with the nested model's name, not the service's.
    """
    if cls.__name__ == title:
        return cls
    for field in cls.model_fields.values():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found = _failing_model(annotation, title)
            if found.__name__ == title:
                return found
    return cls


def _describe(cls: type[BaseModel], exc: ValidationError) -> str:
    cls = _failing_model(cls, exc.title)
    lines = [f"invalid {cls.__name__} settings:"]
    for error in exc.errors():
        name = _env_name(cls, tuple(error["loc"]))
        value = error.get("input")
        shown = "" if isinstance(value, dict) or value is None else f" (got {value!r})"
        if "password" in name.lower() or "key" in name.lower():
            shown = ""  # never echo a secret back into a log
        lines.append(f"  {name}: {error['msg']}{shown}")
    return "\n".join(lines)
