"""A dataset built from spans that went through Kafka and the real collector."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dataset_traces import SYSTEM, episode, llm, reward_event, tool
from kafka import KafkaProducer

from spanmill import semconv as sc
from spanmill.collector.embedded import collector_thread
from spanmill.config import CollectorSettings, KafkaSettings
from spanmill.dataset import layout
from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.spans import encode_otlp_protobuf
from spanmill.store import SpanStore

pytestmark = pytest.mark.services


def test_sft_dataset_from_collected_spans(kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(f"spans-{uuid.uuid4().hex[:8]}", 3)
    dlq = kafka.create_topic(f"{topic}.dlq", 1)
    now = time.time_ns()
    example = {sc.SPANMILL_MESSAGE_EXAMPLE: True}
    few_shot = [
        SYSTEM,
        {"role": "user", "content": "2+2?", **example},
        {"role": "assistant", "content": "4", **example},
    ]
    traces = []
    for i in range(12):
        task = f"calculator/t{i}"
        prompt = [*few_shot, {"role": "user", "content": f"What is {i} times 3?"}]
        success = float(i % 3 != 0)
        traces.append([
            episode(1000 + i, now + i * 1000, reward_event("success", success, primary=True),
                    task=task),
            llm(1000 + i, now + i * 1000 + 1, prompt=prompt, task=task,
                answer={"tool": "calculator", "expression": f"{i}*3"}),
            tool(1000 + i, now + i * 1000 + 2),
            llm(1000 + i, now + i * 1000 + 3, answer=str(i * 3), task=task,
                prompt=[*prompt, {"role": "tool", "content": str(i * 3)}]),
        ])  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for spans in traces:
        producer.send(topic, key=spans[0].trace_id.encode(), value=encode_otlp_protobuf(spans))
    producer.flush()
    producer.close()

    store = tmp_path / "store"
    settings = CollectorSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, spans_topic=topic,
                            dlq_topic=dlq),
        group_id=f"g-{uuid.uuid4().hex}", store_url=str(store), session_timeout_ms=6000,
        batch_max_seconds=0.5, receiver_enabled=False,
    )  # fmt: skip
    with collector_thread(settings):
        deadline = time.monotonic() + 60
        while SpanStore(str(store)).count() < 48 and time.monotonic() < deadline:
            time.sleep(0.3)
    assert SpanStore(str(store)).count() == 48

    out = tmp_path / "dataset"
    spec = DatasetSpec(mode="sft", min_reward=1.0, drop_examples=True, eval_fraction=0.25)
    card = build_dataset(str(store), out, spec)
    train = pq.read_table(out / layout.TRAIN_FILE).to_pylist()
    held = pq.read_table(out / layout.EVAL_FILE).to_pylist()
    rows = train + held
    # 8 successful episodes (i % 3 != 0), two calls each.
    assert len(rows) == 16 and card["counts"]["llm_calls"] == 24
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in held}
    assert all(r["reward"] == 1.0 and r["weight"] == 1.0 for r in rows)
    # Re-targeted to the short prompt: no example turn survives.
    assert all(m["content"] not in {"2+2?", "4"} for r in rows for m in r["prompt"])
    first_calls = [r for r in rows if r["completion"][0]["content"].startswith("{")]
    assert len(first_calls) == 8
    assert json.loads(first_calls[0]["completion"][0]["content"])["tool"] == "calculator"
    assert card["reward"] == "success" and len(card["content_hash"]) == 64
    assert json.loads((out / layout.CARD_FILE).read_text()) == card
    assert "Counts at each step" in (out / "card.html").read_text()
    # The same spans give the same dataset.
    again = build_dataset(str(store), tmp_path / "again", spec)
    assert again["content_hash"] == card["content_hash"]
