"""Compaction under load: the collector writes the current hour, and now and then a batch
of an earlier hour again (a replay after a crash), while ``spanmill store compact``
rewrites the earlier hours and is killed with SIGKILL at random points, and a reader
counts the earlier hours' spans in a loop. Every count is exact, and the next run
finishes the work."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from store_upkeep import HOUR_NS, Feeder, hour_span

from spanmill.store import SpanStore
from spanmill.store.layout import parse_part_name

OLD_HOURS = 12
BATCHES = 30
PER_BATCH = 10


def _compact(url: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SPANMILL_STORE_URL": url,
        "SPANMILL_STORE_SETTLE_SECONDS": "0",
        "SPANMILL_STORE_TARGET_ROWS": "120",  # several parts an hour: more points to die at
        "SPANMILL_STORE_STALE_SECONDS": "0",  # one job at a time: what a dead one left is stale
    }
    return subprocess.Popen(
        [sys.executable, "-m", "spanmill", "store", "compact"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _work_begun(url: str, before: set[str], job: subprocess.Popen[bytes]) -> None:
    """Wait until ``job`` writes its first compacted part (a name not in ``before``) or
    ends: a slow start (imports, the calls' join) must not use up the time to the kill."""
    while job.poll() is None:
        if any(p.name not in before for p in Path(url).rglob("compacted-*.parquet")):
            return
        time.sleep(0.01)


def _midway(url: str, first: int, hours: int) -> int:
    """1 when a killed run left work half done: some earlier hours compacted and some
    not, or parts of a generation that never completed."""
    done = {
        f.hour
        for f in SpanStore(url).files()
        if f.part is not None and first <= f.hour < first + hours
    }
    incomplete = False
    for path in Path(url).rglob("compacted-*.parquet"):
        part = parse_part_name(path.name)
        assert part is not None
        siblings = list(path.parent.glob(f"compacted-{part.generation}-*.parquet"))
        incomplete |= len(siblings) < part.parts
    return int(incomplete or 0 < len(done) < hours)


def test_readers_count_exactly_while_compaction_is_killed_and_the_collector_writes(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "store")
    now_hour = time.time_ns() // HOUR_NS * HOUR_NS
    first_hour = now_hour - OLD_HOURS * HOUR_NS
    feeder = Feeder(url)
    n = 0
    for hour in range(OLD_HOURS):
        for batch in range(BATCHES):
            spans = [hour_span(first_hour + hour * HOUR_NS, n + i) for i in range(PER_BATCH)]
            n += PER_BATCH
            feeder.write(spans, partition=batch % 3)
    expected = n
    old_jobs = list(feeder.jobs)
    window = {"start": first_hour, "end": now_hour}
    assert SpanStore(url).count(**window) == expected

    stop, stop_collector = threading.Event(), threading.Event()
    counts: list[int] = []
    written = [0]
    failures: list[BaseException] = []

    def collector() -> None:
        rng = random.Random(1)
        k = 10**6
        try:
            while not stop_collector.is_set():
                spans = [hour_span(now_hour, k + i) for i in range(PER_BATCH)]
                k += PER_BATCH
                feeder.write(spans, partition=rng.randrange(3))
                written[0] += PER_BATCH
                if rng.random() < 0.3:
                    feeder.replay(rng.choice(old_jobs))
                time.sleep(0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    def reader() -> None:
        store = SpanStore(url)
        try:
            while not stop.is_set():
                counts.append(store.count(**window))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=collector), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    rng = random.Random(7)
    kills = midway = 0
    try:
        for _ in range(10):
            before = {p.name for p in Path(url).rglob("compacted-*.parquet")}
            job = _compact(url)
            _work_begun(url, before, job)
            try:
                job.wait(timeout=rng.uniform(0.0, 1.2))
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
                kills += 1
                midway += _midway(url, first_hour // HOUR_NS, OLD_HOURS)
        stop_collector.set()  # what it wrote last is left for the final run to finish
        threads[0].join()
        final = _compact(url)
        _, err = final.communicate(timeout=300)
        assert final.returncode == 0, err.decode()[-2000:]
        time.sleep(0.5)  # the reader reads the finished store too
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures, failures
    assert midway >= 1 and kills >= 2, f"{kills} kills, {midway} mid-way: the test proves nothing"
    assert len(counts) > 20 and set(counts) == {expected}, sorted(set(counts))

    # The work is finished: each earlier hour is one complete generation and nothing else.
    store = SpanStore(url)
    for hour in range(OLD_HOURS):
        index = first_hour // HOUR_NS + hour
        live = [f for f in store.files() if f.hour == index]
        assert live and all(f.part is not None for f in live)
        assert len({f.part.generation for f in live if f.part}) == 1
    current = f"hour={time.gmtime(now_hour / 1e9).tm_hour:02d}"
    stray = [
        p
        for p in (tmp_path / "store").rglob("*")
        if p.is_file()
        and p.parent.name.startswith("hour=")
        and p.parent.name != current
        and (p.name.startswith(".") or parse_part_name(p.name) is None)
    ]
    assert stray == [], "the final run left temp files or replaced files behind"
    assert store.count(**window) == expected
    assert store.count(start=now_hour) == written[0]
    assert store.duplicates() == 0
