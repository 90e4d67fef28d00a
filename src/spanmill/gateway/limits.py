"""Per-key limits: how fast, and how many at once, one client may ask the gateway.

Each client (the id of its API key; every caller is ``anonymous`` where no key is
asked) has a token bucket of ``requests_per_s`` refilled continuously, holding at
most ``burst`` (one second's worth unless set), and at most ``max_concurrent``
requests in flight. A request past either is refused at once with 429 and a
``Retry-After``: one client cannot take the model from the others.

Limits are per gateway replica: with N replicas behind a Service a client gets
up to N times each limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    in_flight: int = 0


@dataclass
class Refusal:
    message: str
    retry_after_s: int


@dataclass
class KeyLimits:
    requests_per_s: float | None = None
    burst: float | None = None
    max_concurrent: int | None = None
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.requests_per_s is not None or self.max_concurrent is not None

    def _capacity(self) -> float:
        assert self.requests_per_s is not None
        return self.burst if self.burst is not None else max(1.0, self.requests_per_s)

    def admit(self, key: str) -> Refusal | None:
        """Take one request for ``key``: None when admitted (call :meth:`done` once it
        ends), else why not and when to come back."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            full = self._capacity() if self.requests_per_s is not None else 0.0
            bucket = self._buckets[key] = _Bucket(tokens=full, stamp=now)
        if self.max_concurrent is not None and bucket.in_flight >= self.max_concurrent:
            return Refusal(
                f"key {key!r} has {bucket.in_flight} requests in flight, its limit; "
                "wait for one to end",
                1,
            )
        if self.requests_per_s is not None:
            rate = self.requests_per_s
            bucket.tokens = min(self._capacity(), bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
            if bucket.tokens < 1.0:
                wait = (1.0 - bucket.tokens) / rate
                return Refusal(
                    f"key {key!r} is over its limit of {rate:g} requests/s",
                    max(1, math.ceil(wait)),
                )
            bucket.tokens -= 1.0
        bucket.in_flight += 1
        return None

    def done(self, key: str) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None and bucket.in_flight > 0:
            bucket.in_flight -= 1
