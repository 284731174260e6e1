"""``artsvc serve``: the HTTP API in this process, and its workers as child processes it supervises.

Training never shares the API's interpreter (service/worker/supervisor.py starts ``ARTSVC_WORKERS``
``artsvc worker`` children at a lower CPU priority and starts again any that dies). SIGTERM or Ctrl-C
stops the workers first (each hands its jobs back at a step boundary), then the API; a second signal
kills the workers and drops open connections. It imports the installed environments before it
listens, as a submission needs them. It never migrates: an unmigrated database is refused
with the command to run, so a deploy decides when the schema changes. Local single-user mode is
refused beyond loopback.

One Python process answers a few thousand keyed reads a second at most (its event loop and GIL). With
``--api-processes N`` above 1 (``ARTSVC_API_PROCESSES``) this process binds the socket and answers nothing itself: it
supervises N children serving the API on that socket (the kernel hands each connection to one), started again when one
dies and stopped after the workers. Their latency histograms are summed through prometheus_client's multiprocess
files, so ``/metrics`` from any of them shows all; SQLite writers of all of them take turns
(service/store/db.py, ``one_writer``); each has its own connection pool and request and stream caps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
import uvicorn
from pydantic import ValidationError

import environments
from service.cli.app import app, console, fail, log_to_stderr
from service.cli.head_deadline import head_timed_protocol
from service.cli.metrics_folder import metrics_folder
from service.gc_frozen import freeze_startup_objects
from service.settings import Settings, get_settings
from service.store.db import StoreError, check_migrated, make_engine
from service.worker.supervisor import Supervisor, api_processes, settle_as_child, worker_processes

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)
MAX_WORKERS = 64  # Settings.workers
MAX_API_PROCESSES = 64  # Settings.api_processes
BACKLOG = 2048  # uvicorn's default


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (default: ARTSVC_HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind, 0 for any (default: ARTSVC_PORT or 8000).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=0, max=MAX_WORKERS, help="Worker processes to run and restart (default: ARTSVC_WORKERS, else 1)."
        ),
    ] = None,
    no_worker: Annotated[
        bool, typer.Option("--no-worker", help="Run no worker, as --workers 0 (train with `artsvc worker` elsewhere).")
    ] = False,
    access_log: Annotated[
        bool, typer.Option("--access-log", help="Log every request (off: /metrics has the latency histogram).")
    ] = False,
    local: Annotated[bool, typer.Option("--local", help="Single-user mode without tokens (loopback only).")] = False,
    api_processes: Annotated[
        int | None,
        typer.Option(
            min=1, max=MAX_API_PROCESSES,
            help="Processes answering requests on the one socket (default: ARTSVC_API_PROCESSES, else 1).",
        ),
    ] = None,  # fmt: skip
    listen_fd: Annotated[int | None, typer.Option(hidden=True, help="The socket of the serve that started it.")] = None,
    supervised_by: Annotated[int | None, typer.Option(hidden=True, help="The pid of the serve that started it.")] = None,
) -> None:
    """Serve the job API (JSON under /v1, docs at /docs) and run its workers."""
    overrides: dict[str, Any] = {
        "host": host, "port": port, "local_mode": True if local else None, "workers": 0 if no_worker else workers,
        "api_processes": api_processes,
    }  # fmt: skip
    settings = _settings({name: value for name, value in overrides.items() if value is not None})
    if listen_fd is not None:  # one of the API processes of a serve with --api-processes above 1
        if supervised_by is None or settle_as_child(parent=supervised_by):
            _serve_on(_inherited(listen_fd), settings, access_log=access_log)
        return
    if settings.api_processes > 1:
        _supervise_api_processes(settings, access_log=access_log)
        return
    application = _application(settings)
    supervisor = worker_processes(settings)
    application.state.metrics_registry.register(supervisor)
    sock = _listen(settings.host, settings.port)
    _say_where(sock, settings)
    _serve_on(sock, settings, access_log=access_log, application=application, workers=supervisor)


def _application(settings: Settings) -> FastAPI:
    """The app, ready to serve: the store checked, the environments imported, start-up's objects frozen."""
    from service.app import create_app

    try:
        application = create_app(settings)
    except StoreError as exc:
        raise fail(str(exc)) from None
    log_to_stderr()
    _import_environments()
    # a full collection answered no request for 0.4 s while the API still imported torch and ART; under load one came
    # every few seconds and set the API's p99
    freeze_startup_objects()
    return application


def _serve_on(
    sock: socket.socket, settings: Settings, *, access_log: bool, application: FastAPI | None = None,
    workers: Supervisor | None = None,
) -> None:  # fmt: skip
    """Serve ``application`` (a new one if None) on ``sock`` until SIGTERM or Ctrl-C, supervising ``workers``."""
    application = application or _application(settings)
    workers = workers or Supervisor([], count=0, env={}, grace_s=0, kind="worker")
    protocol = head_timed_protocol(settings.request_head_timeout_s)  # uvicorn times no request head itself
    config = uvicorn.Config(application, log_level="info", access_log=access_log, http=protocol)
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(_serve(_Server(config), sock, workers))


def _supervise_api_processes(settings: Settings, *, access_log: bool) -> None:
    """``--api-processes`` above 1: bind, then supervise the API processes and the workers until SIGTERM or Ctrl-C;
    the workers stop first (they hand their jobs back), then the API processes."""
    engine = make_engine(settings.resolved_database_url)
    try:
        check_migrated(engine)  # refused here, once, rather than in every child as it starts again and again
    except StoreError as exc:
        raise fail(str(exc)) from None
    finally:
        engine.dispose()
    log_to_stderr()
    sock = _listen(settings.host, settings.port)
    with metrics_folder() as status_dir:
        workers = worker_processes(settings, status_dir=status_dir)
        apis = api_processes(settings, listen_fd=sock.fileno(), status_dir=status_dir, access_log=access_log)
        _say_where(sock, settings)
        asyncio.run(_supervise(workers, apis))
    sock.close()


async def _supervise(workers: Supervisor, apis: Supervisor) -> None:
    stop, workers_stopped = asyncio.Event(), asyncio.Event()
    _stop_on_signals(stop, hurry=lambda: (workers.hurry(), apis.hurry()))

    async def workers_then_apis() -> None:
        await workers.run(stop)
        workers_stopped.set()

    await asyncio.gather(workers_then_apis(), apis.run(workers_stopped))


def _say_where(sock: socket.socket, settings: Settings) -> None:
    bound_port = sock.getsockname()[1]
    address = f"[{settings.host}]" if ":" in settings.host else settings.host
    mode = "local single-user mode, no tokens" if settings.local_mode else "bearer tokens"
    count = settings.workers
    workers_said = f"{count} worker process{'es' if count > 1 else ''}" if count else "no worker: run `artsvc worker`"
    apis_said = f"{settings.api_processes} API processes; " if settings.api_processes > 1 else ""
    console.print(
        f"artsvc listening on http://{address}:{bound_port} (docs at /docs; {mode}; {apis_said}{workers_said})",
        soft_wrap=True,
        highlight=False,
    )


class _Server(uvicorn.Server):
    """uvicorn, leaving SIGTERM and SIGINT to ``_serve``, which stops the workers before the API."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(server: uvicorn.Server, sock: socket.socket, supervisor: Supervisor) -> None:
    """Serve and supervise until SIGTERM or Ctrl-C; then stop the workers, then the API."""
    stop = asyncio.Event()

    def hurry() -> None:
        supervisor.hurry()
        server.force_exit = True

    _stop_on_signals(stop, hurry=hurry)

    async def workers_then_api() -> None:
        await supervisor.run(stop)
        server.should_exit = True

    supervising = asyncio.create_task(workers_then_api())
    try:
        await server.serve(sockets=[sock])
    finally:
        stop.set()
        await supervising


def _stop_on_signals(stop: asyncio.Event, *, hurry: Callable[[], object]) -> None:
    """SIGTERM or Ctrl-C sets ``stop``; a second one calls ``hurry`` too (quit now)."""

    def on_signal() -> None:
        if stop.is_set():
            hurry()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, on_signal)


def _import_environments() -> None:
    """Import the installed environments before listening: a submission loads its job's environment, and the first
    one should not wait for a plugin's imports while an operator watches (the built-ins import ART, and with it
    torch and litellm, only when they make a trajectory, which the API never does: 0.2 s instead of 7 s here)."""
    for name, entry in environments.available().items():
        try:
            entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not keep the API down
            log.warning("environment %s cannot be imported: %s: %s", name, type(exc).__name__, exc)


def _settings(overrides: dict[str, Any]) -> Settings:
    """The process settings with command-line overrides, validated (local mode beyond loopback is refused)."""
    try:
        return Settings.model_validate({**get_settings().model_dump(), **overrides})
    except ValidationError as exc:
        problems = [": ".join([*map(str, e["loc"][:1]), e["msg"].removeprefix("Value error, ")]) for e in exc.errors()]
        raise fail("; ".join(problems)) from None


def _inherited(fd: int) -> socket.socket:
    """The listening socket serve handed down as descriptor ``fd``."""
    try:
        return socket.socket(fileno=fd)
    except OSError as exc:
        raise fail(f"--listen-fd {fd}: not a socket of this process ({exc.strerror or exc})") from None


def _listen(host: str, port: int, *, backlog: int = BACKLOG) -> socket.socket:
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
