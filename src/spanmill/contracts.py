"""What the flywheel's steps hand each other: each file's name and its shape, here alone.

- a dataset folder (``build_dataset``): :data:`TRAIN_FILE`, :data:`EVAL_FILE` and the
  :class:`DatasetCard` (:mod:`spanmill.dataset.layout` says what the splits hold);
- a trained model folder (``train_lora``, ``train_rl``): the adapter and its
  :class:`TrainManifest` (base model, method, settings, and the card of the dataset
  it learnt from, so that the registry needs nothing but this folder);
- an evaluation folder (``evaluate``): the :class:`EvalReport` (each suite, the flat
  metrics and the gate's decision) and :data:`OUTCOMES_FILE` (each replayed call's
  outcome, one JSON object a line).

Each model reads itself from a folder (:meth:`Contract.read`) and writes itself into
one (:meth:`Contract.write`, atomically: a reader never sees half a file). A file that
is missing or does not hold its model raises :class:`ContractError` naming the file
and the first field that is wrong. Unknown fields are kept, so that a file written by
a newer spanmill reads back whole. This module needs only pydantic, so that every
step may import it without the others' libraries.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, Final, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from spanmill.errors import SpanmillError

TRAIN_FILE: Final = "train.parquet"
EVAL_FILE: Final = "eval.parquet"
CARD_FILE: Final = "card.json"
TRAIN_MANIFEST_FILE: Final = "spanmill-train.json"
METRICS_FILE: Final = "metrics.json"
OUTCOMES_FILE: Final = "outcomes.jsonl"


class ContractError(SpanmillError):
    """A step's output is missing or is not what the step that reads it expects."""


class Contract(BaseModel):
    """A file one step writes into its output folder and a later step reads."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    FILE: ClassVar[str]
    WHAT: ClassVar[str]

    @classmethod
    def present(cls, folder: Path | str) -> bool:
        return (Path(folder) / cls.FILE).is_file()

    @classmethod
    def read(cls, folder: Path | str) -> Self:
        """The model in ``folder``; ContractError when it is missing or malformed."""
        return cls.load(Path(folder) / cls.FILE)

    @classmethod
    def read_if_present(cls, folder: Path | str) -> Self | None:
        """The model in ``folder``, or None where the folder has no such file."""
        return cls.read(folder) if cls.present(folder) else None

    @classmethod
    def load(cls, path: Path | str) -> Self:
        """The model in the file ``path`` (a user may name the file rather than its folder)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ContractError(
                f"{path} does not exist: {path.parent} holds no {cls.WHAT}"
            ) from None
        except OSError as exc:
            raise ContractError(f"{cls.WHAT} {path} cannot be read: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ContractError(f"{cls.WHAT} {path} is not readable JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ContractError(f"{cls.WHAT} {path} must hold a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "(top)"
            raise ContractError(f"{cls.WHAT} {path}: {where}: {first['msg']}") from None

    def write(self, folder: Path | str) -> Path:
        """Write into ``folder`` (made if missing) through a temporary file; returns the path."""
        path = Path(folder) / self.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n", "utf-8")
        os.replace(tmp, path)
        return path

    def to_json(self) -> dict[str, Any]:
        """The file's content as plain JSON values (None fields left in: a reader sees them)."""
        return self.model_dump(mode="json")


class RewardWindow(BaseModel):
    model_config = ConfigDict(extra="allow")

    feedback_horizon_hours: float | None = None
    since: str | None = None
    until: str | None = None
    last_span: str | None = None


class SpanWindow(BaseModel):
    """The spans a dataset was built from: asked for, first and last seen, rewards read."""

    model_config = ConfigDict(extra="allow")

    requested: dict[str, Any] = {}
    first_span: str | None = None
    last_span: str | None = None
    rewards: RewardWindow | None = None

    def span(self) -> str | None:
        """``first/last`` (ISO 8601), as the registry tags a version with it."""
        if not (self.first_span or self.last_span):
            return None
        return f"{self.first_span}/{self.last_span}"


class DatasetCard(Contract):
    """What a dataset is: its mode, where its spans came from, each filter's count, the
    rewards, and the content hash of its splits. Every field is optional: a dataset made
    by hand may carry a card with only its mode, or none."""

    FILE: ClassVar[str] = CARD_FILE
    WHAT: ClassVar[str] = "dataset card"

    format: int = 1
    name: str | None = None
    mode: str | None = None
    agent: str | None = None
    source: str | None = None
    created_at: str | None = None
    store: str | None = None
    span_window: SpanWindow | None = None
    filters: dict[str, Any] = {}
    reward: str | None = None
    counts: dict[str, int] = {}
    reward_histogram: list[dict[str, Any]] = []
    model_versions: dict[str, Any] = {}
    prompt_names: dict[str, Any] = {}
    producers: dict[str, Any] = {}
    content_hash: str | None = None
    files: dict[str, str] = {}


class TrainManifest(Contract):
    """What a training run wrote beside its adapter: the run, the settings it ran with,
    and the lineage of its data (the dataset's card, carried whole)."""

    FILE: ClassVar[str] = TRAIN_MANIFEST_FILE
    WHAT: ClassVar[str] = "training manifest"

    output_dir: str
    base_model: str
    method: str
    global_step: int
    resumed_from_step: int | None = None
    run_id: str | None = None
    dataset_digest: str
    merged_dir: str | None = None
    metrics: dict[str, float] = {}
    dataset: str | None = None  # the folder it was read from (a path in the training pod)
    dataset_mode: str | None = None
    dataset_card: DatasetCard | None = None
    tracking_uri: str | None = None
    settings: dict[str, Any] = {}
    task: str | None = None  # reinforcement learning: the task plugin it sampled
    init_adapter: str | None = None
    init_manifest: TrainManifest | None = None  # the run it started from, kept whole

    def data_card(self) -> DatasetCard | None:
        """The card of the data this model learnt from; after SFT then GRPO, the SFT's."""
        if self.dataset_card is not None:
            return self.dataset_card
        return self.init_manifest.data_card() if self.init_manifest else None

    def asked_base_model(self) -> str:
        """The base as training was asked for it (a Hugging Face id, an object store
        path, a catalog name): where training resolved it to is a path in its pod."""
        return str(self.settings.get("base_model") or self.base_model or "")


class GateVerdict(BaseModel):
    model_config = ConfigDict(extra="allow")

    promote: bool
    verdict: str = ""
    reasons: list[str] = []
    metric: str | None = None
    difference: float | None = None


class EvalReport(Contract):
    """An evaluation's outcome: the models compared, each suite's summaries, the flat
    metrics (``<suite>.<role>.<rate>``) and the gate's decision."""

    FILE: ClassVar[str] = METRICS_FILE
    WHAT: ClassVar[str] = "evaluation report"

    task: str = ""
    models: dict[str, dict[str, Any]] = {}
    suites: dict[str, dict[str, Any]] = {}
    policy: dict[str, Any] = {}
    decision: GateVerdict
    evaluators: dict[str, dict[str, str]] = {}
    metrics: dict[str, float] = {}
    run_id: str | None = None
