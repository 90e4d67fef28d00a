"""Prompts the gateway renders itself, for models that take text (the vLLM flavour).

The tokenizer of each base model is loaded once, on first use, off the event loop;
rendering and tokenising a long conversation runs off the loop as well, so one
large prompt never holds up other requests.
"""

from __future__ import annotations

import asyncio
import threading
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

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, reference: str) -> Any:
        with self._lock:
            found = self._loaded.get(reference)
            if found is not None:
                return found
            from transformers import AutoTokenizer

            from spanmill.models.resolve import resolve_model

            try:
                tokenizer = AutoTokenizer.from_pretrained(resolve_model(reference))
            except Exception as exc:  # a missing folder, no network, a broken file
                raise PromptError(
                    f"the tokenizer of {reference!r} cannot be loaded: {type(exc).__name__}: {exc}"
                ) from None
            self._loaded[reference] = tokenizer
            return tokenizer

    def _render(
        self, reference: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Prompt:
        from spanmill.serving.generation import render_prompt

        tokenizer = self.get(reference)
        try:
            text = render_prompt(tokenizer, messages, tools)
        except Exception as exc:  # the template refuses the conversation (roles, say)
            raise PromptError(
                f"the chat template of {reference!r} refused the messages: {exc}"
            ) from None
        # As the vLLM backend tokenises its text input: with the tokenizer's special tokens.
        return Prompt(text, list(tokenizer(text)["input_ids"]), tokenizer)

    async def render(
        self, reference: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Prompt:
        return await asyncio.to_thread(self._render, reference, messages, tools)
