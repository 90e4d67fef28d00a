"""The collector on one chat call as three instrumentations record it, in one run.

The same call (a system prompt, four turns, a tool call in the answer, token counts)
as GenAI-named attributes, as OpenLLMetry flattens it (``gen_ai.prompt.<i>.role``...)
and as OpenInference does (``llm.input_messages.<i>.message.role``...), one span a
record, through :class:`BatchProcessor` with the collector's default settings into a
store in a temporary folder. GenAI spans are read natively; the others are read
natively, then their rows are read back, translated, redacted and appended again in
Python. Printed: microseconds a span, best of the rounds (alternating), and each
convention's ratio to the GenAI one.
"""

from __future__ import annotations

import json
import tempfile
import time
from typing import Any

from spanmill import semconv as sc
from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
from spanmill.config import CollectorSettings
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.store.layout import BatchId

SPANS = 5_000
ROUNDS = 3
TURNS = (
    ("system", "You answer arithmetic questions with the calculator tool."),
    ("user", "What is 17 times 23? Use the calculator, please."),
    ("assistant", "I will work it out with the calculator."),
    ("user", "And then add four hundred to it."),
)
ARGUMENTS = '{"expression": "17 * 23 + 400"}'


def genai(i: int) -> dict[str, Any]:
    messages = [{"role": r, "parts": [{"type": "text", "content": c}]} for r, c in TURNS]
    answer = [{"role": "assistant", "finish_reason": "tool_calls", "parts": [
        {"type": "tool_call", "id": f"call_{i}", "name": "calculator",
         "arguments": json.loads(ARGUMENTS)}]}]  # fmt: skip
    return {
        sc.GEN_AI_PROVIDER_NAME: "openai",
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "gpt-4o",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 120,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 20,
        sc.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(answer),
    }


def flattened(turn: str, **attributes: Any) -> dict[str, Any]:
    """``attributes`` and the prompt's turns as a convention flattens them: ``turn`` is
    the key of turn ``n``'s ``field`` (role, content)."""
    for n, (role, content) in enumerate(TURNS):
        attributes[turn.format(n=n, field="role")] = role
        attributes[turn.format(n=n, field="content")] = content
    return attributes


def openllmetry(i: int) -> dict[str, Any]:
    answer = "gen_ai.completion.0"
    return flattened("gen_ai.prompt.{n}.{field}", **{
        "gen_ai.system": "openai",
        "llm.request.type": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.prompt_tokens": 120,
        "gen_ai.usage.completion_tokens": 20,
        f"{answer}.role": "assistant",
        f"{answer}.finish_reason": "tool_calls",
        f"{answer}.tool_calls.0.id": f"call_{i}",
        f"{answer}.tool_calls.0.name": "calculator",
        f"{answer}.tool_calls.0.arguments": ARGUMENTS,
    })  # fmt: skip


def openinference(i: int) -> dict[str, Any]:
    call = "llm.output_messages.0.message.tool_calls.0.tool_call"
    return flattened("llm.input_messages.{n}.message.{field}", **{
        "openinference.span.kind": "LLM",
        "llm.provider": "openai",
        "llm.model_name": "gpt-4o",
        "llm.token_count.prompt": 120,
        "llm.token_count.completion": 20,
        "llm.output_messages.0.message.role": "assistant",
        f"{call}.id": f"call_{i}",
        f"{call}.function.name": "calculator",
        f"{call}.function.arguments": ARGUMENTS,
    })  # fmt: skip


CONVENTIONS = {"genai": genai, "openllmetry": openllmetry, "openinference": openinference}


def records(attributes_of: Any) -> list[bytes]:
    out = []
    for i in range(SPANS):
        span = Span(
            trace_id=f"{i + 1:032x}",
            span_id=f"{i + 1:016x}",
            name="chat gpt-4o",
            start_time_unix_nano=1_750_000_000_000_000_000 + i * 1_000_000,
            end_time_unix_nano=1_750_000_000_500_000_000 + i * 1_000_000,
            attributes=attributes_of(i),
        )
        out.append(encode_otlp_protobuf([span]))
    return out


def run(processor: BatchProcessor, values: list[bytes], first: int) -> tuple[float, int]:
    job = BatchJob(
        BatchId("spans", 0, first, first + len(values) - 1, "0000000000000000"),
        list(range(first, first + len(values))),
        [0] * len(values),
        values,
        [None] * len(values),
    )
    started = time.perf_counter()
    outcome = processor.process(job)
    seconds = time.perf_counter() - started
    assert outcome.spans == len(values) and not outcome.dead, outcome.dead
    return seconds, sum(outcome.translations.values())


def main() -> None:
    payloads = {name: records(make) for name, make in CONVENTIONS.items()}
    best: dict[str, float] = {}
    translated: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        settings = CollectorSettings(store_url=folder, receiver_enabled=False)
        processor = BatchProcessor(ProcessingConfig.from_settings(settings))
        first = 0
        for _ in range(ROUNDS):
            for name, values in payloads.items():
                seconds, translated[name] = run(processor, values, first)
                first += len(values)
                best[name] = min(best.get(name, seconds), seconds)
    base = best["genai"]
    print(f"{SPANS:,} spans of one chat call, one a record, default collector settings")
    for name, seconds in best.items():
        print(
            f"  {name:14} {seconds / SPANS * 1e6:7.1f} us a span  "
            f"x{seconds / base:5.1f} of GenAI  ({translated[name]:,} spans translated)"
        )


if __name__ == "__main__":
    main()
