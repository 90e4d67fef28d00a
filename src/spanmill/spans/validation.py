"""Turning validation failures into SpanDecodeErrors that name the payload's own field.

Every decoder builds the same keyword arguments for :class:`Span`, but a user reads
the error against what they sent: ``traceId`` in OTLP/JSON, ``trace_id`` in the SDK
form, with the index of the span in the batch. Decoders pass a ``locate`` function
that maps a location inside a span to that path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from spanmill.spans.errors import OVERSIZE, SCHEMA, SpanDecodeError
from spanmill.spans.record import InvalidAttributeError, show

Loc = tuple[int | str, ...]
Locate = Callable[[Loc], str]
# Several errors in one span are reported together, but a flood helps nobody.
_MAX_REPORTED = 3


class FieldError(Exception):
    """A decoder found a field it cannot convert; ``path`` is relative to the span."""

    def __init__(self, path: str, message: str, reason: str = SCHEMA) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
        self.reason = reason


def join_loc(prefix: str, loc: Loc) -> str:
    """``("events", 0, "name")`` under ``spans[3]`` reads ``spans[3].events[0].name``."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else part
    return path


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required but missing"
    if kind == "extra_forbidden":
        return "is not a known field (check its spelling)"
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, BaseException):
        return str(cause)
    return f"{error['msg']}, got {show(error.get('input'))}"


def decode_error(exc: ValidationError, locate: Locate) -> SpanDecodeError:
    # A misspelt field also shows up as a missing one: the unknown name is the clue.
    errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
    reason = SCHEMA
    parts = []
    for error in errors[:_MAX_REPORTED]:
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, InvalidAttributeError) and cause.oversize:
            reason = OVERSIZE
        parts.append(f"{locate(tuple(error['loc']))}: {_message(error)}")
    if len(errors) > _MAX_REPORTED:
        parts.append(f"and {len(errors) - _MAX_REPORTED} more")
    return SpanDecodeError(reason, "; ".join(parts))


def join_path(prefix: str, path: str) -> str:
    """``spans[0]`` and ``attributes[2].value`` read ``spans[0].attributes[2].value``."""
    if not path:
        return prefix
    if not prefix or path.startswith("["):
        return prefix + path
    return f"{prefix}.{path}"


def field_decode_error(exc: FieldError, prefix: str) -> SpanDecodeError:
    return SpanDecodeError(
        exc.reason, f"{join_path(prefix, exc.path) or 'document'}: {exc.message}"
    )
