"""The flywheel pipeline with kfp's local runner, small settings, every artifact checked.

The span store holds calculator episodes recorded the way the gateway and the SDK
record them: the few-shot production prompt, the reference solution as the
model's answers, a primary success reward. Reference solutions rather than the
base model's own few-shot successes: those need about 800 few-shot episodes
(about 8 minutes of generation here) to yield ~95 successes; the reference
solutions cost nothing and teach the same protocol. The pipeline distils them
into the zero-shot prompt, trains a LoRA adapter for a few dozen steps, evaluates
it through Triton against the base model (no champion is registered: the base is
staged beside it) on fresh held-out problems, where the base model scores ~0%,
and on the replayed held-out calls, registers it as challenger and stages it.
Training, evaluation and lineage are checked in MLflow.
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

STEPS = 40


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


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found: set[str] = set()
    for entry in client.list_artifacts(run_id, path):
        if entry.is_dir:
            found |= artifact_paths(client, run_id, entry.path)
        else:
            found.add(entry.path)
    return found


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
        base_model=str(smollm2_dir), max_steps=STEPS, batch_size=4, learning_rate=5e-4,
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

    # The model learnt: the base model writes prose to the zero-shot prompt, the tuned
    # one calls the tool; measured on fresh held-out problems and on the replayed calls.
    tasks, replay = metrics["suites"]["tasks"], metrics["suites"]["replay"]
    for name, suite in (("tasks", tasks), ("replay", replay)):
        before, after = suite["champion"], suite["challenger"]
        print(
            f"{name:6} n={after['n']:3}  success {before['success_rate']:.2f} -> "
            f"{after['success_rate']:.2f}  format valid {before['format_validity']:.2f} -> "
            f"{after['format_validity']:.2f}  scores {before['scores']} -> {after['scores']}"
        )
    assert tasks["champion"]["success_rate"] <= 0.1
    assert tasks["challenger"]["format_validity"] >= 0.9
    assert tasks["challenger"]["success_rate"] >= tasks["champion"]["success_rate"] + 0.15
    assert tasks["difference"]["low"] > 0
    named = [replay[role]["scores"]["tool_calls.name"] for role in ("champion", "challenger")]
    assert named[1] > named[0]

    # All of it is in MLflow: one run holds the training and its evaluation.
    client = MlflowClient(mlflow_server.tracking_uri)
    run = client.get_run(version.tags[tags.TAG_TRAIN_RUN])
    assert run.info.status == "FINISHED"
    assert run.data.params["lora_r"] == "16"
    assert run.data.params["base_model"] == str(smollm2_dir)
    assert run.data.tags["spanmill.gate"] == "promote"
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(1, STEPS + 1))
    assert loss[-1].value < loss[0].value
    assert {"learning_rate", "tokens_per_second", "train_tokens_per_second", "eval_loss"} <= set(
        run.data.metrics
    )
    metric = run.data.metrics["eval.tasks.challenger.success_rate"]
    assert metric == pytest.approx(tasks["challenger"]["success_rate"])
    assert [i.dataset.digest for i in run.inputs.dataset_inputs] == [card["content_hash"][:36]]
    assert {
        "plots/loss_curve.png",
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "dataset/card.json",
        "spanmill-train.json",
        "evaluation/report.html",
        "evaluation/report.md",
        "evaluation/report.png",
        "evaluation/metrics.json",
        "evaluation/outcomes.jsonl",
    } <= artifact_paths(client, run.info.run_id)
    # The challenger was staged for the evaluation only; no champion: the base beside it.
    candidates = Path(triton.model_repository) / "calculator.candidate"
    assert not [p for p in candidates.glob("*") if p.name.isdigit()]

    triton_client = triton_http.InferenceServerClient(triton.http_url)
    assert triton_client.is_model_ready("calculator", "1")
    triton_client.unload_model("calculator")
