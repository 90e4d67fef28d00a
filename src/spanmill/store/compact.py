"""Store upkeep: compaction, retention and erasure, in one job (``spanmill store compact``).

The collector writes one file per hour folder each time a partition's batch closes,
so a quiet hour may hold thousands of small files. Compaction rewrites a closed
hour's live files as one *generation* of a few large files, sorted by trace id and
start time (:mod:`spanmill.store.layout` says how a generation names what it
replaces). The steps keep every reader exact whenever the job stops:

1. The parts are written under hidden names and renamed into place (one put each on
   an object store). Until the last part is in the folder the generation does not
   count: readers read the files it would replace.
2. Once it is complete, readers read it and never the files it names, which are then
   deleted. A reader that listed the old files just before retries from a new
   listing (:class:`~spanmill.store.SpanStore`).
3. Killed anywhere, the job leaves hidden temp files, an incomplete generation, or
   replaced files not yet deleted; none is read, and the next run deletes them
   (incomplete work once it is ``stale_s`` old, so a run still going is never
   disturbed) and compacts again what is not done.

The collector keeps writing the current hour meanwhile, and it may write a batch's
file again after a crash (the ledger fixes the batch, so the file holds the same
rows): a generation that replaced that name keeps it out, and the next run deletes it.

Retention deletes whole hour folders past the store's retention period. Erasure
(:mod:`spanmill.store.erasure`) rewrites every hour holding a span of a pending
request, closed or not, without those spans, then marks the request applied.

One run at a time, however started: the store's own lock (``UPKEEP_LOCK``), besides
the chart's CronJob, which forbids overlapping runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spanmill import semconv as sc
from spanmill.store.erasure import (
    DEFAULT_USER_ID_ATTRIBUTE,
    Erasure,
    Subject,
    earliest,
    latest,
    read_erasures,
    write_erasure,
)
from spanmill.store.layout import (
    COMPACTED_AT_KEY,
    COMPACTED_PREFIX,
    DEAD_LETTER_DIR,
    REPLACES_KEY,
    SUFFIX,
    PartName,
    encode_replaced,
    hour_of_dir,
    is_date_dir,
    is_hour_dir,
    parse_part_name,
)
from spanmill.store.links import MARGIN_S, call_digest, compact_links
from spanmill.store.policy import StorePolicy, write_policy
from spanmill.store.reader import SpanStore, StoredFile, StoreError
from spanmill.store.schema import SPAN_SCHEMA
from spanmill.store.writer import StoreWriter, writer_id

log = logging.getLogger(__name__)

DEFAULT_TARGET_ROWS = 1_000_000
DEFAULT_SETTLE_S = 600.0
DEFAULT_STALE_S = 3600.0
# One upkeep run at a time, whoever starts it (the CronJob, a Job made from it by hand,
# `spanmill store compact`, a pod replaced while its node is lost): two runs that rewrite
# one hour each write a generation replacing the same files, both are read, and the next
# run makes the duplicates permanent. A run holds this file while it works and renews it
# as it goes; a run killed before it could remove it leaves a lock that is taken over
# once it expires, or at once by a run on the same host where its process is gone.
UPKEEP_LOCK = "_upkeep.lock"
DEFAULT_LOCK_TTL_S = 1800.0
# How long after an erasure is applied its subject's late spans are still looked for.
LATE_S = 7 * 86_400.0


@dataclass
class CompactionReport:
    """What one run did."""

    hours_seen: int = 0
    hours_compacted: int = 0
    files_before: int = 0  # live files of the hours compacted
    files_after: int = 0
    files_deleted: int = 0  # replaced, stale or expired
    hours_expired: int = 0
    link_files_merged: int = 0  # the calls' links (spanmill.store.links), into one file
    dead_letters_deleted: int = 0  # past the horizon, or holding an erasure's subject
    spans_erased: dict[str, int] = field(default_factory=dict)
    erasures_applied: list[str] = field(default_factory=list)
    # Applied past LATE_S: their subject's hash removed, no late span looked for again.
    erasure_hashes_removed: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class _Hour:
    path: str
    hour: int


class Compactor:
    """Compacts, expires and erases one store; :meth:`run` does one pass."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        policy: StorePolicy | None = None,
        settle_s: float = DEFAULT_SETTLE_S,
        target_rows: int = DEFAULT_TARGET_ROWS,
        stale_s: float = DEFAULT_STALE_S,
        clock: Callable[[], float] = time.time,
        lock_ttl_s: float = DEFAULT_LOCK_TTL_S,
    ) -> None:
        if target_rows < 1:
            raise ValueError("target_rows must be at least 1")
        self.store = SpanStore(url, storage_options)
        self.writer = StoreWriter(url, storage_options, compression="zstd", compression_level=3)
        self.fs, self.root = self.store.fs, self.store.root
        self.policy = policy or StorePolicy()
        self.settle_s = settle_s
        self.target_rows = target_rows
        self.stale_s = stale_s
        self.clock = clock
        self.lock_ttl_s = lock_ttl_s

    # -- the pass --------------------------------------------------------------------

    def run(self, progress: Callable[[int, int], None] | None = None) -> CompactionReport:
        """One pass, alone: StoreError where another run holds the store (UPKEEP_LOCK)."""
        with self._alone():
            return self._run(progress)

    @contextlib.contextmanager
    def _alone(self) -> Iterator[None]:
        path = f"{self.root}/{UPKEEP_LOCK}"
        now = self.clock()
        self._since = now
        mine = self._lock_content(now)
        if not self.writer.create_exclusive(path, mine):
            held = _read_lock(self.fs, path)
            if held.get("expires", float("inf")) > now and not _gone(held.get("holder")):
                since = datetime.fromtimestamp(held.get("since", now), UTC)
                raise StoreError(
                    f"another upkeep run ({held.get('holder', 'unknown')}) has held the store "
                    f"since {since:%Y-%m-%d %H:%M:%S} UTC; two at once would store hours "
                    f"twice. It ends by itself; where that run is gone, remove {path}"
                )
            log.warning("taking over the upkeep lock of %s, gone", held.get("holder"))
            self.fs.rm(path)
            if not self.writer.create_exclusive(path, mine):
                raise StoreError(f"another upkeep run took over {path} first")
        try:
            yield
        finally:
            try:
                self.fs.rm(path)
            except OSError as exc:  # it expires: the next run takes it over then
                log.warning("the upkeep lock %s was not removed: %s", path, exc)

    def _lock_content(self, now: float) -> bytes:
        self._renewed = now
        content = {"holder": writer_id(), "since": self._since, "expires": now + self.lock_ttl_s}
        return json.dumps(content).encode()

    def _renew(self) -> None:
        """Push the lock's expiry on, a third of its life at the latest: a run that is
        alive (slow, or on a node its Job lost touch with) is never taken over."""
        now = self.clock()
        if now - self._renewed >= self.lock_ttl_s / 3:
            self.fs.pipe_file(f"{self.root}/{UPKEEP_LOCK}", self._lock_content(now))

    def _run(self, progress: Callable[[int, int], None] | None) -> CompactionReport:
        started = time.perf_counter()
        report = CompactionReport()
        write_policy(self.fs, self.root, self.policy)
        self.fs.invalidate_cache()  # others write the store (open_store)
        erasures = read_erasures(self.fs, self.root)
        pending = [self._resolve(e) for e in erasures if e.status == "pending"]
        # Spans of a subject that arrive after its request was applied (a collector's lag,
        # an agent's run still going): matched by the subject's hash for a while after.
        late = self._late(erasures)
        pending += late
        # Pending requests' traces send every hour holding one to be rewritten; applied
        # ones' (a late span of an erased trace) go whenever their hour is rewritten.
        erasing = {t: e.id for e in pending for t in e.trace_ids}
        hidden = {t: e.id for e in erasures if e.status == "applied" for t in e.trace_ids}
        hidden.update(erasing)
        firsts: dict[str, int] = {}
        lasts: dict[str, int] = {}
        hours = self._hours()
        report.hours_seen = len(hours)
        now = self.clock()
        horizon = self.policy.horizon(datetime.fromtimestamp(now, UTC))
        for done, hour in enumerate(hours, 1):
            if horizon is not None and (hour.hour + 1) * 3600 <= horizon.timestamp():
                report.files_deleted += self._expire(hour)
                report.hours_expired += 1
            else:
                self._tidy(hour, report)
                closed = (hour.hour + 1) * 3600 + self.settle_s <= now
                self._compact(hour, closed, erasing, hidden, report, firsts, lasts)
            self._renew()
            if progress is not None:
                progress(done, len(hours))
        for erasure in pending:
            count = report.spans_erased.get(erasure.id, 0)
            if erasure in late and not count:
                continue  # nothing came late: the record stands as it was applied
            applied = erasure.applied(
                count, (), _moment(firsts.get(erasure.id)), _moment(lasts.get(erasure.id))
            )
            write_erasure(self.fs, self.root, applied)
            report.erasures_applied.append(erasure.id)
        report.erasure_hashes_removed = self._remove_hashes(erasures)
        report.dead_letters_deleted = self._dead_letters(horizon, pending)
        self._drop_empty_days()
        report.link_files_merged = compact_links(self.fs, self.root, horizon)
        report.seconds = time.perf_counter() - started
        return report

    def _resolve(self, erasure: Erasure) -> Erasure:
        return resolve_erasure(self.store, erasure)

    def _past_late(self, erasure: Erasure) -> bool | None:
        """For an applied record: whether LATE_S has passed since; None if not applied."""
        applied = erasure.applied_at
        if erasure.status != "applied" or applied is None:
            return None
        return self.clock() - applied.timestamp() > LATE_S

    def _late(self, erasures: list[Erasure]) -> list[Erasure]:
        """Applied records, within LATE_S of their application, with the traces holding
        their subject that they do not name yet; those with none are left out."""
        found = []
        for erasure in erasures:
            if self._past_late(erasure) is not False or erasure.value_sha256 is None:
                continue
            condition, params = erasure.hash_sql()
            traces = self.store.query(
                f"SELECT DISTINCT trace_id FROM spans_all WHERE {condition}", params=params
            )["trace_id"].to_pylist()
            new = sorted(set(traces) - set(erasure.trace_ids))
            if new:
                found.append(erasure.model_copy(update={"trace_ids": [*erasure.trace_ids, *new]}))
        return found

    def _remove_hashes(self, erasures: list[Erasure]) -> list[str]:
        """Applied records past LATE_S written again without their subject's hash: no late
        span is looked for any more, and a hash of a user id is undone by trying ids."""
        removed = []
        for erasure in erasures:
            if self._past_late(erasure) and erasure.value_sha256 is not None:
                write_erasure(self.fs, self.root, erasure.without_hash())
                removed.append(erasure.id)
        return removed

    # -- hours -----------------------------------------------------------------------

    def _hours(self) -> list[_Hour]:
        self.fs.invalidate_cache()
        found = []
        for day in sorted(self._ls(self.root)):
            dt = is_date_dir(day.rsplit("/", 1)[-1])
            if dt is None:
                continue
            for path in sorted(self._ls(day)):
                hh = is_hour_dir(path.rsplit("/", 1)[-1])
                if hh is not None:
                    found.append(_Hour(path, hour_of_dir(dt, hh)))
        return found

    def _ls(self, path: str, detail: bool = False) -> list[Any]:
        try:
            entries: list[Any] = self.fs.ls(path, detail=detail)
        except FileNotFoundError:
            return []
        return entries

    def _dead_letters(self, horizon: datetime | None, pending: list[Erasure]) -> int:
        """Delete the dead letters the collector kept in the store (raw records, prompts
        and all) that fail before the horizon, or whose bytes hold a pending erasure's
        subject: retention and erasure reach them as they reach the hours."""
        folder = f"{self.root}/{DEAD_LETTER_DIR}"
        self.fs.invalidate_cache(folder)
        try:
            metas = [p for p in self.fs.find(folder) if p.endswith(".json")]
        except FileNotFoundError:
            return 0
        needles = [n for e in pending for n in _needles(e)]
        cutoff = None if horizon is None else horizon.timestamp() * 1000
        deleted = 0
        for meta in metas:
            base = meta[: -len(".json")]
            try:
                failed_at = json.loads(self.fs.cat_file(meta)).get("failed_at_ms", 0)
                value = self.fs.cat_file(base + ".bin") if needles else b""
            except (OSError, ValueError):
                continue  # half written, or gone: the next run sees it whole
            if (cutoff is not None and failed_at < cutoff) or any(n in value for n in needles):
                for path in (base + ".bin", meta):
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm(path)
                deleted += 1
        return deleted

    def _expire(self, hour: _Hour) -> int:
        count = len(self._ls(hour.path))
        self.fs.rm(hour.path, recursive=True)
        log.info("expired %s (%d files)", hour.path, count)
        return count

    def _drop_empty_days(self) -> None:
        if not self.writer.local:
            return  # object stores have no empty folders
        for day in self._ls(self.root):
            if is_date_dir(day.rsplit("/", 1)[-1]) and not self._ls(day):
                self.fs.rmdir(day)

    def _tidy(self, hour: _Hour, report: CompactionReport) -> None:
        """Delete what no reader reads: files a complete generation replaced, and, once
        stale, incomplete generations and hidden temp files a killed run left."""
        entries = self._ls(hour.path, detail=True)
        names = {e["name"].rsplit("/", 1)[-1]: e for e in entries}
        live = {f.path.rsplit("/", 1)[-1] for f in self.store.live_files(hour.path, hour.hour)}
        now = self.clock()
        for name, entry in names.items():
            if name in live:
                continue
            stale = now - _mtime(entry, now) >= self.stale_s
            part = parse_part_name(name)
            temp = name.startswith("." + COMPACTED_PREFIX) and name.endswith(".tmp")
            replaced = (
                name.endswith(SUFFIX)
                and not name.startswith((".", "_"))
                and (part is None or self._generation_complete(names, part))
            )
            if replaced or ((part is not None or temp) and stale):
                self._delete(entry["name"], report)

    @staticmethod
    def _generation_complete(names: Iterable[str], part: PartName) -> bool:
        have = {
            p.part for p in map(parse_part_name, names) if p and p.generation == part.generation
        }
        return len(have) == part.parts

    def _delete(self, path: str, report: CompactionReport) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return
        report.files_deleted += 1

    def _compact(
        self,
        hour: _Hour,
        closed: bool,
        erasing: Mapping[str, str],
        hidden: Mapping[str, str],
        report: CompactionReport,
        firsts: dict[str, int],
        lasts: dict[str, int],
    ) -> None:
        live = self.store.live_files(hour.path, hour.hour)
        if not live:
            return
        erase = bool(erasing) and _holds_any(self._read(live, ["trace_id"]), erasing)
        if not erase and hidden:
            # A late span of a trace an applied request names, in a file no generation
            # has rewritten yet (alone in its hour, it would never be): readers hide it,
            # and the files go to other engines as they are.
            fresh = [f for f in live if f.part is None]
            erase = bool(fresh) and _holds_any(self._read(fresh, ["trace_id"]), hidden)
        if not erase and not (closed and self._worth_compacting(live)):
            return
        self._refuse_newer(live)
        table = self._read(live)
        if hidden:
            table = self._erase(table, hidden, erasing, report, firsts, lasts)
        replaced = set()
        for stored in live:
            replaced.add(stored.path.rsplit("/", 1)[-1])
            if stored.part is not None:
                replaced |= self.store.replaced_by(stored.path)
        parts = self._write_generation(hour, table, replaced)
        report.hours_compacted += 1
        report.files_before += len(live)
        report.files_after += parts
        self._tidy(hour, report)

    def _refuse_newer(self, live: list[StoredFile]) -> None:
        """Refuse files with columns this spanmill does not know (a newer collector's: a
        promoted attribute leaves the attributes JSON for its column): reading them as
        SPAN_SCHEMA and writing them back would drop those values for good."""
        known = set(SPAN_SCHEMA.names)
        for stored in live:
            names = pq.read_schema(stored.path, filesystem=self.store.arrow_fs).names
            extra = sorted(set(names) - known)
            if extra:
                raise StoreError(
                    f"{stored.path} has columns this spanmill does not know ({', '.join(extra)}):"
                    " a newer one wrote it; run the upkeep of that version, whose rewrite "
                    "keeps them"
                )

    def _worth_compacting(self, live: list[StoredFile]) -> bool:
        """More files than the rows need (a complete generation alone is done)."""
        if len(live) == 1:
            return False
        generations = {f.part.generation for f in live if f.part is not None}
        return not (len(generations) == 1 and all(f.part is not None for f in live))

    def _read(self, live: list[StoredFile], columns: list[str] | None = None) -> pa.Table:
        schema = (
            SPAN_SCHEMA if columns is None else pa.schema([SPAN_SCHEMA.field(c) for c in columns])
        )
        tables = [
            pq.read_table(
                f.path, filesystem=self.store.arrow_fs, schema=SPAN_SCHEMA, columns=columns
            )
            for f in live
        ]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def _erase(
        self,
        table: pa.Table,
        hidden: Mapping[str, str],
        erasing: Mapping[str, str],
        report: CompactionReport,
        firsts: dict[str, int],
        lasts: dict[str, int],
    ) -> pa.Table:
        """The table without erased traces' spans; those of pending requests counted."""
        gone = pc.is_in(table.column("trace_id"), pa.array(list(hidden)))
        removed = table.filter(gone).select(["trace_id", "start_time"])
        starts = removed.column("start_time").cast(pa.int64()).to_pylist()
        for trace, start in zip(removed.column("trace_id").to_pylist(), starts, strict=True):
            owner = erasing.get(trace)
            if owner is None:
                continue
            report.spans_erased[owner] = report.spans_erased.get(owner, 0) + 1
            firsts[owner] = min(firsts.get(owner, start), start)
            lasts[owner] = max(lasts.get(owner, start), start)
        return table.filter(pc.invert(gone))

    def _write_generation(self, hour: _Hour, table: pa.Table, replaced: set[str]) -> int:
        """Write an hour's rows as a new generation of parts; returns how many."""
        table = table.sort_by([("trace_id", "ascending"), ("start_time", "ascending")])
        generation = uuid.uuid4().hex[:16]
        parts = max(1, math.ceil(table.num_rows / self.target_rows))
        metadata = {
            **(SPAN_SCHEMA.metadata or {}),
            REPLACES_KEY: encode_replaced(replaced),
            COMPACTED_AT_KEY: str(self.clock()).encode(),
        }
        folder = hour.path[len(self.root) + 1 :] if self.root else hour.path
        for index in range(parts):
            rows = table.slice(index * self.target_rows, self.target_rows)
            name = PartName(generation, index, parts).file_name()
            self.writer.write_file(f"{folder}/{name}", rows.replace_schema_metadata(metadata))
        log.info("compacted %s: %d rows in %d parts", hour.path, table.num_rows, parts)
        return parts


def resolve_erasure(store: SpanStore, erasure: Erasure) -> Erasure:
    """A pending request with every trace that holds its subject now, saved."""
    condition, params = erasure.match_sql()
    traces = (
        store.query(f"SELECT DISTINCT trace_id FROM spans_all WHERE {condition}", params=params)
        .column("trace_id")
        .to_pylist()
    )
    found = set(traces) | set(erasure.trace_ids)
    if erasure.subject == "trace_id" and erasure.value:
        found.add(erasure.value)
    # The gateway's records of the subject's calls, joined to its episodes by content
    # (spanmill.store.links), hold the same prompts: they go too; and so do those no join
    # pass has linked yet (a join reads no erased trace, so it never would).
    links = store.links()
    joined = links.filter(pc.is_in(links["client_trace_id"], pa.array(sorted(found), pa.string())))
    found.update(joined["trace_id"].to_pylist())
    found.update(_same_calls(store, found))
    # When the spans to go started: which trained versions may have learned from them.
    first, last = (
        store.query(
            "SELECT min(start_time) AS first, max(start_time) AS last FROM spans_all "
            "WHERE trace_id IN (SELECT unnest(?))",
            params=[sorted(found)],
        )
        .to_pylist()[0]
        .values()
    )
    resolved = erasure.model_copy(
        update={
            "trace_ids": sorted(found),
            "first_span_at": earliest(erasure.first_span_at, first),
            "last_span_at": latest(erasure.last_span_at, last),
        }
    )
    if resolved != erasure:
        write_erasure(store.fs, store.root, resolved)
    return resolved


def _same_calls(store: SpanStore, traces: set[str]) -> set[str]:
    """The traces of other records of these traces' LLM calls: the same response id, or the
    same call (:func:`~spanmill.store.links.call_digest`) around the same time. Unlike
    a join, every candidate counts: erasing one record too many is the safe side."""
    if not traces:
        return set()
    calls = store.query(
        "SELECT request_model, input_messages, output_messages, response_id, start_time, "
        "end_time FROM spans_all WHERE trace_id IN (SELECT unnest(?)) AND operation_name "
        "IN (SELECT unnest(?))",
        params=[sorted(traces), sorted(sc.LLM_OPERATIONS)],
    ).to_pylist()
    if not calls:
        return set()
    responses = sorted({c["response_id"] for c in calls if c["response_id"]})
    digests = {
        d
        for c in calls
        if (d := call_digest(c["request_model"], c["input_messages"], c["output_messages"]))
    }
    margin = timedelta(seconds=MARGIN_S)
    others = store.query(
        "SELECT trace_id, request_model, input_messages, output_messages, response_id "
        "FROM spans_all WHERE operation_name IN (SELECT unnest(?)) AND start_time >= ? "
        "AND start_time <= ? AND trace_id NOT IN (SELECT unnest(?))",
        params=[sorted(sc.LLM_OPERATIONS), min(c["start_time"] for c in calls) - margin,
                max(c["end_time"] for c in calls) + margin, sorted(traces)],
    ).to_pylist()  # fmt: skip
    return {
        o["trace_id"]
        for o in others
        if o["response_id"] in responses
        or call_digest(o["request_model"], o["input_messages"], o["output_messages"]) in digests
    }


def request_erasure(
    url: str,
    storage_options: Mapping[str, Any] | None,
    subject: Subject,
    value: str,
    *,
    requested_by: str,
    reason: str = "",
    attribute: str = DEFAULT_USER_ID_ATTRIBUTE,
) -> Erasure:
    """Record an erasure request and the traces that hold its subject: from then on no
    read returns them, and the next compaction removes them."""
    store = SpanStore(url, storage_options)
    erasure = Erasure.request(
        subject, value, requested_by=requested_by, reason=reason, attribute=attribute
    )
    write_erasure(store.fs, store.root, erasure)
    return resolve_erasure(store, erasure)


def _holds_any(table: pa.Table, traces: Mapping[str, str]) -> bool:
    return bool(pc.any(pc.is_in(table.column("trace_id"), pa.array(list(traces)))).as_py())


def _mtime(entry: Mapping[str, Any], default: float) -> float:
    value = entry.get("mtime", entry.get("LastModified", entry.get("created")))
    if value is None:
        return default
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value)


def _moment(ns: int | None) -> datetime | None:
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, UTC)


def _needles(erasure: Erasure) -> list[bytes]:
    """The bytes a raw record holding an erasure's subject holds: its value as text, and
    a trace id also as OTLP's 16 raw bytes."""
    value = erasure.value or ""
    found = [value.encode()] if value else []
    if erasure.subject == "trace_id" and len(value) == 32:
        with contextlib.suppress(ValueError):
            found.append(bytes.fromhex(value))
    return found


def _gone(holder: Any) -> bool:
    """Whether a lock's holder was a process of this host that has ended."""
    host, _, pid = str(holder or "").rpartition("/")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _read_lock(fs: Any, path: str) -> dict[str, Any]:
    """What a held upkeep lock says; empty where it cannot be read (it is held then)."""
    try:
        fs.invalidate_cache(path)
        held = json.loads(fs.cat_file(path))
    except (OSError, ValueError):
        return {}
    return held if isinstance(held, dict) else {}
