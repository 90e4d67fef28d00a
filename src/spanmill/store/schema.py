"""The typed Parquet schema of the span store: one row per span.

The facts the dataset builder and a person querying the store need most are
columns of their own: ids, names, times, status, service and agent, model and
model version, messages, token ids and logprobs, the span's own reward, and the
Kafka record each row came from. Every other attribute stays in the
``attributes`` JSON column, so nothing a producer sent is lost.

An attribute with a column of its own is *moved* there when its value has
exactly the column's type, and written back from the column when a row is read,
so that a stored span reads back equal to the span that was taken in. A value of
another type (``gen_ai.usage.input_tokens`` sent as a string, say) stays in the
JSON. A few columns are *derived*: they copy or combine attributes for
convenience (``model``, ``episode_id``, ``reward_value`` of an integer score) and
are never written back.

JSON columns are null when they would be empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import pyarrow as pa

from spanmill import semconv as sc

SCHEMA_VERSION: Final = "1"
SCHEMA_VERSION_KEY: Final = b"spanmill.store.schema_version"

ValueKind = Literal["str", "int", "float", "bool", "int_list", "float_list"]


@dataclass(frozen=True)
class Promoted:
    """An attribute that has a column of its own."""

    column: str
    key: str
    kind: ValueKind
    resource: bool = False


# Span attributes moved to columns when their value has the column's type.
PROMOTED: Final = (
    Promoted("operation_name", sc.GEN_AI_OPERATION_NAME, "str"),
    Promoted("agent_name", sc.GEN_AI_AGENT_NAME, "str"),
    Promoted("request_model", sc.GEN_AI_REQUEST_MODEL, "str"),
    Promoted("response_model", sc.GEN_AI_RESPONSE_MODEL, "str"),
    Promoted("model_version", sc.SPANMILL_MODEL_VERSION, "str"),
    Promoted("response_id", sc.GEN_AI_RESPONSE_ID, "str"),
    Promoted("conversation_id", sc.GEN_AI_CONVERSATION_ID, "str"),
    Promoted("task_id", sc.SPANMILL_TASK_ID, "str"),
    Promoted("prompt_name", sc.SPANMILL_PROMPT_NAME, "str"),
    Promoted("prompt_version", sc.SPANMILL_PROMPT_VERSION, "str"),
    Promoted("input_messages", sc.GEN_AI_INPUT_MESSAGES, "str"),
    Promoted("output_messages", sc.GEN_AI_OUTPUT_MESSAGES, "str"),
    Promoted("system_instructions", sc.GEN_AI_SYSTEM_INSTRUCTIONS, "str"),
    Promoted("input_tokens", sc.GEN_AI_USAGE_INPUT_TOKENS, "int"),
    Promoted("output_tokens", sc.GEN_AI_USAGE_OUTPUT_TOKENS, "int"),
    Promoted("prompt_token_ids", sc.SPANMILL_PROMPT_TOKEN_IDS, "int_list"),
    Promoted("completion_token_ids", sc.SPANMILL_COMPLETION_TOKEN_IDS, "int_list"),
    Promoted("completion_logprobs", sc.SPANMILL_COMPLETION_LOGPROBS, "float_list"),
    Promoted("reward_name", sc.GEN_AI_EVALUATION_NAME, "str"),
    Promoted("reward_value", sc.GEN_AI_EVALUATION_SCORE_VALUE, "float"),
    Promoted("reward_primary", sc.SPANMILL_REWARD_PRIMARY, "bool"),
)
# Resource attributes moved to columns.
PROMOTED_RESOURCE: Final = (Promoted("service_name", sc.SERVICE_NAME, "str", resource=True),)

_ARROW_OF_KIND: Final[dict[ValueKind, pa.DataType]] = {
    "str": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "int_list": pa.list_(pa.int64()),
    "float_list": pa.list_(pa.float64()),
}
_TIME: Final = pa.timestamp("ns", tz="UTC")

REWARD_TYPE: Final = pa.struct(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("response_id", pa.string()),
        pa.field("primary", pa.bool_(), nullable=False),
        pa.field("label", pa.string()),
    ]
)


def _build_schema() -> pa.Schema:
    promoted = {p.column: p for p in PROMOTED + PROMOTED_RESOURCE}

    def column(name: str) -> pa.Field:
        return pa.field(name, _ARROW_OF_KIND[promoted[name].kind])

    fields = [
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("span_id", pa.string(), nullable=False),
        pa.field("parent_span_id", pa.string()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("start_time", _TIME, nullable=False),
        pa.field("end_time", _TIME, nullable=False),
        pa.field("status_code", pa.string(), nullable=False),
        pa.field("status_message", pa.string(), nullable=False),
        column("service_name"),
        column("agent_name"),
        column("operation_name"),
        # Derived: the model that answered, else the one asked for.
        pa.field("model", pa.string()),
        column("request_model"),
        column("response_model"),
        column("model_version"),
        column("response_id"),
        column("conversation_id"),
        # Derived: spanmill.episode.id when set, else the trace id.
        pa.field("episode_id", pa.string(), nullable=False),
        column("task_id"),
        column("prompt_name"),
        column("prompt_version"),
        column("input_messages"),
        column("output_messages"),
        column("system_instructions"),
        column("input_tokens"),
        column("output_tokens"),
        column("prompt_token_ids"),
        column("completion_token_ids"),
        column("completion_logprobs"),
        column("reward_name"),
        column("reward_value"),
        column("reward_primary"),
        # Derived: every reward the span carries, its own and its evaluation events'.
        pa.field("rewards", pa.list_(REWARD_TYPE)),
        pa.field("attributes", pa.string()),
        pa.field("resource_attributes", pa.string()),
        pa.field("scope_name", pa.string(), nullable=False),
        pa.field("scope_version", pa.string(), nullable=False),
        pa.field("events", pa.string()),
        pa.field("links", pa.string()),
        pa.field("kafka_topic", pa.string(), nullable=False),
        pa.field("kafka_partition", pa.int32(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
        # Position of the span among the spans of its Kafka record.
        pa.field("kafka_index", pa.int32(), nullable=False),
        pa.field("kafka_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    ]
    return pa.schema(fields, metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()})


SPAN_SCHEMA: Final = _build_schema()
COLUMNS: Final = tuple(SPAN_SCHEMA.names)

# Columns of few distinct values, dictionary-encoded in Parquet. Ids, texts, times and
# numbers are not: a dictionary of mostly distinct values costs a hash per value and
# is dropped for plain encoding anyway.
DICTIONARY_COLUMNS: Final = (
    "name",
    "kind",
    "status_code",
    "service_name",
    "agent_name",
    "operation_name",
    "model",
    "request_model",
    "response_model",
    "model_version",
    "task_id",
    "prompt_name",
    "prompt_version",
    "reward_name",
    "resource_attributes",
    "scope_name",
    "scope_version",
    "kafka_topic",
    "kafka_partition",
)
# Columns with min/max statistics in Parquet: those the store's readers filter on
# (row groups are skipped on them), and the end time. Long texts' statistics would
# cost a comparison per value and skip nothing.
STATISTICS_COLUMNS: Final = (
    "start_time",
    "end_time",
    "service_name",
    "agent_name",
    "operation_name",
    "trace_id",
    "episode_id",
)
