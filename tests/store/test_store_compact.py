"""Compaction and retention: few files per hour, every span once, before, during, after."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_samples import BASE_NS
from store_upkeep import HOUR_NS, Feeder, hour_span

from spanmill.dataset.output import build_dataset
from spanmill.dataset.spec import DatasetSpec
from spanmill.store import SpanStore, StoreError
from spanmill.store.compact import Compactor
from spanmill.store.layout import parse_part_name
from spanmill.store.policy import StorePolicy

HOUR0 = BASE_NS - BASE_NS % HOUR_NS


def _small_files(
    url: str,
    hours: int = 3,
    batches: int = 8,
    per_batch: int = 25,
    options: dict[str, Any] | None = None,
) -> Feeder:
    feeder = Feeder(url, options)
    n = 0
    for hour in range(hours):
        for b in range(batches):
            spans = [hour_span(HOUR0 + hour * HOUR_NS, n + i) for i in range(per_batch)]
            n += per_batch
            feeder.write(spans, partition=b % 3)
    return feeder


def _data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith((".", "_")))


def test_compaction_leaves_one_file_per_hour_and_every_span_once(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    _small_files(url)
    store = SpanStore(url)
    before = store.table().sort_by([("trace_id", "ascending")])
    assert len(_data_files(tmp_path / "store")) == 24 and before.num_rows == 600

    report = Compactor(url, settle_s=0).run()
    assert (report.hours_compacted, report.files_before, report.files_after) == (3, 24, 3)
    assert report.files_deleted == 24
    files = _data_files(tmp_path / "store")
    assert len(files) == 3 and all(parse_part_name(f.name) for f in files)
    after = store.table().sort_by([("trace_id", "ascending")])
    assert after.equals(before)
    assert store.duplicates() == 0
    # Each file sorted by trace id, then time.
    for path in files:
        ids = pq.read_table(path, columns=["trace_id"]).column("trace_id").to_pylist()
        assert ids == sorted(ids)
    # Nothing left to do.
    again = Compactor(url, settle_s=0).run()
    assert (again.hours_compacted, again.files_deleted) == (0, 0)


def test_open_hours_wait_and_late_files_join_the_next_generation(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    feeder = _small_files(url, hours=2, batches=3)
    last_hour_end = (HOUR0 + 2 * HOUR_NS) / 1e9
    # The clock in the second hour's settling time: only the first hour is compacted.
    report = Compactor(url, settle_s=600, clock=lambda: last_hour_end + 60).run()
    assert report.hours_compacted == 1
    # A late batch into the compacted hour, and a replay of a batch it replaced.
    feeder.write([hour_span(HOUR0, 10_000 + i) for i in range(5)], partition=1)
    feeder.replay(feeder.jobs[0])
    store = SpanStore(url)
    assert store.count() == 2 * 75 + 5 and store.duplicates() == 0
    report = Compactor(url, settle_s=0).run()
    assert report.hours_compacted == 2
    assert len(_data_files(tmp_path / "store")) == 2
    assert store.count() == 155 and store.duplicates() == 0


def test_an_incomplete_generation_is_never_read_and_is_cleared_once_stale(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    _small_files(url, hours=1, batches=4)
    root = tmp_path / "store"
    compactor = Compactor(url, settle_s=0, target_rows=40)
    compactor.run()
    parts = _data_files(root)
    assert len(parts) == 3  # 100 rows, 40 a part
    # A run killed after its first part: a complete generation of three less two.
    _small_files_more = Feeder(url)
    _small_files_more.next_offset = {0: 1000}
    _small_files_more.write([hour_span(HOUR0, 50_000 + i) for i in range(7)])
    live_before = SpanStore(url).count()
    generation = parse_part_name(parts[0].name)
    assert generation is not None
    orphan = parts[0].with_name(parts[0].name.replace(generation.generation, "f" * 16))
    orphan.write_bytes(parts[0].read_bytes())
    assert SpanStore(url).count() == live_before == 107
    # Fresh: left alone (a run may still be writing it); stale: deleted.
    Compactor(url, settle_s=0, stale_s=3600).run()
    assert orphan.exists() and SpanStore(url).count() == 107
    Compactor(url, settle_s=0, stale_s=0).run()
    assert not orphan.exists() and SpanStore(url).count() == 107


def test_retention_deletes_expired_hours_and_refuses_windows_past_it(
    store_at: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = store_at
    feeder = Feeder(url, options)
    for hour in range(3):
        feeder.write([hour_span(HOUR0 + hour * HOUR_NS, hour * 100 + i) for i in range(50)])
    now = (HOUR0 + 3 * HOUR_NS) / 1e9  # just after the third hour
    # Keeps the last hour and a half: the first hour ended before that, the second not.
    policy = StorePolicy(retention_days=1.5 / 24)
    report = Compactor(url, options, policy=policy, settle_s=0, clock=lambda: now).run()
    assert report.hours_expired == 1
    store = SpanStore(url, options)
    hours = sorted({f.hour for f in store.files()})
    assert hours == [HOUR0 // HOUR_NS + 1, HOUR0 // HOUR_NS + 2]
    assert store.count() == 100
    assert store.policy().retention_days == policy.retention_days
    with pytest.raises(StoreError, match="retention horizon"):
        store.count(start=HOUR0)
    # The dataset builder says so before building anything.
    since = datetime.fromtimestamp(HOUR0 / 1e9, UTC).isoformat()
    with pytest.raises(StoreError, match="before the store's retention horizon"):
        build_dataset(url, tmp_path / "dataset", DatasetSpec(since=since), storage_options=options)
    # A window inside retention is read as before.
    assert store.count(start=int(time.time() * 1e9) - 60 * 10**9) == 0


def test_one_upkeep_run_at_a_time_whoever_starts_it(
    store_at: tuple[str, dict[str, Any]],
) -> None:
    """Two runs at once (a Job started by hand beside the CronJob's, a pod replaced while
    its node was lost) each wrote a generation replacing the same files: every row of the
    hour was read twice, and the next run made the duplicates permanent."""
    url, options = store_at
    _small_files(url, hours=1, batches=4, options=options)
    store = SpanStore(url, options)
    rows = store.table().num_rows
    first = Compactor(url, options, settle_s=0)
    held_since = r"another upkeep run \(.*\) has held the store since"
    with first._alone(), pytest.raises(StoreError, match=held_since):
        Compactor(url, options, settle_s=0).run()
    assert store.duplicates() == 0 and store.table().num_rows == rows
    # Released: the next run works, and leaves no lock behind.
    assert Compactor(url, options, settle_s=0).run().hours_compacted == 1
    with first._alone():  # a run killed before it removed its lock ...
        pass
    held = Compactor(url, options, settle_s=0)
    held.writer.create_exclusive(f"{held.root}/_upkeep.lock", b'{"since": 0, "expires": 1}')
    # ... is taken over once the lock expires.
    Compactor(url, options, settle_s=0).run()
    assert store.duplicates() == 0 and store.table().num_rows == rows
    assert not store.fs.exists(f"{store.root}/_upkeep.lock")


def test_upkeep_runs_again_and_again_with_a_retention_of_a_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upkeep joins the last 24 hours' calls first, reading ten minutes before them:
    with a retention of a day or less that read began past the store's horizon, and every
    run after the first (which wrote the policy) stopped there, with no compaction,
    retention or erasure from then on."""
    from typer.testing import CliRunner

    from spanmill.cli.main import app

    url = str(tmp_path / "store")
    now = time.time_ns()
    Feeder(url).write([hour_span(now - now % HOUR_NS, i) for i in range(5)])
    monkeypatch.setenv("SPANMILL_STORE_RETENTION_DAYS", "1")
    runner = CliRunner()
    for attempt in range(2):
        result = runner.invoke(app, ["store", "compact", "--store", url])
        assert result.exit_code == 0, (attempt, result.output)
    assert SpanStore(url).count() == 5


def test_an_erasure_by_conversation_finds_ids_sent_as_numbers(tmp_path: Path) -> None:
    """gen_ai.conversation.id sent as a number is not promoted to its string column: the
    request matched no trace, was marked applied, forgot its value, and the
    conversation stayed readable."""
    from spanmill import semconv as sc
    from spanmill.store.compact import request_erasure

    url = str(tmp_path / "store")
    spans = [hour_span(HOUR0, i) for i in range(3)]
    spans[0].attributes[sc.GEN_AI_CONVERSATION_ID] = 4711
    spans[1].attributes[sc.GEN_AI_CONVERSATION_ID] = "4711"
    Feeder(url).write(spans)
    erasure = request_erasure(url, None, "conversation_id", "4711", requested_by="dpo")
    assert set(erasure.trace_ids) == {spans[0].trace_id, spans[1].trace_id}
    Compactor(url, settle_s=0).run()
    assert {s.trace_id for s in SpanStore(url).spans()} == {spans[2].trace_id}


def test_dead_letters_kept_in_the_store_expire_and_are_erased(tmp_path: Path) -> None:
    """The records the dead-letter topic refused are kept in the store whole, prompts and
    all: retention never expired them and no erasure looked at them."""
    from spanmill.store.compact import request_erasure
    from spanmill.store.writer import StoreWriter

    url = str(tmp_path / "store")
    Feeder(url).write([hour_span(time.time_ns(), 0)])
    writer = StoreWriter(url)
    now_ms = int(time.time() * 1000)
    old = writer.write_dead_letter("spans", 0, 1, "a" * 16, b"old prompt",
                                   {"failed_at_ms": now_ms - 3 * 86_400_000})  # fmt: skip
    ann = writer.write_dead_letter("spans", 0, 2, "b" * 16, b'..."enduser.id":"ann"...',
                                   {"failed_at_ms": now_ms})  # fmt: skip
    kept = writer.write_dead_letter("spans", 0, 3, "c" * 16, b"someone else",
                                    {"failed_at_ms": now_ms})  # fmt: skip
    request_erasure(url, None, "user_id", "ann", requested_by="dpo")
    report = Compactor(url, policy=StorePolicy(retention_days=1), settle_s=0).run()
    assert report.dead_letters_deleted == 2
    for base, present in ((old, False), (ann, False), (kept, True)):
        assert Path(base + ".bin").exists() is present and Path(base + ".json").exists() is present


def test_an_older_upkeep_never_drops_a_newer_collectors_columns(tmp_path: Path) -> None:
    """A collector of a newer spanmill promotes an attribute into a column of its own; the
    old upkeep (a CronJob pod of the previous image during an upgrade) read its files as
    the schema it knew and wrote them back without that column: the values gone."""
    url = str(tmp_path / "store")
    _small_files(url, hours=1, batches=2)
    files = _data_files(tmp_path / "store")
    newer = pq.read_table(files[0])
    newer = newer.append_column("gen_ai_new_column", pa.array(["kept"] * newer.num_rows))
    pq.write_table(newer, files[0])
    with pytest.raises(StoreError, match="columns this spanmill does not know"):
        Compactor(url, settle_s=0).run()
    assert pq.read_table(files[0]).column("gen_ai_new_column").to_pylist()[0] == "kept"


def test_an_applied_erasure_still_takes_its_subjects_late_spans(tmp_path: Path) -> None:
    """Once applied, a record forgets its value and matched only the traces it named:
    a span of the subject that reached the store after (a collector's lag, a run still
    going) stayed readable for good."""
    from spanmill.store.compact import request_erasure
    from spanmill.store.erasure import read_erasures

    url = str(tmp_path / "store")
    feeder = Feeder(url)
    feeder.write([hour_span(HOUR0, 0, user="alice"), hour_span(HOUR0, 1, user="bob")])
    request_erasure(url, None, "user_id", "alice", requested_by="dpo")
    Compactor(url, settle_s=0).run()
    (applied,) = read_erasures(SpanStore(url).fs, SpanStore(url).root)
    assert applied.status == "applied" and applied.value is None
    feeder.write([hour_span(HOUR0 + HOUR_NS, 2, user="alice")])  # late, in another hour
    store = SpanStore(url)
    assert sorted(s.trace_id for s in store.spans()) == [f"{2:032x}", f"{3:032x}"]
    report = Compactor(url, settle_s=0).run()
    assert report.spans_erased == {applied.id: 1}
    assert [s.attributes.get("enduser.id") for s in SpanStore(url).spans()] == ["bob"]
    (again,) = read_erasures(SpanStore(url).fs, SpanStore(url).root)
    assert f"{3:032x}" in again.trace_ids and again.value is None
    # Nothing late: the record is left as it was.
    assert Compactor(url, settle_s=0).run().spans_erased == {}


def test_past_the_late_window_an_applied_erasure_forgets_its_subjects_hash(
    tmp_path: Path,
) -> None:
    """A SHA-256 of a user id (an email, a number) is undone by hashing candidates: kept
    for good, the record kept the value it was to forget. It stays while late spans are
    looked for (LATE_S), and goes with them."""
    from spanmill.store.compact import LATE_S, request_erasure
    from spanmill.store.erasure import read_erasures

    url = str(tmp_path / "store")
    feeder = Feeder(url)
    feeder.write([hour_span(HOUR0, 0, user="alice"), hour_span(HOUR0, 1, user="bob")])
    request_erasure(url, None, "user_id", "alice", requested_by="dpo")
    now = time.time()
    Compactor(url, settle_s=0, clock=lambda: now).run()
    (applied,) = read_erasures(SpanStore(url).fs, SpanStore(url).root)
    assert applied.value is None and applied.value_sha256 is not None
    # Within the window the hash stays; a day past it, it is removed, once.
    day = now + LATE_S - 3600
    assert Compactor(url, settle_s=0, clock=lambda: day).run().erasure_hashes_removed == []
    later = now + LATE_S + 86_400
    report = Compactor(url, settle_s=0, clock=lambda: later).run()
    assert report.erasure_hashes_removed == [applied.id]
    (forgotten,) = read_erasures(SpanStore(url).fs, SpanStore(url).root)
    assert forgotten.value is None and forgotten.value_sha256 is None
    assert "alice" not in (tmp_path / "store" / "_erasures" / f"{applied.id}.json").read_text()
    assert forgotten.model_dump(exclude={"value_sha256"}) == applied.model_dump(
        exclude={"value_sha256"}
    )
    assert Compactor(url, settle_s=0, clock=lambda: later).run().erasure_hashes_removed == []
    assert [s.attributes.get("enduser.id") for s in SpanStore(url).spans()] == ["bob"]


def test_a_late_span_of_an_erased_trace_leaves_the_files_too(tmp_path: Path) -> None:
    """A late span of a trace an applied erasure names, alone in a new hour's file, was
    hidden from readers but never rewritten out: `spanmill store files` handed it on."""
    from spanmill.store.compact import request_erasure

    url = str(tmp_path / "store")
    feeder = Feeder(url)
    feeder.write([hour_span(HOUR0, 0, trace=7), hour_span(HOUR0, 1)])
    request_erasure(url, None, "trace_id", f"{7:032x}", requested_by="dpo")
    Compactor(url, settle_s=0).run()
    feeder.write([hour_span(HOUR0 + HOUR_NS, 2, trace=7)])  # late, alone in its hour
    Compactor(url, settle_s=0).run()
    held = {
        trace
        for path in _data_files(tmp_path / "store")
        for trace in pq.read_table(path, columns=["trace_id"]).column("trace_id").to_pylist()
    }
    assert f"{7:032x}" not in held and held == {f"{2:032x}"}


def test_erasure_records_are_fetched_as_one_batch(tmp_path: Path) -> None:
    """Every read of the store reads every erasure record, and they accumulate for the
    store's life: fetched one after another they cost a round trip each to an object
    store, thousands a read after a few years. Now one batch (which an object store's
    filesystem sends at once); a record removed after the listing is left out, and any
    other failure is raised, not taken for an absent record."""
    from fsspec.implementations.local import LocalFileSystem

    from spanmill.store.erasure import Erasure, read_erasures, write_erasure

    class Counted(LocalFileSystem):
        def __init__(self) -> None:
            super().__init__(skip_instance_cache=True)
            self.batches: list[list[str]] = []
            self.gone: str | None = None
            self.broken: str | None = None
            self.fetching = False

        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
            listed = super().ls(path, detail=False, **kwargs)
            return [*listed, *([self.gone] if self.gone else [])]

        def cat(
            self, path: Any, recursive: bool = False, on_error: str = "raise", **kw: Any
        ) -> Any:
            self.batches.append(list(path))
            self.fetching = True
            try:
                fetched = super().cat(path, recursive=recursive, on_error=on_error, **kw)
            finally:
                self.fetching = False
            if self.broken:
                fetched[self.broken] = PermissionError("denied")
            return fetched

        def cat_file(self, *args: Any, **kwargs: Any) -> Any:
            assert self.fetching, "a record fetched on its own"
            return super().cat_file(*args, **kwargs)

    fs, root = Counted(), str(tmp_path / "store")
    written = [
        Erasure.request("trace_id", f"{i:032x}", requested_by="dpo").model_copy(
            update={"id": f"2026120{i}T000000Z-{i:08x}"}
        )
        for i in range(5)
    ]
    for erasure in reversed(written):
        write_erasure(fs, root, erasure)
    fs.gone = f"{root}/_erasures/20261209T000000Z-ffffffff.json"
    assert [e.id for e in read_erasures(fs, root)] == [e.id for e in written]  # oldest first
    assert len(fs.batches) == 1 and len(fs.batches[0]) == 6
    fs.broken = f"{root}/_erasures/{written[2].id}.json"
    with pytest.raises(PermissionError):
        read_erasures(fs, root)
