"""``spanmill spans tail`` and ``spanmill spans stats``: what is arriving, what is stored."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.table import Table

from spanmill.cli.console import console, handle_errors
from spanmill.config import CollectorSettings, load_settings
from spanmill.errors import ConfigError

app = typer.Typer(
    help="Look at spans: arriving on the topic, or in the store.", no_args_is_help=True
)

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _since(value: str | None) -> datetime | None:
    """``30m``, ``24h``, ``7d`` ago, or an ISO time; None for everything."""
    if not value:
        return None
    match = _DURATION.match(value.strip())
    if match:
        return datetime.now(UTC) - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"--since {value!r}: give a duration such as 30m, 24h, 7d, or an ISO time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _short(text: Any, width: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= width else text[: width - 1] + "…"


@app.command()
@handle_errors
def tail(
    from_beginning: bool = typer.Option(False, help="Start at the oldest record, not the newest."),
    limit: int = typer.Option(0, help="Stop after this many records (0: follow until Ctrl-C)."),
    dlq: bool = typer.Option(False, help="Tail the dead-letter topic, with reasons."),
    topic: str = typer.Option(None, help="Topic (default SPANMILL_KAFKA_SPANS_TOPIC)."),
) -> None:
    """Follow the span topic as records arrive: one line per span, refusals in red.

    Reads without joining the collector's group, so it never takes records from it.
    """
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from spanmill import semconv as sc
    from spanmill.collector.decode import decode_spans
    from spanmill.spans import SpanDecodeError

    settings = load_settings(CollectorSettings)
    name = topic or (settings.kafka.dlq_topic if dlq else settings.kafka.spans_topic)
    try:
        consumer = KafkaConsumer(**settings.kafka.client_options(), enable_auto_commit=False)
        partitions = consumer.partitions_for_topic(name)
    except KafkaError as exc:
        raise ConfigError(
            f"cannot reach Kafka at {settings.kafka.bootstrap_servers}: {exc}; "
            "check SPANMILL_KAFKA_BOOTSTRAP_SERVERS"
        ) from None
    if not partitions:
        raise ConfigError(f"topic {name!r} does not exist on {settings.kafka.bootstrap_servers}")
    assigned = [TopicPartition(name, p) for p in sorted(partitions)]
    consumer.assign(assigned)
    (consumer.seek_to_beginning if from_beginning else consumer.seek_to_end)(*assigned)
    console.print(f"[dim]tailing {name} ({len(assigned)} partitions); Ctrl-C to stop[/]")
    shown = 0
    try:
        while not limit or shown < limit:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    headers = dict(record.headers or ())
                    where = f"[dim]{record.partition}/{record.offset}[/]"
                    if dlq:
                        reason = headers.get(sc.DLQ_HEADER_REASON, b"?").decode(errors="replace")
                        detail = headers.get(sc.DLQ_HEADER_DETAIL, b"").decode(errors="replace")
                        console.print(f"{where} [red]{reason}[/] {_short(detail, 120)}")
                        shown += 1
                        continue
                    content_type = headers.get(sc.CONTENT_TYPE_HEADER)
                    try:
                        spans = decode_spans(
                            record.value or b"",
                            content_type.decode(errors="replace") if content_type else None,
                            settings.kafka.max_message_bytes,
                        )
                    except SpanDecodeError as exc:
                        console.print(f"{where} [red]✗ {exc.reason}[/] {_short(exc.detail, 120)}")
                        shown += 1
                        continue
                    for parts in spans:
                        attributes = parts.attributes
                        when = datetime.fromtimestamp(parts.start / 1e9, UTC).strftime("%H:%M:%S")
                        service = parts.resource_attributes.get(sc.SERVICE_NAME, "")
                        model = attributes.get(sc.GEN_AI_RESPONSE_MODEL) or attributes.get(
                            sc.GEN_AI_REQUEST_MODEL, ""
                        )
                        tokens = attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, "")
                        status = "[red]error[/]" if parts.status_code == "error" else ""
                        console.print(
                            f"{where} {when} [cyan]{_short(service, 24)}[/] "
                            f"{_short(attributes.get(sc.GEN_AI_AGENT_NAME, ''), 16)} "
                            f"[bold]{_short(parts.name, 40)}[/] {_short(model, 24)} "
                            f"{f'{tokens} tok' if tokens != '' else ''} "
                            f"[dim]{parts.trace_id[:8]}[/] {status}",
                            highlight=False,
                        )
                        shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _table(title: str, result: Any, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for column in columns:
        table.add_column(
            column, justify="right" if column not in result.column_names[:1] else "left"
        )
    for row in result.to_pylist():
        table.add_row(*["" if row[c] is None else str(row[c]) for c in result.column_names])
    return table


@app.command()
@handle_errors
def stats(
    store: str = typer.Option(None, help="Span store (default SPANMILL_COLLECTOR_STORE_URL)."),
    since: str = typer.Option("24h", help="Window start: 30m, 24h, 7d, an ISO time, or ''."),
) -> None:
    """What the store holds: spans per hour, service, agent and model; rewards; Kafka progress."""
    from spanmill.store import SpanStore
    from spanmill.store.links import join_health_sql

    settings = load_settings(CollectorSettings, **({"store_url": store} if store else {}))
    start = _since(since)
    span_store = SpanStore(settings.store_url, settings.storage_options)
    began = time.perf_counter()

    def query(sql: str) -> Any:
        return span_store.query(sql, start=start)

    totals = query(
        "SELECT count(*) AS spans, count(DISTINCT trace_id) AS traces, "
        "(SELECT count(*) FROM llm_calls()) AS llm_calls, "
        "count(*) FILTER (WHERE status_code = 'error') AS errors, "
        "min(start_time) AS first, max(start_time) AS last FROM spans"
    ).to_pylist()[0]
    scope = f"since {start:%Y-%m-%d %H:%M} UTC" if start else "all time"
    console.print(
        f"[bold]{settings.store_url}[/] ({scope}): {totals['spans']} spans, "
        f"{totals['traces']} traces, {totals['llm_calls']} LLM calls, {totals['errors']} errors"
    )
    if not totals["spans"]:
        return
    console.print(
        _table(
            "by hour",
            query(
                "SELECT strftime(date_trunc('hour', start_time), '%Y-%m-%d %H:00') AS hour, "
                "count(*) AS spans, count(*) FILTER (WHERE status_code = 'error') AS errors "
                "FROM spans GROUP BY 1 ORDER BY 1 DESC LIMIT 24"
            ),
            ["hour", "spans", "errors"],
        )
    )
    console.print(
        _table(
            "by service and agent",
            query(
                "SELECT coalesce(service_name, '-') AS service, "
                "coalesce(agent_name, '-') AS agent, count(*) AS spans, "
                "count(DISTINCT episode_id) AS episodes FROM spans "
                "GROUP BY 1, 2 ORDER BY spans DESC LIMIT 20"
            ),
            ["service", "agent", "spans", "episodes"],
        )
    )
    console.print(
        _table(
            "the gateway's calls joined to their agents' episodes",
            query(join_health_sql()),
            ["service", "agent", "gateway_calls", "by_context", "by_content", "alone"],
        )
    )
    console.print(
        _table(
            "LLM calls by model",
            query(
                "SELECT coalesce(model, '-') AS model, coalesce(model_version, '-') AS version, "
                "count(*) AS calls, sum(output_tokens) AS output_tokens, "
                "count(*) FILTER (WHERE completion_token_ids IS NOT NULL) AS with_token_ids "
                "FROM llm_calls() GROUP BY 1, 2 ORDER BY calls DESC LIMIT 20"
            ),
            ["model", "version", "calls", "output_tokens", "with_token_ids"],
        )
    )
    rewards = query(
        "SELECT name AS reward, count(*) AS given, round(avg(value), 4) AS mean, "
        'count(*) FILTER (WHERE "primary") AS as_primary '
        "FROM span_rewards() GROUP BY 1 ORDER BY given DESC LIMIT 20"
    )
    if rewards.num_rows:
        console.print(_table("rewards", rewards, ["reward", "given", "mean", "as_primary"]))
    console.print(
        _table(
            "Kafka progress",
            query(
                "SELECT kafka_topic AS topic, kafka_partition AS partition, count(*) AS spans, "
                "max(kafka_offset) AS last_offset, strftime(max(kafka_timestamp), '%H:%M:%S') "
                "AS last_record FROM spans GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            ["topic", "partition", "spans", "last_offset", "last_record"],
        )
    )
    console.print(f"[dim]{time.perf_counter() - began:.2f}s[/]")


@app.command()
@handle_errors
def redact(
    texts: list[str] = typer.Argument(
        ..., help="Texts to try, each as a span attribute's value (a JSON text string by string)."
    ),
    pattern: list[str] = typer.Option(
        [], help="One more pattern, NAME=REGEX, beside SPANMILL_COLLECTOR_REDACT_PATTERNS."
    ),
) -> None:
    """Try the collector's redaction on texts: what it would store, what it counts, and
    what its native decoder scans each record for before any pattern runs."""
    from spanmill.collector.redact import Redactor
    from spanmill.store.rows import SpanParts

    settings = load_settings(CollectorSettings)
    patterns = dict(settings.redact_patterns)
    for item in pattern:
        name, equals, regex = item.partition("=")
        if not (equals and name and regex):
            raise ConfigError(f"--pattern {item!r}: give NAME=REGEX")
        patterns[name] = regex
    try:
        redactor = Redactor(settings.redact_rules, patterns)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    rules = Table(title="what the native decoder scans for, rule by rule")
    for column in ("rule", "scans for"):
        rules.add_column(column)
    for rule in redactor.rules:
        if rule.gates_scanned:
            wanted = ", ".join(repr(gate) for gate in rule.gates)
        elif rule.digits:
            wanted = f"a run of {rule.digits} digits (a space or dash between two)"
        else:
            wanted = "[yellow]nothing: every record's rows take the patterns[/]"
        rules.add_row(rule.name, _short(wanted, 120))
    console.print(rules)
    results = Table(title="texts as they would be stored")
    for column in ("text", "stored", "redacted"):
        results.add_column(column)
    for text in texts:
        parts = SpanParts("0" * 32, "0" * 16, None, "", "internal", 0, 0, "unset", "",
                          {"text": text}, {}, "", "", [], [])  # fmt: skip
        counts: dict[str, int] = {}
        redactor.apply(parts, counts)
        found = ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))
        results.add_row(text, str(parts.attributes["text"]), found or "-")
    console.print(results)
