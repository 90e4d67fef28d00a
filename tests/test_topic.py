"""The span topic's one writer (spanmill.topic): the record shape every writer sends, the
halving of a trace too large for one record, and that no other module makes a span
producer."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from spanmill import semconv as sc
from spanmill import topic
from spanmill.config import KafkaSettings
from spanmill.spans import Span, decode_otlp_protobuf, encode_otlp_protobuf

SRC = Path(__file__).resolve().parents[1] / "src" / "spanmill"


def _span(trace_id: str, index: int, size: int = 10) -> Span:
    return Span(
        trace_id=trace_id,
        span_id=f"{index + 1:016x}",
        name="chat",
        start_time_unix_nano=1_700_000_000_000_000_000 + index,
        end_time_unix_nano=1_700_000_000_000_000_100 + index,
        attributes={"payload": "x" * size},
    )


def test_fit_halves_a_trace_until_each_record_fits_and_hands_back_a_span_alone_over() -> None:
    trace = "ab" * 16
    spans = [_span(trace, i, size=300) for i in range(8)]
    one = len(encode_otlp_protobuf(spans[:1]))
    limit = one * 3  # two or three spans a record, never eight
    payloads, over = topic.fit(spans, encode_otlp_protobuf, limit)
    assert over == []
    assert all(len(payload) <= limit for payload, _ in payloads)
    assert len(payloads) > 1
    assert sum(count for _, count in payloads) == 8
    decoded = [s.span_id for payload, _ in payloads for s in decode_otlp_protobuf(payload)]
    assert decoded == [s.span_id for s in spans]  # every span once, in order

    huge = _span(trace, 9, size=limit * 2)
    payloads, over = topic.fit([*spans[:2], huge], encode_otlp_protobuf, limit)
    assert [s.span_id for s in over] == [huge.span_id]
    assert sum(count for _, count in payloads) == 2
    assert topic.fit([], encode_otlp_protobuf, limit) == ([], [])


def test_trace_key_is_32_lowercase_hex_whatever_the_id_form() -> None:
    assert topic.trace_key(0xAB) == b"0" * 30 + b"ab"
    assert topic.trace_key("AB" * 16) == b"ab" * 16


def test_one_place_makes_a_span_producer() -> None:
    """``KafkaProducer(`` appears in spanmill.topic and in the collector's dead-letter
    producer (which writes the DLQ topic, never spans), nowhere else."""
    makers = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if re.search(r"\bKafkaProducer\(", path.read_text())
    )
    assert makers == ["collector/loop.py", "topic.py"]
    for writer in ("sdk/exporter.py", "gateway/emitter.py", "collector/run.py"):
        assert "span_producer(" in (SRC / writer).read_text(), writer


@pytest.mark.services
def test_a_record_on_the_topic_is_keyed_by_trace_typed_and_lz4_compressed(kafka) -> None:
    from kafka import KafkaConsumer

    name = kafka.create_topic(f"topic-shape-{uuid.uuid4().hex[:8]}")
    settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=name)
    producer = topic.span_producer(settings, "test-topic", delivery_timeout_s=10)
    assert producer.config["compression_type"] == "lz4"
    assert producer.config["enable_idempotence"] is True
    assert producer.config["acks"] == -1  # all in-sync replicas
    trace = "CD" * 16
    spans = [_span(trace.lower(), i, size=2000) for i in range(3)]
    topic.send(producer, name, trace, encode_otlp_protobuf(spans)).get(timeout=10)
    producer.close(timeout=5)

    consumer = KafkaConsumer(
        name,
        bootstrap_servers=kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    records = [next(iter(consumer))]
    consumer.close()
    record = records[0]
    assert record.key == b"cd" * 16
    assert dict(record.headers) == {sc.CONTENT_TYPE_HEADER: sc.CONTENT_TYPE_OTLP_PROTOBUF.encode()}
    assert [s.span_id for s in decode_otlp_protobuf(record.value)] == [s.span_id for s in spans]


def test_a_topics_partitions_are_asked_within_a_bound() -> None:
    """kafka-python waits for metadata without a bound where no broker answers: the
    question gives up, and a failure is the caller's to see."""
    import threading

    import pytest
    from kafka.errors import KafkaTimeoutError

    from spanmill.topic import partitions_of

    never = threading.Event()

    class Lost:
        def partitions_for_topic(self, topic: str) -> set[int]:
            never.wait()
            return {0}

    class Known:
        def partitions_for_topic(self, topic: str) -> set[int] | None:
            return {0, 1, 2} if topic == "spans" else None

    class Failing:
        def partitions_for_topic(self, topic: str) -> set[int]:
            raise KafkaTimeoutError("no broker")

    assert partitions_of(Lost(), "spans", timeout_s=0.5) is None
    assert partitions_of(Known(), "spans") == {0, 1, 2}
    assert partitions_of(Known(), "other") == set()
    with pytest.raises(KafkaTimeoutError):
        partitions_of(Failing(), "spans")
