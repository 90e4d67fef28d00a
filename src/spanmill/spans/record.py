"""The typed span record every encoding decodes into, and the facts read off it.

Validation is hand-written rather than left to pydantic's unions: the collector
validates every span it takes, and plain type checks are both faster and give
messages that name the attribute at fault.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    ValidationInfo,
    field_validator,
)

from spanmill import messages as chat
from spanmill import semconv as sc
from spanmill.rewards import rewards_of

MAX_NAME_CHARS: Final = 1024
MAX_ATTRIBUTE_KEY_CHARS: Final = 256
# One string attribute may hold a whole conversation; beyond this it is a bug upstream.
MAX_ATTRIBUTE_VALUE_BYTES: Final = 1024 * 1024

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_UINT64_MAX: Final = 2**64 - 1
_HEX: Final = frozenset("0123456789abcdef")

Scalar = str | bool | int | float
AttributeValue = str | bool | int | float | list[str] | list[bool] | list[int] | list[float]
Attributes = dict[str, AttributeValue]


class InvalidAttributeError(ValueError):
    """One attribute is wrong; ``key`` names it, ``oversize`` says whether by size."""

    def __init__(self, key: str, message: str, *, oversize: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.oversize = oversize


class SpanKind(StrEnum):
    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"
    PRODUCER = "producer"
    CONSUMER = "consumer"


class StatusCode(StrEnum):
    UNSET = "unset"
    OK = "ok"
    ERROR = "error"


def show(value: object, limit: int = 60) -> str:
    """A short repr of a bad input, so that messages stay readable."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind_of(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _hex_id(value: object, size: int) -> str:
    if type(value) is not str:
        raise ValueError(f"must be a string of {size} hex characters, got {show(value)}")
    text = value if value.islower() or value.isdigit() else value.lower()
    if len(text) != size or not _HEX.issuperset(text):
        raise ValueError(f"must be {size} hex characters, got {show(value)}")
    if text.count("0") == size:
        raise ValueError("must not be all zeros: OpenTelemetry reserves that id for 'invalid'")
    return text


def _trace_id(value: object) -> str:
    return _hex_id(value, 32)


def _span_id(value: object) -> str:
    return _hex_id(value, 16)


def _parent_span_id(value: object) -> str | None:
    # Producers mark a root span with an empty parent id as often as with none.
    if value is None or value == "":
        return None
    return _hex_id(value, 16)


def _nanos(value: object) -> int:
    if type(value) is int:
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)  # OTLP/JSON writes 64-bit integers as decimal strings
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise ValueError(
            f"must be an integer count of nanoseconds since the Unix epoch, got {show(value)}"
        )
    if not 0 <= number <= _UINT64_MAX:
        raise ValueError(f"must be between 0 and 2**64-1 nanoseconds, got {number}")
    return number


def _name(value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"must be a string, got {_kind_of(value)} {show(value)}")
    if not value:
        raise ValueError("must not be empty")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"is {len(value)} characters long, over the limit of {MAX_NAME_CHARS}")
    return value


def _text(value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"must be a string, got {_kind_of(value)} {show(value)}")
    return value


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _check_string(key: str, value: str) -> None:
    # len() counts characters; only long strings pay for the exact UTF-8 byte count.
    if len(value) * 4 > MAX_ATTRIBUTE_VALUE_BYTES:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ATTRIBUTE_VALUE_BYTES:
            raise InvalidAttributeError(
                key,
                f"attribute {key!r} is {size} bytes, over the limit of "
                f"{MAX_ATTRIBUTE_VALUE_BYTES}; store large payloads elsewhere and "
                "reference them",
                oversize=True,
            )


def _check_list(key: str, items: list[Any] | tuple[Any, ...]) -> list[Any]:
    if not items:
        return []
    kinds = {type(item) for item in items}
    if kinds == {int, float}:
        # JSON writes 1.0 as 1 in some producers; a numeric array is a float array.
        return [float(item) for item in items]
    if len(kinds) != 1:
        names = ", ".join(sorted(kind.__name__ for kind in kinds))
        raise InvalidAttributeError(
            key, f"attribute {key!r}: array items must all have one type, got {names}"
        )
    kind = kinds.pop()
    if kind is str:
        for item in items:
            _check_string(key, item)
    elif kind is int:
        for item in items:
            if not _INT64_MIN <= item <= _INT64_MAX:
                raise InvalidAttributeError(
                    key, f"attribute {key!r}: array item {item} does not fit in 64 bits"
                )
    elif kind is not bool and kind is not float:
        raise InvalidAttributeError(
            key,
            f"attribute {key!r}: array items must be strings, booleans, integers or "
            f"floats, got {kind.__name__}",
        )
    return list(items)


def check_attributes(value: object) -> Attributes:
    """Validate an attribute mapping and return a private copy of it."""
    if not isinstance(value, Mapping):
        raise ValueError(
            "must be an object mapping attribute names to values, got "
            f"{_kind_of(value)} {show(value)}"
        )
    out: dict[str, Any] = dict(value)
    for key, item in out.items():
        if type(key) is not str or not key or len(key) > MAX_ATTRIBUTE_KEY_CHARS:
            raise InvalidAttributeError(
                str(key),
                f"attribute name {show(key)} must be a non-empty string of at most "
                f"{MAX_ATTRIBUTE_KEY_CHARS} characters",
            )
        kind = type(item)
        if kind is str:
            _check_string(key, item)
        elif kind is int:
            if not _INT64_MIN <= item <= _INT64_MAX:
                raise InvalidAttributeError(
                    key, f"attribute {key!r}: {item} does not fit in 64 bits"
                )
        elif kind is list or kind is tuple:
            out[key] = _check_list(key, item)
        elif kind is not bool and kind is not float:
            raise InvalidAttributeError(
                key,
                f"attribute {key!r} must be a string, boolean, integer, float or an array "
                f"of one of those, got {_kind_of(item)} {show(item)}",
            )
    return out


TraceId = Annotated[str, BeforeValidator(_trace_id)]
SpanId = Annotated[str, BeforeValidator(_span_id)]
Nanos = Annotated[int, BeforeValidator(_nanos)]
Name = Annotated[str, BeforeValidator(_name)]
Text = Annotated[str, BeforeValidator(_text)]
AttributeMap = Annotated[Attributes, PlainValidator(check_attributes)]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SpanEvent(BaseModel):
    """Something that happened at one instant during a span (e.g. a reward)."""

    model_config = _FROZEN

    name: Name
    time_unix_nano: Nanos
    attributes: AttributeMap = {}


class SpanLink(BaseModel):
    """A pointer from this span to a span in another (or the same) trace."""

    model_config = _FROZEN

    trace_id: TraceId
    span_id: SpanId
    attributes: AttributeMap = {}


@dataclass(frozen=True, slots=True)
class Reward:
    """One named score: of the LLM call with ``response_id``, or of the whole episode."""

    name: str
    value: float
    response_id: str | None = None
    primary: bool = False
    label: str | None = None


class Span(BaseModel):
    """One OpenTelemetry span, with the resource and scope it came from.

    Ids are lowercase hex, times are nanoseconds since the Unix epoch. The
    properties read the GenAI and ``spanmill.`` attributes (see
    :mod:`spanmill.semconv`); those that parse JSON do so on every access.
    """

    model_config = _FROZEN

    trace_id: TraceId
    span_id: SpanId
    parent_span_id: Annotated[SpanId | None, BeforeValidator(_parent_span_id)] = None
    name: Name
    kind: Annotated[SpanKind, BeforeValidator(_lower)] = SpanKind.INTERNAL
    start_time_unix_nano: Nanos
    end_time_unix_nano: Nanos
    status_code: Annotated[StatusCode, BeforeValidator(_lower)] = StatusCode.UNSET
    status_message: Text = ""
    attributes: AttributeMap = {}
    resource_attributes: AttributeMap = {}
    scope_name: Text = ""
    scope_version: Text = ""
    events: tuple[SpanEvent, ...] = ()
    links: tuple[SpanLink, ...] = ()

    @field_validator("end_time_unix_nano")
    @classmethod
    def _ends_after_start(cls, end: int, info: ValidationInfo) -> int:
        start = info.data.get("start_time_unix_nano")
        if start is not None and end < start:
            raise ValueError(f"is {end}, before start_time_unix_nano {start}")
        return end

    # -- facts read off the attributes -----------------------------------------------

    def _str(self, key: str, attributes: Attributes | None = None) -> str | None:
        value = (self.attributes if attributes is None else attributes).get(key)
        if value is None or isinstance(value, bool | list):
            return None
        return value if isinstance(value, str) else str(value)

    @property
    def duration_ns(self) -> int:
        return self.end_time_unix_nano - self.start_time_unix_nano

    @property
    def service_name(self) -> str | None:
        return self._str(sc.SERVICE_NAME, self.resource_attributes)

    @property
    def operation_name(self) -> str | None:
        return self._str(sc.GEN_AI_OPERATION_NAME)

    @property
    def is_llm_call(self) -> bool:
        return self.operation_name in sc.LLM_OPERATIONS

    @property
    def agent_name(self) -> str | None:
        return self._str(sc.GEN_AI_AGENT_NAME)

    @property
    def conversation_id(self) -> str | None:
        return self._str(sc.GEN_AI_CONVERSATION_ID)

    @property
    def response_id(self) -> str | None:
        return self._str(sc.GEN_AI_RESPONSE_ID)

    @property
    def model(self) -> str | None:
        """The model that answered, else the one asked for."""
        return self._str(sc.GEN_AI_RESPONSE_MODEL) or self._str(sc.GEN_AI_REQUEST_MODEL)

    @property
    def model_version(self) -> str | None:
        return self._str(sc.SPANMILL_MODEL_VERSION)

    @property
    def task_id(self) -> str | None:
        return self._str(sc.SPANMILL_TASK_ID)

    @property
    def episode_id(self) -> str:
        """The explicit episode id, else the trace id: one trace is one episode."""
        return self._str(sc.SPANMILL_EPISODE_ID) or self.trace_id

    @property
    def prompt_name(self) -> str | None:
        return self._str(sc.SPANMILL_PROMPT_NAME)

    @property
    def prompt_version(self) -> str | None:
        return self._str(sc.SPANMILL_PROMPT_VERSION)

    @property
    def input_messages(self) -> list[dict[str, Any]]:
        return _messages(self.attributes, sc.GEN_AI_INPUT_MESSAGES)

    @property
    def output_messages(self) -> list[dict[str, Any]]:
        return _messages(self.attributes, sc.GEN_AI_OUTPUT_MESSAGES)

    @property
    def system_instructions(self) -> list[dict[str, Any]]:
        return chat.system_messages(_messages(self.attributes, sc.GEN_AI_SYSTEM_INSTRUCTIONS))

    @property
    def prompt_token_ids(self) -> list[int] | None:
        return _ints(self.attributes.get(sc.SPANMILL_PROMPT_TOKEN_IDS))

    @property
    def completion_token_ids(self) -> list[int] | None:
        return _ints(self.attributes.get(sc.SPANMILL_COMPLETION_TOKEN_IDS))

    @property
    def completion_logprobs(self) -> list[float] | None:
        value = self.attributes.get(sc.SPANMILL_COMPLETION_LOGPROBS)
        if not isinstance(value, list) or any(isinstance(item, bool | str) for item in value):
            return None
        return [float(item) for item in value]

    @property
    def rewards(self) -> list[Reward]:
        """Rewards this span carries: as a reward span itself, and as evaluation events.

        An event without its own ``gen_ai.response.id`` takes the id of the span it
        sits on: an evaluation attached to an LLM call evaluates that call.
        """
        events = ((event.name, event.attributes) for event in self.events)
        return [Reward(**fields) for fields in rewards_of(self.attributes, events)]


def _messages(attributes: Attributes, key: str) -> list[dict[str, Any]]:
    value = attributes.get(key)
    if value is None:
        return []
    try:
        if isinstance(value, str):
            parsed = json.loads(value)
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            # Some producers write one JSON message per array item.
            parsed = [json.loads(item) for item in value]  # type: ignore[arg-type]
        else:
            parsed = None
    except json.JSONDecodeError as exc:
        raise ValueError(f"attribute {key!r} is not valid JSON: {exc}") from None
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not isinstance(parsed, list) or not all(isinstance(item, dict) for item in parsed):
        raise ValueError(f"attribute {key!r} must be a JSON array of message objects")
    return parsed


def _ints(value: AttributeValue | None) -> list[int] | None:
    if isinstance(value, list) and all(type(item) is int for item in value):
        return value  # type: ignore[return-value]
    return None
