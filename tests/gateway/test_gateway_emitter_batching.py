"""The gateway's LLM spans share requests to Kafka; feedback, whose sender waits, does not
linger as long.

A span a request cost the producer's thread most of a millisecond of CPU a call on this
machine, taken from serving (``bench/gateway_overhead.py``); spans are fire-and-forget,
so they wait a little for others.
"""

from __future__ import annotations

import time
import uuid

import pytest

from spanmill.config import KafkaSettings
from spanmill.gateway import emitter as gateway_emitter
from spanmill.gateway.emitter import SpanEmitter
from spanmill.gateway.metrics import GatewayMetrics
from spanmill.spans import Span

pytestmark = pytest.mark.services


def _span(index: int) -> Span:
    return Span(
        trace_id=uuid.uuid4().hex,
        span_id=f"{index + 1:016x}",
        name="chat",
        start_time_unix_nano=1_700_000_000_000_000_000 + index,
        end_time_unix_nano=1_700_000_000_000_000_100 + index,
        attributes={"gen_ai.operation.name": "chat", "payload": "x" * 500},
    )


def test_llm_spans_arriving_apart_share_requests_to_kafka(kafka) -> None:  # type: ignore[no-untyped-def]
    name = kafka.create_topic(f"emitter-batching-{uuid.uuid4().hex[:8]}")
    settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=name)
    emitter = SpanEmitter(settings, GatewayMetrics())
    emitter.start()
    try:
        count = 12
        # Calls 30 ms apart, as one client calling one after another: past a linger of
        # 20 ms each span went alone.
        for index in range(count):
            emitter.emit(_span(index))
            time.sleep(0.03)
        deadline = time.monotonic() + 60
        while emitter.emitted < count:
            assert time.monotonic() < deadline, f"{emitter.emitted} of {count} spans sent"
            time.sleep(0.1)
        producer = emitter._producer
        assert producer.config["linger_ms"] == gateway_emitter.LLM_LINGER_MS
        assert producer.config["batch_size"] == gateway_emitter.LLM_BATCH_BYTES
        assert emitter._feedback_producer.config["linger_ms"] == (
            gateway_emitter.FEEDBACK_LINGER_MS
        )
        sent = producer.metrics()["producer-metrics"]
        # Measured: 6.0 here, where a linger of 20 ms gave 2.4 (spans that came while
        # the previous request was out), and 1.0 is a span a request.
        assert sent["records-per-request-avg"] >= 4, sent["records-per-request-avg"]
    finally:
        emitter.close()
