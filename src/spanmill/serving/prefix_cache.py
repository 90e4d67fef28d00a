"""Reuse of attention keys and values for prompts that begin with tokens seen before.

An agent's conversation grows by turns: the prompt of its next call is the last
prompt, the reply and a tool result, and every conversation of one agent opens with
the same system prompt and tool list. Computing the keys and values of those tokens
again is most of a CPU's generation time for short replies (a prompt token costs
about a third of a decoded row-token, and a calculator turn holds hundreds of
prompt tokens for a reply of tens). vLLM calls the remedy automatic prefix caching;
this is the same idea for the transformers engine: after each generation, every
row's keys and values are kept under its token ids, up to a byte budget, least
recently used first out; a later prompt starts from the longest kept run of tokens
it begins with and computes only the rest.

Keys are stored after rotary position encoding, at the positions their tokens had
(0 onwards), which are the positions a prompt beginning with the same tokens gives
them again: where a row's kept tokens then sit in a padded batch does not matter,
since the attention mask hides the padding and positions come from the mask.

Weights must not change under a cache: a generator over a policy being trained
keeps its prefixes for one version of the weights, and a new version starts with
none (:class:`spanmill.train.policy.PolicyServer`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Entry:
    """One row's tokens and, per layer, their keys and values: ``(heads, tokens, dim)``."""

    tokens: np.ndarray
    keys: list[Any]
    values: list[Any]
    nbytes: int = 0

    def __post_init__(self) -> None:
        self.nbytes = sum(int(t.numel() * t.element_size()) for t in (*self.keys, *self.values))


@dataclass
class CacheStats:
    """Prompt tokens taken from the cache and computed, bytes kept, entries evicted."""

    reused_tokens: int = 0
    computed_tokens: int = 0
    stored_bytes: int = 0
    evictions: int = 0


class PrefixCache:
    """Kept keys and values by token ids, within ``budget_bytes`` (0: keep nothing)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next_id = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: list[int]) -> tuple[int, Entry | None]:
        """The longest kept run of tokens that ``tokens`` begins with, at most all but
        its last token (generation needs one prompt token to compute), and its entry."""
        usable = len(tokens) - 1
        if not self.enabled or usable <= 0 or not self._entries:
            return 0, None
        wanted = np.asarray(tokens, dtype=np.int64)
        best, best_id = 0, -1
        for entry_id, entry in self._entries.items():
            n = min(usable, len(entry.tokens))
            if n <= best:
                continue
            differ = np.flatnonzero(entry.tokens[:n] != wanted[:n])
            common = int(differ[0]) if differ.size else n
            if common > best:
                best, best_id = common, entry_id
        if best_id < 0:
            return 0, None
        self._entries.move_to_end(best_id)
        return best, self._entries[best_id]

    def store(self, tokens: list[int], keys: list[Any], values: list[Any]) -> None:
        """Keep ``tokens``' keys and values; an entry whose tokens the new one begins with
        is dropped (the new one serves every prompt it served)."""
        if not self.enabled or not tokens:
            return
        entry = Entry(np.asarray(tokens, dtype=np.int64), keys, values)
        if entry.nbytes > self.budget_bytes:
            return
        covered = [
            entry_id
            for entry_id, old in self._entries.items()
            if len(old.tokens) <= len(entry.tokens)
            and np.array_equal(old.tokens, entry.tokens[: len(old.tokens)])
        ]
        for entry_id in covered:
            self._drop(entry_id)
        self._entries[self._next_id] = entry
        self._next_id += 1
        self.stats.stored_bytes += entry.nbytes
        while self.stats.stored_bytes > self.budget_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.stats.evictions += 1

    def store_row(self, tokens: list[int], past: Any, row: int, columns: Any) -> None:
        """Keep ``tokens`` with the keys and values of one row of a batch's cache
        (``past``, a transformers cache): those of its ``columns``, in order."""
        self.store(
            tokens,
            [layer.keys[row].index_select(1, columns) for layer in past.layers],
            [layer.values[row].index_select(1, columns) for layer in past.layers],
        )

    def _drop(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.stats.stored_bytes -= entry.nbytes
