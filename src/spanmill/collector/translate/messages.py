"""Building GenAI message objects, the one shape every translator produces.

A message is ``{"role": ..., "parts": [...]}``; a part is ``{"type": "text",
"content": ...}``, ``{"type": "tool_call", "id", "name", "arguments"}`` or
``{"type": "tool_call_response", "id", "response"}``, as the GenAI semantic
conventions define them. Foreign conventions flatten lists into indexed keys
(``gen_ai.prompt.0.role``); :func:`indexed` gathers them back.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from spanmill.messages import EXAMPLE, EXAMPLE_NAMES


@functools.cache
def _indexed_key(prefix: str) -> Callable[[str], re.Match[str] | None]:
    """A test of one key for ``<prefix><i>.<rest>``: one call a key, the prefix included."""
    return re.compile(re.escape(prefix) + r"(\d+)\.(.+)$").match


def indexed(
    attributes: Mapping[str, Any], prefix: str
) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Group ``<prefix><i>.<rest>`` keys by ``i``: ``{i: {rest: value}}``, and the keys used."""
    groups: dict[int, dict[str, Any]] = {}
    used = []
    match_key = _indexed_key(prefix)
    for key, value in attributes.items():
        if not key.startswith(prefix):  # most keys; far cheaper than the match
            continue
        match = match_key(key)
        if match is None:
            continue
        groups.setdefault(int(match[1]), {})[match[2]] = value
        used.append(key)
    return groups, used


def parse_arguments(value: Any) -> Any:
    """Tool-call arguments as a JSON value when they are JSON text, else as sent."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# Content-part types a JSON list of content items may hold (OpenAI's and Anthropic's, as
# instrumentations record them): a list holding any other is a text that looks like one.
_CONTENT_TYPES: Final = frozenset(
    {"text", "image", "image_url", "input_audio", "input_text", "tool_use", "tool_result"}
)


def text_parts(content: Any) -> list[dict[str, Any]]:
    """Parts of a message whose content is text, or a JSON list of typed content items
    (OpenAI's text and image parts; Anthropic's tool_use and tool_result blocks as tool
    calls and their results)."""
    if not isinstance(content, str):
        return [] if content is None else [{"type": "text", "content": str(content)}]
    stripped = content.lstrip()
    if stripped.startswith("[") and '"type"' in stripped:
        try:
            items = json.loads(content)
        except ValueError:
            items = None
        if (
            isinstance(items, list)
            and items
            and all(isinstance(item, dict) and item.get("type") in _CONTENT_TYPES for item in items)
        ):
            return [_content_part(item) for item in items]
    return [{"type": "text", "content": content}]


def _content_part(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type")
    if kind in ("text", "input_text") and "text" in item:
        return {"type": "text", "content": item["text"]}
    if kind == "tool_use":
        return {"type": "tool_call", "id": item.get("id"), "name": item.get("name", ""),
                "arguments": item.get("input") or {}}  # fmt: skip
    if kind == "tool_result":
        result = item.get("content")
        if isinstance(result, list):  # Anthropic's blocks: their text
            result = "".join(str(b.get("text", "")) for b in result if isinstance(b, dict))
        return {"type": "tool_call_response", "id": item.get("tool_use_id"), "response": result}
    return item


def message(
    role: Any, parts: list[dict[str, Any]], *, name: Any = None, **extra: Any
) -> dict[str, Any]:
    """A GenAI message. ``name``: the participant's, where the producer recorded one; the
    names OpenAI's guides give few-shot turns (example_user, example_assistant) mark the
    message as an example turn, as the gateway marks them (:mod:`spanmill.messages`)."""
    out: dict[str, Any] = {"role": role if isinstance(role, str) and role else "user"}
    out["parts"] = parts
    if isinstance(name, str) and name:
        out["name"] = name
        if name in EXAMPLE_NAMES:
            out[EXAMPLE] = True
    out.update({key: value for key, value in extra.items() if value is not None})
    return out


def tool_call_parts(
    fields: Mapping[str, Any],
    prefix: str,
    *,
    id_key: str = "id",
    name_key: str = "name",
    arguments_key: str = "arguments",
) -> list[dict[str, Any]]:
    """GenAI tool_call parts from indexed fields ``<prefix><i>.<id|name|arguments key>``."""
    for key in fields:
        if key.startswith(prefix):
            break
    else:  # most messages call no tool: a tenth of the cost of looking properly
        return []
    calls, _ = indexed(fields, prefix)
    parts = []
    for _, call in sorted(calls.items()):
        part: dict[str, Any] = {"type": "tool_call"}
        if id_key in call:
            part["id"] = call[id_key]
        part["name"] = call.get(name_key, "")
        if arguments_key in call:
            part["arguments"] = parse_arguments(call[arguments_key])
        parts.append(part)
    return parts


def tool_response(fields: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]] | None:
    """A tool message's one tool_call_response part, when it names the call it answers."""
    if fields.get(f"{prefix}role") != "tool" or f"{prefix}tool_call_id" not in fields:
        return None
    return [
        {
            "type": "tool_call_response",
            "id": fields[f"{prefix}tool_call_id"],
            "response": fields.get(f"{prefix}content"),
        }
    ]


def set_default(attributes: dict[str, Any], key: str, value: Any) -> bool:
    """Set a GenAI attribute unless the span already carries it: native values win."""
    if value is None or key in attributes:
        return False
    attributes[key] = value
    return True
