"""Dead letters: records the collector cannot take, kept whole with the reason why.

A dead letter is the original record's value and key, untouched, on the
dead-letter topic, with the original headers and these added (names in
:mod:`spanmill.semconv`): reason (a short code), detail (what is wrong, naming the
field), source (``<topic>/<partition>/<offset>``), when it failed and which
collector refused it. Delivery is at least once: a collector that crashes after
sending a dead letter but before committing sends it again.

A dead letter the topic itself refuses (larger than the broker accepts, say), or
that the topic has not taken for ``write_retry_s`` (the topic missing, its broker
down), is kept in the store under ``_dead_letters/`` instead, and counted; nothing is
dropped silently, and one dead letter does not hold back every partition's commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from spanmill import semconv as sc
from spanmill.store.layout import fingerprint

MAX_DETAIL_BYTES: Final = 4096


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    reason: str
    detail: str

    @property
    def source(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def fingerprint(self) -> str:
        """What tells this record from a new log's record at the same offset."""
        return fingerprint(self.timestamp_ms, self.key, self.value)

    def dlq_headers(self, collector_id: str, now_ms: int | None = None) -> list[tuple[str, bytes]]:
        """The original headers, then the collector's (original ones of those names dropped)."""
        ours = {
            sc.DLQ_HEADER_REASON: self.reason.encode(),
            sc.DLQ_HEADER_DETAIL: self.detail.encode()[:MAX_DETAIL_BYTES],
            sc.DLQ_HEADER_SOURCE: self.source.encode(),
            sc.DLQ_HEADER_FAILED_AT: str(
                now_ms if now_ms is not None else int(time.time() * 1000)
            ).encode(),
            sc.DLQ_HEADER_COLLECTOR: collector_id.encode(),
        }
        kept = [(name, value) for name, value in self.headers if name not in ours]
        return kept + list(ours.items())

    def meta(self, collector_id: str) -> dict[str, object]:
        """What a dead letter kept in the store says about itself."""
        return {
            "source": self.source,
            "key": self.key.hex() if self.key is not None else None,
            "headers": {name: value.hex() for name, value in self.headers},
            "reason": self.reason,
            "detail": self.detail,
            "collector": collector_id,
            "failed_at_ms": int(time.time() * 1000),
        }
