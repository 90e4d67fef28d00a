"""``spanmill evaluate``: the challenger against the champion, and the gate's decision."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from spanmill.cli.console import console, handle_errors


@handle_errors
def evaluate(
    dataset: Path = typer.Argument(..., help="Dataset folder; its eval split is replayed."),
    challenger: str = typer.Argument(..., help="Adapter or model folder to judge."),
    output: Path = typer.Argument(..., help="Folder for metrics.json and the report."),
    agent: str = typer.Option(
        None, help="The agent whose champion it faces; default: the dataset's."
    ),
    champion_version: int = typer.Option(
        None, min=1, help="Registered version; default: champion."
    ),
    task: str = typer.Option(None, help="Task plugin whose verifier scores; default: the agent's."),
    instances: int = typer.Option(None, min=0, help="Fresh held-out task instances."),
    replay_items: int = typer.Option(None, min=0, help="Eval-split calls replayed, at most."),
    evaluator: list[str] = typer.Option(None, help="Evaluator of the replay (repeat for more)."),
    judge_url: str = typer.Option(None, help="The judge's OpenAI-compatible base URL."),
    judge_model: str = typer.Option(None, help="The model the judge endpoint serves."),
    gate_metric: str = typer.Option(
        None, help="The metric that decides, e.g. tool_calls.name_args."
    ),
    margin: float = typer.Option(None, min=0.0, max=1.0, help="Required improvement."),
    require_significant: bool = typer.Option(
        None, help="Also require the difference's 95% interval to exclude 0."
    ),
    batch_size: int = typer.Option(None, min=1, help="Requests sent together."),
    track: bool = typer.Option(None, help="Log to MLflow (SPANMILL_MLFLOW_*)."),
    fail_on_reject: bool = typer.Option(False, help="Exit 3 when the gate rejects."),
) -> None:
    """Answer with CHALLENGER and the champion through Triton, score, compare, and decide.

    Triton and MLflow come from SPANMILL_TRITON_* and SPANMILL_MLFLOW_*; the judge's
    key from SPANMILL_EVAL_JUDGE_API_KEY.
    """
    from spanmill.config import load_settings
    from spanmill.evaluate import EvalSettings
    from spanmill.evaluate import evaluate as run_evaluation

    given = {
        "agent": agent,
        "champion_version": champion_version,
        "task": task,
        "instances": instances,
        "replay_items": replay_items,
        "evaluators": evaluator or None,
        "judge_url": judge_url,
        "judge_model": judge_model,
        "batch_size": batch_size,
        "track": track,
    }
    settings = load_settings(EvalSettings, **{k: v for k, v in given.items() if v is not None})
    try:
        settings = settings.with_gate(
            margin=margin, metric=gate_metric, require_significant=require_significant
        )
    except ValueError as exc:  # pydantic's ValidationError names the field
        raise typer.BadParameter(str(exc)) from None

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        bars: dict[str, TaskID] = {}

        def advance(phase: str, done: int, total: int) -> None:
            if phase not in bars:
                bars[phase] = progress.add_task(phase, total=total)
            progress.update(bars[phase], completed=done)

        report = run_evaluation(dataset, challenger, output, settings, progress=advance)

    table = Table("suite", "model", "n", "success", "format valid", "tokens/answer")
    for suite in report.suites.values():
        for role in ("champion", "challenger"):
            s = getattr(suite, role)
            table.add_row(
                suite.name,
                f"{role}: {report.models[role].label}",
                str(s.n),
                f"{s.success_rate:.3f}",
                f"{s.format_validity:.3f}",
                f"{s.tokens_per_answer:.1f}",
            )
        d = suite.difference
        table.add_row(
            suite.name, "difference", "", f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
        )
    console.print(table)
    for suite in report.suites.values():
        for name, value in suite.challenger.scores.items():
            console.print(
                f"  {suite.name} {name}: champion {suite.champion.scores.get(name, 0.0):.3f}, "
                f"challenger {value:.3f}"
            )
    colour = "green" if report.decision.promote else "red"
    console.print(f"[bold {colour}]gate: {report.decision.verdict}[/]")
    for reason in report.decision.reasons:
        console.print(f"  {reason}")
    console.print(f"report: {output / 'report.html'}")
    if fail_on_reject and not report.decision.promote:
        raise typer.Exit(3)
