"""spanmill's benchmarks: each module has a ``main()`` that prints its figures."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(run: Callable[[], object], times: int = 3) -> float:
    """The median wall time of ``times`` calls of ``run``."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        took.append(time.perf_counter() - started)
    return statistics.median(took)
