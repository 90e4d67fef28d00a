"""``spanmill up | down | status``: the embedded stack on this machine."""

from __future__ import annotations

import typer
from rich.table import Table

from spanmill.cli.console import console, handle_errors
from spanmill.config import StackSettings, load_settings
from spanmill.stack.local import LocalStack
from spanmill.stack.services import RunningService


def _stack() -> LocalStack:
    return LocalStack(load_settings(StackSettings))


@handle_errors
def up() -> None:
    """Start the local stack on 127.0.0.1 (the tansu broker, MLflow, tritonserver, the gateway
    and the collector) and wait until healthy."""
    stack = _stack()

    def started(service: RunningService) -> None:
        console.print(f"[green]✓[/] {service.name:<7} {service.url}  (pid {service.process.pid})")

    with console.status("starting the local stack…"):
        stack.up(on_started=started)
    console.print(f"state in {stack.state_file}")


@handle_errors
def down() -> None:
    """Stop exactly the services that `spanmill up` started."""
    stopped = _stack().down(on_stopped=lambda name: console.print(f"[yellow]■[/] {name} stopped"))
    if not stopped:
        console.print("nothing was running")


@handle_errors
def status() -> None:
    """Show each service of the local stack: pid, health and address."""
    rows = _stack().status()
    table = Table("service", "pid", "state", "address", "log")
    for row in rows:
        state = (
            "[green]healthy[/]"
            if row.healthy
            else ("[yellow]running, not healthy[/]" if row.running else "[dim]stopped[/]")
        )
        table.add_row(row.name, str(row.pid or "-"), state, row.url, row.log_path)
    console.print(table)
    if any(r.running and not r.healthy for r in rows):
        raise typer.Exit(2)
