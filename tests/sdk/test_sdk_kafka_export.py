"""Spans exported to Kafka arrive as OTLP protobuf, one trace per message, keyed by trace id."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanmill import sdk
from spanmill import semconv as sc
from spanmill.config import KafkaSettings
from spanmill.spans import Reward, Span, detect_and_decode
from spanmill.stack.ports import free_port


def consume(
    bootstrap_servers: str,
    topic: str,
    done: Callable[[list[Any]], bool],
    timeout_s: float = 60.0,
) -> list[Any]:
    """Records of ``topic`` from the start, until ``done(records)`` or the timeout."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap_servers,
        group_id=f"test-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not done(records) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


def decoded(record: Any) -> list[Span]:
    headers = dict(record.headers)
    return detect_and_decode(record.value, headers[sc.CONTENT_TYPE_HEADER].decode())


def span_count(records: list[Any]) -> int:
    return sum(len(decoded(record)) for record in records)


def fresh_topic(kafka: Any) -> KafkaSettings:
    topic = kafka.create_topic(f"t-{uuid.uuid4().hex}", 3)
    return KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=topic)


def spans_of_traces(count: int, spans_per_trace: int, padding: int = 0) -> list[ReadableSpan]:
    """Finished spans of ``count`` traces, interleaved the way a batch mixes them."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    roots = [tracer.start_span(f"root-{i}") for i in range(count)]
    for _ in range(spans_per_trace - 1):
        for root in roots:
            context = trace.set_span_in_context(root)
            tracer.start_span("child", context=context, attributes={"pad": "x" * padding}).end()
    for root in roots:
        root.end()
    return list(memory.get_finished_spans())


@pytest.mark.services
def test_an_episode_arrives_as_one_keyed_trace_with_its_rewards(kafka: Any) -> None:
    settings = fresh_topic(kafka)
    exporter = sdk.KafkaSpanExporter(settings)
    sdk.configure("calculator-agent", exporter=exporter, set_global=False)
    try:
        with sdk.episode("calculator", task_id="calculator/bakery/1") as ep:
            with sdk.tool_call("calculator", "call_1", {"expression": "4 * 12 - 9"}) as call:
                call.set_result("39")
            sdk.emit_reward("success", 1.0, primary=True, label="correct")
            sdk.emit_reward("valid_call", 1.0, response_id="chatcmpl-1")
        assert sdk.force_flush()
    finally:
        sdk.shutdown()
    assert (exporter.sent_spans, exporter.failed_spans) == (2, 0)

    records = consume(kafka.bootstrap_servers, settings.spans_topic, lambda r: span_count(r) >= 2)
    assert {record.key for record in records} == {ep.trace_id.encode()}
    assert all(
        dict(record.headers)[sc.CONTENT_TYPE_HEADER] == sc.CONTENT_TYPE_OTLP_PROTOBUF.encode()
        for record in records
    )
    spans = [span for record in records for span in decoded(record)]
    assert {span.trace_id for span in spans} == {ep.trace_id}
    (root,) = [s for s in spans if s.operation_name == sc.OPERATION_INVOKE_AGENT]
    (tool,) = [s for s in spans if s.operation_name == sc.OPERATION_EXECUTE_TOOL]
    assert root.agent_name == "calculator"
    assert root.task_id == "calculator/bakery/1"
    assert root.episode_id == ep.episode_id
    assert root.service_name == "calculator-agent"
    assert tool.parent_span_id == root.span_id
    assert tool.attributes[sc.GEN_AI_TOOL_NAME] == "calculator"
    assert tool.attributes[sc.GEN_AI_TOOL_CALL_ID] == "call_1"
    assert root.rewards == [
        Reward("success", 1.0, primary=True, label="correct"),
        Reward("valid_call", 1.0, response_id="chatcmpl-1"),
    ]


@pytest.mark.services
def test_a_batch_of_several_traces_becomes_one_message_per_trace(kafka: Any) -> None:
    settings = fresh_topic(kafka)
    exporter = sdk.KafkaSpanExporter(settings)
    spans = spans_of_traces(count=3, spans_per_trace=4)
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()

    records = consume(kafka.bootstrap_servers, settings.spans_topic, lambda r: len(r) >= 3)
    assert len(records) == 3
    for record in records:
        trace_spans = decoded(record)
        assert len(trace_spans) == 4
        assert {span.trace_id.encode() for span in trace_spans} == {record.key}
    # Same key, same partition: the order of one trace's messages is kept.
    assert len({record.key for record in records}) == 3


@pytest.mark.services
def test_a_trace_over_the_size_limit_is_split_under_one_key(kafka: Any) -> None:
    settings = fresh_topic(kafka).model_copy(update={"max_message_bytes": 2000})
    exporter = sdk.KafkaSpanExporter(settings)
    spans = spans_of_traces(count=1, spans_per_trace=10, padding=400)
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()

    records = consume(kafka.bootstrap_servers, settings.spans_topic, lambda r: span_count(r) >= 10)
    assert len(records) > 1
    assert all(len(record.value) <= 2000 for record in records)
    assert len({record.key for record in records}) == 1
    assert len({record.partition for record in records}) == 1
    assert span_count(records) == 10


@pytest.mark.services
def test_a_span_too_large_for_any_message_fails_the_export_alone(
    kafka: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = fresh_topic(kafka).model_copy(update={"max_message_bytes": 2000})
    exporter = sdk.KafkaSpanExporter(settings)
    small = spans_of_traces(count=1, spans_per_trace=2)
    huge = spans_of_traces(count=1, spans_per_trace=2, padding=5000)
    try:
        assert exporter.export(small + huge) is SpanExportResult.FAILURE
    finally:
        exporter.shutdown()
    assert exporter.failed_spans == 1
    assert exporter.sent_spans == 3
    assert "over the limit of 2000" in caplog.text


@pytest.mark.services
def test_a_call_over_the_limit_is_sent_without_its_prompt_as_the_gateway_sends_it(
    kafka: Any,
) -> None:
    """A call whose prompt made it too large for a record was dropped whole by the SDK
    (its answer, usage and reward link with it) where the gateway sent it reduced."""
    settings = fresh_topic(kafka).model_copy(update={"max_message_bytes": 2000})
    exporter = sdk.KafkaSpanExporter(settings)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("test").start_span("chat m", attributes={
        sc.GEN_AI_INPUT_MESSAGES: '[{"role": "user", "content": "' + "x" * 5000 + '"}]',
        sc.GEN_AI_OUTPUT_MESSAGES: '[{"role": "assistant", "content": "42"}]',
        sc.GEN_AI_RESPONSE_ID: "chatcmpl-7",
    }).end()  # fmt: skip
    try:
        assert exporter.export(memory.get_finished_spans()) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert (exporter.sent_spans, exporter.failed_spans, exporter.reduced_spans) == (1, 0, 1)
    (record,) = consume(kafka.bootstrap_servers, settings.spans_topic, lambda r: len(r) >= 1)
    assert len(record.value) <= 2000
    (span,) = decoded(record)
    assert sc.GEN_AI_INPUT_MESSAGES not in span.attributes
    assert span.attributes[sc.SPANMILL_SPAN_REDUCED] == [sc.GEN_AI_INPUT_MESSAGES]
    assert span.attributes[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-7"
    assert "42" in span.attributes[sc.GEN_AI_OUTPUT_MESSAGES]


def test_an_unreachable_broker_fails_the_export_without_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    exporter = sdk.KafkaSpanExporter(settings, timeout_s=2.0)
    spans = spans_of_traces(count=1, spans_per_trace=2)
    try:
        assert exporter.export(spans) is SpanExportResult.FAILURE
    finally:
        exporter.shutdown()
    assert exporter.failed_spans == 2
    assert settings.bootstrap_servers in caplog.text
    assert exporter.export(spans) is SpanExportResult.FAILURE  # after shutdown, still no raise
