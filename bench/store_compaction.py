"""Reading a day of spans as the collector wrote it (many small files) and after
``spanmill store compact``, in the same run.

A day of 24 hours, each hour SPANMILL_BENCH_FILES_PER_HOUR files (default 300: three
partitions each writing a batch every 36 s, a quiet collector) of 20 spans, is
written in the collector's layout and file format. Then, before and after one
compaction run: a full read of every column of the day (what the dataset builder
does), and a DuckDB query of spans per hour (what ``spanmill spans stats`` does),
each the median of three. Prints the times, the ratio (small files over compacted)
and the file counts, and the compaction's own time.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

from bench import median_seconds
from spanmill import semconv as sc
from spanmill.spans import Span
from spanmill.store import BatchId, SpanStore, StoreWriter, table_from_spans
from spanmill.store.compact import Compactor

HOURS = 24
SPANS_PER_FILE = 20
HOUR_NS = 3600 * 10**9
DAY0 = 1_780_000_000 * 10**9 // (24 * HOUR_NS) * (24 * HOUR_NS)


def _message(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def _template() -> pa.Table:
    spans = [
        Span(
            trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", name="chat smollm2",
            kind="client", start_time_unix_nano=DAY0 + i, end_time_unix_nano=DAY0 + i + 10**8,
            attributes={
                sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
                sc.GEN_AI_REQUEST_MODEL: "calculator",
                sc.GEN_AI_AGENT_NAME: "calculator",
                sc.GEN_AI_INPUT_MESSAGES: _message("user", f"What is {i} times 37? The number."),
                sc.GEN_AI_OUTPUT_MESSAGES: _message("assistant", str(i * 37)),
                sc.SPANMILL_COMPLETION_TOKEN_IDS: list(range(i, i + 12)),
            },
            resource_attributes={sc.SERVICE_NAME: "calculator-agent"},
        )
        for i in range(SPANS_PER_FILE)
    ]  # fmt: skip
    return table_from_spans(spans, topic="spans")


def _write_day(root: str, files_per_hour: int) -> int:
    writer = StoreWriter(root)
    template = _template()
    step = HOUR_NS // files_per_hour
    n = 0
    for hour in range(HOURS):
        for f in range(files_per_hour):
            first = n
            start = DAY0 + hour * HOUR_NS + f * step
            ids = pa.array([f"{first + i + 1:032x}" for i in range(SPANS_PER_FILE)])
            starts = pa.array([start + i for i in range(SPANS_PER_FILE)], pa.int64())
            table = template.set_column(0, "trace_id", ids).set_column(
                template.schema.get_field_index("start_time"), "start_time",
                starts.cast(template.schema.field("start_time").type),
            )  # fmt: skip
            table = table.set_column(
                template.schema.get_field_index("kafka_offset"), "kafka_offset",
                pc.add(table.column("kafka_offset"), first),
            )  # fmt: skip
            batch = BatchId("spans", f % 3, first, first + SPANS_PER_FILE - 1, f"{first:016x}")
            writer.write_batch(batch, {DAY0 // HOUR_NS + hour: table})
            n += SPANS_PER_FILE
    return n


def _reads(store: SpanStore, spans: int) -> tuple[float, float, int]:
    files = len(store.files())
    table_s = median_seconds(lambda: store.table())
    assert store.count() == spans
    query_s = median_seconds(
        lambda: store.query(
            "SELECT date_trunc('hour', start_time) h, count(*) FROM spans GROUP BY 1"
        )
    )
    return table_s, query_s, files


def main() -> None:
    files_per_hour = int(os.environ.get("SPANMILL_BENCH_FILES_PER_HOUR", "300"))
    with tempfile.TemporaryDirectory(prefix="spanmill-bench-store-") as root:
        started = time.perf_counter()
        spans = _write_day(root, files_per_hour)
        print(
            f"a day: {spans:,} spans in {HOURS * files_per_hour:,} files "
            f"({time.perf_counter() - started:.1f} s to write)",
            flush=True,
        )
        store = SpanStore(root)
        small_table, small_query, small_files = _reads(store, spans)
        report = Compactor(root, settle_s=0).run()
        compacted_table, compacted_query, compacted_files = _reads(SpanStore(root), spans)
    print(f"compaction: {report.hours_compacted} hours in {report.seconds:.1f} s "
          f"({report.files_before:,} files to {report.files_after})")  # fmt: skip
    print(f"{'read':<26}{'small files':>12}{'compacted':>12}{'ratio':>8}")
    print(f"{'files':<26}{small_files:>12,}{compacted_files:>12,}"
          f"{small_files / compacted_files:>8.0f}")  # fmt: skip
    for label, small, compacted in (
        ("full table, every column", small_table, compacted_table),
        ("DuckDB spans per hour", small_query, compacted_query),
    ):
        print(f"{label:<26}{small:>11.2f}s{compacted:>11.2f}s{small / compacted:>8.1f}")


if __name__ == "__main__":
    main()
