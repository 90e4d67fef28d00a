"""A collector running on a thread of the calling process: for tools and tests.

The service runs it in a process of its own (:func:`spanmill.collector.run.main`);
this is for a program that wants spans to land in the store while it does
something else, and stops the collector (flushing what it holds) when done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from spanmill.collector.loop import Collector, CollectorError
from spanmill.config import CollectorSettings


@contextmanager
def collector_thread(
    settings: CollectorSettings, join_timeout: float = 60.0
) -> Iterator[Collector]:
    """Run a collector until the block ends; re-raise what made its loop fail."""
    collector = Collector(settings)
    collector.start()
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            collector.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=loop, name="spanmill-collector", daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        collector.stop()
        thread.join(timeout=join_timeout)
    if thread.is_alive():
        raise CollectorError(f"the collector did not stop within {join_timeout:.0f}s")
    if failure:
        raise failure[0]
