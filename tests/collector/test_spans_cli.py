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


def test_redact_shows_what_would_be_stored_and_what_is_scanned_for() -> None:
    """An operator tries the deployed patterns (from the collector's settings) and one
    more on sample texts before a rollout."""
    env = {"SPANMILL_COLLECTOR_REDACT_PATTERNS": '{"employee": "\\\\bEMP-\\\\d{6}\\\\b"}',
           "COLUMNS": "200"}  # fmt: skip
    result = runner.invoke(
        app,
        ["spans", "redact", "078-05-1120", "ssn 078-05-1120", "EMP-123456 wrote",
         "--pattern", r"ssn=^\d{3}-\d{2}-\d{4}$", "--pattern", r"word=\b[a-z]{20,}\b"],
        env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert "'EMP-'" in rows["employee"]
    assert "a run of 9 digits" in rows["ssn"]
    assert "nothing" in rows["word"]
    assert "[REDACTED:ssn]" in rows["078-05-1120"] and "ssn x1" in rows["078-05-1120"]
    assert "[REDACTED:ssn]" not in rows["ssn 078-05-1120"]  # anchored: a whole value only
    assert "[REDACTED:employee] wrote" in rows["EMP-123456 wrote"]
    bad = runner.invoke(app, ["spans", "redact", "x", "--pattern", "broken=("], env=env)
    assert bad.exit_code == 1 and "'broken' is not a regex" in bad.output
    bad = runner.invoke(app, ["spans", "redact", "x", "--pattern", "no-equals"], env=env)
    assert bad.exit_code == 1 and "NAME=REGEX" in bad.output
