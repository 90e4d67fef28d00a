"""Producer keys on the collector's OTLP receiver (no services: a recording producer)."""

from __future__ import annotations

from pathlib import Path

from collector_helpers import llm_span
from fastapi.testclient import TestClient
from test_receiver_feedback import TRACE, Health, RecordingProducer

from spanmill import semconv as sc
from spanmill.collector.app import create_app
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver
from spanmill.keys import KeyRing, key_line, new_key
from spanmill.spans import encode_otlp_protobuf

PROTOBUF = {"content-type": "application/x-protobuf"}


def client_for(producer: RecordingProducer, keys: KeyRing | None) -> TestClient:
    metrics = CollectorMetrics()
    receiver = OtlpReceiver(producer, "t", metrics, 1 << 20)
    return TestClient(create_app(Health(), metrics, receiver, keys=keys))


def test_the_receiver_takes_known_producers_and_stores_who_sent_each_span(
    tmp_path: Path,
) -> None:
    agent = new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(key_line("support-agent", agent) + "\n")
    producer = RecordingProducer()
    # A span that claims a producer of its own: the receiver's word replaces it.
    forged = llm_span(1, trace_id=TRACE)
    forged = forged.model_copy(update={"resource_attributes": {
        **forged.resource_attributes, sc.SPANMILL_PRODUCER: "gateway"}})  # fmt: skip
    body = encode_otlp_protobuf([forged])
    with client_for(producer, KeyRing(keys_file)) as client:
        assert client.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 401
        wrong = {**PROTOBUF, "authorization": f"Bearer {new_key()}"}
        assert client.post("/v1/traces", content=body, headers=wrong).status_code == 401
        feedback = {"trace_id": TRACE, "name": "thumbs", "value": 1}
        assert client.post("/v1/feedback", json=feedback).status_code == 401
        assert producer.sent == []
        known = {**PROTOBUF, "authorization": f"Bearer {agent}"}
        assert client.post("/v1/traces", content=body, headers=known).status_code == 200
        assert client.post("/v1/feedback", json=feedback,
                           headers={"authorization": f"Bearer {agent}"}).is_success  # fmt: skip
    (_, span), (_, reward) = producer.sent
    assert span.resource_attributes[sc.SPANMILL_PRODUCER] == "support-agent"
    assert reward.attributes[sc.SPANMILL_FEEDBACK_PRINCIPAL] == "support-agent"
    assert reward.resource_attributes[sc.SPANMILL_PRODUCER] == "support-agent"


def test_without_keys_the_receiver_takes_any_caller_as_anonymous() -> None:
    producer = RecordingProducer()
    with client_for(producer, None) as client:
        body = encode_otlp_protobuf([llm_span(1, trace_id=TRACE)])
        assert client.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    assert producer.sent[0][1].resource_attributes[sc.SPANMILL_PRODUCER] == "anonymous"


def test_a_caller_without_a_key_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    """A chunked body is read whole (up to the limit) before a route runs: without a key
    checked first, anyone could make the collector hold 4 MiB a connection for a 401."""
    from test_receiver import _post_in_pieces

    keys_file = tmp_path / "keys"
    keys_file.write_text(key_line("support-agent", new_key()) + "\n")
    metrics = CollectorMetrics()
    receiver = OtlpReceiver(RecordingProducer(), "t", metrics, 1 << 20)
    app = create_app(Health(), metrics, receiver, keys=KeyRing(keys_file))
    for path in ("/v1/traces", "/v1/feedback"):
        assert _post_in_pieces(app, path, "application/json", 1 << 30) == (401, 0)
