"""The lineage of a model version: where it came from, as MLflow version tags.

A version must answer, on its own, the questions someone asks when it misbehaves
in production: which spans it learned from (dataset digest and span window),
from which base model and with which settings, how it scored against the
champion and why the gate let it through, and which pipeline run made it.

:func:`lineage_from_outputs` reads what training and evaluation hand on (the
:class:`~spanmill.contracts.TrainManifest` beside the adapter, which carries the
dataset's card, and the :class:`~spanmill.contracts.EvalReport`), so that
registration needs nothing but the model folder and the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from spanmill.contracts import EvalReport, TrainManifest
from spanmill.registry import names
from spanmill.registry.names import Kind, RegistryError

# Evaluation metrics that say most about a version, kept when there are too many to tag.
_TAG_LIMIT = 5000


@dataclass(frozen=True)
class Lineage:
    """What a registered version is and where it came from."""

    kind: Kind
    base_model: str = ""
    dataset_digest: str | None = None
    dataset_name: str | None = None
    span_window: str | None = None  # "first/last" span start times, ISO 8601
    train_run_id: str | None = None
    train_method: str | None = None
    train_settings: Mapping[str, Any] = field(default_factory=dict)
    eval_run_id: str | None = None
    eval_metrics: Mapping[str, float] = field(default_factory=dict)
    gate_promote: bool | None = None
    gate_reasons: tuple[str, ...] = ()
    pipeline_run_id: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in names.KINDS:
            raise RegistryError(f"kind {self.kind!r} is not one of {', '.join(names.KINDS)}")
        if self.kind in ("adapter", "base") and not self.base_model:
            raise RegistryError(f"a version of kind {self.kind!r} needs its base model")

    @property
    def gate_passed(self) -> bool:
        """The gate let it through; a version evaluated by no gate has not passed one."""
        return self.gate_promote is True

    def tags(self) -> dict[str, str]:
        """The lineage as version tags (strings; absent facts are left out)."""
        tags: dict[str, str] = {names.TAG_KIND: self.kind}
        optional = {
            names.TAG_BASE_MODEL: self.base_model,
            names.TAG_DATASET_DIGEST: self.dataset_digest,
            names.TAG_DATASET_NAME: self.dataset_name,
            names.TAG_SPAN_WINDOW: self.span_window,
            names.TAG_TRAIN_RUN: self.train_run_id,
            names.TAG_TRAIN_METHOD: self.train_method,
            names.TAG_EVAL_RUN: self.eval_run_id,
            names.TAG_PIPELINE_RUN: self.pipeline_run_id,
        }
        tags.update({k: v for k, v in optional.items() if v})
        if self.train_settings:
            tags[names.TAG_TRAIN_SETTINGS] = json.dumps(dict(self.train_settings), sort_keys=True)
        for key, value in self.eval_metrics.items():
            tags[f"{names.EVAL_METRIC_PREFIX}{key}"] = _number(value)
        if self.gate_promote is not None:
            tags[names.TAG_GATE] = "promote" if self.gate_promote else "reject"
            if self.gate_reasons:
                tags[names.TAG_GATE_REASONS] = "; ".join(self.gate_reasons)[:_TAG_LIMIT]
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Lineage:
        kind = tags.get(names.TAG_KIND, "")
        if kind not in names.KINDS:
            raise RegistryError(
                f"version tag {names.TAG_KIND} is {kind!r}; spanmill registers "
                f"{', '.join(names.KINDS)} (was this version registered by spanmill?)"
            )
        reserved = {names.TAG_EVAL_RUN}
        metrics = {
            key[len(names.EVAL_METRIC_PREFIX) :]: float(value)
            for key, value in tags.items()
            if key.startswith(names.EVAL_METRIC_PREFIX) and key not in reserved and _is_float(value)
        }
        gate = tags.get(names.TAG_GATE)
        settings = tags.get(names.TAG_TRAIN_SETTINGS)
        return cls(
            kind=kind,
            base_model=tags.get(names.TAG_BASE_MODEL, ""),
            dataset_digest=tags.get(names.TAG_DATASET_DIGEST),
            dataset_name=tags.get(names.TAG_DATASET_NAME),
            span_window=tags.get(names.TAG_SPAN_WINDOW),
            train_run_id=tags.get(names.TAG_TRAIN_RUN),
            train_method=tags.get(names.TAG_TRAIN_METHOD),
            train_settings=json.loads(settings) if settings else {},
            eval_run_id=tags.get(names.TAG_EVAL_RUN),
            eval_metrics=metrics,
            gate_promote=None if gate is None else gate == "promote",
            gate_reasons=tuple(r for r in tags.get(names.TAG_GATE_REASONS, "").split("; ") if r),
            pipeline_run_id=tags.get(names.TAG_PIPELINE_RUN),
        )


def learned_from(lineage: Lineage, first: datetime, last: datetime) -> bool:
    """Whether a version's training spans (its span window) may hold spans that started
    between ``first`` and ``last``; a version without a window is assumed to."""
    if not lineage.span_window or "/" not in lineage.span_window:
        return True
    low, high = lineage.span_window.split("/", 1)
    try:
        start, end = datetime.fromisoformat(low), datetime.fromisoformat(high)
    except ValueError:
        return True
    return start <= last and first <= end


def lineage_from_outputs(
    model_dir: Path,
    evaluation: EvalReport | None = None,
    *,
    agent: str | None = None,
    pipeline_run_id: str | None = None,
    base_model: str | None = None,
) -> Lineage:
    """The lineage of a trained adapter (or merged model) folder and its evaluation.

    ``model_dir`` holds ``adapter_config.json`` (an adapter) or ``config.json`` (a
    full model) and, when spanmill trained it, its training manifest. Without an
    ``evaluation`` the version carries no gate decision and will not become the
    challenger. An evaluation of another model, or (given ``agent``) of another
    agent, is refused: see :func:`check_evaluated`.
    """
    model_dir = Path(model_dir)
    if (model_dir / "adapter_config.json").is_file():
        kind: Kind = "adapter"
    elif (model_dir / "config.json").is_file():
        kind = "model"
    else:
        raise RegistryError(
            f"{model_dir} is neither a LoRA adapter (adapter_config.json) nor a model "
            "(config.json); register the folder training wrote"
        )
    manifest = TrainManifest.read_if_present(model_dir)
    base = base_model or (manifest.asked_base_model() if manifest else "")
    if kind == "adapter" and not base:
        adapter_config = _read_json(model_dir / "adapter_config.json")
        base = str(adapter_config.get("base_model_name_or_path") or "")
    lineage = Lineage(kind=kind, base_model=base, pipeline_run_id=pipeline_run_id)
    if manifest is not None:
        card = manifest.data_card()
        window = card.span_window if card else None
        lineage = replace(
            lineage,
            dataset_digest=manifest.dataset_digest,
            dataset_name=(card.name if card else None)
            or (Path(manifest.dataset).name if manifest.dataset else None),
            span_window=window.span() if window else None,
            train_run_id=manifest.run_id,
            train_method=manifest.method,
            train_settings=manifest.settings,
        )
    if evaluation is not None:
        check_evaluated(evaluation, model_dir, manifest, agent)
        lineage = with_evaluation(lineage, evaluation)
    return lineage


def check_evaluated(
    report: EvalReport, model_dir: Path, manifest: TrainManifest | None, agent: str | None
) -> None:
    """Refuse a report that evaluated another model or agent than the one registered.

    The gate's verdict is copied onto the version, so a report handed over by mistake
    (another run's metrics.json, or a stale one left in a reused folder) would let an
    unjudged model through. The training run id identifies a trained model wherever
    its folder is mounted; without one, the folders are compared. A report that names
    no challenger (written by hand) is taken as it is.
    """
    evaluated = report.models.get("challenger") or {}
    evaluated_run = evaluated.get("run_id") or None
    evaluated_adapter = evaluated.get("adapter") or None
    evaluated_path = evaluated_adapter or evaluated.get("base") or None
    own_run = manifest.run_id if manifest else None
    # The evaluation records an adapter's training run as its manifest had it, none
    # included; a full model's it does not record.
    if evaluated_run or (evaluated_adapter and own_run):
        if evaluated_run != own_run:
            raise RegistryError(
                f"the evaluation report is of {evaluated_path} from training run "
                f"{evaluated_run or '(none recorded)'}, and {model_dir} is from training run "
                f"{own_run or '(none recorded)'}: its gate verdict is not this model's; "
                f"evaluate {model_dir} and register it with that evaluation's metrics.json"
            )
    elif evaluated_path and not _same_path(str(evaluated_path), model_dir):
        raise RegistryError(
            f"the evaluation report is of {evaluated_path}, and this registers {model_dir}: "
            f"its gate verdict is not this model's; evaluate {model_dir} and register it "
            "with that evaluation's metrics.json"
        )
    if agent and report.task and report.task != agent:
        task_agent = _agent_of_task(report.task)
        if task_agent != agent:
            of = (
                f"task {report.task!r}, whose agent is {task_agent!r}"
                if task_agent
                else f"{report.task!r} (no installed task has that name)"
            )
            raise RegistryError(
                f"the evaluation report is of {of}, and this registers a version of agent "
                f"{agent!r}: register it under the agent it evaluated, or evaluate it for "
                f"{agent!r}"
            )


def _agent_of_task(name: str) -> str | None:
    """The agent of the task plugin ``name``; None when no task of that name loads here."""
    from spanmill.tasks import TASKS, TaskError

    try:
        return str(TASKS[name].agent_name)
    except (KeyError, TaskError):
        return None


def _same_path(recorded: str, model_dir: Path) -> bool:
    return Path(recorded).expanduser().resolve() == Path(model_dir).expanduser().resolve()


def with_evaluation(lineage: Lineage, report: EvalReport) -> Lineage:
    """Add an evaluation's report (its metrics and the gate's decision) to a lineage."""
    finite = {k: v for k, v in report.metrics.items() if math.isfinite(v)}
    return replace(
        lineage,
        eval_run_id=report.run_id or lineage.eval_run_id,
        eval_metrics=finite,
        gate_promote=report.decision.promote,
        gate_reasons=tuple(report.decision.reasons),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{path} must hold a JSON object")
    return data


def _number(value: float) -> str:
    return repr(float(value))


def _is_float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
