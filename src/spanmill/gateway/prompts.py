"""Prompts the gateway renders itself, for models that take text (the vLLM flavour).

The tokenizer of each base model is loaded once, on first use, off the event loop;
rendering and tokenising a long conversation runs off the loop as well, so one
large prompt never holds up other requests. Each base model loads under a lock of its
own, so a slow load (a folder fetched from the object store) holds up only the calls
that need it, and a load that failed is not tried again for ``retry_after_s``: calls
in the meantime are refused at once instead of each starting the download again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from spanmill.errors import SpanmillError


class PromptError(SpanmillError):
    """A base model's tokenizer cannot be loaded, or a conversation cannot be rendered."""


@dataclass(frozen=True)
class Prompt:
    text: str
    token_ids: list[int]
    tokenizer: Any


class Tokenizers:
    """Tokenizers by base model reference (a catalog name, an s3:// folder, a hub id or
    a path), each loaded once."""

    def __init__(self, retry_after_s: float = 30.0) -> None:
        self.retry_after_s = retry_after_s
        self._loaded: dict[str, Any] = {}
        self._failed: dict[str, tuple[float, str]] = {}  # until when, and why
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, reference: str) -> Any:
        found = self._loaded.get(reference)
        if found is not None:
            return found
        with self._guard:
            lock = self._locks.setdefault(reference, threading.Lock())
        with lock:
            found = self._loaded.get(reference)
            if found is not None:
                return found
            failed = self._failed.get(reference)
            if failed is not None and time.monotonic() < failed[0]:
                raise PromptError(failed[1])
            from transformers import AutoTokenizer

            from spanmill.models.resolve import resolve_model

            try:
                tokenizer = AutoTokenizer.from_pretrained(resolve_model(reference))
            except Exception as exc:  # a missing folder, no network, a broken file
                why = (
                    f"the tokenizer of {reference!r} cannot be loaded: {type(exc).__name__}: "
                    f"{exc} (tried again after {self.retry_after_s:g} s)"
                )
                self._failed[reference] = (time.monotonic() + self.retry_after_s, why)
                raise PromptError(why) from None
            self._failed.pop(reference, None)
            self._loaded[reference] = tokenizer
            return tokenizer

    def _render(
        self, reference: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Prompt:
        from spanmill.serving.generation import render_prompt

        tokenizer = self.get(reference)
        try:
            text = render_prompt(tokenizer, messages, tools)
            # As the vLLM backend tokenises its text input: with its special tokens.
            token_ids = list(tokenizer(text)["input_ids"])
        except Exception as exc:  # the template refuses the conversation (roles, say)
            raise PromptError(
                f"the chat template of {reference!r} refused the messages: {exc}"
            ) from None
        return Prompt(text, token_ids, tokenizer)

    async def render(
        self, reference: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Prompt:
        return await asyncio.to_thread(self._render, reference, messages, tools)
