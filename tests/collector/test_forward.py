"""The receiver forwards an OTLP protobuf request split by trace, its spans' bytes kept."""

from __future__ import annotations

from typing import Any

import pytest
from collector_helpers import llm_span
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from spanmill import semconv as sc
from spanmill.collector import forward
from spanmill.collector.app import create_app
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver
from spanmill.spans import Span, detect_and_decode, encode_otlp_protobuf

PRODUCER = "key-7"


def _attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _request(traces: list[int]) -> ExportTraceServiceRequest:
    """Two resources (one claiming to be another producer, one with no resource at
    all), three scopes, spans of the given traces dealt round them in turn."""
    request = ExportTraceServiceRequest()
    first = request.resource_spans.add(schema_url="https://example.org/schema/1")
    first.resource.attributes.extend(
        [_attribute(sc.SERVICE_NAME, "agent"), _attribute(sc.SPANMILL_PRODUCER, "someone-else")]
    )
    second = request.resource_spans.add()  # no resource
    scopes = [
        first.scope_spans.add(schema_url="s1"),
        first.scope_spans.add(),
        second.scope_spans.add(),
    ]
    scopes[0].scope.name, scopes[0].scope.version = "sdk", "1.0"
    scopes[2].scope.name = "other"
    for i, trace in enumerate(traces):
        span = scopes[i % 3].spans.add(
            trace_id=trace.to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"),
            name=f"step {i}", kind=PbSpan.SPAN_KIND_CLIENT,
            start_time_unix_nano=1_750_000_000_000_000_000 + i,
            end_time_unix_nano=1_750_000_000_000_000_100 + i, flags=0x101,
        )  # fmt: skip
        span.attributes.extend([_attribute("n", str(i))])
    return request


def _stamped(spans: list[Span]) -> list[Span]:
    return [
        s.model_copy(update={"resource_attributes": {**s.resource_attributes,
                                                     sc.SPANMILL_PRODUCER: PRODUCER}})
        for s in spans
    ]  # fmt: skip


def _key(span: Span) -> tuple[str, str]:
    return (span.trace_id, span.span_id)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=12))
def test_each_trace_is_the_request_s_spans_of_it_with_the_producer_stamped(
    traces: list[int],
) -> None:
    payload = _request(traces).SerializeToString()
    wire = forward.split(payload, sc.SPANMILL_PRODUCER, PRODUCER)
    expected = sorted(_stamped(detect_and_decode(payload)), key=_key)
    got: list[Span] = []
    for trace_id, spans in wire.traces().items():
        decoded = detect_and_decode(wire.encode(spans))
        assert {s.trace_id for s in decoded} == {trace_id}
        got += decoded
        # Every span's bytes are the request's own, not written again.
        assert all(span.data in payload for span in spans)
    assert sorted(got, key=_key) == expected
    # Nobody speaks for another producer: one value, ours, on every resource.
    assert {s.resource_attributes[sc.SPANMILL_PRODUCER] for s in got} == {PRODUCER}
    assert {s.resource_attributes.get(sc.SERVICE_NAME) for s in got} <= {"agent", None}


def test_the_frame_around_the_spans_is_kept() -> None:
    payload = _request([1, 1, 1]).SerializeToString()
    wire = forward.split(payload, sc.SPANMILL_PRODUCER, PRODUCER)
    (spans,) = wire.traces().values()
    again = ExportTraceServiceRequest.FromString(wire.encode(spans))
    assert [rs.schema_url for rs in again.resource_spans] == ["https://example.org/schema/1", ""]
    assert [(ss.scope.name, ss.scope.version, ss.schema_url)
            for rs in again.resource_spans for ss in rs.scope_spans] == [
        ("sdk", "1.0", "s1"), ("", "", ""), ("other", "", "")]  # fmt: skip
    assert [s.flags for rs in again.resource_spans for ss in rs.scope_spans for s in ss.spans] == [
        0x101
    ] * 3
    # Half the spans make a request of their own, in their own frames.
    part = ExportTraceServiceRequest.FromString(wire.encode(spans[:1]))
    assert [len(ss.spans) for rs in part.resource_spans for ss in rs.scope_spans] == [1]


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a\x05\x12\x03\x12",  # a span cut short
        b"\x12\x00",  # not a resource spans field
        b"\x0a\x04\x12\x02\x12\x00",  # a span with no trace id
        b"\x0b",  # a wire type protobuf does not have
    ],
)
def test_wire_bytes_that_cannot_be_framed_raise(payload: bytes) -> None:
    with pytest.raises(ValueError):
        forward.split(payload, sc.SPANMILL_PRODUCER, PRODUCER)


class KeptProducer:
    """Sends kept in memory, each acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def send(self, topic: str, key: bytes, value: bytes, headers: Any) -> Any:
        self.sent.append((key, value))

        class Done:
            def get(self, timeout: float) -> None:
                return None

        return Done()


def _post(producer: KeptProducer, body: bytes, max_bytes: int, media: str) -> Any:
    metrics = CollectorMetrics()
    client = TestClient(
        create_app(object(), metrics, OtlpReceiver(producer, "t", metrics, max_bytes))
    )
    return client.post("/v1/traces", content=body, headers={"content-type": media})


def test_the_receiver_forwards_protobuf_as_it_came_and_json_encoded_again() -> None:
    spans = [llm_span(i, trace_id=("a" if i % 2 else "b") * 32) for i in range(40)]
    body = encode_otlp_protobuf(spans)
    producer = KeptProducer()
    reply = _post(producer, body, 4 * len(body), "application/x-protobuf")
    assert reply.status_code == 200
    # One trace that, the producer stamped on it, is just over the limit the request is
    # under: its spans are halved over two records.
    one_trace = [s.model_copy(update={"trace_id": "c" * 32}) for s in spans]
    whole = encode_otlp_protobuf(one_trace)
    small = KeptProducer()
    assert _post(small, whole, len(whole) + 4, "application/x-protobuf").status_code == 200
    for sent, sending in ((producer.sent, spans), (small.sent, one_trace)):
        got = [s for _, value in sent for s in detect_and_decode(value)]
        assert sorted(got, key=_key) == sorted(
            [s.model_copy(update={"resource_attributes": {
                **s.resource_attributes, sc.SPANMILL_PRODUCER: "anonymous"}}) for s in sending],
            key=_key,
        )  # fmt: skip
        assert all(key.decode() == detect_and_decode(value)[0].trace_id for key, value in sent)
    assert len(producer.sent) == 2 and len(small.sent) == 2
    assert all(len(value) <= len(whole) + 4 for _, value in small.sent)
    # Forwarded: each span's bytes as the sender wrote them, fields spanmill's own
    # encoder would not write (the W3C flags) included.
    request = _request([1, 2, 1, 3])
    sent = KeptProducer()
    assert (
        _post(sent, request.SerializeToString(), 1 << 20, "application/x-protobuf").status_code
        == 200
    )
    originals = [s.SerializeToString() for rs in request.resource_spans
                 for ss in rs.scope_spans for s in ss.spans]  # fmt: skip
    assert len(sent.sent) == 3
    assert all(any(o in value for _, value in sent.sent) for o in originals)
    # JSON takes the authority and is written as protobuf: the same spans.
    from spanmill.spans import encode_otlp_json

    kept = KeptProducer()
    assert _post(kept, encode_otlp_json(spans), 4 * len(body), "application/json").json() == {}
    assert sorted((s for _, v in kept.sent for s in detect_and_decode(v)), key=_key) == sorted(
        (s for _, v in producer.sent for s in detect_and_decode(v)), key=_key
    )


def test_a_span_too_large_once_stamped_is_refused_by_name() -> None:
    (span,) = [llm_span(1, trace_id="d" * 32)]
    body = encode_otlp_protobuf([span])
    reply = _post(KeptProducer(), body, len(body) + 2, "application/x-protobuf")
    assert reply.status_code == 413
    assert f"span {span.span_id} of trace {'d' * 32}".encode() in reply.content
