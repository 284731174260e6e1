"""``artsvc environments``: what is installed, as a developer adding a plugin wants to see it."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

import environments
from service.cli.app import app, console


def _describe(name: str) -> dict:
    try:
        env = environments.load(name)
        return {
            "name": name,
            "version": env.version,
            "scorer": f"{env.scorer_name} {env.scorer_version}",
            "splits": {split: len(env.scenarios(split)) for split in env.fingerprints() if split in environments.SPLITS},
            "arguments": environments.arguments_of(type(env)),
            "tools": [tool["function"]["name"] for tool in env.tools],
        }
    except Exception as exc:  # a broken plugin is listed with its error, not hidden
        return {"name": name, "error": f"{type(exc).__name__}: {exc}"}


@app.command("environments")
def list_environments(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per environment, one per line.")] = False,
) -> None:
    """List the installed environments (built-in and plugins) with their splits, arguments and tools."""
    described = [_describe(name) for name in sorted(environments.available())]
    if as_json:
        for row in described:
            typer.echo(json.dumps(row))
        return
    table = Table("name", "version", "scorer", "splits", "arguments", "tools")
    for row in described:
        if "error" in row:
            table.add_row(row["name"], "[red]failed to load[/red]", row["error"], "", "", "")
            continue
        splits = " ".join(f"{k}={v}" for k, v in row["splits"].items())
        arguments = " ".join(f"{k}={v!r}" for k, v in row["arguments"].items())
        table.add_row(row["name"], row["version"], row["scorer"], splits, arguments, ", ".join(row["tools"]))
    console.print(table)
