"""The runner against a real HTTP server speaking the OpenAI chat API, with a scripted policy.

The policy answers the calculator protocol correctly for every other instance
(alternating the JSON-content and the ``tool_calls`` forms) and writes prose for
the rest, so the expected success rate is known exactly.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from spanmill_examples.calculator import tool_call_content
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from spanmill import sdk
from spanmill import semconv as sc
from spanmill.config import KafkaSettings
from spanmill.spans import Span, detect_and_decode
from spanmill.stack.ports import free_port
from spanmill.tasks import TaskInstance, get_task
from spanmill.tasks.runner import AgentRunError, run_agent

TASK = get_task("calculator")
SEED = 7


@dataclass
class Policy:
    """A scripted model: knows each question's instance, and which ones to get right."""

    instances: dict[str, TaskInstance] = field(default_factory=dict)
    good: set[str] = field(default_factory=set)
    native: set[str] = field(default_factory=set)
    failing: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=itertools.count)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def learn(self, instances: list[TaskInstance]) -> None:
        for index, instance in enumerate(instances):
            self.instances[instance.question] = instance
            if index % 2 == 0:
                self.good.add(instance.id)
                if index % 4 == 0:
                    self.native.add(instance.id)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        real = [m for m in body["messages"] if sc.SPANMILL_MESSAGE_EXAMPLE not in m]
        question = next(m["content"] for m in real if m["role"] == "user")
        instance = self.instances[question]
        message: dict[str, Any] = {"role": "assistant"}
        if instance.id not in self.good:
            message["content"] = f"Let me think. The answer might be {instance.answer} or so."
        elif real[-1]["role"] == "tool":
            message["content"] = f"The answer is {real[-1]['content']}."
        elif instance.id in self.native:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:8]}",
                    "type": "function",
                    "function": {
                        "name": "calculator",
                        "arguments": f'{{"expression": "{instance.data["expression"]}"}}',
                    },
                }
            ]
        else:
            message["content"] = tool_call_content(instance.data["expression"])
        with self.lock:
            number = next(self.ids)
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
        }


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Policy]]:
    policy = Policy()

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        with policy.lock:
            policy.requests.append({"headers": dict(request.headers), "body": body})
        if policy.failing:
            return JSONResponse({"error": {"message": "backend down"}}, status_code=503)
        return JSONResponse(policy.reply(body))

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    port = free_port()
    uv = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert time.monotonic() < deadline, "the scripted server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1", policy
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def policy(server: tuple[str, Policy]) -> Policy:
    _, scripted = server
    scripted.requests.clear()
    scripted.failing = False
    return scripted


def consume_spans(
    bootstrap_servers: str, topic: str, roots: int, timeout_s: float = 60
) -> list[Span]:
    """Spans of ``topic`` until ``roots`` episode spans have arrived."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap_servers,
        group_id=f"test-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    spans: list[Span] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for record in batch:
                    content_type = dict(record.headers)[sc.CONTENT_TYPE_HEADER].decode()
                    decoded = detect_and_decode(record.value, content_type)
                    assert {span.trace_id.encode() for span in decoded} == {record.key}
                    spans.extend(decoded)
            done = [s for s in spans if s.operation_name == sc.OPERATION_INVOKE_AGENT]
            if len(done) >= roots:
                break
    finally:
        consumer.close()
    return spans


@pytest.mark.services
def test_the_report_matches_the_policy_and_the_episodes_reach_kafka(
    server: tuple[str, Policy], policy: Policy, kafka: Any
) -> None:
    base_url, _ = server
    n = 8
    instances = TASK.instances("heldout", n, seed=SEED)
    policy.learn(instances)
    topic = kafka.create_topic(f"t-{uuid.uuid4().hex}", 3)
    exporter = sdk.KafkaSpanExporter(
        KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=topic)
    )
    sdk.configure("calculator-agent", exporter=exporter, set_global=False)
    progress: list[tuple[int, int]] = []
    try:
        report = run_agent(
            "calculator",
            n,
            base_url,
            "calculator",
            split="heldout",
            seed=SEED,
            concurrency=2,
            progress=lambda done, total, result: progress.append((done, total)),
        )
    finally:
        sdk.shutdown()

    assert report.n == n and report.errors == 0
    assert report.success_rate == 0.5
    assert report.valid_call_rate == 0.5
    assert report.mean_reward == 0.5
    # Good episodes take two calls of 10 completion tokens, prose episodes one.
    assert report.mean_completion_tokens == 15.0
    assert sorted(progress) == [(i, n) for i in range(1, n + 1)]
    assert [e.instance for e in report.episodes] == instances
    for result in report.episodes:
        expected = 1.0 if result.instance.id in policy.good else 0.0
        assert result.score("success") == expected, result.verdict

    # Every request carried its episode's trace context and the prompt's identity.
    by_episode = {e.episode_id: e for e in report.episodes}
    for request in policy.requests:
        metadata = request["body"]["metadata"]
        result = by_episode[metadata[sc.SPANMILL_EPISODE_ID]]
        assert metadata[sc.SPANMILL_TASK_ID] == result.instance.id
        assert metadata[sc.SPANMILL_PROMPT_NAME] == "calculator.zero_shot"
        assert metadata[sc.SPANMILL_PROMPT_VERSION] == TASK.prompt_version
        assert request["headers"]["traceparent"].split("-")[1] == result.trace_id
        assert request["body"]["tools"][0]["function"]["name"] == "calculator"

    spans = consume_spans(kafka.bootstrap_servers, topic, roots=n)
    roots = {s.trace_id: s for s in spans if s.operation_name == sc.OPERATION_INVOKE_AGENT}
    assert len(roots) == n
    for result in report.episodes:
        root = roots[result.trace_id]
        assert root.task_id == result.instance.id
        assert root.episode_id == result.episode_id
        assert root.agent_name == "calculator"
        rewards = {reward.name: reward for reward in root.rewards}
        assert rewards["success"].primary
        assert rewards["success"].value == result.score("success")
        assert rewards["success"].response_id is None  # judges the whole episode
        assert rewards["valid_call"].value == result.score("valid_call")
        assert rewards["valid_call"].response_id == result.response_ids[0]  # judges turn 1
        tools = [
            s
            for s in spans
            if s.trace_id == result.trace_id and s.operation_name == sc.OPERATION_EXECUTE_TOOL
        ]
        if result.instance.id in policy.good:
            (tool,) = tools
            assert tool.parent_span_id == root.span_id
            assert tool.attributes["gen_ai.tool.call.result"] == result.instance.answer
        else:
            assert tools == []


def test_few_shot_requests_mark_their_example_turns(
    server: tuple[str, Policy], policy: Policy
) -> None:
    base_url, _ = server
    instances = TASK.instances("train", 2, seed=SEED)
    policy.learn(instances)
    memory = InMemorySpanExporter()
    sdk.configure("calculator-agent", exporter=memory, set_global=False)
    try:
        report = run_agent(
            TASK, 2, base_url, "calculator", split="train", prompt_style="few_shot", seed=SEED
        )
    finally:
        sdk.shutdown()
    assert report.success_rate == 0.5
    first = policy.requests[0]["body"]
    assert first["metadata"][sc.SPANMILL_PROMPT_NAME] == "calculator.few_shot"
    examples = [m for m in first["messages"] if m.get(sc.SPANMILL_MESSAGE_EXAMPLE) is True]
    assert len(examples) == len(TASK.few_shot_turns(TASK.instances("train", 1, seed=SEED)[0]))
    real = [m for m in first["messages"] if sc.SPANMILL_MESSAGE_EXAMPLE not in m]
    assert [m["role"] for m in real] == ["system", "user"]
    # The transcript keeps the episode's own turns only.
    assert all(sc.SPANMILL_MESSAGE_EXAMPLE not in m for e in report.episodes for m in e.transcript)


def test_server_errors_are_reported_per_episode(server: tuple[str, Policy], policy: Policy) -> None:
    base_url, _ = server
    policy.learn(TASK.instances("heldout", 2, seed=SEED))
    policy.failing = True
    report = run_agent("calculator", 2, base_url, "calculator", seed=SEED)
    assert report.errors == 2
    assert report.success_rate == 0.0
    assert all("503" in (e.error or "") for e in report.episodes)


def test_an_unreachable_endpoint_stops_the_run_with_a_clear_error() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(AgentRunError, match=f"cannot reach the model endpoint at {base_url}"):
        run_agent("calculator", 1, base_url, "calculator")


def test_the_cli_runs_a_task_and_prints_the_rates(
    server: tuple[str, Policy], policy: Policy
) -> None:
    from typer.testing import CliRunner

    from spanmill.cli.agent import app

    base_url, _ = server
    policy.learn(TASK.instances("heldout", 4, seed=SEED))
    result = CliRunner().invoke(
        app,
        [
            "run",
            "calculator",
            "--n",
            "4",
            "--seed",
            str(SEED),
            "--no-export",
            "--base-url",
            base_url,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "50.0%" in result.output
    assert "calculator on calculator" in result.output


def test_the_cli_names_a_bad_choice() -> None:
    from typer.testing import CliRunner

    from spanmill.cli.agent import app

    result = CliRunner().invoke(app, ["run", "calculator", "--prompt", "cot", "--no-export"])
    assert result.exit_code == 1
    assert "--prompt must be one of zero_shot, few_shot" in result.output


def test_the_cli_refuses_to_trace_into_a_broker_that_is_down(server: tuple[str, Policy]) -> None:
    from typer.testing import CliRunner

    from spanmill.cli.agent import app

    base_url, _ = server
    down = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        app,
        ["run", "calculator", "--n", "1", "--base-url", base_url],
        env={"SPANMILL_KAFKA_BOOTSTRAP_SERVERS": down},
    )
    assert result.exit_code == 1
    assert f"cannot reach Kafka at {down}" in result.output
    assert "--no-export" in result.output
