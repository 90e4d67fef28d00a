"""What a reward judges (spanmill.rewards): one rule, read the same by the dataset builder
(over the spans it read) and by SQL over the store (the rollout signals)."""

from __future__ import annotations

from pathlib import Path

from spanmill import semconv as sc
from spanmill.spans import Span, SpanEvent
from spanmill.store import BatchId, SpanStore, StoreWriter
from spanmill.store.queries import linked_rewards
from spanmill.store.rows import HourlyColumns, SpanParts

T0 = 1_750_000_000_000_000_000


def reward(name: str, value: float, **more: object) -> SpanEvent:
    attributes = {sc.GEN_AI_EVALUATION_NAME: name, sc.GEN_AI_EVALUATION_SCORE_VALUE: value}
    return SpanEvent(name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=T0,
                     attributes={**attributes, **more})  # fmt: skip


def span(trace: int, at: int, *, call: str | None = None, events: tuple[SpanEvent, ...] = (),
         episode: str | None = None) -> Span:  # fmt: skip
    attributes: dict[str, object] = {}
    if call is not None:
        attributes = {sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT, sc.GEN_AI_RESPONSE_ID: call}
    if episode is not None:
        attributes[sc.SPANMILL_EPISODE_ID] = episode
    return Span(
        trace_id=f"{trace:032x}", span_id=f"{trace:08x}{at:08x}", name="s",
        start_time_unix_nano=T0 + at, end_time_unix_nano=T0 + at + 1,
        attributes=attributes, events=events,
    )  # fmt: skip


def test_each_reward_judges_the_call_it_names_or_an_episode(tmp_path: Path) -> None:
    spans = [
        span(1, 1, call="resp-1"),
        span(1, 2, call="resp-2"),
        # An agent's own reward for its whole run, and one for a call it names.
        span(1, 3, events=(
            reward("done", 1.0), reward("ok", 0.5, **{sc.GEN_AI_RESPONSE_ID: "resp-2"}))),
        # Feedback by response id, in a trace of its own: the call (and its episode).
        span(2, 4, events=(reward("resolved", 1.0, **{sc.GEN_AI_RESPONSE_ID: "resp-1"}),)),
        # Feedback naming a call that was not read: it judges its own trace's episode.
        span(3, 5, events=(reward("resolved", 0.0, **{sc.GEN_AI_RESPONSE_ID: "elsewhere"}),)),
        # A reward span with an explicit episode: that episode.
        span(4, 6, episode="episode-9", events=(reward("graded", 0.25),)),
    ]  # fmt: skip
    hourly = HourlyColumns()
    for i, item in enumerate(spans):
        hourly.append(SpanParts.from_span(item), "t", 0, i, 0, 1)
    StoreWriter(str(tmp_path)).write_batch(BatchId("t", 0, 0, 5, "0" * 16), hourly.tables())
    store = SpanStore(str(tmp_path))

    columns = ["name", "value", "call_response_id", "episode_id", "reaches_call"]
    builder = linked_rewards(store.table()).select(columns).to_pylist()
    sql = store.query(
        f"SELECT {', '.join(columns)} FROM linked_rewards() "
        "ORDER BY start_time, trace_id, span_id, position"
    ).to_pylist()
    first = f"{1:032x}"
    assert builder == sql == [
        {"name": "done", "value": 1.0, "call_response_id": None, "episode_id": first,
         "reaches_call": True},
        {"name": "ok", "value": 0.5, "call_response_id": "resp-2", "episode_id": first,
         "reaches_call": True},
        {"name": "resolved", "value": 1.0, "call_response_id": "resp-1", "episode_id": first,
         "reaches_call": True},
        {"name": "resolved", "value": 0.0, "call_response_id": None,
         "episode_id": f"{3:032x}", "reaches_call": False},
        {"name": "graded", "value": 0.25, "call_response_id": None, "episode_id": "episode-9",
         "reaches_call": False},
    ]  # fmt: skip


def test_a_score_that_is_not_finite_is_no_reward(tmp_path: Path) -> None:
    """NaN compares as neither above nor below a threshold, and the dataset card's
    histogram cannot place it: the collector keeps the span but not as a reward, and a
    store written before that counts such rewards out, in the card."""
    import math

    import pyarrow as pa

    from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
    from spanmill.dataset.episodes import read_rewards
    from spanmill.rewards import rewards_of
    from spanmill.spans import encode_otlp_protobuf

    for bad in (math.nan, math.inf, -math.inf):
        assert (
            rewards_of({sc.GEN_AI_EVALUATION_NAME: "r", sc.GEN_AI_EVALUATION_SCORE_VALUE: bad})
            == []
        )
    spans = [span(1, 1, call="resp-1"), span(1, 2, events=(reward("done", math.nan),))]
    for native in (True, False):
        store_dir = tmp_path / f"native-{native}"
        job = BatchJob(BatchId("t", 0, 0, 1, "0" * 16), [0, 1], [0, 0],
                       [encode_otlp_protobuf([s]) for s in spans], [None, None])  # fmt: skip
        outcome = BatchProcessor(ProcessingConfig(store_url=str(store_dir)), native=native).process(
            job
        )
        assert outcome.spans == 2 and outcome.dead == []
        table = SpanStore(str(store_dir)).table()
        assert table["rewards"].null_count == 2, native
        assert read_rewards(table).names == {}

    # A store whose rewards column already holds one.
    hourly = HourlyColumns()
    for i, item in enumerate(
        [span(1, 1, call="resp-1"), span(1, 2, events=(reward("done", 1.0),))]
    ):
        hourly.append(SpanParts.from_span(item), "t", 0, i, 0, 1)
    StoreWriter(str(tmp_path / "old")).write_batch(BatchId("t", 0, 0, 1, "0" * 16), hourly.tables())
    table = SpanStore(str(tmp_path / "old")).table()
    items = table["rewards"].to_pylist()
    for row in items:
        for item in row or ():
            item["value"] = math.nan
    column = table.schema.get_field_index("rewards")
    table = table.set_column(column, "rewards", pa.array(items, type=table["rewards"].type))
    found = read_rewards(table)
    assert found.not_finite == 1 and found.names == {}
