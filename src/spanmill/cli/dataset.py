"""``spanmill dataset build``: training data from the span store."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from spanmill.cli.console import console, handle_errors

app = typer.Typer(help="Datasets: build training data from stored spans.", no_args_is_help=True)


@app.callback()
def dataset() -> None:
    """Datasets: build training data from stored spans."""


@app.command()
@handle_errors
def build(
    out: Path = typer.Option(..., help="Folder for train.parquet, eval.parquet and card.json."),
    mode: str = typer.Option("sft", help="sft, preference or rl."),
    since: str = typer.Option(
        None, help="Window start, ISO 8601 or a time before now (-24h, -7d), inclusive."
    ),
    until: str = typer.Option(
        None, help="Window end, ISO 8601 or a time before now (-1h), exclusive."
    ),
    feedback_horizon_hours: float = typer.Option(
        72.0, help="Read rewards (late feedback) until this many hours after --until."
    ),
    store: str = typer.Option(None, help="Span store URL (default: the collector's)."),
    agent: str = typer.Option(None, help="Only calls of this agent."),
    service: str = typer.Option(None, help="Only calls recorded by this service."),
    model: str = typer.Option(None, help="Only calls answered by this model."),
    model_version: str = typer.Option(None, help="Only calls answered by this version."),
    reward: str = typer.Option(None, help="Reward to optimise (default: the primary one)."),
    credit: str = typer.Option("episode", help="episode, per_call or discounted."),
    discount: float = typer.Option(1.0, help="Discount per call, for --credit discounted."),
    min_reward: float = typer.Option(None, help="sft: keep samples at or above this reward."),
    max_reward: float = typer.Option(None, help="sft: keep samples at or below this reward."),
    weighting: str = typer.Option("uniform", help="sft: uniform, or weights from the reward."),
    max_tokens: int = typer.Option(None, help="Longest sample, prompt plus completion."),
    drop_examples: bool = typer.Option(False, help="Drop few-shot example turns (distillation)."),
    eval_fraction: float = typer.Option(0.1, help="Share of tasks held out."),
    min_train_rows: int = typer.Option(
        1, help="Fewest training rows: fewer fail the build, saying what each filter kept."
    ),
    trusted_producers: str = typer.Option(
        "",
        help="Producers whose spans count, comma-separated; empty: all but anonymous "
        "(spans from endpoints that asked no key); '*': every span.",
    ),
    jsonl: bool = typer.Option(False, help="Also write train.jsonl and eval.jsonl."),
) -> None:
    """Build a dataset from the spans of a time window."""
    from pydantic import ValidationError

    from spanmill.config import CollectorSettings, load_settings
    from spanmill.dataset.output import build_dataset
    from spanmill.dataset.spec import DatasetSpec
    from spanmill.errors import ConfigError
    from spanmill.producers import Trust

    try:
        spec = DatasetSpec(
            mode=mode, since=since, until=until, feedback_horizon_hours=feedback_horizon_hours,
            agent=agent, service=service, model=model,
            model_version=model_version, reward=reward, credit=credit, discount=discount,
            min_reward=min_reward, max_reward=max_reward, sft_weighting=weighting,
            max_tokens=max_tokens, drop_examples=drop_examples, eval_fraction=eval_fraction,
            min_train_rows=min_train_rows,
            trusted_producers=Trust.parse(trusted_producers).producers,
        )  # fmt: skip
    except ValidationError as exc:
        problems = "; ".join(f"--{'-'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid dataset options: {problems}") from None
    store_url = store or load_settings(CollectorSettings).store_url
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        job = bar.add_task("starting")
        card = build_dataset(
            store_url, out, spec, jsonl=jsonl,
            progress=lambda step: bar.update(job, description=step),
        )  # fmt: skip
    table = Table("step", "count")
    for step, value in card["counts"].items():
        table.add_row(step, str(value))
    console.print(table)
    console.print(f"[green]✓[/] {mode} dataset in {out} (content hash {card['content_hash'][:12]})")
