"""One episode per agent run, whatever the client's instrumentation (spanmill.store.links).

Real instrumentations drive real calls through the gateway (``spanmill gateway``, an
echo model in tritonserver) while the agent's spans go to the collector's OTLP/HTTP
receiver (``spanmill collector``), on the session's tansu broker:

- OpenInference for LangChain (``langchain-openai``'s ``ChatOpenAI``), which puts no
  ``traceparent`` on its requests: the gateway's span is joined by content;
- OpenLLMetry over the ``openai`` SDK, which propagates: joined by context;
- the official GenAI conventions written with the OpenTelemetry SDK around a plain
  HTTP call: joined by content;
- two agents sending the same prompt at the same moment: never a wrong link.

Each agent records its reward on its own ``invoke_agent`` span; an SFT dataset built
from the window has that reward and the gateway's record (model version, response id)
on the same sample.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Tracer
from support_agent_helpers import Stack, served, uninstrument_openai

from spanmill import semconv as sc
from spanmill.contracts import TRAIN_FILE
from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.producers import GATEWAY
from spanmill.serving.repository import write_echo_version
from spanmill.store import SpanStore
from spanmill.store.join import join_calls
from spanmill.store.links import join_health_sql

pytestmark = pytest.mark.services

MODEL = "joined"


@pytest.fixture(scope="module")
def stack(kafka, triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("join-stack")
    write_echo_version(triton.model_repository, MODEL, 1)
    with served(kafka, triton, work, MODEL) as running:
        yield running


def provider_for(stack: Stack, service: str) -> TracerProvider:
    """An agent's own telemetry: OTLP/HTTP to the collector's receiver with its key."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{stack.collector}/v1/traces", headers=stack.otlp_headers)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def agent_run(tracer: Tracer, agent: str, call: Callable[[], Any]) -> tuple[str, Any]:
    """The agent's run: its ``invoke_agent`` span around the call, its reward on it."""
    with tracer.start_as_current_span(
        f"invoke_agent {agent}",
        attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
                    sc.GEN_AI_AGENT_NAME: agent, sc.SPANMILL_TASK_ID: f"task-{uuid.uuid4()}"},
    ) as root:  # fmt: skip
        answer = call()
        root.add_event(
            sc.GEN_AI_EVALUATION_RESULT_EVENT,
            {sc.GEN_AI_EVALUATION_NAME: "resolved", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
             sc.SPANMILL_REWARD_PRIMARY: True},
        )  # fmt: skip
        return f"{root.get_span_context().trace_id:032x}", answer


def gateway_calls(store: SpanStore, question: str) -> list[dict[str, Any]]:
    """The gateway's records of calls that asked ``question``."""
    calls = store.table(llm_calls_only=True, columns=[
        "trace_id", "span_id", "parent_span_id", "episode_id", "input_messages",
        "resource_attributes", "model_version",
    ]).to_pylist()  # fmt: skip
    return [
        c for c in calls
        if question in (c["input_messages"] or "")
        and json.loads(c["resource_attributes"] or "{}").get(sc.SPANMILL_PRODUCER) == GATEWAY
    ]  # fmt: skip


def wait_until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the spans did not reach the store in time"
        time.sleep(0.5)


def wait_for_episode(store: SpanStore, trace_id: str, question: str, spans: int) -> None:
    """The agent's spans (through the receiver) and the gateway's (through Kafka) stored."""
    wait_until(
        lambda: (
            Path(store.url).exists()
            and store.count(trace_id=trace_id) >= spans
            and bool(gateway_calls(store, question))
        )
    )


def sft_sample(stack: Stack, tmp_path: Path, since: int, until: int) -> dict[str, Any]:
    """The window's one SFT sample, built as the pipeline builds it (the builder joins)."""
    out = tmp_path / f"dataset-{uuid.uuid4().hex[:6]}"
    build_dataset(stack.store, out, DatasetSpec(
        mode="sft", since=since, until=until, min_reward=1.0, eval_fraction=0.0,
        feedback_horizon_hours=0.01,
    ))  # fmt: skip
    samples = pq.read_table(out / TRAIN_FILE).to_pylist()
    assert len(samples) == 1, samples
    return samples[0]


def test_openinference_langchain_calls_join_their_episode_by_content(
    stack: Stack, tmp_path: Path
) -> None:
    from langchain_openai import ChatOpenAI
    from openinference.instrumentation.langchain import LangChainInstrumentor

    question = f"What is in box {uuid.uuid4().hex[:8]}?"
    provider = provider_for(stack, "langchain-agent")
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    started = time.time_ns()
    try:
        llm = ChatOpenAI(model=MODEL, base_url=f"{stack.gateway}/v1", api_key=stack.key,
                         temperature=0, max_retries=0)  # fmt: skip
        trace_id, answer = agent_run(
            provider.get_tracer("langchain-agent"), "langchain-agent",
            lambda: llm.invoke([("system", "Answer briefly."), ("user", question)]),
        )  # fmt: skip
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    assert answer.content == question  # the echo model
    store = SpanStore(stack.store)
    wait_for_episode(store, trace_id, question, spans=2)
    [served] = gateway_calls(store, question)
    assert served["parent_span_id"] is None  # no traceparent came with the request
    assert served["trace_id"] != trace_id

    sample = sft_sample(stack, tmp_path, started - 10**9, time.time_ns())
    # The builder joined it: the gateway's record is in the agent's episode, once.
    [served] = gateway_calls(store, question)
    assert served["episode_id"] == trace_id
    assert sample["episode_id"] == trace_id and sample["reward"] == 1.0
    assert sample["model_version"] == "1" and sample["trace_id"] == served["trace_id"]
    assert sample["completion"][-1]["content"] == question
    assert join_calls(store, started - 10**9, time.time_ns()).already >= 1


def test_openllmetry_propagates_its_context_and_joins_by_it(stack: Stack, tmp_path: Path) -> None:
    import openai
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    question = f"Where is parcel {uuid.uuid4().hex[:8]}?"
    provider = provider_for(stack, "openllmetry-agent")
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    started = time.time_ns()
    try:
        client = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key=stack.key, max_retries=0)
        trace_id, _ = agent_run(
            provider.get_tracer("openllmetry-agent"), "openllmetry-agent",
            lambda: client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": question}], temperature=0),
        )  # fmt: skip
    finally:
        uninstrument_openai()
        provider.shutdown()
    store = SpanStore(stack.store)
    wait_for_episode(store, trace_id, question, spans=2)
    [served] = gateway_calls(store, question)
    assert served["trace_id"] == trace_id and served["parent_span_id"] is not None
    sample = sft_sample(stack, tmp_path, started - 10**9, time.time_ns())
    assert sample["episode_id"] == trace_id and sample["reward"] == 1.0
    assert sample["model_version"] == "1"
    health = store.query(f"SELECT * FROM ({join_health_sql()}) WHERE agent = '{MODEL}'")
    assert health.to_pylist()[0]["by_context"] >= 1


def genai_agent(stack: Stack, tracer: Tracer, agent: str, question: str) -> str:
    """An agent that records its call with the GenAI conventions through the OTel SDK
    and calls the gateway with a plain HTTP client (no context propagation)."""
    messages = [{"role": "user", "content": question}]

    def call() -> Any:
        with tracer.start_as_current_span(
            f"chat {MODEL}",
            attributes={
                sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT, sc.GEN_AI_REQUEST_MODEL: MODEL,
                sc.GEN_AI_INPUT_MESSAGES: json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": question}]}]),
            },
        ) as span:  # fmt: skip
            reply = httpx.post(
                f"{stack.gateway}/v1/chat/completions",
                json={"model": MODEL, "messages": messages, "temperature": 0},
                headers={"Authorization": f"Bearer {stack.key}"}, timeout=60,
            )  # fmt: skip
            reply.raise_for_status()
            text = reply.json()["choices"][0]["message"]["content"]
            span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": text}]}]))  # fmt: skip
            return reply

    trace_id, reply = agent_run(tracer, agent, call)
    # The gateway names its span of the call, in the agent's trace where it was sent.
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", reply.headers["traceresponse"])
    return trace_id


@pytest.mark.parametrize("propagate", [False, True], ids=["plain-httpx", "httpx-instrumented"])
def test_genai_conventions_join_by_content_or_by_the_context_httpx_propagates(
    stack: Stack, tmp_path: Path, propagate: bool
) -> None:
    """Without propagation the call joins by content; with the README's step
    (opentelemetry-instrumentation-httpx) the gateway's span is the agent span's child."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    question = f"Which shelf holds book {uuid.uuid4().hex[:8]}?"
    provider = provider_for(stack, "genai-agent")
    if propagate:
        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    started = time.time_ns()
    try:
        trace_id = genai_agent(stack, provider.get_tracer("genai"), "genai-agent", question)
    finally:
        if propagate:
            HTTPXClientInstrumentor().uninstrument()
        provider.shutdown()
    store = SpanStore(stack.store)
    wait_for_episode(store, trace_id, question, spans=3 if propagate else 2)
    [served] = gateway_calls(store, question)
    assert (served["trace_id"] == trace_id) is propagate
    sample = sft_sample(stack, tmp_path, started - 10**9, time.time_ns())
    assert sample["episode_id"] == trace_id and sample["reward"] == 1.0
    assert sample["model_version"] == "1"
    [served] = gateway_calls(store, question)
    assert served["episode_id"] == trace_id


def test_two_agents_sending_the_same_prompt_at_once_are_never_linked_wrongly(
    stack: Stack,
) -> None:
    question = f"Shared question {uuid.uuid4().hex[:8]}"
    providers = [provider_for(stack, f"twin-{i}") for i in range(2)]
    traces: dict[int, str] = {}
    barrier = threading.Barrier(2)
    started = time.time_ns()

    def run(i: int) -> None:
        barrier.wait()
        traces[i] = genai_agent(stack, providers[i].get_tracer("twin"), f"twin-{i}", question)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for provider in providers:
        provider.shutdown()
    assert len(traces) == 2
    store = SpanStore(stack.store)
    wait_until(lambda: len(gateway_calls(store, question)) == 2
               and all(store.count(trace_id=t) >= 2 for t in traces.values()))  # fmt: skip
    report = join_calls(store, started - 10**9, time.time_ns())
    served = gateway_calls(store, question)
    linked = {c["trace_id"]: c["episode_id"] for c in served if c["episode_id"] != c["trace_id"]}
    # Both answered at once: each is left alone (ambiguous), or linked to one agent each.
    assert report.ambiguous + len(linked) == 2
    assert len(set(linked.values())) == len(linked)
    assert set(linked.values()) <= set(traces.values())
