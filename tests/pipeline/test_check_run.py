"""The run's parameters checked together first: a run that cannot work fails in seconds,
not after its dataset build (spanmill.pipeline.steps.check_run_step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spanmill.errors import ConfigError
from spanmill.pipeline.build import DEFAULT_PACKAGE, run_local
from spanmill.pipeline.steps import check_run_step


def test_parameters_that_work_together_pass() -> None:
    assert check_run_step() == "sft on a sft dataset, trained on 1 GPU(s)"
    assert check_run_step(dataset_mode="preference", train_method="dpo", trainer="trainjob",
                          gpus=0) == ("dpo on a preference dataset, trained on a TrainJob of "
                                      "2 node(s)")  # fmt: skip
    # GRPO alone samples its own episodes: the dataset (for evaluation) may be any mode, and
    # the supervised trainer's settings do not apply.
    assert check_run_step(dataset_mode="rl", train_method="grpo", trainer="trainjob", gpus=1)


def test_every_problem_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_SERVING_FLAVOUR", "vllm")
    monkeypatch.setenv("SPANMILL_SERVING_VLLM_MAX_LORA_RANK", "32")
    with pytest.raises(ConfigError) as refused:
        check_run_step(dataset_mode="sft", train_method="dpo", trainer="trainjob", gpus=1,
                       lora_r=64)  # fmt: skip
    message = str(refused.value)
    assert "train_method dpo trains on a preference dataset, and dataset_mode is 'sft'" in message
    assert "set gpus to 0" in message
    assert "lora_r 64 is above the vLLM engine's max_lora_rank 32" in message
    with pytest.raises(ConfigError, match="train_method must be one of sft, dpo, grpo, sft\\+grpo"):
        check_run_step(train_method="ppo")
    with pytest.raises(ConfigError, match="trainer must be pod or trainjob, not 'slurm'"):
        check_run_step(trainer="slurm")


def test_the_check_is_the_flywheels_first_step() -> None:
    spec, _ = yaml.safe_load_all(DEFAULT_PACKAGE.read_text())
    root = spec["root"]["dag"]["tasks"]
    assert "dependentTasks" not in root["check-run"]
    # Every other task of the run waits for it (the training branches, GRPO's included,
    # through the group that holds them).
    others = {name: task for name, task in root.items() if name != "check-run"}
    assert "build-dataset" in others and any(name.startswith("condition") for name in others)
    for name, task in others.items():
        assert "check-run" in task.get("dependentTasks", []), name


def test_a_run_that_cannot_work_fails_in_the_check_before_any_dataset(tmp_path: Path) -> None:
    # Through kfp's local runner, as `spanmill pipeline run` runs the compiled package.
    with pytest.raises(RuntimeError, match=r"Inner task failed: .*check-run"):
        run_local(tmp_path, agent="calculator", dataset_mode="sft", train_method="dpo")
    assert not list(tmp_path.rglob("build-dataset"))
