"""The FastAPI application: store, auth, routers, limits, metrics, and optionally a worker.

``create_app`` refuses to start against an unmigrated database (StoreError saying to run
``artsvc db upgrade``). With ``run_worker`` the app trains jobs in-process (the embedded
default of ``artsvc serve``); otherwise separate ``artsvc worker`` processes do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.engine import Engine

from service import __version__
from service.api import errors, limits, metrics
from service.api.routes import alerts, curves, environments, evaluations, events, health, jobs, ui
from service.settings import Settings, get_settings
from service.store import db as store_db


def create_app(settings: Settings | None = None, *, engine: Engine | None = None, run_worker: bool = False) -> FastAPI:
    settings = settings or get_settings()
    engine = engine or store_db.make_engine(settings.resolved_database_url)
    store_db.check_migrated(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not run_worker:
            yield
            return
        from service.worker import Worker  # imports torch and ART: only when this process trains

        stop = asyncio.Event()
        task = asyncio.create_task(Worker(engine, settings).run(stop))
        app.state.worker_task = task
        try:
            yield
        finally:
            stop.set()
            await task

    app = FastAPI(
        title="artsvc",
        version=__version__,
        summary="Train agents with reinforcement learning through OpenPipe ART.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    errors.install(app)
    metrics.install(app)
    app.add_middleware(limits.BodySizeLimit, max_bytes=settings.max_body_bytes)
    for module in (jobs, evaluations, events, alerts, curves, environments, health, ui):
        app.include_router(module.router)
    return app
