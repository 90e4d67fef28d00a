"""Decoding one Kafka record into span parts, with a fast path for OTLP protobuf.

:func:`spanmill.spans.detect_and_decode` is the authority on what a valid span
is, and says precisely why a payload is not. It builds a validated
:class:`~spanmill.spans.Span` per span, which costs more than the rest of the
collector together. Most records are OTLP protobuf with plain attributes, so
:func:`decode_record` reads those straight into :class:`~spanmill.store.SpanParts`,
checking the same rules the record model checks. Anything unusual (a bad id, a
nested or mixed array, an oversize value, ...) falls back to the authority, which
then gives the spans or the error: the fast path may only ever say "these spans,
exactly as the authority would give them" or "ask the authority". Tests hold it
to that.

The fast path is native where the package was built with its C extension
(:mod:`spanmill._native`, which reads the wire bytes without building
protobuf messages), and Python otherwise (:func:`python_fast_path`, over the
parsed message). Both give the same answers.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Final, NamedTuple

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from spanmill import native
from spanmill.collector.redact import Prefilter
from spanmill.spans import SpanFormat, detect_and_decode, format_from_content_type
from spanmill.spans.record import MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_BYTES, MAX_NAME_CHARS
from spanmill.store.rows import SpanParts

_ZERO_TRACE: Final = bytes(16)
_UINT64: Final = (1 << 64) - 1
_ZERO_SPAN: Final = bytes(8)
# OTLP enum numbers to the record's words; 0 (unspecified) reads as internal.
_KINDS: Final = {
    0: "internal",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
_STATUS: Final = {0: "unset", 1: "ok", 2: "error"}


# An ArrayValue's wire bytes when every item is an int, a double or a bool: each item
# is field 1 (length-delimited AnyValue) holding exactly one field of that type
# (AnyValue fields: bool 2, varint; int 3, varint; double 4, fixed64). A
# full match proves every item holds that type and nothing else, in C, so the values
# can then be read without asking each item which field it holds.
_VARINT_ITEMS: Final = re.compile(
    b"(?:"
    + b"|".join(
        b"\x0a" + bytes([2 + extra]) + b"\x18" + b"[\x80-\xff]" * extra + b"[\x00-\x7f]"
        for extra in range(10)
    )
    + b")*"
)
# Each int item's varint, once _VARINT_ITEMS has matched the whole array.
_VARINT_VALUES: Final = re.compile(b"\x0a[\x02-\x0b]\x18([\x80-\xff]*[\x00-\x7f])")
_DOUBLE_ITEMS: Final = re.compile(b"(?:\x0a\x09\x21[\x00-\xff]{8})*", re.DOTALL)
_BOOL_ITEMS: Final = re.compile(b"(?:\x0a\x02\x10[\x00\x01])*")


@lru_cache(maxsize=256)
def _doubles(count: int) -> struct.Struct:
    # Each item: 3 bytes of framing, then the little-endian double.
    return struct.Struct("<" + "3xd" * count)


class _Unusual(Exception):
    """The fast path cannot vouch for this payload: let the authority decide."""


def _check_text(value: str) -> None:
    # len() counts characters; only long strings pay for the exact UTF-8 size.
    if (
        len(value) * 4 > MAX_ATTRIBUTE_VALUE_BYTES
        and len(value.encode()) > MAX_ATTRIBUTE_VALUE_BYTES
    ):
        raise _Unusual


def _attributes(pairs: Any, long: bool) -> dict[str, Any]:
    """Plain attributes; ``long``: the payload is big enough to hold an oversize string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key = pair.key
        if not key or len(key) > MAX_ATTRIBUTE_KEY_CHARS:
            raise _Unusual
        value = pair.value
        which = value.WhichOneof("value")
        if which == "string_value":
            text = value.string_value
            if long:
                _check_text(text)
            out[key] = text
        elif which == "int_value":
            out[key] = value.int_value
        elif which == "double_value":
            out[key] = value.double_value
        elif which == "bool_value":
            out[key] = value.bool_value
        elif which == "array_value":
            out[key] = _array(value.array_value, long)
        else:
            raise _Unusual
    return out


def _array(array_value: Any, long: bool) -> list[Any]:
    """A homogeneous array's values; ints, doubles and bools are checked on the wire bytes."""
    items = array_value.values
    if not items:
        return []
    raw = array_value.SerializeToString()
    if _VARINT_ITEMS.fullmatch(raw):
        return _ints(raw)
    if _DOUBLE_ITEMS.fullmatch(raw):
        return list(_doubles(len(items)).unpack(raw))
    if _BOOL_ITEMS.fullmatch(raw):
        return [item.bool_value for item in items]
    first = items[0].WhichOneof("value")
    if first != "string_value":
        raise _Unusual  # mixed, nested or empty items: the authority says why
    for item in items:
        if item.WhichOneof("value") != first:
            raise _Unusual
    array = [item.string_value for item in items]
    if long:
        for text in array:
            _check_text(text)
    return array


def _ints(raw: bytes) -> list[int]:
    """The int64 values of an ArrayValue of ints, from its wire bytes."""
    values = []
    for varint in _VARINT_VALUES.findall(raw):
        size = len(varint)
        if size == 1:
            values.append(varint[0])
        elif size == 2:
            values.append((varint[0] & 0x7F) | (varint[1] << 7))
        else:
            value = 0
            for shift, byte in enumerate(varint):
                value |= (byte & 0x7F) << (7 * shift)
            value &= _UINT64
            values.append(value - (1 << 64) if value >> 63 else value)
    return values


def _span_id(raw: bytes, size: int, zero: bytes) -> str:
    if len(raw) != size or raw == zero:
        raise _Unusual
    return raw.hex()


def _name(text: str) -> str:
    if not text or len(text) > MAX_NAME_CHARS:
        raise _Unusual
    return text


def python_fast_path(payload: bytes) -> list[SpanParts] | None:
    """The spans of a plain OTLP protobuf export, or None: ask the authority."""
    try:
        return _fast_protobuf(payload)
    except _Unusual:
        return None


def _fast_protobuf(payload: bytes) -> list[SpanParts]:
    try:
        request = ExportTraceServiceRequest.FromString(payload)
    except (DecodeError, RuntimeError):
        raise _Unusual from None
    if not request.resource_spans:
        raise _Unusual
    # No string can be longer than the payload that holds it.
    long = len(payload) > MAX_ATTRIBUTE_VALUE_BYTES
    out = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes, long)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            scope_name, scope_version = scope.name, scope.version
            for pb in scope_spans.spans:
                parent = pb.parent_span_id
                start, end = pb.start_time_unix_nano, pb.end_time_unix_nano
                if end < start:
                    raise _Unusual
                kind = _KINDS.get(pb.kind)
                status = pb.status
                code = _STATUS.get(status.code)
                if kind is None or code is None:
                    raise _Unusual
                events = [
                    (_name(event.name), event.time_unix_nano, _attributes(event.attributes, long))
                    for event in pb.events
                ]
                links = [
                    (
                        _span_id(link.trace_id, 16, _ZERO_TRACE),
                        _span_id(link.span_id, 8, _ZERO_SPAN),
                        _attributes(link.attributes, long),
                    )
                    for link in pb.links
                ]
                out.append(
                    SpanParts(
                        _span_id(pb.trace_id, 16, _ZERO_TRACE),
                        _span_id(pb.span_id, 8, _ZERO_SPAN),
                        _span_id(parent, 8, _ZERO_SPAN) if parent else None,
                        _name(pb.name),
                        kind,
                        start,
                        end,
                        code,
                        status.message,
                        _attributes(pb.attributes, long),
                        resource,
                        scope_name,
                        scope_version,
                        events,
                        links,
                    )
                )
    return out


def _looks_like_json(payload: bytes) -> bool:
    start = payload[:64].lstrip(b" \t\r\n")
    return start[:1] in (b"{", b"[") or start.startswith(b"\xef\xbb\xbf")


FastPath = Callable[[bytes], "list[SpanParts] | None"]


if native.module is not None:
    # SpanParts.__init__ only stores its arguments: instances are made slot by slot.
    native.module.configure(
        SpanParts, MAX_NAME_CHARS, MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_BYTES, True
    )
NATIVE_FAST_PATH: Final[FastPath | None] = native.module.decode if native.module else None
FAST_PATH: Final = "native" if NATIVE_FAST_PATH is not None else "python"
_fast_path: FastPath = NATIVE_FAST_PATH or python_fast_path


class Decoded(NamedTuple):
    """A record's spans.

    ``verbatim``: every text they hold lies in the payload as UTF-8. True only for
    the fast path, which copies strings from the protobuf wire as they are. The
    authority may have made text (JSON unescaping, base64 of bytes, JSON of nested
    values), so its spans are never verbatim.

    ``may_match``: False only when the native path scanned the texts redaction
    reads for what a prefilter asked and found none of it.
    """

    spans: list[SpanParts]
    verbatim: bool
    may_match: bool = True


def decode_spans(
    payload: bytes,
    content_type: str | None,
    max_bytes: int,
    prefilter: Prefilter | None = None,
) -> Decoded:
    """The spans of one record's value; raises SpanDecodeError with the reason it is refused.

    ``prefilter``: the gates and digit run of :attr:`Redactor.prefilter`, to scan for.
    """
    if 0 < len(payload) <= max_bytes:
        native_path = _fast_path is NATIVE_FAST_PATH
        if _fast_path_may_read(payload, content_type, native_path):
            if prefilter is not None and native_path and native.module is not None:
                scanned = native.module.decode(payload, *prefilter)
                if scanned is not None:
                    return Decoded(scanned[0], True, scanned[1])
            else:
                fast = _fast_path(payload)
                if fast is not None:
                    return Decoded(fast, True)
    spans = detect_and_decode(payload, content_type, max_bytes=max_bytes)
    return Decoded([SpanParts.from_span(span) for span in spans], False)


def _fast_path_may_read(payload: bytes, content_type: str | None, native_path: bool) -> bool:
    """Whether a record's value is for a fast path (labelled or sniffed OTLP protobuf)."""
    try:
        form = format_from_content_type(content_type) if content_type else None
    except ValueError:
        form = None  # the authority raises the precise error
    if form is SpanFormat.OTLP_PROTOBUF:
        return True
    # "\n{" also begins a protobuf export whose first field is 123 bytes long. JSON
    # text cannot pass the native path's strict reading of the wire (its first
    # characters are fields OTLP does not have), so that path may try it; the
    # Python one keeps unknown fields and must not.
    return content_type is None and (
        (native_path and payload[:1] == b"\n") or not _looks_like_json(payload)
    )


def native_may_read(payload: bytes, content_type: str | None, max_bytes: int) -> bool:
    """Whether the native decoder may read this record's value (it then reads or defers)."""
    return (
        NATIVE_FAST_PATH is not None
        and 0 < len(payload) <= max_bytes
        and _fast_path_may_read(payload, content_type, True)
    )


def decode_record(payload: bytes, content_type: str | None, max_bytes: int) -> list[SpanParts]:
    """The spans of one record's value; raises SpanDecodeError with the reason it is refused."""
    return decode_spans(payload, content_type, max_bytes).spans
