"""Spans for store tests: varied enough to exercise every column and the JSON fallbacks."""

from __future__ import annotations

import json
import math
from typing import Any

from spanmill import semconv as sc
from spanmill.spans import Span

HOUR_NS = 3600 * 10**9
BASE_NS = 1_750_000_000_000_000_000  # 2025-06-15 15:06:40 UTC


def span(i: int, **overrides: Any) -> Span:
    start = BASE_NS + i * 60 * 10**9
    fields: dict[str, Any] = {
        "trace_id": f"{i + 1:032x}",
        "span_id": f"{i + 1:016x}",
        "parent_span_id": None if i % 2 else f"{i + 1000:016x}",
        "name": f"chat {i}",
        "kind": "client",
        "start_time_unix_nano": start,
        "end_time_unix_nano": start + 1234,
        "status_code": "error" if i % 5 == 0 else "ok",
        "status_message": "boom" if i % 5 == 0 else "",
        "attributes": {
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "smollm2",
            sc.GEN_AI_AGENT_NAME: "calculator" if i % 2 else "planner",
            sc.SPANMILL_MODEL_VERSION: str(i % 3),
            sc.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "parts": []}]),
            sc.SPANMILL_COMPLETION_TOKEN_IDS: [i, i + 1],
            sc.SPANMILL_COMPLETION_LOGPROBS: [-0.5, -0.25],
            "inf": math.inf,
            "flags": [True, False],
        },
        "resource_attributes": {sc.SERVICE_NAME: "svc-a" if i % 3 else "svc-b"},
        "scope_name": "scope",
        "scope_version": "1",
    }
    fields.update(overrides)
    return Span(**fields)


def odd_span() -> Span:
    """Attributes whose values do not have their column's type stay in the JSON."""
    return span(
        99,
        attributes={
            sc.GEN_AI_USAGE_INPUT_TOKENS: "12",  # a string where an int is expected
            sc.GEN_AI_EVALUATION_NAME: "correct",
            sc.GEN_AI_EVALUATION_SCORE_VALUE: 1,  # an int score
            sc.SPANMILL_EPISODE_ID: "episode-7",
            sc.SPANMILL_COMPLETION_TOKEN_IDS: [],
            sc.SPANMILL_PROMPT_TOKEN_IDS: ["a", "b"],
            sc.GEN_AI_RESPONSE_MODEL: "",
        },
        resource_attributes={sc.SERVICE_NAME: 5},
        events=[
            {
                "name": sc.GEN_AI_EVALUATION_RESULT_EVENT,
                "time_unix_nano": BASE_NS,
                "attributes": {
                    sc.GEN_AI_EVALUATION_NAME: "latency",
                    sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.5,
                    sc.GEN_AI_RESPONSE_ID: "r-1",
                },
            }
        ],
        links=[{"trace_id": "c" * 32, "span_id": "d" * 16}],
    )
