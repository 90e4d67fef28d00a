"""The typed span record: what it accepts, what it refuses, and the facts it reads off."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from pydantic import ValidationError

from spanmill import semconv as sc
from spanmill.errors import SpanmillError
from spanmill.spans import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    Reward,
    Span,
    SpanDecodeError,
    SpanEvent,
    SpanKind,
    StatusCode,
)

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = "eee19b7ec3c1b174"


def make(**overrides: Any) -> Span:
    fields: dict[str, Any] = {
        "trace_id": TRACE,
        "span_id": SPAN,
        "name": "chat smollm2",
        "start_time_unix_nano": 1_700_000_000_000_000_000,
        "end_time_unix_nano": 1_700_000_000_500_000_000,
    }
    fields.update(overrides)
    return Span(**fields)


def messages(*turns: tuple[str, str]) -> str:
    return json.dumps(
        [{"role": role, "parts": [{"type": "text", "content": text}]} for role, text in turns]
    )


def test_defaults_and_normalisation() -> None:
    span = make(trace_id=TRACE.upper(), parent_span_id="", kind="CLIENT", status_code="Error")
    assert span.trace_id == TRACE
    assert span.parent_span_id is None
    assert span.kind is SpanKind.CLIENT
    assert span.status_code is StatusCode.ERROR
    assert span.events == () and span.links == ()
    assert span.duration_ns == 500_000_000


def test_times_accept_decimal_strings_but_not_booleans() -> None:
    assert make(start_time_unix_nano="5", end_time_unix_nano="7").start_time_unix_nano == 5
    with pytest.raises(ValidationError, match="start_time_unix_nano"):
        make(start_time_unix_nano=True)


def test_span_is_frozen_and_owns_its_attributes() -> None:
    attributes: dict[str, Any] = {"a": 1}
    span = make(attributes=attributes)
    attributes["a"] = 2
    assert span.attributes == {"a": 1}
    with pytest.raises(ValidationError):
        span.name = "other"


def test_attribute_arrays() -> None:
    span = make(attributes={"t": ("a", "b"), "mixed": [1, 2.5], "empty": [], "b": [True]})
    assert span.attributes == {"t": ["a", "b"], "mixed": [1.0, 2.5], "empty": [], "b": [True]}


@pytest.mark.parametrize(
    ("attributes", "fragment"),
    [
        ({"a": {"nested": 1}}, "'a' must be a string, boolean"),
        ({"a": None}, "'a' must be a string, boolean"),
        ({"a": [1, "x"]}, "'a': array items must all have one type"),
        ({"a": [True, 1]}, "'a': array items must all have one type"),
        ({"a": [[1]]}, "'a': array items must be strings"),
        ({"a": 2**63}, "'a': 9223372036854775808 does not fit in 64 bits"),
        ({"a": [2**64]}, "'a': array item"),
        ({"": 1}, "attribute name '' must be a non-empty string"),
        ({"k" * 257: 1}, "at most 256 characters"),
        ("not a mapping", "must be an object mapping attribute names"),
    ],
)
def test_bad_attributes_name_the_attribute(attributes: Any, fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        make(attributes=attributes)
    assert fragment in str(caught.value)
    assert caught.value.errors()[0]["loc"] == ("attributes",)


def test_oversize_attribute_is_refused_naming_it() -> None:
    make(attributes={"ok": "x" * MAX_ATTRIBUTE_VALUE_BYTES})
    with pytest.raises(ValidationError, match=r"'big' is \d+ bytes, over the limit"):
        make(attributes={"big": "é" * (MAX_ATTRIBUTE_VALUE_BYTES // 2 + 1)})
    with pytest.raises(ValidationError, match="'big'"):
        make(attributes={"big": ["x" * (MAX_ATTRIBUTE_VALUE_BYTES + 1)]})


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("trace_id", "abc", "must be 32 hex characters, got 'abc'"),
        ("trace_id", "g" * 32, "must be 32 hex characters"),
        ("trace_id", "0" * 32, "must not be all zeros"),
        ("trace_id", 12, "must be a string of 32 hex characters"),
        ("span_id", "0" * 16, "must not be all zeros"),
        ("parent_span_id", "xyz", "must be 16 hex characters"),
        ("name", "", "must not be empty"),
        ("name", "n" * 1025, "over the limit of 1024"),
        ("name", 3, "must be a string, got int 3"),
        ("start_time_unix_nano", -1, "between 0 and 2**64-1"),
        ("start_time_unix_nano", "soon", "integer count of nanoseconds"),
        ("end_time_unix_nano", 1, "before start_time_unix_nano"),
        ("kind", "sideways", "Input should be"),
    ],
)
def test_bad_fields_are_refused(field: str, value: Any, fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        make(**{field: value})
    error = caught.value.errors()[0]
    assert error["loc"] == (field,)
    assert fragment in str(caught.value)


def test_facts_read_off_an_llm_span() -> None:
    span = make(
        attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
            sc.GEN_AI_AGENT_NAME: "calculator",
            sc.GEN_AI_REQUEST_MODEL: "smollm2",
            sc.GEN_AI_RESPONSE_MODEL: "smollm2-135m",
            sc.GEN_AI_RESPONSE_ID: "chatcmpl-1",
            sc.GEN_AI_CONVERSATION_ID: "conv-9",
            sc.SPANMILL_MODEL_VERSION: 3,
            sc.SPANMILL_TASK_ID: "task-7",
            sc.SPANMILL_PROMPT_NAME: "calc",
            sc.SPANMILL_PROMPT_VERSION: "2",
            sc.GEN_AI_INPUT_MESSAGES: messages(("user", "2+2?")),
            sc.GEN_AI_OUTPUT_MESSAGES: messages(("assistant", "4")),
            sc.SPANMILL_PROMPT_TOKEN_IDS: [1, 2, 3],
            sc.SPANMILL_COMPLETION_TOKEN_IDS: [4],
            sc.SPANMILL_COMPLETION_LOGPROBS: [-0.25],
        },
        resource_attributes={sc.SERVICE_NAME: "calculator-agent"},
    )
    assert span.is_llm_call
    assert span.service_name == "calculator-agent"
    assert span.operation_name == "chat"
    assert span.agent_name == "calculator"
    assert span.model == "smollm2-135m"
    assert span.model_version == "3"
    assert span.response_id == "chatcmpl-1"
    assert span.conversation_id == "conv-9"
    assert span.task_id == "task-7"
    assert span.episode_id == TRACE  # no explicit episode: the trace is the episode
    assert (span.prompt_name, span.prompt_version) == ("calc", "2")
    assert span.input_messages[0]["parts"][0]["content"] == "2+2?"
    assert span.output_messages[0]["role"] == "assistant"
    assert span.system_instructions == []
    assert span.prompt_token_ids == [1, 2, 3]
    assert span.completion_token_ids == [4]
    assert span.completion_logprobs == [-0.25]
    assert span.rewards == []


def test_absent_facts_are_none() -> None:
    span = make(attributes={sc.GEN_AI_REQUEST_MODEL: "smollm2", sc.SPANMILL_EPISODE_ID: "ep-1"})
    assert span.model == "smollm2"
    assert span.episode_id == "ep-1"
    assert not span.is_llm_call
    assert span.service_name is None and span.response_id is None
    assert span.completion_token_ids is None and span.completion_logprobs is None


def test_few_shot_example_turns_are_marked_in_messages() -> None:
    turns = [
        {"role": "user", "parts": [], sc.SPANMILL_MESSAGE_EXAMPLE: True},
        {"role": "user", "parts": []},
    ]
    span = make(attributes={sc.GEN_AI_INPUT_MESSAGES: json.dumps(turns)})
    assert [m.get(sc.SPANMILL_MESSAGE_EXAMPLE, False) for m in span.input_messages] == [
        True,
        False,
    ]


def test_messages_as_one_json_string_per_item() -> None:
    span = make(attributes={sc.GEN_AI_INPUT_MESSAGES: ['{"role": "user", "parts": []}']})
    assert span.input_messages == [{"role": "user", "parts": []}]


@pytest.mark.parametrize("value", ["not json", "[1, 2]", "42"])
def test_malformed_messages_name_the_attribute(value: str) -> None:
    span = make(attributes={sc.GEN_AI_OUTPUT_MESSAGES: value})
    with pytest.raises(ValueError, match=r"gen_ai\.output\.messages"):
        _ = span.output_messages


def test_rewards_from_a_reward_span_and_from_evaluation_events() -> None:
    reward_span = make(
        name="reward",
        attributes={
            sc.GEN_AI_EVALUATION_NAME: "correct",
            sc.GEN_AI_EVALUATION_SCORE_VALUE: 1,
            sc.SPANMILL_REWARD_PRIMARY: True,
            sc.GEN_AI_EVALUATION_SCORE_LABEL: "pass",
        },
    )
    assert reward_span.rewards == [Reward("correct", 1.0, None, True, "pass")]

    def event(**attributes: Any) -> SpanEvent:
        return SpanEvent(
            name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=1, attributes=attributes
        )

    llm_span = make(
        attributes={sc.GEN_AI_RESPONSE_ID: "resp-1"},
        events=[
            event(**{sc.GEN_AI_EVALUATION_NAME: "format", sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.5}),
            event(
                **{
                    sc.GEN_AI_EVALUATION_NAME: "judge",
                    sc.GEN_AI_EVALUATION_SCORE_VALUE: -1.0,
                    sc.GEN_AI_RESPONSE_ID: "resp-0",
                }
            ),
            # Not a reward: no numeric score; and an event of another name.
            event(**{sc.GEN_AI_EVALUATION_NAME: "bad", sc.GEN_AI_EVALUATION_SCORE_VALUE: "x"}),
            SpanEvent(name="log", time_unix_nano=1, attributes={sc.GEN_AI_EVALUATION_NAME: "z"}),
        ],
    )
    assert llm_span.rewards == [
        Reward("format", 0.5, response_id="resp-1"),
        Reward("judge", -1.0, response_id="resp-0"),
    ]


def test_decode_error_is_a_spanmill_value_error_and_pickles() -> None:
    error = SpanDecodeError("schema", "spans[0].trace_id: must be 32 hex characters")
    assert isinstance(error, SpanmillError) and isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.detail) == (error.reason, error.detail)
    assert str(copy) == "schema: spans[0].trace_id: must be 32 hex characters"
