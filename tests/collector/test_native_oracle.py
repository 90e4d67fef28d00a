"""Any OTLP export the official protobuf library can encode gives the same store rows
through the collector's native path as through its oracle (the span decoder and
Python rows, what an install without a C compiler runs).

The messages here are built with ``opentelemetry-proto``'s own classes, not with
spanmill's encoder, so they hold what spanmill never writes: several resources and
scopes a request, scope attributes, schema URLs, trace state, flags, dropped counts,
nested and key-value-list values, bytes, empty values, foreign conventions, reward
spans and evaluation events, links, unknown kinds and broken ids. Whatever the
native path does with a record (reads it whole, marks its rows for the Python steps,
or hands it to the authority), the Parquet files, dead letters and counts must be the
oracle's.
"""

from __future__ import annotations

import tempfile
from typing import Any

from collector_helpers import assert_same_writes, processed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from spanmill import native
from spanmill import semconv as sc
from spanmill.collector.batch import BatchProcessor, ProcessingConfig

HOUR = 3_600_000_000_000
START = 1_750_000_000_000_000_000

KEYS = st.sampled_from(
    [
        sc.SERVICE_NAME,
        sc.GEN_AI_OPERATION_NAME,
        sc.GEN_AI_REQUEST_MODEL,
        sc.GEN_AI_RESPONSE_MODEL,
        sc.GEN_AI_RESPONSE_ID,
        sc.SPANMILL_EPISODE_ID,
        sc.GEN_AI_EVALUATION_NAME,
        sc.GEN_AI_EVALUATION_SCORE_VALUE,
        sc.GEN_AI_EVALUATION_SCORE_LABEL,
        sc.SPANMILL_REWARD_PRIMARY,
        "llm.model_name",  # OpenInference: translated
        "gen_ai.prompt.0.content",  # OpenLLMetry: translated
        "plain",
        "é.key",
    ]
)
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["smollm2", "resp-1", "ops@example.com", "4111 1111 1111 1111", "chat"]),
)
INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _rarely(draw: Any, one_in: int = 25) -> bool:
    # Not st.integers: hypothesis favours its bounds, which would make "rarely" often.
    return bool(draw(st.sampled_from([False] * (one_in - 1) + [True])))


def _any(draw: Any, depth: int = 0) -> AnyValue:
    # Mostly what the native path reads; now and then what only the authority can.
    kind = draw(st.sampled_from(["string", "int", "double", "bool", "ints", "texts"]))
    if _rarely(draw):
        unusual = ["bytes", "empty", "mixed"] + (["kvlist", "nested"] if depth == 0 else [])
        kind = draw(st.sampled_from(unusual))
    value = AnyValue()
    if kind == "string":
        value.string_value = draw(TEXT)
    elif kind == "int":
        value.int_value = draw(INT)
    elif kind == "double":
        value.double_value = draw(st.floats(allow_nan=False))
    elif kind == "bool":
        value.bool_value = draw(st.booleans())
    elif kind == "bytes":
        value.bytes_value = draw(st.binary(max_size=6))
    elif kind == "ints":
        value.array_value.SetInParent()
        for item in draw(st.lists(INT, max_size=3)):
            value.array_value.values.add().int_value = item
    elif kind == "texts":
        value.array_value.SetInParent()
        for item in draw(st.lists(TEXT, max_size=3)):
            value.array_value.values.add().string_value = item
    elif kind == "mixed":
        value.array_value.values.add().int_value = 1
        value.array_value.values.add().string_value = "one"
    elif kind == "kvlist":
        value.kvlist_value.values.add(key="inner").value.CopyFrom(_any(draw, depth + 1))
    elif kind == "nested":
        value.array_value.values.add().CopyFrom(_any(draw, depth + 1))
    return value  # "empty": no field set


@st.composite
def key_values(draw: Any, max_size: int = 5) -> list[KeyValue]:
    out = []
    for key in draw(st.lists(KEYS, max_size=max_size)):
        pair = KeyValue(key="" if _rarely(draw, 200) else key)
        if key == sc.GEN_AI_EVALUATION_SCORE_VALUE and draw(st.booleans()):
            pair.value.double_value = draw(st.floats(min_value=-1, max_value=1))
        else:
            pair.value.CopyFrom(_any(draw))
        out.append(pair)
    return out


def _reward(draw: Any) -> list[KeyValue]:
    pairs = [
        KeyValue(key=sc.GEN_AI_EVALUATION_NAME, value=AnyValue(string_value="correct")),
        KeyValue(
            key=sc.GEN_AI_EVALUATION_SCORE_VALUE,
            value=AnyValue(double_value=draw(st.sampled_from([0.0, 1.0, 0.5]))),
        ),
    ]
    if draw(st.booleans()):
        pairs.append(KeyValue(key=sc.GEN_AI_RESPONSE_ID, value=AnyValue(string_value="resp-1")))
    if draw(st.booleans()):
        pairs.append(KeyValue(key=sc.SPANMILL_REWARD_PRIMARY, value=AnyValue(bool_value=True)))
    return pairs


def _id(draw: Any, size: int) -> bytes:
    # Mostly valid; now and then all zeros or the wrong length, which the authority refuses.
    if _rarely(draw, 150):
        return draw(st.sampled_from([bytes(size), b"\x01" * (size - 1)]))
    return draw(st.binary(min_size=size, max_size=size).filter(any))


@st.composite
def spans(draw: Any) -> Span:
    start = START + draw(st.sampled_from([0, 7, HOUR]))
    span = Span(
        trace_id=_id(draw, 16),
        span_id=_id(draw, 8),
        name=draw(st.sampled_from(["chat smollm2", "tool", "é", "reward"])),
        kind=9 if _rarely(draw, 100) else draw(st.integers(0, 5)),
        start_time_unix_nano=start,
        end_time_unix_nano=start + draw(st.sampled_from([0, 5, 10**9])),
        status=Status(code=draw(st.sampled_from([0, 1, 2])), message=draw(TEXT)),
        trace_state=draw(st.sampled_from(["", "vendor=1"])),
        flags=draw(st.sampled_from([0, 1, 0x101])),
        dropped_attributes_count=draw(st.sampled_from([0, 2])),
    )
    if draw(st.booleans()):
        span.parent_span_id = _id(draw, 8)
    span.attributes.extend(draw(key_values()))
    if draw(st.integers(0, 5)) == 0:
        span.attributes.extend(_reward(draw))
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add(
            name=draw(st.sampled_from([sc.GEN_AI_EVALUATION_RESULT_EVENT, "log", "exception"])),
            time_unix_nano=start + 1,
        )
        event.attributes.extend(
            _reward(draw)
            if event.name == sc.GEN_AI_EVALUATION_RESULT_EVENT
            else draw(key_values(2))
        )
    for _ in range(draw(st.integers(0, 1))):
        link = span.links.add(trace_id=_id(draw, 16), span_id=_id(draw, 8))
        link.attributes.extend(draw(key_values(2)))
    return span


@st.composite
def requests(draw: Any) -> bytes:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        resource = ResourceSpans(schema_url=draw(st.sampled_from(["", "https://example.org/1"])))
        resource.resource.attributes.extend(draw(key_values(3)))
        for _ in range(draw(st.integers(1, 2))):
            scope = ScopeSpans()
            scope.scope.name = draw(st.sampled_from(["", "spanmill.sdk", "openinference"]))
            scope.scope.version = draw(st.sampled_from(["", "1.0"]))
            if _rarely(draw, 10):
                scope.scope.attributes.extend(draw(key_values(1)))
            scope.spans.extend(draw(st.lists(spans(), min_size=1, max_size=3)))
            resource.scope_spans.append(scope)
        request.resource_spans.append(resource)
    return request.SerializeToString(deterministic=draw(st.booleans()))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=3))
def test_any_official_export_gives_the_oracles_rows(values: list[bytes]) -> None:
    assert native.module is not None, "the C extension spanmill._native is not built"
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        native_rows = BatchProcessor(ProcessingConfig(store_url=first))
        oracle = BatchProcessor(ProcessingConfig(store_url=second), native=False)
        assert native_rows._native is not None and oracle._native is None
        assert_same_writes(processed(native_rows, values), processed(oracle, values))


def test_the_generator_reaches_what_the_property_is_about() -> None:
    """Examples the property must have met: rewards on spans and events, links, spans
    the native path reads whole, and records the authority refuses."""
    seen: dict[str, bool] = {"reward": False, "link": False, "stored": False, "dead": False}

    @settings(max_examples=150, deadline=None, database=None)
    @given(requests())
    def look(payload: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(payload)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    if any(e.name == sc.GEN_AI_EVALUATION_RESULT_EVENT for e in span.events):
                        seen["reward"] = True
                    seen["link"] |= bool(span.links)
        with tempfile.TemporaryDirectory() as root:
            outcome, _ = processed(BatchProcessor(ProcessingConfig(store_url=root)), [payload])
        seen["stored"] |= outcome.spans > 0
        seen["dead"] |= bool(outcome.dead)

    look()
    assert all(seen.values()), seen
