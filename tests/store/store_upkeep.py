"""Writing stores of many small files the way the collector does, for upkeep tests."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from store_samples import span

from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.store import BatchId

HOUR_NS = 3600 * 10**9
_fingerprints = itertools.count(1)


def hour_span(hour_ns: int, n: int, *, user: str | None = None, trace: int | None = None) -> Span:
    """Span ``n`` of an hour starting at ``hour_ns`` (distinct ids per ``n``), of ``user``."""
    base = span(n % 50)
    attributes = dict(base.attributes)
    if user is not None:
        attributes["enduser.id"] = user
    start = hour_ns + (n % 3000) * 10**9
    return base.model_copy(
        update={
            "trace_id": f"{trace if trace is not None else n + 1:032x}",
            "span_id": f"{n + 1:016x}",
            "start_time_unix_nano": start,
            "end_time_unix_nano": start + 1000,
            "attributes": attributes,
        }
    )


class Feeder:
    """Writes batches of records through the collector's own processor: one file per
    hour a batch touches, named after the batch, as the collector names them."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.processor = BatchProcessor(
            ProcessingConfig(store_url=url, storage_options=dict(storage_options or {}))
        )
        self.next_offset: dict[int, int] = {}
        self.jobs: list[BatchJob] = []

    def write(self, spans: list[Span], partition: int = 0) -> BatchJob:
        """One batch: a record per span, at the partition's next offsets."""
        first = self.next_offset.get(partition, 0)
        offsets = list(range(first, first + len(spans)))
        self.next_offset[partition] = first + len(spans)
        job = BatchJob(
            BatchId("spans", partition, first, offsets[-1], f"{next(_fingerprints):016x}"),
            offsets,
            [1_750_000_000_000] * len(spans),
            [encode_otlp_protobuf([s]) for s in spans],
            [None] * len(spans),
        )
        self.replay(job)
        self.jobs.append(job)
        return job

    def replay(self, job: BatchJob) -> None:
        """Write a batch again, as a collector does after a crash before its commit."""
        outcome = self.processor.process(job)
        assert not outcome.dead, outcome.dead
