"""POST /v1/feedback on the collector's OTLP receiver: the gateway's wire format and replies."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest
from collector_helpers import Topics
from fastapi.testclient import TestClient
from kafka.errors import KafkaTimeoutError

from spanmill import semconv as sc
from spanmill.collector.app import create_app
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver
from spanmill.feedback import MAX_BODY_BYTES
from spanmill.spans import Span, decode_otlp_protobuf, detect_and_decode

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENTINEL = b"end-of-test"


class Health:
    alive = True
    ready = True


class Acked:
    def __init__(self, failure: Exception | None = None) -> None:
        self.failure = failure

    def get(self, timeout: float) -> object:
        if self.failure is not None:
            raise self.failure
        return "metadata"


class RecordingProducer:
    """Keeps what is sent; refuses or leaves unacknowledged the sends it is told to."""

    def __init__(self, refuse: bool = False, nack: frozenset[int] = frozenset()) -> None:
        self.sent: list[tuple[bytes, Span]] = []
        self.refuse = refuse
        self.nack = nack

    def send(self, topic: str, key: bytes, value: bytes, headers: Any) -> Acked:
        if self.refuse:
            raise KafkaTimeoutError("buffer full")
        number = len(self.sent)
        self.sent.extend((key, span) for span in decode_otlp_protobuf(value))
        return Acked(KafkaTimeoutError("no ack") if number in self.nack else None)


def client_for(producer: Any, topic: str = "t") -> TestClient:
    metrics = CollectorMetrics()
    receiver = OtlpReceiver(producer, topic, metrics, 1 << 20)
    return TestClient(create_app(Health(), metrics, receiver))


def test_bad_bodies_name_the_field() -> None:
    producer = RecordingProducer()
    client = client_for(producer)
    good = {"trace_id": TRACE, "name": "thumbs", "value": 1}
    for body, param in [
        ({"trace_id": TRACE, "value": 1}, "name"),
        ({**good, "value": "yes"}, "value"),
        ({"name": "thumbs", "value": 1}, "response_id"),
        ({**good, "trace_id": "g" * 32}, "trace_id"),
        ([good, good, {**good, "value": []}], "[2].value"),
    ]:
        reply = client.post("/v1/feedback", json=body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
        assert reply.headers["content-type"] == "application/json"
    too_big = client.post(
        "/v1/feedback",
        content=b"[]",
        headers={"content-length": str(MAX_BODY_BYTES + 1), "content-type": "application/json"},
    )
    assert too_big.status_code == 413
    assert producer.sent == []


def test_feedback_is_keyed_by_its_trace_and_answered_after_the_acks() -> None:
    producer = RecordingProducer()
    client = client_for(producer)
    batch = [
        {"trace_id": TRACE, "name": "resolved", "value": True, "source": "tickets"},
        {"response_id": "resp_9", "name": "thumbs", "value": -1, "comment": "no"},
    ]
    reply = client.post("/v1/feedback", json=batch)
    assert reply.status_code == 200 and reply.json()["accepted"] == 2
    assert reply.json()["ids"] == [span.span_id for _, span in producer.sent]
    (key, resolved), (_, thumbs) = producer.sent
    assert key == TRACE.encode() and resolved.trace_id == TRACE
    assert resolved.attributes[sc.SPANMILL_FEEDBACK_SOURCE] == "tickets"
    assert thumbs.rewards[0].response_id == "resp_9" and thumbs.rewards[0].value == -1.0
    for _, span in producer.sent:
        assert span.attributes[sc.SPANMILL_FEEDBACK_PRINCIPAL] == "anonymous"
        assert span.attributes[sc.CLIENT_ADDRESS] == "testclient"
        assert span.service_name == "spanmill-collector"
        assert span.scope_name == sc.FEEDBACK_SCOPE


def test_503_with_retry_after_when_kafka_does_not_take_or_acknowledge() -> None:
    body = [{"trace_id": TRACE, "name": "n", "value": i} for i in range(3)]
    refused = client_for(RecordingProducer(refuse=True)).post("/v1/feedback", json=body)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["delivered"] == []
    partial = client_for(RecordingProducer(nack=frozenset({1}))).post("/v1/feedback", json=body)
    assert partial.status_code == 503 and partial.json()["delivered"] == [0, 2]
    assert "1 of 3" in partial.json()["error"]["message"]


@pytest.mark.services
def test_feedback_through_the_receiver_is_on_the_topic_once(topics: Topics) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=[topics.bootstrap], acks="all", linger_ms=5)
    client = client_for(producer, topics.spans)
    items = [
        {"trace_id": f"{i + 1:032x}", "name": "thumbs", "value": i % 2 == 0, "comment": f"fb-{i}"}
        for i in range(300)
    ]
    for item in items[:200]:
        assert client.post("/v1/feedback", json=item).status_code == 200
    for start in range(200, 300, 50):
        reply = client.post("/v1/feedback", json=items[start : start + 50])
        assert reply.status_code == 200 and reply.json()["accepted"] == 50
    for partition in range(3):
        producer.send(topics.spans, value=SENTINEL, partition=partition)
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(
        topics.spans,
        bootstrap_servers=[topics.bootstrap],
        group_id=f"read-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
    )
    found: list[tuple[bytes, Span]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    while len(ended) < 3 and time.monotonic() < deadline:
        for part, records in consumer.poll(timeout_ms=500).items():
            for record in records:
                if record.value == SENTINEL:
                    ended.add(part.partition)
                else:
                    found.extend((record.key, span) for span in detect_and_decode(record.value))
    consumer.close()
    assert len(ended) == 3, "not every partition's end was read"
    markers = Counter(span.attributes[sc.GEN_AI_EVALUATION_EXPLANATION] for _, span in found)
    assert set(markers) == {item["comment"] for item in items}
    assert set(markers.values()) == {1}
    assert all(key == span.trace_id.encode() for key, span in found)
