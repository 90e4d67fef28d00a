"""The batch processor: what it writes for each kind of record, read back from the store.

The redaction prefilter lets most records skip the patterns; these check that what
it lets through, and what it must not (translated spans, JSON text), is redacted.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from spanmill import semconv as sc
from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
from spanmill.spans import Span, SpanEvent, encode_otlp_json, encode_otlp_protobuf
from spanmill.spans.sdk_json import encode_span
from spanmill.store.layout import BatchId
from spanmill.store.reader import SpanStore

CARD = "4111 1111 1111 1111"


def _span(i: int, **attributes: Any) -> Span:
    return Span(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        name="chat",
        start_time_unix_nano=1_750_000_000_000_000_000 + i,
        end_time_unix_nano=1_750_000_000_000_000_001 + i,
        attributes=attributes,
    )


def _process(tmp_path: Path, values: list[bytes]) -> tuple[dict[str, Span], Any]:
    processor = BatchProcessor(ProcessingConfig(store_url=str(tmp_path)))
    count = len(values)
    job = BatchJob(
        batch=BatchId("spans", 0, 0, count - 1, "f"),
        offsets=list(range(count)),
        timestamps=[0] * count,
        values=values,
        content_types=[None] * count,
    )
    outcome = processor.process(job)
    assert outcome.dead == []
    stored = SpanStore(str(tmp_path)).spans()
    return {span.trace_id: span for span in stored}, outcome


def test_what_the_prefilter_passes_and_what_it_stops(tmp_path: Path) -> None:
    plain = _span(0, **{"spanmill.task.id": "task-1", "note": "ids 1234 5678 90"})
    emailed = _span(1, note="write to ann@example.org")
    keyed = _span(2, key="sk-" + "a" * 24)
    carded = _span(3, card=f"paid with {CARD}")
    # OpenLLMetry prompts: translation makes gen_ai.input.messages from them.
    translated = _span(4, **{"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": CARD})
    values = [encode_otlp_protobuf([s]) for s in (plain, emailed, keyed, carded, translated)]
    # JSON text may escape what it carries: the bytes show no "@", the span has one.
    escaped = _span(5, note="write to bob@example.org")
    values.append(encode_span(escaped).replace(b"@", b"\\u0040"))
    values.append(encode_otlp_json([_span(6, note=f"card {CARD}")]))
    stored, outcome = _process(tmp_path, values)

    assert stored[plain.trace_id].attributes == plain.attributes
    assert stored[emailed.trace_id].attributes["note"] == "write to [REDACTED:email]"
    assert stored[keyed.trace_id].attributes["key"] == "[REDACTED:api_key]"
    assert stored[carded.trace_id].attributes["card"] == "paid with [REDACTED:card_number]"
    messages = json.loads(stored[translated.trace_id].attributes[sc.GEN_AI_INPUT_MESSAGES])
    assert messages[0]["parts"][0]["content"] == "[REDACTED:card_number]"
    assert stored[escaped.trace_id].attributes["note"] == "write to [REDACTED:email]"
    assert stored[f"{7:032x}"].attributes["note"] == "card [REDACTED:card_number]"
    assert outcome.redactions == {"email": 2, "api_key": 1, "card_number": 3}
    assert outcome.translations == {"openllmetry": 1}


def test_escapes_in_a_protobuf_records_json_text_hide_nothing(tmp_path: Path) -> None:
    """A message JSON that writes "@" as "\\u0040" in a record the native decoder reads
    is redacted as the authority redacts it (the scan once passed it, stored as sent)."""
    messages = (
        '[{"role":"user","parts":[{"type":"text","content":'
        '"mail bob\\u0040example.org, key sk\\u002d' + "a" * 24 + '"}]}]'
    )
    span = _span(0, **{sc.GEN_AI_INPUT_MESSAGES: messages, "args": '{"to":"ann\\u0040x.org"}'})
    stored, outcome = _process(tmp_path, [encode_otlp_protobuf([span])])
    attributes = stored[span.trace_id].attributes
    assert json.loads(attributes[sc.GEN_AI_INPUT_MESSAGES])[0]["parts"][0]["content"] == (
        "mail [REDACTED:email], key [REDACTED:api_key]"
    )
    assert json.loads(attributes["args"]) == {"to": "[REDACTED:email]"}
    assert outcome.redactions == {"email": 2, "api_key": 1}


@pytest.mark.parametrize("value", [b"\x00\x01\x02", b"AKIA" + b"A" * 16])
def test_bytes_values_are_redacted_as_the_text_they_become(tmp_path: Path, value: bytes) -> None:
    """A bytes attribute is stored as base64, text the payload never held as such."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest.FromString(encode_otlp_protobuf([_span(0)]))
    # Bytes whose base64 is an AWS key id: the key only exists once decoded.
    raw = base64.b64decode("AKIAIOSFODNN7EXAMPLE") if value.startswith(b"AKIA") else value
    pair = request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="raw")
    pair.value.bytes_value = raw
    stored, _ = _process(tmp_path, [request.SerializeToString()])
    text = base64.b64encode(raw).decode()
    expected = "[REDACTED:api_key]" if text.startswith("AKIA") else text
    assert stored[f"{1:032x}"].attributes["raw"] == expected


@pytest.mark.parametrize("native", [True, False])
def test_a_record_that_breaks_the_processor_is_dead_lettered_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Half of its rows appended when it broke: the batch is made again without it, and
    every other record is stored whole."""
    from spanmill.store.rows import HourlyColumns

    real = HourlyColumns.append

    def append(self: HourlyColumns, parts: Any, *args: Any) -> None:
        real(self, parts, *args)  # the row is in, then the collector breaks
        if parts.name == "poison":
            raise ValueError("a bug in the row builder")

    monkeypatch.setattr(HourlyColumns, "append", append)
    processor = BatchProcessor(ProcessingConfig(store_url=str(tmp_path)), native=native)
    if processor._native is not None:
        real_native = processor._native[0]

        def native_append(hours: Any, value: bytes, *args: Any) -> Any:
            appended = real_native(hours, value, *args)
            if b"poison" in value:
                raise MemoryError("the native builder ran out")
            return appended

        processor._native = (native_append, *processor._native[1:])
    poison = _span(7).model_copy(update={"name": "poison"})
    # Plain spans, and one whose row the steps finish (an evaluation event: a reward).
    event = SpanEvent(
        name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=1_750_000_000_000_000_000
    )
    records = [
        [_span(0), _span(1)],
        [_span(2), poison, _span(3)],  # its first span is in when it breaks
        [_span(4).model_copy(update={"events": [event]})],
        [_span(5), _span(6)],
    ]
    values = [encode_otlp_protobuf(spans) for spans in records]
    outcome = processor.process(
        BatchJob(BatchId("spans", 0, 0, 3, "f"), [0, 1, 2, 3], [0] * 4, values, [None] * 4)
    )
    assert [(offset, reason) for offset, reason, _ in outcome.dead] == [(1, "internal_error")]
    assert outcome.records == 4 and outcome.spans == 5
    stored = sorted(span.span_id for span in SpanStore(str(tmp_path)).spans())
    assert stored == [f"{i + 1:016x}" for i in (0, 1, 4, 5, 6)]


def test_a_batch_that_many_records_break_is_still_made_of_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each breaking record sends the batch round again without it: a bug that many of a
    batch's records meet must not go deeper each time (past the interpreter's recursion
    limit), or the batch could never be made, on any collector."""
    import sys

    from spanmill.store.rows import HourlyColumns

    real = HourlyColumns.append

    def append(self: HourlyColumns, parts: Any, *args: Any) -> None:
        if parts.name == "poison":
            raise ValueError("a bug in the row builder")
        real(self, parts, *args)

    monkeypatch.setattr(HourlyColumns, "append", append)
    processor = BatchProcessor(ProcessingConfig(store_url=str(tmp_path)), native=False)
    count = 400
    spans = [_span(i).model_copy(update={"name": "poison"}) if i % 4 else _span(i)
             for i in range(count)]  # fmt: skip
    values = [encode_otlp_protobuf([span]) for span in spans]
    job = BatchJob(BatchId("spans", 0, 0, count - 1, "f"), list(range(count)),
                   [0] * count, values, [None] * count)  # fmt: skip
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)  # fewer frames than there are breaking records
    try:
        outcome = processor.process(job)
    finally:
        sys.setrecursionlimit(limit)
    assert [offset for offset, _, _ in outcome.dead] == [i for i in range(count) if i % 4]
    assert outcome.records == count and outcome.spans == count // 4
    assert len(SpanStore(str(tmp_path)).spans()) == count // 4


def test_a_record_whose_steps_break_is_dead_lettered_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native path writes a record and marks it for the steps, which break on it
    when the tables are made: the batch is made again without it."""
    processor = BatchProcessor(ProcessingConfig(store_url=str(tmp_path)))
    assert processor._native is not None, "the C extension spanmill._native is not built"
    real = processor.steps

    def steps(parts: Any, *args: Any, **kwargs: Any) -> None:
        if parts.name == "poison":
            raise ValueError("a bug in the steps")
        real(parts, *args, **kwargs)

    monkeypatch.setattr(processor, "steps", steps)
    mail = {"note": "write to ops@example.com"}  # redaction's: marked for the steps
    poison = _span(7).model_copy(update={"name": "poison", "attributes": mail})
    records = [
        [_span(0), _span(1).model_copy(update={"attributes": mail})],
        [_span(2), poison, _span(3)],
        [_span(5), _span(6)],
    ]
    values = [encode_otlp_protobuf(spans) for spans in records]
    outcome = processor.process(
        BatchJob(BatchId("spans", 0, 0, 2, "f"), [0, 1, 2], [0] * 3, values, [None] * 3)
    )
    assert [(offset, reason) for offset, reason, _ in outcome.dead] == [(1, "internal_error")]
    assert "a bug in the steps" in outcome.dead[0][2]
    assert outcome.records == 3 and outcome.spans == 4 and outcome.redactions == {"email": 1}
    stored = {span.span_id: span for span in SpanStore(str(tmp_path)).spans()}
    assert sorted(stored) == [f"{i + 1:016x}" for i in (0, 1, 5, 6)]
    assert stored[f"{2:016x}"].attributes["note"] == "write to [REDACTED:email]"


def test_without_workers_a_batch_is_processed_while_the_consumer_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """workers=0: submit hands the batch to a thread of the process and returns at once,
    so the consumer polls while the batch is decoded and written; the outcome is the
    processor's own."""
    import threading

    from spanmill.collector.batch import ThreadProcessing, make_processing

    processing = make_processing(ProcessingConfig(store_url=str(tmp_path)), 0)
    assert isinstance(processing, ThreadProcessing)
    processor = processing.processor
    release, ran_in = threading.Event(), []
    real = processor.process

    def held(job: BatchJob) -> Any:
        ran_in.append(threading.current_thread())
        assert release.wait(30), "the test never let the batch go"
        return real(job)

    monkeypatch.setattr(processor, "process", held)
    values = [encode_otlp_protobuf([_span(i)]) for i in range(3)]
    job = BatchJob(BatchId("spans", 0, 0, 2, "f"), [0, 1, 2], [0] * 3, values, [None] * 3)
    try:
        future = processing.submit(job)
        assert not future.done()  # the caller is not held while the batch is processed
        release.set()
        outcome = future.result(timeout=60)
    finally:
        release.set()
        processing.close()
    assert ran_in and ran_in[0] is not threading.current_thread()
    assert (outcome.records, outcome.spans, outcome.dead) == (3, 3, [])
    assert len(SpanStore(str(tmp_path)).spans()) == 3


def test_records_in_a_foreign_convention_are_read_natively_once_their_keys_are_judged(
    tmp_path: Path,
) -> None:
    """The attribute lists (on by default) judge each key once; the native decoder leaves
    a record with a key not yet judged to the authority. Keys that translation takes
    away must be judged too, or every OpenLLMetry record goes to the authority whole."""
    from spanmill.store.rows import HourlyColumns

    def openllmetry(i: int) -> Span:
        return _span(i, **{
            "gen_ai.system": "openai",
            "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "You add.",
            "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": f"2+{i}?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.tool_calls.0.name": "calculator",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"expression": "2+2"}',
            "gen_ai.usage.prompt_tokens": 11,
        })  # fmt: skip

    from spanmill.config import CollectorSettings

    settings = CollectorSettings(store_url=str(tmp_path), receiver_enabled=False)
    processor = BatchProcessor(ProcessingConfig.from_settings(settings))
    assert processor.redactor.filters_keys and processor._native is not None
    first = encode_otlp_protobuf([openllmetry(0)])
    job = BatchJob(BatchId("spans", 0, 0, 0, "f"), [0], [0], [first], [None])
    assert processor.process(job).translations == {"openllmetry": 1}

    append, gates, digits, fallback, verdicts = processor._native
    later = encode_otlp_protobuf([openllmetry(1)])
    hourly = HourlyColumns(decoder=processor.decoder)
    taken = append(hourly.native_hours, later, gates, digits, fallback, verdicts,
                   "spans", 0, 1, 0)  # fmt: skip
    unjudged = sorted(set(openllmetry(1).attributes) - set(verdicts))
    assert taken == 1, f"given back to the authority; keys not judged: {unjudged}"
