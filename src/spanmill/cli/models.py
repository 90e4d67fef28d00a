"""``spanmill models``: base models in the local cache (registered versions come later)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from spanmill import paths
from spanmill.cli.console import console, handle_errors

app = typer.Typer(
    help="Base models: pull offline models into the local cache.", no_args_is_help=True
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
