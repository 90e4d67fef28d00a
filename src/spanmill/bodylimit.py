"""Bounded request bodies for spanmill's HTTP services, as a plain ASGI middleware.

A body over its route's limit is refused with 413 before the app reads it: by its
declared length at once, else (a chunked body, which declares none) as soon as the
bytes received pass the limit, so that no request can make a service hold more than
that in memory. The gateway and the collector's receiver both sit behind it, each
with its own limits and its own shape of refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Scope = dict[str, Any]


@dataclass(frozen=True)
class Limit:
    """A route's bound on request bodies, in bytes, and the response that refuses a body
    past it (an ASGI app, from the request's scope and the bound)."""

    bytes: int
    refuse: Callable[[Scope, int], Any]


class BodyLimit:
    """``limits``: by path; ``default``: every other path's (None: no limit)."""

    def __init__(self, app: Any, limits: Mapping[str, Limit], default: Limit | None = None) -> None:
        self.app = app
        self.limits = dict(limits)
        self.default = default

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        bound = self.limits.get(scope["path"], self.default)
        if bound is None:
            await self.app(scope, receive, send)
            return
        limit = bound.bytes
        declared = header(scope, b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > limit:
                await bound.refuse(scope, limit)(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server holds the body to that length
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await bound.refuse(scope, limit)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return whole
            return await receive()

        await self.app(scope, replay, send)


def header(scope: Scope, name: bytes) -> bytes | None:
    """A request header's raw value from its scope (None where absent); ``name`` in
    lower case, as ASGI servers give header names."""
    return next((v for k, v in scope["headers"] if k == name), None)
