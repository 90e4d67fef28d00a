"""Hand-built traces for dataset tests: agent episodes, LLM calls, tool calls, rewards."""

from __future__ import annotations

import json
from itertools import count
from typing import Any

import pyarrow as pa

from spanmill import semconv as sc
from spanmill.spans import Span, SpanEvent
from spanmill.store import table_from_spans

_ids = count(1)
SYSTEM = {"role": "system", "content": "Use the calculator tool."}


def sid() -> str:
    return f"{next(_ids):016x}"


def tid(n: int) -> str:
    return f"{n:032x}"


def genai(messages: list[dict[str, Any]]) -> str:
    from spanmill.messages import openai_to_genai

    return json.dumps(openai_to_genai(messages))


def llm(
    trace: int, start: int, *, answer: str | dict[str, Any],
    prompt: list[dict[str, Any]] | None = None, task: str | None = "t1",
    response_id: str | None = None, version: str = "1",
    events: tuple[SpanEvent, ...] = (), input_tokens: int | None = None, error: bool = False,
    service: str = "spanmill-gateway",
) -> Span:  # fmt: skip
    if isinstance(answer, dict):
        output = {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": answer["tool"], "arguments": json.dumps(
                {k: v for k, v in answer.items() if k != "tool"})}}]}  # fmt: skip
    else:
        output = {"role": "assistant", "content": answer}
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_AGENT_NAME: "calculator",
        sc.GEN_AI_RESPONSE_MODEL: "calculator",
        sc.SPANMILL_MODEL_VERSION: version,
        sc.GEN_AI_INPUT_MESSAGES: genai(prompt or [SYSTEM, {"role": "user", "content": "q?"}]),
        sc.GEN_AI_OUTPUT_MESSAGES: genai([output]),
        sc.GEN_AI_RESPONSE_ID: response_id or f"resp-{sid()}",
    }
    if task:
        attributes[sc.SPANMILL_TASK_ID] = task
    if input_tokens is not None:
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    return Span(
        trace_id=tid(trace), span_id=sid(), name="chat calculator",
        start_time_unix_nano=start, end_time_unix_nano=start + 10,
        status_code="error" if error else "unset",
        attributes=attributes, resource_attributes={sc.SERVICE_NAME: service}, events=events,
    )  # fmt: skip


def reward_event(name: str, value: float, *, primary: bool = False, response_id: str | None = None,
                 at: int = 0) -> SpanEvent:  # fmt: skip
    attributes: dict[str, Any] = {sc.GEN_AI_EVALUATION_NAME: name,
                                  sc.GEN_AI_EVALUATION_SCORE_VALUE: value}  # fmt: skip
    if primary:
        attributes[sc.SPANMILL_REWARD_PRIMARY] = True
    if response_id:
        attributes[sc.GEN_AI_RESPONSE_ID] = response_id
    return SpanEvent(
        name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=at, attributes=attributes
    )


def episode(trace: int, start: int, *rewards: SpanEvent, task: str = "t1") -> Span:
    return Span(
        trace_id=tid(trace), span_id=sid(), name="invoke_agent calculator",
        start_time_unix_nano=start, end_time_unix_nano=start + 1000,
        attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
                    sc.GEN_AI_AGENT_NAME: "calculator", sc.SPANMILL_TASK_ID: task},
        resource_attributes={sc.SERVICE_NAME: "agent"}, events=rewards,
    )  # fmt: skip


def tool(trace: int, start: int) -> Span:
    return Span(
        trace_id=tid(trace), span_id=sid(), name="execute_tool calculator",
        start_time_unix_nano=start, end_time_unix_nano=start + 5,
        attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL,
                    sc.GEN_AI_TOOL_NAME: "calculator"},
    )  # fmt: skip


def table(*spans: Span) -> pa.Table:
    return table_from_spans(spans).sort_by([("start_time", "ascending")])
