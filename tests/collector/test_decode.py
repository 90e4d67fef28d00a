"""The fast OTLP protobuf path gives what the span decoder gives, or defers to it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from spanmill import semconv as sc
from spanmill.collector.decode import decode_record
from spanmill.spans import Span, SpanDecodeError, detect_and_decode, encode_otlp_protobuf
from spanmill.store.rows import SpanParts

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


def exact(parts: list[SpanParts]) -> list[str]:
    """A form in which True, 1 and 1.0 differ, and dict order counts."""
    return [repr([getattr(p, name) for name in SpanParts.__slots__]) for p in parts]


def authority(payload: bytes, content_type: str | None = None) -> list[SpanParts]:
    return [SpanParts.from_span(s) for s in detect_and_decode(payload, content_type)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spans(), min_size=1, max_size=4))
def test_fast_path_matches_the_authority(batch: list[Span]) -> None:
    payload = encode_otlp_protobuf(batch)
    assert exact(decode_record(payload, None, MAX)) == exact(authority(payload))
    labelled = decode_record(payload, sc.CONTENT_TYPE_OTLP_PROTOBUF, MAX)
    assert exact(labelled) == exact(authority(payload))
    assert [p.to_span() for p in labelled] == batch


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
def test_long_arrays_match_the_authority(
    values: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = encode_otlp_protobuf([_span({"array": values, "one": values[:1]})])
    expected = authority(payload)

    def no_fallback(*_: Any, **__: Any) -> None:
        raise AssertionError("the fast path deferred a plain array to the authority")

    monkeypatch.setattr("spanmill.collector.decode.detect_and_decode", no_fallback)
    got = decode_record(payload, None, MAX)
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
    assert exact(decode_record(payload, None, MAX)) == exact(authority(payload))


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
    with pytest.raises(SpanDecodeError) as got:
        decode_record(payload, None, MAX)
    assert (got.value.reason, got.value.detail) == (expected.value.reason, expected.value.detail)
