"""The Feedback API: late rewards from any caller, as reward spans on the span topic.

An agent often learns whether an answer was good only after its episode ended (a
thumbs-up, a resolved ticket, a passing CI run). ``POST /v1/feedback``, served by
the gateway and by the collector's OTLP receiver, takes such rewards as JSON: one
object, or an array of them (a batch)::

    {"response_id": "chatcmpl-...", "name": "thumbs", "value": 1, "comment": "...",
     "source": "web-ui"}
    {"trace_id": "<32 hex>", "name": "resolved", "value": true}

``name`` and ``value`` (a number or a boolean) are required, and at least one of
``response_id`` (the ``id`` of a chat completion: judges that one call) and
``trace_id`` (judges the whole episode). This module is the one definition of that
wire format, of its errors (OpenAI-style bodies whose ``param`` names the field),
and of the span each item becomes; both routes only add transport.

Each item becomes one reward span (:data:`~spanmill.semconv.FEEDBACK_SCOPE`) in the
trace it judges, so that on Kafka it is keyed, and partitioned, with its trace. The
trace is the one given; else the one a gateway response id carries (the gateway
writes its trace id into every response id, see :func:`new_response_id`), so no
lookup is needed; else, for a response id from elsewhere, a trace id derived from
the response id, so that all feedback on one foreign response shares a partition.
The dataset builder joins by response id wherever the call sits.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from spanmill import semconv as sc
from spanmill.errors import error_body
from spanmill.spans import Span, SpanKind
from spanmill.spans.record import TraceId, show

MAX_BATCH: Final = 1000
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
MAX_NAME_CHARS: Final = 256
MAX_ID_CHARS: Final = 256
MAX_SOURCE_CHARS: Final = 256
MAX_COMMENT_CHARS: Final = 16 * 1024
# Seconds a caller is asked to wait before retrying when the span topic cannot take
# more now (a full queue, Kafka unreachable).
RETRY_AFTER_S: Final = 1
RESPONSE_ID_PREFIX: Final = "chatcmpl-"
_RESPONSE_ID_HEX: Final = 40  # a 32-hex trace id, then 8 hex of randomness
_HEX: Final = frozenset("0123456789abcdef")
_FIELDS: Final = ("response_id", "trace_id", "name", "value", "comment", "source")


def _text(limit: int, *, blank_ok: bool) -> Any:
    """A validator for a string field of at most ``limit`` characters."""

    def check(value: object) -> object:
        if value is None:
            return None
        if type(value) is not str:
            raise PydanticCustomError("string_type", f"must be a string, got {show(value)}")
        if not blank_ok and not value.strip():
            raise PydanticCustomError("blank", "must not be empty")
        if len(value) > limit:
            raise PydanticCustomError(
                "too_long", f"is {len(value)} characters long, over the limit of {limit}"
            )
        try:  # JSON's \ud800 escapes decode to a lone surrogate, which no span can carry
            value.encode()
        except UnicodeEncodeError as exc:
            raise PydanticCustomError(
                "not_text", f"holds a lone surrogate at character {exc.start}, which is not text"
            ) from None
        return value

    return BeforeValidator(check)


def _score(value: object) -> float | bool:
    # Checked by hand: pydantic's lax mode would take "1" or "true" as a number.
    if type(value) is bool:
        return value
    if type(value) not in (int, float):
        raise PydanticCustomError("score_type", f"must be a number or a boolean, got {show(value)}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise PydanticCustomError("score_type", f"must be a finite number, got {show(value)}")
    return number


class FeedbackItem(BaseModel):
    """One piece of feedback, as a caller sends it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    response_id: Annotated[str | None, _text(MAX_ID_CHARS, blank_ok=False)] = None
    trace_id: TraceId | None = None
    name: Annotated[str, _text(MAX_NAME_CHARS, blank_ok=False)]
    value: Annotated[float | bool, PlainValidator(_score)]
    comment: Annotated[str | None, _text(MAX_COMMENT_CHARS, blank_ok=True)] = None
    source: Annotated[str | None, _text(MAX_SOURCE_CHARS, blank_ok=False)] = None

    @model_validator(mode="after")
    def _linked(self) -> FeedbackItem:
        if self.response_id is None and self.trace_id is None:
            raise PydanticCustomError(
                "missing_id",
                "is required unless trace_id is given: feedback must name the call "
                "(response_id) or the episode (trace_id) it judges",
            )
        return self


class FeedbackError(ValueError):
    """A feedback body that cannot be taken; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def body(self) -> dict[str, Any]:
        return error_body(self.message, "invalid_request_error", param=self.param)


def _param(prefix: str, loc: tuple[int | str, ...], kind: str) -> str | None:
    """The offending field as a path: ``value``, ``[3].trace_id``, ``[3]``."""
    field = str(loc[0]) if loc else ("response_id" if kind == "missing_id" else "")
    if prefix and field:
        return f"{prefix}.{field}"
    return prefix or field or None


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"is not a feedback field; the fields are {', '.join(_FIELDS)}"
    if kind == "model_type":
        return f"must be a JSON object, got {show(error['input'])}"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    return str(error["msg"])


def _item(entry: object, prefix: str) -> FeedbackItem:
    try:
        return FeedbackItem.model_validate(entry)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = _param(prefix, tuple(error["loc"]), error["type"])
        raise FeedbackError(f"{param or 'body'}: {_message(error)}", param) from None


def parse_feedback(body: object) -> list[FeedbackItem]:
    """The items of a decoded JSON body: one object, or an array of them."""
    if isinstance(body, dict):
        return [_item(body, "")]
    if not isinstance(body, list):
        raise FeedbackError(f"body: must be a JSON object or an array of objects, got {show(body)}")
    if not body:
        raise FeedbackError("body: the batch is empty; send at least one feedback object")
    if len(body) > MAX_BATCH:
        raise FeedbackError(
            f"body: the batch has {len(body)} items, over the limit of {MAX_BATCH}; "
            "send smaller batches"
        )
    return [_item(entry, f"[{index}]") for index, entry in enumerate(body)]


def too_large() -> FeedbackError:
    """The 413 for a body over the limit, refused before it is read whole."""
    return FeedbackError(
        f"body: over the limit of {MAX_BODY_BYTES} bytes; send smaller batches", status=413
    )


def parse_feedback_body(raw: bytes) -> list[FeedbackItem]:
    """The items of a request body as received (UTF-8 JSON)."""
    if len(raw) > MAX_BODY_BYTES:
        raise FeedbackError(
            f"body: {len(raw)} bytes, over the limit of {MAX_BODY_BYTES}; send smaller batches",
            status=413,
        )
    try:
        decoded = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FeedbackError(f"body: not valid JSON: {exc}") from None
    except RecursionError:
        raise FeedbackError("body: JSON nested too deeply") from None
    return parse_feedback(decoded)


# -- response ids carry their trace ---------------------------------------------------


def new_response_id(trace_id: str, random_hex: str) -> str:
    """A chat completion id that carries its trace id, for feedback to find the trace.

    ``random_hex``: 8 hex characters, so that the calls of one trace differ.
    """
    return f"{RESPONSE_ID_PREFIX}{trace_id}{random_hex}"


def trace_of_response_id(response_id: str) -> str | None:
    """The trace id a gateway response id carries; None for any other id."""
    if not response_id.startswith(RESPONSE_ID_PREFIX):
        return None
    tail = response_id[len(RESPONSE_ID_PREFIX) :]
    if len(tail) != _RESPONSE_ID_HEX or not _HEX.issuperset(tail):
        return None
    trace_id = tail[:32]
    return None if trace_id.count("0") == 32 else trace_id


def trace_of(item: FeedbackItem) -> str:
    """The trace the feedback span goes to: given, carried by the response id, or derived."""
    if item.trace_id is not None:
        return item.trace_id
    response_id = item.response_id or ""
    carried = trace_of_response_id(response_id)
    if carried is not None:
        return carried
    digest = hashlib.sha256(f"{sc.FEEDBACK_SCOPE}:{response_id}".encode()).hexdigest()[:32]
    return digest if digest.count("0") < 32 else "1".rjust(32, "0")


# -- the span --------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Who sent feedback, as the route authenticated it."""

    principal: str  # the id of the API key checked, "anonymous" when none is asked
    address: str | None = None


def feedback_span(
    item: FeedbackItem, caller: Caller, received_ns: int, span_id: str, *, service_name: str
) -> Span:
    """The reward span one item becomes: an instant at ``received_ns``, in its trace.

    A boolean value is stored as 1.0 or 0.0 (rewards are numbers) with the label
    ``true`` or ``false``, so that what was sent can still be told.
    """
    attributes: dict[str, Any] = {
        sc.GEN_AI_EVALUATION_NAME: item.name,
        sc.GEN_AI_EVALUATION_SCORE_VALUE: float(item.value),
        sc.SPANMILL_FEEDBACK_PRINCIPAL: caller.principal,
    }
    if isinstance(item.value, bool):
        attributes[sc.GEN_AI_EVALUATION_SCORE_LABEL] = "true" if item.value else "false"
    optional = (
        (sc.GEN_AI_RESPONSE_ID, item.response_id),
        (sc.GEN_AI_EVALUATION_EXPLANATION, item.comment),
        (sc.SPANMILL_FEEDBACK_SOURCE, item.source),
        (sc.CLIENT_ADDRESS, caller.address),
    )
    attributes.update((key, value) for key, value in optional if value is not None)
    return Span(
        trace_id=trace_of(item),
        span_id=span_id,
        name=sc.GEN_AI_EVALUATION_RESULT_EVENT,
        kind=SpanKind.INTERNAL,
        start_time_unix_nano=received_ns,
        end_time_unix_nano=received_ns,
        attributes=attributes,
        # Whoever sent it is its producer: a key id, or anonymous (spanmill.producers).
        resource_attributes={sc.SERVICE_NAME: service_name, sc.SPANMILL_PRODUCER: caller.principal},
        scope_name=sc.FEEDBACK_SCOPE,
    )


# -- the answer ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def answer(spans: Sequence[Span], failures: Sequence[BaseException | None]) -> Answer:
    """The route's reply once Kafka has answered for every span (``failures[i]`` for
    ``spans[i]``, None when acknowledged).

    200 lists the feedback ids (span ids) and their traces. When some were not
    acknowledged the reply is 503 with ``Retry-After``, and ``delivered`` lists the
    indexes that were, so that a batch is retried without its delivered items.
    """
    failed = [index for index, failure in enumerate(failures) if failure is not None]
    if not failed:
        return Answer(
            200,
            {
                "object": "feedback.accepted",
                "accepted": len(spans),
                "ids": [span.span_id for span in spans],
                "trace_ids": [span.trace_id for span in spans],
            },
            {},
        )
    first = failures[failed[0]]
    body = error_body(
        f"{len(failed)} of {len(spans)} feedback items were not acknowledged by Kafka "
        f"({first}); retry those not listed in 'delivered'",
        "unavailable",
        code="kafka_unavailable",
    )
    body["delivered"] = [index for index, failure in enumerate(failures) if failure is None]
    return Answer(503, body, {"Retry-After": str(RETRY_AFTER_S)})


def busy(reason: str) -> Answer:
    """503 when the span topic cannot take feedback now; nothing of it was sent."""
    body = error_body(
        f"feedback not taken: {reason}; retry after {RETRY_AFTER_S}s",
        "unavailable",
        code="busy",
    )
    body["delivered"] = []
    return Answer(503, body, {"Retry-After": str(RETRY_AFTER_S)})
