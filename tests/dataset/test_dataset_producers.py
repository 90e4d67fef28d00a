"""Whose spans train: untrusted producers' spans are stored, counted, and left out."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dataset_traces import llm, tid
from test_dataset_feedback import write_store

from spanmill import semconv as sc
from spanmill.dataset.episodes import DatasetError
from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.feedback import Caller, FeedbackItem, feedback_span
from spanmill.producers import DIRECT, GATEWAY, Trust, producer_of
from spanmill.spans import Span
from spanmill.store import SpanStore, to_unix_nanos

T0 = to_unix_nanos(datetime(2025, 6, 1, 10, tzinfo=UTC))
MINUTE = 60 * 10**9
SINCE, UNTIL = "2025-06-01T10:00:00+00:00", "2025-06-01T12:00:00+00:00"


def feedback(at: int, trace: int, value: float, principal: str) -> Span:
    """Feedback as a route takes it from ``principal`` (a key id, or anonymous)."""
    item = FeedbackItem.model_validate({"name": "resolved", "trace_id": tid(trace), "value": value})
    return feedback_span(item, Caller(principal, None), at, f"{at % 10**12:016x}",
                         service_name="spanmill-gateway")  # fmt: skip


def stamped(span: Span, producer: str) -> Span:
    """``span`` as ``producer`` wrote it: the gateway, or the receiver after a key's id."""
    resource = {**span.resource_attributes, sc.SPANMILL_PRODUCER: producer}
    return span.model_copy(update={"resource_attributes": resource})


def traffic() -> list[Span]:
    return [
        # Calls the gateway recorded, judged by a keyed producer and by an anonymous one.
        stamped(llm(1, T0 + 1 * MINUTE, answer="keyed", task="t1"), GATEWAY),
        feedback(T0 + 10 * MINUTE, 1, 1.0, "support-agent"),
        stamped(llm(2, T0 + 2 * MINUTE, answer="anonymous judge", task="t2"), GATEWAY),
        feedback(T0 + 11 * MINUTE, 2, 1.0, "anonymous"),
        # A whole call, rewards and all, injected through a receiver that asked no key.
        stamped(llm(3, T0 + 3 * MINUTE, answer="injected", task="t3"), "anonymous"),
        stamped(feedback(T0 + 12 * MINUTE, 3, 1.0, "anonymous"), "anonymous"),
    ]


def answers(out: Path) -> set[str]:
    rows = pq.read_table(out / "train.parquet").to_pylist()
    return {row["completion"][0]["content"] for row in rows}


def spec(**fields: object) -> DatasetSpec:
    return DatasetSpec(since=SINCE, until=UNTIL, credit="per_call", eval_fraction=0, **fields)  # type: ignore[arg-type]


def test_untrusted_spans_are_stored_but_left_out_of_a_default_dataset(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, traffic())
    assert len(list(SpanStore(str(store)).spans())) == 6  # every span is kept

    card = build_dataset(str(store), tmp_path / "default", spec())
    assert answers(tmp_path / "default") == {"keyed"}
    assert card["counts"]["untrusted_spans"] == 3  # anonymous feedback twice, and the call
    assert card["producers"] == {
        "trusted": "every producer but anonymous",
        "left_out": {"anonymous": 3},
    }
    assert card["filters"]["trusted_producers"] == []

    # Trusting every span takes them all; naming producers takes those alone.
    build_dataset(str(store), tmp_path / "all", spec(trusted_producers=("*",)))
    assert answers(tmp_path / "all") == {"keyed", "anonymous judge", "injected"}
    build_dataset(
        str(store), tmp_path / "named", spec(trusted_producers=("anonymous", "spanmill-gateway"))
    )
    # The gateway's calls and anonymous spans: the keyed producer's reward is not read.
    assert answers(tmp_path / "named") == {"anonymous judge", "injected"}


def test_a_dataset_emptied_by_trust_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, traffic()[2:])
    with pytest.raises(DatasetError, match=r"3 spans from untrusted producers \(anonymous\)"):
        build_dataset(str(store), tmp_path / "out", spec())


@pytest.mark.parametrize(
    "trust",
    [Trust(), Trust(("*",)), Trust(("kafka", "support")), Trust.parse(" anonymous, x ,")],
    ids=str,
)
def test_the_sql_rule_and_the_arrow_rule_agree(trust: Trust) -> None:
    """The rollout signals read the rule as SQL, the dataset builder as an Arrow mask."""
    resources = [None, "{}", '{"service.name":"a"}', '{"spanmill.producer":"anonymous"}',
                 '{"service.name":"b","spanmill.producer":"support"}',
                 '{"spanmill.producer":""}', '{"spanmill.producer":"x"}']  # fmt: skip
    stored = pa.table({"resource_attributes": pa.array(resources, pa.string())})
    arrow = trust.mask(stored["resource_attributes"]).to_pylist()
    expected = [trust.trusts(producer_of(r)) for r in resources]
    assert arrow == expected
    sql = duckdb.sql(f"SELECT {trust.sql()} AS t FROM stored").fetchall()
    assert [row[0] for row in sql] == expected
    assert producer_of(None) == producer_of('{"spanmill.producer":""}') == DIRECT


def test_a_rebuild_that_fails_half_way_leaves_no_card_to_vouch_for_its_files(
    tmp_path: Path,
) -> None:
    """The card says a dataset folder is complete, and training takes its digest from it:
    a rebuild into the same folder that stops after replacing the train split must not
    leave the earlier card beside it. (The eval split's name taken by a folder stages
    the failure.)"""
    from spanmill.train.data import load_training_data

    store = tmp_path / "store"
    write_store(store, traffic())
    out = tmp_path / "dataset"
    before = build_dataset(str(store), out, spec())["content_hash"]
    assert load_training_data(out).digest == before
    (out / "eval.parquet").unlink()
    (out / "eval.parquet").mkdir()
    with pytest.raises(OSError):
        build_dataset(str(store), out, spec(trusted_producers=("*",)))
    assert answers(out) == {"keyed", "anonymous judge", "injected"}  # the new train split
    assert not (out / "card.json").exists()
    # Without a card, training digests the files it reads: not the earlier dataset's.
    assert load_training_data(out).digest != before
