"""``spanmill triton``: commands run beside a Triton server (its readiness probe)."""

from __future__ import annotations

from pathlib import Path

import typer

from spanmill.cli.console import console, handle_errors

app = typer.Typer(help="Commands run beside a Triton server.", no_args_is_help=True)


@app.command()
@handle_errors
def ready(
    routing_file: Path = typer.Option(
        ..., help="The routing table (the routing ConfigMap mounted as a file)."
    ),
    url: str = typer.Option("127.0.0.1:8000", help="Triton's HTTP endpoint."),
    timeout: float = typer.Option(3.0, help="Seconds to wait for each answer from Triton."),
    serve: int = typer.Option(
        0,
        help="Answer GET /ready on this port (200 ready, 503 not) until stopped, where "
        "0 checks once and exits.",
        min=0,
        max=65535,
    ),
) -> None:
    """Exit 0 when Triton is ready and holds every version the routing table sends to.

    What the Triton pods' readiness probe asks (with --serve, in a container beside
    Triton): a replica takes traffic only once the rollout controller has loaded the
    routed versions onto it (spanmill.serving.readiness).
    """
    from spanmill.serving import readiness

    if serve:
        from spanmill.logs import configure_logging

        configure_logging()
        readiness.serve(url, routing_file, serve, timeout_s=timeout)
        return
    console.print(readiness.judge(url, routing_file, timeout_s=timeout), highlight=False)
