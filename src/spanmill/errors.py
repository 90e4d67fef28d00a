"""Exceptions a user can act on: each says what failed, on which input, and what to do."""

from __future__ import annotations


class SpanmillError(Exception):
    """Base class for every error spanmill raises on purpose."""


class ConfigError(SpanmillError):
    """A setting is missing or invalid; the message names the setting."""


class StackError(SpanmillError):
    """A service of the local embedded stack could not be started, reached or stopped."""


class ModelError(SpanmillError):
    """A base model could not be found, fetched or converted."""
