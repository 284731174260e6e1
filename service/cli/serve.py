"""``artsvc serve``: the HTTP API, with an in-process worker unless ``--no-worker``.

It never migrates: an unmigrated database is refused with the command to run, so a deploy
decides when the schema changes. Local single-user mode is refused beyond loopback.
"""

from __future__ import annotations

import socket
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from service.settings import Settings, get_settings
from service.store.db import StoreError

from service.cli.app import app, console, fail


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="Address to bind (default: ARTSVC_HOST or 127.0.0.1).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port to bind, 0 for any (default: ARTSVC_PORT or 8000).")] = None,
    worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Train queued jobs in this process.")] = True,
    local: Annotated[bool, typer.Option("--local", help="Single-user mode without tokens (loopback only).")] = False,
) -> None:
    """Serve the job API (JSON under /v1, docs at /docs)."""
    import uvicorn

    from service.api.app import create_app

    overrides: dict[str, Any] = {"host": host, "port": port, "local_mode": True if local else None}
    settings = _settings({name: value for name, value in overrides.items() if value is not None})
    try:
        application = create_app(settings, run_worker=worker)
    except StoreError as exc:
        raise fail(str(exc)) from None
    config = uvicorn.Config(application, host=settings.host, port=settings.port, log_level="info")
    sock = _listen(settings.host, settings.port, backlog=config.backlog)
    bound_port = sock.getsockname()[1]
    address = f"[{settings.host}]" if ":" in settings.host else settings.host
    mode = "local single-user mode, no tokens" if settings.local_mode else "bearer tokens"
    console.print(
        f"artsvc listening on http://{address}:{bound_port} (docs at /docs; {mode}; "
        f"worker {'in-process' if worker else 'off: run `artsvc worker`'})",
        soft_wrap=True,
        highlight=False,
    )
    uvicorn.Server(config).run(sockets=[sock])


def _settings(overrides: dict[str, Any]) -> Settings:
    """The process settings with command-line overrides, validated (local mode beyond loopback is refused)."""
    try:
        return Settings.model_validate({**get_settings().model_dump(), **overrides})
    except ValidationError as exc:
        problems = [": ".join([*map(str, e["loc"][:1]), e["msg"].removeprefix("Value error, ")]) for e in exc.errors()]
        raise fail("; ".join(problems)) from None


def _listen(host: str, port: int, *, backlog: int) -> socket.socket:
    """A listening socket, so connections made while the app starts up wait instead of being refused."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(backlog)
    return sock
