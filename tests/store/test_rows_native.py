"""The native row appender gives the rows the Python one gives, value for value."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanmill import semconv as sc
from spanmill.store import rows
from spanmill.store.rows import ColumnBuilder, SpanParts
from spanmill.store.schema import PROMOTED

text = st.text(max_size=8)
# Values of every type for every promoted key, so each is moved or kept by its type.
value = st.one_of(
    text,
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3),
    st.lists(st.floats(allow_nan=False), max_size=3),
    st.lists(text, max_size=3),
)
keys = st.sampled_from(
    [p.key for p in PROMOTED] + [sc.SPANMILL_EPISODE_ID, sc.SERVICE_NAME, "other", "x.y"]
)
attributes = st.dictionaries(keys, value, max_size=8)
hex32 = st.integers(min_value=1, max_value=2**128 - 1).map(lambda n: f"{n:032x}")
hex16 = st.integers(min_value=1, max_value=2**64 - 1).map(lambda n: f"{n:016x}")
event = st.tuples(
    st.sampled_from([sc.GEN_AI_EVALUATION_RESULT_EVENT, "log"]),
    st.integers(min_value=0, max_value=2**62),
    attributes,
)
link = st.tuples(hex32, hex16, attributes)


@st.composite
def parts(draw: Any) -> SpanParts:
    start = draw(st.integers(min_value=0, max_value=2**62))
    return SpanParts(
        draw(hex32),
        draw(hex16),
        draw(st.none() | hex16),
        draw(st.text(min_size=1, max_size=8)),
        draw(st.sampled_from(["internal", "client"])),
        start,
        start + draw(st.integers(min_value=0, max_value=10**9)),
        draw(st.sampled_from(["unset", "ok", "error"])),
        draw(text),
        draw(attributes),
        draw(attributes),
        draw(text),
        draw(text),
        draw(st.lists(event, max_size=2)),
        draw(st.lists(link, max_size=2)),
    )


def test_the_native_appender_is_in_use() -> None:
    assert rows.NATIVE_ROWS, "the C extension spanmill._native is not built"
    assert ColumnBuilder().native_columns is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(parts(), min_size=1, max_size=4))
def test_native_rows_match_python_rows(batch: list[SpanParts]) -> None:
    native, python = ColumnBuilder(), ColumnBuilder(decoder=None)
    shared = batch[0].resource_attributes
    for index, span in enumerate(batch):
        if index % 2:
            span.resource_attributes = shared  # spans of one record share their resource
        twin = copy.deepcopy(span)
        native.append(span, "spans", 1, 100 + index, index, 1_750_000_000_000)
        python.append(twin, "spans", 1, 100 + index, index, 1_750_000_000_000)
        # Both moved the same attributes out of the span, and left its resource alone.
        assert repr(span.attributes) == repr(twin.attributes)
        assert repr(span.resource_attributes) == repr(twin.resource_attributes)
    assert native.rows == python.rows == len(batch)
    left, right = native.to_table(), python.to_table()
    left.validate(full=True)
    assert left.schema == right.schema and isinstance(left, pa.Table)
    for name in left.column_names:
        # Value for value, as Python sees them (repr tells -0.0 from 0.0).
        assert repr(left.column(name).to_pylist()) == repr(right.column(name).to_pylist()), name
    assert left.equals(right)


def _same_tables(batch: list[SpanParts]) -> None:
    native, python = ColumnBuilder(), ColumnBuilder(decoder=None)
    for index, span in enumerate(batch):
        twin = copy.deepcopy(span)
        native.append(span, "spans", 3, 7 + index, index, 1_750_000_000_000 + index)
        python.append(twin, "spans", 3, 7 + index, index, 1_750_000_000_000 + index)
    left, right = native.to_table(), python.to_table()
    left.validate(full=True)
    for name in left.column_names:
        assert repr(left.column(name).to_pylist()) == repr(right.column(name).to_pylist()), name
    assert left.equals(right)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(parts(), min_size=9, max_size=40))
def test_native_rows_match_python_rows_past_the_first_bitmap_bytes(
    batch: list[SpanParts],
) -> None:
    # Validity and bool bitmaps hold eight rows a byte: batches longer than one.
    _same_tables(batch)


def _span(n: int, **attributes: Any) -> SpanParts:
    return SpanParts(
        f"{n + 1:032x}",
        f"{n + 1:016x}",
        None,
        "chat",
        "client",
        1_750_000_000_000_000_000,
        1_750_000_000_500_000_000,
        "ok",
        "",
        dict(attributes),
        {sc.SERVICE_NAME: "agent"},
        "spanmill.sdk",
        "0.1.0",
        [],
        [],
    )


def test_a_row_that_fails_part_way_leaves_the_columns_as_they_were() -> None:
    good = [
        _span(n, **{sc.GEN_AI_USAGE_INPUT_TOKENS: n, sc.SPANMILL_REWARD_PRIMARY: n % 2 == 0})
        for n in range(11)
    ]
    # An int list whose first item is an int is moved to its column; a later str is
    # refused there, after the row's earlier columns had their values.
    # Its model and primary flag were set by then: their bits must go with it.
    bad = _span(
        99,
        **{
            sc.GEN_AI_REQUEST_MODEL: "smollm2",
            sc.SPANMILL_REWARD_PRIMARY: True,
            sc.SPANMILL_COMPLETION_TOKEN_IDS: [1, "two"],
        },
    )
    native = ColumnBuilder()
    for index, span in enumerate(copy.deepcopy(good[:9])):
        native.append(span, "spans", 3, 7 + index, index, 1_750_000_000_000 + index)
    with pytest.raises(TypeError, match="expected an int"):
        native.append(bad, "spans", 3, 99, 0, 1_750_000_000_000)
    for index, span in enumerate(copy.deepcopy(good[9:]), start=9):
        native.append(span, "spans", 3, 7 + index, index, 1_750_000_000_000 + index)
    python = ColumnBuilder(decoder=None)
    for index, span in enumerate(copy.deepcopy(good)):
        python.append(span, "spans", 3, 7 + index, index, 1_750_000_000_000 + index)
    assert native.rows == python.rows == len(good)
    left, right = native.to_table(), python.to_table()
    left.validate(full=True)
    assert left.equals(right)


def test_a_builder_is_native_or_python_not_both() -> None:
    with pytest.raises(RuntimeError, match="native"):
        ColumnBuilder().append_python(_span(0), "spans", 0, 0, 0, 0)


def test_attributes_that_all_have_columns_leave_an_empty_dict_and_no_json() -> None:
    every = {sc.GEN_AI_REQUEST_MODEL: "smollm2", sc.GEN_AI_USAGE_INPUT_TOKENS: 12}
    some = {**every, "server.port": 8000}
    spans = [_span(0, **every), _span(1, **some)]
    _same_tables(copy.deepcopy(spans))
    native = ColumnBuilder()
    for index, span in enumerate(spans):
        native.append(span, "spans", 0, index, 0, 0)
    assert spans[0].attributes == {}
    assert spans[1].attributes == {"server.port": 8000}
    table = native.to_table()
    assert table.column("attributes").to_pylist() == [None, '{"server.port":8000}']
    assert table.column("input_tokens").to_pylist() == [12, 12]


# -- each decoder owns its state --------------------------------------------------------


def _parts(name: str = "chat") -> SpanParts:
    return SpanParts(
        "1" * 32, "2" * 16, None, name, "internal", 1, 2, "unset", None,
        {"n": 1}, {sc.SERVICE_NAME: "agent"}, "scope", None, [], [],
    )  # fmt: skip


def test_columns_belong_to_the_decoder_that_made_them() -> None:
    first, second = rows.native_decoder(), rows.native_decoder()
    assert first is not None and second is not None
    mine = first.columns()
    first.append_row(mine, _parts(), "spans", 0, 1, 0, 0)
    assert mine.rows == 1
    # Another decoder's columns, even laid out the same, are refused, and stay as they were.
    with pytest.raises(TypeError, match="this decoder's columns"):
        second.append_row(mine, _parts(), "spans", 0, 2, 0, 0)
    assert mine.rows == 1
    from spanmill.spans import Span, encode_otlp_protobuf

    payload = encode_otlp_protobuf([Span(
        trace_id="1" * 32, span_id="2" * 16, name="chat", start_time_unix_nano=1,
        end_time_unix_nano=2,
    )])  # fmt: skip
    with pytest.raises(TypeError, match="this decoder's columns"):
        second.append_record({0: mine}, lambda hour: mine, payload, None, 0, (), None,
                             "spans", 0, 3, 0)  # fmt: skip
    assert mine.rows == 1
    # Configured again, a decoder refuses the columns it made before.
    first.configure_rows(*rows._rows_settings())
    with pytest.raises(TypeError, match="since its last configure_rows"):
        first.append_row(mine, _parts(), "spans", 0, 4, 0, 0)
    first.append_row(first.columns(), _parts(), "spans", 0, 4, 0, 0)


def test_decoders_keep_their_own_settings() -> None:
    from spanmill.spans import Span, encode_otlp_protobuf

    module = rows.native.module
    assert module is not None
    with pytest.raises(TypeError, match="no arguments"):
        module.Decoder(SpanParts)
    strict, usual = module.Decoder(), rows.native_decoder()
    strict.configure(SpanParts, 4, 64, 1024, True)  # names of at most 4 characters
    payload = encode_otlp_protobuf([Span(
        trace_id="1" * 32, span_id="2" * 16, name="a longer name", start_time_unix_nano=1,
        end_time_unix_nano=2,
    )])  # fmt: skip
    # The strict decoder leaves the long name to the authority; the usual one reads it,
    # before and after the strict one was set up and used.
    assert strict.decode(payload) is None
    assert usual is not None and usual.decode(payload)[0].name == "a longer name"
    assert strict.decode(payload) is None


# What the extension may keep at file scope: its type objects and method tables, and the
# names of span kinds and status codes, made once when it loads.
_FILE_SCOPE: Final = {
    "KIND_NAMES", "STATUS_NAMES", "ColumnsType", "BufferType", "DecoderType", "buffer_procs",
    "columns_methods", "columns_getset", "decoder_methods", "module_def",
}  # fmt: skip


def test_the_extension_keeps_no_mutable_state_of_its_own() -> None:
    """Every static variable is const, or one of the things made once at load: what a
    decoder learns lives in the Decoder object, never in the module."""
    source = (Path(rows.__file__).parents[1] / "_native.c").read_text()
    declared = re.findall(
        r"^\s*static\s+(?!const\b|inline\b)[\w\s]+?\**\s*(\w+)\s*(?:\[[^\]]*\])?\s*(?:=|;)",
        source,
        flags=re.MULTILINE,
    )
    assert declared and set(declared) <= _FILE_SCOPE, sorted(set(declared) - _FILE_SCOPE)
