"""One training sample per LLM call: the prompt and completion as the model saw them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from spanmill import messages as chat
from spanmill.dataset.episodes import LLMCall

# Without token counts, a character budget stands in: about 3.5 characters a
# token for English text under the small models' tokenizers.
CHARS_PER_TOKEN = 3.5


@dataclass(slots=True)
class Sample:
    call: LLMCall
    prompt: list[dict[str, str]]
    completion: list[dict[str, str]]
    reward: float | None
    tokens: int
    key: str  # identity of (prompt, completion), for deduplication
    prompt_key: str  # identity of the prompt, for pairing attempts

    def lineage(self) -> dict[str, Any]:
        c = self.call
        return {
            "sample_id": c.span_id,
            "task_id": c.task_id,
            "episode_id": c.episode_id,
            "trace_id": c.trace_id,
            "response_id": c.response_id,
            "agent": c.agent,
            "model": c.model,
            "model_version": c.model_version,
            "request": c.request,
        }


def _json_list(text: str | None) -> list[dict[str, Any]]:
    if not text:
        return []
    parsed = json.loads(text)
    return parsed if isinstance(parsed, list) else [parsed]


def _count(refused: dict[str, int] | None, reason: str) -> None:
    if refused is not None:
        refused[reason] = refused.get(reason, 0) + 1


def _object_arguments(call: dict[str, Any]) -> bool:
    """Whether an OpenAI tool call's arguments are a JSON object (a cut-off stream, or a
    producer's "city=Paris", are not)."""
    arguments = (call.get("function") or {}).get("arguments")
    if isinstance(arguments, dict):
        return True
    try:
        return isinstance(json.loads(arguments), dict) if arguments else True
    except (TypeError, ValueError):
        return False


def digest(value: Any) -> str:
    """The identity of messages (a prompt, or a prompt and its answer) by their content."""
    return hashlib.blake2b(
        json.dumps(value, sort_keys=True, ensure_ascii=False).encode(), digest_size=16
    ).hexdigest()


# Message parts a sample renders (a reasoning part is left out of what is trained on).
RENDERED_PARTS: Final = frozenset({"text", "tool_call", "tool_call_response", "reasoning"})


def _unsupported_parts(messages: list[Any]) -> bool:
    return any(
        isinstance(part, dict) and part.get("type") not in RENDERED_PARTS
        for message in messages
        if isinstance(message, dict)
        for part in message.get("parts") or ()
    )


# An answer's finish reasons that mean it did not end where the model ended it.
CUT_SHORT: Final = frozenset({"length", "content_filter"})


def make_sample(
    call: LLMCall,
    reward: float | None,
    *,
    drop_examples: bool,
    refused: dict[str, int] | None = None,
) -> Sample | None:
    """The sample of one call, or None when the call has no usable completion.

    ``refused`` counts, by reason, the calls left out for what they hold rather than
    for what they lack: ``undecodable_messages`` (message attributes that are not the
    conventions' JSON), ``invalid_tool_arguments`` (an answer's tool call whose
    arguments are not a JSON object: a model would learn to write them so),
    ``cut_short`` (an answer that ended at ``max_tokens`` or by a content filter),
    ``unsupported_parts`` (an image, audio or file part the sample cannot render).
    """
    if call.failed or not call.output_messages:
        return None
    try:
        asked, answered = _json_list(call.input_messages), _json_list(call.output_messages)
        inputs = chat.genai_to_openai(asked)
        outputs = chat.genai_to_openai(answered)
        system = chat.genai_to_openai(chat.system_messages(_json_list(call.system_instructions)))
    except (ValueError, AttributeError, TypeError):
        _count(refused, "undecodable_messages")
        return None
    if _unsupported_parts([*asked, *answered]):
        # An image, audio or file the model saw: the prompt would keep its text alone,
        # and the model learn to answer about what it was never shown.
        _count(refused, "unsupported_parts")
        return None
    if any(m.get("finish_reason") in CUT_SHORT for m in answered if isinstance(m, dict)):
        # Cut at max_tokens or by a filter: trained on, the model learns to stop mid-answer.
        _count(refused, "cut_short")
        return None
    if system and not any(m.get("role") == "system" for m in inputs):
        inputs = [
            {"role": "system", "content": "".join(m["content"] or "" for m in system)},
            *inputs,
        ]
    if drop_examples:
        # Context distillation: the few-shot turns go, the behaviour they taught stays.
        inputs = [m for m in inputs if not m.get(chat.EXAMPLE)]
    assistant = [m for m in outputs if m.get("role") == "assistant"][:1]
    if not inputs or not assistant:
        return None
    if not all(_object_arguments(c) for c in assistant[0].get("tool_calls") or ()):
        _count(refused, "invalid_tool_arguments")
        return None
    prompt = chat.to_model_messages(inputs)
    completion = chat.to_model_messages(assistant)
    if not completion[0]["content"]:
        return None
    prompt_chars = sum(len(m["content"]) for m in prompt)
    if call.input_tokens is not None and not drop_examples:
        prompt_tokens = call.input_tokens
    else:
        prompt_tokens = round(prompt_chars / CHARS_PER_TOKEN)
    completion_tokens = call.output_tokens
    if completion_tokens is None:
        completion_tokens = round(len(completion[0]["content"]) / CHARS_PER_TOKEN)
    return Sample(
        call=call,
        prompt=prompt,
        completion=completion,
        reward=reward,
        tokens=prompt_tokens + completion_tokens,
        key=digest([prompt, completion]),
        prompt_key=digest(prompt),
    )
