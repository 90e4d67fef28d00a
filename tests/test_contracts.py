"""What the flywheel's steps hand each other (spanmill.contracts): each file read back as
written, refused with the file and field named when it is wrong, and named nowhere else."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from spanmill import contracts
from spanmill.contracts import (
    ContractError,
    DatasetCard,
    EvalReport,
    GateVerdict,
    SpanWindow,
    TrainManifest,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "spanmill"


def manifest(**more: object) -> TrainManifest:
    fields: dict[str, object] = {
        "output_dir": "/out", "base_model": "/cache/base", "method": "sft", "global_step": 3,
        "dataset_digest": "d" * 64, "settings": {"base_model": "smollm2-135m"},
    }  # fmt: skip
    return TrainManifest.model_validate({**fields, **more})


def test_each_contract_reads_back_what_it_wrote(tmp_path: Path) -> None:
    card = DatasetCard(
        name="calc", mode="sft", counts={"train": 3}, content_hash="c" * 64,
        span_window=SpanWindow(first_span="2026-01-01T00:00:00+00:00",
                               last_span="2026-01-02T00:00:00+00:00"),
    )  # fmt: skip
    sft = manifest(dataset_card=card)
    report = EvalReport(
        decision=GateVerdict(promote=True, reasons=["better"]),
        metrics={"tasks.challenger.success_rate": 0.5, "tasks.difference_low": math.nan},
    )
    for written in (card, sft, report):
        path = written.write(tmp_path)
        assert path == tmp_path / written.FILE
        assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file
    assert DatasetCard.read(tmp_path) == card
    assert TrainManifest.read(tmp_path) == sft
    assert TrainManifest.read_if_present(tmp_path) == sft
    assert TrainManifest.read_if_present(tmp_path / "elsewhere") is None
    back = EvalReport.read(tmp_path)
    assert back.decision.promote and math.isnan(back.metrics["tasks.difference_low"])
    assert card.span_window is not None
    assert card.span_window.span() == "2026-01-01T00:00:00+00:00/2026-01-02T00:00:00+00:00"


def test_a_run_after_sft_keeps_the_card_of_the_data_the_start_adapter_learnt_from() -> None:
    card = DatasetCard(name="calc-spans", content_hash="c" * 64)
    grpo = manifest(method="grpo", init_manifest=manifest(dataset_card=card))
    assert grpo.data_card() == card
    assert manifest().data_card() is None
    assert grpo.asked_base_model() == "smollm2-135m"  # as asked, not where a pod resolved it


def test_fields_a_newer_writer_added_are_kept(tmp_path: Path) -> None:
    (tmp_path / contracts.CARD_FILE).write_text(json.dumps({"mode": "sft", "future": [1, 2]}))
    card = DatasetCard.read(tmp_path)
    assert card.mode == "sft" and card.model_extra == {"future": [1, 2]}
    card.write(tmp_path / "again")
    assert json.loads((tmp_path / "again" / contracts.CARD_FILE).read_text())["future"] == [1, 2]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"does not exist: .* holds no evaluation report"),
        ("{not json", r"evaluation report .*metrics.json is not readable JSON"),
        ("[1]", r"must hold a JSON object"),
        ('{"metrics": {}}', r"metrics.json: decision: Field required"),
        ('{"decision": {"promote": "perhaps"}}', r"decision.promote: Input should be a valid"),
    ],
)
def test_a_wrong_file_is_refused_with_its_path_and_field(
    tmp_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / contracts.METRICS_FILE).write_text(content)
    with pytest.raises(ContractError, match=message):
        EvalReport.read(tmp_path)


def test_the_file_names_are_spelled_only_in_the_contracts_module() -> None:
    """A step finds another's output through spanmill.contracts, never a literal name
    (help texts and docstrings may name the files for people)."""
    names = [
        contracts.CARD_FILE, contracts.TRAIN_MANIFEST_FILE, contracts.METRICS_FILE,
        contracts.OUTCOMES_FILE, contracts.TRAIN_FILE, contracts.EVAL_FILE,
    ]  # fmt: skip
    alternatives = "|".join(map(re.escape, names))
    pattern = re.compile(rf"""(?<![\w.])["']({alternatives})["']""")
    spelled = []
    for path in SRC.rglob("*.py"):
        if path.name == "contracts.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "help=" not in code:
                spelled.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert spelled == []
