"""OTLP/HTTP into the topic, one message per trace; and the whole service end to end."""

from __future__ import annotations

import gzip
import signal
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from collector_helpers import Topics, collector_process, llm_span, ready, wait_for
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanmill import semconv as sc
from spanmill.collector.app import create_app
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.receiver import OtlpReceiver
from spanmill.spans import decode_otlp_protobuf, encode_otlp_json, encode_otlp_protobuf
from spanmill.stack.ports import free_port
from spanmill.store import SpanStore


class Health:
    alive = True
    ready = False


def _client(producer: Any, topic: str = "t", max_bytes: int = 1024 * 1024) -> TestClient:
    metrics = CollectorMetrics()
    return TestClient(
        create_app(Health(), metrics, OtlpReceiver(producer, topic, metrics, max_bytes))
    )


def received(sent: list[Any]) -> list[Any]:
    """Spans as the receiver stores them: with who sent them, here an anonymous producer
    (no key is asked)."""
    return [
        s.model_copy(update={"resource_attributes": {**s.resource_attributes,
                                                     sc.SPANMILL_PRODUCER: "anonymous"}})
        for s in sent
    ]  # fmt: skip


def _read(bootstrap: str, topic: str, count: int) -> list[Any]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=[bootstrap],
        group_id=f"read-{topic}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
    )
    found: list[Any] = []
    wait_for(
        lambda: (
            bool([found.extend(r) for r in consumer.poll(timeout_ms=500).values()])
            or len(found) >= count
        ),
        60,
        f"{count} records",
    )
    consumer.close()
    return found


@pytest.mark.services
def test_export_becomes_one_message_per_trace(topics: Topics) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=[topics.bootstrap], acks="all")
    client = _client(producer, topics.spans)
    trace_a, trace_b = "a" * 31 + "1", "b" * 31 + "2"
    spans = [llm_span(i, trace_id=trace_a) for i in range(3)] + [llm_span(9, trace_id=trace_b)]
    reply = client.post(
        "/v1/traces",
        content=gzip.compress(encode_otlp_protobuf(spans)),
        headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
    )
    assert reply.status_code == 200, reply.content
    assert reply.headers["content-type"] == "application/x-protobuf"
    ExportTraceServiceResponse.FromString(reply.content)
    more = [llm_span(20, trace_id="c" * 32)]
    reply = client.post(
        "/v1/traces", content=encode_otlp_json(more), headers={"content-type": "application/json"}
    )
    assert reply.status_code == 200 and reply.json() == {}

    records = _read(topics.bootstrap, topics.spans, 3)
    assert len(records) == 3
    by_key = {record.key.decode(): record for record in records}
    assert set(by_key) == {trace_a, trace_b, "c" * 32}
    assert decode_otlp_protobuf(by_key[trace_a].value) == received(spans[:3])
    assert decode_otlp_protobuf(by_key["c" * 32].value) == received(more)
    assert dict(by_key[trace_b].headers)[sc.CONTENT_TYPE_HEADER] == b"application/x-protobuf"
    producer.close()


class RefusingProducer:
    def send(self, *args: Any, **kwargs: Any) -> Any:
        from kafka.errors import KafkaTimeoutError

        raise KafkaTimeoutError("no broker")


def test_refusals_follow_the_otlp_http_specification() -> None:
    client = _client(RefusingProducer(), max_bytes=10_000)
    bad = client.post(
        "/v1/traces",
        content=b"\x0a\xff\xff\x0f",
        headers={"content-type": "application/x-protobuf"},
    )
    assert bad.status_code == 400
    assert b"bad_protobuf" in bad.content  # inside a google.rpc.Status
    bad_json = client.post("/v1/traces", content=b"{", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["code"] == 3
    assert "bad_json" in bad_json.json()["message"]
    assert (
        client.post(
            "/v1/traces",
            content=b"x",
            headers={"content-type": "application/x-protobuf", "content-encoding": "br"},
        ).status_code
        == 415
    )
    bomb = gzip.compress(b"\x00" * 1_000_000)
    assert (
        client.post(
            "/v1/traces",
            content=bomb,
            headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
        ).status_code
        == 413
    )
    down = client.post(
        "/v1/traces",
        content=encode_otlp_protobuf([llm_span(1)]),
        headers={"content-type": "application/x-protobuf"},
    )
    assert down.status_code == 503 and down.headers["retry-after"] == "5"
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503
    metrics = client.get("/metrics").text
    assert 'spanmill_collector_receiver_requests_total{status="400"} 2.0' in metrics


def test_every_gzip_member_is_read_and_a_stream_cut_short_is_refused() -> None:
    """RFC 1952 lets a body hold several gzip members, and gzip readers take them all:
    before, the spans after the first member were dropped under a 200. A stream missing
    its end, or bytes after a deflate stream, were read in part and answered 200."""
    from test_receiver_feedback import RecordingProducer

    producer = RecordingProducer()
    client = _client(producer)
    first = encode_otlp_protobuf([llm_span(1, trace_id="1" * 32)])
    second = encode_otlp_protobuf([llm_span(2, trace_id="2" * 32)])
    protobuf = {"content-type": "application/x-protobuf"}
    both = gzip.compress(first) + gzip.compress(second)  # protobuf messages concatenate
    answer = client.post(
        "/v1/traces", content=both, headers={**protobuf, "content-encoding": "gzip"}
    )
    assert answer.status_code == 200
    assert sorted(span.trace_id for _, span in producer.sent) == ["1" * 32, "2" * 32]
    for body, encoding in ((gzip.compress(first)[:-4], "gzip"),
                           (zlib.compress(first) + b"junk", "deflate")):  # fmt: skip
        refused = client.post("/v1/traces", content=body,
                              headers={**protobuf, "content-encoding": encoding})  # fmt: skip
        assert refused.status_code == 400 and b"bad_encoding" in refused.content
    assert len(producer.sent) == 2


@pytest.mark.services
class Recording:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(args)
        raise AssertionError("nothing over the limit reaches Kafka")


def _post_in_pieces(app: Any, path: str, content_type: str, size: int) -> tuple[int, int]:
    """POST ``size`` bytes with no declared length (chunked), a KiB at a time, straight
    to the ASGI app; its status and how many bytes it took before answering."""
    import asyncio

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", content_type.encode())]}  # fmt: skip
    taken = 0
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if status or taken >= size:
            return {"type": "http.disconnect"}
        taken += 1024
        return {"type": "http.request", "body": b"\x00" * 1024, "more_body": taken < size}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    asyncio.run(app(scope, receive, send))
    return status[0], taken


def test_a_body_over_the_limit_is_refused_as_it_arrives_declared_or_not() -> None:
    """A chunked body declares no length: it is refused once its bytes pass the limit,
    before the whole is held, for exports and feedback alike."""
    from spanmill.feedback import MAX_BODY_BYTES

    metrics = CollectorMetrics()
    app = create_app(Health(), metrics, OtlpReceiver(Recording(), "t", metrics, 4096))
    declared = TestClient(app).post(
        "/v1/traces", content=b"\x00" * 8192, headers={"content-type": "application/json"}
    )
    assert declared.status_code == 413 and "over 4096 bytes" in declared.json()["message"]
    for content_type in ("application/x-protobuf", "application/json"):
        assert _post_in_pieces(app, "/v1/traces", content_type, 1 << 30) == (413, 5 * 1024)
    assert _post_in_pieces(app, "/v1/feedback", "application/json", 1 << 30) == (
        413, MAX_BODY_BYTES + 1024
    )  # fmt: skip


def test_service_end_to_end_over_http(topics: Topics, tmp_path: Path) -> None:
    port = free_port()
    store_dir = tmp_path / "store"
    log = tmp_path / "collector.log"
    process = collector_process(
        topics, store_dir, log, port, command=("-m", "spanmill.cli.main", "collector")
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(port), 60, "the collector to be ready")
        spans = [llm_span(i) for i in range(25)]
        reply = httpx.post(
            f"{base}/v1/traces",
            content=encode_otlp_protobuf(spans),
            headers={"content-type": "application/x-protobuf"},
            timeout=30,
        )
        assert reply.status_code == 200
        store = SpanStore(str(store_dir))
        wait_for(lambda: store.count() >= 25, 60, "the spans in the store")
        # Counted once the batch is finished: a moment after its files appear.
        wait_for(
            lambda: (
                "spanmill_collector_spans_written_total 25.0"
                in httpx.get(f"{base}/metrics", timeout=5).text
            ),
            30,
            "the spans counted",
        )
        # Lag is looked at once a second: it may come a moment after the write.
        wait_for(
            lambda: "spanmill_collector_lag{" in httpx.get(f"{base}/metrics", timeout=5).text,
            10,
            "the lag gauge",
        )
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        assert 'spanmill_collector_receiver_spans_total{outcome="accepted"} 25.0' in metrics
        assert "spanmill_collector_lag{" in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, log.read_text()[-2000:]
    assert sorted(store.spans(), key=lambda s: s.span_id) == sorted(
        received(spans), key=lambda s: s.span_id
    )
