"""Carry the agent's trace context to the gateway through any HTTP client.

The gateway emits a span for every LLM call. When the request carries a W3C
``traceparent`` header, that span joins the agent's trace as a child of whatever
span is current (the episode, usually), so the episode's LLM calls, tool calls
and rewards are one trace. Use it with the OpenAI client::

    client = openai.OpenAI(base_url=gateway_url, http_client=traced_http_client())

It injects with the globally configured OpenTelemetry propagator (W3C trace
context and baggage by default), so it works alike under other instrumentation.
"""

from __future__ import annotations

from typing import Any

import httpx
from opentelemetry import propagate


def inject_trace_context(request: httpx.Request) -> None:
    """Set ``traceparent`` (and ``tracestate``) on ``request`` from the current context."""
    propagate.inject(request.headers)


async def _inject_async(request: httpx.Request) -> None:
    inject_trace_context(request)


def _hooks(kwargs: dict[str, Any], hook: Any) -> dict[str, list[Any]]:
    hooks = {key: list(value) for key, value in (kwargs.pop("event_hooks", None) or {}).items()}
    hooks.setdefault("request", []).insert(0, hook)
    hooks.setdefault("response", [])
    return hooks


def traced_http_client(**kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` that sends the current trace context with every request.

    Keyword arguments go to ``httpx.Client``; request hooks given in
    ``event_hooks`` run after the injection.
    """
    return httpx.Client(event_hooks=_hooks(kwargs, inject_trace_context), **kwargs)


def traced_async_http_client(**kwargs: Any) -> httpx.AsyncClient:
    """The ``httpx.AsyncClient`` counterpart of :func:`traced_http_client`."""
    return httpx.AsyncClient(event_hooks=_hooks(kwargs, _inject_async), **kwargs)
