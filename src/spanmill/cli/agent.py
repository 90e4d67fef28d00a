"""``spanmill agent``: run a sample agent against the gateway (or any OpenAI endpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spanmill.cli.console import console, err_console, handle_errors

if TYPE_CHECKING:
    from spanmill.config import KafkaSettings
    from spanmill.tasks.runner import RunReport

app = typer.Typer(help="Sample agents: run a task's episodes and score them.", no_args_is_help=True)


@app.callback()
def agent() -> None:
    """Sample agents: run a task's episodes against an OpenAI-compatible endpoint."""


@app.command()
@handle_errors
def run(
    task: str = typer.Argument(..., help="The task to run, e.g. calculator."),
    n: int = typer.Option(20, "--n", min=1, help="Number of episodes (one instance each)."),
    base_url: str = typer.Option(
        None, help="OpenAI-compatible base URL (default: the gateway's, http://HOST:PORT/v1)."
    ),
    model: str = typer.Option(None, help="Model name to ask for (default: the task's agent)."),
    split: str = typer.Option("heldout", help="Instances from: train or heldout."),
    prompt: str = typer.Option("zero_shot", help="Prompt style: zero_shot or few_shot."),
    temperature: float = typer.Option(0.0, min=0.0, help="Sampling temperature."),
    seed: int = typer.Option(0, help="Seed that picks the instances."),
    concurrency: int = typer.Option(1, min=1, help="Episodes run at once."),
    max_tokens: int = typer.Option(128, min=1, help="Most tokens per LLM call."),
    export: bool = typer.Option(
        True, help="Send the episodes' spans to Kafka (SPANMILL_KAFKA_* settings)."
    ),
) -> None:
    """Run N episodes of TASK and print the success rate and the other rewards."""
    from spanmill import sdk
    from spanmill.config import GatewaySettings, KafkaSettings, load_settings
    from spanmill.tasks import TaskError, get_task
    from spanmill.tasks.base import PROMPT_STYLES, SPLITS
    from spanmill.tasks.runner import run_agent

    if split not in SPLITS:
        raise TaskError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
    if prompt not in PROMPT_STYLES:
        raise TaskError(f"--prompt must be one of {', '.join(PROMPT_STYLES)}, got {prompt!r}")
    chosen = get_task(task)
    gateway = load_settings(GatewaySettings)
    url = base_url or f"http://{gateway.host}:{gateway.port}/v1"
    api_key = gateway.api_key.get_secret_value() if gateway.api_key else None
    exporter = None
    if export:
        kafka = load_settings(KafkaSettings)
        _check_reachable(kafka)
        exporter = sdk.KafkaSpanExporter(kafka)
        sdk.configure(
            f"spanmill-agent-{chosen.name}", agent_name=chosen.agent_name, exporter=exporter
        )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("success {task.fields[success]:.0%}"),
        TimeElapsedColumn(),
    )
    successes = 0
    try:
        with Progress(*columns, console=console, transient=False) as bar:
            job = bar.add_task(f"{chosen.name} ({prompt})", total=n, success=0.0)

            def advance(done: int, total: int, result: object) -> None:
                nonlocal successes
                successes += int(getattr(result, "reward", 0.0) >= 1.0)
                bar.update(job, completed=done, success=successes / done)

            report = run_agent(
                chosen,
                n,
                url,
                model or chosen.agent_name,
                split=split,
                prompt_style=prompt,
                temperature=temperature,
                max_tokens=max_tokens,
                seed=seed,
                concurrency=concurrency,
                api_key=api_key,
                progress=advance,
            )
    finally:
        if export:
            sdk.shutdown()
    _print_report(report)
    if exporter is not None and exporter.failed_spans:
        err_console.print(
            f"[yellow]warning:[/] {exporter.failed_spans} spans could not be sent to Kafka at "
            f"{exporter.settings.bootstrap_servers} (topic {exporter.topic}); is the stack up "
            "(spanmill up)? Pass --no-export to run without traces.",
            highlight=False,
        )


def _check_reachable(kafka: KafkaSettings) -> None:
    """Fail before the first episode rather than lose every span to a broker that is down."""
    from spanmill.stack.ports import can_connect
    from spanmill.tasks.runner import AgentRunError

    for server in kafka.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if can_connect(host.strip("[]"), int(port), timeout=2.0):
            return
    raise AgentRunError(
        f"cannot reach Kafka at {kafka.bootstrap_servers} to send the episodes' spans; start "
        "the stack (spanmill up), set SPANMILL_KAFKA_BOOTSTRAP_SERVERS, or pass --no-export"
    )


def _print_report(report: RunReport) -> None:
    table = Table(title=f"{report.task} on {report.model}")
    for column in ("split", "prompt", "episodes", "success", "valid call", "mean reward"):
        table.add_column(column, justify="right")
    table.add_column("completion tokens", justify="right")
    table.add_column("errors", justify="right")
    table.add_row(
        report.split,
        report.prompt_style,
        str(report.n),
        f"{report.success_rate:.1%}",
        f"{report.valid_call_rate:.1%}",
        f"{report.mean_reward:.3f}",
        f"{report.mean_completion_tokens:.1f}",
        str(report.errors),
    )
    console.print(table)
    failed = [episode for episode in report.episodes if episode.error]
    for episode in failed[:3]:
        err_console.print(f"[red]episode {episode.instance.id} failed:[/] {episode.error}")
