"""``spanmill demo``: the whole system on this machine, narrated."""

from __future__ import annotations

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
def demo(
    n: int = typer.Option(30, "--n", min=1, help="Held-out calculator problems per prompt."),
    down: bool = typer.Option(False, help="Stop the stack at the end."),
) -> None:
    """Start the stack, serve SmolLM2 as the calculator agent's champion, run agent traffic."""
    from spanmill import demo as steps
    from spanmill import sdk
    from spanmill.config import KafkaSettings, StackSettings, load_settings
    from spanmill.stack.local import LocalStack
    from spanmill.tasks.runner import RunReport, run_agent

    settings = load_settings(StackSettings)
    console.rule("1. the embedded stack")
    with console.status("starting tansu, MLflow, tritonserver and the gateway…"):
        steps.start_stack(
            settings, on_started=lambda s: console.print(f"  [green]✓[/] {s.name:<8} {s.url}")
        )
    console.print("  (services already running are reused)")

    console.rule("2. the champion in service")
    with console.status("pulling SmolLM2-135M-Instruct and loading it into Triton…"):
        deployed = steps.serve_base_as_champion(settings)
    console.print(
        f"  [green]✓[/] Triton model {deployed.model} v{deployed.version} ← {deployed.base_model}"
    )

    console.rule("3. production traffic: the calculator agent through the gateway")
    kafka = KafkaSettings(bootstrap_servers=f"{settings.host}:{settings.kafka_port}")
    sdk.configure("spanmill-demo-agent", kafka=kafka, agent_name=steps.AGENT)
    gateway = f"http://{settings.host}:{settings.gateway_port}/v1"
    reports: list[RunReport] = []
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("success {task.fields[success]:.0%}"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console) as bar:
        for style in ("zero_shot", "few_shot"):
            job = bar.add_task(f"{style} prompt", total=n, success=0.0)
            wins = 0

            def tick(done: int, total: int, result: object, job: TaskID = job) -> None:
                nonlocal wins
                verdict = getattr(result, "verdict", None)
                wins += bool(verdict is not None and verdict.primary.value >= 1)
                bar.update(job, completed=done, success=wins / done)

            reports.append(
                run_agent(steps.AGENT, n, gateway, steps.AGENT, prompt_style=style, progress=tick)
            )
    sdk.force_flush()
    sdk.shutdown()

    table = Table("prompt", "success", "valid tool calls", "mean reward", "tokens/answer")
    for report in reports:
        table.add_row(
            report.prompt_style, f"{report.success_rate:.0%}", f"{report.valid_call_rate:.0%}",
            f"{report.mean_reward:.2f}", f"{report.mean_completion_tokens:.1f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"  spans on Kafka topic {kafka.spans_topic}: {steps.spans_on_topic(kafka)} messages"
    )
    console.print(f"  MLflow: http://{settings.host}:{settings.mlflow_port}   gateway: {gateway}")
    if down:
        LocalStack(settings).down()
        console.print("stack stopped")
    else:
        console.print("the stack keeps running: `spanmill status`, `spanmill down`")
