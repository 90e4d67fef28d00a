"""The store on S3: moto's S3 server on 127.0.0.1 stands in for the real endpoint."""

from __future__ import annotations

from typing import Any

from object_store import s3_bucket
from store_samples import span

from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
from spanmill.spans import encode_otlp_protobuf
from spanmill.store import BatchId, SpanStore, StoreWriter


def test_collector_batches_land_on_s3_and_read_back(s3: dict[str, Any]) -> None:
    url = s3_bucket(s3)
    spans = [span(i) for i in range(90)]
    processor = BatchProcessor(ProcessingConfig(store_url=url, storage_options=s3))
    batch = BatchId("t", 0, 0, 89, "00000000000000aa")
    outcome = processor.process(
        BatchJob(
            batch=batch,
            offsets=list(range(90)),
            timestamps=[1] * 90,
            values=[encode_otlp_protobuf([s]) for s in spans],
            content_types=[None] * 90,
        )
    )
    assert outcome.spans == 90 and not outcome.dead and len(outcome.files) == 2

    writer = StoreWriter(url, s3)
    assert writer.claim("t", 0, 0, "00000000000000aa", 89).last == 89
    assert writer.claim("t", 0, 0, "00000000000000aa", 120).last == 89
    store = SpanStore(url, s3)
    assert sorted(store.spans(), key=lambda s: s.span_id) == spans
    assert store.count(service="svc-b") == 30
    assert store.duplicates() == 0
