"""Helpers for collector tests: spans to send, settings, a collector in a thread, waiting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanmill import semconv as sc
from spanmill.collector import Collector
from spanmill.collector.embedded import collector_thread
from spanmill.config import CollectorSettings, KafkaSettings
from spanmill.spans import Span, encode_otlp_protobuf

BASE_NS = 1_750_000_000_000_000_000


@dataclass(frozen=True)
class Topics:
    spans: str
    dlq: str
    group: str
    bootstrap: str


def settings_for(topics: Topics, store: Path | str, **overrides: Any) -> CollectorSettings:
    values: dict[str, Any] = {
        "kafka": KafkaSettings(
            bootstrap_servers=topics.bootstrap, spans_topic=topics.spans, dlq_topic=topics.dlq
        ),
        "group_id": topics.group,
        "store_url": str(store),
        # tansu: the first assignment takes about half the session timeout.
        "session_timeout_ms": 6000,
        "batch_max_seconds": 0.5,
        "workers": 0,
        "receiver_enabled": False,
    }
    values.update(overrides)
    return CollectorSettings(**values)


def collector_process(
    topics: Topics,
    store: Path,
    log: Path,
    port: int,
    *,
    command: tuple[str, ...] = ("-m", "spanmill.collector"),
    **settings: str,
) -> subprocess.Popen[bytes]:
    """``spanmill collector`` as a service process, in a session of its own, logging to ``log``.

    ``settings``: more SPANMILL_COLLECTOR_* variables, by their lower-case suffix.
    """
    env = dict(os.environ)
    env.update(
        {
            "SPANMILL_KAFKA_BOOTSTRAP_SERVERS": topics.bootstrap,
            "SPANMILL_KAFKA_SPANS_TOPIC": topics.spans,
            "SPANMILL_KAFKA_DLQ_TOPIC": topics.dlq,
            "SPANMILL_COLLECTOR_GROUP_ID": topics.group,
            "SPANMILL_COLLECTOR_STORE_URL": str(store),
            "SPANMILL_COLLECTOR_SESSION_TIMEOUT_MS": "6000",
            "SPANMILL_COLLECTOR_BATCH_MAX_SECONDS": "0.5",
            "SPANMILL_COLLECTOR_HTTP_PORT": str(port),
        }
    )
    # One consumer process with one worker unless a test says otherwise: the set-up the
    # crash and fault tests were written for, whatever the machine's cores.
    settings = {"processes": "1", "workers": "1", **settings}
    env.update({f"SPANMILL_COLLECTOR_{name.upper()}": value for name, value in settings.items()})
    with open(log, "ab") as out:
        # A session of its own: SIGKILL to the group takes every process down with it.
        return subprocess.Popen(
            [sys.executable, *command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def running(settings: CollectorSettings) -> AbstractContextManager[Collector]:
    return collector_thread(settings)


def ready(port: int) -> bool:
    """Whether the collector serving HTTP on ``port`` answers /readyz with 200."""
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def producer(bootstrap: str, **options: Any) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=[bootstrap], linger_ms=5, acks="all", **options)


def llm_span(i: int = 0, trace_id: str | None = None, **attributes: Any) -> Span:
    """A realistic LLM call span with messages, tokens, logprobs and a reward event."""
    base = BASE_NS + i * 1_000_000
    attrs: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "smollm2",
        sc.GEN_AI_RESPONSE_MODEL: "smollm2-135m",
        sc.SPANMILL_MODEL_VERSION: "3",
        sc.GEN_AI_RESPONSE_ID: f"chatcmpl-{i}",
        sc.GEN_AI_AGENT_NAME: "calculator",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 42,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
        sc.GEN_AI_INPUT_MESSAGES: json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": f"what is {i} + 1? ÿ 🧮"}]}],
            ensure_ascii=False,
        ),
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": str(i + 1)}]}]
        ),
        sc.SPANMILL_COMPLETION_TOKEN_IDS: [17, 2, i % 50000],
        sc.SPANMILL_COMPLETION_LOGPROBS: [-0.25, -1e-9, 0.0],
        sc.SPANMILL_TASK_ID: f"task-{i % 7}",
        "custom.flag": True,
        "custom.ratio": 0.5,
    }
    attrs.update(attributes)
    return Span(
        trace_id=trace_id or os.urandom(16).hex(),
        span_id=os.urandom(8).hex(),
        parent_span_id=os.urandom(8).hex(),
        name="chat smollm2",
        kind="client",
        start_time_unix_nano=base,
        end_time_unix_nano=base + 500_000_000,
        status_code="ok",
        attributes=attrs,
        resource_attributes={sc.SERVICE_NAME: "calculator-agent", "host.name": "pod-1"},
        scope_name="spanmill.sdk",
        scope_version="0.1.0",
        events=[
            {
                "name": sc.GEN_AI_EVALUATION_RESULT_EVENT,
                "time_unix_nano": base + 600_000_000,
                "attributes": {
                    sc.GEN_AI_EVALUATION_NAME: "correct",
                    sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                    sc.SPANMILL_REWARD_PRIMARY: True,
                },
            }
        ],
        links=[{"trace_id": "a" * 32, "span_id": "b" * 16, "attributes": {"why": "retry"}}],
    )


def by_id(spans: list[Span]) -> dict[str, Span]:
    return {span.span_id: span for span in spans}


def trace_records(
    count: int, spans_per_record: int
) -> tuple[list[tuple[bytes, bytes]], set[tuple[str, str]]]:
    """``count`` records of one trace each (key, OTLP protobuf), ``spans_per_record`` LLM
    spans in each, and every (trace id, span id) they hold."""
    records, expected = [], set()
    template = [llm_span(i) for i in range(spans_per_record)]
    for n in range(count):
        trace_id = f"{n + 1:032x}"
        spans = [
            span.model_copy(update={"trace_id": trace_id, "span_id": f"{n + 1:08x}{i + 1:08x}"})
            for i, span in enumerate(template)
        ]
        expected.update((span.trace_id, span.span_id) for span in spans)
        records.append((trace_id.encode(), encode_otlp_protobuf(spans)))
    return records, expected


def processed(processor: Any, values: list[bytes]) -> tuple[Any, dict[str, Any]]:
    """A ``BatchProcessor``'s outcome for one batch of record values, and the Parquet
    tables it wrote, by path relative to its store."""
    import pyarrow.parquet as pq

    from spanmill.collector.batch import BatchJob
    from spanmill.store.layout import BatchId

    count = len(values)
    batch = BatchId("spans", 2, 10, 10 + count - 1, "f")
    outcome = processor.process(
        BatchJob(batch, list(range(10, 10 + count)), [1_750_000_000_000] * count, values,
                 [None] * count)
    )  # fmt: skip
    root = Path(processor.config.store_url)
    tables = {str(path.relative_to(root)): pq.read_table(path) for path in root.rglob("*.parquet")}
    return outcome, tables


def assert_same_writes(
    got: tuple[Any, dict[str, Any]], expected: tuple[Any, dict[str, Any]]
) -> None:
    """Two :func:`processed` results hold the same counts, dead letters and tables."""
    (outcome, tables), (expected_outcome, expected_tables) = got, expected
    assert outcome.spans == expected_outcome.spans
    assert outcome.dead == expected_outcome.dead
    assert outcome.redactions == expected_outcome.redactions
    assert outcome.translations == expected_outcome.translations
    assert outcome.files == expected_outcome.files
    assert tables.keys() == expected_tables.keys()
    for name, table in expected_tables.items():
        assert tables[name].equals(table), name
