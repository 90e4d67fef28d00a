"""Late feedback joined by the dataset builder: read past the calls' window, counted in the card."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dataset_traces import episode, llm, reward_event, table, tid

from spanmill import semconv as sc
from spanmill.dataset.build import build
from spanmill.dataset.episodes import DatasetError
from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.feedback import Caller, FeedbackItem, feedback_span, new_response_id
from spanmill.spans import Span
from spanmill.store import BatchId, SpanStore, StoreWriter, to_unix_nanos
from spanmill.store.rows import HourlyColumns, SpanParts

HOUR = 3600 * 10**9
T0 = to_unix_nanos(datetime(2025, 6, 1, 10, tzinfo=UTC))  # the calls' window: 10:00 to 12:00
SINCE, UNTIL = "2025-06-01T10:00:00+00:00", "2025-06-01T12:00:00+00:00"
CARRIED = new_response_id(tid(3), "0000abcd")
_ids = iter(range(1, 1000))


def given(at: int, **fields: object) -> Span:
    """Feedback as the routes turn it into a span, received at ``at``."""
    item = FeedbackItem.model_validate({"name": "thumbs", **fields})
    return feedback_span(item, Caller("bearer", "10.1.2.3"), at, f"{next(_ids):016x}",
                         service_name="spanmill-gateway")  # fmt: skip


def traffic() -> list[Span]:
    return [
        # An episode of two calls, judged as a whole 5 hours later by its trace id.
        episode(1, T0 + 5 * 60 * 10**9, task="t1"),
        llm(1, T0 + 6 * 60 * 10**9, answer="first", task="t1", response_id="r-1a"),
        llm(1, T0 + 7 * 60 * 10**9, answer="second", task="t1", response_id="r-1b"),
        given(T0 + 5 * HOUR, trace_id=tid(1), value=True),
        # A call with a foreign response id: its feedback sits in a trace of its own.
        llm(2, T0 + 30 * 60 * 10**9, answer="foreign", task="t2", response_id="resp_foreign"),
        given(T0 + 5 * HOUR + 30 * 60 * 10**9, response_id="resp_foreign", value=0.25),
        # A gateway call: the response id carries the trace, so the feedback joins it.
        llm(3, T0 + HOUR, answer="carried", task="t3", response_id=CARRIED),
        given(T0 + 6 * HOUR, response_id=CARRIED, value=0.5),
        # Feedback naming no call at all: kept and counted.
        given(T0 + 6 * HOUR + 10 * 60 * 10**9, response_id="resp_nowhere", value=1),
        # A call after the window, and its feedback: the next window's.
        llm(4, T0 + 3 * HOUR, answer="later", task="t4", response_id="r-4"),
        given(T0 + 4 * HOUR, response_id="r-4", value=1),
        # Past the horizon (6 h after 12:00): not read, so it overrides nothing.
        given(T0 + 9 * HOUR, response_id="resp_foreign", value=-1),
    ]


def write_store(root: Path, spans: list[Span]) -> None:
    hourly = HourlyColumns()
    for offset, span in enumerate(spans):
        hourly.append(SpanParts.from_span(span), "spans", 0, offset, 0, 1)
    batch = BatchId("spans", 0, 0, len(spans) - 1, "00000000000000aa")
    StoreWriter(str(root)).write_batch(batch, hourly.tables())


def rewards_by_answer(rows: list[dict[str, object]]) -> dict[object, object]:
    return {row["completion"][0]["content"]: row["reward"] for row in rows}  # type: ignore[index]


def test_late_feedback_is_read_past_the_window_and_joined(tmp_path: Path) -> None:
    write_store(tmp_path / "store", traffic())
    spec = DatasetSpec(since=SINCE, until=UNTIL, feedback_horizon_hours=6, credit="per_call",
                       eval_fraction=0)  # fmt: skip
    card = build_dataset(str(tmp_path / "store"), tmp_path / "out", spec)
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert rewards_by_answer(rows) == {"first": 1.0, "second": 1.0, "foreign": 0.25,
                                       "carried": 0.5}  # fmt: skip
    counts = card["counts"]
    assert counts["llm_calls"] == 4  # the call after the window is no sample
    assert (counts["feedback"], counts["feedback_joined"], counts["feedback_later_calls"],
            counts["feedback_unmatched"]) == (5, 3, 1, 1)  # fmt: skip
    assert card["filters"]["feedback_horizon_hours"] == 6
    assert card["span_window"]["rewards"] == {
        "feedback_horizon_hours": 6,
        "since": "2025-06-01T10:00:00+00:00",
        "until": "2025-06-01T18:00:00+00:00",
        "last_span": "2025-06-01T16:10:00+00:00",  # the unmatched feedback, read and counted
    }
    assert card["span_window"]["last_span"] == "2025-06-01T11:00:00+00:00"  # calls' window
    # Unmatched feedback stays in the store, whole.
    kept = SpanStore(str(tmp_path / "store")).query(
        "SELECT response_id, reward_value FROM spans WHERE scope_name = 'spanmill.feedback' "
        "AND response_id = 'resp_nowhere'"
    )
    assert kept.to_pylist() == [{"response_id": "resp_nowhere", "reward_value": 1.0}]


def test_a_short_horizon_misses_late_feedback(tmp_path: Path) -> None:
    write_store(tmp_path / "store", traffic())
    spec = DatasetSpec(since=SINCE, until=UNTIL, feedback_horizon_hours=2, credit="per_call",
                       eval_fraction=0)  # fmt: skip
    with pytest.raises(DatasetError, match="no training rows"):  # rewards until 14:00 only
        build_dataset(str(tmp_path / "store"), tmp_path / "out", spec)
    wider = build_dataset(
        str(tmp_path / "store"),
        tmp_path / "out",
        spec.model_copy(update={"feedback_horizon_hours": 3.5}),  # until 15:30, excluded
    )
    assert wider["counts"]["feedback"] == 2  # 14:00 (the later call's) and 15:00 (trace 1)
    assert wider["counts"]["with_reward"] == 2  # first and second; not yet foreign or carried


def test_feedback_by_trace_reaches_the_episode_its_calls_name() -> None:
    call = llm(7, 100, answer="answer", task="t7")
    call = call.model_copy(
        update={"attributes": {**call.attributes, sc.SPANMILL_EPISODE_ID: "ep-7"}}
    )
    spans = [call, given(5 * HOUR, trace_id=tid(7), value=0.75)]
    built = build(DatasetSpec(eval_fraction=0), table(*spans))
    assert rewards_by_answer(built.train) == {"answer": 0.75}
    assert built.counts["feedback_joined"] == 1 and built.counts["feedback_unmatched"] == 0


def test_feedback_overrides_the_agents_own_reward_of_that_name() -> None:
    spans = [
        episode(8, 100, reward_event("thumbs", 0.0, primary=True), task="t8"),
        llm(8, 110, answer="answer", task="t8"),
        given(2 * HOUR, trace_id=tid(8), value=1),
    ]
    built = build(DatasetSpec(eval_fraction=0), table(*spans))
    assert rewards_by_answer(built.train) == {"answer": 1.0}  # the latest value counts
