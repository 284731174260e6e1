"""Liveness for load balancers (no token) and metrics for Prometheus (an operator's token or ``metrics_token``).

``/healthz`` answers 503 only when the database cannot be reached (nothing works then); with no live
worker it answers 200 ``degraded``: the API serves, but queued jobs wait. It stays answerable under a
flood: it passes the request cap on an allowance of its own (service/api/overload.py), checks the
database on a thread and a connection of its own (``app.state.health_engine``) rather than queueing
behind the requests' threads and connections. ``/metrics`` shows every tenant's activity in aggregate,
so it is the operator's: a client token gets 403.
"""

from __future__ import annotations

import hmac
import logging
from functools import partial
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from service.api.deps import SettingsDep, bearer, get_caller, require_operator
from service.api.watch_schemas import DatabaseHealth, HealthPublic, WorkersHealth
from service.store import stats

router = APIRouter(tags=["health"])
logger = logging.getLogger(__name__)
HEALTH_THREADS = anyio.CapacityLimiter(1)  # checks take a millisecond: one at a time, apart from the requests'


@router.get(
    "/healthz",
    responses={503: {"model": HealthPublic, "description": "The database cannot be reached."}},
)
async def healthz(request: Request, response: Response) -> HealthPublic:
    """Whether the database answers and any worker is alive to train queued jobs."""
    state = request.app.state
    check = partial(check_health, state.health_engine, lease_seconds=state.settings.lease_seconds)
    health = await anyio.to_thread.run_sync(check, limiter=HEALTH_THREADS)
    if health.status == "unavailable":
        response.status_code = 503
    return health


async def metrics_reader(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Let Prometheus in with ``metrics_token``, and operators as everywhere else (local mode: everyone);
    401 without a credential, 403 for a client's."""
    expected = settings.metrics_token.get_secret_value() if settings.metrics_token is not None else None
    if expected and credentials is not None and credentials.scheme.lower() == "bearer":
        if hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
            return
    require_operator(await get_caller(request=request, settings=settings, credentials=credentials))


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(metrics_reader)],
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
)
def metrics(request: Request) -> Response:
    """Jobs by kind and status, training steps, running jobs' validation accuracy by environment, alerts, live
    workers, request latency."""
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)


def check_health(engine: Engine, *, lease_seconds: float) -> HealthPublic:
    """The service's health: ``unavailable`` if the database fails, ``degraded`` with no live worker."""
    try:
        with Session(engine) as session:
            summary = stats.workers(session, lease_seconds=lease_seconds)
    except SQLAlchemyError as exc:
        logger.error("health check cannot reach the database: %s", exc)
        error = f"cannot reach the database ({type(exc).__name__}); the server log has the details"
        return HealthPublic(status="unavailable", database=DatabaseHealth(ok=False, error=error), workers=None)
    workers = WorkersHealth(alive=summary.alive, capacity=summary.capacity, running_jobs=summary.running_jobs)
    return HealthPublic(status="ok" if summary.alive else "degraded", database=DatabaseHealth(ok=True), workers=workers)
