"""Service logs, and the stacks a service writes when asked (spanmill.logs)."""

from __future__ import annotations

import subprocess
import sys


def test_sigusr1_writes_every_threads_stack_and_the_service_goes_on() -> None:
    code = (
        "import os, signal, threading, time\n"
        "from spanmill.logs import stacks_on_sigusr1\n"
        "stacks_on_sigusr1()\n"
        "def waiting_worker():\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=waiting_worker, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.2)\n"
        "print('still running')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"
    assert "Current thread" in done.stderr and "waiting_worker" in done.stderr, done.stderr
