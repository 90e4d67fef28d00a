"""``spanmill gateway``: run the OpenAI-compatible gateway in front of Triton."""

from __future__ import annotations

from pathlib import Path

import typer

from spanmill.cli.console import console, handle_errors
from spanmill.config import GatewaySettings, load_settings


@handle_errors
def gateway(
    host: str = typer.Option(None, help="Bind address (default SPANMILL_GATEWAY_HOST)."),
    port: int = typer.Option(None, help="Port (default SPANMILL_GATEWAY_PORT)."),
    routing_file: Path = typer.Option(None, help="Routing table JSON, re-read on change."),
) -> None:
    """Serve /v1/chat/completions, routing to Triton and emitting an LLM span per call."""
    import uvicorn

    from spanmill.gateway.app import create_app

    overrides = {
        k: v
        for k, v in {"host": host, "port": port, "routing_file": routing_file}.items()
        if v is not None
    }
    settings = load_settings(GatewaySettings, **overrides)
    console.print(
        f"gateway on http://{settings.host}:{settings.port} → Triton {settings.triton.http_url}, "
        f"spans → {settings.kafka.bootstrap_servers}/{settings.kafka.spans_topic}"
    )
    # Per-request access lines would cost more than the proxying; metrics and spans
    # record every call instead.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
    )
