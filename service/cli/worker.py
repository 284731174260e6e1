"""``artsvc worker``: train queued jobs in this process, alongside any number of other workers.

SIGTERM or Ctrl-C stops claiming and lets each running job finish or checkpoint its current
step; its lease is released so another worker resumes it at once. A second signal quits now
(the leases then expire, as after a crash, and other workers take the jobs over).

``artsvc serve`` starts its workers with ``--supervised-by`` (its pid): such a worker lowers its
CPU priority (``ARTSVC_WORKER_CPU_POLICY``: SCHED_IDLE, or ``ARTSVC_WORKER_NICE``) and, on Linux, gets
SIGTERM when serve dies; a second signal changes nothing (serve kills it when its grace period is over).
When serve dies, a thread sees it too (``watch_parent``): the worker stops, and is killed if it has not
within a few seconds, even in the middle of a step.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer
from sqlalchemy.engine import Engine

from service.cli.app import app, fail, log_to_stderr
from service.cpu import wait_passively
from service.settings import Settings, get_settings
from service.store import db as store_db
from service.worker.supervisor import settle_as_child, watch_parent

MAX_CONCURRENCY = 64  # Settings.worker_concurrency


@app.command()
def worker(
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1, max=MAX_CONCURRENCY, help="Jobs trained at once (default: ARTSVC_WORKER_CONCURRENCY, else 1)."
        ),
    ] = None,
    supervised_by: Annotated[
        int | None, typer.Option(hidden=True, help="The pid of the serve that started it.")
    ] = None,
) -> None:
    """Train queued jobs until SIGTERM or Ctrl-C (the database must be migrated: `artsvc db upgrade`)."""
    wait_passively()  # before torch loads
    settings = get_settings()
    if supervised_by is not None and not settle_as_child(
        parent=supervised_by, cpu_policy=settings.worker_cpu_policy, nice=settings.worker_nice
    ):
        return  # serve is gone already
    if concurrency is not None:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    try:
        engine = store_db.make_engine(settings.resolved_database_url)
        store_db.check_migrated(engine)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None
    log_to_stderr()
    try:
        asyncio.run(_run(engine, settings, supervised_by=supervised_by))
    except KeyboardInterrupt:  # a second Ctrl-C
        raise typer.Exit(130) from None


async def _run(engine: Engine, settings: Settings, *, supervised_by: int | None) -> None:
    from service.worker.runner import Worker

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def shut_down() -> None:
        stop.set()
        if supervised_by is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)  # the next signal acts as usual: quit now

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shut_down)
    if supervised_by is not None:
        watch_parent(supervised_by, lambda: loop.call_soon_threadsafe(shut_down))
    await Worker(engine, settings).run(stop)
