"""What a GRPO step refuses to train on: no finished episode, a loss that is not a number."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spanmill.tasks import get_task
from spanmill.tasks.runner import EpisodeResult
from spanmill.train.errors import TrainError
from spanmill.train.rl import Row, episodes_finished, grpo_step
from spanmill.train.settings import TrainSettings


def _result(error: str | None) -> EpisodeResult:
    instance = get_task("calculator").instances("train", 1, seed=1)[0]
    return EpisodeResult(instance, "e", "t", [], None, error=error)


def test_a_step_whose_episodes_all_failed_is_an_error_not_a_step() -> None:
    failed = [_result("APIConnectionError: refused")] * 3 + [_result("Timeout")]
    with pytest.raises(TrainError, match=r"all 4 episodes failed.*refused \(3x\).*Timeout \(1x\)"):
        episodes_finished(5, failed)
    mixed = [_result("Timeout"), _result(None)]
    assert episodes_finished(5, mixed) == [mixed[1]]


def test_a_loss_that_is_not_a_number_changes_no_weight(tiny_model_dir: Path) -> None:
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from spanmill.train.trainer import lora_config

    settings = TrainSettings(track=False, lora_r=4, lora_alpha=8, batch_size=2)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora_config(settings)
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    before = [p.detach().clone() for p in trainable]
    rows = [
        Row([1, 5, 6], [7, 8], [-1.0, -1.0], -1.0),
        Row([1, 5, 9], [7, 3], [-1.0, -1.0], 1.0),
    ]
    # A frozen weight overflowed (as half precision can): the model's logits are not
    # numbers, and so neither are the loss and every LoRA gradient.
    frozen = next(p for p in model.parameters() if not p.requires_grad and p.dim() == 2)
    kept = frozen.detach().clone()
    with torch.no_grad():
        frozen.fill_(math.inf)
    with pytest.raises(TrainError, match="not finite; nothing was applied"):
        grpo_step(model, optimizer, rows, settings, pad_id=2)
    assert all(torch.equal(a, b) for a, b in zip(before, trainable, strict=True))

    # The same rows on the mended model train.
    with torch.no_grad():
        frozen.copy_(kept)
    stats = grpo_step(model, optimizer, rows, settings, pad_id=2)
    assert math.isfinite(stats["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, trainable, strict=True))


def test_a_run_does_not_resume_on_an_init_adapter_trained_again(tmp_path: Path) -> None:
    """Checkpoints grew from the init adapter's weights as they were: the same folder
    holding another adapter (the SFT step run again into it) is another run."""
    import json

    from spanmill.train.errors import CheckpointMismatchError
    from spanmill.train.rl import STATE_FILE, STEP_PREFIX, _adapter_digest, _resume_point
    from spanmill.train.trainer import RUN_STATE_FILE, begin_run

    adapter = tmp_path / "sft"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "adapter_model.safetensors").write_bytes(b"first weights")
    settings = TrainSettings(track=False, task="calculator", init_adapter=str(adapter))
    checkpoints = tmp_path / "out" / "checkpoints"
    begin_run(tmp_path / "out", checkpoints, resuming=False, state={
        "fingerprint": settings.training_fingerprint(),
        "init_adapter": _adapter_digest(settings.init_adapter),
        "run_id": "r1",
    })  # fmt: skip
    (checkpoints / f"{STEP_PREFIX}2").mkdir()
    (checkpoints / f"{STEP_PREFIX}2" / STATE_FILE).write_text(json.dumps({"step": 2}))
    assert _resume_point(checkpoints, settings) == (checkpoints / f"{STEP_PREFIX}2", "r1")

    (adapter / "adapter_model.safetensors").write_bytes(b"weights trained again")
    with pytest.raises(CheckpointMismatchError, match="started from other weights"):
        _resume_point(checkpoints, settings)
    assert json.loads((checkpoints / RUN_STATE_FILE).read_text())["run_id"] == "r1"
