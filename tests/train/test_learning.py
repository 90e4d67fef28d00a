"""SmolLM2-135M-Instruct learns the calculator protocol from a few dozen LoRA steps.

The training data are the calculator's own reference solutions, stored with the
zero-shot prompt the way the dataset builder stores real LLM calls. Reference
solutions rather than the base model's own few-shot successes: those need about
800 few-shot episodes (about 8 minutes of generation here) to yield ~95
successes, which alone would spend this test's whole budget; the reference
solutions cost nothing and teach the same protocol. Held-out success is measured
on fresh instances with the zero-shot prompt, where the base model scores ~0%,
both models answering through Triton (no champion is registered: the base model
is staged beside the challenger).

Everything lands in a real MLflow server and is checked there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from spanmill.config import MLflowSettings, TritonSettings
from spanmill.evaluate import EvalSettings, evaluate
from spanmill.tasks import get_task
from spanmill.train import TrainSettings, train, write_reference_dataset

# About 3 minutes on two idle cores; the limit leaves room for a machine shared with
# other work, where it has taken 9.
pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS = 40
TRAIN_EPISODES = 200
HELDOUT_INSTANCES = 32
REPLAY_ITEMS = 16


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found: set[str] = set()
    for entry in client.list_artifacts(run_id, path):
        if entry.is_dir:
            found |= artifact_paths(client, run_id, entry.path)
        else:
            found.add(entry.path)
    return found


def test_lora_tuning_raises_heldout_success_over_the_base_model(
    tmp_path: Path, smollm2_dir: Path, mlflow_server: Any, triton: Any
) -> None:
    task = get_task("calculator")
    dataset = write_reference_dataset(
        task, tmp_path / "dataset", n_train=TRAIN_EPISODES, n_eval=REPLAY_ITEMS // 2
    )
    tracking = MLflowSettings(tracking_uri=mlflow_server.tracking_uri)
    started = time.perf_counter()
    trained = train(
        dataset,
        tmp_path / "adapter",
        TrainSettings(
            base_model=str(smollm2_dir),
            max_steps=STEPS,
            batch_size=4,
            learning_rate=5e-4,
            precision="bf16",
            num_threads=2,
            experiment="test-learning",
            mlflow=tracking,
        ),
    )
    train_seconds = time.perf_counter() - started
    report = evaluate(
        dataset,
        str(tmp_path / "adapter"),
        tmp_path / "evaluation",
        EvalSettings(
            agent="calculator",
            instances=HELDOUT_INSTANCES,
            replay_items=REPLAY_ITEMS,
            triton=TritonSettings(
                http_url=triton.http_url, model_repository=str(triton.model_repository)
            ),
            max_new_tokens=48,
            batch_size=32,
            num_threads=2,
            mlflow=tracking,
        ),
    )
    eval_seconds = time.perf_counter() - started - train_seconds
    # Both versions staged for the evaluation left Triton's repository with it.
    candidates = Path(triton.model_repository) / "calculator.candidate"
    assert not [p for p in candidates.glob("*") if p.name.isdigit()]

    tasks = report.suites["tasks"]
    samples = report.suites["replay"]
    print(
        f"\n{STEPS} steps of batch 4 in {train_seconds:.0f}s "
        f"({trained.metrics.get('train_tokens_per_second', 0):.0f} tokens/s, "
        f"peak RSS {trained.metrics['peak_rss_mb']:.0f} MB, final loss "
        f"{trained.metrics['train_loss']:.3f}, eval loss {trained.metrics['eval_loss']:.3f}); "
        f"evaluation in {eval_seconds:.0f}s"
    )
    for suite in (tasks, samples):
        d = suite.difference
        print(
            f"{suite.name:8} n={suite.challenger.n:3}  success {suite.champion.success_rate:.2f}"
            f" -> {suite.challenger.success_rate:.2f}  format valid "
            f"{suite.champion.format_validity:.2f} -> {suite.challenger.format_validity:.2f}  "
            f"tokens/answer {suite.champion.tokens_per_answer:.1f} -> "
            f"{suite.challenger.tokens_per_answer:.1f}  diff {d.estimate:+.2f} "
            f"[{d.low:+.2f}, {d.high:+.2f}]"
        )
    print(f"gate: {report.decision.verdict}: {'; '.join(report.decision.reasons)}")

    # The base model writes prose to the zero-shot prompt; the tuned one calls the tool.
    assert tasks.champion.success_rate <= 0.1
    assert tasks.challenger.format_validity >= 0.9
    assert tasks.challenger.success_rate >= tasks.champion.success_rate + 0.15
    assert tasks.difference.low > 0
    assert samples.challenger.success_rate > samples.champion.success_rate
    replayed = samples.challenger.scores
    assert replayed["tool_calls.name"] > samples.champion.scores["tool_calls.name"]
    assert report.decision.promote

    # All of it is in MLflow: one run holds the training and its evaluation.
    client = MlflowClient(mlflow_server.tracking_uri)
    assert trained.run_id is not None and report.run_id == trained.run_id
    run = client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["lora_r"] == "16"
    assert run.data.params["base_model"] == str(smollm2_dir)
    assert run.data.tags["spanmill.gate"] == "promote"
    loss = client.get_metric_history(trained.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(1, STEPS + 1))
    assert loss[-1].value < loss[0].value
    assert {"learning_rate", "tokens_per_second", "train_tokens_per_second", "eval_loss"} <= set(
        run.data.metrics
    )
    metric = run.data.metrics["eval.tasks.challenger.success_rate"]
    assert metric == pytest.approx(tasks.challenger.success_rate)
    inputs = run.inputs.dataset_inputs
    card = json.loads((dataset / "card.json").read_text())
    assert [i.dataset.digest for i in inputs] == [card["content_hash"][:36]]
    artifacts = artifact_paths(client, trained.run_id)
    assert {
        "plots/loss_curve.png",
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "dataset/card.json",
        "spanmill-train.json",
        "evaluation/report.html",
        "evaluation/report.png",
        "evaluation/metrics.json",
        "evaluation/outcomes.jsonl",
    } <= artifacts
