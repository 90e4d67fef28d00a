"""What both OTLP encodings share: enum tables, grouping, and AnyValue flattening.

See :mod:`spanmill.spans.otlp` for the choices these encode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

from spanmill.spans.record import AttributeValue, Span, SpanKind, StatusCode
from spanmill.spans.validation import Locate, join_loc

KIND_FROM_OTLP: Final[dict[object, SpanKind]] = {
    0: SpanKind.INTERNAL,  # unspecified: the specification lets receivers assume internal
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
    "SPAN_KIND_UNSPECIFIED": SpanKind.INTERNAL,
    "SPAN_KIND_INTERNAL": SpanKind.INTERNAL,
    "SPAN_KIND_SERVER": SpanKind.SERVER,
    "SPAN_KIND_CLIENT": SpanKind.CLIENT,
    "SPAN_KIND_PRODUCER": SpanKind.PRODUCER,
    "SPAN_KIND_CONSUMER": SpanKind.CONSUMER,
}
KIND_TO_OTLP: Final = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
STATUS_FROM_OTLP: Final[dict[object, StatusCode]] = {
    0: StatusCode.UNSET,
    1: StatusCode.OK,
    2: StatusCode.ERROR,
    "STATUS_CODE_UNSET": StatusCode.UNSET,
    "STATUS_CODE_OK": StatusCode.OK,
    "STATUS_CODE_ERROR": StatusCode.ERROR,
}
STATUS_TO_OTLP: Final = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
_SCALARS: Final = frozenset({str, bool, int, float})
JSON_NAMES: Final = {
    "trace_id": "traceId",
    "span_id": "spanId",
    "parent_span_id": "parentSpanId",
    "start_time_unix_nano": "startTimeUnixNano",
    "end_time_unix_nano": "endTimeUnixNano",
    "time_unix_nano": "timeUnixNano",
    "status_code": "status.code",
    "status_message": "status.message",
}
PROTO_NAMES: Final = {"status_code": "status.code", "status_message": "status.message"}


def group_spans(spans: Iterable[Span]) -> Iterator[list[list[Span]]]:
    """Consecutive spans by resource, then by scope: order survives a round trip."""
    resource: list[list[Span]] = []
    for span in spans:
        if resource and span.resource_attributes == resource[0][0].resource_attributes:
            head = resource[-1][0]
            if (span.scope_name, span.scope_version) == (head.scope_name, head.scope_version):
                resource[-1].append(span)
            else:
                resource.append([span])
        else:
            if resource:
                yield resource
            resource = [[span]]
    if resource:
        yield resource


def to_attribute(plain: Any) -> AttributeValue | None:
    """A decoded AnyValue as a span attribute value; :mod:`spanmill.spans.otlp` says how."""
    if type(plain) is list:
        kinds = {type(item) for item in plain}
        if (len(kinds) <= 1 and kinds <= _SCALARS) or kinds == {int, float}:
            return plain
        return json.dumps(plain, ensure_ascii=False)
    if type(plain) is dict:
        return json.dumps(plain, ensure_ascii=False)
    return plain


def locator(span_path: str, resource_path: str, scope_path: str, names: dict[str, str]) -> Locate:
    """Maps a location inside a Span to the path of that field in the OTLP payload."""

    def locate(loc: tuple[int | str, ...]) -> str:
        if not loc:
            return span_path
        head = loc[0]
        if head == "resource_attributes":
            return join_loc(f"{resource_path}.resource.attributes", loc[1:])
        if head in ("scope_name", "scope_version"):
            return f"{scope_path}.scope.{str(head).removeprefix('scope_')}"
        return join_loc(span_path, tuple(names.get(p, p) if isinstance(p, str) else p for p in loc))

    return locate
