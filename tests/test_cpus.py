"""The CPUs a process may use (affinity, cgroup quota), and the threads torch is held to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spanmill.cpus import available_cpus, set_torch_threads, torch_threads


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_available_cpus_reads_the_cgroup_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path / "none") == affinity
    v2 = _cgroup(tmp_path / "v2", {"cpu.max": "50000 100000\n"})
    assert available_cpus(v2) == min(0.5, affinity)
    unlimited = _cgroup(tmp_path / "v2max", {"cpu.max": "max 100000\n"})
    assert available_cpus(unlimited) == affinity
    v1 = _cgroup(
        tmp_path / "v1",
        {"cpu,cpuacct/cpu.cfs_quota_us": "25000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
    )
    assert available_cpus(v1) == min(0.25, affinity)
    v1_none = _cgroup(
        tmp_path / "v1none",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert available_cpus(v1_none) == affinity


def test_torch_is_held_to_the_quota_unless_the_run_or_omp_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod limited to 1.5 CPUs on a node whose cores torch counts (96 here)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    quota = _cgroup(tmp_path / "pod", {"cpu.max": "150000 100000\n"})
    assert torch_threads(0, 96, cgroup=quota) == 1  # rounded down
    assert torch_threads(6, 96, cgroup=quota) == 6  # the run's num_threads stands
    assert torch_threads(0, 1, cgroup=quota) is None  # never more than torch's own choice
    assert torch_threads(0, 96, cgroup=tmp_path / "none") == (
        len(os.sched_getaffinity(0)) if len(os.sched_getaffinity(0)) < 96 else None
    )
    # torchrun sets it for each of several processes; torch has read it already.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert torch_threads(0, 96, cgroup=quota) is None


def test_set_torch_threads_applies_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)  # as on a node whose cores outnumber the pod's quota
        one = _cgroup(tmp_path / "pod", {"cpu.max": "100000 100000\n"})
        assert set_torch_threads(0, cgroup=one) == 1 == torch.get_num_threads()
        assert set_torch_threads(3, cgroup=one) == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
