"""The collector against a real tansu broker: spans land intact, bad records land in the DLQ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from collector_helpers import Topics, by_id, llm_span, producer, running, settings_for, wait_for

from spanmill import semconv as sc
from spanmill.spans import (
    Span,
    decode_otlp_protobuf,
    encode_otlp_json,
    encode_otlp_protobuf,
    encode_spans,
    span_to_dict,
)
from spanmill.store import SpanStore

pytestmark = pytest.mark.services


def _otel_sdk_payload() -> tuple[bytes, list[Span]]:
    """OTLP protobuf as a plain OpenTelemetry SDK exporter writes it, and its spans."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as otel_encode
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "plain-otel-service"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("plain.instrumentation", "9.9")
    root = tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.agent.name": "otel"})
    with root, tracer.start_as_current_span("chat gpt") as span:
        span.set_attribute(sc.GEN_AI_OPERATION_NAME, "chat")
        span.set_attribute(sc.GEN_AI_REQUEST_MODEL, "gpt-x")
        span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, 9)
        span.set_attribute("tags", ["a", "b"])
        span.add_event("retry", {"attempt": 2})
        span.set_status(Status(StatusCode.ERROR, "upstream 503"))
    payload = otel_encode(exporter.get_finished_spans()).SerializeToString()
    provider.shutdown()
    return payload, decode_otlp_protobuf(payload)


def test_sdk_json_otlp_and_plain_otel_spans_land_intact(topics: Topics, tmp_path: Path) -> None:
    sdk_spans = [llm_span(i) for i in range(40)]
    otlp_spans = [llm_span(100 + i) for i in range(40)]
    json_spans = [llm_span(200 + i) for i in range(20)]
    otel_payload, otel_spans = _otel_sdk_payload()
    send = producer(topics.bootstrap)
    for span in sdk_spans[:20]:  # one span per record, labelled
        send.send(
            topics.spans,
            key=span.trace_id.encode(),
            value=encode_spans([span]),
            headers=[(sc.CONTENT_TYPE_HEADER, sc.CONTENT_TYPE_SDK_JSON.encode())],
        )
    send.send(topics.spans, key=b"batch", value=encode_spans(sdk_spans[20:]))  # sniffed
    for span in otlp_spans:
        send.send(
            topics.spans,
            key=span.trace_id.encode(),
            value=encode_otlp_protobuf([span]),
            headers=[(sc.CONTENT_TYPE_HEADER, sc.CONTENT_TYPE_OTLP_PROTOBUF.encode())],
        )
    send.send(topics.spans, key=b"otlp-json", value=encode_otlp_json(json_spans))
    send.send(topics.spans, key=otel_spans[0].trace_id.encode(), value=otel_payload)
    send.flush()
    expected = by_id(sdk_spans + otlp_spans + json_spans + otel_spans)
    store = SpanStore(str(tmp_path / "store"))

    with running(settings_for(topics, tmp_path / "store")) as collector:
        wait_for(lambda: store.count() >= len(expected), 60, "every span in the store")
        assert collector.dead_letters == 0

    stored = by_id(store.spans())
    assert stored.keys() == expected.keys()
    for span_id, span in expected.items():
        assert stored[span_id] == span, span_id
    assert store.duplicates() == 0

    table = store.table(columns=["trace_id", "kafka_partition", "kafka_offset", "kafka_index"])
    rows = table.to_pylist()
    # Keyed by trace id: each single-span record's trace sits on one partition.
    partitions: dict[str, set[int]] = {}
    for row in rows:
        partitions.setdefault(row["trace_id"], set()).add(row["kafka_partition"])
    assert all(len(found) == 1 for found in partitions.values())
    assert len({(r["kafka_partition"], r["kafka_offset"], r["kafka_index"]) for r in rows}) == len(
        rows
    )

    one = store.table(trace_id=otlp_spans[3].trace_id).to_pylist()
    assert len(one) == 1
    row = one[0]
    assert row["service_name"] == "calculator-agent"
    assert row["agent_name"] == "calculator"
    assert row["model"] == "smollm2-135m"
    assert row["model_version"] == "3"
    assert row["completion_token_ids"] == [17, 2, 103]
    assert row["completion_logprobs"] == [-0.25, -1e-9, 0.0]
    assert row["rewards"][0]["name"] == "correct" and row["rewards"][0]["primary"] is True
    assert json.loads(row["input_messages"])[0]["parts"][0]["content"] == "what is 103 + 1? ÿ 🧮"
    assert store.count(service="plain-otel-service") == 2
    assert store.count(agent="calculator") == 100


def _consume_all(bootstrap: str, topic: str, count: int, timeout: float = 30) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=[bootstrap], enable_auto_commit=False)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    found: list[Any] = []
    wait_for(
        lambda: (
            bool(found.extend(consumer.poll(timeout_ms=500).get(partition, [])))
            or len(found) >= count
        ),
        timeout,
        f"{count} dead letters",
    )
    consumer.close()
    return found


def _protobuf_with_bad_utf8() -> bytes:
    payload = encode_otlp_protobuf([llm_span(1)])
    marker = b"chat smollm2"
    at = payload.index(marker)
    return payload[:at] + b"\xff\xfe" + payload[at + 2 :]


def _ends_before_start() -> dict[str, Any]:
    fields = span_to_dict(llm_span(2))
    fields["end_time_unix_nano"] = fields["start_time_unix_nano"] - 1
    return fields


MALFORMED: list[tuple[str, bytes, str | None, str]] = [
    ("bad_json", b'{"trace_id": "5b8efff798038103d269b633813fc60c", ', None, "bad_json"),
    (
        "bad_protobuf",
        b"\x0a\xff\xff\xff\x0f\x01\x02",
        sc.CONTENT_TYPE_OTLP_PROTOBUF,
        "bad_protobuf",
    ),
    (
        "wrong_types",
        json.dumps(
            {
                "trace_id": 12,
                "span_id": "eee19b7ec3c1b174",
                "name": "x",
                "start_time_unix_nano": "yesterday",
                "end_time_unix_nano": 1,
            }
        ).encode(),
        None,
        "schema",
    ),
    ("invalid_utf8_json", b'{"trace_id": "\xff\xfe", "name": "x"}', None, "invalid_utf8"),
    (
        "invalid_utf8_protobuf",
        _protobuf_with_bad_utf8(),
        sc.CONTENT_TYPE_OTLP_PROTOBUF,
        "invalid_utf8",
    ),
    ("oversize", b"{" + b" " * 70_000 + b"}", None, "oversize"),
    ("empty", b"", None, "empty"),
    ("unknown_content_type", b"a,b,c", "text/csv", "unsupported_content_type"),
    ("ends_before_start", json.dumps(_ends_before_start()).encode(), None, "schema"),
]


def test_malformed_records_land_in_the_dlq_while_valid_spans_flow(
    topics: Topics, tmp_path: Path
) -> None:
    good = [llm_span(i) for i in range(30)]
    send = producer(topics.bootstrap, max_request_size=4 * 1024 * 1024)
    sent: dict[str, tuple[bytes, str]] = {}
    for i, span in enumerate(good):
        send.send(topics.spans, key=span.trace_id.encode(), value=encode_otlp_protobuf([span]))
        if i < len(MALFORMED):
            name, value, content_type, reason = MALFORMED[i]
            headers = [(sc.CONTENT_TYPE_HEADER, content_type.encode())] if content_type else []
            headers.append(("x-origin", name.encode()))
            send.send(topics.spans, key=f"bad-{name}".encode(), value=value, headers=headers)
            sent[name] = (value, reason)
    send.flush()
    store = SpanStore(str(tmp_path / "store"))
    settings = settings_for(topics, tmp_path / "store")
    settings.kafka.max_message_bytes = 64 * 1024

    with running(settings) as collector:
        wait_for(lambda: collector.dead_letters >= len(MALFORMED), 60, "every dead letter")
        wait_for(lambda: store.count() >= len(good), 30, "every good span")
        counted = {
            sample.labels["reason"]: sample.value
            for metric in collector.metrics.dead_letters.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }

    assert by_id(store.spans()) == by_id(good)
    letters = _consume_all(topics.bootstrap, topics.dlq, len(MALFORMED))
    assert len(letters) == len(MALFORMED)
    for letter in letters:
        headers = dict(letter.headers)
        name = headers["x-origin"].decode()
        value, reason = sent[name]
        assert letter.value == value, name
        assert letter.key == f"bad-{name}".encode()
        assert headers[sc.DLQ_HEADER_REASON].decode() == reason, (name, headers)
        assert headers[sc.DLQ_HEADER_DETAIL], name
        topic, partition, offset = headers[sc.DLQ_HEADER_SOURCE].decode().rsplit("/", 2)
        assert topic == topics.spans and partition.isdigit() and offset.isdigit()
        assert int(headers[sc.DLQ_HEADER_FAILED_AT]) > 0
    assert sum(counted.values()) == len(MALFORMED)
    assert counted["schema"] == 2


def test_a_dead_letter_topic_that_never_takes_them_holds_commits_back_only_so_long(
    topics: Topics, tmp_path: Path
) -> None:
    """The dead-letter topic's broker cannot be reached (every send fails with a
    retriable error): after ``write_retry_s`` the dead letter is kept in the store, named
    by its offset and fingerprint, and every batch behind it is committed. The
    collector's producer is a real client pointed at a port where no broker listens;
    tansu takes any topic, so a missing topic cannot stage the fault."""
    import threading

    from kafka import KafkaProducer
    from store_fault import committed

    from spanmill.collector import Collector
    from spanmill.stack.ports import free_port
    from spanmill.store.layout import fingerprint

    good = [llm_span(i) for i in range(12)]
    send = producer(topics.bootstrap)
    bad = send.send(topics.spans, key=b"bad", value=b"\x00not spans").get(timeout=30)
    for span in good:
        send.send(topics.spans, key=span.trace_id.encode(), value=encode_otlp_protobuf([span]))
    send.flush()
    send.close()
    store = SpanStore(str(tmp_path / "store"))
    collector = Collector(settings_for(topics, tmp_path / "store", write_retry_s=2.0))
    collector.start()
    collector.producer.close(timeout=5)
    collector.producer = KafkaProducer(
        bootstrap_servers=f"127.0.0.1:{free_port()}", api_version=(2, 5, 0), max_block_ms=1_000
    )
    thread = threading.Thread(target=collector.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: collector.dead_letters >= 1, 90, "the dead letter kept in the store")
        wait_for(lambda: store.count() >= len(good), 30, "every good span")
        wait_for(lambda: sum(committed(topics).values()) == len(good) + 1, 30, "every commit")
        assert collector.metrics.dead_letters_stored._value.get() == 1
    finally:
        collector.stop()
        thread.join(timeout=60)

    assert by_id(store.spans()) == by_id(good)
    kept = tmp_path / "store" / "_dead_letters" / topics.spans / f"p{bad.partition}"
    mark = fingerprint(bad.timestamp, b"bad", b"\x00not spans")
    assert (kept / f"{bad.offset:020d}-{mark}.bin").read_bytes() == b"\x00not spans"
    meta = json.loads((kept / f"{bad.offset:020d}-{mark}.json").read_text())
    assert meta["source"] == f"{topics.spans}/{bad.partition}/{bad.offset}"


def test_redaction_happens_before_anything_is_written(topics: Topics, tmp_path: Path) -> None:
    secret_key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2
    span = llm_span(
        7,
        **{
            sc.GEN_AI_INPUT_MESSAGES: json.dumps(
                [
                    {
                        "role": "user",
                        "parts": [
                            {
                                "type": "text",
                                "content": f"I am jane.doe@example.com, key {secret_key}, "
                                "card 4111 1111 1111 1111",
                            }
                        ],
                    }
                ]
            ),
            "user.email": "jane.doe@example.com",
            "http.request.header.authorization": "Bearer abc",
            "note": "order 1750000000000000000 shipped",
        },
    )
    send = producer(topics.bootstrap)
    send.send(topics.spans, key=span.trace_id.encode(), value=encode_otlp_protobuf([span]))
    send.flush()
    store_dir = tmp_path / "store"
    store = SpanStore(str(store_dir))
    with running(settings_for(topics, store_dir)) as collector:
        # The batch's outcome is counted once it is done, after its file is in the store.
        wait_for(lambda: collector.spans_written >= 1, 60, "the span written and counted")
        redacted = {
            sample.labels["rule"]: sample.value
            for metric in collector.metrics.redactions.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }

    (stored,) = store.spans()
    text = json.dumps(stored.model_dump(), ensure_ascii=False)
    assert "jane.doe@example.com" not in text
    assert secret_key not in text
    assert "4111 1111 1111 1111" not in text
    assert "http.request.header.authorization" not in stored.attributes
    assert stored.attributes["user.email"] == "[REDACTED:email]"
    assert "[REDACTED:api_key]" in stored.attributes[sc.GEN_AI_INPUT_MESSAGES]
    assert "[REDACTED:card_number]" in stored.attributes[sc.GEN_AI_INPUT_MESSAGES]
    # A nanosecond timestamp is not a card number.
    assert stored.attributes["note"] == "order 1750000000000000000 shipped"
    json.loads(str(stored.attributes[sc.GEN_AI_INPUT_MESSAGES]))  # still valid JSON
    assert redacted == {"email": 2, "api_key": 1, "card_number": 1, "attribute": 1}
    # Nothing unredacted anywhere in the files either.
    for path in store_dir.rglob("*.parquet"):
        import pyarrow.parquet as pq

        assert "jane.doe" not in str(pq.read_table(path).to_pylist())


def test_stop_writes_what_is_held_and_commits(topics: Topics, tmp_path: Path) -> None:
    spans = [llm_span(i) for i in range(300)]
    send = producer(topics.bootstrap)
    for span in spans:
        send.send(topics.spans, key=span.trace_id.encode(), value=encode_otlp_protobuf([span]))
    send.flush()
    store = SpanStore(str(tmp_path / "store"))
    # Nothing is due by size or age: only stopping writes it.
    settings = settings_for(topics, tmp_path / "store", batch_max_seconds=600.0)
    with running(settings) as collector:
        wait_for(
            lambda: (
                sum(
                    s.value
                    for m in collector.metrics.records_consumed.collect()
                    for s in m.samples
                    if s.name.endswith("_total")
                )
                >= len(spans)
            ),
            60,
            "every record consumed",
        )
        assert store.count() == 0
    assert store.count() == len(spans)

    # The offsets were committed: the same group takes nothing again.
    with running(settings_for(topics, tmp_path / "store", batch_max_seconds=0.2)) as again:
        wait_for(lambda: again.ready, 30, "the second collector to join")
        import time

        time.sleep(2)
        assert again.spans_written == 0
    assert store.count() == len(spans)
    assert store.duplicates() == 0
