"""The CLI's output in logs and pipes: errors on one line, table rows whole."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from spanmill.cli.console import handle_errors
from spanmill.errors import ConfigError


def test_an_error_is_printed_whole_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Longer than any width rich would wrap to: a log or a pipe gets the path unbroken.
    path = "/var/run/" + "/".join(["a-folder-with-a-long-name"] * 8) + "/password"

    @handle_errors
    def fail() -> None:
        raise ConfigError(f"the pipeline user's credentials: {path} is empty")

    with pytest.raises(typer.Exit) as exited:
        fail()
    assert exited.value.exit_code == 1
    assert capsys.readouterr().err == f"error: the pipeline user's credentials: {path} is empty\n"


def test_a_table_written_to_a_pipe_keeps_each_row_on_one_line() -> None:
    # rich would wrap at 80 columns without a terminal; `spanmill ... | grep` needs rows.
    script = (
        "from rich.table import Table\n"
        "from spanmill.cli.console import console\n"
        "table = Table('path', 'versions')\n"
        "table.add_row('/store/' + 'a-long-folder/' * 10 + 'part.parquet', 'agent v1, agent v2')\n"
        "console.print(table)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout
    row = [line for line in out.splitlines() if "part.parquet" in line]
    assert len(row) == 1, out
    assert "/store/" + "a-long-folder/" * 10 + "part.parquet" in row[0]
    assert "agent v1, agent v2" in row[0]


def test_a_heading_written_to_a_pipe_is_a_line_wide() -> None:
    script = "from spanmill.cli.console import heading\nheading('1. the embedded stack')\n"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "1. the embedded stack" in out
    assert len(out.rstrip("\n")) == 80, out
