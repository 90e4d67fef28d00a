"""The native path writes the rows the authority-translate-redact-append steps write.

``BatchProcessor`` hands each OTLP protobuf record to ``append_record`` first, which
reads it from the wire bytes straight into its hour's columns (marking the rows the
Python steps are to finish: translation, redaction, rewards), or gives it back
untouched. Both processors here see the same batches; one takes the steps for every
record. Their Parquet files, dead letters and counts must be the same.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from collector_helpers import assert_same_writes, processed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from spanmill import native
from spanmill import semconv as sc
from spanmill.collector.batch import BatchProcessor, ProcessingConfig
from spanmill.collector.translate import Translation
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.store.rows import HourlyColumns
from spanmill.store.schema import PROMOTED

HOUR = 3_600_000_000_000
START = 1_750_000_000_000_000_000
FALLBACK = sorted(Translation().signature)[:4]
# Keys of every sort a row treats apart: promoted, read for the model or episode,
# sending the record back (translation, rewards), and plain.
KEYS = st.sampled_from(
    [p.key for p in PROMOTED]
    + [sc.SPANMILL_EPISODE_ID, sc.SERVICE_NAME, "plain", "app.note", "é.key"]
    + FALLBACK
)
text = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["", "smollm2", "ops@example.com", "sk-" + "a1" * 12, "4111 1111 1111 1111"]),
)
integers = st.integers(min_value=-(2**63), max_value=2**63 - 1)
value = st.one_of(
    text,
    st.booleans(),
    integers,
    st.floats(allow_nan=False),
    st.lists(integers, max_size=3),
    st.lists(st.floats(allow_nan=False), max_size=3),
    st.lists(text, max_size=3),
    st.lists(st.booleans(), max_size=2),
)
attributes = st.dictionaries(KEYS, value, max_size=8)
hex16 = st.integers(min_value=1, max_value=2**64 - 1).map(lambda n: f"{n:016x}")


@st.composite
def spans(draw: Any) -> Span:
    # Mostly one hour; now and then the next, so some records hold two.
    start = START + draw(st.sampled_from([0, 1, 2, HOUR]))
    return Span(
        trace_id=draw(hex16) + draw(hex16),
        span_id=draw(hex16),
        parent_span_id=draw(st.none() | hex16),
        name=draw(st.sampled_from(["chat", "tool", "a" * 40, "é"])),
        kind=draw(st.sampled_from(["internal", "server", "client"])),
        start_time_unix_nano=start,
        end_time_unix_nano=start + draw(st.integers(min_value=0, max_value=10**9)),
        status_code=draw(st.sampled_from(["unset", "ok", "error"])),
        status_message=draw(text),
        attributes=draw(attributes),
        resource_attributes=draw(
            st.dictionaries(st.sampled_from([sc.SERVICE_NAME, "host", "rank"]), value, max_size=3)
        ),
        scope_name=draw(st.sampled_from(["", "spanmill.sdk"])),
        scope_version=draw(st.sampled_from(["", "0.1.0"])),
        events=draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        # now and then an evaluation, which carries a reward
                        "name": st.sampled_from(["log", "log", sc.GEN_AI_EVALUATION_RESULT_EVENT]),
                        "time_unix_nano": st.just(START),
                        "attributes": attributes,
                    }
                ),
                max_size=2,
            )
        )
        if draw(st.integers(0, 3)) == 0
        else [],
        links=draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "trace_id": hex16.map(lambda h: h * 2),
                        "span_id": hex16,
                        "attributes": attributes,
                    }
                ),
                max_size=2,
            )
        )
        if draw(st.integers(0, 3)) == 0
        else [],
    )


# Redaction set-ups: the default rules; attribute lists that drop a span key, a resource
# key, or all but some; no rules at all (nothing to scan for).
CONFIGS: list[dict[str, Any]] = [
    {},
    {"attributes_deny": ("plain", "host")},
    {"attributes_allow": ("gen_ai.*", "spanmill.*", "service.*", "rank")},
    {"redact_rules": ()},
]


def _same_rows(values: list[bytes], config: dict[str, Any] | None = None) -> None:
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        native = BatchProcessor(ProcessingConfig(store_url=first, **(config or {})))
        steps = BatchProcessor(ProcessingConfig(store_url=second, **(config or {})), native=False)
        assert native._native is not None, "the C extension spanmill._native is not built"
        assert_same_writes(processed(native, values), processed(steps, values))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(spans(), min_size=1, max_size=3), min_size=1, max_size=4),
    st.sampled_from(CONFIGS),
)
def test_native_rows_match_the_steps(records: list[list[Span]], config: dict[str, Any]) -> None:
    _same_rows([encode_otlp_protobuf(spans) for spans in records], config)


def _mutations(payload: bytes) -> st.SearchStrategy[bytes]:
    at = st.integers(min_value=0, max_value=len(payload) - 1)
    byte = st.integers(min_value=0, max_value=255)
    return st.one_of(
        at.map(lambda i: payload[:i]),
        st.tuples(at, byte).map(lambda c: payload[: c[0]] + bytes([c[1]]) + payload[c[0] + 1 :]),
        at.map(lambda i: payload[:i] + payload[i + 1 :]),
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_records_take_the_same_way(data: st.DataObject) -> None:
    """Broken anywhere, a record is stored or refused exactly as the steps do it."""
    payload = encode_otlp_protobuf(data.draw(st.lists(spans(), min_size=1, max_size=2)))
    _same_rows([data.draw(_mutations(payload)), payload], data.draw(st.sampled_from(CONFIGS)))


def _set(pb: Any, value: str | int) -> None:
    if isinstance(value, str):
        pb.string_value = value
    else:
        pb.int_value = value


def _request(
    *pairs: tuple[str, str | int], resource: tuple[tuple[str, str | int], ...] = (), end: int = 0
) -> bytes:
    """One span's export, its attributes given as they come (keys may repeat)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, item in resource:
        _set(resource_spans.resource.attributes.add(key=key).value, item)
    pb = resource_spans.scope_spans.add().spans.add()
    pb.trace_id, pb.span_id, pb.name = b"\x01" * 16, b"\x02" * 8, "chat"
    pb.start_time_unix_nano, pb.end_time_unix_nano = START, end or START
    for key, item in pairs:
        _set(pb.attributes.add(key=key).value, item)
    return request.SerializeToString()


@pytest.mark.parametrize(
    "payload",
    [
        # A promoted key given twice: the last value stands, at the first one's place.
        _request((sc.GEN_AI_REQUEST_MODEL, "a"), ("plain", "x"), (sc.GEN_AI_REQUEST_MODEL, "b")),
        _request((sc.GEN_AI_REQUEST_MODEL, "a"), (sc.GEN_AI_REQUEST_MODEL, 5)),
        # A plain key given twice, and the episode key: the last value is the episode.
        _request(("plain", "a"), (sc.SPANMILL_EPISODE_ID, ""), ("plain", "b")),
        _request((sc.SPANMILL_EPISODE_ID, "e1"), (sc.SPANMILL_EPISODE_ID, "")),
        _request((sc.SPANMILL_EPISODE_ID, "e1"), (sc.SPANMILL_EPISODE_ID, 5)),
        # The promoted resource key given twice, the second time of another type.
        _request(
            ("plain", "a"), resource=((sc.SERVICE_NAME, "a"), ("host", "h"), (sc.SERVICE_NAME, 5))
        ),
        _request(resource=((sc.SERVICE_NAME, "a"), (sc.SERVICE_NAME, "b"))),
        # An end the store cannot hold: a dead letter either way.
        _request(("plain", "a"), end=2**63 + 5),
    ],
)
def test_records_out_of_the_ordinary_match_the_steps(payload: bytes) -> None:
    _same_rows([payload, _request(("plain", "b"))])


def _append(hourly: HourlyColumns, payload: bytes, fallback: frozenset[str] = frozenset()) -> Any:
    assert native.module is not None
    with tempfile.TemporaryDirectory() as store:
        processor = BatchProcessor(ProcessingConfig(store_url=store))
    assert processor._native is not None
    _, gates, digits, _, _ = processor._native
    return hourly.append_record(
        payload,
        gates=gates,
        digits=digits,
        steps_keys=fallback,
        topic="spans",
        offset=7,
        timestamp_ms=1_750_000_000_000,
    )


def _span(start: int = START, **attributes: Any) -> Span:
    return Span(
        trace_id="1" * 32, span_id="2" * 16, name="chat", start_time_unix_nano=start,
        end_time_unix_nano=start + 5, attributes=attributes,
    )  # fmt: skip


def test_a_plain_record_is_read_natively() -> None:
    hourly = HourlyColumns()
    payload = encode_otlp_protobuf([_span(**{sc.GEN_AI_REQUEST_MODEL: "m"}), _span(plain=1)])
    assert _append(hourly, payload) == 2
    (table,) = hourly.tables().values()
    assert table.column("request_model").to_pylist() == ["m", None]
    assert table.column("attributes").to_pylist() == [None, '{"plain":1}']
    assert table.column("kafka_index").to_pylist() == [0, 1]


def _finished(hourly: HourlyColumns) -> dict[int, list[Any]]:
    """Each hour's finished columns, their buffers' bytes read out."""

    def plain(column: Any) -> Any:
        if isinstance(column, list):
            return column
        return tuple(bytes(memoryview(part)) if part is not None and not isinstance(part, int)
                     else part for part in column)  # fmt: skip

    return {
        hour: [plain(column) for column in columns.finish()]
        for hour, columns in hourly.native_hours.items()
    }


# A span of each sort whose record's rows the Python steps finish, and whether the scan
# found what a redaction pattern needs.
FOR_THE_STEPS = [
    (_span(note="write to ops@example.com"), frozenset(), True),  # redaction's to run
    (_span(**{"gen_ai.system": "openai"}), frozenset({"gen_ai.system"}), False),  # translation
    (_span(**{sc.GEN_AI_EVALUATION_NAME: "exact"}), frozenset(), False),  # a reward
]


@pytest.mark.parametrize(("second", "steps", "found"), FOR_THE_STEPS)
def test_a_record_for_the_steps_is_written_and_its_rows_marked(
    second: Span, steps: frozenset[str], found: bool
) -> None:
    hourly = HourlyColumns()
    assert _append(hourly, encode_otlp_protobuf([_span(x=1)]), steps) == 1
    assert _append(hourly, encode_otlp_protobuf([_span(y=2), second, _span(z=3)]), steps) == 3
    (columns,) = hourly.native_hours.values()
    assert columns.rows == 4 and columns.steps == ((1, 4, found),)


@pytest.mark.parametrize(("second", "steps", "found"), FOR_THE_STEPS)
def test_a_record_given_back_leaves_every_column_as_it_was(
    second: Span, steps: frozenset[str], found: bool
) -> None:
    hourly, twin = HourlyColumns(), HourlyColumns()
    first = encode_otlp_protobuf([_span(x=1)])
    assert _append(hourly, first, steps) == 1 and _append(twin, first, steps) == 1
    (columns,) = hourly.native_hours.values()
    # Two spans written (one for the steps), then the tenth hour sends the record back.
    late = [_span(start=START + i * HOUR, n=i) for i in range(1, 9)]
    payload = encode_otlp_protobuf([_span(y=2), second, *late])
    assert _append(hourly, payload, steps) is None
    assert columns.rows == 1 and columns.steps == ()
    assert all(c.rows == 0 for h, c in hourly.native_hours.items() if h != START // HOUR)
    assert _finished(hourly)[START // HOUR] == _finished(twin)[START // HOUR]


def test_a_record_over_two_hours_goes_into_both() -> None:
    hourly = HourlyColumns()
    payload = encode_otlp_protobuf([_span(x=1), _span(start=START + HOUR, y=2), _span(z=3)])
    assert _append(hourly, payload) == 3
    tables = hourly.tables()
    assert list(tables) == [START // HOUR, START // HOUR + 1]
    assert tables[START // HOUR].column("kafka_index").to_pylist() == [0, 2]
    assert tables[START // HOUR + 1].column("kafka_index").to_pylist() == [1]


def test_a_record_given_back_takes_back_its_rows_from_every_hour() -> None:
    hourly, twin = HourlyColumns(), HourlyColumns()
    first = encode_otlp_protobuf([_span(x=1), _span(start=START + HOUR)])
    assert _append(hourly, first) == 2 and _append(twin, first) == 2
    # Two hours written, then seven more: one past what a record may hold.
    payload = encode_otlp_protobuf(
        [_span(y=1), _span(start=START + HOUR, y=2)]
        + [_span(start=START + i * HOUR, n=i) for i in range(2, 9)]
    )
    assert _append(hourly, payload) is None
    assert {hour: columns.rows for hour, columns in hourly.native_hours.items() if columns.rows} \
        == {START // HOUR: 1, START // HOUR + 1: 1}  # fmt: skip
    twin_hours = {hour: columns for hour, columns in _finished(twin).items()}
    assert {h: c for h, c in _finished(hourly).items() if h in twin_hours} == twin_hours


def test_finished_columns_hand_over_their_buffers_and_take_no_more_rows() -> None:
    hourly = HourlyColumns()
    assert _append(hourly, encode_otlp_protobuf([_span(x=1)])) == 1
    (columns,) = hourly.native_hours.values()
    finished = columns.finish()
    names = next(column for column in finished if not isinstance(column, list))
    assert type(names[3]).__name__ == "Buffer" and memoryview(names[3]).readonly
    with pytest.raises(RuntimeError, match="finished already"):
        columns.finish()
    with pytest.raises(TypeError, match="unfinished Columns"):
        _append(hourly, encode_otlp_protobuf([_span(x=2)]))


def test_a_record_over_more_hours_than_it_holds_takes_the_steps() -> None:
    hours = [_span(start=START + i * HOUR, n=i) for i in range(9)]
    assert _append(HourlyColumns(), encode_otlp_protobuf(hours)) is None
    assert _append(HourlyColumns(), encode_otlp_protobuf(hours[:8])) == 8
    _same_rows([encode_otlp_protobuf(hours), encode_otlp_protobuf(hours[:8])])


def test_events_and_links_are_read_natively_and_a_reward_marked_for_the_steps() -> None:
    from spanmill.spans.record import SpanEvent, SpanLink

    event = SpanEvent(name="retry", time_unix_nano=START, attributes={"attempt": 2})
    link = SpanLink(trace_id="3" * 32, span_id="4" * 16, attributes={"why": "follows"})
    plain = _span(x=1).model_copy(update={"events": (event,), "links": (link,)})
    hourly = HourlyColumns()
    assert _append(hourly, encode_otlp_protobuf([plain])) == 1
    (table,) = hourly.tables().values()
    assert json.loads(table.column("events")[0].as_py()) == [
        {"name": "retry", "time_unix_nano": START, "attributes": {"attempt": 2}}]  # fmt: skip
    assert json.loads(table.column("links")[0].as_py()) == [
        {"trace_id": "3" * 32, "span_id": "4" * 16, "attributes": {"why": "follows"}}]  # fmt: skip
    judged = _span(x=1).model_copy(update={"events": (event.model_copy(
        update={"name": sc.GEN_AI_EVALUATION_RESULT_EVENT,
                "attributes": {sc.GEN_AI_EVALUATION_NAME: "exact"}}),)})  # fmt: skip
    judging = HourlyColumns()
    assert _append(judging, encode_otlp_protobuf([judged])) == 1
    assert judging.native_hours[START // HOUR].steps == ((0, 1, False),)
    # The same rows as the steps, with attribute lists that filter event keys too.
    records = [encode_otlp_protobuf([plain]), encode_otlp_protobuf([judged, plain])]
    _same_rows(records)
    _same_rows(records, {"attributes_deny": ("why",)})


def test_keys_the_attribute_lists_have_not_judged_send_the_record_to_the_authority() -> None:
    """The decoder reads the lists' verdicts and never calls into Python: a key without one
    leaves the record to the authority, whose steps judge it; then it is read natively,
    its rows marked where a key is dropped."""
    with tempfile.TemporaryDirectory() as store:
        processor = BatchProcessor(ProcessingConfig(store_url=store, attributes_deny=("secret",)))
    verdicts = processor.redactor.verdicts
    payload = encode_otlp_protobuf([_span(plain=1, secret="x")])
    assert HourlyColumns().append_record(payload, verdicts=verdicts) is None
    assert verdicts == {}
    redacted: dict[str, int] = {}
    (parts,) = processor.spans_of(payload, None, redacted, {})
    assert redacted == {"attribute": 1} and "secret" not in parts.attributes
    assert verdicts == {"plain": True, "secret": False}
    hourly = HourlyColumns()
    assert hourly.append_record(payload, verdicts=verdicts) == 1
    assert hourly.native_hours[START // HOUR].steps == ((0, 1, True),)
    kept = HourlyColumns()
    assert kept.append_record(encode_otlp_protobuf([_span(plain=2)]), verdicts=verdicts) == 1
    assert kept.native_hours[START // HOUR].steps == ()


def test_the_extension_calls_no_python_code() -> None:
    """No callback from C into Python while a record is read: what Python decides
    (translation, redaction, the attribute lists) is handed in before, or done after."""
    source = (Path(native.__file__).parent / "_native.c").read_text()
    assert "PyObject_Call" not in source and "Vectorcall" not in source


def test_the_store_json_is_the_encoders_byte_for_byte() -> None:
    """Texts that need escaping, floats at their edges, the largest ints and event times:
    the extension writes the JSON columns as the store's encoder does."""
    from spanmill.spans.record import SpanEvent

    texts = ['quote " and \\ back', "tab\tline\nfeed\r", "\x00\x01\x1f\x7f", "é ✓ 😀 \u2028"]
    numbers = [0.0, -0.0, 1.5, 1e300, 5e-324, -1e-7, float("inf"), float("-inf"), 2**63 - 1]
    attributes = {f"t{i}": text for i, text in enumerate(texts)}
    attributes |= {f"n{i}": number for i, number in enumerate(numbers)}
    attributes |= {"low": -(2**63), "list": [1.0, -2.5e-10], "words": texts, "yes": True}
    event = SpanEvent(name="log\n", time_unix_nano=2**64 - 1, attributes=attributes)
    span = _span(**attributes).model_copy(
        update={"events": (event,), "resource_attributes": {"host": texts[0], "rank": 1e-3}}
    )
    hourly = HourlyColumns()
    assert _append(hourly, encode_otlp_protobuf([span])) == 1
    (table,) = hourly.tables().values()
    assert json.loads(table.column("attributes")[0].as_py()) == attributes
    _same_rows([encode_otlp_protobuf([span]), encode_otlp_protobuf([_span(x=1)])])
