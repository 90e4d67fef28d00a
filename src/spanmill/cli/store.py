"""``spanmill store``: compaction, retention and erasure of the span store, and SQL over it."""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spanmill.cli.console import console, handle_errors

app = typer.Typer(
    help="The span store: compaction, retention, erasure on request, SQL.", no_args_is_help=True
)


# How far back `spanmill store compact` joins calls before compacting.
JOIN_HOURS = 24


def _settings(store: str | None) -> Any:
    from spanmill.config import StoreSettings, load_settings

    return load_settings(StoreSettings, **({"url": store} if store else {}))


@app.command()
@handle_errors
def compact(
    store: str = typer.Option(None, help="Span store URL (default SPANMILL_STORE_URL)."),
    settle_seconds: float = typer.Option(
        None, help="Compact hours that ended this long ago (default SPANMILL_STORE_SETTLE_SECONDS)."
    ),
) -> None:
    """Rewrite closed hours' small files as a few large ones, delete expired hours, and
    carry out pending erasure requests. Readers stay exact throughout; safe to kill."""
    from spanmill.store.compact import Compactor
    from spanmill.store.policy import StorePolicy

    settings = _settings(store)
    compactor = Compactor(
        settings.url,
        settings.storage_options,
        policy=StorePolicy(
            retention_days=settings.retention_days,
            user_id_attribute=settings.user_id_attribute,
        ),
        settle_s=settings.settle_seconds if settle_seconds is None else settle_seconds,
        target_rows=settings.target_rows,
        stale_s=settings.stale_seconds,
    )
    # Calls joined first: the links are records of their own, which compaction keeps.
    # Never from before the store's horizon (a retention of a day or less).
    since = datetime.now(UTC) - timedelta(hours=JOIN_HOURS)
    horizon = compactor.policy.horizon(datetime.now(UTC))
    _print_join(_join(settings, since=max(since, horizon) if horizon is not None else since))
    with Progress(
        TextColumn("hours"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("hours", total=None)
        report = compactor.run(
            lambda done, total: progress.update(task, completed=done, total=total)
        )
    console.print(
        f"{report.hours_seen} hours: {report.hours_compacted} compacted "
        f"({report.files_before} files to {report.files_after}), {report.hours_expired} expired, "
        f"{report.files_deleted} files deleted, "
        f"{len(report.erasures_applied)} erasures applied "
        f"({sum(report.spans_erased.values())} spans), "
        f"{len(report.erasure_hashes_removed)} erased subjects' hashes removed, "
        f"{report.dead_letters_deleted} dead "
        f"letters deleted, {report.link_files_merged} links files merged in "
        f"{report.seconds:.1f} s"
    )


@app.command()
@handle_errors
def join(
    store: str = typer.Option(None, help="Span store URL (default SPANMILL_STORE_URL)."),
    since: str = typer.Option("24h", help="Window start: 30m, 24h, 7d, an ISO time, or ''."),
    until: str = typer.Option("", help="Window end: 30m (ago), an ISO time, or '' for now."),
) -> None:
    """Join the gateway's calls that came without their caller's trace context to the
    agent episodes they belong to, by content and time (see spanmill.store.links).
    Idempotent; `spanmill store compact` and the dataset builder run it too."""
    from spanmill.cli.spans import _since

    _print_join(_join(_settings(store), since=_since(since), until=_since(until)))


def _join(settings: Any, *, since: datetime | None, until: datetime | None = None) -> Any:
    from spanmill.store import SpanStore
    from spanmill.store.join import join_calls

    return join_calls(SpanStore(settings.url, settings.storage_options), since, until)


def _print_join(report: Any) -> None:
    console.print(
        f"calls joined by content: {report.linked} new, {report.already} before; "
        f"{report.ambiguous} ambiguous and {report.unmatched} unmatched left alone"
    )


@app.command()
@handle_errors
def erase(
    user_id: str = typer.Option(None, help="Every trace holding this user id."),
    conversation_id: str = typer.Option(None, help="Every trace of this conversation."),
    trace_id: str = typer.Option(None, help="This trace."),
    reason: str = typer.Option("", help="Why (kept in the record)."),
    by: str = typer.Option(None, help="Who asks (default: this user's login name)."),
    store: str = typer.Option(None, help="Span store URL (default SPANMILL_STORE_URL)."),
) -> None:
    """Erase one subject's spans: hidden from every read now, removed by the next compaction."""
    from spanmill.errors import ConfigError
    from spanmill.store.compact import request_erasure
    from spanmill.store.erasure import Subject

    subjects: list[tuple[Subject, str | None]] = [
        ("user_id", user_id), ("conversation_id", conversation_id), ("trace_id", trace_id)
    ]  # fmt: skip
    given = [(subject, value) for subject, value in subjects if value]
    if len(given) != 1:
        raise ConfigError("give exactly one of --user-id, --conversation-id, --trace-id")
    subject, value = given[0]
    assert value is not None
    settings = _settings(store)
    erasure = request_erasure(
        settings.url, settings.storage_options, subject, value,
        requested_by=by or getpass.getuser(), reason=reason,
        attribute=settings.user_id_attribute,
    )  # fmt: skip
    console.print(
        f"erasure [bold]{erasure.id}[/]: {len(erasure.trace_ids)} traces hidden from reads now; "
        "the next `spanmill store compact` removes their spans"
    )


@app.command()
@handle_errors
def erasures(
    store: str = typer.Option(None, help="Span store URL (default SPANMILL_STORE_URL)."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON."),
    models: bool = typer.Option(
        False,
        "--models",
        help="Also list the registered model versions whose training spans may hold erased "
        "ones (by their lineage's span window), to decide what to retrain.",
    ),
) -> None:
    """The erasure records: what was asked, when, by whom, how many spans went."""
    from spanmill.store import SpanStore
    from spanmill.store.erasure import read_erasures

    settings = _settings(store)
    span_store = SpanStore(settings.url, settings.storage_options)
    records = read_erasures(span_store.fs, span_store.root)
    if as_json:
        console.print_json(json.dumps([r.model_dump(mode="json") for r in records]))
        return
    table = Table("id", "subject", "status", "requested by", "requested at", "traces", "spans")
    for r in records:
        table.add_row(
            r.id, r.subject, r.status, r.requested_by, f"{r.requested_at:%Y-%m-%d %H:%M}",
            str(len(r.trace_ids)), str(r.spans_erased),
        )  # fmt: skip
    console.print(table)
    if models:
        _trained_on_erased(records)


def _trained_on_erased(records: list[Any]) -> None:
    from spanmill.config import MLflowSettings, load_settings
    from spanmill.registry import ModelRegistry

    registry = ModelRegistry(load_settings(MLflowSettings).tracking_uri)
    table = Table("erasure", "spans from", "to", "model versions that may have learned from them")
    for record in records:
        if record.first_span_at is None or record.last_span_at is None:
            continue
        versions = registry.learned_from(record.first_span_at, record.last_span_at)
        table.add_row(
            record.id, f"{record.first_span_at:%Y-%m-%d %H:%M}",
            f"{record.last_span_at:%Y-%m-%d %H:%M}",
            ", ".join(f"{v.agent} v{v.version}" for v in versions) or "none",
        )  # fmt: skip
    console.print(table)


@app.command()
@handle_errors
def files(
    store: str = typer.Option(None, help="Span store URL (default SPANMILL_STORE_URL)."),
    since: str = typer.Option(None, help="Window start: 30m, 24h, 7d or an ISO time."),
) -> None:
    """The live data files, one URL a line: what another engine reads to see each span once."""
    from spanmill.cli.spans import _since
    from spanmill.store import SpanStore

    settings = _settings(store)
    span_store = SpanStore(settings.url, settings.storage_options)
    for stored in span_store.files(start=_since(since)):
        typer.echo(span_store.fs.unstrip_protocol(stored.path))


@app.command()
@handle_errors
def query(
    sql: str = typer.Argument(..., help="DuckDB SQL over the view `spans` and the store's macros."),
    store: str = typer.Option(None, help="Span store URL (default SPANMILL_STORE_URL)."),
    since: str = typer.Option(None, help="Window start: 30m, 24h, 7d or an ISO time."),
) -> None:
    """SQL over the store, e.g. `SELECT * FROM episodes_per_agent_per_day()`."""
    from spanmill.cli.spans import _since
    from spanmill.store import SpanStore

    settings = _settings(store)
    start = _since(since)
    result = SpanStore(settings.url, settings.storage_options).query(sql, start=start)
    table = Table(*result.column_names)
    for row in result.to_pylist():
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    console.print(table)
