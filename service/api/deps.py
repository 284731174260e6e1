"""Request dependencies: the database session and the authenticated caller.

Routes declare ``session: SessionDep`` and ``caller: CallerDep`` (or ``OperatorDep`` where only
operators may act). No token: 401. A client asking for another client's job gets 404, exactly as
for a job that does not exist, so ids of other tenants cannot be probed.

Two ways to the store, chosen by what a profile of ``GET /v1/jobs/{id}`` under load showed: each thread
hop of a request costs a GIL hand-over (up to the interpreter's 5 ms switch interval while the event loop
is busy), and a session held across hops kept a connection while it queued for a thread, until requests
timed out waiting for the pool. So:

- keyed reads (the caller's token, one job by id, one page of jobs) run right on the event loop through
  ``read_now``, on a connection of the loop's own, kept open (``app.state.loop_reads``,
  service/api/loop_reads.py: the loop runs one read at a time), as Core statements: no session or identity map,
  which through the ORM cost several times the query itself. They take tens of microseconds on SQLite, whose
  readers never wait for a writer in WAL mode; on PostgreSQL a statement timeout bounds them (service/store/db.py).
  ``GET /v1/jobs/{id}``, which operators poll, reads its bearer token and its job in one statement
  (``visible_job_now``): in one process a GET took 220 us instead of 275, and on PostgreSQL it is one round trip.
- everything else is a sync route run on one request thread, whose session (``SessionDep``) is opened
  without a connection and closed on the loop as soon as the route returns, so no request holds a
  connection while it waits for a thread, and the response is sent without one.

FastAPI validates a sync route's response model on a second request thread. Where that second hop hurts, a
route is ``async`` and runs its store work in one ``in_request_thread`` (service/api/threads.py, which also costs the
loop fewer passes than ``run_in_threadpool``): ``POST /v1/evaluations``, and ``POST /v1/jobs`` when SQLite's write
lock is taken (else its write is done on the loop: service/api/loop_writes.py), whose SQLite writers take turns
(``one_writer``), so under load the threads are all held by writers in the queue. A submission that had committed
waited about 250 ms for a thread to validate its response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection, Row, bindparam
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from service.api.browser_auth import SESSION_COOKIE, cookie_caller, refuse_cross_site
from service.api.token_use import note_token_use
from service.auth import LIVE_TOKEN, LOCAL_PRINCIPAL, Principal, authenticate, hash_token
from service.settings import Settings
from service.store import runs
from service.store.tables import ApiToken, Job, JobKind

T = TypeVar("T")
J = TypeVar("J", Job, Row[Any])
bearer = HTTPBearer(auto_error=False, description="A token from `artsvc token create`.")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
_CALLER_AND_JOB = (
    select(col(ApiToken.id).label("caller_id"), col(ApiToken.role).label("caller_role"), *runs.SHOWN_COLUMNS)
    .outerjoin_from(ApiToken, Job, col(Job.id) == bindparam("job_id"))
    .where(*LIVE_TOKEN)
)  # a live token's row, with the job's columns, or NULLs where there is no such job


async def get_engine(request: Request) -> Engine:
    return request.app.state.engine


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


EngineDep = Annotated[Engine, Depends(get_engine)]


async def get_session(engine: EngineDep) -> AsyncIterator[Session]:
    """A session for a sync route: no connection until the route's first query (on its thread), given back on the
    loop when the route returns (a rollback of a finished request's transaction: no waiting)."""
    with Session(engine, expire_on_commit=False) as session:
        yield session


def read_now(request: Request, fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(connection, **kwargs)`` on the event loop, for a keyed read (see the module docstring); never a write."""
    return request.app.state.loop_reads.run(fn, **kwargs)


SessionDep = Annotated[Session, Depends(get_session, scope="function")]  # closed when the route returns, not sent
SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_caller(request: Request, settings: SettingsDep, credentials: BearerDep) -> Principal:
    """The caller of a bearer token, or (only without an Authorization header) of the dashboard's session cookie,
    whose state changes must come from this server's own pages (service/api/browser_auth.py)."""
    if settings.local_mode:
        refuse_cross_site(request)  # no credential at all: only another site's page could make this a forgery
        return LOCAL_PRINCIPAL
    token = _bearer_token(credentials)
    if token is None and "authorization" not in request.headers and request.cookies.get(SESSION_COOKIE):
        principal = read_now(request, lambda connection: cookie_caller(request, connection))
    elif token is None:
        raise HTTPException(401, "missing bearer token (create one with `artsvc token create`)", {"WWW-Authenticate": "Bearer"})
    elif (principal := read_now(request, authenticate, token=token)) is None:
        raise _unknown_token()
    note_token_use(request, principal.id)
    return principal


def _bearer_token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None and credentials.scheme.lower() == "bearer" else None


def _unknown_token() -> HTTPException:
    return HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})


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
    return _if_visible(job, caller=caller, job_id=job_id, kind=kind)


def visible_job_row(connection: Connection, *, caller: Principal, job_id: str) -> Row[Any]:
    """``visible_job`` for a training job only shown, not changed: its Core row, read without a session."""
    row = runs.job_row(connection, job_id=job_id) if runs.is_job_id(job_id) else None
    return _if_visible(row, caller=caller, job_id=job_id, kind=JobKind.training)


async def visible_job_now(request: Request, credentials: HTTPAuthorizationCredentials | None, *, job_id: str) -> Row[Any]:
    """``get_caller`` then ``visible_job_row`` for ``GET /v1/jobs/{id}``, the path operators poll: with a bearer token,
    the token and the job are one statement (one execution on the loop, one round trip to PostgreSQL, not two);
    local mode, the dashboard's cookie and a missing token go ``get_caller``'s way."""
    settings: Settings = request.app.state.settings
    token = _bearer_token(credentials)
    if token is None or settings.local_mode:
        caller = await get_caller(request, settings, credentials)
        return read_now(request, visible_job_row, caller=caller, job_id=job_id)
    found = read_now(request, _caller_and_job_row, token=token, job_id=job_id if runs.is_job_id(job_id) else None)
    if found is None:
        raise _unknown_token()
    caller = Principal(id=found.caller_id, role=found.caller_role)
    note_token_use(request, caller.id)
    return _if_visible(found if found.id is not None else None, caller=caller, job_id=job_id, kind=JobKind.training)


def _caller_and_job_row(connection: Connection, *, token: str, job_id: str | None) -> Row[Any] | None:
    """A live token's id and role with the job's ``SHOWN_COLUMNS`` (all NULL when no such job); None for a token
    unknown or revoked."""
    return connection.execute(_CALLER_AND_JOB, {"token_hash": hash_token(token), "job_id": job_id}).first()


def _if_visible(job: J | None, *, caller: Principal, job_id: str, kind: JobKind | None) -> J:
    if job is None or not (caller.is_operator or job.owner_id == caller.id) or kind not in (None, job.kind):
        noun = "evaluation" if kind == JobKind.evaluation else "job"
        raise HTTPException(404, f"no {noun} {job_id[:64]!r}")
    return job

