"""The CPUs this process may use, and the threads torch runs on them.

A container's CPU limit is a cgroup quota, not fewer cores: ``os.cpu_count()`` and
torch's own choice of threads (the cores it sees) are the node's: a training pod
limited to 8 CPUs on a 96-core node would start a thread per core, each throttled by
the quota for most of each period. Where a run does not set its threads, torch is held
to the CPUs the process may use (:func:`torch_threads`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Final

CGROUP: Final = Path("/sys/fs/cgroup")


def available_cpus(cgroup: Path | None = None) -> float:
    """CPUs this process may use: its affinity, bounded by a cgroup v2 or v1 CPU quota
    (``cgroup``: the cgroup file system's root, /sys/fs/cgroup by default)."""
    cpus = float(len(os.sched_getaffinity(0)))
    quota = _cgroup_quota(CGROUP if cgroup is None else cgroup)
    return min(cpus, quota) if quota is not None else cpus


def _cgroup_quota(cgroup: Path) -> float | None:
    """The CPU quota in CPUs (quota over period), or None where there is none."""
    try:
        fields = (cgroup / "cpu.max").read_text().split()  # v2: "max 100000", "150000 100000"
    except OSError:
        fields = []
    if len(fields) == 2:
        return None if fields[0] == "max" else int(fields[0]) / int(fields[1])
    for folder in ("cpu", "cpu,cpuacct"):  # v1: -1 for no quota
        try:
            quota = int((cgroup / folder / "cpu.cfs_quota_us").read_text())
            period = int((cgroup / folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def torch_threads(num_threads: int, current: int, *, cgroup: Path | None = None) -> int | None:
    """The threads torch is to use, or None to leave ``current`` (its own choice) as it is.

    ``num_threads`` above 0 is the run's choice. Otherwise, where ``OMP_NUM_THREADS`` does
    not say (torch reads it itself; a launcher of several processes sets it), the CPUs
    the process may use, rounded down, at least one, where torch would start more.
    """
    if num_threads > 0:
        return num_threads
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return None
    allowed = max(1, math.floor(available_cpus(cgroup)))
    return allowed if allowed < current else None


def set_torch_threads(num_threads: int, *, cgroup: Path | None = None) -> int:
    """Apply :func:`torch_threads`; the threads torch uses after."""
    import torch

    threads = torch_threads(num_threads, torch.get_num_threads(), cgroup=cgroup)
    if threads is not None:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())
