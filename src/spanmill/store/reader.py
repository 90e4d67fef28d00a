"""Reading the span store: spans by time window, service, agent, trace or episode.

:class:`SpanStore` lists only the hour folders a time window touches, reads them
with ``pyarrow.dataset`` (filters pushed down to Parquet statistics), and gives a
``pyarrow.Table`` of :data:`~spanmill.store.schema.SPAN_SCHEMA`, or spans, or the
answer of a DuckDB query over a view named ``spans``. Windows are half-open,
``start <= span start time < end``.

Readers need no deduplication: the collector's ledger makes every span land in
exactly one file (see :mod:`spanmill.store.writer`), and compaction's generations
say which files they replace (see :mod:`spanmill.store.layout`), so each hour's
*live* files hold every span once. A read lists them, then reads them; if a
compaction removed one in between, the read starts again from a new listing.
:meth:`SpanStore.duplicates` checks that promise.

Every read leaves out the traces of erasure requests (:mod:`spanmill.store.erasure`)
and refuses a window that reaches past the store's retention period
(:mod:`spanmill.store.policy`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spanmill import semconv as sc
from spanmill.errors import SpanmillError
from spanmill.spans import Span
from spanmill.store.erasure import read_erasures
from spanmill.store.layout import (
    REPLACES_KEY,
    SUFFIX,
    BatchId,
    PartName,
    decode_replaced,
    hour_key,
    hour_of_dir,
    is_date_dir,
    is_hour_dir,
    parse_file_name,
    parse_part_name,
)
from spanmill.store.links import apply_links, linked_view_sql, read_links
from spanmill.store.policy import StorePolicy, read_policy
from spanmill.store.rows import spans_from_table
from spanmill.store.schema import SPAN_SCHEMA
from spanmill.store.writer import open_store

log = logging.getLogger(__name__)
TimeLike = datetime | int | str
T = TypeVar("T")
# A read that keeps losing files to compaction gives up after this many listings.
_READ_ATTEMPTS = 20
# What applying the store's links reads (spanmill.store.links).
_LINK_KEYS = ("trace_id", "span_id", "episode_id", "response_id")


class StoreError(SpanmillError):
    """The span store could not be read."""


def to_unix_nanos(value: TimeLike) -> int:
    """Nanoseconds since the epoch from a datetime (naive means UTC), ISO text or an int."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise StoreError(
                f"time {value!r} is not ISO 8601; write e.g. 2024-05-01T13:00:00Z"
            ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000


@dataclass(frozen=True)
class StoredFile:
    path: str
    hour: int
    batch: BatchId | None
    part: PartName | None = None


class SpanStore:
    """Read access to a span store at a local folder or an fsspec URL."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.fs, self.root = open_store(url, storage_options)
        self._replaced_cache: dict[str, frozenset[str]] = {}
        from fsspec.implementations.local import LocalFileSystem

        self.arrow_fs: pafs.FileSystem = (
            pafs.LocalFileSystem()
            if isinstance(self.fs, LocalFileSystem)
            else pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        )

    # -- files -----------------------------------------------------------------------

    def _ls(self, path: str) -> list[str]:
        try:
            return [entry.rstrip("/") for entry in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def files(self, start: TimeLike | None = None, end: TimeLike | None = None) -> list[StoredFile]:
        """The live data files of the hour folders that overlap ``[start, end)``, oldest
        hour first: each span of the window lies in exactly one of them."""
        return self._attempts(lambda: self._files(start, end))

    def _files(self, start: TimeLike | None, end: TimeLike | None) -> list[StoredFile]:
        # The store grows and shrinks under other processes while it is read.
        self.fs.invalidate_cache()
        low = hour_key(to_unix_nanos(start)) if start is not None else None
        high = hour_key(to_unix_nanos(end) - 1) if end is not None else None
        found = []
        for date_path in sorted(self._ls(self.root)):
            dt = is_date_dir(date_path.rsplit("/", 1)[-1])
            if dt is None:
                continue
            day = hour_of_dir(dt, "00")
            if (low is not None and day + 23 < low) or (high is not None and day > high):
                continue
            for hour_path in sorted(self._ls(date_path)):
                hh = is_hour_dir(hour_path.rsplit("/", 1)[-1])
                if hh is None:
                    continue
                hour = hour_of_dir(dt, hh)
                if (low is not None and hour < low) or (high is not None and hour > high):
                    continue
                found.extend(self.live_files(hour_path, hour))
        return found

    def live_files(self, hour_path: str, hour: int) -> list[StoredFile]:
        """An hour folder's files that hold its spans once: every complete compacted
        generation's parts and every file none of them replaces."""
        files = []
        for path in sorted(self._ls(hour_path)):
            name = path.rsplit("/", 1)[-1]
            if name.endswith(SUFFIX) and not name.startswith((".", "_")):
                files.append(StoredFile(path, hour, parse_file_name(name), parse_part_name(name)))
        parts: dict[str, list[StoredFile]] = {}
        for stored in files:
            if stored.part is not None:
                parts.setdefault(stored.part.generation, []).append(stored)
        complete = {
            generation
            for generation, members in parts.items()
            if len(members) == members[0].part.parts  # type: ignore[union-attr]
        }
        replaced: set[str] = set()
        for generation in complete:
            first = min(parts[generation], key=lambda f: f.part.part)  # type: ignore[union-attr]
            replaced |= self.replaced_by(first.path)
        return [
            stored
            for stored in files
            if stored.path.rsplit("/", 1)[-1] not in replaced
            and (stored.part is None or stored.part.generation in complete)
        ]

    def replaced_by(self, part_path: str) -> frozenset[str]:
        """The names a compacted part's generation replaces (parts never change)."""
        cached = self._replaced_cache.get(part_path)
        if cached is None:
            metadata = pq.read_metadata(part_path, filesystem=self.arrow_fs).metadata or {}
            cached = (
                decode_replaced(metadata[REPLACES_KEY]) if REPLACES_KEY in metadata else frozenset()
            )
            self._replaced_cache[part_path] = cached
        return cached

    def policy(self) -> StorePolicy:
        return read_policy(self.fs, self.root)

    def links(self) -> pa.Table:
        """The store's links of gateway calls to agent episodes (:mod:`spanmill.store.links`)."""
        self.fs.invalidate_cache()
        return read_links(self.fs, self.root)

    def erased_trace_ids(self) -> list[str]:
        """Traces of every erasure request, pending or applied: no read returns them."""
        self.fs.invalidate_cache()
        return sorted({t for e in read_erasures(self.fs, self.root) for t in e.trace_ids})

    def _check_window(self, start: TimeLike | None) -> None:
        horizon = self.policy().horizon()
        if horizon is None or start is None:
            return
        if to_unix_nanos(start) < to_unix_nanos(horizon):
            raise StoreError(
                f"the window starts at {_iso(start)}, before the store's retention horizon "
                f"{horizon:%Y-%m-%dT%H:%M:%SZ} (spans are kept "
                f"{self.policy().retention_days:g} days): start the window later"
            )

    def _attempts(self, read: Callable[[], T]) -> T:
        """``read()`` again from a new listing while compaction removes files under it."""
        for attempt in range(_READ_ATTEMPTS):
            try:
                return read()
            except FileNotFoundError as exc:
                missing = exc
            except OSError as exc:
                if "No such file" not in str(exc) and "NoSuchKey" not in str(exc):
                    raise StoreError(f"cannot read the span store at {self.url}: {exc}") from None
                missing = exc  # type: ignore[assignment]
            log.debug("a file went while reading (%s): listing again", missing)
            time.sleep(min(0.05 * (attempt + 1), 1.0))
        raise StoreError(
            f"cannot read the span store at {self.url}: files kept going while it was read "
            f"({_READ_ATTEMPTS} listings); is a compaction stuck in a loop?"
        )

    def batches(self) -> list[BatchId]:
        """The batches whose files are in the store, by topic, partition and offset."""
        return sorted({f.batch for f in self.files() if f.batch is not None})

    def duplicates(self) -> int:
        """How many rows repeat a span of one Kafka record already stored: always 0.

        A record is told apart from a record at the same offset of an earlier
        incarnation of the log by its timestamp and its spans' ids.
        """
        table = self.query(
            "SELECT coalesce(sum(n - 1), 0) AS extra FROM (SELECT count(*) AS n FROM spans "
            "GROUP BY kafka_topic, kafka_partition, kafka_offset, kafka_index, "
            "kafka_timestamp, trace_id, span_id)"
        )
        return int(table.column("extra")[0].as_py())

    # -- rows ------------------------------------------------------------------------

    def _dataset(self, start: TimeLike | None, end: TimeLike | None) -> ds.Dataset | None:
        paths = [f.path for f in self._files(start, end)]
        if not paths:
            return None
        try:
            return ds.dataset(paths, schema=SPAN_SCHEMA, format="parquet", filesystem=self.arrow_fs)
        except pa.ArrowInvalid as exc:
            raise StoreError(f"cannot read the span store at {self.url}: {exc}") from None

    def table(
        self,
        *,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        service: str | None = None,
        agent: str | None = None,
        trace_id: str | None = None,
        episode_id: str | None = None,
        llm_calls_only: bool = False,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Spans matching every filter given, as a table sorted by start time."""
        self._check_window(start)
        wanted = list(columns) if columns is not None else list(SPAN_SCHEMA.names)
        unknown = [name for name in wanted if name not in SPAN_SCHEMA.names]
        if unknown:
            raise StoreError(f"unknown span store columns {unknown}; known: {SPAN_SCHEMA.names}")
        links = self.links()
        # An episode's linked gateway traces are the episode's too.
        joined = (
            pc.filter(links["trace_id"], pc.equal(links["episode_id"], episode_id)).to_pylist()
            if episode_id is not None and links.num_rows
            else []
        )
        expression = _filter(
            start, end, service, agent, trace_id, episode_id, llm_calls_only,
            self.erased_trace_ids(), joined,
        )  # fmt: skip
        read = list(dict.fromkeys([*wanted, "start_time", *(_LINK_KEYS if links.num_rows else ())]))

        def attempt() -> pa.Table:
            dataset = self._dataset(start, end)
            if dataset is None:
                return SPAN_SCHEMA.empty_table().select(read)
            try:
                return dataset.to_table(columns=read, filter=expression)
            except pa.ArrowInvalid as exc:
                raise StoreError(f"cannot read the span store at {self.url}: {exc}") from None

        table = apply_links(self._attempts(attempt), links).sort_by([("start_time", "ascending")])
        return table.select(wanted)

    def spans(self, **filters: Any) -> list[Span]:
        """Spans matching the filters of :meth:`table`, read back as :class:`Span` records."""
        return spans_from_table(self.table(**filters))

    def count(self, **filters: Any) -> int:
        return self.table(columns=["span_id"], **filters).num_rows

    def query(
        self,
        sql: str,
        *,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        params: Sequence[Any] | None = None,
    ) -> pa.Table:
        """Run DuckDB SQL (with ``?`` placeholders for ``params``) over a view ``spans``
        of the window's live spans, erased traces left out, and the store's macros
        (:mod:`spanmill.store.queries`)."""
        self._check_window(start)
        erased, links = self.erased_trace_ids(), self.links()
        return self._attempts(lambda: self._query(sql, start, end, params, erased, links))

    def _query(
        self,
        sql: str,
        start: TimeLike | None,
        end: TimeLike | None,
        params: Sequence[Any] | None,
        erased: list[str],
        links: pa.Table,
    ) -> pa.Table:
        import duckdb

        from spanmill.store.queries import MACROS

        dataset = self._dataset(start, end)
        source: Any = dataset if dataset is not None else SPAN_SCHEMA.empty_table()
        connection = duckdb.connect()
        try:
            connection.register("spans_source", source)
            window = []
            if start is not None:
                window.append(f"epoch_ns(start_time) >= {to_unix_nanos(start)}")
            if end is not None:
                window.append(f"epoch_ns(start_time) < {to_unix_nanos(end)}")
            where = f" WHERE {' AND '.join(window)}" if window else ""
            # spans_all: erased traces too, for resolving erasure requests alone.
            connection.execute(f"CREATE VIEW spans_all AS SELECT * FROM spans_source{where}")
            unerased = "SELECT * FROM spans_all"
            if erased:
                connection.register("erased_traces", pa.table({"trace_id": erased}))
                unerased += " WHERE trace_id NOT IN (SELECT trace_id FROM erased_traces)"
            connection.register("call_links", links)
            connection.execute(f"CREATE VIEW spans_unlinked AS {unerased}")
            connection.execute(f"CREATE VIEW spans AS {linked_view_sql('spans_unlinked')}")
            for macro in MACROS:
                connection.execute(macro)
            relation = connection.sql(sql, params=list(params) if params else None)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.IOException as exc:
            if "No such file" in str(exc) or "not found" in str(exc).lower():
                raise FileNotFoundError(str(exc)) from None
            raise StoreError(f"query failed: {exc}") from None
        except duckdb.Error as exc:
            raise StoreError(f"query failed: {exc}") from None
        finally:
            connection.close()


def _iso(value: TimeLike) -> str:
    moment = datetime.fromtimestamp(to_unix_nanos(value) / 1e9, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%SZ}"


def _filter(
    start: TimeLike | None,
    end: TimeLike | None,
    service: str | None,
    agent: str | None,
    trace_id: str | None,
    episode_id: str | None,
    llm_calls_only: bool,
    erased_trace_ids: Sequence[str] = (),
    linked_trace_ids: Sequence[str] = (),
) -> ds.Expression | None:
    time_type = SPAN_SCHEMA.field("start_time").type
    parts: list[ds.Expression] = []
    if start is not None:
        parts.append(ds.field("start_time") >= pa.scalar(to_unix_nanos(start), type=time_type))
    if end is not None:
        parts.append(ds.field("start_time") < pa.scalar(to_unix_nanos(end), type=time_type))
    if service is not None:
        parts.append(ds.field("service_name") == service)
    if agent is not None:
        parts.append(ds.field("agent_name") == agent)
    if trace_id is not None:
        parts.append(ds.field("trace_id") == trace_id.lower())
    if episode_id is not None:
        episode = ds.field("episode_id") == episode_id
        if linked_trace_ids:
            episode = episode | ds.field("trace_id").isin(list(linked_trace_ids))
        parts.append(episode)
    if llm_calls_only:
        parts.append(ds.field("operation_name").isin(sorted(sc.LLM_OPERATIONS)))
    if erased_trace_ids:
        parts.append(~ds.field("trace_id").isin(list(erased_trace_ids)))
    if not parts:
        return None
    expression = parts[0]
    for part in parts[1:]:
        expression = expression & part
    return expression
