"""The lineage of a model version: where it came from, as MLflow version tags.

A version must answer, on its own, the questions someone asks when it misbehaves
in production: which spans it learned from (dataset digest and span window),
from which base model and with which settings, how it scored against the
champion and why the gate let it through, and which pipeline run made it.

:func:`lineage_from_outputs` reads what training and evaluation leave behind
(``spanmill-train.json`` beside the adapter, the evaluation's ``metrics.json``)
so that registration needs nothing but those two folders.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from spanmill.contracts import CARD_FILE, TRAIN_MANIFEST_FILE
from spanmill.registry import names
from spanmill.registry.names import Kind, RegistryError

# Written by spanmill.train beside the adapter it saves.
TRAIN_MANIFEST = TRAIN_MANIFEST_FILE
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
    metrics_path: Path | None = None,
    *,
    pipeline_run_id: str | None = None,
    base_model: str | None = None,
) -> Lineage:
    """The lineage of a trained adapter (or merged model) folder and its evaluation.

    ``model_dir`` holds ``adapter_config.json`` (an adapter) or ``config.json`` (a
    full model) and, when spanmill trained it, ``spanmill-train.json``.
    ``metrics_path`` is the evaluation's ``metrics.json``; without it the version
    carries no gate decision and will not become the challenger.
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
    manifest = (
        _read_json(model_dir / TRAIN_MANIFEST) if (model_dir / TRAIN_MANIFEST).is_file() else {}
    )
    # The base as training was asked for it (a Hugging Face id, an object store path, a
    # catalog name): where training resolved it to is a path in the training pod alone.
    asked = (manifest.get("settings") or {}).get("base_model")
    base = base_model or str(asked or manifest.get("base_model") or "")
    if kind == "adapter" and not base:
        adapter_config = _read_json(model_dir / "adapter_config.json")
        base = str(adapter_config.get("base_model_name_or_path") or "")
    card = _dataset_card(manifest.get("dataset"))
    window = card.get("span_window") or {}
    first, last = window.get("first_span"), window.get("last_span")
    settings = manifest.get("settings") or {}
    lineage = Lineage(
        kind=kind,
        base_model=base,
        dataset_digest=manifest.get("dataset_digest"),
        dataset_name=card.get("name")
        or (Path(manifest["dataset"]).name if manifest.get("dataset") else None),
        span_window=f"{first}/{last}" if first or last else None,
        train_run_id=manifest.get("run_id"),
        train_method=manifest.get("method"),
        train_settings=settings if isinstance(settings, dict) else {},
        pipeline_run_id=pipeline_run_id,
    )
    if metrics_path is not None:
        lineage = with_evaluation(lineage, _read_json(Path(metrics_path)))
    return lineage


def with_evaluation(lineage: Lineage, report: Mapping[str, Any]) -> Lineage:
    """Add an evaluation report (the content of ``metrics.json``) to a lineage."""
    decision = report.get("decision")
    if not isinstance(decision, dict) or not isinstance(decision.get("promote"), bool):
        raise RegistryError(
            "the evaluation report has no gate decision (decision.promote); pass the "
            "metrics.json that spanmill's evaluation wrote"
        )
    metrics = report.get("metrics") or {}
    finite = {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and math.isfinite(float(v))
    }
    return replace(
        lineage,
        eval_run_id=report.get("run_id") or lineage.eval_run_id,
        eval_metrics=finite,
        gate_promote=decision["promote"],
        gate_reasons=tuple(str(r) for r in decision.get("reasons") or ()),
    )


def _dataset_card(folder: Any) -> dict[str, Any]:
    if not folder:
        return {}
    path = Path(str(folder)) / CARD_FILE
    return _read_json(path) if path.is_file() else {}


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
