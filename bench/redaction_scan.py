"""Where the scan for redaction runs: inside the native decoder, or over the columns.

Every built-in redaction pattern needs one of its gates (``@``, ``k-``, ``AKIA``...)
or a run of digits to occur in a text; a span with none skips the patterns. The
native decoder looks for them in each text as it reads a record. The other place
such a test could run is after decoding, over the batch's text columns with Arrow's
compute functions (RE2). This prints both on the collector bench's spans (one a
record), in one run: the decoder with and without its scan (the difference is the
scan's cost), and Arrow's ``match_substring_regex`` over the same rows' text
columns for the gates and the digit run, and for one literal alone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from bench.collector_throughput import payloads
from spanmill.collector.redact import Redactor
from spanmill.store.rows import HourlyColumns
from spanmill.store.schema import PROMOTED, PROMOTED_RESOURCE

SPANS = 20_000
ROUNDS = 3
# The columns whose text the patterns read (ids, times and Kafka's columns are not texts).
TEXT_COLUMNS = (
    "name",
    "status_message",
    *(p.column for p in (*PROMOTED, *PROMOTED_RESOURCE) if p.kind == "str"),
    "attributes",
    "resource_attributes",
    "events",
    "links",
)


def decode(records: list[bytes], gates: object, digits: int) -> tuple[float, HourlyColumns]:
    hourly = HourlyColumns()
    started = time.perf_counter()
    for offset, value in enumerate(records):
        hourly.append_record(value, gates=gates, digits=digits, offset=offset)
    return time.perf_counter() - started, hourly


def over_columns(table: pa.Table, test: Callable[[pa.ChunkedArray], pa.ChunkedArray]) -> float:
    started = time.perf_counter()
    found = None
    for column in TEXT_COLUMNS:
        hits = test(table[column])
        found = hits if found is None else pc.or_kleene(found, hits)
    return time.perf_counter() - started


def main() -> None:
    records = [value for _, value in payloads(SPANS)]
    redactor = Redactor()
    prefilter = redactor.prefilter
    if prefilter is None:
        print("no native decoder here: nothing to compare")
        return
    gates, digits = prefilter
    # Each gate with the characters that must follow it, as the decoder tests them.
    gated = "|".join(
        re.escape(gate)
        + (f"[{re.escape(rule.follow)}]{{{rule.follow_min}}}" if rule.follow_min else "")
        for rule in redactor.rules
        for gate in rule.gates
    )
    run = r"\p{Nd}(?:[ -]?\p{Nd}){" + str(digits - 1) + "}"
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, seconds), seconds)

    table = None
    for _ in range(ROUNDS):
        seconds, _ = decode(records, None, 0)
        keep("decoder without its scan", seconds)
        seconds, hourly = decode(records, gates, digits)
        keep("decoder with its scan", seconds)
        if table is None:
            (table,) = hourly.tables().values()
        keep("arrow: gates and digit run", over_columns(
            table, lambda c: pc.match_substring_regex(c, f"{gated}|{run}")))  # fmt: skip
        keep("arrow: one literal (@)", over_columns(table, lambda c: pc.match_substring(c, "@")))
    assert table is not None and table.num_rows == SPANS
    text_bytes = sum(table[column].nbytes for column in TEXT_COLUMNS) / SPANS
    print(f"{SPANS} spans, {text_bytes:.0f} bytes of text columns a span; best of {ROUNDS}")
    scan = best["decoder with its scan"] - best["decoder without its scan"]
    for name, seconds in best.items():
        print(f"  {name:<28} {seconds / SPANS * 1e6:6.2f} us a span")
    print(f"  the decoder's scan itself      {scan / SPANS * 1e6:6.2f} us a span; Arrow's test "
          f"of the same gates costs {best['arrow: gates and digit run'] / max(scan, 1e-9):.1f}x "
          f"that, {best['arrow: gates and digit run'] / best['decoder with its scan']:.2f}x "
          "the whole decode")  # fmt: skip


if __name__ == "__main__":
    main()
