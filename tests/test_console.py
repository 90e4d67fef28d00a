"""The CLI's error line: one readable message and exit status 1."""

from __future__ import annotations

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
