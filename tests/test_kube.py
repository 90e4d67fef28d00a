"""Every call spanmill makes to the Kubernetes API is bounded (spanmill.kube)."""

from __future__ import annotations

import ast
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spanmill.kube import request_timeout

SRC = Path(__file__).resolve().parents[1] / "src" / "spanmill"
# The client's calls by their names: CoreV1Api.read_namespaced_config_map,
# CustomObjectsApi.get_namespaced_custom_object, DiscoveryV1Api.list_namespaced_..., and
# the calls a watch streams.
API_CALL = re.compile(r"^(read|list|create|patch|replace|delete|get)_(namespaced_|cluster_)")


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if API_CALL.match(name) or name == "stream":
                out.append((name, node))
    return out


def test_every_kubernetes_api_call_passes_a_bound_the_client_honours() -> None:
    """A call without ``_request_timeout`` waits for ever; one with a float waits for ever
    too (the client takes a bare number only as an int). Each passes request_timeout()."""
    found, unbounded = 0, []
    for path in sorted(SRC.rglob("*.py")):
        for name, call in _calls(ast.parse(path.read_text(), str(path))):
            if name == "stream" and "watch" not in ast.unparse(call.func).lower():
                continue
            found += 1
            bound = next((k.value for k in call.keywords if k.arg == "_request_timeout"), None)
            given = (
                isinstance(bound, ast.Call)
                and isinstance(bound.func, ast.Name)
                and bound.func.id == "request_timeout"
            )
            if not given:
                unbounded.append(f"{path.relative_to(SRC)}:{call.lineno} {name}")
    assert found >= 20, found  # the scan finds the calls it is there to check
    assert unbounded == [], unbounded


def test_the_scan_finds_a_call_left_unbounded() -> None:
    bad = ast.parse(
        "core.read_namespaced_config_map('a', 'b')\n"
        "core.read_namespaced_config_map('a', 'b', _request_timeout=10.0)\n"
        "core.read_namespaced_config_map('a', 'b', _request_timeout=request_timeout())\n"
    )
    calls = [c for _, c in _calls(bad)]
    assert len(calls) == 3
    kinds = [ast.unparse(k.value) for c in calls for k in c.keywords]
    assert kinds == ["10.0", "request_timeout()"]


def test_a_silent_api_server_ends_a_call_in_the_bound() -> None:
    """The real client, a server that takes the connection and never answers: the call
    ends in a timeout error (a bare float bound would wait for ever; the child is killed
    at 60 s and the test fails)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    code = (
        "from kubernetes import client\n"
        "from spanmill.kube import request_timeout\n"
        f"c = client.Configuration(); c.host = 'http://127.0.0.1:{port}'; c.retries = 0\n"
        "api = client.CoreV1Api(client.ApiClient(c))\n"
        "try:\n"
        "    api.read_namespaced_config_map('a', 'b', _request_timeout=request_timeout(1.0))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("ReadTimeoutError", "MaxRetryError"), done.stdout


@pytest.mark.parametrize("seconds", [None, 2.5])
def test_the_bound_is_a_pair(seconds: float | None) -> None:
    bound = request_timeout(seconds)
    assert isinstance(bound, tuple) and bound == (seconds or 10.0, seconds or 10.0)
