"""The broker goes away mid-stream and comes back on the same port.

tansu keeps its log in memory, so a restarted broker is empty: topics, records and
the group's offsets are gone. What can be shown is what matters: the collector
does not crash, writes what it had already consumed, reconnects, and takes the
new log's spans, each once.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from collector_helpers import Topics, llm_span, producer, running, settings_for, wait_for

from spanmill.errors import StackError
from spanmill.spans import encode_otlp_protobuf
from spanmill.stack.ports import free_port
from spanmill.stack.services import KafkaBroker, RunningService
from spanmill.store import SpanStore

pytestmark = pytest.mark.services


def _consumed(collector: object) -> float:
    metrics = collector.metrics  # type: ignore[attr-defined]
    return sum(
        sample.value
        for metric in metrics.records_consumed.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def test_collector_survives_a_broker_restart(tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    port = free_port()
    spans_topic, dlq_topic = f"spans-{suffix}", f"spans-{suffix}.dlq"

    def broker() -> RunningService:
        # tansu creates a topic whenever a client asks for it, whatever the client says,
        # and the collector keeps asking while it reconnects: make ours unless it won.
        server = KafkaBroker("127.0.0.1", port, tmp_path / "kafka", topics=())
        started = server.start()
        for topic in (spans_topic, dlq_topic):
            try:
                server.create_topic(topic, 3)
            except StackError as exc:
                assert "already exists" in str(exc)
        return started

    running_broker = broker()
    topics = Topics(spans_topic, dlq_topic, f"collector-{suffix}", f"127.0.0.1:{port}")
    store = SpanStore(str(tmp_path / "store"))
    # Records wait up to 5 s in memory: some are held, consumed but unwritten, when
    # the broker goes.
    settings = settings_for(topics, tmp_path / "store", batch_max_seconds=5.0)
    first = [llm_span(i) for i in range(300)]
    held = [llm_span(1000 + i) for i in range(200)]
    after = [llm_span(2000 + i) for i in range(200)]
    try:
        with running(settings) as collector:
            send = producer(topics.bootstrap)
            for span in first:
                send.send(
                    spans_topic, key=span.trace_id.encode(), value=encode_otlp_protobuf([span])
                )
            send.flush()
            wait_for(lambda: store.count() >= len(first), 60, "the first spans in the store")
            for span in held:
                send.send(
                    spans_topic, key=span.trace_id.encode(), value=encode_otlp_protobuf([span])
                )
            send.flush()
            send.close()
            wait_for(
                lambda: _consumed(collector) >= len(first) + len(held), 30, "held spans consumed"
            )
            running_broker.stop()

            # Gone broker: what was consumed is still written.
            wait_for(lambda: store.count() >= len(first) + len(held), 30, "held spans in the store")
            running_broker = broker()
            send = producer(topics.bootstrap)
            for span in after:
                send.send(
                    spans_topic, key=span.trace_id.encode(), value=encode_otlp_protobuf([span])
                )
            send.flush()
            send.close()
            # The rejoin can wait out tansu's hold on the group (about a minute after a
            # member vanished mid-join), more under load; the spans wait in the log.
            wait_for(
                lambda: store.count() >= len(first) + len(held) + len(after),
                240,
                "spans sent after the restart in the store",
            )
            wait_for(lambda: collector.ready, 30, "the collector ready again")
    finally:
        running_broker.stop()

    stored = {span.span_id: span for span in store.spans()}
    assert stored == {span.span_id: span for span in first + held + after}
    assert store.duplicates() == 0
