"""The ``spanmill`` entry point.

Each command group lives in its own module; later groups (collector, gateway,
rollout, pipeline, demo) register here the same way.
"""

from __future__ import annotations

import contextlib

import typer

from spanmill import __version__
from spanmill.cli import (
    agent,
    collector,
    dataset,
    demo,
    evaluate,
    gateway,
    models,
    pipeline,
    rollout,
    spans,
    stack,
    store,
    train,
    triton,
)
from spanmill.config import MLflowSettings

app = typer.Typer(
    name="spanmill",
    help="Turn the traces of agents in production into better models, continuously.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

app.command()(stack.up)
app.command()(stack.down)
app.command()(stack.status)
app.command()(gateway.gateway)
app.command(name="gateway-key")(gateway.gateway_key)
app.command()(demo.demo)
app.add_typer(models.app, name="models")
app.add_typer(agent.app, name="agent")
app.add_typer(dataset.app, name="dataset")


@app.callback()
def main() -> None:
    """Turn the traces of agents in production into better models, continuously."""
    # Every command's MLflow calls bounded (spanmill.registry.bounds); the controller
    # bounds its own tighter. A malformed setting is left for the command to report.
    with contextlib.suppress(ValueError):
        MLflowSettings().bound_requests()


app.command()(collector.collector)
app.add_typer(spans.app, name="spans")
app.add_typer(store.app, name="store")
app.add_typer(rollout.app, name="rollout")
app.add_typer(pipeline.app, name="pipeline")
app.add_typer(triton.app, name="triton")
app.command()(train.train)
app.command()(evaluate.evaluate)


@app.command()
def version() -> None:
    """Print the spanmill version."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
