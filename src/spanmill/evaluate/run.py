"""Judge a challenger against the champion: ``evaluate(dataset_dir, challenger, output_dir)``.

Folder in, folder out, like training; the pipeline component and the CLI call
this function. ``output_dir`` receives ``metrics.json`` (flat metrics and the
gate's decision), ``report.html``, ``report.png`` and ``outcomes.jsonl``
(every episode and reply, for a person to read). Every input is checked before
a model is loaded.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spanmill.errors import ModelError
from spanmill.evaluate.episodes import answer_samples, play_episodes
from spanmill.evaluate.gate import GateDecision, decide
from spanmill.evaluate.report import html_page, rates_png
from spanmill.evaluate.scoring import Outcome, Summary, as_jsonable, per_item
from spanmill.evaluate.settings import EvalSettings, GatePolicy
from spanmill.evaluate.stats import Interval, bootstrap_difference
from spanmill.models import resolve_model
from spanmill.tasks import TASKS, Task, TaskError, TaskInstance, get_task
from spanmill.tasks.base import Message
from spanmill.train.data import TrainingData, load_training_data
from spanmill.train.tracking import RunTracker
from spanmill.train.trainer import MANIFEST_FILE

METRICS_FILE = "metrics.json"
REPORT_HTML = "report.html"
REPORT_PNG = "report.png"
OUTCOMES_FILE = "outcomes.jsonl"
ARTIFACT_DIR = "evaluation"
ROLES = ("champion", "challenger")

# (phase, done, total): phase is "<role> <suite>".
Progress = Callable[[str, int, int], None]


class EvaluationError(ModelError):
    """A model to evaluate cannot be found, or the evaluation has nothing to run on."""


@dataclass(frozen=True)
class ModelRef:
    """A model to generate with: a base model and, optionally, an adapter on it."""

    label: str
    base: str
    adapter: str | None = None
    run_id: str | None = None

    def describe(self) -> str:
        return f"{self.adapter} on {self.base}" if self.adapter else self.base


@dataclass(frozen=True)
class SuiteResult:
    name: str
    champion: Summary
    challenger: Summary
    difference: Interval


@dataclass(frozen=True)
class EvalReport:
    """The comparison, suite by suite, and the gate's decision."""

    task: str
    models: dict[str, ModelRef]
    suites: dict[str, SuiteResult]
    policy: GatePolicy
    decision: GateDecision
    run_id: str | None = None

    def metrics(self) -> dict[str, float]:
        """Flat metrics, named ``<suite>.<role>.<rate>`` and ``<suite>.difference[_low|_high]``."""
        flat: dict[str, float] = {}
        for suite in self.suites.values():
            for role in ROLES:
                summary = getattr(suite, role)
                for key, value in asdict(summary).items():
                    flat[f"{suite.name}.{role}.{key}"] = float(value)
            flat[f"{suite.name}.difference"] = suite.difference.estimate
            flat[f"{suite.name}.difference_low"] = suite.difference.low
            flat[f"{suite.name}.difference_high"] = suite.difference.high
        flat["gate.promote"] = float(self.decision.promote)
        return flat

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "models": {role: asdict(ref) for role, ref in self.models.items()},
            "suites": {name: asdict(suite) for name, suite in self.suites.items()},
            "policy": self.policy.model_dump(),
            "decision": {
                "promote": self.decision.promote,
                "verdict": self.decision.verdict,
                "reasons": list(self.decision.reasons),
                "metric": self.decision.metric,
                "difference": self.decision.difference,
            },
            "metrics": self.metrics(),
            "run_id": self.run_id,
        }


def evaluate(
    dataset_dir: Path,
    challenger: str | Path,
    output_dir: Path,
    settings: EvalSettings | None = None,
    *,
    progress: Progress | None = None,
) -> EvalReport:
    """Compare ``challenger`` (an adapter or model folder) with the champion; see the module doc."""
    settings = settings or EvalSettings()
    output_dir = Path(output_dir)
    data = load_training_data(Path(dataset_dir))
    task = _task(settings.task, data)
    challenger_ref = model_ref(str(challenger), settings.base_model)
    champion_ref = (
        model_ref(settings.champion, settings.base_model)
        if settings.champion
        else ModelRef("base model", challenger_ref.base)
    )
    instances = fresh_instances(
        task, settings.instances, settings.instance_seed, data.train.task_ids
    )
    samples = dataset_samples(data, settings.dataset_samples)
    if not instances and not samples:
        raise EvaluationError(
            "nothing to evaluate: no task instances asked and the dataset has no eval split; "
            "set instances above 0"
        )
    if settings.gate.suite == "tasks" and not instances:
        raise EvaluationError("the gate decides on the tasks suite; set instances above 0")
    if settings.gate.suite == "dataset" and not samples:
        raise EvaluationError(f"the gate decides on the dataset suite, and {data.folder} has none")
    tracker = _tracker(settings, challenger_ref)

    try:
        outcomes: dict[str, dict[str, list[Outcome]]] = {}
        for role, ref in (("champion", champion_ref), ("challenger", challenger_ref)):
            outcomes[role] = _run_model(ref, role, task, instances, samples, settings, progress)
        suites = {
            name: _compare(name, outcomes["champion"][name], outcomes["challenger"][name], settings)
            for name in outcomes["challenger"]
        }
        gated = suites[settings.gate.suite]
        decision = decide(gated.challenger, gated.champion, gated.difference, settings.gate)
        report = EvalReport(
            task=task.name,
            models={"champion": champion_ref, "challenger": challenger_ref},
            suites=suites,
            policy=settings.gate,
            decision=decision,
            run_id=tracker.run_id if tracker else None,
        )
        _write(report, outcomes, output_dir)
        if tracker is not None:
            tracker.log_metrics({f"eval.{k}": v for k, v in report.metrics().items()}, step=0)
            tracker.set_tags(
                {"spanmill.gate": decision.verdict, "spanmill.champion": champion_ref.describe()}
            )
            for name in (METRICS_FILE, REPORT_HTML, REPORT_PNG, OUTCOMES_FILE):
                tracker.log_artifact(output_dir / name, ARTIFACT_DIR)
    except BaseException:
        if tracker is not None:
            tracker.finish("FAILED")
        raise
    if tracker is not None:
        tracker.finish("FINISHED")
    return report


def model_ref(ref: str, base_override: str | None = None) -> ModelRef:
    """An adapter folder (its base from the override, its training manifest, or its config),
    a model folder, a catalog name or a Hugging Face id."""
    path = Path(ref).expanduser()
    label = path.name or ref
    adapter_config = path / "adapter_config.json"
    if adapter_config.is_file():
        manifest = _read_json(path / MANIFEST_FILE)
        config = _read_json(adapter_config)
        base = base_override or manifest.get("base_model") or config.get("base_model_name_or_path")
        if not base:
            raise EvaluationError(
                f"adapter {path} does not say which base model it adapts; pass base_model"
            )
        return ModelRef(label, resolve_model(str(base)), str(path), manifest.get("run_id"))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EvaluationError(
                f"{path} is neither an adapter folder (adapter_config.json) nor a model "
                "folder (config.json)"
            )
        return ModelRef(label, str(path.resolve()))
    return ModelRef(label, resolve_model(ref))


def fresh_instances(task: Task, n: int, seed: int, exclude: frozenset[str]) -> list[TaskInstance]:
    """``n`` held-out instances of ``task``, none of them among ``exclude`` (the training ids)."""
    if n == 0:
        return []
    want = n
    fresh: list[TaskInstance] = []
    for _ in range(8):
        fresh = [i for i in task.instances("heldout", want, seed) if i.id not in exclude][:n]
        if len(fresh) == n:
            break
        want += n - len(fresh)
    return fresh


def dataset_samples(data: TrainingData, limit: int) -> list[tuple[str, list[Message], str]]:
    """(id, prompt, reference reply) of the eval split, at most ``limit``."""
    if data.eval is None or limit == 0:
        return []
    target = "chosen" if data.mode == "preference" else "completion"
    rows = data.eval.table.to_pylist()
    if data.mode == "rl":
        rows = [row for row in rows if (row.get("reward") or 0) > 0]
    return [
        (f"eval-{i}", row["prompt"], str(row[target][-1]["content"]))
        for i, row in enumerate(rows[:limit])
    ]


def _task(name: str | None, data: TrainingData) -> Task:
    if name:
        return get_task(name)
    agents = set(data.train.agents)
    if data.card.get("agent"):
        agents.add(str(data.card["agent"]))
    for task_name, cls in TASKS.items():
        if agents == {cls.agent_name}:
            return get_task(task_name)
    raise TaskError(
        f"cannot tell which task scores {data.folder} (agents: "
        f"{', '.join(sorted(agents)) or 'none'}); set the task, one of {', '.join(sorted(TASKS))}"
    )


def _tracker(settings: EvalSettings, challenger: ModelRef) -> RunTracker | None:
    if not settings.track:
        return None
    return RunTracker.open(
        settings.mlflow.tracking_uri,
        settings.experiment,
        run_name=f"evaluate-{Path(challenger.adapter or challenger.base).name}",
        tags={"spanmill.challenger": challenger.describe()},
        resume_run_id=settings.run_id or challenger.run_id,
        add_to_existing=True,
    )


def _run_model(
    ref: ModelRef,
    role: str,
    task: Task,
    instances: list[TaskInstance],
    samples: list[tuple[str, list[Message], str]],
    settings: EvalSettings,
    progress: Progress | None,
) -> dict[str, list[Outcome]]:
    from spanmill.serving.generation import Generator

    generator = Generator(
        ref.base, ref.adapter, dtype=settings.dtype, num_threads=settings.num_threads
    )
    results: dict[str, list[Outcome]] = {}
    try:
        if instances:
            results["tasks"] = play_episodes(
                generator,
                task,
                instances,
                prompt_style=settings.prompt_style,
                max_new_tokens=settings.max_new_tokens,
                batch_size=settings.batch_size,
                progress=_counter(progress, f"{role} tasks", len(instances)),
            )
        if samples:
            results["dataset"] = answer_samples(
                generator,
                task,
                samples,
                max_new_tokens=settings.max_new_tokens,
                batch_size=settings.batch_size,
                progress=_counter(progress, f"{role} dataset", len(samples)),
            )
    finally:
        # Two models never need to be in memory together.
        del generator
        gc.collect()
    return results


def _counter(progress: Progress | None, phase: str, total: int) -> Callable[[int], None] | None:
    if progress is None:
        return None
    done = 0
    progress(phase, 0, total)

    def advance(count: int) -> None:
        nonlocal done
        done += count
        progress(phase, done, total)

    return advance


def _compare(
    name: str, champion: list[Outcome], challenger: list[Outcome], settings: EvalSettings
) -> SuiteResult:
    metric = settings.gate.metric
    return SuiteResult(
        name=name,
        champion=Summary.of(champion),
        challenger=Summary.of(challenger),
        difference=bootstrap_difference(
            per_item(challenger, metric),
            per_item(champion, metric),
            resamples=settings.bootstrap_resamples,
            confidence=settings.confidence,
            seed=settings.seed,
        ),
    )


def _write(
    report: EvalReport, outcomes: dict[str, dict[str, list[Outcome]]], output_dir: Path
) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / METRICS_FILE).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    with (output_dir / OUTCOMES_FILE).open("w", encoding="utf-8") as handle:
        for role, suites in outcomes.items():
            for suite, items in suites.items():
                for outcome in items:
                    handle.write(json.dumps(as_jsonable(outcome, suite, role)) + "\n")
    png = rates_png(report, output_dir / REPORT_PNG)
    by_model = {
        f"{role} {suite}": items
        for role, suites in outcomes.items()
        for suite, items in suites.items()
    }
    (output_dir / REPORT_HTML).write_text(html_page(report, png, by_model), encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
