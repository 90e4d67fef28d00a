"""The Feedback API's wire model, its errors, and the reward span each item becomes."""

from __future__ import annotations

import json

import pytest

from spanmill import semconv as sc
from spanmill.feedback import (
    MAX_BATCH,
    Caller,
    FeedbackError,
    FeedbackItem,
    answer,
    busy,
    feedback_span,
    new_response_id,
    parse_feedback,
    parse_feedback_body,
    trace_of,
    trace_of_response_id,
)
from spanmill.spans import decode_otlp_protobuf, encode_otlp_protobuf
from spanmill.store import table_from_spans

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = Caller("bearer", "10.0.0.7")


def refused(body: object) -> FeedbackError:
    with pytest.raises(FeedbackError) as caught:
        parse_feedback(body)
    return caught.value


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_id": "r", "value": 1}, "name", "required"),
        ({"response_id": "r", "name": "  ", "value": 1}, "name", "empty"),
        ({"response_id": "r", "name": 7, "value": 1}, "name", "string"),
        ({"response_id": "r", "name": "thumbs"}, "value", "required"),
        ({"response_id": "r", "name": "thumbs", "value": "1"}, "value", "number or a boolean"),
        ({"response_id": "r", "name": "thumbs", "value": None}, "value", "number or a boolean"),
        ({"response_id": "r", "name": "thumbs", "value": float("inf")}, "value", "finite"),
        ({"name": "thumbs", "value": 1}, "response_id", "trace_id"),
        ({"trace_id": "xyz", "name": "thumbs", "value": 1}, "trace_id", "32 hex"),
        ({"trace_id": "0" * 32, "name": "thumbs", "value": 1}, "trace_id", "zeros"),
        ({"response_id": "", "name": "thumbs", "value": 1}, "response_id", "empty"),
        ({"response_id": "r", "name": "n", "value": 1, "score": 2}, "score", "not a feedback"),
        ({"response_id": "r", "name": "n", "value": 1, "comment": 3}, "comment", "string"),
    ],
)
def test_bad_items_name_the_field(body: dict[str, object], param: str, words: str) -> None:
    error = refused(body)
    assert error.param == param and error.status == 400
    assert error.message.startswith(f"{param}: ") and words in error.message
    assert error.body() == {
        "error": {
            "message": error.message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


def test_a_bad_item_in_a_batch_is_named_by_its_index() -> None:
    good = {"trace_id": TRACE, "name": "thumbs", "value": True}
    error = refused([good, good, good, {**good, "trace_id": "nope"}])
    assert error.param == "[3].trace_id" and "[3].trace_id: must be 32 hex" in error.message
    assert refused([good, 5]).param == "[1]"
    assert refused([]).param is None and "empty" in refused([]).message
    assert "over the limit" in refused([good] * (MAX_BATCH + 1)).message
    assert "object or an array" in refused("thumbs up").message


def test_bodies_as_received() -> None:
    items = parse_feedback_body(
        json.dumps([{"trace_id": TRACE.upper(), "name": "ok", "value": 0.5}]).encode()
    )
    assert items == [FeedbackItem(trace_id=TRACE, name="ok", value=0.5)]
    with pytest.raises(FeedbackError, match="not valid JSON") as bad:
        parse_feedback_body(b"{")
    assert bad.value.param is None and bad.value.status == 400
    with pytest.raises(FeedbackError) as huge:
        parse_feedback_body(b" " * (4 * 1024 * 1024 + 1))
    assert huge.value.status == 413


def test_gateway_response_ids_carry_their_trace() -> None:
    response_id = new_response_id(TRACE, "0a1b2c3d")
    assert response_id == f"chatcmpl-{TRACE}0a1b2c3d"
    assert trace_of_response_id(response_id) == TRACE
    for other in (
        "chatcmpl-" + "a" * 32,
        "resp_123",
        f"chatcmpl-{TRACE}0a1b2c3g",
        "chatcmpl-" + "0" * 40,
    ):
        assert trace_of_response_id(other) is None


def test_the_trace_is_given_carried_or_derived() -> None:
    carried = FeedbackItem(response_id=new_response_id(TRACE, "00000001"), name="n", value=1)
    assert trace_of(carried) == TRACE
    both = FeedbackItem(response_id=carried.response_id, trace_id="f" * 32, name="n", value=1)
    assert trace_of(both) == "f" * 32  # the trace given wins
    foreign = FeedbackItem(response_id="chatcmpl-ABC", name="n", value=1)
    again = FeedbackItem(response_id="chatcmpl-ABC", name="other", value=0)
    derived = trace_of(foreign)
    assert len(derived) == 32 and derived == trace_of(again) != TRACE  # one response, one trace
    assert trace_of(FeedbackItem(response_id="chatcmpl-ABD", name="n", value=1)) != derived


def test_an_item_becomes_one_reward_span() -> None:
    item = FeedbackItem(
        response_id=new_response_id(TRACE, "00000002"),
        name="thumbs",
        value=True,
        comment="solved my problem",
        source="web-ui",
    )
    span = feedback_span(item, CALLER, 1_700_000_000_000_000_000, "1" * 16, service_name="gw")
    assert span.trace_id == TRACE and span.span_id == "1" * 16
    assert span.name == sc.GEN_AI_EVALUATION_RESULT_EVENT and span.scope_name == sc.FEEDBACK_SCOPE
    assert span.start_time_unix_nano == span.end_time_unix_nano == 1_700_000_000_000_000_000
    assert span.attributes == {
        sc.GEN_AI_EVALUATION_NAME: "thumbs",
        sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
        sc.GEN_AI_EVALUATION_SCORE_LABEL: "true",
        sc.GEN_AI_RESPONSE_ID: item.response_id,
        sc.GEN_AI_EVALUATION_EXPLANATION: "solved my problem",
        sc.SPANMILL_FEEDBACK_SOURCE: "web-ui",
        sc.SPANMILL_FEEDBACK_PRINCIPAL: "bearer",
        sc.CLIENT_ADDRESS: "10.0.0.7",
    }
    assert span.service_name == "gw"
    # Readers take it as a reward of that one call, through both encodings and the store.
    (reward,) = span.rewards
    assert (reward.name, reward.value, reward.response_id) == ("thumbs", 1.0, item.response_id)
    assert decode_otlp_protobuf(encode_otlp_protobuf([span])) == [span]
    stored = table_from_spans([span]).to_pylist()[0]
    assert stored["rewards"] == [
        {"name": "thumbs", "value": 1.0, "response_id": item.response_id, "primary": False,
         "label": "true"}
    ]  # fmt: skip
    assert stored["scope_name"] == sc.FEEDBACK_SCOPE


def test_feedback_by_trace_judges_the_episode() -> None:
    item = FeedbackItem(trace_id=TRACE, name="resolved", value=0)
    span = feedback_span(item, Caller("anonymous"), 5, "2" * 16, service_name="collector")
    assert span.trace_id == TRACE and span.rewards[0].response_id is None
    assert span.rewards[0].value == 0.0
    assert sc.CLIENT_ADDRESS not in span.attributes
    assert sc.GEN_AI_EVALUATION_SCORE_LABEL not in span.attributes


def test_answers() -> None:
    spans = [
        feedback_span(FeedbackItem(trace_id=TRACE, name="n", value=i), CALLER, 1, f"{i + 1:016x}",
                      service_name="gw")
        for i in range(3)
    ]  # fmt: skip
    ok = answer(spans, [None, None, None])
    assert ok.status == 200 and ok.body["accepted"] == 3
    assert ok.body["ids"] == [s.span_id for s in spans] and ok.body["trace_ids"] == [TRACE] * 3
    partial = answer(spans, [None, TimeoutError("no ack"), None])
    assert partial.status == 503 and partial.headers == {"Retry-After": "1"}
    assert partial.body["delivered"] == [0, 2] and "1 of 3" in partial.body["error"]["message"]
    refused_all = busy("the span queue is full")
    assert refused_all.status == 503 and refused_all.body["delivered"] == []
    assert refused_all.body["error"]["code"] == "busy"
