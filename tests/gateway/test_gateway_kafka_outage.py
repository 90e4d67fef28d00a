"""Kafka stops answering while the gateway serves: requests are answered, spans wait up to
the bound, the rest are dropped and counted, and what waited arrives once Kafka is back.

The broker (tansu) is paused with SIGSTOP, as a broker that hangs or a partition that
loses its network looks to a client: connections open, nothing answers. The figures
are printed as a row of the fault table in the README.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from test_gateway_services import echo_model, echo_table, read_spans, settings

from spanmill.gateway.app import create_app
from spanmill.stack.ports import free_port
from spanmill.stack.services import KafkaBroker

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]
__all__ = ["echo_model"]  # the fixture, shared with the gateway's service tests

BOUND = 40  # span_queue_size: as many wait in the queue, as many again in the producer
OUTAGE_S = float(os.environ.get("SPANMILL_FAULT_OUTAGE_S", "10"))
DURING = 3 * BOUND  # requests answered while Kafka is away: more than can wait


def _until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout:.0f}s"
        time.sleep(0.2)


def test_a_kafka_outage_never_holds_a_request_and_loses_only_past_the_bound(
    echo_model: str, serve_app, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    broker = KafkaBroker("127.0.0.1", port, tmp_path / "kafka", topics=())
    running = broker.start()
    bootstrap = f"127.0.0.1:{port}"
    topic = f"spans-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    app = create_app(
        settings(bootstrap, topic, echo_model, span_queue_size=BOUND, span_outage_s=120),
        table=echo_table(),
    )
    emitter = app.state.gateway.emitter
    body = {"model": "echo", "messages": [{"role": "user", "content": "hello"}]}
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=60) as http:
            before = [http.post("/v1/chat/completions", json=body) for _ in range(10)]
            assert [r.status_code for r in before] == [200] * 10
            _until(lambda: emitter.emitted == 10, 60, "the first spans acknowledged")

            os.kill(running.process.pid, signal.SIGSTOP)
            paused = time.monotonic()
            try:
                slowest = 0.0
                during = []
                for _ in range(DURING):
                    sent = time.perf_counter()
                    during.append(http.post("/v1/chat/completions", json=body))
                    slowest = max(slowest, time.perf_counter() - sent)
                time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - paused)))
            finally:
                os.kill(running.process.pid, signal.SIGCONT)
            # Every request answered while Kafka was away.
            assert [r.status_code for r in during] == [200] * DURING
            produced = 10 + DURING
            _until(lambda: emitter.emitted + emitter.dropped == produced, 180,
                   "every span acknowledged or dropped")  # fmt: skip
            metrics = http.get("/metrics").text
        stored = read_spans(bootstrap, topic, emitter.emitted)
    finally:
        running.stop()

    ids = [span.span_id for _, span in stored]
    duplicated = len(ids) - len(set(ids))
    print(
        f"\nfault | Kafka paused {OUTAGE_S:.0f} s while the gateway serves | requests "
        f"{produced}, failed 0 | spans produced {produced}, stored {len(set(ids))}, dropped "
        f"{emitter.dropped} (counted), duplicated {duplicated} | slowest answer "
        f"{slowest * 1000:.0f} ms"
    )
    # What could wait, waited and arrived: the queue and the producer, BOUND each, and the
    # one span the emitter's thread holds between them.
    waited = 2 * BOUND + 1
    assert emitter.emitted == 10 + waited
    assert emitter.dropped == DURING - waited
    assert f'spanmill_gateway_spans_dropped_total{{reason="queue_full"}} {DURING - waited}' in (
        metrics
    )
    assert len(set(ids)) == emitter.emitted and duplicated == 0
