"""OTLP protobuf: the binary ``ExportTraceServiceRequest`` (same wire as ``TracesData``)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2
from pydantic import ValidationError

from spanmill.spans.errors import SpanDecodeError
from spanmill.spans.otlp_common import (
    KIND_FROM_OTLP,
    KIND_TO_OTLP,
    PROTO_NAMES,
    STATUS_FROM_OTLP,
    STATUS_TO_OTLP,
    group_spans,
    locator,
    to_attribute,
)
from spanmill.spans.protowire import diagnose
from spanmill.spans.record import AttributeValue, Span, StatusCode
from spanmill.spans.validation import decode_error


def _pb_plain(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        return value.double_value
    if which == "array_value":
        return [_pb_plain(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {pair.key: _pb_plain(pair.value) for pair in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return None


def _pb_attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        value = to_attribute(_pb_plain(pair.value))
        if value is not None:
            out[pair.key] = value
    return out


def _pb_set(target: AnyValue, value: AttributeValue) -> None:
    kind = type(value)
    if kind is str:
        target.string_value = value  # type: ignore[assignment]
    elif kind is bool:
        target.bool_value = value  # type: ignore[assignment]
    elif kind is int:
        target.int_value = value  # type: ignore[assignment]
    elif kind is float:
        target.double_value = value  # type: ignore[assignment]
    else:
        array = target.array_value
        array.SetInParent()  # an empty array is still an array, not an empty value
        for item in value:  # type: ignore[union-attr]
            _pb_set(array.values.add(), item)


def _pb_fill_attributes(target: Any, attributes: dict[str, AttributeValue]) -> None:
    for key, value in attributes.items():
        pair = target.add()
        pair.key = key
        _pb_set(pair.value, value)


def _to_pb(span: Span, target: trace_pb2.Span) -> None:
    target.trace_id = bytes.fromhex(span.trace_id)
    target.span_id = bytes.fromhex(span.span_id)
    if span.parent_span_id is not None:
        target.parent_span_id = bytes.fromhex(span.parent_span_id)
    target.name = span.name
    target.kind = KIND_TO_OTLP[span.kind]  # type: ignore[assignment]
    target.start_time_unix_nano = span.start_time_unix_nano
    target.end_time_unix_nano = span.end_time_unix_nano
    _pb_fill_attributes(target.attributes, span.attributes)
    for event in span.events:
        pb_event = target.events.add()
        pb_event.name = event.name
        pb_event.time_unix_nano = event.time_unix_nano
        _pb_fill_attributes(pb_event.attributes, event.attributes)
    for link in span.links:
        pb_link = target.links.add()
        pb_link.trace_id = bytes.fromhex(link.trace_id)
        pb_link.span_id = bytes.fromhex(link.span_id)
        _pb_fill_attributes(pb_link.attributes, link.attributes)
    if span.status_code is not StatusCode.UNSET:
        target.status.code = STATUS_TO_OTLP[span.status_code]  # type: ignore[assignment]
    if span.status_message:
        target.status.message = span.status_message


def to_otlp_request(spans: Iterable[Span]) -> ExportTraceServiceRequest:
    """The spans as an OTLP ``ExportTraceServiceRequest`` message."""
    request = ExportTraceServiceRequest()
    for resource_group in group_spans(spans):
        resource_spans = request.resource_spans.add()
        _pb_fill_attributes(
            resource_spans.resource.attributes, resource_group[0][0].resource_attributes
        )
        for scope_group in resource_group:
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = scope_group[0].scope_name
            scope_spans.scope.version = scope_group[0].scope_version
            for span in scope_group:
                _to_pb(span, scope_spans.spans.add())
    return request


def encode_otlp_protobuf(spans: Iterable[Span]) -> bytes:
    """Serialize spans as a binary ``ExportTraceServiceRequest`` (same wire as TracesData)."""
    return to_otlp_request(spans).SerializeToString()


def decode_otlp_protobuf(payload: bytes) -> list[Span]:
    """Decode a binary ``ExportTraceServiceRequest`` or ``TracesData``; raises SpanDecodeError."""
    try:
        request = ExportTraceServiceRequest.FromString(payload)
    except (DecodeError, RuntimeError):
        reason, detail = diagnose(payload, ExportTraceServiceRequest.DESCRIPTOR)
        raise SpanDecodeError(reason, detail) from None
    if payload and not request.resource_spans:
        # The parser keeps what it does not know as unknown fields; bytes that hold
        # nothing but those are not a trace export, and must not pass as zero spans.
        reason, detail = diagnose(payload, ExportTraceServiceRequest.DESCRIPTOR)
        if detail.startswith("not a valid"):
            detail = "message holds no resource_spans (field 1); is it an OTLP trace export?"
        raise SpanDecodeError(reason, detail)
    return from_otlp_request(request)


def from_otlp_request(request: ExportTraceServiceRequest) -> list[Span]:
    """The spans of a parsed OTLP ``ExportTraceServiceRequest``."""
    spans = []
    for i, resource_spans in enumerate(request.resource_spans):
        resource = _pb_attributes(resource_spans.resource.attributes)
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            scope_name, scope_version = scope_spans.scope.name, scope_spans.scope.version
            for k, pb in enumerate(scope_spans.spans):
                fields = {
                    "trace_id": pb.trace_id.hex(),
                    "span_id": pb.span_id.hex(),
                    "parent_span_id": pb.parent_span_id.hex(),
                    "name": pb.name,
                    "kind": KIND_FROM_OTLP.get(pb.kind, pb.kind),
                    "start_time_unix_nano": pb.start_time_unix_nano,
                    "end_time_unix_nano": pb.end_time_unix_nano,
                    "status_code": STATUS_FROM_OTLP.get(pb.status.code, pb.status.code),
                    "status_message": pb.status.message,
                    "attributes": _pb_attributes(pb.attributes),
                    "resource_attributes": resource,
                    "scope_name": scope_name,
                    "scope_version": scope_version,
                    "events": [
                        {
                            "name": event.name,
                            "time_unix_nano": event.time_unix_nano,
                            "attributes": _pb_attributes(event.attributes),
                        }
                        for event in pb.events
                    ],
                    "links": [
                        {
                            "trace_id": link.trace_id.hex(),
                            "span_id": link.span_id.hex(),
                            "attributes": _pb_attributes(link.attributes),
                        }
                        for link in pb.links
                    ],
                }
                try:
                    spans.append(Span.model_validate(fields))
                except ValidationError as exc:
                    resource_path = f"resource_spans[{i}]"
                    scope_path = f"{resource_path}.scope_spans[{j}]"
                    locate = locator(
                        f"{scope_path}.spans[{k}]", resource_path, scope_path, PROTO_NAMES
                    )
                    raise decode_error(exc, locate) from None
    return spans
