"""One entry point for whatever a producer sent: pick the encoding, decode, or say why not.

A ``content-type`` wins when given: ``application/x-protobuf`` is OTLP protobuf;
``application/json`` is OTLP/JSON or the SDK form, told apart by the
``spanmill-format=otlp|sdk`` parameter or, without it, by the document itself.
Without a content type the payload is sniffed: JSON starts with ``{`` or ``[``
(after whitespace); an object with ``resourceSpans`` is OTLP/JSON, anything else
JSON is the SDK form; everything else is tried as OTLP protobuf.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from spanmill import semconv as sc
from spanmill.spans.errors import (
    BAD_JSON,
    EMPTY,
    OVERSIZE,
    UNSUPPORTED_CONTENT_TYPE,
    SpanDecodeError,
)
from spanmill.spans.jsontext import load_json
from spanmill.spans.otlp import decode_otlp_protobuf, spans_from_otlp_document
from spanmill.spans.record import Span
from spanmill.spans.sdk_json import spans_from_document

# Kafka's default message.max.bytes, which the embedded broker does not enforce.
MAX_MESSAGE_BYTES: Final = 1024 * 1024

_PROTOBUF_TYPES: Final = frozenset(
    {"application/x-protobuf", "application/protobuf", "application/vnd.google.protobuf"}
)
_JSON_TYPES: Final = frozenset({"application/json", "text/json"})


class SpanFormat(StrEnum):
    OTLP_PROTOBUF = "otlp_protobuf"
    OTLP_JSON = "otlp_json"
    SDK_JSON = "sdk_json"


def format_from_content_type(content_type: str) -> SpanFormat | None:
    """The encoding a content type names; None for JSON whose form must be sniffed."""
    media, *params = (part.strip() for part in content_type.split(";"))
    media = media.lower()
    if media in _PROTOBUF_TYPES:
        return SpanFormat.OTLP_PROTOBUF
    if media in _JSON_TYPES or media.endswith("+json"):
        hint = ""
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == sc.FORMAT_PARAM:
                hint = value.strip().strip('"').lower()
        if hint in ("", "auto"):
            return None
        if hint in ("otlp", SpanFormat.OTLP_JSON):
            return SpanFormat.OTLP_JSON
        if hint in ("sdk", SpanFormat.SDK_JSON):
            return SpanFormat.SDK_JSON
        raise SpanDecodeError(
            UNSUPPORTED_CONTENT_TYPE,
            f"content-type {content_type!r}: {sc.FORMAT_PARAM}={hint!r} is unknown; "
            "use 'otlp' or 'sdk'",
        )
    raise SpanDecodeError(
        UNSUPPORTED_CONTENT_TYPE,
        f"content-type {content_type!r} is not accepted; send application/x-protobuf "
        f"(OTLP) or application/json (OTLP/JSON, or the SDK form with {sc.FORMAT_PARAM}=sdk)",
    )


def _from_json(document: Any, form: SpanFormat | None) -> list[Span]:
    if form is None:
        otlp = isinstance(document, dict) and (
            "resourceSpans" in document or "resource_spans" in document
        )
        form = SpanFormat.OTLP_JSON if otlp else SpanFormat.SDK_JSON
    if form is SpanFormat.OTLP_JSON:
        return spans_from_otlp_document(document)
    return spans_from_document(document)


def _looks_like_json(payload: bytes) -> bool:
    start = payload.lstrip(b" \t\r\n")
    return start[:1] in (b"{", b"[") or start.startswith(b"\xef\xbb\xbf")


def _is_text(payload: bytes) -> bool:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.isprintable() or all(char.isprintable() or char in "\t\r\n" for char in text)


def detect_and_decode(
    payload: bytes, content_type: str | None = None, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> list[Span]:
    """Decode one message's spans in whichever encoding it is; raises SpanDecodeError.

    A message over ``max_bytes`` is refused with reason ``oversize`` before any parsing,
    and an empty one with reason ``empty``: it holds no spans in any encoding, and a
    producer that sends it is misconfigured.
    """
    if len(payload) > max_bytes:
        raise SpanDecodeError(
            OVERSIZE,
            f"message is {len(payload)} bytes, over the limit of {max_bytes}; "
            "send smaller batches or raise the limit",
        )
    if not payload:
        raise SpanDecodeError(EMPTY, "message is empty; expected OTLP or SDK spans")
    form = format_from_content_type(content_type) if content_type else None
    if form is SpanFormat.OTLP_PROTOBUF:
        try:
            return decode_otlp_protobuf(payload)
        except SpanDecodeError as exc:
            if _looks_like_json(payload):
                raise SpanDecodeError(
                    exc.reason,
                    f"{exc.detail}; the payload looks like JSON but is labelled "
                    f"{content_type!r}: label it application/json",
                ) from None
            raise
    if form is not None:
        return _from_json(load_json(payload), form)
    if not _looks_like_json(payload):
        try:
            return decode_otlp_protobuf(payload)
        except SpanDecodeError:
            if _is_text(payload):
                raise SpanDecodeError(
                    BAD_JSON,
                    f"message is text, but neither a JSON object or array nor OTLP "
                    f"protobuf: starts with {payload.decode()[:40]!r}",
                ) from None
            raise
    try:
        return _from_json(load_json(payload), None)
    except SpanDecodeError as json_error:
        # "\n{" is also how a protobuf request with a 123-byte first field begins.
        if payload[:1] != b"\n":
            raise
        try:
            return decode_otlp_protobuf(payload)
        except SpanDecodeError:
            raise json_error from None
