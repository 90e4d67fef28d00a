"""The consume loop hands ledger pruning to a thread of its own: on an object store it
is a request for each entry, and the loop must go on polling meanwhile."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from spanmill.collector.loop import Collector
from spanmill.config import CollectorSettings


def test_pruning_runs_beside_the_loop_one_at_a_time(tmp_path: Path) -> None:
    collector = Collector(CollectorSettings(store_url=str(tmp_path), receiver_enabled=False))
    collector._committed = {0: 100, 2: 50}
    release = threading.Event()
    pruned: list[tuple[int, int]] = []

    def slow_prune(topic: str, partition: int, committed: int, older_than_s: float) -> int:
        # A store that takes its time answering: held until the test lets it go.
        release.wait(timeout=60)
        pruned.append((partition, committed))
        return 0

    collector.ledger.prune_ledger = slow_prune  # type: ignore[method-assign]
    collector._prune()
    pruning = collector._pruning
    assert pruning is not None and pruning.is_alive() and pruned == []
    collector._committed[0] = 200
    collector._prune()  # the first is still at work: no second one beside it
    assert collector._pruning is pruning

    release.set()
    pruning.join(timeout=30)
    assert sorted(pruned) == [(0, 100), (2, 50)]
    collector._prune()
    assert collector._pruning is not pruning
    collector._pruning.join(timeout=30)
    assert sorted(pruned) == [(0, 100), (0, 200), (2, 50), (2, 50)]


def test_a_failed_pruning_is_logged_and_the_next_one_runs(tmp_path: Path, caplog: Any) -> None:
    collector = Collector(CollectorSettings(store_url=str(tmp_path), receiver_enabled=False))
    collector._committed = {1: 10}

    def refusing(*args: Any) -> int:
        raise PermissionError("the store refused the listing")

    collector.ledger.prune_ledger = refusing  # type: ignore[method-assign]
    collector._prune()
    assert collector._pruning is not None
    collector._pruning.join(timeout=30)
    assert "pruning the ledger of partition 1 failed" in caplog.text
