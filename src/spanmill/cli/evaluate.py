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
    dataset: Path = typer.Argument(..., help="Dataset folder; its eval split is one suite."),
    challenger: str = typer.Argument(..., help="Adapter or model folder to judge."),
    output: Path = typer.Argument(..., help="Folder for metrics.json and the report."),
    champion: str = typer.Option(None, help="The model in service; default: the base model."),
    task: str = typer.Option(None, help="Task whose verifier scores; default: the dataset's."),
    instances: int = typer.Option(None, min=0, help="Fresh held-out task instances."),
    samples: int = typer.Option(None, min=0, help="Eval-split samples, at most."),
    margin: float = typer.Option(None, min=0.0, max=1.0, help="Required improvement."),
    batch_size: int = typer.Option(None, min=1, help="Episodes generated together."),
    track: bool = typer.Option(None, help="Log to MLflow (SPANMILL_MLFLOW_*)."),
    fail_on_reject: bool = typer.Option(False, help="Exit 3 when the gate rejects."),
) -> None:
    """Generate with CHALLENGER and the champion, score, compare, and decide."""
    from spanmill.config import load_settings
    from spanmill.evaluate import EvalSettings
    from spanmill.evaluate import evaluate as run_evaluation

    given = {
        "champion": champion,
        "task": task,
        "instances": instances,
        "dataset_samples": samples,
        "batch_size": batch_size,
        "track": track,
    }
    settings = load_settings(EvalSettings, **{k: v for k, v in given.items() if v is not None})
    if margin is not None:
        settings = settings.model_copy(
            update={"gate": settings.gate.model_copy(update={"margin": margin})}
        )

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
    colour = "green" if report.decision.promote else "red"
    console.print(f"[bold {colour}]gate: {report.decision.verdict}[/]")
    for reason in report.decision.reasons:
        console.print(f"  {reason}")
    console.print(f"report: {output / 'report.html'}")
    if fail_on_reject and not report.decision.promote:
        raise typer.Exit(3)
