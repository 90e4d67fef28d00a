"""Requests made to hurt the gateway: each is refused or served, and none costs it more
than its own answer (no metric series of its own, no lost span, no blocked emitter)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_gateway_feedback import TRACE, EchoUpstream, FakeEmitter, FakeProducer, emitter_with
from test_gateway_limits import CountingUpstream

from spanmill import feedback
from spanmill.config import GatewaySettings
from spanmill.gateway.app import create_app
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.protocol import Choice, GenerationResult

TABLE = {"routes": {"echo": {"triton_model": "echo", "backends": [{"version": "1", "weight": 1}]}}}
HI = [{"role": "user", "content": "hi"}]


def client(emitter: FakeEmitter, upstream: Any = None, **settings: Any) -> TestClient:
    app = create_app(
        GatewaySettings(**settings),
        emitter=emitter,  # type: ignore[arg-type]
        upstream=upstream or EchoUpstream(),
        table=RoutingTable.model_validate(TABLE),
    )
    return TestClient(app)


def test_a_model_name_the_gateway_does_not_route_is_never_a_metric_label() -> None:
    """Each label value is a series held for good: a client sending a new (or a
    megabyte-long) model name with every call would grow the gateway without bound."""
    with client(FakeEmitter()) as http:
        for i in range(20):
            name = f"no-such-model-{i}-" + "x" * 10_000
            answer = http.post("/v1/chat/completions", json={"model": name, "messages": HI})
            assert answer.status_code == 404
            assert len(answer.text) < 1_000  # the name is not echoed whole either
        shown = http.get("/metrics").text
    assert "no-such-model" not in shown
    assert 'model="(unrouted)",status="404",version=""} 20.0' in shown
    assert len(shown) < 50_000


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stop": ""}, "stop"),
        ({"stop": ["end", ""]}, "stop"),
        ({"max_tokens": 2**31}, "max_tokens"),  # Triton's INT32 would wrap it to a small one
        ({"max_completion_tokens": 10**26}, "max_completion_tokens"),
        ({"seed": 2**63}, "seed"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": "x"}]}]},
         "messages.0.tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}]},
         "messages.0.tool_calls"),
        ({"messages": [{"role": "user", "content": "hi", "name": ["example_user"]}]},
         "messages.0.name"),
    ],
)  # fmt: skip
def test_a_body_no_model_or_span_could_take_is_a_400_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    """Before: a 500 with no span (an empty stop, a tool call without its function
    object), or a 200 whose span was never built (a token limit past 64 bits, a name
    that is not a string), or a limit Triton would wrap round."""
    emitter, upstream = FakeEmitter(), CountingUpstream()
    with client(emitter, upstream) as http:
        answer = http.post("/v1/chat/completions", json={"model": "echo", "messages": HI, **change})
        assert answer.status_code == 400, answer.text
        assert f"{field}: " in answer.json()["error"]["message"]
    assert upstream.calls == 0


def test_a_call_whose_span_cannot_be_built_is_answered_and_the_loss_counted() -> None:
    """What no span can hold gets past the schema (an upstream answering with a token
    id past 64 bits, here): the client still has its answer, the span is counted as
    dropped, and the gateway goes on recording the calls after it."""

    class OddTokens(EchoUpstream):
        calls = 0

        async def generate(self, *args: Any) -> GenerationResult:
            self.calls += 1
            ids = [2**70] if self.calls == 1 else [104, 105]
            return GenerationResult([Choice("hi", ids, [0.0] * len(ids), "stop")], [1, 2], "1")

    emitter = FakeEmitter()
    with client(emitter, OddTokens()) as http:
        first = http.post("/v1/chat/completions", json={"model": "echo", "messages": HI})
        second = http.post("/v1/chat/completions", json={"model": "echo", "messages": HI})
        shown = http.get("/metrics").text
    assert first.status_code == second.status_code == 200
    assert first.json()["choices"][0]["message"]["content"] == "hi"
    assert len(emitter.emitted) == 1  # the second call's span
    assert 'spanmill_gateway_spans_dropped_total{reason="unbuildable"} 1.0' in shown


def test_feedback_with_a_lone_surrogate_is_a_400_not_a_retry_forever() -> None:
    """JSON's ``\\ud800`` escape parses to a string no span can encode: before, the
    gateway answered 503 with Retry-After for an item that could never be sent."""
    body = json.dumps(
        [{"trace_id": TRACE, "name": "ok", "value": 1}, {"trace_id": TRACE, "name": "a\ud800",
                                                          "value": 1}]
    ).encode()  # fmt: skip
    assert b"\\ud800" in body
    with pytest.raises(feedback.FeedbackError, match=r"\[1\]\.name: holds a lone surrogate"):
        feedback.parse_feedback_body(body)
    emitter = FakeEmitter()
    with client(emitter) as http:
        answer = http.post(
            "/v1/feedback", content=body, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 400
    assert "[1].name" in answer.text and "retry-after" not in answer.headers
    assert emitter.delivered == []  # nothing of the batch was sent: it may be sent again whole


def test_feedback_counts_against_the_callers_limits() -> None:
    """Feedback from one key cannot flood the emitter its calls share: past its
    concurrency or rate, a 429 with Retry-After, as for its calls."""
    emitter = FakeEmitter()
    item = {"trace_id": TRACE, "name": "thumbs", "value": 1}
    with client(emitter, key_requests_per_s=0.001, key_burst=2) as http:
        answers = [http.post("/v1/feedback", json=item) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 429, 429]
    assert answers[2].headers["retry-after"]
    assert len(emitter.delivered) == 2


def test_a_producer_that_cannot_take_one_item_is_not_asked_for_the_rest() -> None:
    """A full producer buffer blocks each send for ``max_block`` seconds: a thousand
    items would hold the emitter thread (and every call's span behind it) that many
    times over. The first refusal answers the rest of the delivery at once."""
    producer = FakeProducer()
    producer.refuse = {1}
    emitter = emitter_with(producer)
    emitter.start()
    try:
        outcome = asyncio.run(emitter.deliver(spans_of(5)))
    finally:
        emitter.close()
    assert outcome[0] is None
    assert all(isinstance(failure, RuntimeError) for failure in outcome[1:])
    assert len(producer.sent) == 2  # the first, and the one refused: no third try


def spans_of(count: int) -> list[Any]:
    from test_gateway_feedback import spans

    return spans(count)


def test_a_call_too_large_for_one_record_is_recorded_without_its_token_ids() -> None:
    """A long-context call (its prompt's token ids, its messages) over Kafka's record
    limit was dropped whole: served, never in a dataset. Now the token ids go first, then
    the prompt's messages, and the span says which; only a span over the limit even so
    is dropped, and counted."""
    from spanmill import semconv as sc
    from spanmill.config import KafkaSettings
    from spanmill.gateway.emitter import SpanEmitter
    from spanmill.gateway.llm_span import build_llm_span
    from spanmill.gateway.metrics import GatewayMetrics
    from spanmill.spans import decode_otlp_protobuf

    values: list[bytes] = []

    class Keeping(FakeProducer):
        def send(self, topic: str, key: bytes, value: bytes, headers: Any) -> Any:
            values.append(value)
            return super().send(topic, key, value, headers)

    def call(prompt_chars: int, answer_chars: int) -> Any:
        choice = {"message": {"role": "assistant", "content": "a" * answer_chars},
                  "finish_reason": "stop", "token_ids": list(range(20_000)),
                  "logprobs": [-0.5] * 20_000}  # fmt: skip
        return build_llm_span(
            trace_id=TRACE, parent_span_id=None, span_id="1" * 16, start_ns=1, end_ns=2,
            requested_model="echo", triton_model="echo", version="1", lora_name=None,
            request_messages=[{"role": "user", "content": "q" * prompt_chars}],
            params={"temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "stop": [],
                    "tools": None},
            metadata=None, traffic=None, client="anonymous", response_id="chatcmpl-1",
            choice=choice, prompt_token_ids=list(range(30_000)), token_ids_source=None,
        )  # fmt: skip

    metrics = GatewayMetrics()
    emitter = SpanEmitter(KafkaSettings(max_message_bytes=100_000), metrics)
    emitter._producer = emitter._feedback_producer = Keeping()
    emitter.start()
    try:
        for span in (call(1_000, 100), call(200_000, 100), call(1_000, 200_000)):
            emitter.emit(span)
    finally:
        emitter.close()
    sent = [decode_otlp_protobuf(value)[0] for value in values]
    assert [s.attributes.get(sc.SPANMILL_SPAN_REDUCED) for s in sent] == [
        [sc.SPANMILL_PROMPT_TOKEN_IDS, sc.SPANMILL_COMPLETION_TOKEN_IDS,
         sc.SPANMILL_COMPLETION_LOGPROBS],
        [sc.SPANMILL_PROMPT_TOKEN_IDS, sc.SPANMILL_COMPLETION_TOKEN_IDS,
         sc.SPANMILL_COMPLETION_LOGPROBS, sc.GEN_AI_INPUT_MESSAGES],
    ]  # fmt: skip
    assert sc.GEN_AI_INPUT_MESSAGES in sent[0].attributes
    assert all(sc.GEN_AI_OUTPUT_MESSAGES in s.attributes for s in sent)
    assert all(len(value) <= 100_000 for value in values)
    assert metrics.spans_reduced._value.get() == 2
    assert metrics.spans_dropped.labels("too_large")._value.get() == 1  # the answer alone
