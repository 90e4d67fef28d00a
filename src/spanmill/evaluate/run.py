"""Judge a challenger against the champion: ``evaluate(dataset_dir, challenger, output_dir)``.

Folder in, folder out, like training; the pipeline component and the CLI call
this function. Both models answer through Triton (see :mod:`spanmill.evaluate.served`):
the champion is the agent's registered champion version, the challenger is
staged as a candidate version for the length of the evaluation. Two suites:

``replay``
    the dataset's eval split replayed to both, scored by the chosen evaluators
    (any agent has this one);
``tasks``
    fresh held-out instances of the agent's task plugin, played as whole
    episodes and judged by the task's verifier (only agents with a task plugin).

``output_dir`` receives ``metrics.json`` (flat metrics and the gate's decision),
``report.html``, ``report.md``, ``report.png`` and ``outcomes.jsonl`` (every
episode and reply, for a person to read). Every input is checked before Triton
is asked for anything.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spanmill.contracts import METRICS_FILE, OUTCOMES_FILE, TrainManifest
from spanmill.errors import ModelError, SpanmillError
from spanmill.evaluate.comparison import ROLES, Comparison, ModelRef, SuiteResult
from spanmill.evaluate.evaluators import Evaluator, EvaluatorContext, ReplayItem, load_evaluator
from spanmill.evaluate.gate import GateDecision, decide
from spanmill.evaluate.play import play_episodes
from spanmill.evaluate.replay import answer, replay_items, score
from spanmill.evaluate.report import html_page, markdown_page, rates_png
from spanmill.evaluate.scoring import Outcome, Summary, as_jsonable, per_item
from spanmill.evaluate.served import (
    Candidate,
    ServedModel,
    ServingError,
    same_engine,
    staged_candidates,
)
from spanmill.evaluate.settings import EvalSettings, GatePolicy
from spanmill.evaluate.stats import bootstrap_difference
from spanmill.models import resolve_model
from spanmill.rollout.fleet import TritonFleet
from spanmill.rollout.triton import TritonControl
from spanmill.tasks import Task, TaskInstance, find_task, get_task
from spanmill.train.data import TrainingData, load_training_data
from spanmill.train.tracking import RunTracker

if TYPE_CHECKING:
    from spanmill.rollout.deployer import Deployer

log = logging.getLogger(__name__)

REPORT_HTML = "report.html"
REPORT_MD = "report.md"
REPORT_PNG = "report.png"
ARTIFACT_DIR = "evaluation"

# (phase, done, total): phase is "<role> <suite>".
Progress = Callable[[str, int, int], None]


class EvaluationError(ModelError):
    """A model to evaluate cannot be found, or the evaluation has nothing to run on."""


@dataclass(frozen=True)
class Plan:
    """What one evaluation runs, checked before Triton is asked for anything."""

    agent: str
    task: Task | None
    instances: list[TaskInstance]
    items: list[ReplayItem]
    evaluators: list[Evaluator]
    policy: GatePolicy


def evaluate(
    dataset_dir: Path,
    challenger: str | Path,
    output_dir: Path,
    settings: EvalSettings | None = None,
    *,
    progress: Progress | None = None,
) -> Comparison:
    """Compare ``challenger`` (an adapter or model folder) with the champion; see the module doc."""
    settings = settings or EvalSettings()
    output_dir = Path(output_dir)
    data = load_training_data(Path(dataset_dir))
    challenger_ref = model_ref(str(challenger), settings.base_model)
    plan = _plan(settings, data)
    tracker = _tracker(settings, challenger_ref)
    try:
        with serve_models(settings, plan.agent, challenger_ref) as served:
            refs = {
                "champion": ModelRef(
                    "champion",
                    served["champion"].describe(),
                    version=served["champion"].registered,
                ),
                "challenger": replace(challenger_ref, served=served["challenger"].describe()),
            }
            outcomes = _run(plan, served, settings, progress)
        policy = _metric(plan.policy, plan.evaluators, outcomes)
        suites = {
            name: _compare(name, outcomes, policy.metric, settings)
            for name in outcomes["challenger"]
        }
        gated = suites[policy.suite]
        if gated.metric != policy.metric:
            decision = GateDecision(
                False,
                (f"no item of the {policy.suite} suite has {policy.metric}: nothing to decide on",),
                policy.metric,
                0.0,
            )
        else:
            others = {name: (suite.challenger, suite.champion)
                      for name, suite in suites.items() if name != policy.suite}  # fmt: skip
            decision = decide(gated.challenger, gated.champion, gated.difference, policy,
                              others=others)  # fmt: skip
        report = Comparison(
            task=plan.task.name if plan.task else plan.agent,
            models=refs,
            suites=suites,
            policy=policy,
            decision=decision,
            run_id=tracker.run_id if tracker else None,
            evaluators={e.name: _describe(e) for e in plan.evaluators},
        )
        _write(report, outcomes, output_dir)
        if tracker is not None:
            tracker.log_metrics({f"eval.{k}": v for k, v in report.metrics().items()}, step=0)
            tracker.set_tags(_tags(report))
            for name in (METRICS_FILE, REPORT_HTML, REPORT_MD, REPORT_PNG, OUTCOMES_FILE):
                tracker.log_artifact(output_dir / name, ARTIFACT_DIR)
    except BaseException:
        if tracker is not None:
            tracker.finish("FAILED")
        raise
    if tracker is not None:
        tracker.finish("FINISHED")
    return report


def _tags(report: Comparison) -> dict[str, str]:
    """The gate's verdict, the champion, and what each judge-like evaluator used."""
    tags = {
        "spanmill.gate": report.decision.verdict,
        "spanmill.champion": report.models["champion"].describe(),
    }
    for name, described in report.evaluators.items():
        for key in ("prompt_version", "model"):
            if key in described:
                tags[f"spanmill.eval.{name}.{key}"] = described[key][:250]
    return tags


def _plan(settings: EvalSettings, data: TrainingData) -> Plan:
    agent = settings.agent or (data.card.agent if data.card else None) or ""
    if not agent:
        agents = sorted(data.train.agents)
        if len(agents) != 1:
            raise EvaluationError(
                f"cannot tell which agent {data.folder} is for (agents: "
                f"{', '.join(agents) or 'none'}); set the agent"
            )
        agent = agents[0]
    task = get_task(settings.task) if settings.task else find_task(agent)
    instances = (
        fresh_instances(task, settings.instances, settings.instance_seed, data.train.task_ids)
        if task is not None
        else []
    )
    items = replay_items(data, settings.replay_items)
    context = EvaluatorContext(
        judge_url=settings.judge_url,
        judge_model=settings.judge_model,
        judge_api_key=settings.judge_api_key.get_secret_value() if settings.judge_api_key else None,
        seed=settings.seed,
        task=task,
    )
    evaluators = [load_evaluator(name, context) for name in settings.evaluators] if items else []
    policy = _policy(settings.gate, has_tasks=bool(instances))
    if not instances and not items:
        raise EvaluationError(
            f"nothing to evaluate: {data.folder} has no eval split with rewarded calls"
            + ("" if task is None else f" and no fresh {task.name} instances were asked")
            + "; build the dataset with eval_fraction above 0"
        )
    if policy.suite == "tasks" and not instances:
        raise EvaluationError(
            "the gate decides on the tasks suite, which needs a task plugin for "
            f"{agent!r} and instances above 0"
        )
    if policy.suite == "tasks" and "." in policy.metric:
        raise EvaluationError(
            f"the gate's metric {policy.metric!r} is an evaluator's, and evaluators score "
            "the replay suite only; set the gate's suite to replay (or auto)"
        )
    if policy.suite == "replay" and not items:
        raise EvaluationError(f"the gate decides on the replay suite, and {data.folder} has none")
    if policy.suite == "replay" and "." in policy.metric:
        known = {f"{e.name}.{m}" for e in evaluators for m in e.metrics}
        if policy.metric not in known:
            raise EvaluationError(
                f"the gate's metric {policy.metric!r} is given by none of the evaluators "
                f"({', '.join(sorted(known)) or 'none chosen'})"
            )
    return Plan(agent, task, instances, items, evaluators, policy)


def _policy(policy: GatePolicy, *, has_tasks: bool) -> GatePolicy:
    """The policy with an ``auto`` suite resolved: the replay when the metric is an
    evaluator's (only the replay has evaluators), else tasks when there are any."""
    if policy.suite != "auto":
        return policy
    if "." in policy.metric or not has_tasks:
        return policy.model_copy(update={"suite": "replay"})
    return policy.model_copy(update={"suite": "tasks"})


def _metric(
    policy: GatePolicy, evaluators: list[Evaluator], outcomes: dict[str, dict[str, list[Outcome]]]
) -> GatePolicy:
    """The policy with an ``auto`` metric resolved on what was scored: for the replay, the
    first evaluator metric (the evaluators' order, each one's headline first) that scores
    at least half the replayed items of each model, so that a metric of a few items never
    decides for all; else, and for tasks, the success rate."""
    if policy.metric != "auto":
        return policy
    if policy.suite == "replay":
        sides = [outcomes[side].get(policy.suite, []) for side in ("challenger", "champion")]
        for evaluator in evaluators:
            for metric in evaluator.metrics:
                name = f"{evaluator.name}.{metric}"
                if all(side and 2 * sum(name in o.scores for o in side) >= len(side)
                       for side in sides):  # fmt: skip
                    return policy.model_copy(update={"metric": name})
    return policy.model_copy(update={"metric": "success_rate"})


def _describe(evaluator: Evaluator) -> dict[str, str]:
    described = getattr(evaluator, "describe", None)
    found = described() if callable(described) else {}
    return {"metrics": ", ".join(evaluator.metrics), **{k: str(v) for k, v in found.items()}}


def model_ref(ref: str, base_override: str | None = None) -> ModelRef:
    """An adapter folder (its base from the override, its training manifest, or its config),
    a model folder, a catalog name or a Hugging Face id."""
    path = Path(ref).expanduser()
    label = path.name or ref
    adapter_config = path / "adapter_config.json"
    if adapter_config.is_file():
        manifest = TrainManifest.read_if_present(path)
        config = _read_json(adapter_config)
        base = (
            base_override
            or (manifest.asked_base_model() if manifest else None)
            or config.get("base_model_name_or_path")
        )
        if not base:
            raise EvaluationError(
                f"adapter {path} does not say which base model it adapts; pass base_model"
            )
        run_id = manifest.run_id if manifest else None
        return ModelRef(label, resolve_model(str(base)), str(path), run_id, base_named=str(base))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EvaluationError(
                f"{path} is neither an adapter folder (adapter_config.json) nor a model "
                "folder (config.json)"
            )
        return ModelRef(label, str(path.resolve()))
    return ModelRef(label, resolve_model(ref), base_named=ref)


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
    if len(fresh) < n:
        log.warning("the task %s gave %d held-out instances not seen in training, of %d asked",
                    task.name, len(fresh), n)  # fmt: skip
    return fresh


@contextmanager
def serve_models(
    settings: EvalSettings, agent: str, challenger: ModelRef
) -> Iterator[dict[str, ServedModel]]:
    """The champion as Triton serves it, the challenger staged; a champion no serving pod
    holds staged as the challenger is (the serving pods are the rollout controller's: an
    evaluation never loads a version onto them); without a champion, the challenger's
    base model staged beside it. What is staged is staged together
    (:func:`~spanmill.evaluate.served.staged_candidates`: in the vLLM flavour, adapters of
    one engine)."""
    from spanmill.registry import CHAMPION, ModelRegistry
    from spanmill.rollout.deployer import Deployer
    from spanmill.rollout.fleet import fleet_of
    from spanmill.rollout.materialize import ModelRepository, ServingOptions, weights_of

    triton_url = settings.triton.http_url
    triton = fleet_of(settings.triton)
    repository = ModelRepository.from_settings(settings.triton)
    options = ServingOptions.from_settings(settings.serving, settings.triton)
    registry = ModelRegistry(settings.mlflow.tracking_uri)
    version = settings.champion_version
    if version is None:
        version = registry.aliases(agent).get(CHAMPION) if agent in registry.agents() else None
    adapter = Path(challenger.adapter) if challenger.adapter else None
    deployer = Deployer(registry, triton, repository, options)
    with ExitStack() as stack:
        server = stack.enter_context(candidates_server(settings, triton))
        staged: dict[str, Candidate] = {}
        champion: ServedModel | None = None
        if version is not None and deployer.ready(agent, version):
            champion = _in_service(deployer, triton_url, agent, version)
        elif version is not None:
            log.info("%s version %d is not in service; staging it for the evaluation", agent,
                     version)  # fmt: skip
            registered = registry.version(agent, version)
            if registered.lineage.kind == "echo":
                raise ServingError(f"{agent} version {version} is an echo model: "
                                   "nothing to compare with")  # fmt: skip
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="spanmill-champion-"))
            base, champion_adapter, downloaded = weights_of(registered, registry, Path(scratch))
            staged["champion"] = Candidate(
                base, champion_adapter, downloaded, named=registered.lineage.base_model or ""
            )
        else:
            # No champion yet (the agent's first run): the base model stands in.
            log.info("%s has no champion in MLflow; comparing with the base model", agent)
            staged["champion"] = Candidate(challenger.base, named=challenger.base_named)
        staged["challenger"] = Candidate(challenger.base, adapter, named=challenger.base_named)
        if champion is not None and champion.flavour == "vllm":
            # One engine serves adapters of one base: the controller could not deploy a
            # challenger on another, whatever the comparison said.
            same_engine(champion.base_model or "", staged["challenger"])
        served = stack.enter_context(
            staged_candidates(
                server,
                repository,
                agent,
                staged,
                options,
                triton_url=server.url,
                owner=settings.owner,
            )
        )
        measured = champion or replace(served["champion"], registered=version)
        yield {"champion": measured, "challenger": served["challenger"]}


def _in_service(deployer: Deployer, triton_url: str, agent: str, version: int) -> ServedModel:
    """``version`` where the serving Triton holds it (in the vLLM flavour: its adapter of
    the agent's engine)."""
    from spanmill.registry import names

    model = names.triton_model(agent)
    engine = deployer.engine(agent)
    if engine is None:
        return ServedModel(triton_url, model, version, registered=version)
    if version not in engine.versions:
        raise ServingError(
            f"{agent} version {version} left its vLLM engine as the evaluation began (the "
            "controller retired it): run it again"
        )
    lora = engine.versions[version]
    return ServedModel(
        triton_url, model, version, flavour="vllm", lora_name=lora,
        base_model=engine.base_model, registered=version,
    )  # fmt: skip


@contextmanager
def candidates_server(settings: EvalSettings, triton: TritonFleet) -> Iterator[TritonControl]:
    """The Triton server the evaluation stages its candidates on, and sends their requests
    to: the evaluation's own (``candidates_url``) where there is one, else one serving pod,
    never all of them, so that a large or broken candidate takes memory and time from one
    pod's models at most."""
    if settings.candidates_url is not None:
        server = TritonControl(settings.candidates_url)
        try:
            yield server
        finally:
            server.close()
        return
    try:
        servers = triton.members()
    except SpanmillError as exc:
        raise ServingError(f"no Triton server to stage the challenger on: {exc}") from None
    if not servers:
        raise ServingError("no Triton server to stage the challenger on")
    yield min(servers, key=lambda server: server.pod or server.url)


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


def _run(
    plan: Plan,
    served: dict[str, ServedModel],
    settings: EvalSettings,
    progress: Progress | None,
) -> dict[str, dict[str, list[Outcome]]]:
    """role -> suite -> outcomes."""
    results: dict[str, dict[str, list[Outcome]]] = {role: {} for role in ROLES}
    if plan.instances and plan.task is not None:
        for role in ROLES:
            results[role]["tasks"] = play_episodes(
                served[role],
                plan.task,
                plan.instances,
                prompt_style=settings.prompt_style,
                max_new_tokens=settings.max_new_tokens,
                batch_size=settings.batch_size,
                progress=_counter(progress, f"{role} tasks", len(plan.instances)),
            )
    if plan.items:
        answers: dict[str, list[str]] = {}
        tokens: dict[str, list[int]] = {}
        for role in ROLES:
            answers[role], tokens[role] = answer(
                served[role],
                plan.items,
                max_new_tokens=settings.max_new_tokens,
                batch_size=settings.batch_size,
                progress=_counter(progress, f"{role} replay", len(plan.items)),
            )
        for role, outcomes in score(plan.items, answers, tokens, plan.evaluators).items():
            results[role]["replay"] = outcomes
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
    name: str, outcomes: dict[str, dict[str, list[Outcome]]], metric: str, settings: EvalSettings
) -> SuiteResult:
    """Both summaries, and the paired bootstrap of ``metric`` where the suite has it."""
    champion, challenger = _paired(outcomes["champion"][name], outcomes["challenger"][name])
    if "." in metric and not any(metric in o.scores for o in challenger):
        metric = "success_rate"  # an evaluator's metric, and this suite has no evaluators
    return SuiteResult(
        name=name,
        champion=Summary.of(champion),
        challenger=Summary.of(challenger),
        metric=metric,
        difference=bootstrap_difference(
            per_item(challenger, metric),
            per_item(champion, metric),
            resamples=settings.bootstrap_resamples,
            confidence=settings.confidence,
            seed=settings.seed,
        ),
    )


def _paired(
    champion: list[Outcome], challenger: list[Outcome]
) -> tuple[list[Outcome], list[Outcome]]:
    """Both models' outcomes with each evaluator metric kept on the items it scored for
    both: an evaluator that finds nothing to score in one model's answer (a failed
    generation) must not leave that model's mean over its good answers alone, nor pair
    one model's items with the other's by position."""
    names = {name for o in (*champion, *challenger) for name in o.scores}
    both = {
        name: {o.item_id for o in champion if name in o.scores}
        & {o.item_id for o in challenger if name in o.scores}
        for name in names
    }

    def kept(outcomes: list[Outcome]) -> list[Outcome]:
        return [
            replace(o, scores={k: v for k, v in o.scores.items() if o.item_id in both[k]})
            for o in outcomes
        ]

    return kept(champion), kept(challenger)


def _write(
    report: Comparison, outcomes: dict[str, dict[str, list[Outcome]]], output_dir: Path
) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    report.report().write(output_dir)
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
    (output_dir / REPORT_MD).write_text(markdown_page(report), encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
