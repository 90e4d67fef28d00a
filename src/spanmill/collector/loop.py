"""The collector's consume loop: Kafka records in, durable Parquet out, offsets committed after.

One thread owns the Kafka consumer and runs :meth:`Collector.run`:

1. poll records and append them to a buffer per partition;
2. when a buffer is due (``batch_max_spans`` records, ``batch_max_bytes`` bytes, or
   its oldest record ``batch_max_seconds`` old), fix the batch's extent in the
   store's ledger (:mod:`spanmill.store.writer`) and hand it to the processing
   workers (:mod:`spanmill.collector.batch`);
3. as batches finish, in order: send their dead letters, then commit the offset
   past the batch. Nothing is committed before its files are durable and its dead
   letters delivered.

Rebalances only set flags (the Kafka client calls its listener from its own event
loop, where blocking would stall heartbeats); the loop then writes what it holds of
the partitions it lost. Their new owner reads them again from the last commit,
and the ledger makes both end up with the same files. A partition whose log was
replaced (offsets going backwards) is written out first, too.

:meth:`Collector.stop` (SIGTERM) makes the loop write everything it holds, wait
for it, commit, and leave the group.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spanmill import semconv as sc
from spanmill.collector.batch import (
    BatchJob,
    BatchOutcome,
    Processing,
    ProcessingConfig,
    make_processing,
)
from spanmill.collector.decode import FAST_PATH
from spanmill.collector.dlq import DeadLetter
from spanmill.collector.metrics import CollectorMetrics
from spanmill.collector.sizing import settled, sized
from spanmill.config import CollectorSettings
from spanmill.errors import SpanmillError
from spanmill.store.layout import BatchId, fingerprint
from spanmill.store.writer import LedgerEntry, StoreWriter

_T = TypeVar("_T")

log = logging.getLogger(__name__)

_POLL_MS = 200
_DLQ_TIMEOUT_S = 10.0
_COMMIT_TIMEOUT_MS = 10_000
_LAG_EVERY_S = 1.0
_PRUNE_EVERY_S = 600.0
# How long a partition's log must seem to end before the consumer's position before it
# is taken for a new log (and read again from its start).
LOG_ENDS_SETTLE_S = 10.0


class LogEnds:
    """Whether a partition's log has ended before the consumer's position long enough to
    be a new log. A broker's high watermark can trail what was already read for a
    moment (a new leader catching up after a failover); a new log (a topic made again, a
    broker that lost its storage) stays shorter. Taken for a new one, a log is read
    again from its start: a mistake would store every record still in it twice."""

    def __init__(self, settle_s: float = LOG_ENDS_SETTLE_S) -> None:
        self.settle_s = settle_s
        self._since: dict[int, float] = {}

    def settled(self, partition: int, position: int, high: int, now: float) -> bool:
        """True once the log has ended before ``position`` for ``settle_s``."""
        if position <= high:
            self._since.pop(partition, None)
            return False
        return now - self._since.setdefault(partition, now) >= self.settle_s

    def forget(self, partition: int) -> None:
        self._since.pop(partition, None)


class CollectorError(SpanmillError):
    """The collector cannot go on (its store cannot be written, say)."""


def _content_type(headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    for name, value in headers or ():
        if name.lower() == sc.CONTENT_TYPE_HEADER and value:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return value.decode("latin-1")
    return None


def fetch_options(settings: CollectorSettings) -> dict[str, int]:
    """How the collector's consumer fetches and polls (the bench's raw consumer uses them too)."""
    return {
        # A poll takes all that the last fetch brought, so the next fetch is under
        # way while those records are written.
        "max_poll_records": max(500, 4 * settings.batch_max_spans),
        "max_partition_fetch_bytes": max(8 * 1024 * 1024, settings.kafka.max_message_bytes * 2),
        "fetch_max_bytes": 64 * 1024 * 1024,
    }


@dataclass
class PartitionBuffer:
    """Records of one partition taken but not yet handed to a batch."""

    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)
    size: int = 0
    since: float = 0.0
    # The ledger entry for the batch starting at offsets[0], once looked up.
    entry: LedgerEntry | None = None
    looked_up: tuple[int, str] | None = None

    def take(self, count: int) -> dict[str, list[Any]]:
        taken: dict[str, list[Any]] = {
            "offsets": self.offsets[:count],
            "timestamps": self.timestamps[:count],
            "keys": self.keys[:count],
            "values": self.values[:count],
            "headers": self.headers[:count],
        }
        del self.offsets[:count], self.timestamps[:count], self.keys[:count]
        del self.values[:count], self.headers[:count]
        self.size = sum(len(value) for value in self.values)
        self.entry, self.looked_up = None, None
        self.since = time.monotonic() if self.offsets else 0.0
        return taken


@dataclass
class InFlight:
    """A batch handed to the workers, and what finishing it needs."""

    partition: int
    batch: BatchId
    job: BatchJob
    keys: list[bytes | None]
    headers: list[Any]
    taken_at: float
    future: Future[BatchOutcome]
    # The partition's assignment epoch when the batch was taken; see Collector._epochs.
    epoch: int = 0
    attempts: int = 1
    failing_since: float = 0.0  # monotonic time of the first failed write
    outcome: BatchOutcome | None = None
    delivered: set[int] = field(default_factory=set)
    retry_at: float = 0.0
    dead_letters_since: float = 0.0  # monotonic time of the first try to send its dead letters


class Collector:
    """Consume the span topic into the store. Use :meth:`start`, :meth:`run`, :meth:`stop`."""

    def __init__(
        self,
        settings: CollectorSettings,
        *,
        metrics: CollectorMetrics | None = None,
        collector_id: str | None = None,
    ) -> None:
        if settings.processes == "auto":  # the one consume loop is this one
            settings = settings.model_copy(update={"processes": 1})
        self.settings = settings = sized(settings)
        self.workers = settled(settings).workers
        self.topic = settings.kafka.spans_topic
        self.metrics = metrics if metrics is not None else CollectorMetrics()
        self.collector_id = collector_id or f"{socket.gethostname()}/{os.getpid()}"
        self.ledger = StoreWriter(settings.store_url, settings.storage_options)
        self.consumer: Any = None
        self.producer: Any = None
        self.processing: Processing | None = None
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._events: deque[tuple[str, list[Any]]] = deque()
        self._buffers: dict[int, PartitionBuffer] = {}
        self._next_offset: dict[int, int] = {}
        self._inflight: deque[InFlight] = deque()
        self._pending_commits: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._assigned: set[int] = set()
        # Bumped whenever a partition is assigned, taken away, or its offsets go back:
        # a batch taken in an older epoch is written but its offset never committed,
        # for it may belong to a log the group no longer reads.
        self._epochs: dict[int, int] = {}
        self._joined = False
        self._commit_retry_at = 0.0
        self._last_lag = 0.0
        self._log_ends = LogEnds()
        self._last_prune = time.monotonic()
        self._pruning: threading.Thread | None = None
        self.last_loop = 0.0
        self.spans_written = 0
        self.dead_letters = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and connect to Kafka; raises if either cannot be done."""
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.consumer.subscription_state import ConsumerRebalanceListener
        from kafka.errors import KafkaError

        collector = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: list[Any]) -> None:
                collector._events.append(("revoked", list(revoked)))

            def on_partitions_assigned(self, assigned: list[Any]) -> None:
                collector._events.append(("assigned", list(assigned)))

            def on_partitions_lost(self, lost: list[Any]) -> None:
                collector._events.append(("lost", list(lost)))

        settings = self.settings
        self.processing = make_processing(ProcessingConfig.from_settings(settings), self.workers)
        options = settings.kafka.client_options()
        session = settings.session_timeout_ms
        try:
            self.producer = KafkaProducer(
                **options,
                client_id=f"spanmill-collector-{self.collector_id}",
                acks="all",
                linger_ms=5,
                # Dead letters carry the original bytes, however large they were.
                max_request_size=max(settings.kafka.max_message_bytes * 4, 16 * 1024 * 1024),
                max_block_ms=10_000,
                request_timeout_ms=10_000,
                delivery_timeout_ms=30_000,
                reconnect_backoff_max_ms=5_000,
                allow_auto_create_topics=False,
            )
            self.consumer = KafkaConsumer(
                **options,
                client_id=f"spanmill-collector-{self.collector_id}",
                group_id=settings.group_id,
                enable_auto_commit=False,
                auto_offset_reset=settings.auto_offset_reset,
                session_timeout_ms=session,
                heartbeat_interval_ms=max(500, session // 3),
                **fetch_options(settings),
                reconnect_backoff_max_ms=5_000,
                # A topic made by accident has the broker's default partitions; the
                # collector waits for the real one instead.
                allow_auto_create_topics=False,
            )
        except KafkaError as exc:
            self.processing.close()
            raise CollectorError(
                f"cannot reach Kafka at {settings.kafka.bootstrap_servers}: {exc}; check "
                "SPANMILL_KAFKA_BOOTSTRAP_SERVERS and that the broker is up"
            ) from None
        self.consumer.subscribe([self.topic], listener=Listener())
        log.info(
            "collector %s: %s (group %s) → %s, %s decoding, %d workers",
            self.collector_id,
            self.topic,
            settings.group_id,
            settings.store_url,
            FAST_PATH,
            self.workers,
        )

    def stop(self) -> None:
        """Ask the loop to write what it holds, commit, and return (thread- and signal-safe)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """Asked to stop, or stopped."""
        return self._stop.is_set() or self._stopped.is_set()

    @property
    def ready(self) -> bool:
        """Joined the group and looping: what /readyz reports."""
        return (
            self._joined and time.monotonic() - self.last_loop < 30 and not self._stopped.is_set()
        )

    @property
    def alive(self) -> bool:
        """The loop is not stuck: what /healthz reports."""
        return self.last_loop == 0.0 or time.monotonic() - self.last_loop < 120

    def run(self) -> None:
        """Consume until :meth:`stop`; then flush, commit and close."""
        if self.consumer is None:
            self.start()
        try:
            while not self._stop.is_set():
                self.step()
        finally:
            self._shutdown()

    def step(self, poll_ms: int = _POLL_MS) -> None:
        """One turn of the loop: poll, buffer, write what is due, finish what is done."""
        records = self.consumer.poll(timeout_ms=poll_ms)
        now = time.monotonic()
        self.last_loop = now
        self._handle_events()
        for tp, batch in records.items():
            self._take(tp.partition, batch, now)
        for partition in list(self._buffers):
            self._flush(partition, force=False, now=now)
        self._reap(block=False)
        self._commit()
        if now - self._last_lag >= _LAG_EVERY_S:
            self._update_lag()
            self._last_lag = now
        if now - self._last_prune >= _PRUNE_EVERY_S:
            self._prune()
            self._last_prune = now

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        try:
            with contextlib.suppress(Exception):
                self._handle_events()
            for partition in list(self._buffers):
                self._flush(partition, force=True, now=time.monotonic())
            while self._inflight and time.monotonic() < deadline:
                self._reap(block=True, deadline=deadline)
            self._commit(force=True)
        finally:
            self._stopped.set()
            if self.consumer is not None:
                with contextlib.suppress(Exception):
                    self.consumer.close(autocommit=False, timeout_ms=5_000)
            if self.producer is not None:
                with contextlib.suppress(Exception):
                    self.producer.close(timeout=5)
            if self.processing is not None:
                self.processing.close()
            log.info(
                "collector %s stopped: %d spans written, %d dead letters",
                self.collector_id,
                self.spans_written,
                self.dead_letters,
            )

    # -- taking records ----------------------------------------------------------------

    def _handle_events(self) -> None:
        while self._events:
            kind, partitions = self._events.popleft()
            numbers = {tp.partition for tp in partitions if tp.topic == self.topic}
            if kind != "assigned":
                # Write what is held first, in the epoch it was taken in.
                for partition in numbers:
                    self._flush(partition, force=True, now=time.monotonic())
            for partition in numbers:
                self._new_epoch(partition)
            if kind == "assigned":
                self._joined = True
                self._assigned |= numbers
            else:
                # What was held is written above: the new owner would read it again
                # anyway, and for a log that is gone (a broker that lost its storage)
                # it is the only copy. The ledger makes both writes the same files.
                self._assigned -= numbers
                for partition in numbers:
                    self._next_offset.pop(partition, None)
                    self._committed.pop(partition, None)
            self.metrics.assigned_partitions.set(len(self._assigned))

    def _new_epoch(self, partition: int) -> None:
        """Nothing taken of this partition before now gets its offset committed."""
        self._epochs[partition] = self._epochs.get(partition, 0) + 1
        self._pending_commits.pop(partition, None)
        self._log_ends.forget(partition)

    def _close_epoch(self, partition: int, now: float) -> None:
        """Write what is held of this partition in the epoch it was taken in; start a new one."""
        self._flush(partition, force=True, now=now)
        self._new_epoch(partition)

    def _take(self, partition: int, records: list[Any], now: float) -> None:
        buffer = self._buffers.get(partition)
        if buffer is None:
            buffer = self._buffers[partition] = PartitionBuffer()
        if buffer.offsets and records and records[0].offset <= buffer.offsets[-1]:
            # Offsets went backwards: a new incarnation of the log, or a seek. What is
            # held belongs to the old one; write it before taking the new.
            log.warning(
                "partition %d went back from offset %d to %d; writing what is held first",
                partition,
                buffer.offsets[-1],
                records[0].offset,
            )
            self._close_epoch(partition, now)
            buffer = self._buffers[partition] = PartitionBuffer()
        if not buffer.offsets:
            buffer.since = now
        if not records:
            return
        # Column by column, the poll's records (named tuples) transposed in C: this
        # runs for every record, on the consumer's core.
        columns = dict(zip(type(records[0])._fields, zip(*records, strict=True), strict=True))
        values = columns["value"]
        if None in values:
            values = tuple(value if value is not None else b"" for value in values)
        buffer.offsets += columns["offset"]
        buffer.timestamps += columns["timestamp"]
        buffer.keys += columns["key"]
        buffer.headers += columns["headers"]
        buffer.values += values
        buffer.size += sum(map(len, values))
        self._next_offset[partition] = records[-1].offset + 1
        self.metrics.records_consumed.labels(str(partition)).inc(len(records))

    # -- batches -----------------------------------------------------------------------

    def _entry(self, partition: int, buffer: PartitionBuffer) -> LedgerEntry | None:
        first = buffer.offsets[0]
        mark = fingerprint(buffer.timestamps[0], buffer.keys[0], buffer.values[0])
        if buffer.looked_up != (first, mark):
            buffer.entry = self._ledger(
                "reading", partition, self.ledger.ledger_entry, self.topic, partition, first, mark
            )
            buffer.looked_up = (first, mark)
        return buffer.entry

    def _ledger(self, what: str, partition: int, call: Callable[..., _T], *args: Any) -> _T:
        """A ledger read or claim, retried like a batch write while the store refuses it."""
        failing_since = time.monotonic()
        attempts = 1
        while True:
            try:
                return call(*args)
            except Exception as exc:
                self._wait_to_retry(
                    f"{what} the ledger of partition {partition}", failing_since, attempts, exc
                )
                attempts += 1

    def _wait_to_retry(
        self, what: str, failing_since: float, attempts: int, exc: BaseException
    ) -> None:
        """Wait (growing with ``attempts``) before trying ``what`` on the store again;
        raise once the store has refused it for ``write_retry_s``."""
        now = time.monotonic()
        left = self.settings.write_retry_s - (now - failing_since)
        if left <= 0:
            raise CollectorError(
                f"{what} in {self.settings.store_url} failed {attempts} times in "
                f"{now - failing_since:.0f}s, last with {type(exc).__name__}: {exc}; check "
                "that the store is reachable and writable (SPANMILL_COLLECTOR_STORE_URL); "
                "nothing past it was committed"
            ) from exc
        log.warning("%s failed (%s: %s); trying again", what, type(exc).__name__, exc)
        time.sleep(min(2.0 ** (attempts - 1), 30.0, left))

    def _flush(self, partition: int, *, force: bool, now: float) -> None:
        """Hand over every batch of this partition's buffer that is due (all, if forced)."""
        settings = self.settings
        buffer = self._buffers.get(partition)
        while buffer is not None and buffer.offsets:
            entry = self._entry(partition, buffer)
            if entry is None:
                due = (
                    force
                    or len(buffer.offsets) >= settings.batch_max_spans
                    or buffer.size >= settings.batch_max_bytes
                    or now - buffer.since >= settings.batch_max_seconds
                )
                if not due:
                    return
                count = min(len(buffer.offsets), settings.batch_max_spans)
                first, last = buffer.offsets[0], buffer.offsets[count - 1]
                mark = fingerprint(buffer.timestamps[0], buffer.keys[0], buffer.values[0])
                entry = self._ledger(
                    "claiming",
                    partition,
                    self.ledger.claim,
                    self.topic,
                    partition,
                    first,
                    mark,
                    last,
                )
                buffer.entry, buffer.looked_up = entry, (first, mark)
            if buffer.offsets[-1] < entry.last:
                # Someone started this batch before and it ended further on: wait for
                # those records. Forced, there is no waiting: leave the batch to
                # whoever reads the partition next, uncommitted.
                if force:
                    log.info(
                        "partition %d: batch %d-%d is recorded further than what is held "
                        "(up to %d); left to the next reader",
                        partition,
                        entry.first,
                        entry.last,
                        buffer.offsets[-1],
                    )
                    self._buffers.pop(partition, None)
                return
            count = bisect.bisect_right(buffer.offsets, entry.last)
            since = buffer.since
            self._submit(partition, entry.batch(), buffer.take(count), buffer_since=since)
            buffer = self._buffers.get(partition)

    def _submit(
        self, partition: int, batch: BatchId, taken: dict[str, list[Any]], *, buffer_since: float
    ) -> None:
        assert self.processing is not None
        while len(self._inflight) >= self.settings.max_inflight_batches:
            self._reap(block=True)
        job = BatchJob(
            batch=batch,
            offsets=taken["offsets"],
            timestamps=taken["timestamps"],
            values=taken["values"],
            content_types=[
                _content_type(headers) if headers else None for headers in taken["headers"]
            ],
        )
        self._inflight.append(
            InFlight(
                partition=partition,
                batch=batch,
                job=job,
                keys=taken["keys"],
                headers=taken["headers"],
                taken_at=buffer_since or time.monotonic(),
                future=self.processing.submit(job),
                epoch=self._epochs.get(partition, 0),
            )
        )

    def _reap(self, *, block: bool, deadline: float | None = None) -> None:
        """Finish batches in the order they were handed over: dead letters, then commit."""
        while self._inflight:
            head = self._inflight[0]
            if head.outcome is None:
                if not block and not head.future.done():
                    return
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    head.outcome = head.future.result(timeout=timeout)
                except TimeoutError:
                    return
                except Exception as exc:
                    self._retry_write(head, exc)
                    continue
                self._record(head.outcome)
            if not self._deliver_dead_letters(head, block=block):
                return
            self._inflight.popleft()
            if head.epoch == self._epochs.get(head.partition, 0):
                self._pending_commits[head.partition] = head.batch.last + 1
            self.metrics.batch_seconds.observe(time.monotonic() - head.taken_at)
            if not block:
                continue
            return

    def _retry_write(self, item: InFlight, exc: BaseException) -> None:
        assert self.processing is not None
        item.failing_since = item.failing_since or time.monotonic()
        self._wait_to_retry(
            f"writing batch {item.batch.file_name()}", item.failing_since, item.attempts, exc
        )
        item.attempts += 1
        item.future = self.processing.submit(item.job)

    def _record(self, outcome: BatchOutcome) -> None:
        metrics = self.metrics
        metrics.spans_written.inc(outcome.spans)
        metrics.files_written.inc(len(outcome.files))
        metrics.write_seconds.observe(outcome.seconds)
        metrics.batch_records.observe(outcome.records)
        for rule, count in outcome.redactions.items():
            metrics.redactions.labels(rule).inc(count)
        for convention, count in outcome.translations.items():
            metrics.translated.labels(convention).inc(count)
        self.spans_written += outcome.spans

    def _deliver_dead_letters(self, item: InFlight, *, block: bool) -> bool:
        """Send the batch's dead letters; False while some wait for the broker."""
        from kafka.errors import KafkaError

        assert item.outcome is not None
        dead = [d for d in item.outcome.dead if d[0] not in item.delivered]
        if not dead:
            return True
        if not block and time.monotonic() < item.retry_at:
            return False
        item.dead_letters_since = item.dead_letters_since or time.monotonic()
        index = {offset: i for i, offset in enumerate(item.job.offsets)}
        sent = []
        for offset, reason, detail in dead:
            i = index[offset]
            letter = DeadLetter(
                topic=self.topic,
                partition=item.partition,
                offset=offset,
                timestamp_ms=item.job.timestamps[i],
                key=item.keys[i],
                value=item.job.values[i],
                headers=tuple(item.headers[i] or ()),
                reason=reason,
                detail=detail,
            )
            try:
                future = self.producer.send(
                    self.settings.kafka.dlq_topic,
                    key=letter.key,
                    value=letter.value,
                    headers=letter.dlq_headers(self.collector_id),
                )
                sent.append((letter, future))
            except KafkaError as exc:
                if not self._store_dead_letter(letter, exc, item.dead_letters_since):
                    item.retry_at = time.monotonic() + 5.0
                    return False
                item.delivered.add(offset)
        for letter, future in sent:
            try:
                future.get(timeout=_DLQ_TIMEOUT_S)
            except KafkaError as exc:
                if not self._store_dead_letter(letter, exc, item.dead_letters_since):
                    log.warning("dead letter %s not delivered yet: %s", letter.source, exc)
                    item.retry_at = time.monotonic() + 5.0
                    return False
            else:
                self.metrics.dead_letters.labels(letter.reason).inc()
                self.dead_letters += 1
            item.delivered.add(letter.offset)
        return True

    def _store_dead_letter(
        self, letter: DeadLetter, exc: BaseException, failing_since: float
    ) -> bool:
        """Keep a dead letter in the store when the topic refuses it for good, or has not
        taken it for ``write_retry_s`` (every later batch's commit waits behind it);
        False to try the topic again later."""
        waited = time.monotonic() - failing_since
        if getattr(exc, "retriable", False) and waited < self.settings.write_retry_s:
            return False
        log.error(
            "dead-letter topic %s (%s); keeping %s in the store's _dead_letters",
            "refused it" if waited < self.settings.write_retry_s else f"failing {waited:.0f}s",
            exc,
            letter.source,
        )
        self._ledger(
            "keeping a dead letter beside",
            letter.partition,
            self.ledger.write_dead_letter,
            letter.topic,
            letter.partition,
            letter.offset,
            letter.fingerprint,
            letter.value,
            letter.meta(self.collector_id),
        )
        self.metrics.dead_letters.labels(letter.reason).inc()
        self.metrics.dead_letters_stored.inc()
        self.dead_letters += 1
        return True

    # -- offsets -----------------------------------------------------------------------

    def _commit(self, *, force: bool = False) -> None:
        from kafka import TopicPartition
        from kafka.errors import CommitFailedError, KafkaError
        from kafka.structs import OffsetAndMetadata

        if not self._pending_commits:
            return
        if not force and time.monotonic() < self._commit_retry_at:
            return
        # Only partitions still ours: a moved partition's new owner commits it.
        for partition in [p for p in self._pending_commits if p not in self._assigned]:
            del self._pending_commits[partition]
        if not self._pending_commits:
            return
        offsets = {
            TopicPartition(self.topic, partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in self._pending_commits.items()
        }
        try:
            self.consumer.commit(offsets, timeout_ms=_COMMIT_TIMEOUT_MS)
        except CommitFailedError as exc:
            log.info("commit dropped, partitions moved to another collector: %s", exc)
            self.metrics.commits_failed.inc()
            self._pending_commits.clear()
            return
        except KafkaError as exc:
            log.warning("commit failed (%s); trying again", exc)
            self.metrics.commits_failed.inc()
            self._commit_retry_at = time.monotonic() + 2.0
            return
        self._committed.update(self._pending_commits)
        self._pending_commits.clear()

    def _update_lag(self) -> None:
        """Lag per partition, from the high watermark of the latest fetch.

        The same look notices a log that now ends before the consumer's position
        (see :meth:`_log_replaced`). The watermark comes with fetch responses: a
        broker's answer to a separate end-offset query may trail what it has
        already served.
        """
        from kafka import TopicPartition

        for partition in list(self._assigned):
            tp = TopicPartition(self.topic, partition)
            try:
                high = self.consumer.highwater(tp)
                position = self._next_offset.get(partition)
                if position is None:
                    # Nothing taken since (re)assignment: where the consumer will fetch.
                    position = self.consumer.position(tp, timeout_ms=200)
            except Exception:
                continue
            if high is None or position is None:
                continue
            if position > high:
                if self._log_ends.settled(partition, position, high, time.monotonic()):
                    # Asked of the broker now, not read off the last fetch.
                    self._log_ends.forget(partition)
                    end = self._end_offset(tp)
                    if end is not None and end < position:
                        self._log_replaced(partition, position, end)
                continue
            self.metrics.lag.labels(str(partition)).set(high - position)

    def _end_offset(self, tp: Any) -> int | None:
        try:
            end = self.consumer.end_offsets([tp], timeout_ms=5_000).get(tp)
        except Exception as exc:
            log.warning("the end of partition %d could not be asked: %s", tp.partition, exc)
            return None
        return int(end) if end is not None else None

    def _log_replaced(self, partition: int, position: int, high: int) -> None:
        """The partition's log now ends before what was read of it: a new log (a topic
        made again, a broker that lost its storage). Its records sit below the position
        the group remembers, and a broker may answer those fetches with nothing rather
        than an out-of-range error. Write what is held of the old log, and read the
        new one from its start; the ledger's fingerprints keep the two apart."""
        from kafka import TopicPartition

        log.warning(
            "partition %d ends at offset %d, before the %d already read: a new log; "
            "reading it from the start",
            partition,
            high,
            position,
        )
        self._close_epoch(partition, time.monotonic())
        self._next_offset.pop(partition, None)
        self._buffers.pop(partition, None)
        self.consumer.seek_to_beginning(TopicPartition(self.topic, partition))

    def _prune(self) -> None:
        """Prune the ledger on a thread of its own: on an object store it is a request
        for each entry, and the consume loop must not wait for it (nor fall past the
        group's poll interval). One pruning at a time."""
        if self._pruning is not None and self._pruning.is_alive():
            return
        committed = dict(self._committed)

        def prune() -> None:
            for partition, offset in committed.items():
                try:
                    self.ledger.prune_ledger(
                        self.topic, partition, offset, self.settings.ledger_retention_s
                    )
                except Exception as exc:
                    log.warning("pruning the ledger of partition %d failed: %s", partition, exc)

        self._pruning = threading.Thread(target=prune, name="spanmill-ledger-prune", daemon=True)
        self._pruning.start()
