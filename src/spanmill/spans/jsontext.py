"""Reading JSON payloads strictly: UTF-8 only, and no lone surrogates smuggled in."""

from __future__ import annotations

import json
import re
from typing import Any, Final

from spanmill.spans.errors import BAD_JSON, INVALID_UTF8, SpanDecodeError
from spanmill.spans.validation import join_loc

_BOM = b"\xef\xbb\xbf"
# A \uD800-\uDFFF escape: valid in pairs, but json.loads also lets a lone one through,
# and such a string cannot be written to protobuf or Parquet later.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")


def _line_column(payload: bytes, offset: int) -> tuple[int, int]:
    line = payload.count(b"\n", 0, offset) + 1
    return line, offset - (payload.rfind(b"\n", 0, offset) + 1) + 1


def load_json(payload: bytes) -> Any:
    """Parse a UTF-8 JSON document, raising SpanDecodeError that points at the fault."""
    if payload.startswith(_BOM):
        payload = payload[len(_BOM) :]
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _line_column(payload, exc.start)
        raise SpanDecodeError(
            INVALID_UTF8,
            f"byte 0x{payload[exc.start]:02x} at offset {exc.start} (line {line}, column "
            f"{column}) is not valid UTF-8; JSON payloads must be UTF-8 encoded",
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpanDecodeError(
            BAD_JSON, f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise SpanDecodeError(BAD_JSON, "JSON is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text):
        path = _lone_surrogate(document, ())
        if path is not None:
            raise SpanDecodeError(
                INVALID_UTF8,
                f"{path or 'document'}: contains an unpaired UTF-16 surrogate escape "
                "(\\ud800-\\udfff), which is not valid Unicode text",
            )
    return document


def _lone_surrogate(value: Any, loc: tuple[int | str, ...]) -> str | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return join_loc("", loc)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, (*loc, index))
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate(key, loc)
            if found is None:
                found = _lone_surrogate(item, (*loc, key))
            if found is not None:
                return found
    return None


# JSON text as spanmill writes it everywhere (payloads, the store's columns, translated
# messages): no spaces, non-ASCII kept. One encoder for every call (json.dumps with
# options makes one a call); the documents come from parsed payloads or are built by
# code, so none holds a cycle.
compact_json: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), check_circular=False
).encode


def dump_json(document: Any) -> bytes:
    return compact_json(document).encode("utf-8")
