"""Bounded work per request at the gateway: a body over the limit is refused unread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient
from test_gateway_feedback import EchoUpstream, FakeEmitter

from spanmill import semconv as sc
from spanmill.config import GatewaySettings
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable

LIMIT = 2048
JSON = {"content-type": "application/json"}


class CountingUpstream(EchoUpstream):
    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, *args: Any) -> Any:
        self.calls += 1
        return await super().generate(*args)


def client(upstream: CountingUpstream) -> TestClient:
    table = RoutingTable.model_validate(
        {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
    )
    settings = GatewaySettings(max_request_bytes=LIMIT)
    app = create_app(settings, emitter=FakeEmitter(), upstream=upstream, table=table)  # type: ignore[arg-type]
    return TestClient(app)


def body(chars: int) -> bytes:
    return (
        '{"model": "echo", "messages": [{"role": "user", "content": "' + "x" * chars + '"}]}'
    ).encode()


def chunked(data: bytes) -> Iterator[bytes]:
    """A body sent in pieces with no declared length (chunked transfer encoding)."""
    for start in range(0, len(data), 512):
        yield data[start : start + 512]


def test_a_body_over_the_limit_is_refused_with_413_and_never_reaches_triton() -> None:
    upstream = CountingUpstream()
    with client(upstream) as http:
        declared = http.post("/v1/chat/completions", content=body(LIMIT), headers=JSON)
        assert declared.status_code == 413
        assert declared.json()["error"]["message"] == (
            f"the request body is over the limit of {LIMIT} bytes"
        )
        streamed = http.post("/v1/chat/completions", content=chunked(body(LIMIT)), headers=JSON)
        assert streamed.status_code == 413
        assert upstream.calls == 0
        # Under the limit, with its length declared or not, it is served.
        small = body(LIMIT // 2)
        for content in (small, chunked(small)):
            served = http.post("/v1/chat/completions", content=content, headers=JSON)
            assert served.status_code == 200
        assert upstream.calls == 2


def test_a_bad_body_is_refused_with_400_naming_what_is_wrong_and_never_reaches_triton() -> None:
    upstream = CountingUpstream()
    with client(upstream) as http:
        broken = http.post("/v1/chat/completions", content=b'{"model": "echo", "mess', headers=JSON)
        assert broken.status_code == 400
        error = broken.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("invalid request: Invalid JSON")
        wrong = http.post(
            "/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "robot", "content": "hi"}],
                  "temperature": 3},
        )  # fmt: skip
        assert wrong.status_code == 400
        message = wrong.json()["error"]["message"]
        assert "messages.0.role: " in message and "temperature: " in message
        assert http.post("/v1/chat/completions", content=body(10), headers=JSON).status_code == 200
        # The request's schema is still in the gateway's OpenAPI document.
        schema = http.get("/openapi.json").json()["paths"]["/v1/chat/completions"]["post"]
        assert (
            "messages"
            in schema["requestBody"]["content"]["application/json"]["schema"]["properties"]
        )
    assert upstream.calls == 1


class BrokenUpstream(EchoUpstream):
    """An upstream with a bug: it raises what no upstream error names."""

    async def generate(self, *args: Any) -> Any:
        raise KeyError("TEXT")

    async def stream(self, *args: Any) -> Any:
        yield ["Hel"]
        raise KeyError("TEXT")


def test_a_fault_of_the_gateways_own_is_answered_and_recorded() -> None:
    """Not a bare 500 from the server, and no call unrecorded: the API's error shape,
    and the call's span with its error."""
    emitter = FakeEmitter()
    table = RoutingTable.model_validate(
        {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
    )
    app = create_app(GatewaySettings(), emitter=emitter, upstream=BrokenUpstream(), table=table)  # type: ignore[arg-type]
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as http:
        whole = http.post("/v1/chat/completions", json=chat)
        assert whole.status_code == 500
        assert whole.json()["error"]["message"] == "the gateway failed: KeyError: 'TEXT'"
        streamed = http.post("/v1/chat/completions", json={**chat, "stream": True})
        assert streamed.status_code == 200  # the stream had begun
        events = [line for line in streamed.text.splitlines() if line.startswith("data:")]
        assert "the gateway failed: KeyError" in events[-2] and events[-1] == "data: [DONE]"
    assert [span.status_message for span in emitter.emitted] == [
        "the gateway failed: KeyError: 'TEXT'"
    ] * 2
    # The status each was answered with: the rollout's span signals count 5xx alone.
    assert [span.attributes[sc.ERROR_TYPE] for span in emitter.emitted] == ["500"] * 2


def test_a_client_that_leaves_before_a_plain_answer_stops_its_generation() -> None:
    """Nothing is written to a plain answer's client until its end, so nothing else
    would notice it gone: its generation would hold Triton, and its request slot, on."""
    import asyncio
    import json

    class Waiting(EchoUpstream):
        def __init__(self) -> None:
            self.started: asyncio.Event | None = None
            self.cancelled = False

        async def generate(self, *args: Any) -> Any:
            assert self.started is not None
            self.started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled = True  # the call to Triton is closed: generation stops
                raise

    emitter, upstream = FakeEmitter(), Waiting()
    table = RoutingTable.model_validate(
        {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
    )
    app = create_app(GatewaySettings(), emitter=emitter, upstream=upstream, table=table)  # type: ignore[arg-type]
    body = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "hi"}]}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}  # fmt: skip

    async def scenario() -> list[Any]:
        upstream.started = asyncio.Event()
        left = asyncio.Event()
        read = False
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        call = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(upstream.started.wait(), 30)
        left.set()  # the client goes away mid-generation
        await asyncio.wait_for(call, 30)
        return sent

    sent = asyncio.run(scenario())
    assert upstream.cancelled
    assert sent[0]["status"] == 499
    (span,) = emitter.emitted
    assert span.status_message == "the client closed the connection before the answer ended"
    assert span.attributes[sc.ERROR_TYPE] == "499"


def test_a_stream_stalled_on_its_head_still_ends_its_answer() -> None:
    """A client whose connection takes not even the response's head (its buffers full):
    the answer's generator had not begun, and closing it would have run none of its
    ending (the call recorded, the stream to Triton closed). A send that never returns
    stands for that client."""
    import asyncio

    from starlette.background import BackgroundTask

    from spanmill.gateway.app import _StreamedAnswer

    ended: list[str] = []

    async def answer() -> Any:
        try:
            yield "data: first\n\n"
            yield "data: second\n\n"
        except BaseException:
            ended.append("recorded as a client gone")
            raise
        finally:
            ended.append("stream to Triton closed")

    async def scenario() -> None:
        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                await asyncio.Event().wait()  # the head never leaves

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        response = _StreamedAnswer(
            answer(), write_timeout_s=0.2, media_type="text/event-stream", headers={},
            background=BackgroundTask(lambda: ended.append("slot freed")),
        )  # fmt: skip
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        await asyncio.wait_for(response(scope, receive, send), 30)

    asyncio.run(scenario())
    assert ended == ["slot freed", "recorded as a client gone", "stream to Triton closed"]
