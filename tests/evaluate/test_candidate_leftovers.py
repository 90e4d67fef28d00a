"""What an evaluation that was killed left staged is removed by the next one to stage a
candidate of the agent: at once where it is a retry of the same evaluation, ten minutes
after its evaluation last renewed its record otherwise (spanmill.evaluate.served)."""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from spanmill.evaluate import served
from spanmill.evaluate.served import RECORD, _staged
from spanmill.registry import names
from spanmill.rollout.materialize import ModelRepository

MODEL = names.triton_candidate_model("calc")


class NoServers:
    """A fleet with no server: what is staged is written and never loaded."""

    def members(self) -> list[object]:
        return []


def write(stage: Path, version: int) -> None:
    folder = stage / MODEL / str(version)
    folder.mkdir(parents=True)
    (folder / "model.py").write_text("# a candidate")
    (stage / MODEL / "config.pbtxt").write_text('backend: "python"\n')


def stage(repository: ModelRepository, owner: str | None) -> AbstractContextManager[int]:
    return _staged(NoServers(), repository, MODEL, write, lambda server, version: None,  # type: ignore[arg-type]
                   what="a candidate", owner=owner)  # fmt: skip


def leftover(repository: ModelRepository, version: int, record: dict[str, object] | None) -> None:
    folder = Path(repository.location) / MODEL / str(version)
    folder.mkdir(parents=True)
    (folder / "model.py").write_text("# left behind")
    if record is not None:
        (folder / RECORD).write_text(json.dumps(record))


def test_leftovers_go_and_running_evaluations_stay(tmp_path: Path) -> None:
    repository = ModelRepository(str(tmp_path / "repo"))
    now = time.time()
    base = int(now * 1000) - 3600_000  # staged an hour ago, each
    silent = {"owner": "run-a/evaluate", "beat": now - 11 * 60}  # killed 11 minutes ago
    running = {"owner": "run-b/evaluate", "beat": now - 30}  # another evaluation, running
    ours = {"owner": "run-c/evaluate", "beat": now - 30}  # this step's killed first try
    leftover(repository, base + 1, silent)
    leftover(repository, base + 2, running)
    leftover(repository, base + 3, ours)
    leftover(repository, base + 4, None)  # no record, an hour old: kept a day, as before
    with stage(repository, "run-c/evaluate") as version:
        assert sorted(repository.versions(MODEL)) == [base + 2, base + 4, version]
        record = repository.read_json(MODEL, str(version), RECORD)
        assert record is not None and record["owner"] == "run-c/evaluate"
        assert abs(record["beat"] - time.time()) < 60
    assert repository.versions(MODEL) == [base + 2, base + 4]
    # Without an owner (the CLI), a record never matches: the running one still stays.
    with stage(repository, None):
        pass
    assert repository.versions(MODEL) == [base + 2, base + 4]


def test_a_running_evaluation_renews_its_record_until_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served, "HEARTBEAT_S", 0.05)
    repository = ModelRepository(str(tmp_path / "repo"))
    with stage(repository, "run/evaluate") as version:
        first = repository.read_json(MODEL, str(version), RECORD)
        assert first is not None
        deadline = time.monotonic() + 30
        while (repository.read_json(MODEL, str(version), RECORD) or first)["beat"] == first["beat"]:
            assert time.monotonic() < deadline, "the record was never renewed"
            time.sleep(0.02)
    # Its last beat is done before the version goes: no folder is written again after.
    time.sleep(0.3)
    assert repository.versions(MODEL) == []
    assert not (Path(repository.location) / MODEL / str(version)).exists()
