"""Spans into store rows and back, exactly: typed columns, JSON for the rest."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from store_samples import odd_span, span

from spanmill import semconv as sc
from spanmill.spans import SpanDecodeError
from spanmill.store import (
    SPAN_SCHEMA,
    SpanParts,
    check_storable,
    spans_from_table,
    table_from_spans,
)


def test_round_trip_is_exact() -> None:
    spans = [span(i) for i in range(12)] + [odd_span()]
    table = table_from_spans(spans, topic="t", partition=2, offset=7, timestamp_ms=1)
    assert table.schema == SPAN_SCHEMA
    assert spans_from_table(table) == spans


def test_facts_have_typed_columns_and_leave_the_json() -> None:
    row = table_from_spans([span(1)]).to_pylist()[0]
    assert row["service_name"] == "svc-a"
    assert row["agent_name"] == "calculator"
    assert row["operation_name"] == "chat"
    assert row["model"] == "smollm2" and row["model_version"] == "1"
    assert row["completion_token_ids"] == [1, 2]
    assert row["completion_logprobs"] == [-0.5, -0.25]
    assert row["episode_id"] == f"{2:032x}"
    rest = json.loads(row["attributes"])
    assert sc.GEN_AI_INPUT_MESSAGES not in rest and sc.GEN_AI_AGENT_NAME not in rest
    assert rest == {"inf": float("inf"), "flags": [True, False]}
    assert row["resource_attributes"] is None
    assert row["events"] is None and row["links"] is None


def test_values_of_another_type_stay_in_the_json() -> None:
    row = table_from_spans([odd_span()]).to_pylist()[0]
    rest = json.loads(row["attributes"])
    assert row["input_tokens"] is None and rest[sc.GEN_AI_USAGE_INPUT_TOKENS] == "12"
    # An integer score is readable as a float column, and kept as an int in the JSON.
    assert row["reward_name"] == "correct" and row["reward_value"] == 1.0
    assert rest[sc.GEN_AI_EVALUATION_SCORE_VALUE] == 1
    assert row["episode_id"] == "episode-7"
    assert row["completion_token_ids"] == []
    assert rest[sc.SPANMILL_PROMPT_TOKEN_IDS] == ["a", "b"]
    assert row["service_name"] is None
    assert json.loads(row["resource_attributes"]) == {sc.SERVICE_NAME: 5}
    assert [r["name"] for r in row["rewards"]] == ["correct", "latency"]
    assert row["rewards"][1]["response_id"] == "r-1"


def test_times_beyond_the_store_range_are_refused() -> None:
    parts = SpanParts.from_span(span(1, end_time_unix_nano=2**63))
    with pytest.raises(SpanDecodeError) as caught:
        check_storable(parts, 0)
    assert caught.value.reason == "schema" and "2262" in caught.value.detail


def test_schema_is_versioned() -> None:
    assert SPAN_SCHEMA.metadata[b"spanmill.store.schema_version"] == b"1"
    assert SPAN_SCHEMA.field("start_time").type == pa.timestamp("ns", tz="UTC")
