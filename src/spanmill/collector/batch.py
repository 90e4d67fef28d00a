"""Turning a batch of Kafka records into durable Parquet files: the collector's core.

:class:`BatchProcessor` is a plain function of its inputs: decode each record
(:mod:`~spanmill.collector.decode`), translate foreign conventions
(:mod:`~spanmill.collector.translate`), redact (:mod:`~spanmill.collector.redact`),
build one Arrow table per hour, write them (:class:`~spanmill.store.StoreWriter`).
A record that cannot be decoded is reported as a dead letter with its reason;
it never stops the others.

Processing is CPU-bound and the Kafka client's fetches wait on the broker, so the two
overlap: :class:`ProcessPool` runs processors in worker processes; with ``workers=0``
:class:`ThreadProcessing` runs one in a thread of the consumer's process.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any, Protocol

from spanmill.collector.decode import decode_spans, native_may_read
from spanmill.collector.redact import Redactor
from spanmill.collector.translate import Translation
from spanmill.collector.tuning import tune_process
from spanmill.config import CollectorSettings
from spanmill.logs import stacks_on_sigusr1
from spanmill.spans.errors import SpanDecodeError
from spanmill.store.layout import BatchId
from spanmill.store.rows import (
    HourlyColumns,
    RowFailed,
    SpanParts,
    check_storable,
    native_decoder,
)
from spanmill.store.writer import StoreWriter

log = logging.getLogger(__name__)

# A record whose spans broke the collector itself; its bytes go to the dead letters
# with this reason rather than taking the batch, and the collector, down.
INTERNAL_ERROR = "internal_error"


@dataclass(frozen=True)
class ProcessingConfig:
    """What a processor needs, picklable for worker processes."""

    store_url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    compression: str = "zstd"
    max_message_bytes: int = 1024 * 1024
    redact_rules: tuple[str, ...] = ("email", "api_key", "card_number")
    redact_patterns: dict[str, str] = field(default_factory=dict)
    attributes_allow: tuple[str, ...] = ()
    attributes_deny: tuple[str, ...] = ()
    conventions: tuple[str, ...] = ("openllmetry", "openinference")

    @classmethod
    def from_settings(cls, settings: CollectorSettings) -> ProcessingConfig:
        return cls(
            store_url=settings.store_url,
            storage_options=dict(settings.storage_options),
            compression=settings.compression,
            max_message_bytes=settings.kafka.max_message_bytes,
            redact_rules=tuple(settings.redact_rules),
            redact_patterns=dict(settings.redact_patterns),
            attributes_allow=tuple(settings.attributes_allow),
            attributes_deny=tuple(settings.attributes_deny),
            conventions=tuple(settings.conventions),
        )


@dataclass
class BatchJob:
    """The records of one batch, as plain lists (cheap to send to a worker)."""

    batch: BatchId
    offsets: list[int]
    timestamps: list[int]
    values: list[bytes]
    content_types: list[str | None]

    def without(self, offset: int) -> BatchJob:
        """The same batch less the record at ``offset``."""
        kept = [i for i, o in enumerate(self.offsets) if o != offset]
        return BatchJob(
            self.batch,
            [self.offsets[i] for i in kept],
            [self.timestamps[i] for i in kept],
            [self.values[i] for i in kept],
            [self.content_types[i] for i in kept],
        )


@dataclass
class BatchOutcome:
    batch: BatchId
    files: list[str]
    records: int
    spans: int
    dead: list[tuple[int, str, str]]  # offset, reason, detail
    redactions: dict[str, int]
    translations: dict[str, int]
    seconds: float


class BatchProcessor:
    """Decode, translate, redact and write one batch at a time.

    The native decoder takes each record's spans from its bytes straight into its
    hour's columns (see :meth:`_native_arguments`); a record it gives back takes the
    steps: the authority decodes, :meth:`steps` translates and redacts, Python appends.
    ``native``: False sends every record the steps' way, leaving the C extension out:
    what an install without a C compiler runs, and the oracle the tests hold the native
    path to.
    """

    def __init__(self, config: ProcessingConfig, *, native: bool = True) -> None:
        self.config = config
        self.writer = StoreWriter(
            config.store_url,
            config.storage_options,
            compression=config.compression,
            compression_level=1 if config.compression == "zstd" else None,
        )
        self.redactor = Redactor(
            config.redact_rules,
            config.redact_patterns,
            config.attributes_allow,
            config.attributes_deny,
        )
        self.translation = Translation(config.conventions)
        # The native decoder this processor owns (its settings, key cache and columns).
        self.decoder = native_decoder() if native else None
        self._native = self._native_arguments()

    def _native_arguments(self) -> tuple[Any, Any, int, frozenset[str], Any] | None:
        """``append_record`` and what it needs to know of redaction and translation.

        The decoder scans for what the redaction patterns need, and marks the rows of
        any record where it finds some, or a key that the attribute lists drop, that
        translation looks for or that makes a reward: :meth:`steps` finishes those rows
        (:meth:`HourlyColumns.tables`). A key the attribute lists have not judged yet
        sends its record to the authority, whose steps judge it for the records after
        (``Redactor.verdicts``). Where a custom pattern leaves nothing to scan for, every
        record's rows are marked as found (a negative digit run): all take the patterns.
        """
        decoder, redactor = self.decoder, self.redactor
        if decoder is None:
            return None
        gates: tuple[tuple[bytes, bytes, int], ...] | None
        if redactor.prefilter is not None:
            gates, digits = redactor.prefilter
        else:
            gates, digits = ((), -1) if redactor.rules else (None, 0)
        verdicts = redactor.verdicts if redactor.filters_keys else None
        return decoder.append_record, gates, digits, self.translation.signature, verdicts

    def spans_of(
        self,
        value: bytes,
        content_type: str | None,
        redactions: dict[str, int],
        translations: dict[str, int],
    ) -> list[SpanParts]:
        """One record's spans by the authority, ready for the store; raises SpanDecodeError."""
        spans = decode_spans(value, content_type, self.config.max_message_bytes)
        for index, parts in enumerate(spans):
            check_storable(parts, index)
        for parts in spans:
            self.steps(parts, redactions, translations)
        return spans

    def steps(
        self,
        parts: SpanParts,
        redactions: dict[str, int],
        translations: dict[str, int],
        *,
        patterns: bool = True,
    ) -> None:
        """Translate foreign conventions and redact, in place, counting what each did.

        ``patterns``: False only where a scan for the redactor's prefilter found nothing.
        """
        # The keys as they came are judged too: the native decoder leaves a record with
        # a key not yet judged to these steps, and a key that translation takes away
        # would otherwise never be judged, sending every such record here whole.
        self.redactor.judge(parts.attributes)
        self.redactor.deny_before_translation(parts, redactions)
        translated = self.translation.apply(parts.attributes, translations)
        # A translated span has new texts (message JSON): its patterns always run.
        self.redactor.apply(parts, redactions, patterns=patterns or translated)

    def process(self, job: BatchJob) -> BatchOutcome:
        """The batch's rows written, its undecodable records dead-lettered. A record that
        breaks the collector itself (a bug) goes to the dead-letter topic alone: the batch
        is made again without it, as often as records break it, and the others' rows are
        stored, none of its own."""
        started = time.perf_counter()
        records = len(job.offsets)
        broken: list[tuple[int, str, str]] = []
        with _collection_paused():
            while True:
                try:
                    outcome = self._process(job)
                    break
                except _RecordBroke as broke:
                    batch = job.batch
                    log.error("record %s/%s/%s broke the collector", batch.topic,
                              batch.partition, broke.offset, exc_info=broke.error)  # fmt: skip
                    detail = f"{type(broke.error).__name__}: {broke.error}"
                    broken.append((broke.offset, INTERNAL_ERROR, detail))
                    job = job.without(broke.offset)
        if broken:
            outcome.dead = sorted([*outcome.dead, *broken])
            outcome.records = records
            outcome.seconds = time.perf_counter() - started
        return outcome

    def _process(self, job: BatchJob) -> BatchOutcome:
        started = time.perf_counter()
        batch = job.batch
        hourly = HourlyColumns(decoder=self.decoder)
        dead: list[tuple[int, str, str]] = []
        redactions: dict[str, int] = {}
        translations: dict[str, int] = {}
        # The native decoder is called here, not through HourlyColumns.append_record: this
        # loop runs once a record, and a call less is worth having on one-span records.
        native, hours = self._native, hourly.native_hours
        max_bytes = self.config.max_message_bytes
        for offset, timestamp, value, content_type in zip(
            job.offsets, job.timestamps, job.values, job.content_types, strict=True
        ):
            try:
                if native is not None and native_may_read(value, content_type, max_bytes):
                    append, gates, digits, fallback, verdicts = native
                    appended = append(
                        hours, value, gates, digits, fallback, verdicts,
                        batch.topic, batch.partition, offset, timestamp,
                    )  # fmt: skip
                    if appended is not None:
                        hourly.rows += appended
                        continue
                spans = self.spans_of(value, content_type, redactions, translations)
                for index, parts in enumerate(spans):
                    hourly.append(parts, batch.topic, batch.partition, offset, index, timestamp)
            except SpanDecodeError as exc:
                dead.append((offset, exc.reason, exc.detail))
                continue
            except Exception as exc:  # a collector bug must not lose the batch
                # Some of its rows may be in: the batch is made again without it.
                raise _RecordBroke(offset, exc) from exc
        try:
            tables = hourly.tables(
                lambda parts, found: self.steps(parts, redactions, translations, patterns=found)
            )
        except RowFailed as exc:  # a collector bug in the steps: as above
            raise _RecordBroke(exc.offset, exc.__cause__ or exc) from exc
        files = self.writer.write_batch(batch, tables) if hourly.rows else []
        return BatchOutcome(
            batch=batch,
            files=files,
            records=len(job.offsets),
            spans=hourly.rows,
            dead=dead,
            redactions=redactions,
            translations=translations,
            seconds=time.perf_counter() - started,
        )


class _RecordBroke(Exception):
    """A record that broke the collector while its batch was made: ``offset``, with the
    ``error`` it raised."""

    def __init__(self, offset: int, error: BaseException) -> None:
        super().__init__(offset)
        self.offset = offset
        self.error = error


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while a batch is turned into rows.

    A batch makes hundreds of thousands of small objects, none of them in cycles,
    and each collection pass walks all of them: about a quarter of decoding time.
    Reference counting frees them as usual; cycles wait for the end of the batch.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Processing(Protocol):
    def submit(self, job: BatchJob) -> Future[BatchOutcome]: ...

    def close(self) -> None: ...


class ThreadProcessing:
    """Processes batches one at a time in a thread of the consumer's own process.

    The consumer goes on fetching while a batch is decoded and written: fetches wait on
    the broker, and the decoder and Parquet's writer leave the interpreter's lock to it
    between records and while compressing.
    """

    def __init__(self, config: ProcessingConfig) -> None:
        self.processor = BatchProcessor(config)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spanmill-batch")

    def submit(self, job: BatchJob) -> Future[BatchOutcome]:
        return self.executor.submit(self.processor.process, job)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=False)


_worker: BatchProcessor | None = None


def _watch_parent(parent: int) -> None:
    # A worker must not outlive a collector killed without a chance to stop it.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _init_worker(config: ProcessingConfig, parent: int) -> None:
    global _worker
    _worker = BatchProcessor(config)
    tune_process()
    stacks_on_sigusr1()
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _process(job: BatchJob) -> BatchOutcome:
    assert _worker is not None, "worker used before its initializer ran"
    return _worker.process(job)


def _ready() -> bool:
    return _worker is not None


class ProcessPool:
    """Processes batches in worker processes (started fresh, not forked)."""

    def __init__(self, config: ProcessingConfig, workers: int) -> None:
        self.executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=get_context("spawn"),
            initializer=_init_worker,
            initargs=(config, os.getpid()),
        )
        # Start every worker now: a bad store URL fails here, not on the first batch.
        for future in [self.executor.submit(_ready) for _ in range(workers)]:
            future.result()

    def submit(self, job: BatchJob) -> Future[BatchOutcome]:
        return self.executor.submit(_process, job)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=False)


def make_processing(config: ProcessingConfig, workers: int) -> Processing:
    return ProcessPool(config, workers) if workers > 0 else ThreadProcessing(config)
