"""Per-key rate and concurrency limits (no services: the app with a recording emitter)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from test_gateway_feedback import EchoUpstream, FakeEmitter

from spanmill.config import GatewaySettings
from spanmill.gateway.app import create_app
from spanmill.gateway.limits import KeyLimits
from spanmill.gateway.routing import RoutingTable
from spanmill.keys import key_line, new_key

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def test_the_bucket_refills_at_its_rate_and_holds_a_burst() -> None:
    now = [0.0]
    limits = KeyLimits(requests_per_s=2.0, burst=3.0, clock=lambda: now[0])
    assert [limits.admit("a") for _ in range(3)] == [None, None, None]
    refused = limits.admit("a")
    assert refused is not None and refused.retry_after_s == 1 and "2 requests/s" in refused.message
    assert limits.admit("b") is None  # another key has a bucket of its own
    now[0] = 0.5  # half a second: one more token
    assert limits.admit("a") is None and limits.admit("a") is not None
    now[0] = 100.0  # never more than the burst
    assert [limits.admit("a") is None for _ in range(4)] == [True, True, True, False]


def test_requests_in_flight_are_counted_until_done() -> None:
    limits = KeyLimits(max_concurrent=2)
    assert limits.admit("a") is None and limits.admit("a") is None
    assert limits.admit("a") is not None
    limits.done("a")
    assert limits.admit("a") is None


class HeldUpstream(EchoUpstream):
    """Answers once released: requests stay in flight as long as the test wants."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def generate(self, *args: Any) -> Any:
        self.started += 1
        await self.release.wait()
        return await super().generate(*args)

    async def stream(self, *args: Any) -> Any:
        yield await self.generate(*args)


def test_one_client_at_its_limit_does_not_hold_up_another(tmp_path: Path) -> None:
    busy, other = new_key(), new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{key_line('busy', busy)}\n{key_line('other', other)}\n")
    table = RoutingTable.model_validate(
        {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
    )
    settings = GatewaySettings(client_keys_file=keys_file, key_max_concurrent=1,
                               key_requests_per_s=100)  # type: ignore[call-arg]  # fmt: skip
    upstream = HeldUpstream()
    emitter = FakeEmitter()
    app = create_app(settings, emitter=emitter, upstream=upstream, table=table)  # type: ignore[arg-type]

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

            def ask(key: str, **extra: Any) -> Any:
                return client.post("/v1/chat/completions", json={**CHAT, **extra},
                                   headers={"authorization": f"Bearer {key}"})  # fmt: skip

            first = asyncio.ensure_future(ask(busy))
            while upstream.started < 1:
                await asyncio.sleep(0.01)
            second = await ask(busy)  # refused at once: busy has one in flight
            streamed = await ask(busy, stream=True)
            third = asyncio.ensure_future(ask(other))  # another key is let in
            while upstream.started < 2:
                await asyncio.sleep(0.01)
            upstream.release.set()
            done = [await first, second, streamed, await third]
            done.append(await ask(busy))  # busy's first one ended: its slot is free
            done.append(await ask(busy, stream=True))
            done.append(await ask(busy))  # ... and the stream's slot, once it ended
            return done

    first, second, streamed, third, after, stream_after, after_stream = asyncio.run(scenario())
    assert first.status_code == 200 and third.status_code == 200
    for refused in (second, streamed):
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_exceeded"
        assert "'busy'" in refused.json()["error"]["message"]
    assert after.status_code == 200
    assert stream_after.status_code == 200 and "[DONE]" in stream_after.text
    assert after_stream.status_code == 200
