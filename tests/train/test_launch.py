"""One training process per GPU: the decision, the command line, and a real two-process run.

CI has no GPU, so the decision is tested as the pure function it is, over the GPU
count torch would report; the two-process run is real, on the CPU with gloo.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from spanmill.train import TrainError, TrainSettings, train
from spanmill.train.launch import (
    LaunchPlan,
    child_env,
    launch,
    plan_processes,
    settings_env,
    torchrun_command,
)
from spanmill.train.trainer import CHECKPOINTS_DIRNAME, MANIFEST_FILE


@pytest.mark.parametrize(
    ("gpus", "visible", "processes", "devices", "in_process"),
    [
        (0, 0, 1, None, True),  # the CPU, on a machine without GPUs
        (0, 2, 1, (), False),  # the CPU, with the machine's GPUs hidden
        (1, 1, 1, None, True),  # the single-GPU pod: no launcher needed
        (4, 4, 4, None, False),  # every GPU of the node, one process each
        (8, 8, 8, None, False),
        (2, 8, 2, (0, 1), False),  # fewer than the machine has: the first ones
        (1, 4, 1, (0,), False),  # one of several: the Trainer would take them all
    ],
)
def test_one_process_per_gpu_asked_for(
    gpus: int, visible: int, processes: int, devices: tuple[int, ...] | None, in_process: bool
) -> None:
    plan = plan_processes(gpus, visible)
    assert (plan.processes, plan.devices, plan.in_process) == (processes, devices, in_process)
    assert plan.note == ""


def test_gpus_asked_for_but_none_visible_train_on_the_cpu_with_a_warning() -> None:
    plan = plan_processes(2, 0)
    assert (plan.processes, plan.in_process) == (1, True)
    assert "sees none" in plan.note and "CPU" in plan.note


def test_fewer_gpus_than_asked_for_is_an_error() -> None:
    with pytest.raises(TrainError, match="asked for 4 GPUs, but this machine has 2"):
        plan_processes(4, 2)
    with pytest.raises(TrainError, match="gpus must be 0"):
        plan_processes(-1, 0)


def test_the_command_line_for_n_gpus() -> None:
    command = torchrun_command(Path("/data/ds"), Path("/out/model"), 8)
    assert command == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
        "-m", "spanmill.train.worker", "/data/ds", "/out/model",
    ]  # fmt: skip
    # A TrainJob node: torchrun reads nodes, rank and processes from the PET_* environment.
    node = torchrun_command(Path("/d"), Path("/o"), None)
    assert node == [sys.executable, "-m", "torch.distributed.run", "-m",
                    "spanmill.train.worker", "/d", "/o"]  # fmt: skip


def test_each_process_loads_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = TrainSettings(
        base_model="/models/base", lora_r=32, max_steps=7, target_modules=["q_proj", "v_proj"],
        packing=True, learning_rate=1e-4, run_name=None, mlflow={"tracking_uri": "http://ml:5000"},
    )  # fmt: skip
    # A setting of the parent that the run leaves unset must not leak into the processes.
    parent = {"SPANMILL_TRAIN_RUN_NAME": "other", "CUDA_VISIBLE_DEVICES": "3,5,7", "PATH": "/bin"}
    env = child_env(settings, (0, 1), parent)
    assert "SPANMILL_TRAIN_RUN_NAME" not in env
    assert env["SPANMILL_TRAIN_LORA_R"] == "32" and env["SPANMILL_TRAIN_PACKING"] == "True"
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5" and env["PATH"] == "/bin"
    assert child_env(settings, (), parent)["CUDA_VISIBLE_DEVICES"] == ""
    assert child_env(settings, None, parent)["CUDA_VISIBLE_DEVICES"] == "3,5,7"
    assert child_env(settings, (0, 1), {})["CUDA_VISIBLE_DEVICES"] == "0,1"

    for key in [k for k in os.environ if k.startswith("SPANMILL_")]:
        monkeypatch.delenv(key)
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    assert TrainSettings() == settings


def _tiny(model: Path, **overrides: Any) -> TrainSettings:
    values: dict[str, Any] = {
        "base_model": str(model),
        "max_steps": 3,
        "batch_size": 2,
        "max_length": 512,
        "lora_r": 4,
        "lora_alpha": 8,
        "save_steps": 3,
        "keep_checkpoints": True,
        "track": False,
        **overrides,
    }
    return TrainSettings(**values)


def _epoch(output: Path) -> float:
    state = output / CHECKPOINTS_DIRNAME / "checkpoint-3" / "trainer_state.json"
    return float(json.loads(state.read_text())["epoch"])


def test_two_processes_train_one_adapter_with_the_single_process_metrics(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    settings = _tiny(tiny_model_dir)
    single = train(small_dataset, tmp_path / "single", settings)

    out = tmp_path / "two"
    two = launch(small_dataset, out, settings, LaunchPlan(2, (), in_process=False))

    # Rank 0's result, read back: the same figures a single process returns.
    assert set(two.metrics) == set(single.metrics)
    assert two.global_step == single.global_step == 3
    assert two.output_dir == out and two.method == single.method == "sft"
    assert two.dataset_digest == single.dataset_digest
    # Two ranks, each with its own batches: twice the samples per step, so twice the epoch.
    assert _epoch(out) == pytest.approx(2 * _epoch(tmp_path / "single"))
    # One adapter, one manifest, one checkpoint series: rank 0 wrote them.
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("adapter", "spanmill"))) == [
        "adapter_config.json", "adapter_model.safetensors", MANIFEST_FILE,
    ]  # fmt: skip
    assert [p.name for p in (out / CHECKPOINTS_DIRNAME).glob("checkpoint-*")] == ["checkpoint-3"]
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["global_step"] == 3 and set(manifest["metrics"]) == set(single.metrics)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    PeftModel.from_pretrained(base, out)
