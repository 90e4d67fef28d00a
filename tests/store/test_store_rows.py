"""Spans into store rows and back, exactly: typed columns, JSON for the rest."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest
from store_samples import odd_span, span

from spanmill import semconv as sc
from spanmill.spans import Span, SpanDecodeError
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


def test_span_rewards_and_stored_rewards_are_one_reading() -> None:
    """A span's ``rewards`` and the store's ``rewards`` column come from one function
    (spanmill.rewards.rewards_of): every shape a producer sends reads the same."""
    from spanmill.spans import SpanEvent

    event = sc.GEN_AI_EVALUATION_RESULT_EVENT
    shapes = [
        ({sc.GEN_AI_EVALUATION_NAME: "ok", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1}, ()),
        ({sc.GEN_AI_EVALUATION_NAME: "ok", sc.GEN_AI_EVALUATION_SCORE_VALUE: True}, ()),
        ({sc.GEN_AI_EVALUATION_NAME: "ok", sc.GEN_AI_EVALUATION_SCORE_VALUE: "1"}, ()),
        (
            {sc.GEN_AI_RESPONSE_ID: 42},  # not a string: links nothing, in either reading
            ((event, {sc.GEN_AI_EVALUATION_NAME: "a", sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.5}),),
        ),
        (
            {sc.GEN_AI_RESPONSE_ID: "r-9"},
            (
                ("other", {sc.GEN_AI_EVALUATION_NAME: "x", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1}),
                (event, {sc.GEN_AI_EVALUATION_NAME: "a", sc.GEN_AI_EVALUATION_SCORE_VALUE: 2,
                         sc.SPANMILL_REWARD_PRIMARY: True, sc.GEN_AI_EVALUATION_SCORE_LABEL: "p"}),
                (event, {sc.GEN_AI_EVALUATION_NAME: "b", sc.GEN_AI_EVALUATION_SCORE_VALUE: -1.5,
                         sc.GEN_AI_RESPONSE_ID: "r-1"}),
            ),
        ),
    ]  # fmt: skip
    spans = [
        Span(
            trace_id="ab" * 16,
            span_id=f"{i + 1:016x}",
            name="s",
            start_time_unix_nano=1,
            end_time_unix_nano=2,
            attributes=attributes,
            events=tuple(SpanEvent(name=n, time_unix_nano=1, attributes=a) for n, a in events),
        )
        for i, (attributes, events) in enumerate(shapes)
    ]
    stored = table_from_spans(spans).column("rewards").to_pylist()
    read = [[dataclasses.asdict(r) for r in span.rewards] or None for span in spans]
    assert stored == read
    assert [len(r or ()) for r in read] == [1, 0, 0, 1, 2]
    assert read[3][0]["response_id"] is None
    assert [r["response_id"] for r in read[4]] == ["r-9", "r-1"]
