"""Chat messages in their three forms, and the conversions between them.

* OpenAI chat format: what agents send to the gateway and what TRL trainers take
  (``{"role", "content", "tool_calls", "tool_call_id"}``).
* GenAI semantic-convention format: what spans carry in ``gen_ai.input.messages``
  and ``gen_ai.output.messages`` (``{"role", "parts": [...]}``, parts typed
  ``text``, ``tool_call`` and ``tool_call_response``).
* Model text: what a chat template renders. Models without a tool format of
  their own (SmolLM2) write a tool call as one JSON object,
  ``{"tool": NAME, ...arguments}``; :func:`to_model_messages` renders calls that
  way and :func:`parse_tool_calls` reads them back.

A message may carry ``"spanmill.message.example": true`` (few-shot example turn);
it survives every conversion. Agents that know nothing of spanmill mark example
turns the way OpenAI's guides do, with the participant ``name`` ``example_user`` or
``example_assistant``; such a message, and a tool result answering a call made in
one, enters the GenAI form marked as an example.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from spanmill import semconv

EXAMPLE = semconv.SPANMILL_MESSAGE_EXAMPLE
# OpenAI's participant names for few-shot example turns.
EXAMPLE_NAMES = frozenset({"example_user", "example_assistant"})


def text_of(content: Any) -> str:
    """The text of an OpenAI ``content``: a string, or a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return {"_raw": raw}
    return parsed if isinstance(parsed, dict) else {"_raw": parsed}


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"tool": name, **arguments}, ensure_ascii=False)


def to_model_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """OpenAI messages to the plain role/content form a chat template renders.

    An assistant turn with tool calls renders its calls, one JSON object a line, and
    leaves out any text beside them ("Let me check." before a lookup): a model without a
    tool format of its own answers a call as that object alone, which is what
    :func:`parse_tool_calls` reads back, and what it must learn is the call itself.
    """
    rendered = []
    for message in messages:
        role = str(message.get("role", "user"))
        text = text_of(message.get("content"))
        calls = message.get("tool_calls") or []
        if role == "assistant" and calls:
            text = "\n".join(
                tool_call_text(
                    call.get("function", {}).get("name", ""),
                    _arguments(call.get("function", {}).get("arguments")),
                )
                for call in calls
            )
        rendered.append({"role": role, "content": text})
    return rendered


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls`` from model text holding one JSON tool call, else [].

    Accepts ``{"tool": NAME, ...args}`` and ``{"name": NAME, "arguments": {...}}``,
    optionally inside a fenced code block.
    """
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`")
        stripped = stripped[stripped.find("\n") + 1 :] if "\n" in stripped else stripped
        stripped = stripped.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return []
    try:
        obj = json.loads(stripped)
    except ValueError:
        return []
    if not isinstance(obj, dict):
        return []
    if isinstance(obj.get("tool"), str):
        name = obj["tool"]
        arguments = {k: v for k, v in obj.items() if k != "tool"}
    elif isinstance(obj.get("name"), str) and isinstance(obj.get("arguments", {}), dict):
        name, arguments = obj["name"], obj.get("arguments", {})
    else:
        return []
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
    ]


def system_messages(items: list[Any]) -> list[dict[str, Any]]:
    """``gen_ai.system_instructions`` as GenAI messages: the conventions make it an array
    of parts, one system message's; an array of messages, as earlier producers wrote it,
    stays as it is."""
    if items and all(
        isinstance(item, dict) and "type" in item and "role" not in item and "parts" not in item
        for item in items
    ):
        return [{"role": "system", "parts": items}]
    return items


def openai_to_genai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages to GenAI semantic-convention messages."""
    converted = []
    example_calls: set[str] = set()  # ids of tool calls made in example turns
    for message in messages:
        role = str(message.get("role", "user"))
        example = bool(message.get(EXAMPLE)) or message.get("name") in EXAMPLE_NAMES
        if role == "tool" and message.get("tool_call_id") in example_calls:
            example = True
        parts: list[dict[str, Any]] = []
        if role == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": text_of(message.get("content")),
                }
            )
        else:
            text = text_of(message.get("content"))
            if text:
                parts.append({"type": "text", "content": text})
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                if example and call.get("id"):
                    example_calls.add(str(call["id"]))
                parts.append(
                    {
                        "type": "tool_call",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": _arguments(function.get("arguments")),
                    }
                )
        out: dict[str, Any] = {"role": role, "parts": parts}
        if example:
            out[EXAMPLE] = True
        if "finish_reason" in message:
            out["finish_reason"] = message["finish_reason"]
        converted.append(out)
    return converted


def _arguments_text(arguments: Any) -> str:
    """A tool call's arguments as OpenAI's JSON text. The conventions allow any type: an
    object, or the JSON text of one as a model wrote it, is taken as it is (the text was
    encoded again, a JSON string that no longer held an object)."""
    if isinstance(arguments, str):
        try:
            if isinstance(json.loads(arguments), dict):
                return arguments
        except ValueError:
            pass
        return json.dumps(arguments)
    return json.dumps(arguments or {})


def genai_to_openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GenAI semantic-convention messages back to OpenAI chat messages.

    A message of tool results (parallel calls answered together, or Anthropic's results
    in a user turn) becomes one ``tool`` message a result, in order, and any text beside
    them a message of its own role after them: OpenAI's form holds one result a message.
    """
    converted = []
    for message in messages:
        role = str(message.get("role", "user"))
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        responses: list[dict[str, Any]] = []
        for part in message.get("parts") or []:
            kind = part.get("type")
            if kind == "text":
                texts.append(str(part.get("content", "")))
            elif kind == "tool_call":
                calls.append(
                    {
                        "id": part.get("id") or f"call_{len(calls)}",
                        "type": "function",
                        "function": {
                            "name": part.get("name", ""),
                            "arguments": _arguments_text(part.get("arguments")),
                        },
                    }
                )
            elif kind == "tool_call_response":
                responses.append(part)
        example = {EXAMPLE: True} if message.get(EXAMPLE) else {}
        for part in responses:
            response = part.get("response")
            content = response if isinstance(response, str) else json.dumps(response)
            converted.append(  # OpenAI's role for a result, whoever's turn carried it
                {"role": "tool", "content": content, "tool_call_id": part.get("id"), **example}
            )
        if responses and not texts and not calls:
            continue
        out: dict[str, Any] = {"role": role}
        out["content"] = "".join(texts) if texts or not calls else None
        if calls:
            out["tool_calls"] = calls
        converted.append({**out, **example})
    return converted
