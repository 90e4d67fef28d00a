"""Resuming, DPO and weighted SFT on a tiny model, tracked by a real MLflow server."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from transformers import TrainerCallback

from spanmill.config import MLflowSettings
from spanmill.contracts import DatasetCard, TrainManifest
from spanmill.dataset.layout import CARD_FILE, EVAL_FILE, TRAIN_FILE
from spanmill.train import CheckpointMismatchError, TrainSettings, train
from spanmill.train.errors import TrainError
from spanmill.train.trainer import CHECKPOINTS_DIRNAME, MANIFEST_FILE, RUN_STATE_FILE

pytestmark = pytest.mark.services


class Interrupted(Exception):
    """Stands in for a preempted node or a killed pod."""


class InterruptAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise Interrupted(f"interrupted before step {self.step + 1}")


class FirstStep(TrainerCallback):
    def __init__(self) -> None:
        self.global_step: int | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.global_step is None:
            self.global_step = state.global_step


def tiny_settings(model: Path, tracking_uri: str, **overrides: Any) -> TrainSettings:
    values: dict[str, Any] = {
        "base_model": str(model),
        "max_steps": 6,
        "batch_size": 4,
        "save_steps": 2,
        "lora_r": 4,
        "lora_alpha": 8,
        "experiment": "test-train-plumbing",
        "mlflow": MLflowSettings(tracking_uri=tracking_uri),
        **overrides,
    }
    return TrainSettings(**values)


def test_an_interrupted_run_resumes_from_its_last_checkpoint(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path, mlflow_server: Any
) -> None:
    settings = tiny_settings(tiny_model_dir, mlflow_server.tracking_uri)
    out = tmp_path / "adapter"
    with pytest.raises(Interrupted):
        train(small_dataset, out, settings, callbacks=[InterruptAt(3)])
    checkpoints = out / CHECKPOINTS_DIRNAME
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-2"]
    run_id = json.loads((checkpoints / RUN_STATE_FILE).read_text())["run_id"]
    client = MlflowClient(mlflow_server.tracking_uri)
    assert client.get_run(run_id).info.status == "FAILED"

    # Other settings would silently mix two runs' weights: refused before loading anything.
    with pytest.raises(CheckpointMismatchError, match="other settings"):
        train(small_dataset, out, settings.model_copy(update={"lora_r": 8}))

    first = FirstStep()
    result = train(small_dataset, out, settings, callbacks=[first])
    print(f"\nresumed from step {result.resumed_from_step}, finished at {result.global_step}")
    assert result.resumed_from_step == 2
    assert first.global_step == 2
    assert result.global_step == 6
    assert result.run_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    loss_steps = {m.step for m in client.get_metric_history(run_id, "loss")}
    assert loss_steps == {1, 2, 3, 4, 5, 6}
    assert not checkpoints.exists()
    assert (out / "adapter_model.safetensors").is_file()
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["global_step"] == 6
    assert manifest["run_id"] == run_id
    # The manifest carries the dataset's card whole: the registry reads nothing else.
    card = TrainManifest.read(out).dataset_card
    assert card is not None and card == DatasetCard.read(small_dataset)
    assert card.content_hash == manifest["dataset_digest"]

    # Training again into the same folder: the finished run's manifest goes first, so
    # what a failed run leaves there is not taken for that run's adapter.
    with pytest.raises(Interrupted):
        train(small_dataset, out, settings.model_copy(update={"lora_r": 8}),
              callbacks=[InterruptAt(1)])  # fmt: skip
    assert not (out / MANIFEST_FILE).exists()


def preference_dataset(sft_dataset: Path, folder: Path) -> Path:
    """The reference answers as chosen, a wrong number as rejected."""
    folder.mkdir()
    for name in (TRAIN_FILE, EVAL_FILE):
        rows = []
        for row in pq.read_table(sft_dataset / name).to_pylist():
            wrong = [{"role": "assistant", "content": "I think it is 7."}]
            rows.append(
                {
                    "prompt": row["prompt"],
                    "chosen": row["completion"],
                    "rejected": wrong,
                    "chosen_reward": 1.0,
                    "rejected_reward": 0.0,
                    "task_id": row["task_id"],
                    "agent": row["agent"],
                }
            )
        pq.write_table(pa.Table.from_pylist(rows), folder / name)
    (folder / CARD_FILE).write_text(json.dumps({"mode": "preference", "name": "pairs"}))
    return folder


def test_dpo_trains_an_adapter_on_preference_pairs(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path, mlflow_server: Any
) -> None:
    pairs = preference_dataset(small_dataset, tmp_path / "pairs")
    settings = tiny_settings(tiny_model_dir, mlflow_server.tracking_uri, max_steps=2)
    result = train(pairs, tmp_path / "dpo", settings)
    assert result.method == "dpo"
    assert result.global_step == 2
    assert (tmp_path / "dpo" / "adapter_config.json").is_file()
    run = MlflowClient(mlflow_server.tracking_uri).get_run(result.run_id or "")
    assert run.data.params["method"] == "dpo"
    assert "loss" in run.data.metrics


def test_varying_weights_train_a_weighted_loss(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path, mlflow_server: Any
) -> None:
    folder = tmp_path / "weighted"
    folder.mkdir()
    for name in (TRAIN_FILE, EVAL_FILE):
        rows = pq.read_table(small_dataset / name).to_pylist()
        for index, row in enumerate(rows):
            row["weight"] = [0.0, 0.5, 1.0][index % 3]
        pq.write_table(pa.Table.from_pylist(rows), folder / name)
    settings = tiny_settings(tiny_model_dir, mlflow_server.tracking_uri, max_steps=2)
    result = train(folder, tmp_path / "out", settings)
    assert result.global_step == 2
    assert result.metrics["train_loss"] > 0
    assert "eval_loss" in result.metrics
    run = MlflowClient(mlflow_server.tracking_uri).get_run(result.run_id or "")
    assert run.data.params["sample_weights_applied"] == "True"


def test_a_loss_that_is_not_a_number_stops_the_run_without_an_adapter(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    """A base model with an overflowed weight (as half precision can make): the first
    step's loss is not a number. Hugging Face's Trainer leaves such steps out of the
    loss it logs and goes on training a broken model; the run must stop instead."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    broken = tmp_path / "broken-base"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.fill_(math.inf)
    model.save_pretrained(broken)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(broken)
    settings = TrainSettings(base_model=str(broken), max_steps=3, batch_size=4, lora_r=4,
                             lora_alpha=8, logging_steps=1, track=False)  # fmt: skip
    out = tmp_path / "adapter"
    with pytest.raises(TrainError, match=r"training loss at step 1 is nan; the run stops"):
        train(small_dataset, out, settings)
    assert not (out / MANIFEST_FILE).exists()
    assert not (out / "adapter_model.safetensors").exists()
