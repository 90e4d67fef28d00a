"""Erasure on request: one user's spans, over several hours and partitions, gone from the
store and from datasets built afterwards, on a folder and on the local S3 endpoint."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from dataset_traces import SYSTEM, episode, llm, reward_event, tool

from spanmill.collector.batch import BatchJob, BatchProcessor, ProcessingConfig
from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.store import BatchId, SpanStore
from spanmill.store.compact import Compactor, request_erasure
from spanmill.store.erasure import read_erasures

HOUR_NS = 3600 * 10**9
HOUR0 = 1_750_000_000_000_000_000 // HOUR_NS * HOUR_NS


def _episode(trace: int, start: int, user: str) -> list[Span]:
    """A calculator episode whose root span names its user; the calls do not."""
    task = f"{user}/t{trace}"
    root = episode(trace, start, reward_event("success", 1.0, primary=True), task=task)
    root = root.model_copy(update={"attributes": {**root.attributes, "enduser.id": user}})
    prompt = [SYSTEM, {"role": "user", "content": f"What is {trace} times 3?"}]
    return [
        root,
        llm(trace, start + 1, answer={"tool": "calculator", "expression": f"{trace}*3"},
            prompt=prompt, task=task),
        tool(trace, start + 2),
        llm(trace, start + 3, answer=str(trace * 3), task=task,
            prompt=[*prompt, {"role": "tool", "content": str(trace * 3)}]),
    ]  # fmt: skip


def _write(url: str, options: dict[str, Any]) -> dict[str, int]:
    """Ann's and Bob's episodes over four hours and three partitions, a record a trace."""
    processor = BatchProcessor(ProcessingConfig(store_url=url, storage_options=options))
    spans_of = {"ann": 0, "bob": 0}
    offsets = [0, 0, 0]
    for hour in range(4):
        for partition in range(3):
            traces = []
            for user in ("ann", "bob"):
                trace = 1 + len(spans_of) * 100 + hour * 10 + partition + (user == "bob") * 1000
                traces.append(_episode(trace, HOUR0 + hour * HOUR_NS + partition * 10**9, user))
                spans_of[user] += 4
            first = offsets[partition]
            offsets[partition] += len(traces)
            outcome = processor.process(
                BatchJob(
                    BatchId("spans", partition, first, first + len(traces) - 1,
                            f"{hour * 3 + partition + 1:016x}"),
                    list(range(first, first + len(traces))), [1_750_000_000_000] * len(traces),
                    [encode_otlp_protobuf(t) for t in traces], [None] * len(traces),
                )
            )  # fmt: skip
            assert outcome.spans == 8 and not outcome.dead
    return spans_of


def _tasks(out: Path) -> set[str]:
    rows = pq.read_table(out / "train.parquet").to_pylist()
    rows += pq.read_table(out / "eval.parquet").to_pylist()
    return {row["task_id"].split("/")[0] for row in rows}


def test_a_users_spans_are_erased_from_the_store_and_later_datasets(
    store_at: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = store_at
    spans_of = _write(url, options)
    store = SpanStore(url, options)
    assert store.count() == 96 and spans_of == {"ann": 48, "bob": 48}
    spec = DatasetSpec(mode="sft", eval_fraction=0.25, trusted_producers=("*",))
    build_dataset(url, tmp_path / "before", spec, storage_options=options)
    assert _tasks(tmp_path / "before") == {"ann", "bob"}

    erasure = request_erasure(
        url, options, "user_id", "ann", requested_by="dpo@example.org", reason="request 17"
    )
    assert len(erasure.trace_ids) == 12 and erasure.status == "pending"
    # Hidden from every read at once, before any compaction.
    assert store.count() == 48
    build_dataset(url, tmp_path / "pending", spec, storage_options=options)
    assert _tasks(tmp_path / "pending") == {"bob"}

    report = Compactor(url, options, settle_s=0).run()
    assert report.spans_erased == {erasure.id: 48}
    assert report.erasures_applied == [erasure.id]
    # Gone from the files themselves, not only hidden: read every data file raw.
    fs, root = store.fs, store.root
    files = [p for p in fs.find(root) if p.endswith(".parquet")]
    raw = sum(pq.read_table(p, filesystem=fs).num_rows for p in files)
    assert raw == 48 and len(files) == 4  # one compacted file an hour
    for path in files:
        texts = pq.read_table(path, filesystem=fs, columns=["attributes", "task_id"]).to_pylist()
        assert not [row for row in texts if '"ann"' in (row["attributes"] or "")]
        assert {row["task_id"].split("/")[0] for row in texts if row["task_id"]} == {"bob"}
    # Nothing else changed: Bob's 48 spans, each once.
    assert store.count() == 48
    assert store.duplicates() == 0
    build_dataset(url, tmp_path / "after", spec, storage_options=options)
    assert _tasks(tmp_path / "after") == {"bob"}
    # The record: what, when, by whom, how many; the value itself forgotten.
    (record,) = read_erasures(fs, root)
    assert record.status == "applied" and record.spans_erased == 48
    assert record.value is None
    assert record.value_sha256 == hashlib.sha256(b"ann").hexdigest()
    assert record.requested_by == "dpo@example.org" and record.reason == "request 17"
    assert record.first_span_at is not None and record.last_span_at is not None
    assert (record.last_span_at - record.first_span_at).total_seconds() > 3 * 3600
    assert b"ann" not in fs.cat_file(f"{root}/_erasures/{record.id}.json")
