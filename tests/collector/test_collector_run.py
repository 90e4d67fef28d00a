"""The collector service's lifetime: a stop asked for while it starts ends it cleanly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest
from collector_helpers import Topics, collector_process, ready, wait_for
from keep_alive import answers_after_idle

from spanmill.stack.ports import free_port

pytestmark = pytest.mark.services

# The service's own entry point, with SIGTERM arriving while it connects to Kafka (as
# when a pod is deleted as it comes up).
_STOPPED_WHILE_STARTING = """
import os, signal
from spanmill.collector.loop import Collector

start = Collector.start

def start_and_be_stopped(self):
    os.kill(os.getpid(), signal.SIGTERM)
    start(self)

Collector.start = start_and_be_stopped
from spanmill.collector.run import main
main()
"""


def test_sigterm_while_starting_stops_cleanly_and_starts_no_consumer_processes(
    topics: Topics, tmp_path: Path
) -> None:
    log = tmp_path / "collector.log"
    process = collector_process(
        topics,
        tmp_path / "store",
        log,
        free_port(),
        command=("-c", _STOPPED_WHILE_STARTING),
        processes="2",
        workers="0",
    )
    watched = psutil.Process(process.pid)
    children: set[int] = set()
    try:
        while process.poll() is None:
            children.update(child.pid for child in watched.children())
            try:
                process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert process.returncode == 0, text[-2000:]
    assert "signal 15: writing what is held, then stopping" in text
    assert "stopped" in text.splitlines()[-1], text[-2000:]
    assert not children, "no consumer process is started once a stop is asked for"


def test_an_idle_exporter_connection_outlives_the_exporters_own_idle_limit(
    topics: Topics, tmp_path: Path
) -> None:
    """The receiver keeps an idle connection open longer than clients keep theirs (5 s
    for httpx, uvicorn's default too), so no export goes out on one it is closing."""
    port = free_port()
    process = collector_process(topics, tmp_path / "store", tmp_path / "collector.log", port)
    try:
        wait_for(lambda: ready(port), 60, "the collector")
        assert answers_after_idle(f"http://127.0.0.1:{port}", "/readyz")
    finally:
        process.terminate()
        process.wait(timeout=60)
