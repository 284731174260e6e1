"""``artsvc worker``: train queued jobs in this process, alongside any number of other workers.

SIGTERM or Ctrl-C stops claiming and lets each running job finish or checkpoint its current
step; its lease is released so another worker resumes it at once. A second signal quits now
(the leases then expire, as after a crash, and other workers take the jobs over).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Annotated, Optional

import typer
from sqlalchemy.engine import Engine

from service.settings import Settings, get_settings
from service.store import db as store_db

from service.cli.app import app, fail

MAX_CONCURRENCY = 64  # Settings.worker_concurrency


@app.command()
def worker(
    concurrency: Annotated[
        Optional[int],
        typer.Option(
            min=1, max=MAX_CONCURRENCY, help="Jobs trained at once (default: ARTSVC_WORKER_CONCURRENCY, else 1)."
        ),
    ] = None,
) -> None:
    """Train queued jobs until SIGTERM or Ctrl-C (the database must be migrated: `artsvc db upgrade`)."""
    settings = get_settings()
    if concurrency is not None:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    try:
        engine = store_db.make_engine(settings.resolved_database_url)
        store_db.check_migrated(engine)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.WARNING)
    logging.getLogger("service.worker").setLevel(logging.INFO)
    try:
        asyncio.run(_run(engine, settings))
    except KeyboardInterrupt:  # a second Ctrl-C
        raise typer.Exit(130) from None


async def _run(engine: Engine, settings: Settings) -> None:
    from service.worker import Worker  # imports torch and ART: keep `artsvc --help` fast

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def shut_down() -> None:
        stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)  # the next signal acts as usual: quit now

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shut_down)
    await Worker(engine, settings).run(stop)
