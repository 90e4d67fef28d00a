"""An agent traced by the SDK while Kafka stops answering: its episodes go on as before,
and its spans reach the topic once Kafka is back (or are counted as failed).

The broker (tansu) is paused with SIGSTOP. The episode times are printed, before and
during the outage, as a row of the fault table in the README; the test asserts what
became of every span.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from spanmill import sdk
from spanmill.config import KafkaSettings
from spanmill.spans import detect_and_decode
from spanmill.stack.ports import free_port
from spanmill.stack.services import KafkaBroker

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

EPISODES = 40
OUTAGE_S = float(os.environ.get("SPANMILL_FAULT_OUTAGE_S", "10"))


def _episodes(n: int, tag: str) -> list[float]:
    """``n`` episodes of a tool call and a reward each; the seconds each took."""
    took = []
    for i in range(n):
        started = time.perf_counter()
        with sdk.episode(task_id=f"{tag}-{i}"):
            with sdk.tool_call("lookup", f"call-{i}", {"q": i}) as call:
                call.set_result("found")
            sdk.emit_reward("resolved", 1.0, primary=True)
        took.append(time.perf_counter() - started)
    return took


def _stored(bootstrap: str, topic: str, expected: int) -> list[str]:
    """Span ids on the topic, read from its start without a consumer group."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10000)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    ids: list[str] = []
    for message in consumer:
        ids += [span.span_id for span in detect_and_decode(message.value)]
        if len(ids) >= expected:
            break
    consumer.close()
    return ids


def test_an_agent_runs_on_through_a_kafka_outage(tmp_path: Path) -> None:
    port = free_port()
    running = KafkaBroker("127.0.0.1", port, tmp_path / "kafka", topics=()).start()
    bootstrap, topic = f"127.0.0.1:{port}", f"spans-{uuid.uuid4().hex[:8]}"
    exporter = sdk.KafkaSpanExporter(KafkaSettings(bootstrap_servers=bootstrap, spans_topic=topic))
    sdk.configure("outage-agent", agent_name="outage", exporter=exporter, schedule_delay_ms=50,
                  set_global=False)  # fmt: skip
    try:
        before = _episodes(EPISODES, "before")
        assert sdk.force_flush()
        os.kill(running.process.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            during = _episodes(EPISODES, "during")
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - paused)))
        finally:
            os.kill(running.process.pid, signal.SIGCONT)
        sdk.shutdown()  # flushes what waited, within the exporter's timeout
        produced = 2 * EPISODES * 2  # the episode (its reward an event on it), its tool call
        ids = _stored(bootstrap, topic, exporter.sent_spans)
    finally:
        running.stop()
    duplicated = len(ids) - len(set(ids))
    print(
        f"\nfault | the SDK with Kafka paused {OUTAGE_S:.0f} s | episodes {2 * EPISODES}, "
        f"failed 0 | spans produced {produced}, stored {len(set(ids))}, dropped "
        f"{exporter.failed_spans} (counted), duplicated {duplicated} | episode median "
        f"{statistics.median(before) * 1e3:.2f} ms with Kafka, "
        f"{statistics.median(during) * 1e3:.2f} ms without"
    )
    assert len(during) == EPISODES  # every episode ran to its end
    # Every span is stored once, or counted as failed: none vanishes, none doubles.
    assert len(set(ids)) + exporter.failed_spans == produced
    assert duplicated == 0
    assert exporter.sent_spans == len(set(ids))
