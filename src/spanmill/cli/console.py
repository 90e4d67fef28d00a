"""Shared terminal output and error handling for the CLI."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.rule import Rule

from spanmill.errors import SpanmillError

# A terminal gives rich its width. Written to a pipe or a log, rich would wrap every
# table at 80 columns and split a row's cells over several lines; there a row stays
# whole on one line, as wide as its cells (COLUMNS, where set, still decides).
PIPE_WIDTH = 1000
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH)
# What fills a line rather than fitting its content (a titled rule) is this wide there.
LINE_WIDTH = 80
# Messages on stderr go out one line each, as long as they are: a terminal wraps them
# itself, and a log or a pipe gets paths in them unbroken.
err_console = Console(stderr=True, soft_wrap=True)


def heading(title: str) -> None:
    """A titled rule across the terminal, or across 80 columns in a pipe or a log."""
    width = console.width if console.is_terminal else min(console.width, LINE_WIDTH)
    console.print(Rule(title), width=width)


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
