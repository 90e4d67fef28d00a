"""The collector SIGKILLed again and again while spans arrive, in records of 10 spans and
of 100 (as SDK exporters batch them): none lost, none twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from collector_helpers import (
    Topics,
    collector_process,
    producer,
    ready,
    trace_records,
    wait_for,
)

from spanmill.stack.ports import free_port
from spanmill.store import SpanStore

pytestmark = [pytest.mark.services, pytest.mark.slow]

TOTAL_SPANS = 60_000
KILLS = 2
# Traffic is spread over about this long, so that the kills fall while it arrives.
PRODUCE_S = 12.0


def _collector(topics: Topics, store: Path, log: Path, port: int) -> subprocess.Popen[bytes]:
    return collector_process(topics, store, log, port, batch_max_spans="500", workers="1")


@pytest.mark.parametrize("spans_per_record", [10, 100])
def test_sigkill_while_producing_loses_nothing_and_duplicates_nothing(
    topics: Topics, tmp_path: Path, spans_per_record: int
) -> None:
    rng = random.Random(4 + spans_per_record)
    records, expected = trace_records(TOTAL_SPANS // spans_per_record, spans_per_record)
    chunk = max(1, len(records) // int(PRODUCE_S / 0.5))

    send = producer(topics.bootstrap)
    produced = threading.Event()

    def produce() -> None:
        # Spread over the kills: steady traffic for about PRODUCE_S.
        for start in range(0, len(records), chunk):
            for key, value in records[start : start + chunk]:
                send.send(topics.spans, key=key, value=value)
            send.flush()
            time.sleep(0.5)
        produced.set()

    store_dir = tmp_path / "store"
    store = SpanStore(str(store_dir))
    log = tmp_path / "collector.log"
    threading.Thread(target=produce, name="producer", daemon=True).start()

    def files() -> int:
        return sum(1 for _ in store_dir.rglob("*.parquet")) if store_dir.exists() else 0

    for _ in range(KILLS):
        before = files()
        port = free_port()
        process = _collector(topics, store_dir, log, port)
        try:
            # Kill only once it has joined and written: a member killed mid-join blocks
            # a tansu group for a minute. Once every span is produced there may be no new
            # batch left to write (one rewritten keeps its file name): joined is enough.
            wait_for(
                lambda: files() > before or (produced.is_set() and ready(port)),  # noqa: B023
                90,
                "the collector to write",
            )
            time.sleep(rng.uniform(0.2, 2.0))
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    port = free_port()
    final = _collector(topics, store_dir, log, port)
    try:
        # Stopped only once it has joined: the last spans may already be in the store
        # (written, not committed, by the collector killed last) before it has started.
        wait_for(lambda: ready(port), 90, "the last collector to join")
        wait_for(produced.is_set, 120, "the producer to finish")
        wait_for(lambda: store.count() >= TOTAL_SPANS, 120, "every span in the store")
    finally:
        final.send_signal(signal.SIGTERM)
        code = final.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]

    table = store.table(columns=["trace_id", "span_id"])
    stored = list(
        zip(table.column("trace_id").to_pylist(), table.column("span_id").to_pylist(), strict=True)
    )
    assert len(stored) == TOTAL_SPANS
    assert set(stored) == expected
    assert store.duplicates() == 0
