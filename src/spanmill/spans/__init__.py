"""Span contracts: the typed record, its encodings, and decoding whatever producers send.

See :mod:`spanmill.semconv` for the attribute names, and the design's "Data
contracts" for how spans travel (Kafka topic ``spanmill.spans.v1``).
"""

from spanmill.spans.codec import (
    MAX_MESSAGE_BYTES,
    SpanFormat,
    detect_and_decode,
    format_from_content_type,
)
from spanmill.spans.errors import REASONS, SpanDecodeError
from spanmill.spans.otlp import (
    decode_otlp_json,
    decode_otlp_protobuf,
    encode_otlp_json,
    encode_otlp_protobuf,
    from_otlp_request,
    to_otlp_request,
)
from spanmill.spans.record import (
    MAX_ATTRIBUTE_VALUE_BYTES,
    Attributes,
    AttributeValue,
    Reward,
    Span,
    SpanEvent,
    SpanKind,
    SpanLink,
    StatusCode,
)
from spanmill.spans.sdk_json import decode_spans, encode_span, encode_spans, span_to_dict

__all__ = [
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_MESSAGE_BYTES",
    "REASONS",
    "AttributeValue",
    "Attributes",
    "Reward",
    "Span",
    "SpanDecodeError",
    "SpanEvent",
    "SpanFormat",
    "SpanKind",
    "SpanLink",
    "StatusCode",
    "decode_otlp_json",
    "decode_otlp_protobuf",
    "decode_spans",
    "detect_and_decode",
    "encode_otlp_json",
    "encode_otlp_protobuf",
    "encode_span",
    "encode_spans",
    "format_from_content_type",
    "from_otlp_request",
    "span_to_dict",
    "to_otlp_request",
]
