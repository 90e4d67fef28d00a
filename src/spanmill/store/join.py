"""One join pass: the gateway's calls that came without their caller's trace context,
linked to the agents' spans of the same calls (the rule and the records are
:mod:`spanmill.store.links`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa

from spanmill.producers import GATEWAY, Trust
from spanmill.store.links import MARGIN_S, call_digest, write_links
from spanmill.store.reader import SpanStore, TimeLike, to_unix_nanos

_CALL_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "episode_id", "start_time", "end_time",
    "request_model", "input_messages", "output_messages", "response_id",
    "resource_attributes",
)  # fmt: skip


@dataclass(frozen=True)
class JoinReport:
    """What one join pass did over its window's gateway calls without a caller."""

    linked: int  # newly linked (by_response_id of them by the client's response id)
    already: int  # linked by an earlier pass
    ambiguous: int  # more than one candidate on a side: left alone
    unmatched: int  # no agent span of the same call around it
    by_response_id: int = 0
    path: str | None = None  # the links file written, if any


@dataclass(frozen=True)
class _Call:
    trace_id: str
    span_id: str
    episode_id: str
    start: int
    end: int
    response_id: str | None
    digest: str | None


@dataclass
class _Window:
    """A window's gateway calls without a caller, and the agents' calls they may be."""

    orphans: list[_Call]
    by_response: dict[str, list[_Call]]
    by_digest: dict[str, list[_Call]]
    already: int


def join_calls(
    store: SpanStore, start: TimeLike | None, end: TimeLike | None, *, skew_s: float = 1.0
) -> JoinReport:
    """Link the window's gateway calls that came without a caller context to the agent
    spans of the same calls, and record the new links in the store.

    An agent span that carries the gateway's response id (the client's instrumentation
    recorded it) is the call's; otherwise the content and time decide (see above)."""
    window = _calls(store, start, end)
    skew = int(skew_s * 1e9)
    found: dict[str, tuple[list[_Call], bool]] = {}
    chosen_by: dict[str, int] = defaultdict(int)
    for call in window.orphans:
        same = window.by_response.get(call.response_id or "", [])
        if len(same) == 1:
            found[call.span_id] = (same, True)
        else:
            around = [
                c for c in window.by_digest.get(call.digest or "", ())
                if c.start - skew <= call.start and call.end <= c.end + skew
            ]  # fmt: skip
            found[call.span_id] = (around, False)
        for candidate in found[call.span_id][0]:
            chosen_by[candidate.span_id] += 1
    new, ambiguous, unmatched, by_response_id = [], 0, 0, 0
    for call in window.orphans:
        candidates, exact = found[call.span_id]
        if not candidates:
            unmatched += 1
        elif len(candidates) > 1 or chosen_by[candidates[0].span_id] > 1:
            ambiguous += 1
        else:
            client = candidates[0]
            by_response_id += exact
            new.append({
                "trace_id": call.trace_id, "episode_id": client.episode_id,
                "span_id": call.span_id, "client_trace_id": client.trace_id,
                "client_span_id": client.span_id, "response_id": call.response_id,
            })  # fmt: skip
    path = write_links(store.fs, store.root, new) if new else None
    return JoinReport(len(new), window.already, ambiguous, unmatched, by_response_id, path)


def _calls(store: SpanStore, start: TimeLike | None, end: TimeLike | None) -> _Window:
    low = None if start is None else to_unix_nanos(start)
    high = None if end is None else to_unix_nanos(end)
    margin = MARGIN_S * 1_000_000_000
    read_from = None if low is None else low - margin
    horizon = store.policy().horizon()
    if read_from is not None and horizon is not None:
        # Nothing lies past the store's horizon: the margin never reaches across it (a
        # short retention would otherwise refuse every window near its start). A minute
        # inside it, as the horizon moves on while the read begins.
        read_from = max(read_from, to_unix_nanos(horizon) + 60 * 1_000_000_000)
    calls = store.table(
        start=read_from,
        end=None if high is None else high + margin,
        llm_calls_only=True,
        columns=_CALL_COLUMNS,
    )
    known = store.links()
    linked_traces = set(known["trace_id"].to_pylist())
    linked_clients = set(known["client_span_id"].to_pylist())
    window = _Window([], defaultdict(list), defaultdict(list), 0)
    times = {name: calls[name].cast(pa.int64()).to_pylist() for name in ("start_time", "end_time")}
    gateways = Trust((GATEWAY,)).mask(calls["resource_attributes"]).to_pylist()
    rows = calls.drop_columns(["start_time", "end_time", "resource_attributes"]).to_pylist()
    for row, started, ended, gateway in zip(
        rows, times["start_time"], times["end_time"], gateways, strict=True
    ):
        if gateway and row["parent_span_id"]:
            continue  # joined by context
        call = _Call(
            row["trace_id"], row["span_id"], row["episode_id"], started, ended,
            row["response_id"],
            call_digest(row["request_model"], row["input_messages"], row["output_messages"]),
        )  # fmt: skip
        if not gateway:
            if call.span_id not in linked_clients:
                if call.response_id:
                    window.by_response[call.response_id].append(call)
                if call.digest:
                    window.by_digest[call.digest].append(call)
        elif _inside(call.start, low, high):
            if call.trace_id in linked_traces:
                window.already += 1
            else:
                window.orphans.append(call)
    return window


def _inside(at: int, low: int | None, high: int | None) -> bool:
    return (low is None or at >= low) and (high is None or at < high)
