"""The span store: Parquet files under ``dt=YYYY-MM-DD/hour=HH/`` on a folder or any fsspec URL.

- :mod:`~spanmill.store.schema`: the typed Arrow schema, one row per span.
- :mod:`~spanmill.store.layout`: folder and file names, and what a name says.
- :mod:`~spanmill.store.rows`: spans to columns and back.
- :mod:`~spanmill.store.writer`: atomic writes and the ledger that makes them exactly-once.
- :mod:`~spanmill.store.reader`: spans by time window, service, agent, trace.
"""

from spanmill.store.layout import BatchId, fingerprint, hour_dir, parse_file_name
from spanmill.store.reader import SpanStore, StoredFile, StoreError, to_unix_nanos
from spanmill.store.rows import (
    HourlyColumns,
    SpanParts,
    check_storable,
    span_from_row,
    spans_from_table,
    table_from_spans,
)
from spanmill.store.schema import COLUMNS, SCHEMA_VERSION, SPAN_SCHEMA
from spanmill.store.writer import LedgerEntry, StoreWriter, open_store

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "SPAN_SCHEMA",
    "BatchId",
    "HourlyColumns",
    "LedgerEntry",
    "SpanParts",
    "SpanStore",
    "StoreError",
    "StoreWriter",
    "StoredFile",
    "check_storable",
    "fingerprint",
    "hour_dir",
    "open_store",
    "parse_file_name",
    "span_from_row",
    "spans_from_table",
    "table_from_spans",
    "to_unix_nanos",
]
