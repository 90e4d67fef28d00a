"""The edges of a dataset build: read the span store, write the files and the card."""

from __future__ import annotations

import html
import json
import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spanmill.contracts import DatasetCard
from spanmill.dataset import layout
from spanmill.dataset.build import (
    Built,
    Progress,
    build,
    call_window,
    check_trainable,
    histogram,
    reward_window,
)
from spanmill.dataset.episodes import COLUMNS, REWARD_COLUMNS
from spanmill.dataset.spec import DatasetSpec

_MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
_LINEAGE = [pa.field(name, pa.string()) for name in layout.LINEAGE_COLUMNS]
SCHEMAS: dict[str, pa.Schema] = {
    "sft": pa.schema(
        [("prompt", _MESSAGES), ("completion", _MESSAGES), ("weight", pa.float64()),
         ("reward", pa.float64()), *_LINEAGE]
    ),
    "preference": pa.schema(
        [("prompt", _MESSAGES), ("chosen", _MESSAGES), ("rejected", _MESSAGES),
         ("chosen_reward", pa.float64()), ("rejected_reward", pa.float64()), *_LINEAGE]
    ),
    "rl": pa.schema(
        [("prompt", _MESSAGES), ("completion", _MESSAGES), ("reward", pa.float64()),
         ("group_id", pa.string()), *_LINEAGE]
    ),
}  # fmt: skip


def _iso(ns: int | None) -> str | None:
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def card_of(built: Built, store_url: str) -> DatasetCard:
    return DatasetCard.model_validate({
        "format": 1,
        "mode": built.spec.mode,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": store_url,
        "span_window": {
            "requested": {"since": built.spec.since, "until": built.spec.until},
            "first_span": _iso(built.span_window[0]),
            "last_span": _iso(built.span_window[1]),
            # Rewards are read past the calls' window, for feedback that comes late.
            "rewards": {
                "feedback_horizon_hours": built.spec.feedback_horizon_hours,
                "since": _iso(built.reward_window[0]),
                "until": _iso(built.reward_window[1]),
                "last_span": _iso(built.last_reward_span),
            },
        },
        "filters": built.spec.model_dump(mode="json"),
        "reward": built.reward_name,
        "counts": dict(built.counts),
        "reward_histogram": histogram(built.rewards),
        "model_versions": built.details.get("model_versions", {}),
        "prompt_names": built.details.get("prompt_names", {}),
        # Whose spans were read, and how many of each untrusted producer's were left out.
        "producers": {
            "trusted": built.details.get("trusted_producers", ""),
            "left_out": built.details.get("untrusted_producers", {}),
        },
        "content_hash": built.content_hash(),
        "files": {"train": layout.TRAIN_FILE, "eval": layout.EVAL_FILE},
    })  # fmt: skip


def card_html(card: Mapping[str, Any]) -> str:
    """A one-page summary: the counts at each step and the reward histogram as SVG bars."""
    bins = card["reward_histogram"]
    top = max((b["count"] for b in bins), default=1) or 1
    bars = "".join(
        f'<rect x="{i * 42 + 4}" y="{150 - 140 * b["count"] / top:.1f}" width="36" '
        f'height="{140 * b["count"] / top:.1f}" fill="#4c78a8"><title>{b["low"]:.3g} to '
        f"{b['high']:.3g}: {b['count']}</title></rect>"
        for i, b in enumerate(bins)
    )
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in card["counts"].items()
    )
    return (
        "<!doctype html><meta charset=utf-8><title>spanmill dataset card</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:2px 12px}</style>"
        f"<h1>Dataset: {html.escape(card['mode'])}</h1>"
        f"<p>content hash <code>{card['content_hash']}</code><br>"
        f"spans from {card['span_window']['first_span']} to {card['span_window']['last_span']}"
        f"<br>rewards read until {card['span_window']['rewards']['until']} (feedback horizon "
        f"{card['span_window']['rewards']['feedback_horizon_hours']} h)"
        f"<br>reward <b>{html.escape(str(card['reward']))}</b></p>"
        f"<h2>Counts at each step</h2><table>{rows}</table>"
        f'<h2>Reward histogram</h2><svg width="{len(bins) * 42 + 8}" height="155">{bars}</svg>'
        f"<h2>Filters</h2><pre>{html.escape(json.dumps(card['filters'], indent=2))}</pre>"
    )


def _write_parquet(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    table = pa.Table.from_pylist(rows, schema=schema)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        pq.write_table(table, tmp.name, compression="zstd")
    os.replace(tmp.name, path)


def _write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_dataset(
    built: Built, out_dir: Path, store_url: str, *, jsonl: bool = False
) -> dict[str, Any]:
    """Write the splits and the card; returns the card."""
    card = card_of(built, store_url)
    out_dir.mkdir(parents=True, exist_ok=True)
    # An earlier dataset's card goes first: beside splits half replaced by this one,
    # it would vouch for them (training resumes and lineage read its digest).
    (out_dir / layout.CARD_FILE).unlink(missing_ok=True)
    schema = SCHEMAS[built.spec.mode]
    _write_parquet(built.train, schema, out_dir / layout.TRAIN_FILE)
    _write_parquet(built.eval, schema, out_dir / layout.EVAL_FILE)
    if jsonl:
        _write_jsonl(built.train, out_dir / "train.jsonl")
        _write_jsonl(built.eval, out_dir / "eval.jsonl")
    (out_dir / "card.html").write_text(card_html(card.to_json()))
    # The card goes last: its presence says the dataset is complete.
    card.write(out_dir)
    return card.to_json()


def build_dataset(
    store_url: str,
    out_dir: Path,
    spec: DatasetSpec,
    *,
    storage_options: Mapping[str, Any] | None = None,
    jsonl: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Read the window from the span store, build, write; the KFP component calls this."""
    from spanmill.store import SpanStore
    from spanmill.store.join import join_calls

    report = progress or (lambda _: None)
    store = SpanStore(store_url, storage_options)
    since, until = call_window(spec)
    # The gateway's calls whose callers sent no trace context join their agents'
    # episodes first, so that each agent run is one episode (spanmill.store.links).
    report("joining calls to episodes")
    join_calls(store, since, until)
    report("reading spans")
    spans = store.table(start=since, end=until, columns=COLUMNS)
    late = None
    if until is not None:
        report("reading late rewards")
        late = store.table(start=until, end=reward_window(spec)[1], columns=REWARD_COLUMNS)
    built = build(spec, spans, progress, late=late)
    check_trainable(built)
    report("writing files")
    return write_dataset(built, out_dir, store_url, jsonl=jsonl)
