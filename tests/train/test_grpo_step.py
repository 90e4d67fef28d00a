"""What a GRPO step refuses to train on: no finished episode, a loss that is not a number."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_an_episode_that_raises_or_hangs_is_a_failed_episode_not_the_end_of_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The episodes are the agent's own code: a tool's or a verifier's bug raised out of
    the run (after waiting for every other episode), and one that never returned held
    the GPU idle for good. Now each is that episode's error; the others stand."""
    import threading

    from spanmill.train import rollouts

    release = threading.Event()
    task = get_task("calculator")
    instances = task.instances("train", 3, seed=1)

    def episode(client: object, model: str, task: object, instance: object, **_: object) -> Any:
        if instance is instances[1]:
            raise ValueError("the verifier gave NaN")
        if instance is instances[2]:
            release.wait(60)  # a tool that never returns (until the test ends)
        return EpisodeResult(instance, f"e-{instance.id}", "t", [], None)  # type: ignore[arg-type]

    monkeypatch.setattr(rollouts, "run_episode", episode)
    try:
        results = rollouts.run_groups(
            None, "calc", task, instances, 2,  # type: ignore[arg-type]
            temperature=1.0, max_tokens=8, concurrency=6, timeout_s=1.0,
        )  # fmt: skip
    finally:
        release.set()
    assert [r.error is None for r in results] == [True, True, False, False, False, False]
    assert results[2].error == "ValueError: the verifier gave NaN"
    assert results[4].error == "TimeoutError: the episode had not ended after 1 s"
    assert episodes_finished(1, results) == results[:2]


def test_an_episode_that_never_returns_does_not_keep_the_process_alive() -> None:
    """The run ends with that episode counted as failed; then the process exits (the
    executor it ran on before was joined at exit, and the training pod ran on, idle)."""
    code = (
        "import threading\n"
        "from concurrent.futures import wait\n"
        "from spanmill.daemons import on_daemon_threads\n"
        "never = threading.Event()\n"
        "futures = on_daemon_threads(lambda item: never.wait() if item else item, [0, 1], 2)\n"
        "done, late = wait(futures, timeout=1)\n"
        "print(len(done), len(late))\n"
    )
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.split() == ["1", "1"]


@pytest.mark.parametrize(
    ("environment", "settings", "message"),
    [
        ({"WORLD_SIZE": "4"}, {}, "one process on one GPU"),
        ({}, {"precision": "fp16"}, "does not train in fp16"),
    ],
)
def test_grpo_refuses_what_it_cannot_train_before_any_rollout(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    settings: dict[str, Any],
    message: str,
) -> None:
    """Under torchrun, every rank ran rollouts of its own on the first GPU with no
    gradient shared, all writing one folder; fp16 weights trained with no loss scaling."""
    from spanmill.config import KafkaSettings
    from spanmill.train.rl import train_grpo

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    asked = TrainSettings(track=False, task="calculator", **settings)
    with pytest.raises(TrainError, match=message):
        train_grpo(tmp_path / "out", asked, KafkaSettings())
    assert not (tmp_path / "out").exists()


def test_the_policy_takes_no_call_while_its_weights_change() -> None:
    """A call that came late (an episode left behind by the step's deadline) got a forward
    pass on the weights the trainer was changing; now it is refused at once."""
    import asyncio

    from spanmill.gateway.upstream import UpstreamError
    from spanmill.serving.protocol import GenerationParams
    from spanmill.train.policy import PolicyServer

    class Untouched:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the held policy's {name} was used")

    policy = PolicyServer.__new__(PolicyServer)
    policy._held = True
    policy.generator = policy.batcher = Untouched()
    with pytest.raises(UpstreamError, match="being updated") as refused:
        asyncio.run(policy.generate(None, [], GenerationParams(), None))  # type: ignore[arg-type]
    assert refused.value.status == 503


def test_mlflow_gone_mid_run_costs_metrics_never_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's MLflow stops answering after it began: a step's metrics raised out of
    the training loop (GRPO's before its checkpoint, SFT's through the Trainer's
    callback), and the failed run's status then hid the run's own error."""
    from spanmill.stack.ports import free_port
    from spanmill.train.tracking import RunTracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    tracker = RunTracker(f"http://127.0.0.1:{free_port()}", "0" * 32)
    manifest = tmp_path / "spanmill-train.json"
    manifest.write_text("{}")
    tracker.log_metrics({"loss": 0.5}, 3)
    tracker.log_artifact(manifest)
    tracker.finish("FAILED")
    said = [r.getMessage() for r in caplog.records if r.name == "spanmill.train.tracking"]
    assert len(said) == 3 and all(m.startswith("MLflow did not take") for m in said), said
    assert any("step 3's metrics" in m for m in said), said


def test_a_step_never_waits_for_a_quiet_mlflow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """MLflow takes the connection and does not answer: a step's metrics leave from
    MLflow's own logging thread, so the step goes on; the run's end says what was lost."""
    import socket
    import threading

    from spanmill.train.tracking import RunTracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    tracker = RunTracker(f"http://127.0.0.1:{silent.getsockname()[1]}", "0" * 32)
    try:
        step = threading.Thread(target=tracker.log_metrics, args=({"loss": 0.5}, 3))
        step.start()
        step.join(30)  # sent by the step itself, it would wait out the 120 s
        assert not step.is_alive()
    finally:
        silent.close()  # MLflow goes: what waited for it fails
    tracker.finish("FAILED")
    said = [r.getMessage() for r in caplog.records if r.name == "spanmill.train.tracking"]
    assert any("step 3's metrics" in m for m in said), said


def test_an_init_adapter_trained_on_another_base_is_refused(tmp_path: Path) -> None:
    """PEFT loads an adapter onto any base of its shape without a word (the base model
    and its instruct tune, say), and the run's manifest then paired it with a base it
    never learnt on, for the evaluation and for serving."""
    from spanmill.config import KafkaSettings
    from spanmill.contracts import TrainManifest
    from spanmill.train.rl import train_grpo

    adapter = tmp_path / "sft"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    TrainManifest(
        output_dir=str(adapter), base_model="/pod/models/base", method="sft", global_step=9,
        dataset_digest="d", settings={"base_model": "HuggingFaceTB/SmolLM2-135M"},
    ).write(adapter)  # fmt: skip
    asked = TrainSettings(
        track=False, task="calculator", init_adapter=str(adapter),
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    )  # fmt: skip
    with pytest.raises(TrainError, match="was trained on HuggingFaceTB/SmolLM2-135M, and this"):
        train_grpo(tmp_path / "out", asked, KafkaSettings())
    assert not (tmp_path / "out").exists()
