"""Request dependencies: the database session and the authenticated caller.

Routes declare ``session: SessionDep`` and ``caller: CallerDep`` (or ``OperatorDep`` where only
operators may act). No token: 401. A client asking for another client's job gets 404, exactly as
for a job that does not exist, so ids of other tenants cannot be probed.

No request holds a database connection longer than its own work: the token lookup uses a session of
its own, closed before the route runs (a request waiting for a thread holds no connection), and the
route's session closes as soon as the route and its response model are done, before the response is
sent (a slow reader or a stream holds none).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.api.browser_auth import SESSION_COOKIE, cookie_caller, refuse_cross_site
from service.auth import LOCAL_PRINCIPAL, Principal, authenticate
from service.settings import Settings
from service.store import runs
from service.store.tables import Job, JobKind

bearer = HTTPBearer(auto_error=False, description="A token from `artsvc token create`.")


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


EngineDep = Annotated[Engine, Depends(get_engine)]


def get_session(engine: EngineDep) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]  # closed when the route returns, not sent
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_caller(
    request: Request,
    settings: SettingsDep,
    engine: EngineDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The caller of a bearer token, or (only without an Authorization header) of the dashboard's session cookie,
    whose state changes must come from this server's own pages (service/api/browser_auth.py)."""
    if settings.local_mode:
        refuse_cross_site(request)  # no credential at all: only another site's page could make this a forgery
        return LOCAL_PRINCIPAL
    token = credentials.credentials if credentials is not None and credentials.scheme.lower() == "bearer" else None
    if token is None and "authorization" not in request.headers and request.cookies.get(SESSION_COOKIE):
        with Session(engine) as session:
            return cookie_caller(request, session)
    if token is None:
        raise HTTPException(401, "missing bearer token (create one with `artsvc token create`)", {"WWW-Authenticate": "Bearer"})
    with Session(engine) as session:  # its own, short: the connection is back in the pool before the route runs
        principal = authenticate(session, token=token)
    if principal is None:
        raise HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})
    return principal


CallerDep = Annotated[Principal, Depends(get_caller)]


def require_operator(caller: CallerDep) -> Principal:
    if not caller.is_operator:
        raise HTTPException(403, "this needs an operator token")
    return caller


OperatorDep = Annotated[Principal, Depends(require_operator)]


def visible_job(session: Session, *, caller: Principal, job_id: str, kind: JobKind | None = JobKind.training) -> Job:
    """The job (of ``kind``; None: training or evaluation) if the caller may see it; 404 otherwise (missing and
    foreign look the same)."""
    job = runs.get_job(session, job_id=job_id) if runs.is_job_id(job_id) else None
    if job is None or not (caller.is_operator or job.owner_id == caller.id) or kind not in (None, job.kind):
        noun = "evaluation" if kind == JobKind.evaluation else "job"
        raise HTTPException(404, f"no {noun} {job_id[:64]!r}")
    return job

