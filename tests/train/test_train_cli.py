"""``spanmill train`` and ``spanmill evaluate`` end to end on a tiny model.

Evaluation answers through the real tritonserver and looks the champion up in
the real MLflow server (there is none: the base model is staged beside the
challenger); tracking runs in MLflow are off.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanmill.cli.main import app


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("SPANMILL_TRAIN_TRACK", "false")
    monkeypatch.setenv("SPANMILL_EVAL_TRACK", "false")
    monkeypatch.setenv("SPANMILL_EVAL_MAX_NEW_TOKENS", "8")
    return CliRunner()


@pytest.mark.services
def test_train_then_evaluate_from_the_command_line(  # type: ignore[no-untyped-def]
    runner: CliRunner,
    tmp_path: Path,
    small_dataset: Path,
    tiny_model_dir: Path,
    mlflow_server,
    triton,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPANMILL_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    monkeypatch.setenv("SPANMILL_TRITON_HTTP_URL", triton.http_url)
    monkeypatch.setenv("SPANMILL_TRITON_MODEL_REPOSITORY", str(triton.model_repository))
    adapter = tmp_path / "adapter"
    metrics = tmp_path / "train-metrics.json"
    trained = runner.invoke(
        app,
        [
            "train",
            str(small_dataset),
            str(adapter),
            "--base-model",
            str(tiny_model_dir),
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--lora-r",
            "4",
            "--metrics-json",
            str(metrics),
        ],
    )
    assert trained.exit_code == 0, trained.output
    assert "adapter in" in trained.output
    assert json.loads(metrics.read_text())["global_step"] == 2.0

    # An agent no other test registers: the session's MLflow may hold a champion of the
    # dataset's own agent (calculator), and this compares with the base model.
    agent = f"calc-{uuid.uuid4().hex[:6]}"
    evaluated = runner.invoke(
        app,
        [
            "evaluate",
            str(small_dataset),
            str(adapter),
            str(tmp_path / "evaluation"),
            "--agent",
            agent,
            "--task",
            "calculator",
            "--instances",
            "3",
            "--replay-items",
            "2",
            "--fail-on-reject",
        ],
    )
    # A random model learns nothing: a tie with the base model, which the gate rejects.
    assert evaluated.exit_code == 3, evaluated.output
    assert "gate: reject" in evaluated.output
    result = json.loads((tmp_path / "evaluation" / "metrics.json").read_text())
    assert result["decision"]["verdict"] == "reject"
    assert result["metrics"]["tasks.challenger.n"] == 3
    assert result["metrics"]["replay.challenger.n"] == 2
    assert f"Triton {agent}.candidate version" in result["models"]["challenger"]["served"]
    assert (tmp_path / "evaluation" / "report.html").read_text().startswith("<!doctype html>")


def test_bad_settings_are_named(runner: CliRunner, tmp_path: Path, small_dataset: Path) -> None:
    bad = runner.invoke(
        app, ["train", str(small_dataset), str(tmp_path / "a"), "--precision", "fp8"]
    )
    assert bad.exit_code == 1
    assert "SPANMILL_TRAIN_PRECISION" in " ".join(bad.output.split())
    missing = runner.invoke(
        app, ["train", str(tmp_path / "nowhere"), str(tmp_path / "a"), "--steps", "1"]
    )
    assert missing.exit_code == 1
    assert "does not exist" in " ".join(missing.output.split())
