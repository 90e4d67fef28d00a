"""The support agent, which knows nothing of spanmill, against the real local stack.

SmolLM2-135M-Instruct in tritonserver, the gateway and the collector run as the
processes ``spanmill up`` starts (``spanmill gateway``, ``spanmill collector``
with its OTLP/HTTP receiver), on the session's tansu broker. The agent's own
spans (OpenLLMetry and its ``invoke_agent`` span) reach the store through the
receiver; the gateway's LLM spans, with token ids, through Kafka; all of an
episode's spans share one trace.

A measurement lives here too (no assertion on the figures, so ``make test`` leaves
it out; ``pytest -m measure -s`` runs it): tool-call and resolved rates over 20
episodes at temperature 0 and 0.8, with the model's raw replies.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support_agent_helpers import Stack, served, uninstrument_openai

from spanmill import semconv as sc
from spanmill.serving.repository import write_python_version
from spanmill.spans import Span
from spanmill.store import SpanStore

# isort: split
from support_agent import agent, simulate

pytestmark = pytest.mark.services

MODEL = "support"
EPISODES = 4


@pytest.fixture(scope="module")
def stack(
    kafka, triton, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("support-stack")
    write_python_version(triton.model_repository, MODEL, 1, smollm2_dir, num_threads=1)
    with served(kafka, triton, work, MODEL) as running:
        yield running


@pytest.fixture
def telemetry(stack: Stack) -> Iterator[agent.TracerProvider]:
    """OpenLLMetry exporting to the collector's receiver, as OTEL_EXPORTER_OTLP_ENDPOINT would."""
    provider = agent.setup_telemetry(stack.collector, set_global=False, headers=stack.otlp_headers)
    try:
        yield provider
    finally:
        provider.shutdown()
        uninstrument_openai()


def run_episodes(
    stack: Stack, provider: agent.TracerProvider, n: int, temperature: float = 0.0, offset: int = 0
) -> list[simulate.Outcome]:
    questions = simulate.load_questions()
    outcomes = simulate.simulate(
        agent.make_client(f"{stack.gateway}/v1", stack.key),
        MODEL,
        [questions[(offset + i) % len(questions)] for i in range(n)],
        faq=agent.FAQ.load(),
        tracer=provider.get_tracer("support-agent-test"),
        temperature=temperature,
    )
    assert provider.force_flush()
    return outcomes


def wait_for_traces(
    store: str, check: Callable[[dict[str, list[Span]]], bool], timeout: float = 90.0
) -> dict[str, list[Span]]:
    deadline = time.monotonic() + timeout
    while True:
        by_trace: dict[str, list[Span]] = defaultdict(list)
        if Path(store).exists():
            for span in SpanStore(store).spans():
                by_trace[span.trace_id].append(span)
        if check(by_trace) or time.monotonic() > deadline:
            return by_trace
        time.sleep(0.5)


def test_episodes_land_in_the_store_in_one_trace(stack: Stack, telemetry) -> None:  # type: ignore[no-untyped-def]
    outcomes = run_episodes(stack, telemetry, EPISODES)
    episodes = [o.episode for o in outcomes]
    assert all(e.error is None for e in episodes), [e.error for e in episodes]
    print(f"\nsupport agent, {EPISODES} episodes:", simulate.rates(outcomes))
    for outcome in outcomes:
        print(simulate.describe(outcome, raw=True))

    def complete(by_trace: dict[str, list[Span]]) -> bool:
        return all(
            sum(s.service_name == "spanmill-gateway" for s in by_trace[e.trace_id])
            >= len(e.response_ids)
            and sum(s.service_name == agent.SERVICE_NAME for s in by_trace[e.trace_id])
            >= 1 + len(e.response_ids)
            for e in episodes
        )

    by_trace = wait_for_traces(stack.store, complete)
    for episode in episodes:
        spans = by_trace[episode.trace_id]
        names = sorted((s.service_name or "", s.name) for s in spans)
        client = [s for s in spans if s.service_name == agent.SERVICE_NAME]
        served = [s for s in spans if s.service_name == "spanmill-gateway"]
        roots = [s for s in client if s.operation_name == sc.OPERATION_INVOKE_AGENT]
        assert len(roots) == 1, names
        assert roots[0].agent_name == "support" and roots[0].parent_span_id is None
        # OpenLLMetry's spans, translated at the edge: one LLM call per completion.
        calls = [s for s in client if s.is_llm_call]
        assert len(calls) == len(episode.response_ids), names
        assert {s.parent_span_id for s in calls} == {roots[0].span_id}
        assert {s.response_id for s in calls} == set(episode.response_ids)
        # The gateway's spans: children of the client's, with what training needs.
        assert sorted(s.response_id or "" for s in served) == sorted(episode.response_ids)
        assert {s.parent_span_id for s in served} <= {s.span_id for s in calls}
        for span in served:
            assert span.is_llm_call and span.model == MODEL and span.model_version == "1"
            assert span.prompt_token_ids and span.completion_token_ids
            assert len(span.completion_logprobs or []) == len(span.completion_token_ids)


def test_late_feedback_joins_the_episodes(stack: Stack, telemetry) -> None:  # type: ignore[no-untyped-def]
    outcomes = run_episodes(stack, telemetry, 3, offset=EPISODES)
    episodes = [o.episode for o in outcomes]
    assert all(e.error is None and e.last_response_id for e in episodes)
    # Every episode is over before any feedback is sent, as with real customers.
    items = simulate.feedback_items(outcomes[:2]) + simulate.feedback_items(
        outcomes[2:], by="trace_id"
    )
    reply = agent.send_feedback(items, url=stack.gateway, api_key=stack.key)
    assert reply.status_code < 300, reply.text

    def feedback_of(spans: list[Span]) -> list[Span]:
        return [s for s in spans if s.scope_name == sc.FEEDBACK_SCOPE]

    by_trace = wait_for_traces(
        stack.store, lambda t: all(feedback_of(t[e.trace_id]) for e in episodes)
    )
    for outcome, item in zip(outcomes, items, strict=True):
        spans = feedback_of(by_trace[outcome.episode.trace_id])
        assert len(spans) == 1, f"feedback for {item} in trace {outcome.episode.trace_id}"
        rewards = spans[0].rewards
        assert [(r.name, r.value) for r in rewards] == [("resolved", float(outcome.resolved))]
        if "response_id" in item:
            assert rewards[0].response_id == outcome.episode.last_response_id


@pytest.mark.slow
@pytest.mark.measure
def test_measure_tool_call_and_resolved_rates(stack: Stack, telemetry) -> None:  # type: ignore[no-untyped-def]
    n = int(os.environ.get("SUPPORT_AGENT_EPISODES", "20"))
    for temperature in (0.0, 0.8):
        started = time.monotonic()
        outcomes = run_episodes(stack, telemetry, n, temperature=temperature)
        took = time.monotonic() - started
        print(f"\n== temperature {temperature}: {simulate.rates(outcomes)} in {took:.0f}s")
        for outcome in outcomes:
            print(simulate.describe(outcome, raw=True))
        assert all(o.episode.error is None for o in outcomes)
