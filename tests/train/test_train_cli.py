"""``spanmill train`` and ``spanmill evaluate`` end to end on a tiny model, MLflow off."""

from __future__ import annotations

import json
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


def test_train_then_evaluate_from_the_command_line(
    runner: CliRunner, tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
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

    evaluated = runner.invoke(
        app,
        [
            "evaluate",
            str(small_dataset),
            str(adapter),
            str(tmp_path / "evaluation"),
            "--instances",
            "3",
            "--samples",
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
