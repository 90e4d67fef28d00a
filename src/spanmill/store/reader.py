"""Reading the span store: spans by time window, service, agent, trace or episode.

:class:`SpanStore` lists only the hour folders a time window touches, reads them
with ``pyarrow.dataset`` (filters pushed down to Parquet statistics), and gives a
``pyarrow.Table`` of :data:`~spanmill.store.schema.SPAN_SCHEMA`, or spans, or the
answer of a DuckDB query over a view named ``spans``. Windows are half-open,
``start <= span start time < end``.

Readers need no deduplication: the collector's ledger makes every span land in
exactly one file (see :mod:`spanmill.store.writer`). :meth:`SpanStore.duplicates`
checks that promise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from spanmill import semconv as sc
from spanmill.errors import SpanmillError
from spanmill.spans import Span
from spanmill.store.layout import (
    SUFFIX,
    BatchId,
    hour_key,
    hour_of_dir,
    is_date_dir,
    is_hour_dir,
    parse_file_name,
)
from spanmill.store.rows import spans_from_table
from spanmill.store.schema import SPAN_SCHEMA
from spanmill.store.writer import open_store

TimeLike = datetime | int | str


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


class SpanStore:
    """Read access to a span store at a local folder or an fsspec URL."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.fs, self.root = open_store(url, storage_options)
        from fsspec.implementations.local import LocalFileSystem

        self._arrow_fs: pafs.FileSystem = (
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
        """Data files whose hour folder overlaps ``[start, end)``, oldest hour first."""
        # Object-store filesystems cache listings, and the store grows while we read it.
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
                for path in sorted(self._ls(hour_path)):
                    name = path.rsplit("/", 1)[-1]
                    if name.endswith(SUFFIX) and not name.startswith((".", "_")):
                        found.append(StoredFile(path, hour, parse_file_name(name)))
        return found

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
        paths = [f.path for f in self.files(start, end)]
        if not paths:
            return None
        try:
            return ds.dataset(
                paths, schema=SPAN_SCHEMA, format="parquet", filesystem=self._arrow_fs
            )
        except (OSError, pa.ArrowInvalid) as exc:
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
        expression = _filter(start, end, service, agent, trace_id, episode_id, llm_calls_only)
        dataset = self._dataset(start, end)
        wanted = list(columns) if columns is not None else list(SPAN_SCHEMA.names)
        unknown = [name for name in wanted if name not in SPAN_SCHEMA.names]
        if unknown:
            raise StoreError(f"unknown span store columns {unknown}; known: {SPAN_SCHEMA.names}")
        if dataset is None:
            return SPAN_SCHEMA.empty_table().select(wanted)
        read = wanted if "start_time" in wanted else [*wanted, "start_time"]
        try:
            table = dataset.to_table(columns=read, filter=expression)
        except (OSError, pa.ArrowInvalid) as exc:
            raise StoreError(f"cannot read the span store at {self.url}: {exc}") from None
        table = table.sort_by([("start_time", "ascending")])
        return table.select(wanted)

    def spans(self, **filters: Any) -> list[Span]:
        """Spans matching the filters of :meth:`table`, read back as :class:`Span` records."""
        return spans_from_table(self.table(**filters))

    def count(self, **filters: Any) -> int:
        return self.table(columns=["span_id"], **filters).num_rows

    def query(
        self, sql: str, *, start: TimeLike | None = None, end: TimeLike | None = None
    ) -> pa.Table:
        """Run DuckDB SQL over a view ``spans`` of the window's files."""
        import duckdb

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
            connection.execute(f"CREATE VIEW spans AS SELECT * FROM spans_source{where}")
            relation = connection.sql(sql)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.Error as exc:
            raise StoreError(f"query failed: {exc}") from None
        finally:
            connection.close()


def _filter(
    start: TimeLike | None,
    end: TimeLike | None,
    service: str | None,
    agent: str | None,
    trace_id: str | None,
    episode_id: str | None,
    llm_calls_only: bool,
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
        parts.append(ds.field("episode_id") == episode_id)
    if llm_calls_only:
        parts.append(ds.field("operation_name").isin(sorted(sc.LLM_OPERATIONS)))
    if not parts:
        return None
    expression = parts[0]
    for part in parts[1:]:
        expression = expression & part
    return expression
