"""Every spanmill entry point bounds its MLflow calls (spanmill.registry.bounds)."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from spanmill.registry.bounds import bounded, request_env

NAMES = tuple(request_env(1, 1))


@pytest.fixture
def unbounded(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in NAMES:
        # Set first, so that what the test leaves is undone (a variable absent at the
        # start is recorded only by a set).
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    return monkeypatch


def test_a_pipeline_step_bounds_mlflow_where_the_operator_did_not(
    unbounded: pytest.MonkeyPatch,
) -> None:
    from spanmill.pipeline.steps import _mlflow

    unbounded.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "9")  # the operator's own
    unbounded.setenv("SPANMILL_MLFLOW_REQUEST_TIMEOUT_S", "45")
    _mlflow("http://mlflow.example:5000")
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "45"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "9"


def test_every_cli_command_bounds_mlflow(unbounded: pytest.MonkeyPatch) -> None:
    from spanmill.cli.main import app

    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0, result.output
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "120"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"


def test_the_controllers_bounds_hold_for_its_block_only(unbounded: pytest.MonkeyPatch) -> None:
    unbounded.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    with bounded(10, 1):
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "10"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
