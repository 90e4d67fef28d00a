"""The SDK's own JSON form of spans: flat, friendly, and the same names as :class:`Span`.

A payload is one span object, a JSON array of them, or ``{"spans": [...]}``. A span
object holds hex ids, times as integer nanoseconds, ``kind`` and ``status_code`` as
lowercase words, and ``attributes`` / ``resource_attributes`` as plain JSON objects::

    {"trace_id": "5b8efff798038103d269b633813fc60c", "span_id": "eee19b7ec3c1b174",
     "name": "chat smollm2", "kind": "client",
     "start_time_unix_nano": 1700000000000000000, "end_time_unix_nano": 1700000000500000000,
     "attributes": {"gen_ai.operation.name": "chat"},
     "resource_attributes": {"service.name": "calculator-agent"}}

Non-finite floats are written as ``NaN`` / ``Infinity``, which Python's JSON reads
back but strict parsers do not. Fields left at their defaults are omitted when
encoding; unknown fields are refused rather than ignored, so that a misspelt field
never loses data silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from pydantic import ValidationError

from spanmill import semconv as sc
from spanmill.spans.errors import SCHEMA, SpanDecodeError
from spanmill.spans.jsontext import dump_json, load_json
from spanmill.spans.record import Span, SpanEvent, SpanKind, SpanLink, StatusCode, show
from spanmill.spans.validation import Loc, decode_error, join_loc


def _event(event: SpanEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"name": event.name, "time_unix_nano": event.time_unix_nano}
    if event.attributes:
        out["attributes"] = event.attributes
    return out


def _link(link: SpanLink) -> dict[str, Any]:
    out: dict[str, Any] = {"trace_id": link.trace_id, "span_id": link.span_id}
    if link.attributes:
        out["attributes"] = link.attributes
    return out


def span_to_dict(span: Span) -> dict[str, Any]:
    """The span as a JSON-ready dict in the SDK form."""
    out: dict[str, Any] = {"trace_id": span.trace_id, "span_id": span.span_id}
    if span.parent_span_id is not None:
        out["parent_span_id"] = span.parent_span_id
    out["name"] = span.name
    if span.kind is not SpanKind.INTERNAL:
        out["kind"] = span.kind.value
    out["start_time_unix_nano"] = span.start_time_unix_nano
    out["end_time_unix_nano"] = span.end_time_unix_nano
    if span.status_code is not StatusCode.UNSET:
        out["status_code"] = span.status_code.value
    if span.status_message:
        out["status_message"] = span.status_message
    if span.attributes:
        out["attributes"] = span.attributes
    if span.resource_attributes:
        out["resource_attributes"] = span.resource_attributes
    if span.scope_name:
        out["scope_name"] = span.scope_name
    if span.scope_version:
        out["scope_version"] = span.scope_version
    if span.events:
        out["events"] = [_event(event) for event in span.events]
    if span.links:
        out["links"] = [_link(link) for link in span.links]
    return out


def encode_span(span: Span) -> bytes:
    """One span as one JSON object."""
    return dump_json(span_to_dict(span))


def encode_spans(spans: Iterable[Span]) -> bytes:
    """A batch of spans as ``{"spans": [...]}``."""
    return dump_json({"spans": [span_to_dict(span) for span in spans]})


def _locate(base: str, loc: Loc) -> str:
    return join_loc(base, loc) or "span"


def decode_spans(payload: bytes) -> list[Span]:
    """Decode a UTF-8 JSON payload in the SDK form; raises SpanDecodeError."""
    return spans_from_document(load_json(payload))


def spans_from_document(document: Any) -> list[Span]:
    """Decode an already parsed SDK JSON document."""
    prefix: str
    if isinstance(document, dict) and ("resourceSpans" in document or "resource_spans" in document):
        raise SpanDecodeError(
            SCHEMA,
            "document: is OTLP/JSON (it has resourceSpans), not the SDK form; label it "
            f"{sc.CONTENT_TYPE_OTLP_JSON!r} or leave the format to detection",
        )
    if isinstance(document, dict) and "spans" in document and "trace_id" not in document:
        extra = sorted(set(document) - {"spans"})
        if extra:
            raise SpanDecodeError(
                SCHEMA, f"{extra[0]}: is not a known field of a span batch (only 'spans')"
            )
        items, prefix = document["spans"], "spans"
        if not isinstance(items, list):
            raise SpanDecodeError(
                SCHEMA, f"spans: must be an array of span objects, got {show(items)}"
            )
    elif isinstance(document, dict):
        items, prefix = [document], ""
    elif isinstance(document, list):
        items, prefix = document, ""
    else:
        raise SpanDecodeError(
            SCHEMA,
            'document: must be a span object, an array of span objects or {"spans": [...]}, '
            f"got {show(document)}",
        )
    single = isinstance(document, dict) and not prefix
    spans = []
    for index, item in enumerate(items):
        where = "span" if single else f"{prefix}[{index}]"
        if not isinstance(item, dict):
            raise SpanDecodeError(SCHEMA, f"{where}: must be a span object, got {show(item)}")
        try:
            spans.append(Span.model_validate(item))
        except ValidationError as exc:
            raise decode_error(exc, partial(_locate, "" if single else where)) from None
    return spans
