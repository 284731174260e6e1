"""The typer application every ``artsvc`` verb registers on, and the shared error exit."""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(help="Train agents with reinforcement learning through OpenPipe ART.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """One red line on stderr and exit code 2: how every verb reports bad input."""
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code=2)


def log_to_stderr() -> None:
    """Warnings from everything and the workers' news (claims, releases, restarts) on stderr, with timestamps."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.WARNING)
    logging.getLogger("service.worker").setLevel(logging.INFO)
