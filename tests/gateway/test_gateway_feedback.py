"""POST /v1/feedback on the gateway, and the emitter's acknowledged delivery (no Kafka)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from spanmill import semconv as sc
from spanmill.config import GatewaySettings, KafkaSettings
from spanmill.feedback import trace_of_response_id
from spanmill.gateway.app import create_app
from spanmill.gateway.emitter import EmitterBusy, Outcome, SpanEmitter
from spanmill.gateway.metrics import GatewayMetrics
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.protocol import Choice, GenerationResult
from spanmill.spans import Span

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class FakeEmitter:
    """Records what the app emits; ``deliver`` answers as told."""

    def __init__(self) -> None:
        self.metrics: Any = None
        self.emitted: list[Span] = []
        self.delivered: list[Span] = []
        self.busy = False
        self.fail_index: int | None = None

    def start(self) -> None: ...

    def close(self) -> None: ...

    def emit(self, span: Span) -> None:
        self.emitted.append(span)

    async def deliver(self, spans: list[Span]) -> Outcome:
        if self.busy:
            raise EmitterBusy("the span queue is full")
        outcome: Outcome = [None] * len(spans)
        if self.fail_index is not None:
            outcome[self.fail_index] = TimeoutError("no ack")
        self.delivered.extend(s for s, o in zip(spans, outcome, strict=True) if o is None)
        return outcome


class EchoUpstream:
    url = "fake"

    async def generate(self, *args: Any) -> GenerationResult:
        return GenerationResult([Choice("hi", [104, 105], [0.0, 0.0], "stop")], [1, 2], "1")

    async def ready(self) -> bool:
        return True

    async def close(self) -> None: ...


@pytest.fixture
def emitter() -> FakeEmitter:
    return FakeEmitter()


def client_for(emitter: FakeEmitter, api_key: str | None = None) -> TestClient:
    settings = GatewaySettings(api_key=api_key)  # type: ignore[arg-type]
    table = RoutingTable.model_validate(
        {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
    )
    app = create_app(settings, emitter=emitter, upstream=EchoUpstream(), table=table)  # type: ignore[arg-type]
    return TestClient(app)


@pytest.fixture
def client(emitter: FakeEmitter) -> Iterator[TestClient]:
    with client_for(emitter) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"trace_id": TRACE, "value": 1}, "name"),
        ({"trace_id": TRACE, "name": "thumbs", "value": "great"}, "value"),
        ({"name": "thumbs", "value": 1}, "response_id"),
        ({"trace_id": "not-hex", "name": "thumbs", "value": 1}, "trace_id"),
        (
            [{"trace_id": TRACE, "name": "a", "value": 1}] * 3
            + [{"trace_id": TRACE[:-1], "name": "a", "value": 1}],
            "[3].trace_id",
        ),
    ],
)
def test_bad_bodies_give_400_naming_the_field(
    client: TestClient, emitter: FakeEmitter, body: object, param: str
) -> None:
    reply = client.post("/v1/feedback", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}: ")
    assert emitter.delivered == []  # a batch with one bad item is refused whole


def test_a_body_declared_over_the_limit_is_refused_unread(
    client: TestClient, emitter: FakeEmitter
) -> None:
    from spanmill.feedback import MAX_BODY_BYTES

    too_big = client.post(
        "/v1/feedback",
        content=b"[]",
        headers={"content-length": str(MAX_BODY_BYTES + 1), "content-type": "application/json"},
    )
    assert too_big.status_code == 413
    assert "over the limit" in too_big.json()["error"]["message"]


def test_a_chunked_body_over_the_feedback_limit_is_refused_unread_whatever_the_chat_limit() -> None:
    """Feedback keeps its own limit where chat bodies may be larger: a chunked body
    (no declared length) past it is refused as it arrives. The message names no size
    received: one that did would show the body was read whole first."""
    from spanmill.feedback import MAX_BODY_BYTES, too_large

    emitter = FakeEmitter()
    app = create_app(GatewaySettings(max_request_bytes=2 * MAX_BODY_BYTES), emitter=emitter,  # type: ignore[arg-type]
                     upstream=EchoUpstream())  # fmt: skip

    def chunked() -> Iterator[bytes]:
        yield b"["
        for _ in range(MAX_BODY_BYTES // 65536 + 1):
            yield b" " * 65536
        yield b"]"

    with TestClient(app) as http:
        for content in (chunked(), b"".join(chunked())):
            refused = http.post(
                "/v1/feedback", content=content, headers={"content-type": "application/json"}
            )
            assert refused.status_code == 413
            assert refused.json()["error"]["message"] == too_large().message
        metrics = http.get("/metrics").text
    assert 'spanmill_gateway_feedback_total{outcome="rejected"} 2.0' in metrics
    assert emitter.delivered == []


def test_json_nested_past_the_parser_is_400(client: TestClient) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # well under the size limit
    reply = client.post("/v1/feedback", content=deep, headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "nested too deeply" in reply.json()["error"]["message"]


def test_not_json_is_400(client: TestClient) -> None:
    reply = client.post("/v1/feedback", content=b"thumbs up")
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


def test_feedback_is_delivered_and_answered(client: TestClient, emitter: FakeEmitter) -> None:
    one = client.post("/v1/feedback", json={"trace_id": TRACE, "name": "resolved", "value": 1})
    assert one.status_code == 200, one.text
    batch = [
        {"response_id": "resp_foreign", "name": "thumbs", "value": False, "comment": "wrong"},
        {"trace_id": TRACE, "name": "csat", "value": 4.5, "source": "survey"},
    ]
    many = client.post("/v1/feedback", json=batch)
    assert many.status_code == 200 and many.json()["accepted"] == 2
    ids = one.json()["ids"] + many.json()["ids"]
    assert ids == [span.span_id for span in emitter.delivered] and len(set(ids)) == 3
    first, foreign, csat = emitter.delivered
    assert first.trace_id == TRACE and first.rewards[0].name == "resolved"
    assert foreign.attributes[sc.GEN_AI_RESPONSE_ID] == "resp_foreign"
    assert foreign.attributes[sc.GEN_AI_EVALUATION_EXPLANATION] == "wrong"
    assert csat.attributes[sc.SPANMILL_FEEDBACK_SOURCE] == "survey"
    for span in emitter.delivered:
        assert span.attributes[sc.SPANMILL_FEEDBACK_PRINCIPAL] == "anonymous"
        assert span.attributes[sc.CLIENT_ADDRESS] == "testclient"
        assert span.service_name == "spanmill-gateway"
    metrics = client.get("/metrics").text
    assert 'spanmill_gateway_feedback_total{outcome="accepted"} 3.0' in metrics


def test_feedback_on_a_completion_lands_in_its_trace(
    client: TestClient, emitter: FakeEmitter
) -> None:
    completion = client.post(
        "/v1/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
    )
    response_id = completion.json()["id"]
    assert trace_of_response_id(response_id) == TRACE
    assert emitter.emitted[0].response_id == response_id
    reply = client.post(
        "/v1/feedback", json={"response_id": response_id, "name": "thumbs", "value": True}
    )
    assert reply.json()["trace_ids"] == [TRACE]
    assert emitter.delivered[0].rewards[0].response_id == response_id


def test_auth_is_enforced_when_a_token_is_set(emitter: FakeEmitter) -> None:
    body = {"trace_id": TRACE, "name": "thumbs", "value": 1}
    with client_for(emitter, api_key="s3cret") as client:
        assert client.post("/v1/feedback", json=body).status_code == 401
        wrong = client.post("/v1/feedback", json=body, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "authentication_error"
        assert emitter.delivered == []
        ok = client.post("/v1/feedback", json=body, headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
    # The shared key (SPANMILL_GATEWAY_API_KEY) is known by the id "default".
    assert emitter.delivered[0].attributes[sc.SPANMILL_FEEDBACK_PRINCIPAL] == "default"


def test_503_with_retry_after_when_not_taken_or_not_acknowledged(
    client: TestClient, emitter: FakeEmitter
) -> None:
    body = [{"trace_id": TRACE, "name": "a", "value": i} for i in range(3)]
    emitter.busy = True
    busy = client.post("/v1/feedback", json=body)
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert busy.json()["delivered"] == [] and busy.json()["error"]["code"] == "busy"
    emitter.busy, emitter.fail_index = False, 1
    partial = client.post("/v1/feedback", json=body)
    assert partial.status_code == 503 and partial.json()["delivered"] == [0, 2]
    metrics = client.get("/metrics").text
    assert 'spanmill_gateway_feedback_total{outcome="unavailable"} 4.0' in metrics


# -- the emitter's acknowledged delivery ---------------------------------------------------


class FakeFuture:
    def __init__(self, failure: BaseException | None) -> None:
        self.failure = failure

    def add_callback(self, fn: Any, *args: Any) -> None:
        if self.failure is None:
            threading.Thread(target=fn, args=(*args, "metadata")).start()

    def add_errback(self, fn: Any, *args: Any) -> None:
        if self.failure is not None:
            threading.Thread(target=fn, args=(*args, self.failure)).start()


class FakeProducer:
    """Acknowledges every send from another thread, as kafka-python does; fails as told."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.refuse: set[int] = set()  # sends (by number) refused outright
        self.nack: set[int] = set()  # sends (by number) that Kafka does not acknowledge

    def send(
        self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]
    ) -> FakeFuture:
        number = len(self.sent)
        self.sent.append(key)
        if number in self.refuse:
            raise RuntimeError("buffer full")
        return FakeFuture(TimeoutError("no ack") if number in self.nack else None)

    def flush(self, timeout: float) -> None: ...

    def close(self, timeout: float) -> None: ...


def spans(count: int) -> list[Span]:
    return [
        Span(trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", name="s",
             start_time_unix_nano=1, end_time_unix_nano=1)
        for i in range(count)
    ]  # fmt: skip


def emitter_with(producer: FakeProducer | None, capacity: int = 10) -> SpanEmitter:
    emitter = SpanEmitter(KafkaSettings(), GatewayMetrics(), capacity)
    emitter._producer = emitter._feedback_producer = producer
    return emitter


def test_delivery_waits_for_every_acknowledgement() -> None:
    producer = FakeProducer()
    producer.refuse, producer.nack = {4}, {3}
    emitter = emitter_with(producer)
    emitter.start()
    try:
        assert asyncio.run(emitter.deliver(spans(3))) == [None, None, None]
        outcome = asyncio.run(emitter.deliver(spans(2)))
        assert [type(failure) for failure in outcome] == [TimeoutError, RuntimeError]
        assert producer.sent[:3] == [s.trace_id.encode() for s in spans(3)]  # keyed by trace
        assert emitter.emitted == 3
    finally:
        emitter.close()


def test_a_delivery_not_taken_in_time_is_withdrawn_unsent() -> None:
    producer = FakeProducer()
    emitter = emitter_with(producer, capacity=1)  # its thread not started: nothing drains
    with pytest.raises(EmitterBusy, match="within"):
        asyncio.run(emitter.deliver(spans(2), queue_wait_s=0.05))
    with pytest.raises(EmitterBusy, match="full"):  # the withdrawn one still fills the queue
        asyncio.run(emitter.deliver(spans(1)))
    emitter.start()
    try:
        assert asyncio.run(emitter.deliver(spans(1))) == [None]
        assert len(producer.sent) == 1  # the withdrawn delivery was skipped, never sent
    finally:
        emitter.close()


def test_stopping_while_kafka_was_never_reached_counts_what_is_left_and_answers_senders() -> None:
    """Kafka unreachable since the gateway started: at its stop, the calls' spans left
    in the queue are counted as dropped, and a feedback sender still waiting is told
    its delivery was refused (none of it was sent), instead of waiting for an answer."""
    from spanmill.stack.ports import free_port

    metrics = GatewayMetrics()
    emitter = SpanEmitter(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), metrics)
    emitter.start()
    for span in spans(5):
        emitter.emit(span)

    async def feedback() -> Outcome:
        return await emitter.deliver(spans(2), queue_wait_s=120)

    answered: list[Any] = []
    sender = threading.Thread(target=lambda: answered.append(asyncio.run(feedback())))
    sender.start()
    from spanmill.gateway.emitter import _Delivery

    # The feedback waits in the queue behind the spans (the first is with the thread,
    # trying Kafka) before the gateway stops.
    while not any(isinstance(item, _Delivery) for item in list(emitter._queue.queue)):
        threading.Event().wait(0.01)
    emitter.close(timeout=30)
    sender.join(30)
    assert not emitter._thread.is_alive()
    assert emitter.dropped == 5
    assert metrics.spans_dropped.labels("shutdown")._value.get() == 5
    assert [type(failure) for failure in answered[0]] == [EmitterBusy, EmitterBusy]
