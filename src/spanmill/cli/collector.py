"""``spanmill collector``: run the collector, the span topic into the span store."""

from __future__ import annotations

import typer

from spanmill.cli.console import console, handle_errors
from spanmill.config import CollectorSettings, load_settings


@handle_errors
def collector(
    store: str = typer.Option(
        None, help="Span store: a folder or fsspec URL (default SPANMILL_COLLECTOR_STORE_URL)."
    ),
    group_id: str = typer.Option(
        None, help="Consumer group (default SPANMILL_COLLECTOR_GROUP_ID)."
    ),
    http_port: int = typer.Option(
        None, help="OTLP/HTTP, /metrics and health port (default SPANMILL_COLLECTOR_HTTP_PORT)."
    ),
    workers: int = typer.Option(
        None, help="Decode-and-write processes (default SPANMILL_COLLECTOR_WORKERS)."
    ),
) -> None:
    """Consume spans from Kafka into Parquet: redacted, exactly once, offsets committed after."""
    from spanmill.collector.run import run_collector
    from spanmill.logs import configure_logging, stacks_on_sigusr1

    overrides = {
        key: value
        for key, value in {
            "store_url": store,
            "group_id": group_id,
            "http_port": http_port,
            "workers": workers,
        }.items()
        if value is not None
    }
    settings = load_settings(CollectorSettings, **overrides)
    console.print(
        f"collector: {settings.kafka.bootstrap_servers}/{settings.kafka.spans_topic} "
        f"(group {settings.group_id}) → {settings.store_url}; "
        f"http://{settings.http_host}:{settings.http_port} (/v1/traces, /metrics, /readyz)"
    )
    configure_logging()
    stacks_on_sigusr1()
    run_collector(settings)
