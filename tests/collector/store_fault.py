"""What the store-fault tests share: steady traffic through the fault, the check that
no offset is committed past an unwritten span, and the count of what was stored."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from collector_helpers import Topics, producer, trace_records, wait_for

from spanmill.store import SpanStore

RECORDS = 1200
SPANS_PER_RECORD = 5


@dataclass
class Traffic:
    expected: set[tuple[str, str]]
    produced: threading.Event = field(default_factory=threading.Event)

    def wait_stored(self, store: SpanStore) -> None:
        """Until every record is sent and the store holds as many spans as were sent."""
        wait_for(self.produced.is_set, 120, "the producer to finish")
        wait_for(lambda: store.count() >= len(self.expected), 180, "every span in the store")


@contextmanager
def traffic(topics: Topics, outage_s: float) -> Iterator[Traffic]:
    """``RECORDS`` records sent 50 at a time, spread over the fault and 10 s after it."""
    records, expected = trace_records(RECORDS, SPANS_PER_RECORD)
    sent = Traffic(expected)
    send = producer(topics.bootstrap)
    stop = threading.Event()
    pace = (outage_s + 10) / (RECORDS / 50)

    def produce() -> None:
        for start in range(0, RECORDS, 50):
            if stop.is_set():
                return
            for key, value in records[start : start + 50]:
                send.send(topics.spans, key=key, value=value)
            send.flush()
            time.sleep(pace)
        sent.produced.set()

    thread = threading.Thread(target=produce, name="producer", daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(timeout=30)
        send.close(timeout=5)


def committed(topics: Topics) -> dict[int, int]:
    """The group's committed offsets, read by a client that never joins it."""
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(bootstrap_servers=[topics.bootstrap], group_id=topics.group,
                           enable_auto_commit=False)  # fmt: skip
    try:
        partitions = [TopicPartition(topics.spans, p) for p in range(3)]
        found = {tp.partition: reader.committed(tp) for tp in partitions}
    finally:
        reader.close()
    return {partition: offset for partition, offset in found.items() if offset is not None}


def stored_offsets(store: SpanStore) -> dict[int, set[int]]:
    if store.count() == 0:
        return {}
    table = store.table(columns=["kafka_partition", "kafka_offset"])
    found: dict[int, set[int]] = {}
    for partition, offset in zip(
        table.column("kafka_partition").to_pylist(),
        table.column("kafka_offset").to_pylist(),
        strict=True,
    ):
        found.setdefault(partition, set()).add(offset)
    return found


def never_commits_unwritten(topics: Topics, store: SpanStore, seconds: float) -> None:
    """For ``seconds``, once a second: no committed offset past a span the store lacks."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        stored = stored_offsets(store)
        for partition, offset in committed(topics).items():
            missing = set(range(offset)) - stored.get(partition, set())
            assert not missing, f"partition {partition} committed to {offset} unwritten"
        time.sleep(1.0)


def stored_once(store: SpanStore, expected: set[tuple[str, str]]) -> dict[str, int]:
    """What the store holds of ``expected``: stored, lost and duplicated span counts;
    asserts each span of it is there once and nothing else is."""
    table = store.table(columns=["trace_id", "span_id"])
    ids = list(
        zip(table.column("trace_id").to_pylist(), table.column("span_id").to_pylist(), strict=True)
    )
    counts = {
        "produced": len(expected),
        "stored": len(set(ids) & expected),
        "lost": len(expected - set(ids)),
        "duplicated": len(ids) - len(set(ids)),
        "duplicated_by_the_store": store.duplicates(),
        "strangers": len(set(ids) - expected),
    }
    assert counts["stored"] == counts["produced"] and counts["strangers"] == 0, counts
    assert counts["duplicated"] == counts["duplicated_by_the_store"] == 0, counts
    return counts


def stop(process: subprocess.Popen[bytes]) -> int:
    """Stop the collector as Kubernetes does (SIGTERM) unless it stopped; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=60)
