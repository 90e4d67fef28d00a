"""The one error span decoding raises, with a reason code machines can route on."""

from __future__ import annotations

from typing import Final

from spanmill.errors import SpanmillError

# Reason codes: stable, short, and written into the dead-letter header as they are.
BAD_JSON: Final = "bad_json"
BAD_PROTOBUF: Final = "bad_protobuf"
INVALID_UTF8: Final = "invalid_utf8"
SCHEMA: Final = "schema"
OVERSIZE: Final = "oversize"
EMPTY: Final = "empty"
UNSUPPORTED_CONTENT_TYPE: Final = "unsupported_content_type"
REASONS: Final = frozenset(
    {BAD_JSON, BAD_PROTOBUF, INVALID_UTF8, SCHEMA, OVERSIZE, EMPTY, UNSUPPORTED_CONTENT_TYPE}
)


class SpanDecodeError(SpanmillError, ValueError):
    """A payload could not be turned into spans.

    ``reason`` is one of :data:`REASONS`; ``detail`` says which field of the
    payload is wrong and why, e.g. ``spans[0].trace_id: must be 32 hex
    characters, got 'xyz'``.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[SpanDecodeError], tuple[str, str]]:
        # Keeps the error picklable across process pools despite the 2-arg init.
        return (type(self), (self.reason, self.detail))
