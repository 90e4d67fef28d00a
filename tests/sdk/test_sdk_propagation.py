"""Requests through the traced HTTP clients carry the episode's W3C trace context."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanmill import sdk


@pytest.fixture(autouse=True)
def tracing() -> Iterator[None]:
    sdk.configure("test-agent", exporter=InMemorySpanExporter(), set_global=False)
    try:
        yield
    finally:
        sdk.shutdown()


class Recorder:
    """A mock transport that keeps the headers of every request it answers."""

    def __init__(self, body: dict[str, object] | None = None) -> None:
        self.headers: list[httpx.Headers] = []
        self.body = body or {"ok": True}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.headers.append(request.headers)
        return httpx.Response(200, json=self.body)

    def traceparent(self, index: int = -1) -> tuple[str, str, str, str]:
        version, trace_id, span_id, flags = self.headers[index]["traceparent"].split("-")
        return version, trace_id, span_id, flags


def episode_span_id(ep: sdk.Episode) -> str:
    return format(ep.span.get_span_context().span_id, "016x")


def test_requests_inside_an_episode_carry_its_trace() -> None:
    recorder = Recorder()
    with (
        sdk.traced_http_client(transport=httpx.MockTransport(recorder)) as client,
        sdk.episode("calculator") as ep,
    ):
        client.get("http://gateway.test/v1/models")
    version, trace_id, span_id, flags = recorder.traceparent()
    assert version == "00"
    assert int(flags, 16) & 1, "the sampled flag must be set"
    assert trace_id == ep.trace_id
    # The episode is the current span, so the gateway's span becomes its child.
    assert span_id == episode_span_id(ep)


def test_requests_outside_any_span_carry_no_trace() -> None:
    recorder = Recorder()
    with sdk.traced_http_client(transport=httpx.MockTransport(recorder)) as client:
        client.get("http://gateway.test/v1/models")
    assert "traceparent" not in recorder.headers[0]


def test_own_event_hooks_still_run_after_the_injection() -> None:
    recorder = Recorder()
    seen: list[str | None] = []
    with (
        sdk.traced_http_client(
            transport=httpx.MockTransport(recorder),
            event_hooks={
                "request": [lambda request: seen.append(request.headers.get("traceparent"))]
            },
        ) as client,
        sdk.episode("calculator") as ep,
    ):
        client.get("http://gateway.test/")
    assert seen and seen[0] is not None and ep.trace_id in seen[0]


def test_the_async_client_injects_too() -> None:
    recorder = Recorder()

    async def call() -> str:
        async with sdk.traced_async_http_client(transport=httpx.MockTransport(recorder)) as client:
            with sdk.episode("calculator") as ep:
                await client.get("http://gateway.test/v1/models")
        return ep.trace_id

    trace_id = asyncio.run(call())
    assert recorder.traceparent()[1] == trace_id


def test_the_openai_client_sends_the_trace_through_it() -> None:
    recorder = Recorder(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "calculator",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "5"},
                    "finish_reason": "stop",
                }
            ],
        }
    )
    client = openai.OpenAI(
        base_url="http://gateway.test/v1",
        api_key="unused",
        http_client=sdk.traced_http_client(transport=httpx.MockTransport(recorder)),  # type: ignore[arg-type]
    )
    with sdk.episode("calculator") as ep:
        reply = client.chat.completions.create(
            model="calculator", messages=[{"role": "user", "content": "2 + 3?"}]
        )
    assert reply.choices[0].message.content == "5"
    assert recorder.traceparent()[1:3] == (ep.trace_id, episode_span_id(ep))
