"""The native decoder's objects: whose columns are whose, whose settings are whose, and
nothing kept in the module; and the Python rows' handling of promoted attributes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from spanmill import semconv as sc
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.store import rows
from spanmill.store.rows import ColumnBuilder, SpanParts


def _span(n: int, **attributes: object) -> SpanParts:
    return SpanParts(
        f"{n + 1:032x}", f"{n + 1:016x}", None, "chat", "client", n, n + 1, "ok", "",
        dict(attributes), {sc.SERVICE_NAME: "agent"}, "spanmill", "0.1.0", [], [],
    )  # fmt: skip


def _payload(name: str = "chat") -> bytes:
    return encode_otlp_protobuf([Span(
        trace_id="1" * 32, span_id="2" * 16, name=name, start_time_unix_nano=1,
        end_time_unix_nano=2,
    )])  # fmt: skip


def _append(decoder: object, columns: object, payload: bytes) -> int | None:
    count: int | None = decoder.append_record(  # type: ignore[attr-defined]
        {0: columns}, payload, None, 0, (), None, "spans", 0, 1, 0
    )
    return count


def test_the_native_decoder_is_in_use() -> None:
    assert rows.NATIVE_ROWS, "the C extension spanmill._native is not built"
    assert rows.HourlyColumns().decoder is not None


def test_attributes_that_all_have_columns_leave_an_empty_dict_and_no_json() -> None:
    every = {sc.GEN_AI_REQUEST_MODEL: "smollm2", sc.GEN_AI_USAGE_INPUT_TOKENS: 12}
    some = {**every, "server.port": 8000}
    spans = [_span(0, **every), _span(1, **some)]
    builder = ColumnBuilder()
    for index, span in enumerate(spans):
        builder.append(span, "spans", 0, index, 0, 0)
    assert spans[0].attributes == {}
    assert spans[1].attributes == {"server.port": 8000}
    table = builder.to_table()
    assert table.column("attributes").to_pylist() == [None, '{"server.port":8000}']
    assert table.column("input_tokens").to_pylist() == [12, 12]
    assert [rows.parts_from_row(row).attributes for row in rows.exact_times(table).to_pylist()] \
        == [every, some]  # fmt: skip


# -- each decoder owns its state --------------------------------------------------------


def test_columns_belong_to_the_decoder_that_made_them() -> None:
    first, second = rows.native_decoder(), rows.native_decoder()
    assert first is not None and second is not None
    mine = first.columns()
    assert _append(first, mine, _payload()) == 1
    # Another decoder's columns, even laid out the same, are refused, and stay as they were.
    with pytest.raises(TypeError, match="this decoder's columns"):
        _append(second, mine, _payload())
    assert mine.rows == 1
    # Configured again, a decoder refuses the columns it made before.
    first.configure_rows(*rows._rows_settings())
    with pytest.raises(TypeError, match="since its last configure_rows"):
        _append(first, mine, _payload())
    assert _append(first, first.columns(), _payload()) == 1


def test_decoders_keep_their_own_settings() -> None:
    module = rows.native.module
    assert module is not None
    with pytest.raises(TypeError, match="no arguments"):
        module.Decoder(SpanParts)
    strict, usual = module.Decoder(), rows.native_decoder()
    assert usual is not None
    strict.configure(4, 64, 1024)  # names of at most 4 characters
    strict.configure_rows(*rows._rows_settings())
    # The strict decoder leaves the long name to the authority; the usual one reads it,
    # before and after the strict one was set up and used.
    assert _append(strict, strict.columns(), _payload("a longer name")) is None
    assert _append(usual, usual.columns(), _payload("a longer name")) == 1
    assert _append(strict, strict.columns(), _payload("a longer name")) is None
    assert _append(strict, strict.columns(), _payload("chat")) == 1


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
