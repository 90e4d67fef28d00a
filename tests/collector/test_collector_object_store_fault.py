"""The object store answering 500 while spans arrive: no offset is committed past an
unwritten span, and once it answers again every span is stored, none twice.

The collector writes through an endpoint that answers every request with S3's 500
InternalError for ``SPANMILL_FAULT_OUTAGE_S`` (10 s in ``make test``), within its write
retries; the test reads the same buckets through a second endpoint that never fails.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from collector_helpers import Topics, collector_process, ready, wait_for
from object_store import FaultyS3, s3_bucket
from store_fault import never_commits_unwritten, stop, stored_once, traffic

from spanmill.stack.ports import free_port
from spanmill.store import SpanStore

pytestmark = pytest.mark.services

OUTAGE_S = float(os.environ.get("SPANMILL_FAULT_OUTAGE_S", "10"))


@pytest.fixture
def s3_endpoints() -> Iterator[FaultyS3]:
    endpoints = FaultyS3()
    try:
        yield endpoints
    finally:
        endpoints.close()


def test_an_object_store_answering_500_loses_nothing_and_commits_nothing_unwritten(
    topics: Topics, s3_endpoints: FaultyS3, tmp_path: Path
) -> None:
    url = s3_bucket(s3_endpoints.options(s3_endpoints.clean_url))
    store = SpanStore(url, s3_endpoints.options(s3_endpoints.clean_url))
    log = tmp_path / "collector.log"
    port = free_port()
    process = collector_process(
        topics, Path("unused"), log, port, batch_max_spans="200", workers="1",
        store_url=url, storage_options=json.dumps(s3_endpoints.options(s3_endpoints.faulty_url)),
    )  # fmt: skip
    with traffic(topics, OUTAGE_S) as sent:
        try:
            wait_for(lambda: ready(port) and store.count() > 0, 90, "the collector to write")
            s3_endpoints.fault.set()
            never_commits_unwritten(topics, store, OUTAGE_S)
            s3_endpoints.fault.clear()
            assert process.poll() is None, log.read_text()[-3000:]
            sent.wait_stored(store)
        finally:
            code = stop(process)

    assert code == 0, log.read_text()[-3000:]
    counts = stored_once(store, sent.expected)
    print(f"\nfault row: object store answers 500 for {OUTAGE_S:g} s | {counts} | "
          f"requests refused {s3_endpoints.refused}")  # fmt: skip
    assert s3_endpoints.refused > 0, "the collector sent nothing during the fault"
