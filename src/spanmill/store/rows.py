"""Spans into store rows and back: columns built column-wise, one Arrow table per hour.

:class:`SpanParts` is the plain, mutable shape of one span that the collector's
decoding, translation and redaction work on; :class:`HourlyColumns` turns many of
them into Arrow tables of :data:`~spanmill.store.schema.SPAN_SCHEMA`, one per hour
folder; :func:`span_from_row` reads a row back into a :class:`~spanmill.spans.Span`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from spanmill import native
from spanmill import semconv as sc
from spanmill.rewards import rewards_of
from spanmill.spans import Span
from spanmill.spans.errors import SCHEMA, SpanDecodeError
from spanmill.spans.jsontext import compact_json
from spanmill.spans.record import (
    MAX_ATTRIBUTE_KEY_CHARS,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_NAME_CHARS,
)
from spanmill.store.layout import hour_key
from spanmill.store.schema import PROMOTED, PROMOTED_RESOURCE, SPAN_SCHEMA, Promoted

_INT64_MAX: Final = 2**63 - 1
_KIND_TYPES: Final[dict[str, type]] = {"str": str, "int": int, "float": float, "bool": bool}

Event = tuple[str, int, dict[str, Any]]
Link = tuple[str, str, dict[str, Any]]


class SpanParts:
    """One span as plain fields; attribute dicts are owned and may be changed in place.

    The authority's spans (:meth:`from_span`) and the rows read back
    (:func:`parts_from_row`) both come in this shape for translation and redaction.
    """

    __slots__ = (
        "attributes",
        "end",
        "events",
        "kind",
        "links",
        "name",
        "parent_span_id",
        "resource_attributes",
        "scope_name",
        "scope_version",
        "span_id",
        "start",
        "status_code",
        "status_message",
        "trace_id",
    )

    def __init__(
        self,
        trace_id: str,
        span_id: str,
        parent_span_id: str | None,
        name: str,
        kind: str,
        start: int,
        end: int,
        status_code: str,
        status_message: str,
        attributes: dict[str, Any],
        resource_attributes: dict[str, Any],
        scope_name: str,
        scope_version: str,
        events: list[Event],
        links: list[Link],
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.name = name
        self.kind = kind
        self.start = start
        self.end = end
        self.status_code = status_code
        self.status_message = status_message
        self.attributes = attributes
        self.resource_attributes = resource_attributes
        self.scope_name = scope_name
        self.scope_version = scope_version
        self.events = events
        self.links = links

    @classmethod
    def from_span(cls, span: Span) -> SpanParts:
        return cls(
            span.trace_id,
            span.span_id,
            span.parent_span_id,
            span.name,
            span.kind.value,
            span.start_time_unix_nano,
            span.end_time_unix_nano,
            span.status_code.value,
            span.status_message,
            dict(span.attributes),
            dict(span.resource_attributes),
            span.scope_name,
            span.scope_version,
            [(e.name, e.time_unix_nano, dict(e.attributes)) for e in span.events],
            [(link.trace_id, link.span_id, dict(link.attributes)) for link in span.links],
        )

    def to_span(self) -> Span:
        return Span(
            trace_id=self.trace_id,
            span_id=self.span_id,
            parent_span_id=self.parent_span_id,
            name=self.name,
            kind=self.kind,
            start_time_unix_nano=self.start,
            end_time_unix_nano=self.end,
            status_code=self.status_code,
            status_message=self.status_message,
            attributes=self.attributes,
            resource_attributes=self.resource_attributes,
            scope_name=self.scope_name,
            scope_version=self.scope_version,
            events=[{"name": n, "time_unix_nano": t, "attributes": a} for n, t, a in self.events],
            links=[{"trace_id": t, "span_id": s, "attributes": a} for t, s, a in self.links],
        )


def check_storable(parts: SpanParts, index: int) -> None:
    """Refuse what a valid span may hold but the store's nanosecond timestamps cannot.

    ``index``: the span's place among its record's spans, for the message.
    """
    if parts.end > _INT64_MAX:
        raise SpanDecodeError(
            SCHEMA,
            f"spans[{index}]: end time {parts.end} ns is after the year 2262, which the span "
            "store cannot hold; send nanoseconds since the Unix epoch",
        )


def _matches(promoted: Promoted, value: Any) -> bool:
    # Attribute arrays hold one type (the span record guarantees it): the first item tells.
    kind = promoted.kind
    if kind == "int_list":
        return type(value) is list and (not value or type(value[0]) is int)
    if kind == "float_list":
        return type(value) is list and (not value or type(value[0]) is float)
    return type(value) is _KIND_TYPES[kind]


def _rewards(parts: SpanParts) -> list[Any] | None:
    events = parts.events
    if not events:
        return rewards_of(parts.attributes) or None
    return rewards_of(parts.attributes, ((name, attrs) for name, _, attrs in events)) or None


def _json_or_none(value: Any) -> str | None:
    return compact_json(value) if value else None


# HourlyColumns' default: a native decoder of its own.
NEW_DECODER: Final = object()

_PROMOTED_BY_KEY: Final = {promoted.key: promoted for promoted in PROMOTED}
_PROMOTED_KEYS: Final = frozenset(_PROMOTED_BY_KEY)


class ColumnBuilder:
    """Rows of one Arrow table appended span by span in Python, a list per column: what
    the collector writes for records its native decoder gives back, for the rows of
    records whose steps run in Python, and everywhere without the C extension."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in SPAN_SCHEMA.names}
        self.rows = 0
        self._promoted = [(p.column, self.columns[p.column]) for p in PROMOTED]

    def append(
        self,
        parts: SpanParts,
        topic: str,
        partition: int,
        offset: int,
        index: int,
        timestamp_ms: int,
    ) -> None:
        """Add one span's row; ``parts.attributes`` loses the attributes moved to columns."""
        c = self.columns
        attributes = parts.attributes
        c["rewards"].append(_rewards(parts))
        response_model = attributes.get(sc.GEN_AI_RESPONSE_MODEL)
        request_model = attributes.get(sc.GEN_AI_REQUEST_MODEL)
        c["model"].append(
            response_model
            if type(response_model) is str and response_model
            else (request_model if type(request_model) is str and request_model else None)
        )
        episode = attributes.get(sc.SPANMILL_EPISODE_ID)
        c["episode_id"].append(episode if type(episode) is str and episode else parts.trace_id)
        # Only the promoted keys the span has are looked at; every other column gets null.
        moved: dict[str, Any] = {}
        for key in _PROMOTED_KEYS.intersection(attributes):
            promoted = _PROMOTED_BY_KEY[key]
            value = attributes[key]
            if value is not None and _matches(promoted, value):
                del attributes[key]
                moved[promoted.column] = value
        if "reward_value" not in moved:
            score = attributes.get(sc.GEN_AI_EVALUATION_SCORE_VALUE)
            if type(score) is int:
                moved["reward_value"] = float(score)
        for column, values in self._promoted:
            values.append(moved.get(column))
        resource = parts.resource_attributes
        for promoted in PROMOTED_RESOURCE:
            value = resource.get(promoted.key)
            if value is not None and _matches(promoted, value):
                resource = dict(resource)  # resources are shared by the spans of a record
                del resource[promoted.key]
                c[promoted.column].append(value)
            else:
                c[promoted.column].append(None)
        c["trace_id"].append(parts.trace_id)
        c["span_id"].append(parts.span_id)
        c["parent_span_id"].append(parts.parent_span_id)
        c["name"].append(parts.name)
        c["kind"].append(parts.kind)
        c["start_time"].append(parts.start)
        c["end_time"].append(parts.end)
        c["status_code"].append(parts.status_code)
        c["status_message"].append(parts.status_message)
        c["attributes"].append(_json_or_none(attributes))
        c["resource_attributes"].append(_json_or_none(resource))
        c["scope_name"].append(parts.scope_name)
        c["scope_version"].append(parts.scope_version)
        c["events"].append(
            compact_json(
                [{"name": n, "time_unix_nano": t, "attributes": a} for n, t, a in parts.events]
            )
            if parts.events
            else None
        )
        c["links"].append(
            compact_json(
                [{"trace_id": t, "span_id": s, "attributes": a} for t, s, a in parts.links]
            )
            if parts.links
            else None
        )
        c["kafka_topic"].append(topic)
        c["kafka_partition"].append(partition)
        c["kafka_offset"].append(offset)
        c["kafka_index"].append(index)
        c["kafka_timestamp"].append(timestamp_ms)
        self.rows += 1

    def to_table(self) -> pa.Table:
        arrays = [pa.array(self.columns[field.name], type=field.type) for field in SPAN_SCHEMA]
        return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)


def native_table(columns: Any) -> pa.Table:
    """A native decoder's ``Columns`` as one Arrow table, on their own buffers (no copy)."""
    rows = columns.rows
    arrays = [
        _from_buffers(field.type, rows, column)
        for field, column in zip(SPAN_SCHEMA, columns.finish(), strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)


def _from_buffers(kind: pa.DataType, length: int, column: Any) -> pa.Array:
    """An Arrow array from a native column: its values as a list, or its buffers."""
    if isinstance(column, list):
        return pa.array(column, type=kind)
    nulls, validity, offsets, values, items = column
    bitmap = pa.py_buffer(validity) if validity is not None else None
    if pa.types.is_list(kind):
        child = pa.Array.from_buffers(kind.value_type, items, [None, pa.py_buffer(values)])
        return pa.Array.from_buffers(
            kind, length, [bitmap, pa.py_buffer(offsets)], nulls, children=[child]
        )
    if offsets is not None:
        return pa.Array.from_buffers(
            kind, length, [bitmap, pa.py_buffer(offsets), pa.py_buffer(values)], nulls
        )
    return pa.Array.from_buffers(kind, length, [bitmap, pa.py_buffer(values)], nulls)


_KIND_CODES: Final = {"str": 0, "int": 1, "float": 2, "bool": 3, "int_list": 4, "float_list": 5}


def _column_kind(kind: pa.DataType) -> int:
    """How the C extension lays a column out (its A_* codes); 7: as Python objects."""
    if pa.types.is_string(kind):
        return 0
    if pa.types.is_int64(kind) or pa.types.is_timestamp(kind):
        return 1
    if pa.types.is_int32(kind):
        return 2
    if pa.types.is_float64(kind):
        return 3
    if pa.types.is_boolean(kind):
        return 4
    if pa.types.is_list(kind) and pa.types.is_int64(kind.value_type):
        return 5
    if pa.types.is_list(kind) and pa.types.is_float64(kind.value_type):
        return 6
    return 7


def native_decoder() -> Any:
    """A new native decoder, set up for the span record's limits and the store's schema;
    None without the C extension. It owns its settings, key cache and columns: one per
    batch processor."""
    if native.module is None:
        return None
    decoder = native.module.Decoder()
    decoder.configure(MAX_NAME_CHARS, MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_BYTES)
    decoder.configure_rows(*_rows_settings())
    return decoder


def _rows_settings() -> tuple[Any, ...]:
    """configure_rows' arguments: the store schema's columns, kinds and promoted keys."""
    return (
        tuple(SPAN_SCHEMA.names),
        tuple((p.key, p.column, _KIND_CODES[p.kind]) for p in PROMOTED),
        tuple((p.key, p.column, _KIND_CODES[p.kind]) for p in PROMOTED_RESOURCE),
        (
            sc.GEN_AI_RESPONSE_MODEL,
            sc.GEN_AI_REQUEST_MODEL,
            sc.SPANMILL_EPISODE_ID,
            sc.GEN_AI_EVALUATION_SCORE_VALUE,
            sc.GEN_AI_EVALUATION_NAME,
        ),
        sc.GEN_AI_EVALUATION_RESULT_EVENT,
        tuple(_column_kind(field.type) for field in SPAN_SCHEMA),
    )


# Whether rows can go to native columns (the package has its C extension).
NATIVE_ROWS: Final = native.module is not None

# The order rows are written in: a batch's records, and each record's spans, in turn.
_RECORD_ORDER: Final = [("kafka_offset", "ascending"), ("kafka_index", "ascending")]


class RowFailed(Exception):
    """The steps broke on a marked row: the Kafka offset of its record, the cause chained."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"the steps broke on a row of the record at offset {offset}")
        self.offset = offset


class HourlyColumns:
    """Rows split by the hour of their span's start time: one table per hour folder.

    The collector's native decoder writes most rows straight into each hour's native
    columns (:attr:`native_hours`, by :meth:`append_record`); :meth:`append` adds a
    span's row in Python. :meth:`tables` gives each hour's rows in record order, the
    rows the decoder marked for the Python steps rebuilt by them.
    """

    def __init__(self, *, decoder: Any = NEW_DECODER) -> None:
        """``decoder``: the native decoder whose columns the native rows go to (by default a
        new one; None: every row is appended in Python)."""
        self.decoder = native_decoder() if decoder is NEW_DECODER else decoder
        self.hours: dict[int, ColumnBuilder] = {}
        # Each hour's native columns, which the decoder's append_record adds and fills
        # (the caller counts their rows into ``rows``).
        self.native_hours: dict[int, Any] = {}
        self.rows = 0

    def builder(self, hour: int) -> ColumnBuilder:
        """The hour's rows appended in Python, made if new."""
        builder = self.hours.get(hour)
        if builder is None:
            builder = self.hours[hour] = ColumnBuilder()
        return builder

    def append_record(
        self,
        payload: bytes,
        *,
        gates: Any = None,
        digits: int = 0,
        steps_keys: frozenset[str] = frozenset(),
        verdicts: dict[str, bool] | None = None,
        topic: str = "",
        partition: int = 0,
        offset: int = 0,
        timestamp_ms: int = 0,
    ) -> int | None:
        """One OTLP protobuf record's spans as native rows; None (nothing added): the
        authority must decide. ``gates``/``digits``: what the scan for redaction looks
        for (None: no scan); ``steps_keys``: keys whose spans the steps finish;
        ``verdicts``: the attribute lists' (``Redactor.verdicts``). The collector's batch
        loop calls the decoder itself, as this does."""
        if self.decoder is None:
            raise RuntimeError("these rows have no native decoder")
        count: int | None = self.decoder.append_record(
            self.native_hours, payload, gates, digits, steps_keys, verdicts,
            topic, partition, offset, timestamp_ms,
        )  # fmt: skip
        if count is not None:
            self.rows += count
        return count

    def append(
        self,
        parts: SpanParts,
        topic: str,
        partition: int,
        offset: int,
        index: int,
        timestamp_ms: int,
    ) -> None:
        self.builder(hour_key(parts.start)).append(
            parts, topic, partition, offset, index, timestamp_ms
        )
        self.rows += 1

    def tables(self, steps: Callable[[SpanParts, bool], None] | None = None) -> dict[int, pa.Table]:
        """A table per hour that holds rows (a record the decoder gave back may have left
        an hour's native columns empty).

        Rows the decoder marked (``Columns.steps``) are read back into span parts, given
        to ``steps`` (translation and redaction, in the collector) with whether the
        decoder's scan found what a redaction pattern needs, and appended again in Python,
        so that rewards, promoted columns and JSON are made as for any other.
        """
        out = {}
        for hour, columns in self.native_hours.items():
            if not columns.rows:
                continue
            marked = columns.steps
            table = native_table(columns)
            if marked:
                table = self._rebuilt(table, marked, self.builder(hour), steps)
            out[hour] = table
        for hour, builder in self.hours.items():
            if not builder.rows:
                continue
            table = builder.to_table()
            if hour in out:  # some of the hour's rows native, some in Python
                table = pa.concat_tables([out[hour], table]).sort_by(_RECORD_ORDER)
            out[hour] = table
        return dict(sorted(out.items()))

    @staticmethod
    def _rebuilt(
        table: pa.Table,
        marked: Sequence[tuple[int, int, bool]],
        builder: ColumnBuilder,
        steps: Callable[[SpanParts, bool], None] | None,
    ) -> pa.Table:
        """``table`` without the ``marked`` rows, which go through ``steps`` to ``builder``."""
        flags = [False] * table.num_rows
        found = []
        for first, end, scan_found in marked:
            flags[first:end] = [True] * (end - first)
            found += [scan_found] * (end - first)
        chosen = pa.array(flags, type=pa.bool_())
        for row, may_match in zip(
            exact_times(table.filter(chosen)).to_pylist(), found, strict=True
        ):
            try:
                parts = parts_from_row(row)
                if steps is not None:
                    steps(parts, may_match)
                builder.append(
                    parts, row["kafka_topic"], row["kafka_partition"], row["kafka_offset"],
                    row["kafka_index"], row["kafka_timestamp"],
                )  # fmt: skip
            except Exception as exc:
                raise RowFailed(row["kafka_offset"]) from exc
        return table.filter(pc.invert(chosen))


def table_from_spans(
    spans: Iterable[Span],
    *,
    topic: str = "",
    partition: int = 0,
    offset: int = 0,
    timestamp_ms: int = 0,
) -> pa.Table:
    """Spans as one store table (every span credited to one Kafka record): for tests and tools."""
    builder = ColumnBuilder()
    for index, span in enumerate(spans):
        parts = SpanParts.from_span(span)
        check_storable(parts, index)
        builder.append(parts, topic, partition, offset, index, timestamp_ms)
    return builder.to_table()


# Each promoted column, its attribute's key, and whether its values are lists.
_RESTORED: Final = tuple((p.column, p.key, p.kind in ("int_list", "float_list")) for p in PROMOTED)
_RESTORED_RESOURCE: Final = tuple(
    (p.column, p.key, p.kind in ("int_list", "float_list")) for p in PROMOTED_RESOURCE
)


def _restore(
    attributes: dict[str, Any], row: Mapping[str, Any], restored: tuple[tuple[str, str, bool], ...]
) -> None:
    """The row's promoted values back among ``attributes``, where a key is not there already."""
    for column, key, is_list in restored:
        value = row.get(column)
        if value is not None and key not in attributes:
            attributes[key] = list(value) if is_list else value


def parts_from_row(row: Mapping[str, Any]) -> SpanParts:
    """A stored row (as ``pyarrow.Table.to_pylist`` gives it) back as the span's parts
    taken in: promoted attributes back among the others.

    Times must be integer nanoseconds: pyarrow's datetimes drop them (:func:`exact_times`).
    """
    attributes = json.loads(row["attributes"]) if row.get("attributes") else {}
    _restore(attributes, row, _RESTORED)
    resource = json.loads(row["resource_attributes"]) if row.get("resource_attributes") else {}
    _restore(resource, row, _RESTORED_RESOURCE)
    events = json.loads(row["events"]) if row.get("events") else ()
    links = json.loads(row["links"]) if row.get("links") else ()
    return SpanParts(
        row["trace_id"],
        row["span_id"],
        row.get("parent_span_id"),
        row["name"],
        row["kind"],
        row["start_time"],
        row["end_time"],
        row["status_code"],
        row["status_message"],
        attributes,
        resource,
        row["scope_name"],
        row["scope_version"],
        [(e["name"], e["time_unix_nano"], e["attributes"]) for e in events],
        [(link["trace_id"], link["span_id"], link["attributes"]) for link in links],
    )


def span_from_row(row: Mapping[str, Any]) -> Span:
    """A stored row (as ``pyarrow.Table.to_pylist`` gives it) back as the span taken in."""
    return parts_from_row(row).to_span()


def exact_times(table: pa.Table) -> pa.Table:
    """``table`` with its time columns as integer nanoseconds, for ``to_pylist``."""
    exact = table
    for name in ("start_time", "end_time"):
        if name in exact.column_names:
            index = exact.column_names.index(name)
            exact = exact.set_column(index, name, exact.column(name).cast(pa.int64()))
    return exact


def spans_from_table(table: pa.Table) -> list[Span]:
    """Every row of a store table as a Span, times read as exact integer nanoseconds."""
    return [span_from_row(row) for row in exact_times(table).to_pylist()]
