"""The support agent example: it knows nothing of spanmill, its tool, its loop, its spans.

No service here: the model is a fake OpenAI endpoint behind an httpx transport.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support_agent_helpers import AGENT_DIR, uninstrument_openai

# isort: split
from support_agent import agent, simulate


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_imports_nothing_from_spanmill() -> None:
    files = sorted(AGENT_DIR.rglob("*.py"))
    assert {f.name for f in files} >= {"agent.py", "simulate.py"}
    offending = {
        f"{path.name}: {name}"
        for path in files
        for name in _imported_modules(path)
        if name == "spanmill" or name.startswith("spanmill.")
    }
    assert not offending
    requirements = (AGENT_DIR / "requirements.txt").read_text()
    assert "spanmill" not in requirements


def test_every_question_has_its_entry_among_the_search_results() -> None:
    faq = agent.FAQ.load()
    questions = simulate.load_questions()
    assert 15 <= len(faq.entries) <= 25
    # Every entry is asked about, twice, except the one the worked example shows.
    asked = {q.faq_id for q in questions}
    assert {e.id for e in faq.entries} - asked == {"change-email"}
    assert len(questions) == 2 * len(asked) == len({q.id for q in questions})
    for question in questions:
        found = [entry.id for entry in faq.search(question.question)]
        assert question.faq_id in found, (question, found)
    # The key fact is in the entry's answer, so copying the search result resolves.
    assert all(e.key_fact in e.answer for e in faq.entries)


def test_tool_errors_are_readable_by_the_model() -> None:
    faq = agent.FAQ.load()
    assert "[export]" in agent.run_tool(faq, "search_faq", '{"query": "export my notes"}')
    assert "no tool named" in agent.run_tool(faq, "calculator", "{}")
    assert "not JSON" in agent.run_tool(faq, "search_faq", "{query")
    assert "needs a" in agent.run_tool(faq, "search_faq", '{"q": "x"}')
    assert "No FAQ entry" in agent.run_tool(faq, "search_faq", '{"query": "zebra"}')


def test_judge_and_feedback_items() -> None:
    assert simulate.judge("Refunds are possible within  30 DAYS of purchase.", "30 days")
    assert not simulate.judge("Refunds are possible within a month.", "30 days")
    assert agent.feedback(1, response_id="chatcmpl-1") == {
        "response_id": "chatcmpl-1", "name": "resolved", "value": 1, "source": "user",
    }  # fmt: skip
    by_trace = agent.feedback(0, trace_id="ab" * 16, comment="wrong plan")
    assert by_trace["trace_id"] == "ab" * 16 and by_trace["comment"] == "wrong plan"
    with pytest.raises(ValueError):
        agent.feedback(1)
    with pytest.raises(ValueError):
        agent.feedback(1, response_id="x", trace_id="y")
    assert agent.feedback_base_url("http://gw:8080/v1/") == "http://gw:8080"


def _completion(number: int, message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": 0,
        "model": "support",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def test_episode_loop_and_its_spans() -> None:
    requests: list[httpx.Request] = []
    call = {"id": "call_1", "type": "function",
            "function": {"name": "search_faq", "arguments": '{"query": "refund"}'}}  # fmt: skip
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "Annual plans: within 30 days of purchase."},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json=_completion(len(requests), replies[len(requests) - 1]))

    client = openai.OpenAI(
        base_url="http://gateway.test/v1",
        api_key="k",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    exporter = InMemorySpanExporter()
    provider = agent.setup_telemetry(set_global=False, exporter=exporter)
    try:
        episode = agent.run_episode(
            client, "support", "Can I get a refund?", faq=agent.FAQ.load(),
            tracer=provider.get_tracer("test"),
        )  # fmt: skip
        provider.force_flush()
    finally:
        uninstrument_openai()
        provider.shutdown()

    assert episode.error is None
    assert episode.answer == "Annual plans: within 30 days of purchase."
    assert episode.response_ids == ["chatcmpl-1", "chatcmpl-2"]
    assert episode.last_response_id == "chatcmpl-2"
    assert [c["name"] for c in episode.tool_calls] == ["search_faq"]
    assert episode.tool_calls[0]["result"].startswith("[refund]")

    bodies = [json.loads(r.content) for r in requests]
    assert all(b["tools"] == agent.TOOLS and b["temperature"] == 0.0 for b in bodies)
    # The worked example goes first, as real chat turns, then the customer's question.
    example = agent.worked_example(agent.FAQ.load())
    first = bodies[0]["messages"]
    assert first[1:-1] == example and first[-1] == {
        "role": "user",
        "content": "Can I get a refund?",
    }
    assert example[2]["content"].startswith("[change-email]")
    # Marked as OpenAI's guides mark few-shot turns (a tool message has no name).
    names = [m.get("name") for m in example]
    assert names == ["example_user", "example_assistant", None, "example_assistant"]
    second = bodies[1]["messages"]
    assert second[: len(first)] == first
    assert [m["role"] for m in second[len(first) :]] == ["assistant", "tool"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "search_faq"
    assert second[-1]["tool_call_id"] == "call_1" and "30 days" in second[-1]["content"]
    assert all(b["stop"] == ["\n"] for b in bodies)
    # OpenLLMetry puts the episode's trace on the wire, so the gateway joins it.
    assert {r.headers["traceparent"].split("-")[1] for r in requests} == {episode.trace_id}

    spans = exporter.get_finished_spans()
    root = [s for s in spans if s.name == "invoke_agent support"]
    chats = [s for s in spans if s is not root[0]] if root else []
    assert len(root) == 1 and len(chats) == 2
    assert root[0].attributes is not None
    assert root[0].attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root[0].attributes["gen_ai.agent.name"] == "support"
    assert {format(s.context.trace_id, "032x") for s in spans} == {episode.trace_id}
    assert all(s.parent is not None and s.parent.span_id == root[0].context.span_id for s in chats)
    assert root[0].resource.attributes["service.name"] == "support-agent"


def test_api_errors_end_the_episode_without_raising() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad temperature"}})

    client = openai.OpenAI(
        base_url="http://gateway.test/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    episode = agent.run_episode(client, "support", "Hi?", faq=agent.FAQ.load())
    assert episode.error is not None and "bad temperature" in episode.error
    assert episode.answer == "" and episode.response_ids == []


def test_instrumented_once_and_again_after_a_full_uninstrument() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["traceparent"])
        return httpx.Response(200, json=_completion(1, {"role": "assistant", "content": "Hi."}))

    client = openai.OpenAI(
        base_url="http://gateway.test/v1",
        api_key="k",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    for _ in range(2):
        exporter = InMemorySpanExporter()
        provider = agent.setup_telemetry(set_global=False, exporter=exporter)
        try:
            with pytest.raises(RuntimeError, match="already instrumented"):
                agent.setup_telemetry(set_global=False, exporter=exporter)
            agent.run_episode(
                client, "support", "Hi?", faq=agent.FAQ.load(), tracer=provider.get_tracer("t")
            )
            provider.force_flush()
        finally:
            uninstrument_openai()
            provider.shutdown()
        (chat,) = [s for s in exporter.get_finished_spans() if s.name == "openai.chat"]
        # The gateway is told the span that is exported, not one of a stale wrapper.
        assert seen[-1].split("-")[2] == format(chat.context.span_id, "016x")


def test_late_feedback_items_and_rates() -> None:
    question = simulate.Question("q01", "pricing", "How much is Pro?")
    called = agent.Episode("How much is Pro?", "It costs $6 per month.", "a" * 32, ["r1", "r2"])
    called.tool_calls.append({"name": "search_faq", "arguments": "{}", "result": "[pricing] ..."})
    silent = agent.Episode("How much is Pro?", "It is free.", "b" * 32, ["r3"])
    failed = agent.Episode("How much is Pro?", "", "c" * 32, [], error="APIError: down")
    outcomes = [
        simulate.Outcome(question, "$6 per month", episode, simulate.judge(episode.answer, key))
        for episode, key in ((called, "$6 per month"), (silent, "$6 per month"), (failed, "x"))
    ]
    assert [o.resolved for o in outcomes] == [True, False, False]
    # By response id: the last completion of each episode that got one.
    assert [(i["response_id"], i["value"]) for i in simulate.feedback_items(outcomes)] == [
        ("r2", 1), ("r3", 0),
    ]  # fmt: skip
    by_trace = simulate.feedback_items(outcomes, by="trace_id")
    assert [i["trace_id"][0] for i in by_trace] == ["a", "b", "c"]
    assert all(i["name"] == "resolved" and i["source"] == "user" for i in by_trace)
    rates = simulate.rates(outcomes)
    assert (
        rates["tool_call_rate"] == rates["search_call_rate"] == rates["found_entry_rate"] == 1 / 3
    )
    assert rates["resolved_rate"] == 1 / 3 and rates["errors"] == 1
