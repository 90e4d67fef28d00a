"""Writing the store: atomic files, deterministic names, and a ledger whose first writer wins."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from store_samples import span

from spanmill.store import BatchId, SpanStore, StoreWriter, fingerprint, parse_file_name
from spanmill.store.layout import hour_dir, hour_key
from spanmill.store.rows import HourlyColumns, SpanParts
from spanmill.store.schema import DICTIONARY_COLUMNS, STATISTICS_COLUMNS


def _tables(count: int, offset: int = 0) -> dict[int, object]:
    hourly = HourlyColumns()
    for i in range(count):
        # 60 spans a minute apart cross an hour boundary: two files.
        hourly.append(SpanParts.from_span(span(i)), "t", 0, offset + i, 0, 1)
    return hourly.tables()  # type: ignore[return-value]


def test_batch_files_are_named_for_the_batch_and_written_whole(tmp_path: Path) -> None:
    writer = StoreWriter(str(tmp_path))
    batch = BatchId("spanmill.spans.v1", 2, 0, 59, fingerprint(1, b"k", b"v"))
    written = writer.write_batch(batch, _tables(60))
    assert len(written) == 2
    for relative in written:
        assert parse_file_name(relative) == batch
        assert relative.startswith(hour_dir(hour_key(span(0).start_time_unix_nano))[:14])
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temp left
    # Writing the same batch again replaces its files: still 60 spans, not 120.
    writer.write_batch(batch, _tables(60))
    store = SpanStore(str(tmp_path))
    assert store.count() == 60
    assert store.duplicates() == 0


def test_only_few_valued_columns_get_dictionaries_and_only_filtered_ones_statistics(
    tmp_path: Path,
) -> None:
    writer = StoreWriter(str(tmp_path))
    batch = BatchId("t", 0, 0, 59, fingerprint(1, b"k", b"v"))
    (relative, *_) = writer.write_batch(batch, _tables(60))
    group = pq.ParquetFile(tmp_path / relative).metadata.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    dictionary = {name for name, c in columns.items() if "RLE_DICTIONARY" in c.encodings}
    with_statistics = {name for name, c in columns.items() if c.is_stats_set}
    assert dictionary == set(DICTIONARY_COLUMNS)
    assert with_statistics == set(STATISTICS_COLUMNS)
    # Readers still find spans by what they filter on.
    store = SpanStore(str(tmp_path))
    assert store.count(trace_id=span(3).trace_id) == 1
    service = span(3).resource_attributes["service.name"]
    expected = [i for i in range(60) if span(i).resource_attributes["service.name"] == service]
    assert store.count(service=service) == len(expected) > 0


def test_names_parse_back_and_fingerprints_tell_logs_apart() -> None:
    batch = BatchId("my.topic-with-p1-dashes", 12, 5, 9, "0123456789abcdef")
    assert parse_file_name(f"dt=2024-01-01/hour=03/{batch.file_name()}") == batch
    assert parse_file_name("notes.parquet") is None
    assert fingerprint(1, b"k", b"v") != fingerprint(2, b"k", b"v")
    assert fingerprint(1, None, b"v") != fingerprint(1, b"", b"v")


def test_ledger_first_claim_wins_even_when_racing(store_at: tuple[str, dict[str, Any]]) -> None:
    url, options = store_at
    writer = StoreWriter(url, options)
    mark = "00000000000000aa"
    results = []
    barrier = threading.Barrier(8)

    def claim(last: int) -> None:
        racer = StoreWriter(url, options)
        barrier.wait()
        results.append(racer.claim("t", 1, 100, mark, last).last)

    threads = [threading.Thread(target=claim, args=(150 + i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    entry = writer.ledger_entry("t", 1, 100, mark)
    assert entry is not None and entry.last == results[0]
    assert writer.claim("t", 1, 100, mark, 999).last == results[0]
    # Another log's record at the same offset is another batch.
    assert writer.ledger_entry("t", 1, 100, "00000000000000bb") is None


def test_a_claim_made_between_another_collectors_look_and_its_write_is_the_one_kept(
    store_at: tuple[str, dict[str, Any]],
) -> None:
    """A partition's old owner flushing what it held as its new owner starts: the old one
    looks, finds no entry, and the new one claims before the old one writes. Both must
    end with the new one's extent (on an object store the write is a conditional put)."""
    url, options = store_at
    old_owner, new_owner = StoreWriter(url, options), StoreWriter(url, options)
    mark = "00000000000000aa"
    looked = old_owner.ledger_entry

    def look_then_let_the_other_claim(*args: Any) -> Any:
        found = looked(*args)
        if found is None:
            assert new_owner.claim("t", 2, 100, mark, 120).last == 120
        return found

    old_owner.ledger_entry = look_then_let_the_other_claim  # type: ignore[method-assign]
    assert old_owner.claim("t", 2, 100, mark, 199).last == 120
    entry = new_owner.ledger_entry("t", 2, 100, mark)
    assert entry is not None and entry.last == 120


def test_a_conditional_put_refused_without_a_reason_still_takes_the_entry_in_force(
    s3: dict[str, Any],
) -> None:
    """An S3-compatible store may answer a refused conditional put with a bare 412 (no
    AWS error body: an OSError, not FileExistsError), and a put's answer may be lost
    after it landed: either way the entry read back is the one in force."""
    from object_store import s3_bucket

    url = s3_bucket(s3)
    own = {**s3, "skip_instance_cache": True}
    other, writer = StoreWriter(url, own), StoreWriter(url, own)
    mark = "00000000000000aa"
    put = writer.fs.pipe_file

    def answered_412(path: str, value: bytes, **kwargs: Any) -> None:
        with contextlib.suppress(FileExistsError):
            put(path, value, **kwargs)
        raise OSError("An error occurred (412) when calling the PutObject operation")

    writer.fs.pipe_file = answered_412
    assert writer.claim("t", 4, 0, mark, 9).last == 9  # landed, its answer lost
    looked = writer.ledger_entry

    def look_then_let_the_other_claim(*args: Any) -> Any:
        found = looked(*args)
        if found is None:
            other.claim("t", 4, 10, mark, 15)
        return found

    writer.ledger_entry = look_then_let_the_other_claim  # type: ignore[method-assign]
    assert writer.claim("t", 4, 10, mark, 19).last == 15

    # A put that failed and left nothing is the store's failure, raised for a retry.
    def timed_out(path: str, value: bytes, **kwargs: Any) -> None:
        raise OSError("timed out")

    writer.ledger_entry = looked  # type: ignore[method-assign]
    writer.fs.pipe_file = timed_out
    with pytest.raises(OSError, match="timed out"):
        writer.claim("t", 4, 20, mark, 29)


def test_what_other_processes_write_is_seen_after_a_listing(
    store_at: tuple[str, dict[str, Any]],
) -> None:
    """A partition moves between collector processes, each with a filesystem of its own.
    The new owner listed the partition's ledger while pruning it once; an entry the old
    owner made since must still be read, and its extent taken (fsspec answered "not
    found" from its cached listing, and the conditional put then refused the claim: the
    batch failed for ever). A reader that listed an hour sees files written since."""
    url, options = store_at
    # skip_instance_cache: a filesystem each, as two processes have.
    own = {**options, "skip_instance_cache": True}
    old_owner, new_owner = StoreWriter(url, own), StoreWriter(url, own)
    mark = "00000000000000aa"
    old_owner.claim("t", 3, 0, mark, 9)
    new_owner.prune_ledger("t", 3, committed=0)  # lists the ledger's folder
    old_owner.claim("t", 3, 10, mark, 19)
    entry = new_owner.ledger_entry("t", 3, 10, mark)
    assert entry is not None and entry.last == 19
    assert new_owner.claim("t", 3, 10, mark, 25).last == 19

    reader = SpanStore(url, own)
    old_owner.write_batch(BatchId("t", 3, 0, 9, mark), _tables(10))
    assert reader.count() == 10
    old_owner.write_batch(BatchId("t", 3, 10, 19, mark), _tables(10, offset=10))
    assert reader.count() == 20


def test_prune_removes_only_old_committed_entries(tmp_path: Path) -> None:
    writer = StoreWriter(str(tmp_path))
    for first, last in ((0, 9), (10, 19), (20, 29)):
        writer.claim("t", 0, first, "00000000000000aa", last)
    folder = tmp_path / "_ledger" / "t" / "p0"
    old = time.time() - 7200
    for path in folder.iterdir():
        entry = json.loads(path.read_text())
        entry["created_at"] = old
        path.write_text(json.dumps(entry))
    assert writer.prune_ledger("t", 0, committed=20, older_than_s=3600) == 2
    assert sorted(p.name[:20] for p in folder.iterdir()) == [f"{20:020d}"]

    # A young entry is read once, not at every pruning (each read is a request on an
    # object store).
    writer.claim("t", 0, 30, "00000000000000aa", 39)
    opened: list[str] = []
    open_file = writer.fs.open

    def counting_open(path: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return open_file(path, *args, **kwargs)

    writer.fs.open = counting_open
    assert writer.prune_ledger("t", 0, committed=40, older_than_s=3600) == 1  # 20, old
    assert len(opened) == 2
    assert writer.prune_ledger("t", 0, committed=40, older_than_s=3600) == 0
    assert len(opened) == 2  # 30, young when read, not read again
    assert writer.prune_ledger("t", 0, committed=40, older_than_s=0) == 1
    assert list(folder.iterdir()) == []


def test_object_store_urls_work_through_fsspec() -> None:
    url = f"memory://store-{uuid.uuid4().hex}"
    writer = StoreWriter(url)
    assert not writer.local
    batch = BatchId("t", 0, 0, 9, "00000000000000aa")
    writer.write_batch(batch, _tables(10))
    assert writer.claim("t", 0, 0, "00000000000000aa", 9).last == 9
    store = SpanStore(url)
    assert [s.span_id for s in store.spans()] == [span(i).span_id for i in range(10)]


def test_dead_letters_the_topic_refuses_are_kept(tmp_path: Path) -> None:
    writer = StoreWriter(str(tmp_path))
    base = writer.write_dead_letter("t", 1, 42, "00000000000000aa", b"\x00raw", {"reason": "a"})
    assert (Path(base + ".bin")).read_bytes() == b"\x00raw"
    # A new log's record at the same offset: kept beside it, not over it.
    other = writer.write_dead_letter("t", 1, 42, "00000000000000bb", b"other", {"reason": "b"})
    assert other != base and (Path(base + ".bin")).read_bytes() == b"\x00raw"
    assert json.loads(Path(base + ".json").read_text())["reason"] == "a"
    assert not os.listdir(tmp_path / "_dead_letters" / "t" / "p1")[0].startswith(".")
