"""Shared terminal output and error handling for the CLI."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from spanmill.errors import SpanmillError

# A terminal gives rich its width. Written to a pipe or a log, rich would wrap every
# table at 80 columns and split a row's cells over several lines; there a row stays
# whole on one line, as wide as its cells (COLUMNS, where set, still decides).
PIPE_WIDTH = 1000
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH)
# Messages on stderr go out one line each, as long as they are: a terminal wraps them
# itself, and a log or a pipe gets paths in them unbroken.
err_console = Console(stderr=True, soft_wrap=True)

P = ParamSpec("P")
R = TypeVar("R")


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Show a SpanmillError as one readable message and exit 1, without a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except SpanmillError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(1) from None

    return wrapper
