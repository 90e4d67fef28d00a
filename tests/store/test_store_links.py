"""Joining a gateway call that came without its caller's trace context to the agent's
own span of the call, by content and time (spanmill.store.links), on a real store."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spanmill import semconv as sc
from spanmill.contracts import TRAIN_FILE
from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.producers import GATEWAY
from spanmill.spans import Span, SpanEvent
from spanmill.store import BatchId, SpanStore, StoreWriter
from spanmill.store.join import join_calls
from spanmill.store.links import call_digest, join_health_sql, write_links
from spanmill.store.rows import HourlyColumns, SpanParts

T0 = 1_750_000_000_000_000_000
MS = 1_000_000
QUESTION = [
    {"role": "system", "parts": [{"type": "text", "content": "You add numbers."}]},
    {"role": "user", "parts": [{"type": "text", "content": "What is 2+2?"}]},
]
ANSWER = [{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}]


def hex_id(size: int) -> str:
    return os.urandom(size).hex()


def agent_run(
    agent: str, start: int, *, question: Any = QUESTION, reward: float = 1.0
) -> list[Span]:
    """An agent's episode as a non-propagating instrumentation records it: its own span
    of the call (translated to the GenAI conventions) under its run, with a reward."""
    trace, root = hex_id(16), hex_id(8)
    return [
        Span(
            trace_id=trace, span_id=root, name=f"invoke_agent {agent}",
            start_time_unix_nano=start, end_time_unix_nano=start + 200 * MS,
            attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
                        sc.GEN_AI_AGENT_NAME: agent, sc.SPANMILL_TASK_ID: f"task-{agent}"},
            resource_attributes={sc.SERVICE_NAME: agent, sc.SPANMILL_PRODUCER: agent},
            events=(SpanEvent(name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=start,
                              attributes={sc.GEN_AI_EVALUATION_NAME: "resolved",
                                          sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                                          sc.SPANMILL_REWARD_PRIMARY: True}),),
        ),
        Span(
            trace_id=trace, span_id=hex_id(8), parent_span_id=root, name="ChatOpenAI",
            start_time_unix_nano=start + 10 * MS, end_time_unix_nano=start + 150 * MS,
            attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
                        sc.GEN_AI_REQUEST_MODEL: "calc",
                        sc.GEN_AI_INPUT_MESSAGES: json.dumps(question),
                        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(ANSWER)},
            resource_attributes={sc.SERVICE_NAME: agent, sc.SPANMILL_PRODUCER: agent},
        ),
    ]  # fmt: skip


def gateway_call(start: int, *, question: Any = QUESTION, parent: str | None = None) -> Span:
    """The gateway's record of a call: its own trace, unless the caller sent one."""
    # Spelled differently, same content: whitespace around the text.
    served = [
        {**m, "parts": [{**p, "content": f" {p['content']}\n"} for p in m["parts"]]}
        for m in question
    ]
    return Span(
        trace_id=hex_id(16), span_id=hex_id(8), parent_span_id=parent, name="chat calc",
        start_time_unix_nano=start, end_time_unix_nano=start + 100 * MS,
        attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
                    sc.GEN_AI_REQUEST_MODEL: "calc", sc.SPANMILL_MODEL_VERSION: "3",
                    sc.GEN_AI_RESPONSE_ID: f"chatcmpl-{hex_id(6)}",
                    sc.GEN_AI_INPUT_MESSAGES: json.dumps(served),
                    sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(
                        [{**ANSWER[0], "finish_reason": "stop"}]),
                    sc.SPANMILL_COMPLETION_TOKEN_IDS: [19, 20, 2]},
        resource_attributes={sc.SERVICE_NAME: "spanmill-gateway", sc.SPANMILL_PRODUCER: GATEWAY},
    )  # fmt: skip


def write(store_dir: Path, spans: list[Span], batch: int = 0) -> SpanStore:
    hourly = HourlyColumns()
    for i, span in enumerate(spans):
        hourly.append(SpanParts.from_span(span), "t", 0, batch * 1000 + i, 0, 1)
    first, last = batch * 1000, batch * 1000 + len(spans) - 1
    StoreWriter(str(store_dir)).write_batch(
        BatchId("t", 0, first, last, f"{batch:016x}"), hourly.tables()
    )
    return SpanStore(str(store_dir))


def episode_of(store: SpanStore, span: Span) -> str:
    rows = store.table(trace_id=span.trace_id, columns=["span_id", "episode_id"]).to_pylist()
    return next(r["episode_id"] for r in rows if r["span_id"] == span.span_id)


def test_a_call_without_context_joins_the_agent_episode_it_came_from(tmp_path: Path) -> None:
    run = agent_run("support", T0)
    served = gateway_call(T0 + 20 * MS)
    store = write(tmp_path, [*run, served])
    assert episode_of(store, served) == served.trace_id  # two episodes before the join

    report = join_calls(store, T0 - 10**9, T0 + 10**9)
    assert (report.linked, report.ambiguous, report.unmatched) == (1, 0, 0)
    # Every reader sees one episode: the table, SQL, and the agent's span of the call
    # now carries the gateway's response id, so that the two read as one call.
    assert episode_of(store, served) == run[0].trace_id
    episode = store.table(episode_id=run[0].trace_id, columns=["span_id", "response_id"])
    assert served.span_id in episode["span_id"].to_pylist()
    by_span = dict(
        zip(episode["span_id"].to_pylist(), episode["response_id"].to_pylist(), strict=True)
    )
    assert by_span[run[1].span_id] == served.attributes[sc.GEN_AI_RESPONSE_ID]
    sql = store.query(
        "SELECT count(*) AS n FROM spans WHERE episode_id = ?", params=[run[0].trace_id]
    ).to_pylist()
    assert sql == [{"n": 3}]
    # The gateway span keeps its own ids.
    assert store.count(trace_id=served.trace_id) == 1

    again = join_calls(store, T0 - 10**9, T0 + 10**9)
    assert (again.linked, again.already, again.path) == (0, 1, None)

    # The dataset has one sample: the gateway's record (model version, response id)
    # with the agent's reward.
    out = build_dataset(
        str(tmp_path), tmp_path / "dataset",
        DatasetSpec(mode="sft", min_reward=1.0, eval_fraction=0.0, trusted_producers=("*",)),
    )  # fmt: skip
    assert out["counts"]
    sample = pq.read_table(tmp_path / "dataset" / TRAIN_FILE).to_pylist()
    assert len(sample) == 1
    assert sample[0]["reward"] == 1.0 and sample[0]["model_version"] == "3"
    assert sample[0]["episode_id"] == run[0].trace_id


def test_two_identical_prompts_at_the_same_moment_are_left_alone(tmp_path: Path) -> None:
    first, second = agent_run("alpha", T0), agent_run("beta", T0 + 5 * MS)
    calls = [gateway_call(T0 + 20 * MS), gateway_call(T0 + 25 * MS)]
    store = write(tmp_path, [*first, *second, *calls])
    report = join_calls(store, T0 - 10**9, T0 + 10**9)
    assert (report.linked, report.ambiguous) == (0, 2)
    assert store.links().num_rows == 0
    assert [episode_of(store, c) for c in calls] == [c.trace_id for c in calls]


def test_only_a_call_inside_the_agent_span_with_the_same_content_is_linked(tmp_path: Path) -> None:
    run = agent_run("support", T0)
    other = [{"role": "user", "parts": [{"type": "text", "content": "What is 3+3?"}]}]
    late = gateway_call(T0 + 5 * 10**9)  # after the agent's span ended, past any clock skew
    different = gateway_call(T0 + 20 * MS, question=other)
    propagated = gateway_call(T0 + 30 * MS, parent=run[1].span_id)
    store = write(tmp_path, [*run, late, different, propagated])
    report = join_calls(store, T0 - 10**9, T0 + 10 * 10**9)
    assert (report.linked, report.unmatched) == (0, 2)
    health = store.query(
        f"SELECT agent, gateway_calls, by_context, by_content, alone FROM ({join_health_sql()})"
    ).to_pylist()
    assert health == [
        {"agent": "calc", "gateway_calls": 3, "by_context": 1, "by_content": 0, "alone": 2}
    ]


def tool_call(call_id: str, arguments: object) -> list[dict[str, object]]:
    part = {"type": "tool_call", "id": call_id, "name": "add", "arguments": arguments}
    return [{"role": "assistant", "parts": [part]}]


def test_the_digest_reads_content_not_spelling() -> None:
    call = tool_call("call_1", '{"a": 1, "b": 2}')
    same = tool_call("x9", {"b": 2, "a": 1})
    other = tool_call("call_1", {"a": 1, "b": 3})
    question = json.dumps(QUESTION)
    without_system = json.dumps(QUESTION[1:])
    digest = call_digest("calc", question, json.dumps(call))
    assert digest is not None
    assert call_digest("calc", without_system, json.dumps(same)) == digest
    assert call_digest("calc", question, json.dumps(other)) != digest
    assert call_digest("other", question, json.dumps(call)) != digest
    assert call_digest("calc", question, None) is None
    assert call_digest("calc", "not json", json.dumps(call)) is None


def test_links_written_twice_for_one_call_count_once(tmp_path: Path) -> None:
    run = agent_run("support", T0)
    served = gateway_call(T0 + 20 * MS)
    store = write(tmp_path, [*run, served])
    row = {"trace_id": served.trace_id, "episode_id": run[0].trace_id, "span_id": served.span_id,
           "client_trace_id": run[1].trace_id, "client_span_id": run[1].span_id,
           "response_id": "r"}  # fmt: skip
    for _ in range(3):  # as passes running at once may
        write_links(store.fs, store.root, [row])
    assert store.links().num_rows == 1
    assert store.count(episode_id=run[0].trace_id) == 3
    assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 3}]


def test_an_agent_span_that_kept_the_response_id_is_joined_by_it(tmp_path: Path) -> None:
    """Two identical prompts at once, each agent span holding the response id its client
    received (as LangChain's result carries it): each call joins its own agent."""
    first, second = agent_run("alpha", T0), agent_run("beta", T0 + 5 * MS)
    calls = [gateway_call(T0 + 20 * MS), gateway_call(T0 + 25 * MS)]
    for run, call in ((first, calls[1]), (second, calls[0])):  # crossed: time cannot tell
        run[1].attributes[sc.GEN_AI_RESPONSE_ID] = call.attributes[sc.GEN_AI_RESPONSE_ID]
    store = write(tmp_path, [*first, *second, *calls])
    report = join_calls(store, T0 - 10**9, T0 + 10**9)
    assert (report.linked, report.by_response_id, report.ambiguous) == (2, 2, 0)
    assert episode_of(store, calls[1]) == first[0].trace_id
    assert episode_of(store, calls[0]) == second[0].trace_id


def test_the_join_and_its_health_from_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spanmill.cli.main import app

    run, propagated = agent_run("support", T0), agent_run("other", T0)
    calls = [gateway_call(T0 + 20 * MS), gateway_call(T0 + 30 * MS, parent=propagated[1].span_id)]
    write(tmp_path, [*run, *propagated, *calls])
    runner = CliRunner()
    joined = runner.invoke(app, ["store", "join", "--store", str(tmp_path), "--since", ""])
    assert joined.exit_code == 0, joined.output
    # The propagated call is no orphan; both agents' spans of that content enclose the
    # other call: it is ambiguous, and left alone.
    assert "0 new, 0 before; 1 ambiguous and 0 unmatched" in joined.output
    stats = runner.invoke(
        app, ["spans", "stats", "--store", str(tmp_path), "--since", ""], env={"COLUMNS": "200"}
    )
    assert stats.exit_code == 0, stats.output
    lines = stats.output.splitlines()
    title = next(i for i, line in enumerate(lines) if "joined to their agents' episodes" in line)
    row = next(line for line in lines[title:] if line.strip().startswith("spanmill-gateway"))
    cells = [cell.strip() for cell in row.split("│")]
    assert cells == ["spanmill-gateway", "calc", "2", "1", "0", "1"]  # context, content, alone


def test_erasing_an_agents_run_erases_the_gateways_joined_record_of_it(tmp_path: Path) -> None:
    """The gateway's span of a joined call holds the same prompt: an erasure of the
    agent's trace takes it too, from reads at once and from the files at compaction."""
    from spanmill.store.compact import request_erasure

    run = agent_run("support", T0)
    served = gateway_call(T0 + 20 * MS)
    store = write(tmp_path, [*run, served])
    assert join_calls(store, T0 - 10**9, T0 + 10**9).linked == 1
    erasure = request_erasure(str(tmp_path), None, "trace_id", run[0].trace_id, requested_by="test")
    assert served.trace_id in erasure.trace_ids
    assert store.count(trace_id=served.trace_id) == 0
    assert store.query("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 0}]


def test_compaction_merges_the_links_files_and_expires_old_links(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from spanmill.store.compact import Compactor
    from spanmill.store.policy import StorePolicy

    store = write(tmp_path, agent_run("support", T0))
    now = datetime.now(UTC)

    def link(n: int, at: datetime) -> dict[str, object]:
        return {"trace_id": f"gw-{n}", "episode_id": f"ep-{n}", "span_id": f"s-{n}",
                "client_trace_id": f"ct-{n}", "client_span_id": f"cs-{n}",
                "response_id": None, "linked_at": at}  # fmt: skip

    for n in range(3):  # three join passes
        write_links(store.fs, store.root, [link(n, now)], stamp=False)
    write_links(store.fs, store.root, [link(9, now - timedelta(days=40))], stamp=False)
    report = Compactor(str(tmp_path), policy=StorePolicy(retention_days=30)).run()
    assert report.link_files_merged == 4
    assert len(list((tmp_path / "_links").glob("*.parquet"))) == 1
    assert sorted(store.links()["trace_id"].to_pylist()) == ["gw-0", "gw-1", "gw-2"]
    assert Compactor(str(tmp_path)).run().link_files_merged == 0  # one file: left as it is


def test_an_erasure_before_any_join_takes_the_gateways_record_of_the_call(
    tmp_path: Path,
) -> None:
    """A join reads no erased trace: a request made before the join pass linked the
    gateway's record of the call left that record, the subject's prompt and the token
    ids datasets train on, readable for good."""
    from spanmill.store.compact import Compactor, request_erasure

    run = agent_run("support", T0)
    served = gateway_call(T0 + 20 * MS)
    other = gateway_call(
        T0 + 30 * MS, question=[{"role": "user", "parts": [{"type": "text", "content": "Hi?"}]}]
    )
    store = write(tmp_path, [*run, served, other])
    erasure = request_erasure(str(tmp_path), None, "trace_id", run[0].trace_id, requested_by="test")
    assert served.trace_id in erasure.trace_ids and other.trace_id not in erasure.trace_ids
    assert join_calls(store, T0 - 10**9, T0 + 10**9).linked == 0  # nothing left to join
    Compactor(str(tmp_path), settle_s=0).run()
    assert {s.trace_id for s in SpanStore(str(tmp_path)).spans()} == {other.trace_id}
