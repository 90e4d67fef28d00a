"""Exceptions a user can act on: each says what failed, on which input, and what to do."""

from __future__ import annotations

from typing import Any


class SpanmillError(Exception):
    """Base class for every error spanmill raises on purpose."""


class ConfigError(SpanmillError):
    """A setting is missing or invalid; the message names the setting."""


class StackError(SpanmillError):
    """A service of the local embedded stack could not be started, reached or stopped."""


class ModelError(SpanmillError):
    """A base model could not be found, fetched or converted."""


def error_body(
    message: str, kind: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON error body of spanmill's HTTP APIs, in OpenAI's shape.

    OpenAI-style clients (the ``openai`` SDK among them) read ``error.message`` and
    ``error.param`` to say what was wrong; ``param`` names the offending field.
    """
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
