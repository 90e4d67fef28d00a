"""Decoding one Kafka record: the native decoder where it can read it whole, else the authority.

:func:`spanmill.spans.detect_and_decode` is the authority on what a valid span
is, and says precisely why a payload is not. It builds a validated
:class:`~spanmill.spans.Span` per span, which costs more than the rest of the
collector together. Most records are OTLP protobuf with plain attributes, so where
the package was built with its C extension (:mod:`spanmill._native`), the native
decoder reads those from the wire bytes straight into the store's columns
(``Decoder.append_record``), checking the same rules the record model checks.
Anything unusual (a bad id, a nested or mixed array, an oversize value, ...) it
gives back to the authority, which then gives the spans or the error: the native
path may only ever say "these rows, exactly as the authority's spans would make
them" or "ask the authority". Tests hold it to that.

Without the extension every record goes to the authority: the same rows, slower.
There is one native path, and the authority is both the fallback and the tests' oracle.
"""

from __future__ import annotations

from typing import Any, Final

from spanmill import native
from spanmill.spans import SpanFormat, detect_and_decode, format_from_content_type
from spanmill.store.rows import HourlyColumns, SpanParts


def _looks_like_json(payload: bytes) -> bool:
    start = payload[:64].lstrip(b" \t\r\n")
    return start[:1] in (b"{", b"[") or start.startswith(b"\xef\xbb\xbf")


FAST_PATH: Final = "native" if native.module is not None else "authority only"


def decode_spans(payload: bytes, content_type: str | None, max_bytes: int) -> list[SpanParts]:
    """The spans of one record's value, by the authority; raises SpanDecodeError with the
    reason it is refused."""
    spans = detect_and_decode(payload, content_type, max_bytes=max_bytes)
    return [SpanParts.from_span(span) for span in spans]


def native_count(
    decoder: Any, payload: bytes, content_type: str | None, max_bytes: int
) -> int | None:
    """How many spans a record holds, where the native decoder reads it whole (it writes
    their rows into columns of its own, dropped after); None: the authority must say."""
    if decoder is None or not native_may_read(payload, content_type, max_bytes):
        return None
    return HourlyColumns(decoder=decoder).append_record(payload)


def _fast_path_may_read(payload: bytes, content_type: str | None) -> bool:
    """Whether a record's value is for the fast path (labelled or sniffed OTLP protobuf)."""
    try:
        form = format_from_content_type(content_type) if content_type else None
    except ValueError:
        form = None  # the authority raises the precise error
    if form is SpanFormat.OTLP_PROTOBUF:
        return True
    # "\n{" also begins a protobuf export whose first field is 123 bytes long. JSON
    # text cannot pass the native path's strict reading of the wire (its first
    # characters are fields OTLP does not have), so it may try it.
    return content_type is None and (payload[:1] == b"\n" or not _looks_like_json(payload))


def native_may_read(payload: bytes, content_type: str | None, max_bytes: int) -> bool:
    """Whether the native decoder may read this record's value (it then reads or defers)."""
    return (
        native.module is not None
        and 0 < len(payload) <= max_bytes
        and _fast_path_may_read(payload, content_type)
    )
