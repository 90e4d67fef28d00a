"""Every encoding round-trips, agrees with the others, and refuses bad input precisely."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from spanmill import semconv as sc
from spanmill.spans import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    REASONS,
    Span,
    SpanDecodeError,
    SpanKind,
    StatusCode,
    decode_otlp_json,
    decode_otlp_protobuf,
    decode_spans,
    detect_and_decode,
    encode_otlp_json,
    encode_otlp_protobuf,
    encode_span,
    encode_spans,
    format_from_content_type,
)

Encode = Callable[[list[Span]], bytes]
Decode = Callable[[bytes], list[Span]]
CODECS: dict[str, tuple[Encode, Decode]] = {
    "sdk_json": (encode_spans, decode_spans),
    "otlp_json": (encode_otlp_json, decode_otlp_json),
    "otlp_protobuf": (encode_otlp_protobuf, decode_otlp_protobuf),
}
TRACE = "5b8efff798038103d269b633813fc60c"


def llm_span(**overrides: Any) -> Span:
    fields: dict[str, Any] = {
        "trace_id": TRACE,
        "span_id": "eee19b7ec3c1b174",
        "parent_span_id": "1111111111111111",
        "name": "chat smollm2",
        "kind": SpanKind.CLIENT,
        "start_time_unix_nano": 1_700_000_000_000_000_000,
        "end_time_unix_nano": 1_700_000_000_500_000_000,
        "status_code": StatusCode.ERROR,
        "status_message": "tool failed: ÿ",
        "attributes": {
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "smollm2",
            sc.GEN_AI_RESPONSE_ID: "chatcmpl-1",
            sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
            sc.GEN_AI_REQUEST_TEMPERATURE: 0.7,
            sc.GEN_AI_INPUT_MESSAGES: json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "Größe? 日本語 🧮"}]}],
                ensure_ascii=False,
            ),
            sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "42"}]}]
            ),
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
            sc.SPANMILL_COMPLETION_TOKEN_IDS: [17, 2, 0],
            sc.SPANMILL_COMPLETION_LOGPROBS: [-0.5, -1e-9, 0.0],
            "flags": [True, False],
            "empty": [],
            "stream": False,
            "big": 2**63 - 1,
            "small": -(2**63),
            "inf": math.inf,
        },
        "resource_attributes": {sc.SERVICE_NAME: "calculator-agent", "pid": 4},
        "scope_name": "spanmill.sdk",
        "scope_version": "0.1.0",
        "events": [
            {
                "name": sc.GEN_AI_EVALUATION_RESULT_EVENT,
                "time_unix_nano": 1_700_000_000_600_000_000,
                "attributes": {
                    sc.GEN_AI_EVALUATION_NAME: "correct",
                    sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                },
            },
            {"name": "log", "time_unix_nano": 1_700_000_000_100_000_000},
        ],
        "links": [
            {"trace_id": "a" * 32, "span_id": "b" * 16, "attributes": {"why": "retry"}},
        ],
    }
    fields.update(overrides)
    return Span(**fields)


def batch() -> list[Span]:
    root = llm_span(
        span_id="1111111111111111",
        parent_span_id=None,
        name="invoke_agent",
        kind=SpanKind.INTERNAL,
        status_code=StatusCode.UNSET,
        status_message="",
        attributes={},
        events=[],
        links=[],
    )
    other = llm_span(span_id="2222222222222222", scope_name="other", resource_attributes={})
    # Resource and scope change back and forth: decoding must keep the order anyway.
    return [root, llm_span(), other, llm_span(span_id="3333333333333333")]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip(codec: str) -> None:
    encode, decode = CODECS[codec]
    spans = batch()
    payload = encode(spans)
    assert decode(payload) == spans
    assert detect_and_decode(payload) == spans
    assert decode(encode([])) == []


@pytest.mark.parametrize("first", CODECS)
@pytest.mark.parametrize("second", CODECS)
def test_cross_format(first: str, second: str) -> None:
    spans = batch()
    via_first = CODECS[first][1](CODECS[first][0](spans))
    via_second = CODECS[second][1](CODECS[second][0](via_first))
    assert via_second == spans
    assert via_second[1].rewards[0].name == "correct"
    assert via_second[1].input_messages[0]["parts"][0]["content"] == "Größe? 日本語 🧮"


def test_single_sdk_object_and_array_forms() -> None:
    span = llm_span()
    assert decode_spans(encode_span(span)) == [span]
    array = json.dumps([json.loads(encode_span(span))]).encode()
    assert decode_spans(array) == [span]
    assert detect_and_decode(b"  \n" + array) == [span]


def test_otlp_json_wire_form() -> None:
    document = json.loads(encode_otlp_json([llm_span()]))
    span = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == TRACE  # hex, not base64
    assert span["startTimeUnixNano"] == "1700000000000000000"
    assert span["kind"] == 3 and span["status"] == {"code": 2, "message": "tool failed: ÿ"}
    values = {kv["key"]: kv["value"] for kv in span["attributes"]}
    assert values["big"] == {"intValue": "9223372036854775807"}
    assert values["inf"] == {"doubleValue": "Infinity"}
    assert values["flags"] == {
        "arrayValue": {"values": [{"boolValue": True}, {"boolValue": False}]}
    }


def test_otlp_protobuf_reads_traces_data_too() -> None:
    request = ExportTraceServiceRequest.FromString(encode_otlp_protobuf([llm_span()]))
    data = TracesData(resource_spans=request.resource_spans).SerializeToString()
    assert decode_otlp_protobuf(data) == [llm_span()]


# What the OpenTelemetry Collector's Kafka exporter writes with encoding otlp_json:
# uppercase hex is allowed, fields we do not carry are ignored, enums may be names.
COLLECTOR_OTLP_JSON = b"""{"resourceSpans":[{"resource":{"attributes":[
 {"key":"service.name","value":{"stringValue":"calculator-agent"}}],"droppedAttributesCount":0},
 "scopeSpans":[{"scope":{"name":"agent","version":"1.2"},"spans":[{
  "traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"",
  "traceState":"","flags":256,"name":"chat smollm2","kind":"SPAN_KIND_CLIENT",
  "startTimeUnixNano":"1700000000000000000","endTimeUnixNano":1700000000500000000,
  "attributes":[
   {"key":"gen_ai.operation.name","value":{"stringValue":"chat"}},
   {"key":"gen_ai.usage.input_tokens","value":{"intValue":"12"}},
   {"key":"score","value":{"doubleValue":"NaN"}},
   {"key":"payload","value":{"bytesValue":"aGk="}},
   {"key":"meta","value":{"kvlistValue":{"values":[{"key":"k","value":{"intValue":1}}]}}},
   {"key":"mixed","value":{"arrayValue":{"values":[{"intValue":"1"},{"stringValue":"a"}]}}},
   {"key":"nothing","value":{}}],
  "droppedAttributesCount":0,"events":[],"droppedEventsCount":0,"links":[],
  "droppedLinksCount":0,"status":{"code":"STATUS_CODE_OK"}}]}],
 "schemaUrl":"https://opentelemetry.io/schemas/1.26.0"}]}"""


def test_collector_otlp_json() -> None:
    (span,) = detect_and_decode(COLLECTOR_OTLP_JSON)
    assert span.trace_id == TRACE and span.parent_span_id is None
    assert span.kind is SpanKind.CLIENT and span.status_code is StatusCode.OK
    assert span.service_name == "calculator-agent" and span.scope_version == "1.2"
    attributes = span.attributes
    assert attributes["gen_ai.usage.input_tokens"] == 12
    assert math.isnan(attributes["score"])  # type: ignore[arg-type]
    assert attributes["payload"] == "aGk="
    assert json.loads(attributes["meta"]) == {"k": 1}  # type: ignore[arg-type]
    assert json.loads(attributes["mixed"]) == [1, "a"]  # type: ignore[arg-type]
    assert "nothing" not in attributes


def test_kvlist_and_bytes_from_protobuf_become_text() -> None:
    request = ExportTraceServiceRequest.FromString(encode_otlp_protobuf([llm_span()]))
    attributes = request.resource_spans[0].scope_spans[0].spans[0].attributes
    attributes.add(key="raw").value.bytes_value = b"hi"
    kv = attributes.add(key="meta").value.kvlist_value.values.add(key="k")
    kv.value.array_value.values.add().string_value = "v"
    (span,) = decode_otlp_protobuf(request.SerializeToString())
    assert span.attributes["raw"] == "aGk="
    assert json.loads(span.attributes["meta"]) == {"k": ["v"]}  # type: ignore[arg-type]


def test_sdk_exporter_output() -> None:
    from opentelemetry.exporter.otlp.proto.common import trace_encoder as encoder
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create({sc.SERVICE_NAME: "sdk-agent"}))
    tracer = provider.get_tracer("agent.scope", "9.9")
    with (
        tracer.start_as_current_span("invoke_agent") as parent,
        tracer.start_as_current_span(
            "chat", attributes={"gen_ai.usage.input_tokens": 3, "ids": [1, 2]}
        ) as child,
    ):
        child.add_event(
            "gen_ai.evaluation.result",
            {sc.GEN_AI_EVALUATION_NAME: "ok", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0},
        )
    payload = encoder.encode_spans([child, parent]).SerializeToString()
    decoded = detect_and_decode(payload, sc.CONTENT_TYPE_OTLP_PROTOBUF)
    assert [span.name for span in decoded] == ["chat", "invoke_agent"]
    assert decoded[0].parent_span_id == decoded[1].span_id
    assert decoded[0].trace_id == f"{parent.get_span_context().trace_id:032x}"
    assert decoded[0].service_name == "sdk-agent" and decoded[0].scope_name == "agent.scope"
    assert decoded[0].attributes["ids"] == [1, 2]
    assert decoded[0].rewards[0].value == 1.0


# -- property: any valid span survives every encoding --------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=30)
_scalars = st.one_of(
    _text,
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
)
_values = st.one_of(
    _scalars,
    st.lists(_text, max_size=4),
    st.lists(st.booleans(), max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=4),
)
_attributes = st.dictionaries(_text.filter(bool), _values, max_size=5)
_id = st.binary(min_size=8, max_size=8).filter(any).map(bytes.hex)
_trace_id = st.binary(min_size=16, max_size=16).filter(any).map(bytes.hex)
_nanos = st.integers(0, 2**63)
_events: st.SearchStrategy[dict[str, Any]] = st.builds(
    dict, name=_text.filter(bool), time_unix_nano=_nanos, attributes=_attributes
)
_links: st.SearchStrategy[dict[str, Any]] = st.builds(
    dict, trace_id=_trace_id, span_id=_id, attributes=_attributes
)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    start = draw(_nanos)
    return Span(
        trace_id=draw(_trace_id),
        span_id=draw(_id),
        parent_span_id=draw(st.none() | _id),
        name=draw(_text.filter(bool)),
        kind=draw(st.sampled_from(SpanKind)),
        start_time_unix_nano=start,
        end_time_unix_nano=start + draw(st.integers(0, 2**40)),
        status_code=draw(st.sampled_from(StatusCode)),
        status_message=draw(_text),
        attributes=draw(_attributes),
        resource_attributes=draw(_attributes),
        scope_name=draw(_text),
        scope_version=draw(_text),
        events=draw(st.lists(_events, max_size=2)),
        links=draw(st.lists(_links, max_size=2)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spans(), max_size=4))
def test_property_round_trip_all_encodings(generated: list[Span]) -> None:
    for encode, decode in CODECS.values():
        payload = encode(generated)
        assert decode(payload) == generated
        if generated:  # zero spans in protobuf is zero bytes, which detection refuses
            assert detect_and_decode(payload, max_bytes=2**30) == generated


# -- malformed input: reason code, and a detail naming the field ---------------------


def sdk_doc(**overrides: Any) -> dict[str, Any]:
    span = json.loads(encode_span(llm_span()))
    for key, value in overrides.items():
        if value is DELETE:
            del span[key]
        else:
            span[key] = value
    return {"spans": [span]}


def sdk(**overrides: Any) -> bytes:
    return json.dumps(sdk_doc(**overrides)).encode()


def otlp_json(edit: Callable[[dict[str, Any]], None]) -> bytes:
    document = json.loads(encode_otlp_json([llm_span()]))
    edit(document)
    return json.dumps(document).encode()


def otlp_span(document: dict[str, Any]) -> dict[str, Any]:
    span: dict[str, Any] = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    return span


def otlp_set(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        otlp_span(document)[field] = value

    return edit


def otlp_del(field: str) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        del otlp_span(document)[field]

    return edit


def otlp_attr(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        otlp_span(document)["attributes"] = [{"key": "k", "value": value}]

    return edit


def protobuf(edit: Callable[[Any], None]) -> bytes:
    request = ExportTraceServiceRequest.FromString(encode_otlp_protobuf([llm_span()]))
    edit(request.resource_spans[0].scope_spans[0].spans[0])
    return request.SerializeToString()


def protobuf_with_bad_utf8(marker: str) -> bytes:
    payload = encode_otlp_protobuf([llm_span(**{"name": "chat", **{"attributes": {marker: "v"}}})])
    assert payload.count(marker.encode()) == 1
    return payload.replace(marker.encode(), b"\xff" + marker.encode()[1:])


def set_attr(span: Any, key: str, value: str) -> None:
    span.attributes.add(key=key).value.string_value = value


DELETE = object()
BIG = "x" * (MAX_ATTRIBUTE_VALUE_BYTES + 1)

MALFORMED: list[tuple[str, bytes, str, list[str]]] = [
    # SDK JSON
    ("sdk trace_id short", sdk(trace_id="abc"), "schema", ["spans[0].trace_id", "'abc'"]),
    ("sdk trace_id non-hex", sdk(trace_id="z" * 32), "schema", ["spans[0].trace_id", "hex"]),
    ("sdk trace_id zeros", sdk(trace_id="0" * 32), "schema", ["spans[0].trace_id", "zeros"]),
    ("sdk span_id long", sdk(span_id="a" * 17), "schema", ["spans[0].span_id", "16 hex"]),
    ("sdk parent bad", sdk(parent_span_id="xyz"), "schema", ["spans[0].parent_span_id"]),
    ("sdk trace_id number", sdk(trace_id=5), "schema", ["spans[0].trace_id"]),
    ("sdk attributes list", sdk(attributes=[1]), "schema", ["spans[0].attributes", "object"]),
    (
        "sdk attribute object",
        sdk(attributes={"deep": {"a": 1}}),
        "schema",
        ["spans[0].attributes", "'deep'"],
    ),
    (
        "sdk attribute mixed array",
        sdk(attributes={"m": [1, "a"]}),
        "schema",
        ["spans[0].attributes", "'m'"],
    ),
    (
        "sdk start not a number",
        sdk(start_time_unix_nano="soon"),
        "schema",
        ["spans[0].start_time_unix_nano", "'soon'"],
    ),
    (
        "sdk start negative",
        sdk(start_time_unix_nano=-5),
        "schema",
        ["spans[0].start_time_unix_nano"],
    ),
    ("sdk name number", sdk(name=42), "schema", ["spans[0].name", "string"]),
    ("sdk name empty", sdk(name=""), "schema", ["spans[0].name", "empty"]),
    ("sdk no trace_id", sdk(trace_id=DELETE), "schema", ["spans[0].trace_id", "missing"]),
    ("sdk no name", sdk(name=DELETE), "schema", ["spans[0].name", "missing"]),
    (
        "sdk end before start",
        sdk(end_time_unix_nano=1),
        "schema",
        ["spans[0].end_time_unix_nano", "before start_time_unix_nano"],
    ),
    ("sdk unknown field", sdk(atributes={}), "schema", ["spans[0].atributes", "not a known"]),
    ("sdk kind", sdk(kind="sideways"), "schema", ["spans[0].kind"]),
    ("sdk status", sdk(status_code="great"), "schema", ["spans[0].status_code"]),
    (
        "sdk event time",
        sdk(events=[{"name": "e"}]),
        "schema",
        ["spans[0].events[0].time_unix_nano", "missing"],
    ),
    (
        "sdk link id",
        sdk(links=[{"trace_id": "1", "span_id": "b" * 16}]),
        "schema",
        ["spans[0].links[0].trace_id"],
    ),
    ("sdk spans not array", b'{"spans": {}}', "schema", ["spans", "array"]),
    ("sdk span not object", b'{"spans": [1]}', "schema", ["spans[0]", "span object"]),
    ("sdk batch extra key", b'{"spans": [], "x": 1}', "schema", ["x"]),
    (
        "sdk single bad",
        json.dumps({**sdk_doc()["spans"][0], "name": 1}).encode(),
        "schema",
        ["name", "string"],
    ),
    (
        "sdk oversize attribute",
        sdk(attributes={"huge": BIG}),
        "oversize",
        ["spans[0].attributes", "'huge'", "bytes"],
    ),
    (
        "json invalid utf-8",
        b'{"spans": [{"name": "\xff"}]}',
        "invalid_utf8",
        ["0xff", "offset 21", "line 1"],
    ),
    (
        "json lone surrogate",
        sdk(name="\\ud800").replace(b"\\\\ud800", b"\\ud800"),
        "invalid_utf8",
        ["spans[0].name", "surrogate"],
    ),
    ("bad json", b'{"spans": [', "bad_json", ["line 1", "column"]),
    ("bad json trailing", b'{"spans": []} x', "bad_json", ["Extra data"]),
    ("text not json", b"hello", "bad_json", ["'hello'"]),
    ("empty", b"", "empty", ["empty"]),
    # OTLP/JSON
    (
        "otlp traceId",
        otlp_json(otlp_set("traceId", "xyz")),
        "schema",
        ["resourceSpans[0].scopeSpans[0].spans[0].traceId", "'xyz'"],
    ),
    ("otlp spanId zeros", otlp_json(otlp_set("spanId", "0" * 16)), "schema", ["spans[0].spanId"]),
    ("otlp no traceId", otlp_json(otlp_del("traceId")), "schema", ["spans[0].traceId", "missing"]),
    ("otlp no name", otlp_json(otlp_del("name")), "schema", ["spans[0].name", "missing"]),
    ("otlp name number", otlp_json(otlp_set("name", 7)), "schema", ["spans[0].name"]),
    (
        "otlp start string",
        otlp_json(otlp_set("startTimeUnixNano", "later")),
        "schema",
        ["spans[0].startTimeUnixNano", "'later'"],
    ),
    (
        "otlp end before start",
        otlp_json(otlp_set("endTimeUnixNano", "1")),
        "schema",
        ["spans[0].endTimeUnixNano"],
    ),
    ("otlp kind", otlp_json(otlp_set("kind", 9)), "schema", ["spans[0].kind"]),
    (
        "otlp status code",
        otlp_json(otlp_set("status", {"code": 7})),
        "schema",
        ["spans[0].status.code"],
    ),
    (
        "otlp attributes object",
        otlp_json(otlp_set("attributes", {"a": 1})),
        "schema",
        ["spans[0].attributes", "array"],
    ),
    (
        "otlp attribute no key",
        otlp_json(otlp_set("attributes", [{"value": {}}])),
        "schema",
        ["spans[0].attributes[0]", "'key'"],
    ),
    (
        "otlp intValue",
        otlp_json(otlp_attr({"intValue": "1.5"})),
        "schema",
        ["spans[0].attributes[0].value.intValue", "'1.5'"],
    ),
    (
        "otlp intValue range",
        otlp_json(otlp_attr({"intValue": str(2**64)})),
        "schema",
        ["attributes[0].value.intValue"],
    ),
    (
        "otlp stringValue",
        otlp_json(otlp_attr({"stringValue": 1})),
        "schema",
        ["attributes[0].value.stringValue"],
    ),
    (
        "otlp unknown value",
        otlp_json(otlp_attr({"fooValue": 1})),
        "schema",
        ["attributes[0].value.fooValue", "not an AnyValue"],
    ),
    (
        "otlp two values",
        otlp_json(otlp_attr({"intValue": 1, "boolValue": True})),
        "schema",
        ["attributes[0].value", "exactly one"],
    ),
    (
        "otlp nested bad",
        otlp_json(otlp_attr({"arrayValue": {"values": [{"boolValue": 1}]}})),
        "schema",
        ["attributes[0].value.arrayValue.values[0].boolValue"],
    ),
    (
        "otlp bytes",
        otlp_json(otlp_attr({"bytesValue": "!!"})),
        "schema",
        ["attributes[0].value.bytesValue", "base64"],
    ),
    (
        "otlp oversize attribute",
        otlp_json(otlp_attr({"stringValue": BIG})),
        "oversize",
        ["spans[0].attributes", "'k'"],
    ),
    (
        "otlp event time",
        otlp_json(otlp_set("events", [{"name": "e", "timeUnixNano": "x"}])),
        "schema",
        ["spans[0].events[0].timeUnixNano"],
    ),
    (
        "otlp link id",
        otlp_json(otlp_set("links", [{"traceId": "1", "spanId": "b" * 16}])),
        "schema",
        ["spans[0].links[0].traceId"],
    ),
    (
        "otlp resource attrs",
        otlp_json(lambda d: d["resourceSpans"][0]["resource"].update(attributes=[{"key": 1}])),
        "schema",
        ["resourceSpans[0].resource.attributes[0]"],
    ),
    (
        "otlp scope name",
        otlp_json(lambda d: d["resourceSpans"][0]["scopeSpans"][0]["scope"].update(name=1)),
        "schema",
        ["resourceSpans[0].scopeSpans[0].scope.name"],
    ),
    ("otlp resourceSpans object", b'{"resourceSpans": {}}', "schema", ["resourceSpans", "array"]),
    (
        "otlp span not object",
        b'{"resourceSpans": [{"scopeSpans": [{"spans": ["x"]}]}]}',
        "schema",
        ["resourceSpans[0].scopeSpans[0].spans[0]", "span object"],
    ),
    # OTLP protobuf
    ("pb garbage", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "bad_protobuf", ["varint"]),
    (
        "pb truncated",
        encode_otlp_protobuf([llm_span()])[:-7],
        "bad_protobuf",
        ["resource_spans[0]", "truncated"],
    ),
    ("pb wrong wire type", b"\x08\x01", "bad_protobuf", ["resource_spans[0]", "wire type"]),
    (
        "pb invalid utf-8 key",
        protobuf_with_bad_utf8("marker-key"),
        "invalid_utf8",
        ["resource_spans[0].scope_spans[0].spans[0].attributes[0].key", "0xff"],
    ),
    (
        "pb trace_id length",
        protobuf(lambda s: setattr(s, "trace_id", b"\x01" * 15)),
        "schema",
        ["resource_spans[0].scope_spans[0].spans[0].trace_id", "32 hex"],
    ),
    (
        "pb no trace_id",
        protobuf(lambda s: s.ClearField("trace_id")),
        "schema",
        ["spans[0].trace_id"],
    ),
    (
        "pb zero span_id",
        protobuf(lambda s: setattr(s, "span_id", b"\x00" * 8)),
        "schema",
        ["spans[0].span_id", "zeros"],
    ),
    ("pb no name", protobuf(lambda s: s.ClearField("name")), "schema", ["spans[0].name", "empty"]),
    (
        "pb end before start",
        protobuf(lambda s: setattr(s, "end_time_unix_nano", 3)),
        "schema",
        ["spans[0].end_time_unix_nano"],
    ),
    ("pb kind", protobuf(lambda s: setattr(s, "kind", 42)), "schema", ["spans[0].kind"]),
    (
        "pb status",
        protobuf(lambda s: setattr(s.status, "code", 9)),
        "schema",
        ["spans[0].status.code"],
    ),
    (
        "pb oversize attribute",
        protobuf(lambda s: set_attr(s, "huge", BIG)),
        "oversize",
        ["spans[0].attributes", "'huge'"],
    ),
]


@pytest.mark.parametrize(
    ("payload", "reason", "fragments"),
    [
        pytest.param(payload, reason, fragments, id=name)
        for name, payload, reason, fragments in MALFORMED
    ],
)
def test_malformed_input(payload: bytes, reason: str, fragments: list[str]) -> None:
    with pytest.raises(SpanDecodeError) as caught:
        detect_and_decode(payload, max_bytes=4 * MAX_ATTRIBUTE_VALUE_BYTES)
    error = caught.value
    assert error.reason == reason, error.detail
    for fragment in fragments:
        assert fragment in error.detail, error.detail


def test_invalid_utf8_in_protobuf_string_names_the_field() -> None:
    payload = encode_otlp_protobuf([llm_span(name="chat-marker")])
    bad = payload.replace(b"chat-marker", b"chat\xc3marker")
    with pytest.raises(SpanDecodeError) as caught:
        decode_otlp_protobuf(bad)
    assert caught.value.reason == "invalid_utf8"
    assert "resource_spans[0].scope_spans[0].spans[0].name" in caught.value.detail


def test_oversize_payload_is_refused_before_parsing() -> None:
    payload = encode_spans([llm_span()])
    with pytest.raises(SpanDecodeError) as caught:
        detect_and_decode(payload, max_bytes=len(payload) - 1)
    assert caught.value.reason == "oversize"
    assert f"{len(payload)} bytes" in caught.value.detail
    assert detect_and_decode(payload, max_bytes=len(payload)) == [llm_span()]


@pytest.mark.parametrize(
    ("content_type", "encode"),
    [
        ("application/x-protobuf", encode_otlp_protobuf),
        ("application/json", encode_otlp_json),
        ("application/json", encode_spans),
        (sc.CONTENT_TYPE_OTLP_JSON, encode_otlp_json),
        (sc.CONTENT_TYPE_SDK_JSON, encode_spans),
        ('Application/JSON; charset=utf-8; spanmill-format="SDK"', encode_spans),
    ],
)
def test_content_type_selects_the_decoder(content_type: str, encode: Encode) -> None:
    assert detect_and_decode(encode([llm_span()]), content_type) == [llm_span()]


@pytest.mark.parametrize(
    ("content_type", "payload", "reason", "fragment"),
    [
        ("text/plain", b"{}", "unsupported_content_type", "'text/plain'"),
        ("application/json; spanmill-format=xml", b"{}", "unsupported_content_type", "xml"),
        ("application/x-protobuf", b'{"spans": []}', "bad_protobuf", "looks like JSON"),
        (sc.CONTENT_TYPE_SDK_JSON, b'{"resourceSpans": []}', "schema", "resourceSpans"),
        (sc.CONTENT_TYPE_OTLP_JSON, b'{"spans": []}', "schema", "has no resourceSpans"),
        (sc.CONTENT_TYPE_SDK_JSON, b'"span"', "schema", "document"),
    ],
)
def test_content_type_mismatch(
    content_type: str, payload: bytes, reason: str, fragment: str
) -> None:
    with pytest.raises(SpanDecodeError) as caught:
        detect_and_decode(payload, content_type)
    assert caught.value.reason == reason
    assert fragment in caught.value.detail


def test_empty_envelopes_are_empty_batches() -> None:
    assert detect_and_decode(b"{}", sc.CONTENT_TYPE_OTLP_JSON) == []
    assert detect_and_decode(b'{"resourceSpans": []}') == []
    assert detect_and_decode(b'{"spans": []}') == []
    assert decode_otlp_protobuf(b"") == []


def test_protobuf_of_unknown_fields_only_is_refused() -> None:
    with pytest.raises(SpanDecodeError, match="no resource_spans"):
        decode_otlp_protobuf(b"\x20\x01")  # field 4, a varint: valid wire, not a trace


def test_format_from_content_type() -> None:
    assert format_from_content_type("application/json") is None
    assert format_from_content_type(sc.CONTENT_TYPE_SDK_JSON) == "sdk_json"


def test_protobuf_starting_like_json_is_still_read() -> None:
    # A first ResourceSpans of exactly 123 bytes encodes as b"\n{...": sniffing must cope.
    for size in range(1, 200):
        spans = [
            llm_span(
                name="n" * size,
                attributes={},
                events=[],
                links=[],
                resource_attributes={},
                scope_name="",
                scope_version="",
            )
        ]
        payload = encode_otlp_protobuf(spans)
        if payload.startswith(b"\n{"):
            assert detect_and_decode(payload) == spans
            return
    pytest.fail("no payload of the wanted shape was produced")


def test_decoders_do_not_mutate_or_share_documents() -> None:
    document = sdk_doc()
    before = copy.deepcopy(document)
    (span,) = decode_spans(json.dumps(document).encode())
    assert document == before and span.attributes is not document["spans"][0]["attributes"]


# -- fuzzing: whatever arrives, the answer is spans or a SpanDecodeError -------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


def decodes_or_refuses(payload: bytes) -> None:
    # The collector's contract: spans, or a SpanDecodeError for the dead-letter topic.
    try:
        detect_and_decode(payload)
    except SpanDecodeError as exc:
        assert exc.reason in REASONS and exc.detail


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_bytes_never_crash(payload: bytes) -> None:
    decodes_or_refuses(payload)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["sdk_json", "otlp_json", "otlp_protobuf"]), st.data())
def test_fuzz_corrupted_payloads_never_crash(codec: str, data: st.DataObject) -> None:
    payload = bytearray(CODECS[codec][0]([llm_span()]))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    decodes_or_refuses(bytes(payload))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        ["traceId", "name", "kind", "status", "attributes", "events", "links", "startTimeUnixNano"]
    ),
    _json,
)
def test_fuzz_otlp_json_fields_never_crash(field: str, value: Any) -> None:
    decodes_or_refuses(otlp_json(otlp_set(field, value)))
    decodes_or_refuses(otlp_json(otlp_attr(value)))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        [
            "trace_id",
            "name",
            "kind",
            "attributes",
            "events",
            "links",
            "start_time_unix_nano",
            "status_code",
        ]
    ),
    _json,
)
def test_fuzz_sdk_json_fields_never_crash(field: str, value: Any) -> None:
    decodes_or_refuses(sdk(**{field: value}))
