"""Episodes, tool calls and rewards become the spans and events the contracts describe."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanmill import sdk
from spanmill import semconv as sc
from spanmill.sdk.tracing import get_tracer
from spanmill.spans import Reward, Span, StatusCode, decode_otlp_protobuf


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    sdk.configure("test-agent", agent_name="default-agent", exporter=exporter, set_global=False)
    try:
        yield exporter
    finally:
        sdk.shutdown()


def finished(exporter: InMemorySpanExporter) -> list[Span]:
    """The exported spans as the collector sees them: through OTLP protobuf and our decoder."""
    assert sdk.force_flush()
    spans = exporter.get_finished_spans()
    return decode_otlp_protobuf(encode_spans(spans).SerializeToString()) if spans else []


def by_operation(spans: list[Span], operation: str) -> list[Span]:
    return [span for span in spans if span.operation_name == operation]


def test_episode_span_names_the_agent_task_and_episode(memory: InMemorySpanExporter) -> None:
    with sdk.episode("calculator", task_id="calculator/t/1", attributes={"extra": 3}) as ep:
        assert sdk.current_episode() is ep
    assert sdk.current_episode() is None

    (span,) = finished(memory)
    assert span.name == "invoke_agent calculator"
    assert span.operation_name == sc.OPERATION_INVOKE_AGENT
    assert span.agent_name == "calculator"
    assert span.task_id == "calculator/t/1"
    assert span.episode_id == ep.episode_id and len(ep.episode_id) == 32
    assert span.trace_id == ep.trace_id
    assert span.service_name == "test-agent"
    assert span.attributes["extra"] == 3


def test_episode_ids_are_fresh_unless_given(memory: InMemorySpanExporter) -> None:
    with sdk.episode() as first:
        pass
    with sdk.episode() as second:
        pass
    with sdk.episode(episode_id="chosen") as third:
        pass
    assert first.agent_name == "default-agent"
    assert first.episode_id != second.episode_id
    assert first.trace_id != second.trace_id
    assert first.episode_id == first.trace_id  # the calls in its trace are its calls
    assert third.episode_id == "chosen"


@pytest.mark.parametrize("operation", [sc.OPERATION_CHAT, sc.OPERATION_GENERATE_CONTENT])
def test_a_call_its_instrumentation_records_in_the_episode_gets_the_episodes_reward(
    memory: InMemorySpanExporter, operation: str
) -> None:
    """The SDK's own minimal agent: an episode, a chat call recorded in its trace by the
    agent's instrumentation (which knows nothing of episodes), a reward. The episode's
    id was a fresh UUID, the call's its trace id: the reward never reached the call, and
    the dataset had nothing to train on. Gemini's instrumentations name the call
    generate_content, which no reader took for a call at all."""
    import json as json_module

    from spanmill.dataset.build import build
    from spanmill.dataset.spec import DatasetSpec
    from spanmill.store.rows import table_from_spans

    with sdk.episode("support", task_id="ticket-1") as ep:
        with get_tracer().start_as_current_span("chat gpt-4o", attributes={
            sc.GEN_AI_OPERATION_NAME: operation, sc.GEN_AI_REQUEST_MODEL: "gpt-4o",
            sc.GEN_AI_INPUT_MESSAGES: json_module.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "Where is my order?"}]}]),
            sc.GEN_AI_OUTPUT_MESSAGES: json_module.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "It shipped."}]}]),
        }):  # fmt: skip
            pass
        sdk.emit_reward("resolved", 1.0, primary=True)
    spans = finished(memory)
    assert ep.episode_id == ep.trace_id
    built = build(DatasetSpec(agent="support", trusted_producers=("*",)), table_from_spans(spans))
    assert built.counts["with_reward"] == 1
    assert len(built.train) + len(built.eval) == 1
    (row,) = built.train + built.eval
    assert row["reward"] == 1.0 and row["task_id"] == "ticket-1"


def test_episode_without_any_agent_name_is_refused() -> None:
    sdk.shutdown()
    with pytest.raises(ValueError, match="agent name"):
        sdk.episode()


def test_decorated_functions_run_one_episode_per_call(memory: InMemorySpanExporter) -> None:
    seen: list[str] = []

    @sdk.episode("calculator", task_id="t")
    def solve(x: int) -> int:
        active = sdk.current_episode()
        assert active is not None
        seen.append(active.episode_id)
        return x * 2

    @sdk.episode("calculator")
    async def solve_async(x: int) -> int:
        active = sdk.current_episode()
        assert active is not None
        seen.append(active.episode_id)
        await asyncio.sleep(0)
        return x + 1

    assert solve(2) == 4 and solve(3) == 6
    assert asyncio.run(solve_async(1)) == 2
    assert len(set(seen)) == 3
    assert len(by_operation(finished(memory), sc.OPERATION_INVOKE_AGENT)) == 3


def test_tool_call_is_a_child_of_the_episode(memory: InMemorySpanExporter) -> None:
    with (
        sdk.episode("calculator") as ep,
        sdk.tool_call("calculator", "call_1", {"expression": "2 + 3"}) as call,
    ):
        call.set_result("5")

    spans = finished(memory)
    (root,) = by_operation(spans, sc.OPERATION_INVOKE_AGENT)
    (tool,) = by_operation(spans, sc.OPERATION_EXECUTE_TOOL)
    assert tool.name == "execute_tool calculator"
    assert tool.parent_span_id == root.span_id
    assert tool.attributes[sc.GEN_AI_TOOL_NAME] == "calculator"
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_ID] == "call_1"
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"expression": "2 + 3"}'
    assert tool.attributes["gen_ai.tool.call.result"] == "5"
    assert tool.episode_id == ep.episode_id


def test_a_failing_tool_marks_its_span_and_propagates(memory: InMemorySpanExporter) -> None:
    with pytest.raises(ZeroDivisionError), sdk.episode("calculator"), sdk.tool_call("calculator"):
        _ = 1 / 0
    spans = finished(memory)
    assert {span.status_code for span in spans} == {StatusCode.ERROR}


def test_rewards_are_evaluation_events_on_the_episode(memory: InMemorySpanExporter) -> None:
    with sdk.episode("calculator"), sdk.tool_call("calculator"):
        # Inside a tool call, the reward still belongs to the episode.
        sdk.emit_reward(
            "success", 1, primary=True, label="correct", explanation="answered 39, expected 39"
        )
        sdk.emit_reward("valid_call", 0.0, response_id="chatcmpl-7")

    spans = finished(memory)
    (root,) = by_operation(spans, sc.OPERATION_INVOKE_AGENT)
    assert root.rewards == [
        Reward("success", 1.0, primary=True, label="correct"),
        Reward("valid_call", 0.0, response_id="chatcmpl-7"),
    ]
    event = root.events[0]
    assert event.name == sc.GEN_AI_EVALUATION_RESULT_EVENT
    assert event.attributes[sc.GEN_AI_EVALUATION_EXPLANATION] == "answered 39, expected 39"
    (tool,) = by_operation(spans, sc.OPERATION_EXECUTE_TOOL)
    assert tool.events == ()


def test_reward_outside_an_episode_goes_on_the_current_span(
    memory: InMemorySpanExporter,
) -> None:
    tracer = get_tracer()
    with tracer.start_as_current_span("chat", attributes={sc.GEN_AI_RESPONSE_ID: "resp-1"}):
        sdk.emit_reward("helpful", 0.5)
    (span,) = finished(memory)
    # An event without its own response id rewards the LLM call it sits on.
    assert span.rewards == [Reward("helpful", 0.5, response_id="resp-1")]


def test_reward_with_no_span_at_all_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sdk.shutdown()
    with caplog.at_level(logging.DEBUG, logger="spanmill.sdk.episode"):
        sdk.emit_reward("success", 1.0, primary=True)
    assert "not recorded" in caplog.text
    assert not trace.get_current_span().is_recording()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "1"])
def test_reward_values_must_be_finite_numbers(memory: InMemorySpanExporter, value: object) -> None:
    with sdk.episode("calculator"), pytest.raises(ValueError, match="finite number"):
        sdk.emit_reward("success", value)  # type: ignore[arg-type]


def test_a_second_primary_reward_is_warned_about(
    memory: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), sdk.episode("calculator"):
        sdk.emit_reward("success", 1.0, primary=True)
        sdk.emit_reward("style", 1.0, primary=True)
    assert "already has primary reward 'success'" in caplog.text


def test_configure_again_replaces_and_flushes_the_previous_setup() -> None:
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    sdk.configure("one", agent_name="a", exporter=first, set_global=False, schedule_delay_ms=60000)
    try:
        with sdk.episode():
            pass
        sdk.configure("two", agent_name="b", exporter=second, set_global=False)
        # The first provider was shut down, which flushed its pending span.
        assert len(first.get_finished_spans()) == 1
        with sdk.episode() as ep:
            pass
        assert ep.agent_name == "b"
        assert sdk.force_flush()
        assert len(second.get_finished_spans()) == 1
    finally:
        sdk.shutdown()


def test_configure_needs_a_service_name() -> None:
    with pytest.raises(ValueError, match="service_name"):
        sdk.configure("", exporter=InMemorySpanExporter(), set_global=False)


def test_a_tool_error_handed_back_to_the_agent_marks_the_span(
    memory: InMemorySpanExporter,
) -> None:
    with sdk.episode("calculator"), sdk.tool_call("calculator", "call_1") as call:
        call.set_result("error: division by zero")
        call.set_error("division by zero")
    (tool,) = by_operation(finished(memory), sc.OPERATION_EXECUTE_TOOL)
    assert tool.status_code == StatusCode.ERROR
    assert tool.status_message == "division by zero"
