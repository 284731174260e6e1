"""The FastAPI application, assembled from service/api: store, auth, routers, limits, metrics. It trains nothing: worker processes do
(``artsvc serve`` runs them as its children, service/worker/supervisor.py, or ``artsvc worker`` apart).

``create_app`` refuses to start against an unmigrated database (StoreError saying to run
``artsvc db upgrade``).

Keyed reads (the caller's token, a job by id, a page of jobs) run on the event loop, on a connection of its
own kept open (``loop_reads``), whose statements give up after ``LOOP_READ_WAIT_S`` so the loop cannot stall for longer
(service/api/deps.py says why). Connections and threads are sized together: the pool holds
``db_pool_size + db_max_overflow`` connections and sync routes and dependencies run on as many threads (anyio's
default limiter, set at startup, whose tokens the async routes' store work takes too: service/api/threads.py), so a
request thread normally finds a connection; ``/healthz`` has a connection of its
own, so a busy pool never makes the server look dead. Chat completions on trained checkpoints run in an
inference process of their own, a child at the workers' CPU priority that serves callers in turn
(service/inference/), never in this process. Requests past ``max_concurrent_requests`` get 503 at once, each
token's past its share 429 and those without a valid credential share a small pool (service/api/overload.py);
slow bodies get 408 (service/api/limits.py); live event streams have caps of their own
(service/api/routes/events.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.engine import Engine

from service import __version__
from service.api import errors, hosts, limits, metrics, overload
from service.api.loop_reads import LoopReads
from service.api.loop_writes import LoopWrites
from service.api.slot_owners import SlotOwners
from service.api.threads import request_threads
from service.api.routes import (
    alerts, checkpoints, curves, environments, evaluations, events, health, inference, jobs, preview, ui,
)  # fmt: skip
from service.inference import InferenceEngine
from service.settings import Settings, get_settings
from service.store import db as store_db

BATCH_BODY_TIMEOUT_S = 300.0  # a batch of ART's client may be tens of MiB: the time its body may take to arrive
LOOP_READ_WAIT_S = 1.0  # the longest a keyed read may hold the event loop (a lock wait, a slow server)


def create_app(settings: Settings | None = None, *, engine: Engine | None = None) -> FastAPI:
    settings = settings or get_settings()
    engine = engine or store_db.make_engine(
        settings.resolved_database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout_s=settings.db_pool_timeout_s,
    )
    store_db.check_migrated(engine)
    url = engine.url.render_as_string(hide_password=False)
    health_engine = store_db.make_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=settings.db_pool_timeout_s)
    loop_engine = store_db.make_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=LOOP_READ_WAIT_S, wait_s=LOOP_READ_WAIT_S)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.request_threads = request_threads(settings.db_pool_size + settings.db_max_overflow)
        yield
        app.state.request_threads.shutdown(wait=False)
        app.state.inference.close()
        app.state.loop_reads.close()
        app.state.loop_writes.close()
        loop_engine.dispose()
        health_engine.dispose()

    app = FastAPI(
        title="artsvc",
        version=__version__,
        summary="Train agents with reinforcement learning through OpenPipe ART.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.health_engine = health_engine
    app.state.loop_reads = LoopReads(loop_engine)
    app.state.loop_writes = LoopWrites(url)
    app.state.inference = InferenceEngine(settings)
    app.state.stream_slots = events.StreamSlots(
        max_streams=settings.max_event_streams, max_per_caller=settings.max_event_streams_per_tenant
    )
    errors.install(app)
    metrics.install(app)
    batch_timeout_s = max(settings.request_body_timeout_s, BATCH_BODY_TIMEOUT_S)
    batch_limits = limits.PathLimits(settings.client_batch_max_bytes, batch_timeout_s, "ARTSVC_CLIENT_BATCH_MAX_BYTES")
    app.add_middleware(limits.BodyLimits, max_bytes=settings.max_body_bytes, timeout_s=settings.request_body_timeout_s,
                       larger={"/v1/preview/training-jobs": batch_limits})  # fmt: skip
    app.add_middleware(
        overload.InFlightLimit,
        owners=SlotOwners(app.state.loop_reads, local_mode=settings.local_mode, metrics_token=settings.metrics_token),
        max_requests=settings.max_concurrent_requests,
        max_per_caller=settings.max_concurrent_requests_per_caller,
        max_unauthenticated=settings.max_concurrent_unauthenticated_requests,
    )
    if settings.local_mode or settings.trusted_hosts:  # outermost: first, so a foreign Host takes no slot
        app.add_middleware(hosts.TrustedHosts, trusted_hosts=settings.trusted_hosts)
    routers = (jobs, checkpoints, inference, preview, evaluations, events, alerts, curves, environments, health, ui)
    for module in routers:
        app.include_router(module.router)
    return app
