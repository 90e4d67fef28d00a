"""Joining the gateway's calls to their agents' episodes (``spanmill.store.links``), and
what the links cost every read afterwards, in the same run.

An hour of SPANMILL_BENCH_JOIN_CALLS calls (default 20,000) is written in the
collector's layout: for each, the agent's own LLM span (an instrumentation that sends
no trace context, so no response id either) and the gateway's span of the same call in
a trace of its own; one call in ten repeats an earlier question at another moment. Then:
one join pass over the hour (calls joined a second), and before and after it, a read of
the hour's LLM calls with the dataset builder's columns and a DuckDB count by episode,
each the median of three: the ratio (with links over without) is what every reader
pays for the links.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from bench import median_seconds
from spanmill import semconv as sc
from spanmill.dataset.episodes import COLUMNS
from spanmill.producers import GATEWAY
from spanmill.spans import Span
from spanmill.store import BatchId, SpanStore, StoreWriter, table_from_spans
from spanmill.store.join import join_calls

CALLS = int(os.environ.get("SPANMILL_BENCH_JOIN_CALLS", "20000"))
HOUR_NS = 3600 * 10**9
HOUR0 = 1_780_000_000 * 10**9 // HOUR_NS * HOUR_NS
PER_FILE = 500


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def _pair(i: int) -> list[Span]:
    start = HOUR0 + i * (HOUR_NS // (CALLS + 1))
    question = f"What is {i if i % 10 else i // 2} times 37?"
    answer = str((i if i % 10 else i // 2) * 37)
    common = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "calculator",
        sc.GEN_AI_INPUT_MESSAGES: _messages("user", question),
        sc.GEN_AI_OUTPUT_MESSAGES: _messages("assistant", answer),
    }
    return [
        Span(
            trace_id=f"{2 * i + 1:032x}", span_id=f"{2 * i + 1:016x}", name="ChatOpenAI",
            start_time_unix_nano=start, end_time_unix_nano=start + 80_000_000,
            attributes=common,
            resource_attributes={sc.SERVICE_NAME: "agent", sc.SPANMILL_PRODUCER: "agent"},
        ),
        Span(
            trace_id=f"{2 * i + 2:032x}", span_id=f"{2 * i + 2:016x}", name="chat calculator",
            start_time_unix_nano=start + 10_000_000, end_time_unix_nano=start + 70_000_000,
            attributes={**common, sc.GEN_AI_RESPONSE_ID: f"chatcmpl-{i}",
                        sc.SPANMILL_MODEL_VERSION: "2",
                        sc.SPANMILL_COMPLETION_TOKEN_IDS: list(range(8))},
            resource_attributes={sc.SERVICE_NAME: "spanmill-gateway",
                                 sc.SPANMILL_PRODUCER: GATEWAY},
        ),
    ]  # fmt: skip


def _write(root: str) -> None:
    writer = StoreWriter(root)
    for first in range(0, CALLS, PER_FILE):
        spans = [s for i in range(first, min(first + PER_FILE, CALLS)) for s in _pair(i)]
        table = table_from_spans(spans, topic="spans")
        batch = BatchId("spans", 0, first, first + PER_FILE - 1, f"{first:016x}")
        writer.write_batch(batch, {HOUR0 // HOUR_NS: table})


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="spanmill-bench-join-") as root:
        _write(root)
        store = SpanStore(root)
        window = {"start": HOUR0, "end": HOUR0 + HOUR_NS}

        def read() -> object:
            return store.table(llm_calls_only=True, columns=list(COLUMNS), **window)

        def query() -> object:
            return store.query("SELECT episode_id, count(*) FROM llm_calls() GROUP BY 1", **window)

        read_before, query_before = median_seconds(read), median_seconds(query)
        started = time.perf_counter()
        report = join_calls(store, HOUR0, HOUR0 + HOUR_NS)
        joined_s = time.perf_counter() - started
        read_after, query_after = median_seconds(read), median_seconds(query)
        print(
            f"{CALLS} gateway calls without context: {report.linked} joined, "
            f"{report.ambiguous} ambiguous, {report.unmatched} unmatched in {joined_s:.2f} s "
            f"({CALLS / joined_s:,.0f} calls/s)"
        )
        print(
            f"read of the hour's LLM calls: {read_before:.3f} s without links, "
            f"{read_after:.3f} s with (ratio {read_after / read_before:.2f})"
        )
        print(
            f"DuckDB count by episode: {query_before:.3f} s without links, "
            f"{query_after:.3f} s with (ratio {query_after / query_before:.2f})"
        )


if __name__ == "__main__":
    main()
