"""``spanmill models list/show/promote/rollback/register`` against a real MLflow server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanmill.cli.main import app
from spanmill.registry import CHALLENGER, CHAMPION, Lineage, ModelRegistry

pytestmark = pytest.mark.services
runner = CliRunner()


def test_people_list_show_promote_and_roll_back(mlflow_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    uri = ["--tracking-uri", mlflow_server.tracking_uri]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = f"cli-{uuid.uuid4().hex[:6]}"
    v1 = registry.register(agent, Lineage(kind="echo")).version

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"decision": {"promote": True, "reasons": ["better"]},
                                   "metrics": {"tasks.challenger.success_rate": 0.7}}))  # fmt: skip
    result = runner.invoke(app, ["models", "register", agent, str(adapter), "--metrics",
                                 str(metrics), "--base-model", "smollm2-135m", *uri])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "is the challenger" in result.output
    v2 = int(result.output.strip().splitlines()[-1])

    result = runner.invoke(app, ["models", "promote", agent, str(v1), *uri])
    assert result.exit_code == 0 and f"version {v1} is the champion" in result.output
    result = runner.invoke(app, ["models", "list", *uri])
    assert result.exit_code == 0 and agent in result.output
    result = runner.invoke(app, ["models", "list", agent, *uri], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (
        "challenger" in result.output and "champion" in result.output and "adapter" in result.output
    )
    result = runner.invoke(app, ["models", "show", agent, str(v2), *uri], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "spanmill.gate.decision" in result.output and "smollm2-135m" in result.output

    result = runner.invoke(app, ["models", "rollback", agent, "--reason", "wrong answers", *uri])
    assert result.exit_code == 0, result.output
    assert registry.aliases(agent) == {CHAMPION: v1}
    assert registry.version(agent, v2).rolled_back

    result = runner.invoke(app, ["models", "promote", agent, str(v2), "--canary", *uri])
    assert result.exit_code == 0 and registry.aliases(agent)[CHALLENGER] == v2

    result = runner.invoke(app, ["models", "show", agent, "99", *uri])
    assert result.exit_code == 1 and "error:" in result.output


def test_register_refuses_another_models_metrics(mlflow_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from test_registry import trained_folder

    agent = f"cli-{uuid.uuid4().hex[:6]}"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    trained_folder(tmp_path / "a", agent=agent, run_id="train-a")
    adapter_b, _ = trained_folder(tmp_path / "b", agent=agent, run_id="train-b")
    metrics_a = tmp_path / "a" / "metrics.json"
    result = runner.invoke(
        app,
        ["models", "register", agent, str(adapter_b), "--metrics", str(metrics_a),
         "--tracking-uri", mlflow_server.tracking_uri],
        env={"COLUMNS": "400"},
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "training run train-a" in result.output and "training run train-b" in result.output
    assert agent not in ModelRegistry(mlflow_server.tracking_uri).agents()
