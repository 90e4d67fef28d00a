"""OTLP trace encodings: protobuf (``ExportTraceServiceRequest``) and OTLP/JSON.

OTLP/JSON follows the OTLP specification, as the OpenTelemetry Collector's Kafka
exporter writes it with ``otlp_json``: lowerCamelCase field names (snake_case is
accepted too), trace and span ids as hex strings (not protobuf JSON's base64),
64-bit integers as decimal strings (numbers accepted), enums as integers (names
accepted), and unknown fields ignored. It is hand-written rather than run through
protobuf's JSON mapping, which would read ids as base64 and report errors without
saying which span they are in.

What does not fit a :class:`Span` attribute value, which is a scalar or an array
of one scalar type, is carried as text rather than dropped: a ``kvlistValue``, and
an ``arrayValue`` that is nested or mixes types, become their JSON text; a
``bytesValue`` becomes its base64 text. Such values come back as ``stringValue``
when encoded again. An empty AnyValue carries nothing and its attribute is left out.
Trace state, trace flags and dropped-item counts are not carried.

Spans are grouped under one ``ResourceSpans`` / ``ScopeSpans`` while consecutive
spans share their resource and scope, so that decoding gives back the same order.
"""

from spanmill.spans.otlp_json import (
    decode_otlp_json,
    encode_otlp_json,
    spans_from_otlp_document,
    to_otlp_document,
)
from spanmill.spans.otlp_protobuf import (
    decode_otlp_protobuf,
    encode_otlp_protobuf,
    from_otlp_request,
    to_otlp_request,
)

__all__ = [
    "decode_otlp_json",
    "decode_otlp_protobuf",
    "encode_otlp_json",
    "encode_otlp_protobuf",
    "from_otlp_request",
    "spans_from_otlp_document",
    "to_otlp_document",
    "to_otlp_request",
]
