"""The native OTLP protobuf path stores what the span decoder gives, or defers to it.

The dev install builds the C extension; without it every record goes to the span
decoder (the authority), which these tests hold the native path to: the rows it
writes, read back, are the authority's spans.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from spanmill import semconv as sc
from spanmill.collector import decode
from spanmill.collector.decode import decode_spans
from spanmill.collector.redact import Redactor
from spanmill.spans import Span, SpanDecodeError, detect_and_decode, encode_otlp_protobuf
from spanmill.spans.protowire import varint
from spanmill.store.rows import (
    HourlyColumns,
    SpanParts,
    exact_times,
    native_decoder,
    native_table,
    parts_from_row,
)

MAX = 1024 * 1024
hex_id = st.integers(min_value=1, max_value=2**64 - 1).map(lambda n: f"{n:016x}")
trace_id = st.tuples(hex_id, hex_id).map("".join)
text = st.text(max_size=20)
scalar = st.one_of(
    text,
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
value = st.one_of(
    scalar,
    st.lists(text, max_size=4),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=4),
    st.lists(st.booleans(), max_size=4),
)
attributes = st.dictionaries(st.text(min_size=1, max_size=12), value, max_size=6)
times = st.integers(min_value=0, max_value=2**62)


@st.composite
def spans(draw: Any) -> Span:
    start = draw(times)
    return Span(
        trace_id=draw(trace_id),
        span_id=draw(hex_id),
        parent_span_id=draw(st.none() | hex_id),
        name=draw(st.text(min_size=1, max_size=30)),
        kind=draw(st.sampled_from(["internal", "server", "client", "producer", "consumer"])),
        start_time_unix_nano=start,
        end_time_unix_nano=start + draw(st.integers(min_value=0, max_value=10**12)),
        status_code=draw(st.sampled_from(["unset", "ok", "error"])),
        status_message=draw(text),
        attributes=draw(attributes),
        resource_attributes=draw(attributes),
        scope_name=draw(text),
        scope_version=draw(text),
        events=draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.text(min_size=1, max_size=10),
                        "time_unix_nano": times,
                        "attributes": attributes,
                    }
                ),
                max_size=2,
            )
        ),
        links=draw(
            st.lists(
                st.fixed_dictionaries(
                    {"trace_id": trace_id, "span_id": hex_id, "attributes": attributes}
                ),
                max_size=2,
            )
        ),
    )


def _plain(value: Any) -> Any:
    """Dicts as their items in key order (a row gives its promoted keys back last); lists
    and tuples item by item."""
    if isinstance(value, dict):
        return sorted((key, _plain(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def exact(parts: list[SpanParts]) -> list[str]:
    """A form in which True, 1 and 1.0 differ, and a key's place does not count."""
    return [repr([_plain(getattr(p, name)) for name in SpanParts.__slots__]) for p in parts]


def authority(payload: bytes, content_type: str | None = None) -> list[SpanParts]:
    return [SpanParts.from_span(s) for s in detect_and_decode(payload, content_type)]


PREFILTER = Redactor().prefilter


DECODER = native_decoder()


def _append(payload: bytes) -> HourlyColumns | None:
    """The record's rows in native columns of their own, scanned for the redaction
    gates; None where the native path defers to the authority."""
    decoder = DECODER
    assert decoder is not None, (
        "the C extension spanmill._native is not built: reinstall with a C compiler"
    )
    assert PREFILTER is not None
    hourly = HourlyColumns(decoder=decoder)
    gates, digits = PREFILTER
    count = hourly.append_record(payload, gates=gates, digits=digits, topic="spans")
    return hourly if count is not None else None


def native_path(payload: bytes) -> list[SpanParts] | None:
    """The spans the native path stores for a record, read back from its rows."""
    hourly = _append(payload)
    if hourly is None:
        return None
    rows = [
        row
        for columns in hourly.native_hours.values()
        if columns.rows
        for row in exact_times(native_table(columns)).to_pylist()
    ]
    return [parts_from_row(row) for row in sorted(rows, key=lambda row: row["kafka_index"])]


def test_the_dev_install_has_the_native_path() -> None:
    assert decode.FAST_PATH == "native"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spans(), min_size=1, max_size=4))
def test_fast_path_matches_the_authority(batch: list[Span]) -> None:
    payload = encode_otlp_protobuf(batch)
    expected = exact(authority(payload))
    got = native_path(payload)
    assert got is not None, "the native path deferred a plain export"
    assert exact(got) == expected
    assert [p.to_span() for p in got] == batch
    labelled = decode_spans(payload, sc.CONTENT_TYPE_OTLP_PROTOBUF, MAX)
    assert exact(labelled) == exact(decode_spans(payload, None, MAX)) == expected


def _mutations(payload: bytes) -> st.SearchStrategy[bytes]:
    """The payload cut short, with bytes changed, dropped or put in."""
    size = len(payload)
    at = st.integers(min_value=0, max_value=size - 1)
    byte = st.integers(min_value=0, max_value=255)
    return st.one_of(
        at.map(lambda i: payload[:i]),
        st.tuples(at, byte).map(lambda c: payload[: c[0]] + bytes([c[1]]) + payload[c[0] + 1 :]),
        at.map(lambda i: payload[:i] + payload[i + 1 :]),
        st.tuples(at, byte).map(lambda c: payload[: c[0]] + bytes([c[1]]) + payload[c[0] :]),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_payloads_never_pass_for_other_spans(data: st.DataObject) -> None:
    """On bytes broken anywhere the native path gives the authority's spans, or defers."""
    payload = encode_otlp_protobuf(data.draw(st.lists(spans(), min_size=1, max_size=2)))
    damaged = data.draw(_mutations(payload))
    got = native_path(damaged)
    if got is None:
        return
    try:
        expected = authority(damaged, sc.CONTENT_TYPE_OTLP_PROTOBUF)
    except SpanDecodeError as exc:
        raise AssertionError(f"native path took what the authority refuses: {exc}") from None
    assert exact(got) == exact(expected)


def _span(attributes: dict[str, Any]) -> Span:
    return Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        name="x",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        attributes=attributes,
    )


@pytest.mark.parametrize(
    "values",
    [
        # varints of every size, 1 to 10 bytes
        [*range(-300, 300), *(2 ** (7 * k) for k in range(2, 9)), 2**63 - 1, -(2**63)],
        [0.0, -0.0, 1e308, -2.5e-308, float("inf"), float("-inf")] * 50,
        [True, False] * 200,
        ["tokens", "", "é" * 40] * 30,
    ],
    ids=["ints", "doubles", "bools", "strings"],
)
def test_long_arrays_match_the_authority(values: list[Any]) -> None:
    payload = encode_otlp_protobuf([_span({"array": values, "one": values[:1]})])
    expected = authority(payload)
    got = native_path(payload)
    assert got is not None, "the native path deferred a plain array to the authority"
    assert exact(got) == exact(expected)
    assert got[0].attributes["array"] == values


def _request(mutate: Any) -> bytes:
    request = ExportTraceServiceRequest.FromString(encode_otlp_protobuf([_span({"a": 1})]))
    mutate(request.resource_spans[0].scope_spans[0].spans[0])
    return request.SerializeToString()


def _kvlist(pb: Any) -> None:
    pair = pb.attributes.add(key="nested")
    pair.value.kvlist_value.values.add(key="k").value.int_value = 3


def _mixed(pb: Any) -> None:
    array = pb.attributes.add(key="mixed").value.array_value
    array.values.add().int_value = 1
    array.values.add().double_value = 2.5


def _ints_then_bool(pb: Any) -> None:
    # Same wire length as an int 0: only the field number tells them apart.
    array = pb.attributes.add(key="mixed").value.array_value
    array.values.add().int_value = 7
    array.values.add().bool_value = True


def _bools_then_int(pb: Any) -> None:
    array = pb.attributes.add(key="mixed").value.array_value
    array.values.add().bool_value = False
    array.values.add().int_value = 1


def _doubles_then_string(pb: Any) -> None:
    array = pb.attributes.add(key="mixed").value.array_value
    array.values.add().double_value = 0.5
    array.values.add().string_value = "eight ch"


def _empty_item(pb: Any) -> None:
    array = pb.attributes.add(key="holes").value.array_value
    array.values.add().int_value = 1
    array.values.add()


def _nested_array(pb: Any) -> None:
    array = pb.attributes.add(key="nested").value.array_value
    array.values.add().array_value.values.add().int_value = 1


def _bytes(pb: Any) -> None:
    pb.attributes.add(key="raw").value.bytes_value = b"\x00\x01"


def _empty(pb: Any) -> None:
    pb.attributes.add(key="nothing")


@pytest.mark.parametrize(
    "mutate",
    [_kvlist, _mixed, _ints_then_bool, _bools_then_int, _doubles_then_string, _empty_item,
     _nested_array, _bytes, _empty],
)  # fmt: skip
def test_unusual_values_defer_to_the_authority(mutate: Any) -> None:
    payload = _request(mutate)
    assert native_path(payload) is None
    assert exact(decode_spans(payload, None, MAX)) == exact(authority(payload))


def _zero_trace(pb: Any) -> None:
    pb.trace_id = bytes(16)


def _short_span_id(pb: Any) -> None:
    pb.span_id = b"\x01\x02"


def _bad_kind(pb: Any) -> None:
    pb.kind = 9


def _ends_early(pb: Any) -> None:
    pb.end_time_unix_nano = 0


def _no_name(pb: Any) -> None:
    pb.name = ""


def _long_key(pb: Any) -> None:
    pb.attributes.add(key="k" * 300).value.int_value = 1


@pytest.mark.parametrize(
    "mutate", [_zero_trace, _short_span_id, _bad_kind, _ends_early, _no_name, _long_key]
)
def test_invalid_spans_get_the_authoritys_error(mutate: Any) -> None:
    payload = _request(mutate)
    with pytest.raises(SpanDecodeError) as expected:
        detect_and_decode(payload)
    assert native_path(payload) is None
    with pytest.raises(SpanDecodeError) as got:
        decode_spans(payload, None, MAX)
    assert (got.value.reason, got.value.detail) == (expected.value.reason, expected.value.detail)


def _scope_attributes(request: ExportTraceServiceRequest) -> None:
    request.resource_spans[0].scope_spans[0].scope.attributes.add(key="a").value.int_value = 1


def _schema_url(request: ExportTraceServiceRequest) -> None:
    request.resource_spans[0].schema_url = "https://opentelemetry.io/schemas/1.26.0"
    request.resource_spans[0].scope_spans[0].schema_url = "https://example.org/s"


def _trace_state(request: ExportTraceServiceRequest) -> None:
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.trace_state = "vendor=1"
    span.flags = 0x101
    span.dropped_attributes_count = 3


def test_wire_forms_the_parser_accepts() -> None:
    """Fields repeated or in any order, and kept-out fields, give the authority's spans."""
    base = encode_otlp_protobuf([_span({"a": 1, "b": "x"})])
    request = ExportTraceServiceRequest.FromString(base)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    # A singular field sent twice: concatenated messages merge, the last value wins.
    twice = base + ExportTraceServiceRequest(resource_spans=[]).SerializeToString()
    variants = [twice, request.SerializeToString(deterministic=True)]
    for mutate in (_schema_url, _trace_state, _scope_attributes):
        copy = ExportTraceServiceRequest()
        copy.CopyFrom(request)
        mutate(copy)
        variants.append(copy.SerializeToString())
    # Resource after its scopes: the wire does not fix the order of fields.
    resource_spans = request.resource_spans[0]
    scopes = b"".join(
        b"\x12" + varint(scope.ByteSize()) + scope.SerializeToString()
        for scope in resource_spans.scope_spans
    )
    resource = resource_spans.resource.SerializeToString()
    reordered = scopes + b"\x0a" + varint(len(resource)) + resource
    variants.append(b"\x0a" + varint(len(reordered)) + reordered)
    # The span's name on the wire twice: the parser keeps the last, the native path defers.
    doubled = span.SerializeToString() + b"\x2a" + varint(5) + b"other"
    scope = resource_spans.scope_spans[0]
    scope_bytes = scope.scope.SerializeToString()
    inner = b"\x0a" + varint(len(scope_bytes)) + scope_bytes
    inner += b"\x12" + varint(len(doubled)) + doubled
    outer = b"\x0a" + varint(len(resource)) + resource + b"\x12" + varint(len(inner)) + inner
    variants.append(b"\x0a" + varint(len(outer)) + outer)
    for payload in variants:
        expected = exact(authority(payload, sc.CONTENT_TYPE_OTLP_PROTOBUF))
        got = native_path(payload)
        assert got is None or exact(got) == expected


@pytest.mark.parametrize("field", ["trace_state", "schema_url"])
def test_a_text_field_not_kept_must_still_be_utf8(field: str) -> None:
    """The native path checks texts it drops as the parser does: invalid UTF-8 is refused."""
    request = ExportTraceServiceRequest.FromString(encode_otlp_protobuf([_span({"a": 1})]))
    holder = (
        request.resource_spans[0].scope_spans[0].spans[0]
        if field == "trace_state"
        else request.resource_spans[0]
    )
    setattr(holder, field, "ab")
    good = request.SerializeToString()
    assert good.count(b"\x02ab") == 1
    payload = good.replace(b"\x02ab", b"\x02\xff\xfe")
    with pytest.raises(SpanDecodeError) as expected:
        detect_and_decode(payload)
    assert native_path(payload) is None
    with pytest.raises(SpanDecodeError) as got:
        decode_spans(payload, None, MAX)
    assert got.value.reason == expected.value.reason


@pytest.mark.parametrize("lead", [b"\n", b"\n  ", b"\n\n"])
def test_json_that_starts_like_protobuf_is_read_as_json(lead: bytes) -> None:
    """A newline then "{" also begins a protobuf export: the native path must refuse it."""
    from spanmill.spans import encode_otlp_json
    from spanmill.spans.sdk_json import encode_span

    span = _span({"note": "hello", "n": 3})
    for payload in (lead + encode_otlp_json([span]), lead + encode_span(span)):
        assert native_path(payload) is None
        assert [p.to_span() for p in decode_spans(payload, None, MAX)] == [span]


def test_an_overlong_tag_is_left_to_the_parser() -> None:
    """The parser refuses a tag over 5 bytes even when its value fits: so must the fast path."""
    payload = encode_otlp_protobuf([_span({"a": 1})])
    assert payload[0] == 0x0A
    overlong = b"\x8a\x80\x80\x80\x80\x00" + payload[1:]  # field 1, length-delimited, 6 bytes
    assert native_path(overlong) is None
    with pytest.raises(SpanDecodeError):
        detect_and_decode(overlong, sc.CONTENT_TYPE_OTLP_PROTOBUF)
    with pytest.raises(SpanDecodeError):
        decode_spans(overlong, None, MAX)


def _marked(payload: bytes) -> bool:
    """Whether the native path's scan found what a redaction pattern needs."""
    hourly = _append(payload)
    assert hourly is not None
    return any(found for c in hourly.native_hours.values() for _, _, found in c.steps)


def test_concurrent_decodes_keep_their_own_scan() -> None:
    """Threads decoding at once each get the prefilter answer for their own record."""
    import sys
    import threading

    # Several spans a record: a thread may switch while one span is read, and the
    # texts of the next ones must still count for their own record.
    plain = [_span({"note": f"nothing to see {i}"}) for i in range(4)]
    secret = encode_otlp_protobuf([*plain, _span({"note": "mail ann@example.org now"})])
    clean = encode_otlp_protobuf([*plain, _span({"note": "nothing to see"})])
    wrong: list[str] = []

    def work(first: bytes, second: bytes, expected: tuple[bool, bool]) -> None:
        for _ in range(1500):
            for payload, want in zip((first, second), expected, strict=True):
                if _marked(payload) != want:
                    wrong.append(f"{want} expected")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [
            threading.Thread(target=work, args=(secret, clean, (True, False))),
            threading.Thread(target=work, args=(clean, secret, (False, True))),
            threading.Thread(target=work, args=(clean, clean, (False, False))),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
