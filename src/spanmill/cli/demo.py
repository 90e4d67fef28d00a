"""``spanmill demo``: the loop turns once on this machine, narrated."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

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

from spanmill.cli.console import console, handle_errors, heading
from spanmill.demo import DemoPlan

steps_plan = DemoPlan()  # the sizes the options default to


def _episodes(bar: Progress, label: str, n: int | None) -> Any:
    """A progress line for episodes; ``n`` None while the count is open-ended."""
    job: TaskID = bar.add_task(label, total=n, success=0.0)
    wins = 0

    def tick(done: int, total: int | None, result: Any) -> None:
        nonlocal wins
        verdict = getattr(result, "verdict", None)
        wins += bool(verdict is not None and verdict.primary.value >= 1)
        bar.update(job, completed=done, success=wins / done)

    return tick


def _bar() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("success {task.fields[success]:.0%}"), TimeElapsedColumn(), console=console,
    )  # fmt: skip


@handle_errors
def demo(
    episodes: int = typer.Option(
        steps_plan.traffic_episodes, help="Production episodes (few-shot prompt, train tasks)."
    ),
    eval_n: int = typer.Option(
        steps_plan.eval_episodes, "--eval-n", help="Held-out problems measured before/after."
    ),
    max_steps: int = typer.Option(steps_plan.max_steps, help="LoRA training steps."),
    concurrency: int = typer.Option(
        steps_plan.concurrency, min=1, help="Episodes in flight at once."
    ),
    down: bool = typer.Option(False, help="Stop the stack at the end."),
) -> None:
    """Stack up, SmolLM2 in service, agent traffic, the flywheel, a rollout, before/after."""
    from spanmill import demo as steps
    from spanmill import sdk
    from spanmill.config import StackSettings, load_settings
    from spanmill.registry import CHAMPION, ModelRegistry
    from spanmill.rollout.schemas import Phase
    from spanmill.stack.local import LocalStack

    started = time.monotonic()
    settings = load_settings(StackSettings)
    plan = steps.DemoPlan(eval_episodes=eval_n, traffic_episodes=episodes, max_steps=max_steps,
                          concurrency=concurrency)  # fmt: skip
    urls = steps.stack_urls(settings)

    heading("1. the embedded stack")
    with console.status("starting tansu, MLflow, tritonserver, the gateway and the collector…"):
        steps.start_stack(
            settings, on_started=lambda s: console.print(f"  [green]✓[/] {s.name:<9} {s.url}")
        )

    heading("2. SmolLM2-135M-Instruct as the calculator agent's champion")
    with console.status("registering the base model in MLflow; the controller serves it…"):
        v1 = steps.serve_base_as_champion(settings)
        steps.reconcile_until(
            settings, lambda st: st.champion == v1 and st.phase == Phase.STABLE, timeout_s=300
        )
    console.print(f"  [green]✓[/] {steps.AGENT} v{v1} is champion and serves all traffic")

    sdk.configure("calculator-agent", kafka=steps.kafka_settings(settings), agent_name=steps.AGENT)
    heading("3. before: the short zero-shot prompt on held-out problems")
    with _bar() as bar:
        tick = _episodes(bar, "zero-shot, base", plan.eval_episodes)
        before = steps.run_agent(settings, plan.eval_episodes, split="heldout",
                                 prompt_style="zero_shot", concurrency=plan.concurrency,
                                 progress=tick)  # fmt: skip

    heading("4. production traffic: the few-shot prompt, spans through Kafka")
    with _bar() as bar:
        tick = _episodes(bar, "few-shot, production", plan.traffic_episodes)
        steps.run_agent(settings, plan.traffic_episodes, split="train", prompt_style="few_shot",
                        concurrency=plan.concurrency, progress=tick)  # fmt: skip
    sdk.force_flush()
    stored = steps.wait_for_spans(settings, plan.traffic_episodes * 4)
    console.print(f"  [green]✓[/] {stored} spans in the store at {settings.span_store}")

    heading("5. the flywheel pipeline (kfp local runner)")
    root = Path(settings.state_dir) / "pipeline-root"
    with console.status("build_dataset → train_lora → evaluate → register…"):
        steps.run_flywheel(settings, plan, root)
    registry = ModelRegistry(urls["mlflow"])
    desired = registry.desired(steps.AGENT)
    if desired.challenger is None:
        console.print("[yellow]the gate kept the champion: no challenger this turn[/]")
        raise typer.Exit(1)
    console.print(f"  [green]✓[/] v{desired.challenger} registered as challenger")

    heading("6. rollout: the controller deploys it, runs a canary, then promotes")
    with _bar() as bar:
        canary = _episodes(bar, "canary traffic", None)
        done = {"n": 0}

        def traffic() -> None:
            report = steps.run_agent(
                settings,
                plan.concurrency,
                split="heldout",
                prompt_style="zero_shot",
                concurrency=plan.concurrency,
            )
            for _ in report.episodes:
                done["n"] += 1
                canary(done["n"], None, _)

        _, decisions = steps.reconcile_until(
            settings,
            lambda st: st.phase == Phase.STABLE and st.challenger is None,
            traffic=traffic,
        )
    new_champion = registry.aliases(steps.AGENT).get(CHAMPION)
    promoted = new_champion == desired.challenger
    for decision in decisions:
        if decision.version == desired.challenger:
            console.print(f"  {decision.action:<8} {decision.reason}")
    mark, outcome = ("[green]✓[/]", "promoted") if promoted else ("[yellow]✗[/]", "rolled back")
    console.print(f"  {mark} v{desired.challenger} {outcome}")

    heading("7. after: the same held-out problems")
    with _bar() as bar:
        tick = _episodes(bar, f"zero-shot, v{new_champion}", plan.eval_episodes)
        after = steps.run_agent(settings, plan.eval_episodes, split="heldout",
                                prompt_style="zero_shot", concurrency=plan.concurrency,
                                progress=tick)  # fmt: skip
    sdk.force_flush()
    sdk.shutdown()

    table = Table("held-out, zero-shot prompt", "success", "valid tool calls", "mean reward",
                  "tokens/answer")  # fmt: skip
    for label, report in ((f"before (v{v1}, base)", before),
                          (f"after (v{new_champion})", after)):  # fmt: skip
        table.add_row(
            label, f"{report.success_rate:.0%}", f"{report.valid_call_rate:.0%}",
            f"{report.mean_reward:.2f}", f"{report.mean_completion_tokens:.1f}",
        )  # fmt: skip
    console.print(table)
    console.print(f"  MLflow:     {urls['mlflow']}/#/models/{steps.AGENT}")
    console.print(f"  span store: {settings.span_store}")
    console.print(f"              {here('spanmill spans stats')}", soft_wrap=True)
    console.print(f"  pipeline:   {root}")
    console.print(f"  took {(time.monotonic() - started) / 60:.1f} minutes")
    if down:
        LocalStack(settings).down()
        console.print("stack stopped")
    else:
        console.print("the stack keeps running; to look at it, and to stop it:")
        for command in ("spanmill status", "spanmill down"):
            console.print(f"  {here(command)}", soft_wrap=True)


def here(command: str) -> str:
    """``command`` as typed in another shell to reach this run's stack: with the
    ``SPANMILL_HOME`` it ran under (``make`` sets one inside the checkout)."""
    configured = os.environ.get("SPANMILL_HOME", "").strip()
    return f"SPANMILL_HOME={shlex.quote(configured)} {command}" if configured else command
