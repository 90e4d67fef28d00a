"""Writing the span store: atomic files, and a ledger that makes replays exactly-once.

How readers never see a span twice
----------------------------------
The collector takes records from each Kafka partition in *batches* of consecutive
offsets ``[first, last]`` and writes each batch as one file per hour folder, named
after the batch (:mod:`spanmill.store.layout`). It commits the Kafka offset
``last + 1`` only once every file of the batch is durable.

A crash between the write and the commit makes the next collector read the batch
again. Were it to cut the batch differently (``[first, last']``), the rows of the
records both batches hold would be stored twice, under two names. The *ledger*
prevents that: before the first file of a batch is written, the batch's extent is
recorded at ``_ledger/<topic>/p<partition>/<first>-<fingerprint>.json``, created
only if absent. Whoever builds a batch starting at ``first`` from the same log
(same fingerprint of the record at ``first``) reads the ledger first and ends that
batch at the recorded ``last``; only a batch no one has started yet gets a new entry.

Why that is exactly-once for readers:

1. Every batch starts at an offset the collector committed, or right after the
   batch before it; committed offsets are always some batch's ``last + 1``. So
   batch starts are ledger entries, and the ledger's extents never overlap.
2. A ledger entry is written once and never changed, so every attempt at the
   batch covers the same records, and each record lies in exactly one batch.
3. The rows of a record depend only on the record (and the collector's settings):
   each span goes to the one file named by its batch and its start hour. Writing
   that file again replaces it whole (rename on a local disk, a single put on an
   object store), never adds a second copy.
4. So at any moment each span of each record is in at most one file, and once the
   offset past it is committed, in exactly one.

The fingerprint keeps two incarnations of a log apart (a topic created again, a
broker that lost its storage) so that a new log's offset 0 is never taken for the
old one's. Ledger entries are small and can be pruned once their batch is
committed (:meth:`StoreWriter.prune_ledger`).

On a local disk an entry is created exclusively (a hard link that fails if the
name exists), files are fsynced and then renamed into place, and the folders are
fsynced. On object stores an entry is created if a read finds it absent, which
leaves a window only for two collectors racing for one partition at once; each
file is one put under its final name, which appears whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from spanmill.store.layout import (
    DEAD_LETTER_DIR,
    BatchId,
    hour_dir,
    ledger_dir,
    ledger_name,
    record_name,
)
from spanmill.store.schema import DICTIONARY_COLUMNS, STATISTICS_COLUMNS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerEntry:
    """Where one batch ends, fixed by whoever started it first."""

    topic: str
    partition: int
    first: int
    last: int
    fingerprint: str
    created_at: float
    writer: str

    def batch(self) -> BatchId:
        return BatchId(self.topic, self.partition, self.first, self.last, self.fingerprint)


def writer_id() -> str:
    """Who writes: this host and process, as the ledger and the upkeep lock record it."""
    return f"{socket.gethostname()}/{os.getpid()}"


def open_store(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem and root path of a store URL (a folder or e.g. s3://b/p).

    Other processes write the store all the time, and fsspec keeps a folder's listing
    once made and then answers for every file in it from that listing: a file another
    process wrote since is "not found" without a request (``DirCache``). Whatever reads
    what others write therefore drops that listing first (``invalidate_cache``); the cache is
    kept for the rest, where it spares a request for each file a read opens.
    """
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, root.rstrip("/")


class StoreWriter:
    """Writes batches of span rows into a store, and keeps its ledger."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        compression: str = "zstd",
        compression_level: int | None = 1,
    ) -> None:
        self.url = url
        self.fs, self.root = open_store(url, storage_options)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.compression = compression
        self.compression_level = compression_level
        self._durable_dirs: set[str] = set()
        # When each ledger entry read by pruning was made, by folder: an entry is opened
        # once while it is too young to go, not at every pruning.
        self._ledger_created: dict[str, dict[str, float]] = {}
        if self.local:
            self._ensure_dir(self.root)

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if self.root else relative

    # -- data files ------------------------------------------------------------------

    def _write_parquet(self, table: pa.Table, sink: Any) -> None:
        pq.write_table(
            table,
            sink,
            compression=self.compression,
            compression_level=self.compression_level,
            use_dictionary=[name for name in DICTIONARY_COLUMNS if name in table.column_names],
            write_statistics=[name for name in STATISTICS_COLUMNS if name in table.column_names],
        )

    def _parquet_bytes(self, table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        self._write_parquet(table, sink)
        return sink.getvalue().to_pybytes()

    def write_batch(self, batch: BatchId, tables: Mapping[int, pa.Table]) -> list[str]:
        """Write a batch's tables, one per hour (hours since the epoch); paths relative."""
        written = []
        for hour, table in tables.items():
            relative = f"{hour_dir(hour)}/{batch.file_name()}"
            self.write_file(relative, table)
            written.append(relative)
        return written

    def write_file(self, relative: str, table: pa.Table) -> None:
        """One data file, appearing whole under its name or not at all."""
        if self.local:
            self._write_local(self.path(relative), table)
        else:
            self.fs.pipe_file(self.path(relative), self._parquet_bytes(table))

    def _ensure_dir(self, path: str) -> None:
        """Create a folder and make its entry durable in its parent, once per process."""
        if path in self._durable_dirs:
            return
        if not os.path.isdir(path):
            parent = os.path.dirname(path)
            if parent and parent != path:
                self._ensure_dir(parent)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            if parent:
                _fsync_dir(parent)
        self._durable_dirs.add(path)

    def _write_local(self, final: str, table: pa.Table) -> None:
        folder = os.path.dirname(final)
        self._ensure_dir(folder)
        # A dot-name is invisible to readers while it is incomplete.
        temp = os.path.join(folder, f".{os.path.basename(final)}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temp, "wb") as file:
                self._write_parquet(table, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        _fsync_dir(folder)

    # -- ledger ----------------------------------------------------------------------

    def _ledger_path(self, topic: str, partition: int, first: int, fingerprint: str) -> str:
        return self.path(f"{ledger_dir(topic, partition)}/{ledger_name(first, fingerprint)}")

    def ledger_entry(
        self, topic: str, partition: int, first: int, fingerprint: str
    ) -> LedgerEntry | None:
        """The recorded extent of the batch starting at ``first``, if anyone started it."""
        path = self._ledger_path(topic, partition, first, fingerprint)
        # Asked of the store, not of a listing made before another collector made it (a
        # collector that had pruned this ledger could not read the entry, and, refused
        # by the conditional put as well, its batch failed for ever).
        self.fs.invalidate_cache(path)
        try:
            with self.fs.open(path, "rb") as file:
                data = json.loads(file.read())
        except FileNotFoundError:
            return None
        return LedgerEntry(**data)

    def claim(
        self, topic: str, partition: int, first: int, fingerprint: str, last: int
    ) -> LedgerEntry:
        """Record that the batch starting at ``first`` ends at ``last``, unless it is recorded.

        Returns the entry in force: this one, or the one recorded before, whose
        ``last`` the caller must then use.
        """
        existing = self.ledger_entry(topic, partition, first, fingerprint)
        if existing is not None:
            return existing
        entry = LedgerEntry(topic, partition, first, last, fingerprint, time.time(), writer_id())
        path = self._ledger_path(topic, partition, first, fingerprint)
        # Of two collectors that both found no entry (a partition's old owner flushing as
        # its new owner starts), one records its extent and the other takes that one, so
        # both write the same files instead of overlapping ones.
        if self.create_exclusive(path, json.dumps(entry.__dict__).encode()):
            return entry
        found = self.ledger_entry(topic, partition, first, fingerprint)
        if found is None:  # pragma: no cover - entries are never removed while in use
            raise FileExistsError(path)
        return found

    def create_exclusive(self, path: str, content: bytes) -> bool:
        """Write ``content`` to ``path`` unless it exists; False where it did. An object
        store takes a conditional put (If-None-Match); a local disk a hard link, which
        fails if the name exists, of a complete and synced file."""
        if not self.local:
            try:
                self.fs.pipe_file(path, content, mode="create")
            except OSError:
                # FileExistsError where the store says why (AWS's PreconditionFailed); a
                # store that answers 412 alone, or a put whose answer was lost, is a bare
                # OSError: whether the object is there now tells them apart from a failure.
                self.fs.invalidate_cache(path)
                if self.fs.exists(path):
                    return False
                raise
            return True
        folder = os.path.dirname(path)
        self._ensure_dir(folder)
        temp = os.path.join(folder, f".{uuid.uuid4().hex}.tmp")
        with open(temp, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)
        _fsync_dir(folder)
        return True

    def prune_ledger(
        self, topic: str, partition: int, committed: int, older_than_s: float = 3600.0
    ) -> int:
        """Remove entries of batches below the committed offset, once they are old.

        A committed batch is never read again by a collector that follows the group's
        offsets; the age margin covers one that fell behind its group unnoticed.
        """
        folder = self.path(ledger_dir(topic, partition))
        self.fs.invalidate_cache(folder)
        try:
            names = self.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return 0
        removed = 0
        cutoff = time.time() - older_than_s
        seen = self._ledger_created.setdefault(folder, {})
        for gone in seen.keys() - set(names):
            del seen[gone]
        for name in names:
            base = name.rsplit("/", 1)[-1]
            head = base.split("-", 1)[0]
            if not head.isdigit() or int(head) >= committed:
                continue
            if seen.get(name, 0.0) >= cutoff:
                continue  # read before and still too young: not opened again
            try:
                with self.fs.open(name, "rb") as file:
                    entry = json.loads(file.read())
            except (FileNotFoundError, ValueError):
                continue
            seen[name] = float(entry.get("created_at", 0))
            if entry.get("last", committed) < committed and seen[name] < cutoff:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(name)
                del seen[name]
                removed += 1
        return removed

    # -- dead letters that Kafka refused ---------------------------------------------

    def write_dead_letter(
        self,
        topic: str,
        partition: int,
        offset: int,
        fingerprint: str,
        value: bytes,
        meta: Mapping[str, Any],
    ) -> str:
        """Keep a dead letter the dead-letter topic would not take (too large, say).

        Named by its record's offset and fingerprint, as ledger entries are: a new log's
        record at the same offset is another dead letter, not this one replaced.
        Returns the path both files share, less ``.bin`` (the value) and ``.json``.
        """
        base = f"{DEAD_LETTER_DIR}/{topic}/p{partition}/{record_name(offset, fingerprint)}"
        for suffix, content in ((".bin", value), (".json", json.dumps(dict(meta)).encode())):
            path = self.path(base + suffix)
            if self.local:
                folder = os.path.dirname(path)
                self._ensure_dir(folder)
                temp = f"{path}.{uuid.uuid4().hex}.tmp"
                with open(temp, "wb") as file:
                    file.write(content)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temp, path)
                _fsync_dir(folder)
            else:
                self.fs.pipe_file(path, content)
        return self.path(base)


def put_file(fs: Any, path: str, content: bytes) -> None:
    """Write a small file whole: on a local disk through a hidden temp file, fsynced and
    renamed into place; on an object store as one put."""
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, content)
        return
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(folder)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
