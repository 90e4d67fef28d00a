"""The flywheel pipeline with kfp's local runner, small settings, every artifact checked.

The span store holds calculator episodes recorded the way the gateway and the SDK
record them: the few-shot production prompt, the reference solution as the
model's answers, a primary success reward. The pipeline distils them into the
zero-shot prompt, trains a LoRA adapter for a few dozen steps, evaluates it
against the base model, registers it as challenger and stages it in Triton.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import tritonclient.http as triton_http
from mlflow import MlflowClient

from spanmill import semconv as sc
from spanmill.gateway.llm_span import build_llm_span, new_span_id
from spanmill.pipeline.build import run_local
from spanmill.registry import CHALLENGER, ModelRegistry
from spanmill.registry import names as tags
from spanmill.spans import Span, SpanEvent
from spanmill.store import BatchId, hour_dir, table_from_spans
from spanmill.store.layout import hour_key
from spanmill.tasks import get_task

# Training and evaluating the real model: minutes on two cores, more when they are busy.
pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(2400)]


def recorded_episodes(n: int) -> list[Span]:
    task = get_task("calculator")
    spans: list[Span] = []
    t0 = time.time_ns() - 3600 * 10**9
    for i, instance in enumerate(task.instances("train", n, seed=3)):
        trace_id = f"{i + 1:032x}"
        root = new_span_id()
        start = t0 + i * 10**9
        opening = task.messages(instance, "few_shot")[:-1]
        transcript = task.reference_transcript(instance)
        for turn, message in enumerate(transcript):
            if message["role"] != "assistant":
                continue
            spans.append(build_llm_span(
                trace_id=trace_id, parent_span_id=root, span_id=new_span_id(),
                start_ns=start + turn * 1000, end_ns=start + turn * 1000 + 500,
                requested_model="calculator", triton_model="calculator", version="1",
                response_id=f"r-{i}-{turn}", request_messages=[*opening, *transcript[:turn]],
                params={"temperature": 0.0}, metadata={sc.SPANMILL_TASK_ID: instance.id},
                choice={"message": message, "finish_reason": "stop", "token_ids": [1, 2],
                        "logprobs": [-0.1, -0.2]},
            ))  # fmt: skip
        reward = SpanEvent(name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=start + 9000,
                           attributes={sc.GEN_AI_EVALUATION_NAME: "success",
                                       sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
                                       sc.SPANMILL_REWARD_PRIMARY: True})  # fmt: skip
        spans.append(Span(
            trace_id=trace_id, span_id=root, name="invoke_agent calculator",
            start_time_unix_nano=start, end_time_unix_nano=start + 10_000,
            attributes={sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
                        sc.GEN_AI_AGENT_NAME: "calculator", sc.SPANMILL_TASK_ID: instance.id},
            events=(reward,),
        ))  # fmt: skip
    return spans


def write_store(root: Path, spans: list[Span]) -> None:
    table = table_from_spans(spans, topic="spanmill.spans.v1")
    folder = root / hour_dir(hour_key(spans[0].start_time_unix_nano))
    folder.mkdir(parents=True)
    pq.write_table(table, folder / BatchId("spanmill.spans.v1", 0, 0, 0, "0" * 16).file_name())


def only(root: Path, pattern: str) -> Path:
    found = sorted(root.rglob(pattern))
    assert len(found) == 1, f"{pattern}: {found}"
    return found[0]


def test_flywheel_runs_locally(  # type: ignore[no-untyped-def]
    tmp_path: Path, smollm2_dir: Path, mlflow_server: Any, triton
) -> None:
    store = tmp_path / "spans"
    write_store(store, recorded_episodes(120))
    root = tmp_path / "pipeline-root"
    run_local(
        root, agent="calculator", store_url=str(store), min_reward=1.0, drop_examples=True,
        base_model=str(smollm2_dir), max_steps=40, batch_size=4, learning_rate=5e-4,
        precision="bf16", num_threads=2, eval_instances=32, margin=0.05,
        triton_url=triton.http_url, model_repository=str(triton.model_repository),
        tracking_uri=mlflow_server.tracking_uri,
    )  # fmt: skip

    card = json.loads(only(root, "card.json").read_text())
    assert card["counts"]["llm_calls"] == 240 and card["reward"] == "success"
    train_rows = pq.read_table(only(root, "train.parquet")).to_pylist()
    assert train_rows
    # Distilled: the example turns of the production prompt are gone.
    assert max(len(r["prompt"]) for r in train_rows) <= 4
    adapter = only(root, "adapter_config.json").parent
    assert (adapter / "adapter_model.safetensors").exists()
    metrics = json.loads(only(root, "metrics.json").read_text())
    print(f"\ngate: {metrics['decision']}")
    assert metrics["decision"]["promote"] is True

    registry = ModelRegistry(mlflow_server.tracking_uri)
    assert registry.aliases("calculator")[CHALLENGER] == 1
    version = registry.version("calculator", 1)
    assert version.tags[tags.TAG_KIND] == "adapter"
    assert (
        version.tags[tags.TAG_DATASET_DIGEST]
        == card["content_hash"][: len(version.tags[tags.TAG_DATASET_DIGEST])]
    )
    assert version.tags[tags.TAG_BASE_MODEL] == str(smollm2_dir)
    assert version.tags[tags.TAG_GATE] == "promote"
    assert version.tags.get(tags.TAG_PIPELINE_RUN)
    assert version.tags.get(tags.TAG_TRAIN_RUN)

    client = MlflowClient(mlflow_server.tracking_uri)
    run = client.get_run(version.tags[tags.TAG_TRAIN_RUN])
    assert run.info.status == "FINISHED" and "loss" in run.data.metrics

    triton_client = triton_http.InferenceServerClient(triton.http_url)
    assert triton_client.is_model_ready("calculator", "1")
    triton_client.unload_model("calculator")
