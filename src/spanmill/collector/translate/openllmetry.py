"""OpenLLMetry (Traceloop) attributes into the GenAI conventions.

OpenLLMetry flattens messages into ``gen_ai.prompt.<i>.role|content|tool_call_id``
and ``gen_ai.completion.<i>.role|content|finish_reason|tool_calls.<j>.id|name|arguments``,
counts tokens as ``gen_ai.usage.prompt_tokens|completion_tokens``, names the
provider ``gen_ai.system``, the call type ``llm.request.type`` and the workflow
step ``traceloop.span.kind`` / ``traceloop.entity.name``, and the tools offered
``llm.request.functions.<i>.name|description|parameters``. Those become
``gen_ai.input.messages`` / ``gen_ai.output.messages``, the usage, provider,
operation, agent and tool attributes, ``gen_ai.tool.definitions``; the flattened keys
are removed once translated, every other key is kept as sent.
"""

from __future__ import annotations

from typing import Any, Final

from spanmill import semconv as sc
from spanmill.collector.translate.messages import (
    indexed,
    message,
    parse_arguments,
    set_default,
    text_parts,
    tool_call_parts,
    tool_response,
)
from spanmill.spans.jsontext import compact_json

NAME: Final = "openllmetry"
PROMPT_PREFIX: Final = "gen_ai.prompt."
COMPLETION_PREFIX: Final = "gen_ai.completion."
# The tools a call was offered: llm.request.functions.<i>.name|description|parameters.
FUNCTIONS_PREFIX: Final = "llm.request.functions."
# Keys whose presence marks a span as OpenLLMetry's: checked against the keys in C.
SIGNATURE: Final = frozenset(
    (
        "gen_ai.prompt.0.role",
        "gen_ai.prompt.0.content",
        "gen_ai.completion.0.role",
        "gen_ai.completion.0.content",
        "gen_ai.system",
        "gen_ai.usage.prompt_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.request.type",
        "traceloop.span.kind",
    )
)
_REQUEST_TYPES: Final = {"chat": sc.OPERATION_CHAT, "completion": sc.OPERATION_TEXT_COMPLETION}
_SPAN_KINDS: Final = {"agent": sc.OPERATION_INVOKE_AGENT, "tool": sc.OPERATION_EXECUTE_TOOL}


def _tools(functions: dict[int, dict[str, Any]]) -> str:
    """``llm.request.functions.<i>.name|description|parameters`` as the tools the call was
    offered, in OpenAI's form (what the gateway records and a replay offers again)."""
    tools = []
    for _, fields in sorted(functions.items()):
        function: dict[str, Any] = {"name": fields.get("name", "")}
        if "description" in fields:
            function["description"] = fields["description"]
        if "parameters" in fields:
            function["parameters"] = parse_arguments(fields["parameters"])
        tools.append({"type": "function", "function": function})
    return compact_json(tools)


def _legacy_call(fields: dict[str, Any]) -> dict[str, Any]:
    """A message's ``function_call.name|arguments`` as the first of its indexed calls."""
    prefix = "function_call."
    return {
        f"{prefix}0.{key[len(prefix) :]}": value
        for key, value in fields.items()
        if key.startswith(prefix)
    }


def _calls(fields: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's tool calls: ``tool_calls.<i>.id|name|arguments``, and the one call of
    the legacy API that older OpenLLMetry records as ``function_call.name|arguments``."""
    for key in fields:
        if "." in key:  # most messages hold text alone, with no nested keys
            break
    else:
        return []
    return [
        *tool_call_parts(fields, "tool_calls."),
        *tool_call_parts(_legacy_call(fields), "function_call."),
    ]


def _messages(groups: dict[int, dict[str, Any]], output: bool) -> list[dict[str, Any]]:
    messages = []
    for _, fields in sorted(groups.items()):
        role = fields.get("role")
        parts = tool_response(fields) or [
            *text_parts(fields.get("content")),
            # A refusal is the answer's text (current OpenLLMetry records it apart).
            *text_parts(fields.get("refusal")),
            *_calls(fields),
        ]  # fmt: skip
        finish = fields.get("finish_reason") if output else None
        messages.append(
            message(
                role or ("assistant" if output else "user"),
                parts,
                name=fields.get("name"),
                finish_reason=finish,
            )
        )
    return messages


def translate(attributes: dict[str, Any]) -> bool:
    """Rewrite OpenLLMetry attributes in place; True when the span carried any."""
    if SIGNATURE.isdisjoint(attributes):
        return False
    changed = False
    prompts, used_prompts = indexed(attributes, PROMPT_PREFIX)
    completions, used_completions = indexed(attributes, COMPLETION_PREFIX)
    if prompts and set_default(
        attributes, sc.GEN_AI_INPUT_MESSAGES, compact_json(_messages(prompts, False))
    ):
        changed = True
    if completions and set_default(
        attributes, sc.GEN_AI_OUTPUT_MESSAGES, compact_json(_messages(completions, True))
    ):
        changed = True
    functions, used_functions = indexed(attributes, FUNCTIONS_PREFIX)
    if functions and set_default(attributes, sc.GEN_AI_TOOL_DEFINITIONS, _tools(functions)):
        changed = True
    for key in used_prompts + used_completions + used_functions:
        del attributes[key]
        changed = True
    for old, new in (
        ("gen_ai.usage.prompt_tokens", sc.GEN_AI_USAGE_INPUT_TOKENS),
        ("gen_ai.usage.completion_tokens", sc.GEN_AI_USAGE_OUTPUT_TOKENS),
        ("gen_ai.system", sc.GEN_AI_PROVIDER_NAME),
    ):
        if old in attributes:
            set_default(attributes, new, attributes.pop(old))
            changed = True
    request_type = attributes.get("llm.request.type")
    if request_type in _REQUEST_TYPES:
        changed |= set_default(attributes, sc.GEN_AI_OPERATION_NAME, _REQUEST_TYPES[request_type])
    span_kind = attributes.get("traceloop.span.kind")
    if span_kind in _SPAN_KINDS:
        changed |= set_default(attributes, sc.GEN_AI_OPERATION_NAME, _SPAN_KINDS[span_kind])
        entity = attributes.get("traceloop.entity.name")
        target = sc.GEN_AI_AGENT_NAME if span_kind == "agent" else sc.GEN_AI_TOOL_NAME
        if isinstance(entity, str):
            changed |= set_default(attributes, target, entity)
    return changed
