"""``spanmill rollout``: run the rollout controller, or see where each agent's rollout stands."""

from __future__ import annotations

import logging
import time

import typer
from rich.table import Table

from spanmill.cli.console import console, handle_errors
from spanmill.config import RolloutSettings, load_settings

app = typer.Typer(
    help="The rollout controller: canary, promote or roll back what the MLflow aliases name.",
    invoke_without_command=True,
)


@app.callback()
@handle_errors
def rollout(
    ctx: typer.Context,
    once: bool = typer.Option(False, help="Reconcile once, print the decisions, and exit."),
    backend: str = typer.Option(
        None, help="local or kubernetes (default SPANMILL_ROLLOUT_BACKEND)."
    ),
    interval: float = typer.Option(
        None, help="Seconds between passes (SPANMILL_ROLLOUT_INTERVAL_S)."
    ),
) -> None:
    """Run the controller until stopped (every setting: SPANMILL_ROLLOUT_*)."""
    if ctx.invoked_subcommand is not None:
        return
    overrides = {
        k: v for k, v in {"backend": backend, "interval_s": interval}.items() if v is not None
    }
    settings = load_settings(RolloutSettings, **overrides)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from spanmill.logs import stacks_on_sigusr1
    from spanmill.rollout.service import bounded_mlflow, build_reconciler, run

    if once:
        reconciler = build_reconciler(settings)
        reconciler.deploy_wait_s = None  # one pass: each deployment it begins, it ends
        try:
            with bounded_mlflow(settings):
                decisions = reconciler.tick()
        finally:
            reconciler.close()
        for decision in decisions:
            console.print(decision.message(), highlight=False)
        return
    triton = (
        settings.triton.http_url
        if settings.triton.discovery == "none"
        else f"every pod of {settings.triton.namespace}/{settings.triton.pods_service}"
    )
    console.print(
        f"rollout controller: MLflow {settings.mlflow.tracking_uri}, Triton "
        f"{triton}, {settings.backend} backend, steps {settings.steps}, "
        f"bake {settings.bake_s:g}s; metrics on http://{settings.http_host}:{settings.http_port}"
    )
    stacks_on_sigusr1()
    run(settings)


@app.command()
@handle_errors
def status(
    events: int = typer.Option(10, help="Recent decisions to show (local backend)."),
) -> None:
    """Where each agent's rollout stands, from the controller's persisted state."""
    from spanmill.rollout.local_backend import LocalBackend
    from spanmill.rollout.service import backend_of, policy_of

    settings = load_settings(RolloutSettings)
    backend = backend_of(settings)
    state, table = backend.load()
    policy = policy_of(settings)
    rows = Table("agent", "phase", "champion", "challenger", "challenger share", "since")
    from spanmill.rollout.decide import challenger_weight

    for name, agent in sorted(state.agents.items()):
        since = agent.step_started_at or agent.updated_at
        rows.add_row(
            name,
            agent.phase.value,
            str(agent.champion or "-"),
            str(agent.challenger or "-"),
            f"{challenger_weight(agent, policy):g}%",
            time.strftime("%H:%M:%S", time.localtime(since)),
        )
    console.print(rows)
    console.print(f"routing table revision {table.revision} ({backend.describe()})")
    if isinstance(backend, LocalBackend):
        for decision in backend.events(events):
            stamp = time.strftime("%H:%M:%S", time.localtime(decision.at))
            console.print(f"{stamp} {decision.message()}", highlight=False)
