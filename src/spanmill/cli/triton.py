"""``spanmill triton``: commands run beside a Triton server (its readiness probe)."""

from __future__ import annotations

from pathlib import Path

import typer

from spanmill.cli.console import console, err_console, handle_errors
from spanmill.errors import ConfigError

app = typer.Typer(help="Commands run beside a Triton server.", no_args_is_help=True)


@app.command()
@handle_errors
def ready(
    routing_file: Path = typer.Option(
        ..., help="The routing table (the routing ConfigMap mounted as a file)."
    ),
    url: str = typer.Option("127.0.0.1:8000", help="Triton's HTTP endpoint."),
    timeout: float = typer.Option(3.0, help="Seconds to wait for each answer from Triton."),
) -> None:
    """Exit 0 when Triton is ready and holds every version the routing table sends to.

    The Triton pods' readiness probe: a replica takes traffic only once the rollout
    controller has loaded the routed versions onto it (spanmill.serving.readiness).
    """
    from spanmill.serving.readiness import check, read_routes

    try:
        table = read_routes(routing_file)
    except ConfigError as exc:
        # A bad edit of the table must not take every replica out of service.
        err_console.print(f"ignoring the routing table: {exc}", highlight=False)
        from spanmill.gateway.routing import RoutingTable

        table = RoutingTable()
    check(url, table, timeout_s=timeout)
    console.print(f"ready for routing revision {table.revision}", highlight=False)
