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
    from spanmill.logs import stacks_on_sigusr1

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
    stacks_on_sigusr1()
    # Per-request access lines would cost more than the proxying; metrics and spans
    # record every call instead.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        timeout_keep_alive=settings.keep_alive_s,
    )


@handle_errors
def gateway_key(
    key_id: str = typer.Argument(..., help="Who the key is for, e.g. support-agent."),
    keys_file: Path = typer.Option(
        None, help="Append the key's line to this keys file (SPANMILL_GATEWAY_CLIENT_KEYS_FILE)."
    ),
) -> None:
    """Make a client API key for the gateway: the key is printed once, only its hash is kept.

    Revoke it by deleting its line from the keys file; the gateway re-reads the file.
    """
    from spanmill.errors import ConfigError
    from spanmill.keys import key_line, new_key, parse_keys

    key = new_key()
    line = key_line(key_id, key)
    if keys_file is not None:
        existing = keys_file.read_text() if keys_file.exists() else ""
        if key_id in parse_keys(existing, str(keys_file)):
            raise ConfigError(f"{keys_file} already holds a key with id {key_id!r}")
        separator = "" if not existing or existing.endswith("\n") else "\n"
        keys_file.parent.mkdir(parents=True, exist_ok=True)
        with keys_file.open("a") as handle:
            handle.write(f"{separator}{line}\n")
        console.print(f"added {key_id!r} to {keys_file}")
    else:
        console.print(f"keys-file line (put it in the gateway's keys Secret):\n{line}")
    console.print("the key, shown this once:")
    typer.echo(key)
