"""One episode per agent run: the gateway's record of a call joined to the agent's own.

The gateway records every call it serves as an LLM span with the token ids, logprobs
and model version. When the caller propagates its trace context (W3C
``traceparent``), that span is a child of the agent's own span of the call, in the
agent's trace, and so in its episode. Many instrumentations do not propagate it
(OpenInference for LangChain and LlamaIndex, hand-written HTTP clients): the
gateway's span then starts a trace of its own, and the agent's episode (its tool
calls, its rewards) and the token-level record of the same call never meet.

:func:`spanmill.store.join.join_calls` finds them. A gateway span without a caller
is linked to the agent's LLM span of the same call when it carries the gateway's
response id (the client's instrumentation recorded it), or else when

- both have the same :func:`call_digest`: the requested model, the input messages
  and the output, canonicalised (system messages left out, as conventions put them
  apart; text stripped; tool-call arguments parsed; ids dropped), and
- the agent's span encloses the gateway's in time (within ``skew_s`` each side, for
  clocks on two hosts), and
- neither side has another candidate. Two identical prompts answered at the same
  moment are left unlinked and counted as ambiguous, never guessed.

A link is a record in the store (``_links/*.parquet``): the gateway's trace, the
agent's episode, the agent's span and the gateway's response id. Every read through
:class:`~spanmill.store.SpanStore` (the dataset builder, the rollout signals, replay
evaluation, SQL) applies them: the gateway's spans take the agent's episode (keeping
their own trace and span ids), and the agent's span of the call takes the gateway's
response id where it had none, so that the two records read as one call, and
feedback given by response id reaches the agent's episode.

:func:`join_health_sql` says, per service and agent, how many gateway calls were joined
by context, joined by content, or left alone (``spanmill spans stats``).
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from datetime import UTC, datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spanmill.producers import GATEWAY, Trust
from spanmill.store.writer import put_file

LINK_DIR: Final = "_links"
LINK_SCHEMA: Final = pa.schema(
    [
        pa.field("trace_id", pa.string(), nullable=False),  # the gateway's trace
        pa.field("episode_id", pa.string(), nullable=False),  # the agent's episode
        pa.field("span_id", pa.string(), nullable=False),  # the gateway's span
        pa.field("client_trace_id", pa.string(), nullable=False),
        pa.field("client_span_id", pa.string(), nullable=False),
        pa.field("response_id", pa.string()),  # the gateway's
        pa.field("linked_at", pa.timestamp("ms", tz="UTC"), nullable=False),
    ]
)
# Read around the window: a call's two records may start in neighbouring hours.
MARGIN_S: Final = 600


def call_digest(
    model: str | None, input_messages: str | None, output_messages: str | None
) -> str | None:
    """What identifies one call's content on both sides: a SHA-256 of the requested
    model and the canonical input and output messages (GenAI parts form, as the gateway
    records them and as the collector's translation writes a client's); None when a
    side lacks the model or the messages."""
    return content_digest(input_messages, output_messages, model) if model else None


def content_digest(
    input_messages: str | None, output_messages: str | None, model: str = ""
) -> str | None:
    """:func:`call_digest` without the model (within one episode, content alone)."""
    if not input_messages or not output_messages:
        return None
    try:
        canonical = [model, _canonical(input_messages), _canonical(output_messages)]
    except (ValueError, TypeError, AttributeError):
        return None
    if not canonical[1] or not canonical[2]:
        return None
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(messages_json: str) -> list[Any]:
    messages = json.loads(messages_json)
    out = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            continue
        parts = [part for part in map(_canonical_part, message.get("parts") or []) if part]
        if parts:
            out.append([role, parts])
    return out


def _canonical_part(part: dict[str, Any]) -> list[Any] | None:
    kind = part.get("type")
    if kind == "text":
        text = str(part.get("content") or "").strip()
        return ["text", text] if text else None
    if kind == "tool_call":
        arguments = part.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = arguments.strip()
        return ["tool_call", part.get("name"), arguments]
    if kind == "tool_call_response":
        response = part.get("response")
        text = (
            response.strip() if isinstance(response, str) else json.dumps(response, sort_keys=True)
        )
        return ["tool_call_response", text]
    return None


# -- the records ---------------------------------------------------------------------


def _folder(root: str) -> str:
    return f"{root}/{LINK_DIR}" if root else LINK_DIR


def _link_files(fs: Any, root: str) -> list[str]:
    """The store's links files, oldest name first (a hidden name is a write under way)."""
    try:
        names = fs.ls(_folder(root), detail=False)
    except FileNotFoundError:
        return []
    return sorted(
        n for n in names if n.endswith(".parquet") and not n.rsplit("/", 1)[-1].startswith(".")
    )


def read_links(fs: Any, root: str, names: list[str] | None = None) -> pa.Table:
    """Every link of a store (or of the files ``names``), each gateway trace and each
    agent span once (the first written wins)."""
    tables = []
    for name in _link_files(fs, root) if names is None else names:
        try:
            tables.append(pq.read_table(io.BytesIO(fs.cat_file(name)), schema=LINK_SCHEMA))
        except FileNotFoundError:
            continue
    if not tables:
        return LINK_SCHEMA.empty_table()
    links = pa.concat_tables(tables).sort_by([("linked_at", "ascending")])
    # Two passes at once may link the same call: a trace joins one episode, a client
    # span one gateway call.
    traces: set[str] = set()
    clients: set[str] = set()
    first = []
    pairs = zip(links["trace_id"].to_pylist(), links["client_span_id"].to_pylist(), strict=True)
    for row, (trace_id, client) in enumerate(pairs):
        if trace_id not in traces and client not in clients:
            traces.add(trace_id)
            clients.add(client)
            first.append(row)
    return links if len(first) == links.num_rows else links.take(pa.array(first, pa.int64()))


def write_links(fs: Any, root: str, rows: list[dict[str, Any]], *, stamp: bool = True) -> str:
    """Write links as one file (new ones ``stamp``ed with the time now); returns its path."""
    now = datetime.now(UTC)
    if stamp:
        rows = [{**row, "linked_at": now} for row in rows]
    table = pa.Table.from_pylist(rows, schema=LINK_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    path = f"{_folder(root)}/links-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}.parquet"
    put_file(fs, path, sink.getvalue())
    return path


def compact_links(fs: Any, root: str, horizon: datetime | None) -> int:
    """Merge the links files into one, leaving out links made before ``horizon`` (their
    spans are past retention); returns how many files were merged. The merged file is
    written before the old ones go, and readers take each link once: a read in between
    sees every link. A file a join pass writes meanwhile is not touched."""
    names = _link_files(fs, root)
    if not names:
        return 0
    links = read_links(fs, root, names)
    kept = links if horizon is None else links.filter(pc.greater_equal(links["linked_at"], horizon))
    if len(names) < 2 and kept.num_rows == links.num_rows:
        return 0
    if kept.num_rows:
        write_links(fs, root, kept.to_pylist(), stamp=False)
    for name in names:
        fs.rm_file(name)
    return len(names)


# -- applying them -------------------------------------------------------------------


def apply_links(table: pa.Table, links: pa.Table) -> pa.Table:
    """The spans as one episode per agent run: a linked gateway trace's spans take the
    agent's episode, and the agent's span of the call the gateway's response id where
    it had none. ``table`` must hold ``trace_id`` (for ``episode_id``) and ``span_id``
    (for ``response_id``); other columns pass through."""
    if not links.num_rows or not table.num_rows:
        return table
    names = table.column_names
    if "episode_id" in names and "trace_id" in names:
        at = pc.index_in(table["trace_id"], value_set=links["trace_id"])
        linked = pc.take(links["episode_id"], at)
        episode = pc.coalesce(linked, table["episode_id"])
        table = table.set_column(
            names.index("episode_id"), table.schema.field("episode_id"), episode
        )
    if "response_id" in names and "span_id" in names:
        at = pc.index_in(table["span_id"], value_set=links["client_span_id"])
        given = pc.take(links["response_id"], at)
        response = pc.coalesce(table["response_id"], given)
        table = table.set_column(
            names.index("response_id"), table.schema.field("response_id"), response
        )
    return table


def linked_view_sql(source: str) -> str:
    """The same as :func:`apply_links`, in DuckDB over ``source`` and a ``call_links`` table."""
    return (
        f"SELECT s.* REPLACE (coalesce(l.episode_id, s.episode_id) AS episode_id, "
        f"coalesce(s.response_id, c.response_id) AS response_id) FROM {source} s "
        f"LEFT JOIN call_links l ON s.trace_id = l.trace_id "
        f"LEFT JOIN call_links c ON s.span_id = c.client_span_id"
    )


def join_health_sql() -> str:
    """Per service and agent of the gateway's calls: joined by context (the caller
    propagated its trace), joined by content (a link), and left alone."""
    gateway = Trust((GATEWAY,)).sql("s.resource_attributes")
    alone = "s.parent_span_id IS NULL AND l.trace_id IS NULL"
    return (
        "SELECT coalesce(s.service_name, '-') AS service, "
        "coalesce(s.request_model, '-') AS agent, count(*) AS gateway_calls, "
        "count(*) FILTER (WHERE s.parent_span_id IS NOT NULL) AS by_context, "
        "count(*) FILTER (WHERE l.trace_id IS NOT NULL) AS by_content, "
        f"count(*) FILTER (WHERE {alone}) AS alone "
        "FROM llm_calls() s LEFT JOIN call_links l ON s.trace_id = l.trace_id "
        f"WHERE {gateway} "
        "GROUP BY 1, 2 ORDER BY gateway_calls DESC"
    )
