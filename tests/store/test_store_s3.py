"""The store on S3: moto's S3 server on 127.0.0.1 stands in for the real endpoint."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from store_samples import span

from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
from spanmill.spans import encode_otlp_protobuf
from spanmill.stack.ports import free_port
from spanmill.store import BatchId, SpanStore, StoreWriter

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "test",
        "secret": "test",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    try:
        yield options
    finally:
        server.stop()


def test_collector_batches_land_on_s3_and_read_back(s3: dict[str, Any]) -> None:
    import boto3

    bucket = f"spans-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3",
        endpoint_url=s3["endpoint_url"],
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/store"
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
