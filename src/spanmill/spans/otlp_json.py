"""OTLP/JSON, hand-written: hex ids, decimal-string 64-bit integers, paths in errors.

See :mod:`spanmill.spans.otlp` for what is accepted and how values are mapped.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Iterable
from typing import Any, Final

from pydantic import ValidationError

from spanmill.spans.errors import SCHEMA, SpanDecodeError
from spanmill.spans.jsontext import dump_json, load_json
from spanmill.spans.otlp_common import (
    JSON_NAMES,
    KIND_FROM_OTLP,
    KIND_TO_OTLP,
    STATUS_FROM_OTLP,
    STATUS_TO_OTLP,
    group_spans,
    locator,
    to_attribute,
)
from spanmill.spans.record import AttributeValue, Span, StatusCode, show
from spanmill.spans.validation import (
    FieldError,
    decode_error,
    field_decode_error,
    join_path,
)

_INT64: Final = re.compile(r"-?[0-9]{1,19}")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NON_FINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _nested(exc: FieldError, prefix: str) -> FieldError:
    return FieldError(join_path(prefix, exc.path), exc.message, exc.reason)


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _json_int(item: Any, field: str) -> int:
    if type(item) is int:
        number = item
    elif type(item) is str and _INT64.fullmatch(item):
        number = int(item)
    else:
        raise FieldError(field, f"must be a 64-bit integer or its decimal string, got {show(item)}")
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise FieldError(field, f"{number} does not fit in 64 bits")
    return number


def _json_double(item: Any, field: str) -> float:
    if type(item) is float or type(item) is int:
        return float(item)
    if type(item) is str:
        if item in _NON_FINITE:
            return _NON_FINITE[item]
        try:
            return float(item)
        except ValueError:
            pass
    raise FieldError(field, f"must be a number, 'NaN', 'Infinity' or '-Infinity', got {show(item)}")


def _json_bytes(item: Any, field: str) -> str:
    if type(item) is str:
        try:
            # Producers write either base64 alphabet; normalise to the standard one.
            raw = base64.b64decode(item.replace("-", "+").replace("_", "/"), validate=True)
            return base64.b64encode(raw).decode("ascii")
        except (binascii.Error, ValueError):
            pass
    raise FieldError(field, f"must be base64 text, got {show(item)}")


def _json_plain(value: Any) -> Any:
    """An OTLP/JSON AnyValue as a plain Python value (None when empty)."""
    if type(value) is not dict:
        raise FieldError(
            "", f'must be an AnyValue object like {{"stringValue": "..."}}, got {show(value)}'
        )
    if not value:
        return None
    if len(value) != 1:
        raise FieldError("", f"must hold exactly one value, got fields {sorted(value)}")
    ((field, item),) = value.items()
    if field in ("stringValue", "string_value"):
        if type(item) is str:
            return item
        raise FieldError(field, f"must be a string, got {show(item)}")
    if field in ("boolValue", "bool_value"):
        if type(item) is bool:
            return item
        raise FieldError(field, f"must be true or false, got {show(item)}")
    if field in ("intValue", "int_value"):
        return _json_int(item, field)
    if field in ("doubleValue", "double_value"):
        return _json_double(item, field)
    if field in ("bytesValue", "bytes_value"):
        return _json_bytes(item, field)
    if field in ("arrayValue", "array_value", "kvlistValue", "kvlist_value"):
        values = item.get("values") if type(item) is dict else None
        if type(item) is not dict or (values is not None and type(values) is not list):
            raise FieldError(field, f'must be an object like {{"values": [...]}}, got {show(item)}')
        if field in ("arrayValue", "array_value"):
            return [
                _json_each(element, f"{field}.values[{n}]")
                for n, element in enumerate(values or ())
            ]
        return _json_pairs(values or [], f"{field}.values")
    raise FieldError(
        field,
        "is not an AnyValue field; expected one of stringValue, boolValue, intValue, "
        "doubleValue, arrayValue, kvlistValue, bytesValue",
    )


def _json_each(element: Any, path: str) -> Any:
    try:
        return _json_plain(element)
    except FieldError as exc:
        raise _nested(exc, path) from None


def _json_pairs(pairs: Any, path: str) -> dict[str, Any]:
    if pairs is None:
        return {}
    if type(pairs) is not list:
        raise FieldError(
            path, f'must be an array of {{"key": ..., "value": ...}} objects, got {show(pairs)}'
        )
    out = {}
    for n, pair in enumerate(pairs):
        if type(pair) is not dict or type(pair.get("key")) is not str:
            raise FieldError(
                f"{path}[{n}]", f"must be an object with a string 'key', got {show(pair)}"
            )
        out[pair["key"]] = _json_each(pair.get("value", {}), f"{path}[{n}].value")
    return out


def _json_attributes(pairs: Any, path: str) -> dict[str, Any]:
    out = {}
    for key, plain in _json_pairs(pairs, path).items():
        value = to_attribute(plain)
        if value is not None:
            out[key] = value
    return out


def _json_object(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise FieldError(path, f"must be an object, got {show(value)}")
    return value


def _json_list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if type(value) is not list:
        raise FieldError(path, f"must be an array, got {show(value)}")
    return value


_SPAN_FIELDS: Final = (
    ("traceId", "trace_id"),
    ("spanId", "span_id"),
    ("parentSpanId", "parent_span_id"),
    ("name", "name"),
    ("startTimeUnixNano", "start_time_unix_nano"),
    ("endTimeUnixNano", "end_time_unix_nano"),
)


def _enum(table: dict[object, Any], value: Any) -> Any:
    # Anything else goes through as it is, for the record's validation to name it.
    return table.get(value, value) if type(value) is int or type(value) is str else value


def _json_span_fields(obj: Any) -> dict[str, Any]:
    """Keyword arguments for Span from one OTLP/JSON span, resource and scope aside."""
    if type(obj) is not dict:
        raise FieldError("", f"must be a span object, got {show(obj)}")
    fields: dict[str, Any] = {}
    for camel, snake in _SPAN_FIELDS:
        value = _get(obj, camel, snake)
        if value is not None:
            fields[snake] = value
    kind = obj.get("kind")
    if kind is not None:
        fields["kind"] = _enum(KIND_FROM_OTLP, kind)
    status = _json_object(obj.get("status"), "status")
    code = status.get("code")
    if code is not None:
        fields["status_code"] = _enum(STATUS_FROM_OTLP, code)
    if status.get("message") is not None:
        fields["status_message"] = status["message"]
    fields["attributes"] = _json_attributes(obj.get("attributes"), "attributes")
    events = []
    for n, item in enumerate(_json_list(obj.get("events"), "events")):
        event = _json_object(item, f"events[{n}]")
        entry = {"attributes": _json_attributes(event.get("attributes"), f"events[{n}].attributes")}
        if event.get("name") is not None:
            entry["name"] = event["name"]
        time = _get(event, "timeUnixNano", "time_unix_nano")
        if time is not None:
            entry["time_unix_nano"] = time
        events.append(entry)
    fields["events"] = events
    links = []
    for n, item in enumerate(_json_list(obj.get("links"), "links")):
        link = _json_object(item, f"links[{n}]")
        entry = {"attributes": _json_attributes(link.get("attributes"), f"links[{n}].attributes")}
        for camel, snake in (("traceId", "trace_id"), ("spanId", "span_id")):
            value = _get(link, camel, snake)
            if value is not None:
                entry[snake] = value
        links.append(entry)
    fields["links"] = links
    return fields


def spans_from_otlp_document(document: Any) -> list[Span]:
    """The spans of a parsed OTLP/JSON ``ExportTraceServiceRequest`` / ``TracesData``."""
    if type(document) is not dict:
        raise SpanDecodeError(
            SCHEMA,
            f'document: must be an object like {{"resourceSpans": [...]}}, got {show(document)}',
        )
    if document and "resourceSpans" not in document and "resource_spans" not in document:
        raise SpanDecodeError(
            SCHEMA,
            f"document: has no resourceSpans, only {', '.join(sorted(document)[:5])}; "
            "is it OTLP/JSON?",
        )
    try:
        resource_list = _json_list(
            _get(document, "resourceSpans", "resource_spans"), "resourceSpans"
        )
    except FieldError as exc:
        raise field_decode_error(exc, "") from None
    spans = []
    for i, resource_spans in enumerate(resource_list):
        resource_path = f"resourceSpans[{i}]"
        try:
            resource_spans = _json_object(resource_spans, "")
            resource = _json_object(resource_spans.get("resource"), "resource")
            resource_attributes = _json_attributes(
                resource.get("attributes"), "resource.attributes"
            )
            scope_list = _json_list(_get(resource_spans, "scopeSpans", "scope_spans"), "scopeSpans")
        except FieldError as exc:
            raise field_decode_error(exc, resource_path) from None
        for j, scope_spans in enumerate(scope_list):
            scope_path = f"{resource_path}.scopeSpans[{j}]"
            try:
                scope_spans = _json_object(scope_spans, "")
                scope = _json_object(scope_spans.get("scope"), "scope")
                span_list = _json_list(scope_spans.get("spans"), "spans")
            except FieldError as exc:
                raise field_decode_error(exc, scope_path) from None
            for k, obj in enumerate(span_list):
                try:
                    fields = _json_span_fields(obj)
                except FieldError as exc:
                    raise field_decode_error(exc, f"{scope_path}.spans[{k}]") from None
                fields["resource_attributes"] = resource_attributes
                name, version = scope.get("name"), scope.get("version")
                fields["scope_name"] = "" if name is None else name
                fields["scope_version"] = "" if version is None else version
                try:
                    spans.append(Span.model_validate(fields))
                except ValidationError as exc:
                    span_path = f"{scope_path}.spans[{k}]"
                    locate = locator(span_path, resource_path, scope_path, JSON_NAMES)
                    raise decode_error(exc, locate) from None
    return spans


def _json_value(value: AttributeValue) -> dict[str, Any]:
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is float:
        number = float(value)  # type: ignore[arg-type]
        if math.isfinite(number):
            return {"doubleValue": number}
        return {
            "doubleValue": "NaN"
            if math.isnan(number)
            else ("Infinity" if number > 0 else "-Infinity")
        }
    return {"arrayValue": {"values": [_json_value(item) for item in value]}}  # type: ignore[union-attr]


def _json_attrs(attributes: dict[str, AttributeValue]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _json_value(value)} for key, value in attributes.items()]


def _json_span(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "parentSpanId": span.parent_span_id or "",
        "name": span.name,
        "kind": KIND_TO_OTLP[span.kind],
        "startTimeUnixNano": str(span.start_time_unix_nano),
        "endTimeUnixNano": str(span.end_time_unix_nano),
        "attributes": _json_attrs(span.attributes),
        "events": [
            {
                "timeUnixNano": str(event.time_unix_nano),
                "name": event.name,
                "attributes": _json_attrs(event.attributes),
            }
            for event in span.events
        ],
        "links": [
            {
                "traceId": link.trace_id,
                "spanId": link.span_id,
                "attributes": _json_attrs(link.attributes),
            }
            for link in span.links
        ],
        "status": {},
    }
    if span.status_code is not StatusCode.UNSET:
        out["status"]["code"] = STATUS_TO_OTLP[span.status_code]
    if span.status_message:
        out["status"]["message"] = span.status_message
    return out


def to_otlp_document(spans: Iterable[Span]) -> dict[str, Any]:
    """The spans as an OTLP/JSON ``ExportTraceServiceRequest`` document."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _json_attrs(group[0][0].resource_attributes)},
                "scopeSpans": [
                    {
                        "scope": {"name": scopes[0].scope_name, "version": scopes[0].scope_version},
                        "spans": [_json_span(span) for span in scopes],
                    }
                    for scopes in group
                ],
            }
            for group in group_spans(spans)
        ]
    }


def encode_otlp_json(spans: Iterable[Span]) -> bytes:
    """Serialize spans as OTLP/JSON (hex ids, decimal-string 64-bit integers)."""
    return dump_json(to_otlp_document(spans))


def decode_otlp_json(payload: bytes) -> list[Span]:
    """Decode an OTLP/JSON payload; raises SpanDecodeError naming the bad field."""
    return spans_from_otlp_document(load_json(payload))
