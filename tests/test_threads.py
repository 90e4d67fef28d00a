"""Torch's OpenMP threads sleep when idle in every process that imports spanmill."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def openmp_spin_count(env_policy: str | None) -> int:
    """GOMP_SPINCOUNT as the OpenMP runtime that torch loads reports it at start."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    shown = subprocess.run(
        [sys.executable, "-c", "import spanmill, torch; torch.ones(4).sum()"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found = re.search(r"GOMP_SPINCOUNT = '(\d+)'", shown)
    assert found, shown
    return int(found.group(1))


def test_idle_threads_sleep_instead_of_spinning() -> None:
    # Unset, the runtime spins 300,000 rounds before sleeping; passive spins none.
    assert openmp_spin_count(None) == 0


def test_a_policy_the_user_set_wins() -> None:
    assert openmp_spin_count("ACTIVE") > 0
