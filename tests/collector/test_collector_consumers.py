"""A collector of several consumer processes: every span once, one /metrics, one lifetime."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from collector_helpers import Topics, collector_process, llm_span, producer, wait_for
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spanmill.collector.consumers import merge, snapshot
from spanmill.spans import encode_otlp_protobuf
from spanmill.stack.ports import free_port
from spanmill.store import SpanStore

RECORDS = 3000


def _metric(text: str, name: str) -> float:
    """A sample's value summed over its labels, from a /metrics page."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def test_merge_sums_samples_and_keeps_the_first_creation_time() -> None:
    registries = []
    for value in (2, 5):
        registry = CollectorRegistry()
        counter = Counter("spans", "Spans.", ["partition"], registry=registry)
        counter.labels("0").inc(value)
        counter.labels(str(value)).inc(1)
        Gauge("lag", "Lag.", registry=registry).set(value * 10)
        Histogram("seconds", "Time.", buckets=(1, 10), registry=registry).observe(value)
        registries.append(registry)
    snapshots = [snapshot(registry) for registry in registries]
    created = [
        value
        for families in snapshots
        for name, _, _, samples in families
        for sample, labels, value in samples
        if sample == "spans_created" and labels == {"partition": "0"}
    ]
    merged = merge(snapshots)

    class Shown:
        def collect(self) -> list[Any]:
            return merged

    text = generate_latest(Shown()).decode()  # type: ignore[arg-type]
    assert 'spans_total{partition="0"} 7.0' in text
    assert 'spans_total{partition="2"} 1.0' in text and 'spans_total{partition="5"} 1.0' in text
    assert "lag 70.0" in text
    assert 'seconds_bucket{le="1.0"} 0.0' in text and 'seconds_bucket{le="10.0"} 2.0' in text
    assert "seconds_sum 7.0" in text and "seconds_count 2.0" in text
    # A creation time is a moment, not a quantity: the earliest stands for the sum.
    assert len(created) == 2
    shown = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('spans_created{partition="0"}')
    ]
    assert shown == [pytest.approx(min(created))]


def _start(topics: Topics, store: Path, log: Path, port: int) -> subprocess.Popen[bytes]:
    return collector_process(
        topics,
        store,
        log,
        port,
        batch_max_spans="400",
        # The default layout, worked out for two CPUs and the topic's three partitions:
        # three consumer processes, each decoding on a thread of its own.
        processes="auto",
        workers="auto",
        cpus="2",
        receiver_enabled="false",
    )


def _produce(topics: Topics) -> set[tuple[str, str]]:
    send = producer(topics.bootstrap)
    expected = set()
    for n in range(RECORDS):
        span = llm_span(n).model_copy(
            update={"trace_id": f"{n + 1:032x}", "span_id": f"{n + 1:016x}"}
        )
        expected.add((span.trace_id, span.span_id))
        send.send(topics.spans, key=span.trace_id.encode(), value=encode_otlp_protobuf([span]))
    send.flush()
    send.close()
    return expected


@pytest.mark.services
def test_the_default_layout_runs_three_consumer_processes_that_share_the_topic_and_stop(
    topics: Topics, tmp_path: Path
) -> None:
    expected = _produce(topics)
    port = free_port()
    log = tmp_path / "collector.log"
    process = _start(topics, tmp_path / "store", log, port)
    client = httpx.Client(timeout=5)
    try:

        def metrics() -> str:
            try:
                return client.get(f"http://127.0.0.1:{port}/metrics").text
            except httpx.HTTPError:
                return ""

        wait_for(
            lambda: _metric(metrics(), "spanmill_collector_spans_written_total") >= RECORDS,
            120,
            "every span written, in the summed metrics",
        )
        children = psutil.Process(process.pid).children()
        consumers = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        assert len(consumers) == 2, "two more consumer processes beside the first"
        assert all(not c.children() for c in consumers), "no worker processes: threads"
        assert "collector layout: 3 consumer process(es), 0 worker(s) each" in log.read_text()
        text = metrics()
        # Each process read its own share: the consumed counters of all three add up.
        assert _metric(text, "spanmill_collector_records_consumed_total") == RECORDS
        assert _metric(text, "spanmill_collector_assigned_partitions") == 3
        wait_for(
            lambda: client.get(f"http://127.0.0.1:{port}/readyz").status_code == 200,
            30,
            "every consumer ready",
        )
        assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        for child in consumers:
            assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    finally:
        client.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    stored = SpanStore(str(tmp_path / "store")).table(columns=["trace_id", "span_id"])
    pairs = list(zip(stored["trace_id"].to_pylist(), stored["span_id"].to_pylist(), strict=True))
    assert len(pairs) == len(set(pairs)) == RECORDS
    assert set(pairs) == expected
    assert log.read_text().count("stopped:") == 3, "each consumer wrote what it held and stopped"


@pytest.mark.services
def test_a_consumer_process_that_dies_stops_the_collector_with_an_error(
    topics: Topics, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "collector.log"
    process = _start(topics, tmp_path / "store", log, port)
    try:
        wait_for(
            lambda: len(psutil.Process(process.pid).children()) >= 2,
            60,
            "the consumer processes",
        )
        child = next(
            c
            for c in psutil.Process(process.pid).children()
            if "spawn_main" in " ".join(c.cmdline())
        )
        wait_for(lambda: "native decoding" in log.read_text(), 60, "the children started")
        child.send_signal(signal.SIGKILL)
        assert process.wait(timeout=60) == 1
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert "exited with code -9" in text and "stopping the collector" in text
