"""Reading the store: by time window, service, agent, trace and episode; SQL; no duplicates."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from store_samples import BASE_NS, HOUR_NS, span

from spanmill.store import BatchId, SpanStore, StoreError, StoreWriter, to_unix_nanos
from spanmill.store.rows import HourlyColumns, SpanParts

MINUTE_NS = 60 * 10**9


@pytest.fixture
def store(tmp_path: Path) -> SpanStore:
    writer = StoreWriter(str(tmp_path))
    for batch_index in range(3):
        hourly = HourlyColumns()
        for i in range(batch_index * 40, batch_index * 40 + 40):
            hourly.append(SpanParts.from_span(span(i)), "t", batch_index % 2, i, 0, 1)
        first, last = batch_index * 40, batch_index * 40 + 39
        writer.write_batch(
            BatchId("t", batch_index % 2, first, last, "00000000000000aa"), hourly.tables()
        )
    return SpanStore(str(tmp_path))


def test_window_is_half_open_and_prunes_hour_folders(store: SpanStore) -> None:
    assert store.count() == 120
    start, end = BASE_NS + 10 * MINUTE_NS, BASE_NS + 70 * MINUTE_NS
    table = store.table(start=start, end=end, columns=["span_id"])
    assert table.column("span_id").to_pylist() == [span(i).span_id for i in range(10, 70)]
    assert len(store.files(start=BASE_NS + 2 * HOUR_NS)) < len(store.files())
    assert store.count(start=datetime.fromtimestamp((BASE_NS + 119 * MINUTE_NS) / 1e9, UTC)) == 1


def test_filters_by_service_agent_trace_episode(store: SpanStore) -> None:
    assert store.count(service="svc-b") == 40
    assert store.count(agent="calculator") == 60
    assert store.count(service="svc-b", agent="planner") == 20
    (found,) = store.spans(trace_id=span(33).trace_id.upper())
    assert found == span(33)
    assert store.count(episode_id=span(7).trace_id) == 1
    assert store.count(llm_calls_only=True) == 120


def test_sql_over_a_window(store: SpanStore) -> None:
    result = store.query(
        "SELECT agent_name, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1",
        start=BASE_NS,
        end=BASE_NS + 60 * MINUTE_NS,
    )
    assert result.to_pylist() == [
        {"agent_name": "calculator", "n": 30},
        {"agent_name": "planner", "n": 30},
    ]


def test_duplicates_are_detected(store: SpanStore, tmp_path: Path) -> None:
    assert store.duplicates() == 0
    assert [b.first for b in store.batches()] == [0, 80, 40]
    original = store.files()[0].path
    shutil.copy(original, original.replace("00000000000000aa", "00000000000000ab"))
    assert store.duplicates() > 0


def test_empty_store_and_bad_input(tmp_path: Path) -> None:
    empty = SpanStore(str(tmp_path / "nothing"))
    assert empty.count() == 0
    assert empty.table(columns=["trace_id"]).num_rows == 0
    assert empty.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 0}]
    with pytest.raises(StoreError, match="ISO 8601"):
        to_unix_nanos("yesterday")
    with pytest.raises(StoreError, match="unknown span store columns"):
        empty.table(columns=["nope"])
    assert to_unix_nanos("2025-06-15T15:06:40Z") == BASE_NS
    assert to_unix_nanos(datetime(2025, 6, 15, 15, 6, 40)) == BASE_NS
