"""Registration with lineage, aliases, promotion and rollback, against a real MLflow server."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from spanmill.contracts import ContractError, DatasetCard, EvalReport, SpanWindow, TrainManifest
from spanmill.registry import CHALLENGER, CHAMPION, Lineage, ModelRegistry, RegistryError, names
from spanmill.registry.lineage import lineage_from_outputs

pytestmark = pytest.mark.services


def agent_name() -> str:
    return f"calc-{uuid.uuid4().hex[:8]}"


def trained_folder(
    tmp_path: Path,
    *,
    promote: bool | None = True,
    agent: str = "",
    run_id: str | None = "train-run-1",
) -> tuple[Path, EvalReport | None]:
    """What training and evaluation hand the registry (weights are placeholders): the
    adapter folder with its manifest, which carries the dataset's card, and the report.

    With ``agent``, the report names what it evaluated as the evaluation writes it (its
    task and its challenger); without, it is a hand-written report that names neither."""
    card = DatasetCard(
        name="calc-spans",
        span_window=SpanWindow(
            first_span="2025-06-01T00:00:00+00:00", last_span="2025-06-02T00:00:00+00:00"
        ),
    )
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "x"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    TrainManifest(
        output_dir="/pod/out", base_model="/pod/cache/smollm2", method="sft", global_step=9,
        dataset="/pod/dataset",  # a path in the training pod: the registry never opens it
        dataset_digest="d" * 64, dataset_card=card, run_id=run_id,
        settings={"base_model": "smollm2-135m", "lora_r": 16, "learning_rate": 0.0003},
    ).write(adapter)  # fmt: skip
    if promote is None:
        return adapter, None
    evaluated: dict[str, object] = {}
    if agent:
        evaluated = {"task": agent, "models": {
            "champion": {"label": "champion", "base": "smollm2-135m", "served": "triton"},
            "challenger": {"label": adapter.name, "base": "smollm2-135m",
                           "adapter": str(adapter), "run_id": run_id, "served": "triton"},
        }}  # fmt: skip
    (tmp_path / "metrics.json").write_text(json.dumps({
        **evaluated,
        "decision": {"promote": promote, "verdict": "promote" if promote else "reject",
                     "reasons": ["success_rate better by 0.200"] if promote
                     else ["success_rate 0.1 is below the champion's 0.2"]},
        "metrics": {"tasks.challenger.success_rate": 0.6, "tasks.champion.success_rate": 0.4,
                    "gate.promote": float(promote), "tasks.difference_low": float("nan")},
        "run_id": "eval-run-1",
    }))  # fmt: skip
    return adapter, EvalReport.read(tmp_path)


def test_lineage_is_read_from_training_and_evaluation_outputs(tmp_path: Path) -> None:
    adapter, metrics = trained_folder(tmp_path)
    lineage = lineage_from_outputs(adapter, metrics, pipeline_run_id="pipe-7")
    assert lineage.kind == "adapter" and lineage.base_model == "smollm2-135m"
    assert lineage.dataset_name == "calc-spans"
    assert "tasks.difference_low" not in lineage.eval_metrics  # NaN is not a tag
    assert lineage.span_window == "2025-06-01T00:00:00+00:00/2025-06-02T00:00:00+00:00"
    assert lineage.gate_passed and lineage.eval_metrics["tasks.challenger.success_rate"] == 0.6
    tags = lineage.tags()
    assert tags[names.TAG_DATASET_DIGEST] == "d" * 64
    assert tags[names.TAG_TRAIN_RUN] == "train-run-1"
    assert tags[names.TAG_PIPELINE_RUN] == "pipe-7"
    assert tags[names.TAG_GATE] == "promote"
    assert json.loads(tags[names.TAG_TRAIN_SETTINGS])["lora_r"] == 16
    assert Lineage.from_tags(tags) == lineage
    with pytest.raises(RegistryError, match="neither a LoRA adapter"):
        lineage_from_outputs(tmp_path)
    (tmp_path / "bad.json").write_text('{"metrics": {}}')
    with pytest.raises(ContractError, match=r"bad.json: decision: Field required"):
        EvalReport.load(tmp_path / "bad.json")
    (adapter / TrainManifest.FILE).write_text('{"method": "sft"}')
    with pytest.raises(ContractError, match=r"training manifest .*: output_dir: Field required"):
        lineage_from_outputs(adapter)


def test_a_version_that_passed_the_gate_becomes_the_challenger(
    mlflow_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    adapter, metrics = trained_folder(tmp_path)
    first = registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-1")
    assert first.challenger and first.version.aliases == (CHALLENGER,)
    version = registry.version(agent, first.version.version)
    assert version.lineage.dataset_digest == "d" * 64
    assert version.lineage.gate_reasons == ("success_rate better by 0.200",)
    assert version.events()[-1].endswith("challenger: the gate passed")
    assert agent in registry.agents()

    downloaded = registry.download(agent, version.version, tmp_path / "download")
    assert (downloaded / "adapter_config.json").is_file()
    assert (downloaded / "adapter_model.safetensors").read_bytes() == b"\0" * 64

    rejected_dir = tmp_path / "second"
    rejected_dir.mkdir()
    adapter2, metrics2 = trained_folder(rejected_dir, promote=False)
    second = registry.register_trained(agent, adapter2, metrics2)
    assert not second.challenger and second.version.aliases == ()
    assert second.version.lineage.gate_promote is False
    unevaluated_dir = tmp_path / "third"
    unevaluated_dir.mkdir()
    adapter3, _ = trained_folder(unevaluated_dir, promote=None)
    assert not registry.register_trained(agent, adapter3).challenger
    # The challenger alias stayed on the version that passed.
    assert registry.aliases(agent) == {CHALLENGER: first.version.version}
    listed = registry.versions(agent)
    assert [v.version for v in listed] == [3, 2, 1] and listed[-1].aliases == (CHALLENGER,)


def test_promote_and_roll_back_by_hand(mlflow_server) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    v1, v2, v3 = (registry.register(agent, Lineage(kind="echo")).version for _ in range(3))
    assert registry.promote(agent, v1) is None
    assert registry.promote(agent, v2) == v1
    assert registry.champion_history(agent) == [v1]
    # A challenger in its canary is what a rollback stops first.
    registry.set_alias(agent, CHALLENGER, v3)
    assert registry.rollback(agent, reason="answers in French") == v3
    assert CHALLENGER not in registry.aliases(agent)
    stopped = registry.version(agent, v3)
    assert stopped.rolled_back and stopped.tags[names.TAG_ROLLOUT_REASON] == "answers in French"
    # With no challenger, the champion returns to the one it replaced.
    assert registry.rollback(agent) == v2
    assert registry.aliases(agent) == {CHAMPION: v1}
    assert registry.version(agent, v2).rolled_back
    with pytest.raises(RegistryError, match="no earlier champion"):
        registry.rollback(agent)


def test_a_rolled_back_challenger_is_not_desired_again(mlflow_server) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    v1, v2 = (registry.register(agent, Lineage(kind="echo")).version for _ in range(2))
    registry.promote(agent, v1)
    registry.set_alias(agent, CHALLENGER, v2)
    assert registry.desired(agent).challenger == v2
    registry.record(agent, v2, "rolled back: too slow", status=names.ROLLED_BACK)
    desired = registry.desired(agent)
    assert (desired.champion, desired.challenger) == (v1, None)
    assert CHALLENGER not in registry.aliases(agent)  # removed again
    # A controller that deployed it meanwhile records its canary, which leaves the
    # status alone: a rollback by hand is never undone by an event that came after it.
    registry.record(agent, v2, "canary: against champion version 1", status="canary")
    assert registry.version(agent, v2).rolled_back
    registry.promote(agent, v2, reason="promoted by hand")  # a person's word is the last
    assert registry.version(agent, v2).rollout_status == "promoted"


def test_errors_name_what_to_do(mlflow_server, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    with pytest.raises(RegistryError, match="agent name"):
        registry.register("bad name!", Lineage(kind="echo"))
    with pytest.raises(RegistryError, match="needs its folder"):
        registry.register(agent_name(), Lineage(kind="adapter", base_model="b"))
    with pytest.raises(RegistryError, match="needs its base model"):
        Lineage(kind="base")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    from spanmill.stack.ports import free_port

    down = ModelRegistry(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RegistryError, match=r"MLflow at http://127\.0\.0\.1"):
        down.aliases("calc")


def test_versions_that_learned_from_erased_spans_are_listed_by_lineage(
    mlflow_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    from typer.testing import CliRunner

    from spanmill.cli.main import app
    from spanmill.store.erasure import Erasure, write_erasure
    from spanmill.store.writer import open_store

    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    adapter, metrics = trained_folder(tmp_path)  # trained on 2025-06-01 to 06-02
    version = registry.register_trained(agent, adapter, metrics).version.version
    inside = (datetime(2025, 6, 1, 12, tzinfo=UTC), datetime(2025, 6, 1, 13, tzinfo=UTC))
    later = (datetime(2025, 7, 1, tzinfo=UTC), datetime(2025, 7, 2, tzinfo=UTC))
    assert (agent, version) in {(v.agent, v.version) for v in registry.learned_from(*inside)}
    assert agent not in {v.agent for v in registry.learned_from(*later)}

    store = tmp_path / "store"
    fs, root = open_store(str(store))
    for first, last in (inside, later):
        erasure = Erasure.request("user_id", "ann", requested_by="dpo")
        write_erasure(fs, root, erasure.applied(3, ["ab" * 16], first, last))
    monkeypatch.setenv("SPANMILL_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    result = CliRunner().invoke(
        app, ["store", "erasures", "--store", str(store), "--models"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    # The versions table's last cell, row by row: every version in the session's MLflow
    # whose window overlaps is listed, and a long list wraps onto lines of its own.
    cells: dict[str, str] = {}
    row = ""
    for line in result.output.splitlines():
        fields = [field.strip() for field in line.split("│")]
        if len(fields) != 6 or fields[1] == "erasure":
            continue
        row = fields[2] or row
        cells[row] = f"{cells.get(row, '')} {fields[4]}"
    assert set(cells) == {"2025-06-01 12:00", "2025-07-01 00:00"}, result.output
    assert f"{agent} v{version}," in f"{cells['2025-06-01 12:00']},", result.output
    assert f"{agent} v" not in cells["2025-07-01 00:00"], result.output


def fail_first_call(
    monkeypatch: pytest.MonkeyPatch, registry: ModelRegistry, method: str, when: str = ""
) -> list[object]:
    """Stand-in for a fault: the registry client's ``method`` fails once (on its first call
    whose arguments mention ``when``), as a dropped connection would; every other call
    reaches the real MLflow. Returns the arguments of the call that failed."""
    from mlflow.exceptions import MlflowException

    real = getattr(registry.client, method)
    failed: list[object] = []

    def once(*args: object, **kwargs: object) -> object:
        if not failed and when in repr((args, kwargs)):
            failed.append(args)
            raise MlflowException(f"staged fault in {method}")
        return real(*args, **kwargs)

    monkeypatch.setattr(registry.client, method, once)
    return failed


def test_a_retried_registration_finishes_the_version_it_made(
    mlflow_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    adapter, metrics = trained_folder(tmp_path, agent=agent)
    failed = fail_first_call(monkeypatch, registry, "set_registered_model_alias")
    with pytest.raises(RegistryError, match="staged fault"):
        registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-1")
    assert failed
    (half,) = registry.versions(agent)
    # Half registered, it does not look like a version the gate let through.
    assert names.TAG_GATE not in half.tags and half.aliases == ()
    assert half.tags[names.TAG_PIPELINE_RUN] == "pipe-1"

    retried = registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-1")
    assert [v.version for v in registry.versions(agent)] == [half.version]
    assert retried.challenger and retried.version.version == half.version
    assert retried.version.aliases == (CHALLENGER,)
    assert retried.version.tags[names.TAG_GATE] == "promote"
    assert registry.desired(agent).challenger == half.version

    # Once complete, the same run registers nothing more and writes nothing twice.
    again = registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-1")
    assert again.version.version == half.version and len(registry.versions(agent)) == 1
    events = registry.version(agent, half.version).events()
    assert [e for e in events if e.endswith("challenger: the gate passed")] == events[:1]
    # A retry whose evaluation came out otherwise is refused, not quietly ignored.
    (tmp_path / "again").mkdir()
    _, rejected = trained_folder(tmp_path / "again", agent=agent, promote=False)
    with pytest.raises(RegistryError, match="a run registers one verdict"):
        registry.register_trained(agent, adapter, rejected, pipeline_run_id="pipe-1")
    # Another pipeline run's registration is another version.
    other = registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-2")
    assert other.version.version == half.version + 1


def test_a_challenger_whose_registration_stopped_is_not_rolled_out(
    mlflow_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    adapter, metrics = trained_folder(tmp_path, agent=agent)
    fail_first_call(monkeypatch, registry, "set_model_version_tag", names.ROLLOUT_EVENT_PREFIX)
    with pytest.raises(RegistryError, match="staged fault"):
        registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-1")
    (half,) = registry.versions(agent)
    assert half.aliases == (CHALLENGER,)  # the alias moved before the fault
    assert registry.desired(agent).challenger is None
    with pytest.raises(RegistryError, match=r"registration .* did not finish"):
        registry.promote(agent, half.version)
    # Nor named the challenger by hand (spanmill models promote --canary).
    with pytest.raises(RegistryError, match=r"registration .* did not finish"):
        registry.make_challenger(agent, half.version, reason="by hand")

    registry.register_trained(agent, adapter, metrics, pipeline_run_id="pipe-1")
    assert registry.desired(agent).challenger == half.version
    assert len(registry.versions(agent)) == 1


def test_a_report_of_another_model_or_agent_is_refused(mlflow_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    adapter_a, report_a = trained_folder(tmp_path / "a", agent=agent, run_id="train-a")
    adapter_b, report_b = trained_folder(tmp_path / "b", agent=agent, run_id="train-b")
    assert report_a is not None and report_b is not None
    with pytest.raises(RegistryError) as refused:
        registry.register_trained(agent, adapter_b, report_a)
    assert "train-a" in str(refused.value) and "train-b" in str(refused.value)
    assert str(adapter_b) in str(refused.value)

    # A stale report in a reused folder: training wrote the folder again since.
    manifest = TrainManifest.read(adapter_a)
    manifest.model_copy(update={"run_id": "train-a2"}).write(adapter_a)
    with pytest.raises(RegistryError, match=r"train-a\b.*train-a2"):
        registry.register_trained(agent, adapter_a, report_a)

    # Without training run ids, the folders are compared.
    (tmp_path / "c").mkdir(), (tmp_path / "d").mkdir()
    adapter_c, report_c = trained_folder(tmp_path / "c", agent=agent, run_id=None)
    adapter_d, _ = trained_folder(tmp_path / "d", agent=agent, run_id=None)
    folders = f"{re.escape(str(adapter_c))}.*{re.escape(str(adapter_d))}"
    with pytest.raises(RegistryError, match=folders):
        registry.register_trained(agent, adapter_d, report_c)

    other = agent_name()
    with pytest.raises(RegistryError, match=f"{agent}.*{other}"):
        registry.register_trained(other, adapter_b, report_b)
    # The task the report names stands for its agent.
    sql = report_b.model_copy(update={"task": "sql"})
    with pytest.raises(
        RegistryError, match=r"task 'sql', whose agent is 'sql'.*agent 'calculator'"
    ):
        lineage_from_outputs(adapter_b, sql, agent="calculator")
    assert lineage_from_outputs(adapter_b, sql, agent="sql").gate_passed

    assert agent not in registry.agents() and other not in registry.agents()
    assert registry.register_trained(agent, adapter_b, report_b).challenger


def test_a_new_agent_gets_its_first_version_from_the_command_line(
    mlflow_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A team's own agent had no way to be served but Python (the demo's code): the
    gateway answers 404 for a model name no champion stands for. `spanmill models
    serve-base` registers the base as version 1 and makes it the champion, once."""
    from typer.testing import CliRunner

    from spanmill.cli.main import app

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    agent = f"support-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("SPANMILL_MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    runner = CliRunner()
    first = runner.invoke(app, ["models", "serve-base", agent, "--base-model", str(base)])
    assert first.exit_code == 0, first.output
    assert first.output.strip().splitlines()[-1] == "1"
    registry = ModelRegistry(mlflow_server.tracking_uri)
    assert registry.aliases(agent) == {CHAMPION: 1}
    lineage = registry.version(agent, 1).lineage
    assert (lineage.kind, lineage.base_model) == ("base", str(base))
    # Again, or with another base: the champion stands, nothing is registered.
    again = runner.invoke(app, ["models", "serve-base", agent, "--base-model", str(base)])
    assert again.exit_code == 0 and "has a champion already" in again.output
    assert [v.version for v in registry.versions(agent)] == [1]
    missing = runner.invoke(app, ["models", "serve-base", "other", "--base-model", "no-such"])
    assert missing.exit_code != 0 and "other" not in registry.agents()


def test_a_challenger_is_aliased_only_while_the_champion_it_beat_is_in_service(
    mlflow_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """An evaluation compares with the champion it finds when it begins; another run's
    challenger promoted meanwhile (or an alias moved by hand) left nothing checking, and
    the challenger went to a canary against a champion it was never compared with."""
    registry = ModelRegistry(mlflow_server.tracking_uri)
    agent = agent_name()
    base = Lineage(kind="base", base_model="smollm2-135m")
    v1 = registry.register(agent, base).version
    registry.promote(agent, v1)

    def evaluated(folder: str, champion: int | None) -> tuple[Path, EvalReport]:
        (tmp_path / folder).mkdir()
        adapter, report = trained_folder(tmp_path / folder, agent=agent)
        assert report is not None
        models = {**report.models, "champion": {**report.models["champion"], "version": champion}}
        return adapter, report.model_copy(update={"models": models})

    adapter, measured_v1 = evaluated("beat-v1", v1)
    v2 = registry.register(agent, base).version
    registry.promote(agent, v2)  # meanwhile: another version took over
    moved = registry.register_trained(agent, adapter, measured_v1, pipeline_run_id="pipe-a")
    assert not moved.challenger and CHALLENGER not in registry.aliases(agent)
    assert moved.version.lineage.gate_promote is True  # its verdict is kept, as measured
    adapter, measured_v2 = evaluated("beat-v2", v2)
    kept = registry.register_trained(agent, adapter, measured_v2, pipeline_run_id="pipe-b")
    assert kept.challenger and registry.aliases(agent)[CHALLENGER] == kept.version.version
