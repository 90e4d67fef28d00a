"""``spanmill models``: base models in the local cache, and the agents' registered versions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from spanmill import paths
from spanmill.cli.console import console, handle_errors
from spanmill.contracts import EvalReport

if TYPE_CHECKING:
    from spanmill.registry import ModelRegistry

app = typer.Typer(
    help="Base models (pull, catalog) and registered versions (list, show, promote, rollback).",
    no_args_is_help=True,
)


@app.command()
@handle_errors
def pull(
    name: str = typer.Argument(..., help="A catalog name, e.g. smollm2-135m."),
    cache_dir: Path = typer.Option(None, help="Model cache (default: $SPANMILL_HOME/models)."),
    force: bool = typer.Option(False, help="Convert again even if the model is cached."),
) -> None:
    """Turn an offline base model into a Hugging Face folder in the local cache."""
    from spanmill.models import pull_model

    with console.status(f"pulling {name}…") as status:
        folder = pull_model(
            name,
            cache_dir or paths.models_dir(),
            force=force,
            progress=lambda message: status.update(f"{name}: {message}"),
        )
    console.print(f"[green]✓[/] {name} ready at {folder}")
    typer.echo(str(folder))


@app.command("catalog")
def catalog_cmd() -> None:
    """List the base models that can be pulled offline."""
    from spanmill.models.catalog import CATALOG

    table = Table("name", "source", "corresponds to")
    for name, entry in CATALOG.items():
        table.add_row(name, entry.distribution, entry.hf_id)
    console.print(table)


# -- registered versions -------------------------------------------------------------


def _registry(tracking_uri: str | None) -> ModelRegistry:
    from spanmill.config import MLflowSettings, load_settings
    from spanmill.registry import ModelRegistry

    uri = tracking_uri or load_settings(MLflowSettings).tracking_uri
    return ModelRegistry(uri)


_TRACKING = typer.Option(None, help="MLflow tracking URI (default SPANMILL_MLFLOW_TRACKING_URI).")


@app.command("list")
@handle_errors
def list_cmd(
    agent: str = typer.Argument(None, help="An agent: list its versions. None: every agent."),
    tracking_uri: str = _TRACKING,
) -> None:
    """List agents with their champion and challenger, or one agent's versions."""
    registry = _registry(tracking_uri)
    if agent is None:
        table = Table("agent", "champion", "challenger")
        for name in registry.agents():
            aliases = registry.aliases(name)
            table.add_row(name, str(aliases.get("champion", "-")),
                          str(aliases.get("challenger", "-")))  # fmt: skip
        console.print(table)
        return
    table = Table("version", "aliases", "kind", "rollout", "gate", "dataset", "created")
    for v in registry.versions(agent):
        tags = v.tags
        table.add_row(
            str(v.version),
            ", ".join(v.aliases) or "-",
            tags.get("spanmill.kind", "?"),
            tags.get("spanmill.rollout.status", "-"),
            tags.get("spanmill.gate.decision", "-"),
            (tags.get("spanmill.dataset.digest") or "-")[:12],
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(v.created_at)),
        )
    console.print(table)


@app.command()
@handle_errors
def show(
    agent: str = typer.Argument(..., help="The agent."),
    version: int = typer.Argument(None, help="A version (default: the champion)."),
    tracking_uri: str = _TRACKING,
) -> None:
    """Show a version: aliases, lineage, evaluation, and what the rollout did with it."""
    from spanmill.registry import CHAMPION, RegistryError

    registry = _registry(tracking_uri)
    if version is None:
        version = registry.aliases(agent).get(CHAMPION)
        if version is None:
            raise RegistryError(f"{agent!r} has no champion; name a version")
    v = registry.version(agent, version)
    console.print(f"[bold]{agent} version {v.version}[/] {', '.join(v.aliases)}")
    console.print(f"source: {v.source}  run: {v.run_id}")
    if v.description:
        console.print(v.description)
    table = Table("tag", "value")
    for key in sorted(v.tags):
        if not key.startswith("spanmill.rollout.event."):
            table.add_row(key, v.tags[key])
    console.print(table)
    for event in v.events():
        console.print(f"  {event}", highlight=False)


@app.command()
@handle_errors
def promote(
    agent: str = typer.Argument(..., help="The agent."),
    version: int = typer.Argument(..., help="The version to put in service."),
    canary: bool = typer.Option(
        False, help="Make it the challenger instead: the controller rolls it out step by step."
    ),
    reason: str = typer.Option("promoted by hand", help="Recorded on the version."),
    tracking_uri: str = _TRACKING,
) -> None:
    """Move the champion alias to a version (the controller switches traffic to it)."""
    registry = _registry(tracking_uri)
    if canary:
        registry.make_challenger(agent, version, reason=reason)
        console.print(f"[green]✓[/] {agent} version {version} is the challenger")
        return
    previous = registry.promote(agent, version, reason=reason)
    was = f" (was {previous})" if previous is not None and previous != version else ""
    console.print(f"[green]✓[/] {agent} version {version} is the champion{was}")


@app.command()
@handle_errors
def rollback(
    agent: str = typer.Argument(..., help="The agent."),
    to: int = typer.Option(None, help="Version to return the champion alias to."),
    reason: str = typer.Option("rolled back by hand", help="Recorded on the version."),
    tracking_uri: str = _TRACKING,
) -> None:
    """Stop the challenger's canary, or else return the champion to the previous one."""
    from spanmill.registry import CHAMPION

    registry = _registry(tracking_uri)
    rolled = registry.rollback(agent, to=to, reason=reason)
    champion = registry.aliases(agent).get(CHAMPION)
    console.print(f"[green]✓[/] {agent} version {rolled} rolled back; champion: {champion}")


@app.command("serve-base")
@handle_errors
def serve_base(
    agent: str = typer.Argument(..., help="The agent: the model name its calls ask for."),
    base_model: str = typer.Option(
        ...,
        help="What answers until a trained version replaces it: a model folder, a "
        "catalog name (smollm2-135m), a Hugging Face id or an s3:// folder.",
    ),
    tracking_uri: str = _TRACKING,
) -> None:
    """Register a base model as the agent's first version and make it the champion; the
    rollout controller deploys it and routes the agent's name to it. An agent with a
    champion is left as it is."""
    from spanmill.models.resolve import resolve_model

    resolve_model(base_model)  # refused now, by name, rather than at the controller's load
    version, new = _registry(tracking_uri).serve_base(agent, base_model)
    if new:
        console.print(f"[green]✓[/] {agent} version {version}: {base_model}, the champion")
    else:
        console.print(f"{agent} has a champion already: version {version}; nothing changed")
    typer.echo(str(version))


@app.command()
@handle_errors
def register(
    agent: str = typer.Argument(..., help="The agent the model serves."),
    folder: Path = typer.Argument(..., help="The adapter (or merged model) folder training wrote."),
    metrics: Path = typer.Option(None, help="The evaluation's metrics.json (gate decision)."),
    pipeline_run: str = typer.Option(None, help="The pipeline run that made it."),
    base_model: str = typer.Option(None, help="Base model, when training's manifest is absent."),
    tracking_uri: str = _TRACKING,
) -> None:
    """Register a trained version with its lineage; it becomes the challenger if the gate passed."""
    registry = _registry(tracking_uri)
    evaluation = EvalReport.load(metrics) if metrics else None
    result = registry.register_trained(
        agent, folder, evaluation, pipeline_run_id=pipeline_run, base_model=base_model
    )
    alias = " and is the challenger" if result.challenger else " (gate not passed: no alias)"
    console.print(f"[green]✓[/] registered {agent} version {result.version.version}{alias}")
    typer.echo(str(result.version.version))


@app.command()
@handle_errors
def users(
    controller: Path = typer.Option(
        None, help="Folder with the controller user's username and password files (a Secret)."
    ),
    pipeline: Path = typer.Option(
        None, help="Folder with the pipeline user's username and password files (a Secret)."
    ),
    wait: float = typer.Option(300.0, help="Seconds to wait for the server to come up."),
    tracking_uri: str = _TRACKING,
) -> None:
    """Create or update spanmill's own MLflow users and their grants (basic auth).

    Signs in as the admin from MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD.
    """
    from spanmill.config import MLflowSettings, load_settings
    from spanmill.errors import ConfigError
    from spanmill.registry.users import ensure_users, user_from_folder, wait_for_server

    given = {"controller": controller, "pipeline": pipeline}
    found = [user_from_folder(role, folder) for role, folder in given.items() if folder]
    if not found:
        raise ConfigError("name at least one user: --controller and/or --pipeline")
    uri = tracking_uri or load_settings(MLflowSettings).tracking_uri
    wait_for_server(uri, wait)
    for line in ensure_users(uri, found):
        console.print(f"[green]✓[/] {line}", highlight=False)
