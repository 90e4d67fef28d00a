"""OpenInference (Arize Phoenix) attributes into the GenAI conventions.

OpenInference marks every span with ``openinference.span.kind`` (``LLM``, ``TOOL``,
``AGENT``, ``CHAIN``, ...), flattens messages into
``llm.input_messages.<i>.message.role|content|contents.<j>.message_content.*|
tool_calls.<j>.tool_call.id|function.name|function.arguments|tool_call_id``
(and ``llm.output_messages``), names the model ``llm.model_name``, counts tokens
as ``llm.token_count.prompt|completion``, and carries raw ``input.value`` /
``output.value``. Those become the GenAI operation, model, provider, messages,
usage, tool, agent and conversation attributes, and the response id where a JSON
``output.value`` carries one (LangChain's result, an OpenAI body). A TOOL span's
``input.value`` / ``output.value`` become the tool call's arguments and result; an
LLM span with no messages gets them from its plain-text ``input.value`` /
``output.value``.
Translated keys are removed; every other key is kept as sent.
"""

from __future__ import annotations

import json
from typing import Any, Final

from spanmill import semconv as sc
from spanmill.collector.translate.messages import (
    indexed,
    message,
    set_default,
    text_parts,
    tool_call_parts,
    tool_response,
)
from spanmill.spans.jsontext import compact_json

NAME: Final = "openinference"
SPAN_KIND: Final = "openinference.span.kind"
SIGNATURE: Final = frozenset((SPAN_KIND, "llm.model_name", "llm.input_messages.0.message.role"))
# GenAI names for a tool call's arguments and result (opt-in attributes of the conventions).
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
_OPERATIONS: Final = {
    "LLM": sc.OPERATION_CHAT,
    "TOOL": sc.OPERATION_EXECUTE_TOOL,
    "AGENT": sc.OPERATION_INVOKE_AGENT,
    "EMBEDDING": "embeddings",
}
_MOVES: Final = (
    ("llm.model_name", sc.GEN_AI_REQUEST_MODEL),
    ("llm.request.model_name", sc.GEN_AI_REQUEST_MODEL),
    ("llm.response.model_name", sc.GEN_AI_RESPONSE_MODEL),
    ("llm.system", sc.GEN_AI_PROVIDER_NAME),
    ("llm.provider", sc.GEN_AI_PROVIDER_NAME),
    ("llm.token_count.prompt", sc.GEN_AI_USAGE_INPUT_TOKENS),
    ("llm.token_count.completion", sc.GEN_AI_USAGE_OUTPUT_TOKENS),
    ("tool.name", sc.GEN_AI_TOOL_NAME),
    ("tool_call.id", sc.GEN_AI_TOOL_CALL_ID),
    ("agent.name", sc.GEN_AI_AGENT_NAME),
    ("session.id", sc.GEN_AI_CONVERSATION_ID),
    ("llm.prompt_template.version", sc.SPANMILL_PROMPT_VERSION),
)
_PARAMETERS: Final = {
    "temperature": sc.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": sc.GEN_AI_REQUEST_TOP_P,
    "max_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
}


def _parts(fields: dict[str, Any]) -> list[dict[str, Any]]:
    contents, _ = indexed(fields, "message.contents.")
    if contents:
        parts: list[dict[str, Any]] = []
        for _, item in sorted(contents.items()):
            kind = item.get("message_content.type")
            if kind == "text" or "message_content.text" in item:
                parts.append({"type": "text", "content": item.get("message_content.text", "")})
            elif "message_content.image.image.url" in item:
                parts.append({"type": "image", "url": item["message_content.image.image.url"]})
        return parts
    return text_parts(fields.get("message.content"))


def _messages(groups: dict[int, dict[str, Any]], output: bool) -> list[dict[str, Any]]:
    messages = []
    for _, fields in sorted(groups.items()):
        role = fields.get("message.role")
        parts = tool_response(fields, "message.") or _parts(fields) + tool_call_parts(
            fields,
            "message.tool_calls.",
            id_key="tool_call.id",
            name_key="tool_call.function.name",
            arguments_key="tool_call.function.arguments",
        )
        messages.append(
            message(
                role or ("assistant" if output else "user"), parts, name=fields.get("message.name")
            )
        )
    return messages


def _plain_text(attributes: dict[str, Any], which: str) -> str | None:
    value = attributes.get(f"{which}.value")
    mime = attributes.get(f"{which}.mime_type", "text/plain")
    return value if isinstance(value, str) and mime == "text/plain" else None


def translate(attributes: dict[str, Any]) -> bool:
    """Rewrite OpenInference attributes in place; True when the span carried any."""
    if SIGNATURE.isdisjoint(attributes):
        return False
    changed = False
    kind = attributes.pop(SPAN_KIND, None)
    if kind is not None:
        changed = True
        operation = _OPERATIONS.get(str(kind).upper())
        if operation is not None:
            set_default(attributes, sc.GEN_AI_OPERATION_NAME, operation)
    for prefix, key, output in (
        ("llm.input_messages.", sc.GEN_AI_INPUT_MESSAGES, False),
        ("llm.output_messages.", sc.GEN_AI_OUTPUT_MESSAGES, True),
    ):
        groups, used = indexed(attributes, prefix)
        if groups:
            set_default(attributes, key, compact_json(_messages(groups, output)))
            for name in used:
                del attributes[name]
            changed = True
    for old, new in _MOVES:
        if old in attributes:
            set_default(attributes, new, attributes.pop(old))
            changed = True
    parameters = attributes.get("llm.invocation_parameters")
    if isinstance(parameters, str):
        try:
            decoded = json.loads(parameters)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            for name, key in _PARAMETERS.items():
                value = decoded.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    changed |= set_default(attributes, key, value)
    if str(kind).upper() == "TOOL":
        for which, key in (("input", TOOL_CALL_ARGUMENTS), ("output", TOOL_CALL_RESULT)):
            value = attributes.get(f"{which}.value")
            if isinstance(value, str) and set_default(attributes, key, value):
                attributes.pop(f"{which}.value")
                attributes.pop(f"{which}.mime_type", None)
                changed = True
    elif str(kind).upper() == "LLM":
        response_id = _response_id(attributes)
        if response_id is not None:
            changed |= set_default(attributes, sc.GEN_AI_RESPONSE_ID, response_id)
        for which, key, role in (
            ("input", sc.GEN_AI_INPUT_MESSAGES, "user"),
            ("output", sc.GEN_AI_OUTPUT_MESSAGES, "assistant"),
        ):
            text = _plain_text(attributes, which)
            if text is not None and key not in attributes:
                attributes[key] = compact_json([message(role, [{"type": "text", "content": text}])])
                changed = True
    return changed


def _response_id(attributes: dict[str, Any]) -> str | None:
    """The id of the response the client received, from a JSON ``output.value``:
    LangChain's ``LLMResult`` (``llm_output.id``, or a message's
    ``response_metadata.id``) or an OpenAI chat completion body (``id``)."""
    value = attributes.get("output.value")
    if not isinstance(value, str) or attributes.get("output.mime_type") != "application/json":
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    found = _dig(decoded, "llm_output", "id")
    for generations in decoded.get("generations") or ():
        for generation in generations if isinstance(generations, list) else ():
            found = found or _dig(generation, "message", "kwargs", "response_metadata", "id")
    if found is None and str(decoded.get("object", "")).startswith("chat.completion"):
        found = _dig(decoded, "id")
    return found


def _dig(value: Any, *path: str) -> str | None:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None
