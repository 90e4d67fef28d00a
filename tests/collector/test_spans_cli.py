"""``spanmill spans stats`` and ``spanmill spans tail``: what a person looks at."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from collector_helpers import Topics, llm_span, producer
from typer.testing import CliRunner

from spanmill.cli.main import app
from spanmill.spans import encode_otlp_protobuf
from spanmill.store import SpanParts, StoreWriter
from spanmill.store.layout import BatchId
from spanmill.store.rows import HourlyColumns

runner = CliRunner()


def test_stats_summarises_the_store(tmp_path: Path) -> None:
    hourly = HourlyColumns()
    for i in range(30):
        hourly.append(SpanParts.from_span(llm_span(i)), "spanmill.spans.v1", 1, i, 0, 1)
    StoreWriter(str(tmp_path)).write_batch(
        BatchId("spanmill.spans.v1", 1, 0, 29, "00000000000000aa"), hourly.tables()
    )
    result = runner.invoke(
        app, ["spans", "stats", "--store", str(tmp_path), "--since", ""], env={"COLUMNS": "150"}
    )
    assert result.exit_code == 0, result.output
    assert "30 spans, 30 traces, 30 LLM calls, 0 errors" in result.output
    for expected in ("calculator-agent", "smollm2-135m", "correct", "spanmill.spans.v1"):
        assert expected in result.output
    bad = runner.invoke(app, ["spans", "stats", "--store", str(tmp_path), "--since", "soon"])
    assert bad.exit_code == 1 and "--since 'soon'" in bad.output


@pytest.mark.services
def test_tail_shows_spans_and_refusals(topics: Topics) -> None:
    env = {
        "SPANMILL_KAFKA_BOOTSTRAP_SERVERS": topics.bootstrap,
        "SPANMILL_KAFKA_SPANS_TOPIC": topics.spans,
        "COLUMNS": "200",
    }
    send = producer(topics.bootstrap)

    def later() -> None:
        time.sleep(2)  # after tail has seeked to the end
        span = llm_span(5)
        send.send(topics.spans, key=span.trace_id.encode(), value=encode_otlp_protobuf([span]))
        send.send(topics.spans, key=b"bad", value=b"{oops")
        send.flush()

    threading.Thread(target=later, daemon=True).start()
    result = runner.invoke(app, ["spans", "tail", "--limit", "2"], env=env)
    assert result.exit_code == 0, result.output
    assert "chat smollm2" in result.output and "calculator-agent" in result.output
    assert "bad_json" in result.output
