"""The native row appender gives the rows the Python one gives, value for value."""

from __future__ import annotations

import copy
from typing import Any

import pyarrow as pa
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
    assert rows._native_append is not None, "the C extension spanmill._native is not built"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(parts(), min_size=1, max_size=4))
def test_native_rows_match_python_rows(batch: list[SpanParts]) -> None:
    native, python = ColumnBuilder(), ColumnBuilder()
    shared = batch[0].resource_attributes
    for index, span in enumerate(batch):
        if index % 2:
            span.resource_attributes = shared  # spans of one record share their resource
        twin = copy.deepcopy(span)
        native.append(span, "spans", 1, 100 + index, index, 1_750_000_000_000)
        python.append_python(twin, "spans", 1, 100 + index, index, 1_750_000_000_000)
        # Both moved the same attributes out of the span, and left its resource alone.
        assert repr(span.attributes) == repr(twin.attributes)
        assert repr(span.resource_attributes) == repr(twin.resource_attributes)
    assert native.rows == python.rows == len(batch)
    for name in native.columns:
        assert repr(native.columns[name]) == repr(python.columns[name]), name
    left, right = native.to_table(), python.to_table()
    assert left.equals(right)
    assert left.schema == right.schema and isinstance(left, pa.Table)
