"""Request dependencies: the database session and the authenticated caller.

Routes declare ``session: SessionDep`` and ``caller: CallerDep`` (or ``OperatorDep`` where only
operators may act). No token: 401. A client asking for another client's job gets 404, exactly as
for a job that does not exist, so ids of other tenants cannot be probed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.auth import LOCAL_PRINCIPAL, Principal, authenticate
from service.settings import Settings
from service.store import runs
from service.store.tables import Job

bearer = HTTPBearer(auto_error=False, description="A token from `artsvc token create`.")


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_caller(
    settings: SettingsDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if settings.local_mode:
        return LOCAL_PRINCIPAL
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "missing bearer token (create one with `artsvc token create`)", {"WWW-Authenticate": "Bearer"})
    principal = authenticate(session, token=credentials.credentials)
    if principal is None:
        raise HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})
    return principal


CallerDep = Annotated[Principal, Depends(get_caller)]


def require_operator(caller: CallerDep) -> Principal:
    if not caller.is_operator:
        raise HTTPException(403, "this needs an operator token")
    return caller


OperatorDep = Annotated[Principal, Depends(require_operator)]


def visible_job(session: Session, *, caller: Principal, job_id: str) -> Job:
    """The job if the caller may see it; 404 otherwise (missing and foreign look the same)."""
    job = runs.get_job(session, job_id=job_id) if _is_uuid(job_id) else None
    if job is None or not (caller.is_operator or job.owner_id == caller.id):
        raise HTTPException(404, f"no job {job_id[:64]!r}")
    return job


def _is_uuid(text: str) -> bool:
    """Job ids are UUIDs; anything else is not looked up (some databases refuse odd bytes such as NUL)."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
