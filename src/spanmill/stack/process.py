"""Child processes that belong to the stack: started detached, stopped as a group.

Each service runs in a session of its own so that ``spanmill up`` can return while
it keeps running, and so that stopping it also stops whatever it spawned (MLflow's
workers, Triton's backend stubs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from spanmill.errors import StackError


@dataclass(frozen=True)
class ProcessRecord:
    """What is needed to find a started process again, and to be sure it is ours."""

    pid: int
    create_time: float
    argv0: str

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            # A recycled pid belongs to a process created later.
            return abs(proc.create_time() - self.create_time) < 1.0 and proc.status() not in (
                psutil.STATUS_ZOMBIE,
                psutil.STATUS_DEAD,
            )
        except psutil.Error:
            return False

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout``."""
        if not self.alive():
            return
        try:
            pgid = os.getpgid(self.pid)
        except ProcessLookupError:
            return
        members = _group_members(pgid)
        _signal_group(pgid, signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=timeout)
        if alive:
            _signal_group(pgid, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=5.0)


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start ``argv`` detached from the caller's session, output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            popen = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise StackError(f"cannot start {argv[0]}: {exc.strerror}") from None
    record = ProcessRecord(popen.pid, psutil.Process(popen.pid).create_time(), str(argv[0]))
    return popen, record


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    popen: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
    interval: float = 0.2,
) -> None:
    """Poll ``check`` until it holds; fail early if the process died, with its log tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            raise StackError(
                f"{what} exited with code {popen.returncode} while starting" + _log_tail(log_path)
            )
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(interval)
    raise StackError(f"{what} was not healthy after {timeout:.0f}s" + _log_tail(log_path))


def _log_tail(log_path: Path | None, lines: int = 20) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {log_path} ---\n" + "\n".join(tail)
