"""A consumer process's memory settings: made as it starts, leaving the rest alone."""

from __future__ import annotations

import json
import subprocess
import sys

from spanmill.collector import tuning

_REPORT = """
import gc, json
before = gc.get_freeze_count()
from spanmill.collector.tuning import tune_process
refused = tune_process()
print(json.dumps({"refused": refused, "threshold": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "before": before,
                  "enabled": gc.isenabled()}))
"""


def test_tune_process_freezes_what_is_held_and_collects_less_often() -> None:
    # In a process of its own: the settings are the whole process's.
    done = subprocess.run(
        [sys.executable, "-c", _REPORT], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(done.stdout)
    assert report["before"] == 0
    assert report["frozen"] > 1000, "the modules' objects are out of the collector's passes"
    assert tuple(report["threshold"]) == (tuning.GC_THRESHOLD, 20, 20)
    assert report["enabled"], "cycles are still collected"
    # glibc (this machine's, and the images') takes every malloc setting.
    assert report["refused"] == []
