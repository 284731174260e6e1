"""The operator dashboard: server-rendered pages over the same store and the same visibility rules as the API.

``/ui`` lists the caller's jobs (an operator's: everyone's), ``/ui/jobs/{id}`` shows one job and follows it live
through the job's event stream. A browser cannot send a bearer header, so outside local mode ``/ui/login`` takes
a token and opens a session of its own: the cookie holds the session's secret, never the token, and ``get_caller``
accepts it (service/api/browser_auth.py); pages redirect there without one, ``/ui/logout`` ends the session.
Every page is autoescaped and sent with a nonce-based Content-Security-Policy: rollouts hold model output, and no
script but the page's own may run.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.templating import Jinja2Templates
from sqlmodel import Session

from service.api import dashboard
from service.api.browser_auth import SESSION_COOKIE, clear_session_cookie, same_origin, set_session_cookie
from service.api.deps import SessionDep, SettingsDep, bearer, get_caller, visible_job
from service.api.threads import in_request_thread
from service.auth import Principal, create_browser_session, revoke_browser_session
from service.store import alerts_query, jobs, runs
from service.store import dashboard as dashboard_store

router = APIRouter(prefix="/ui", include_in_schema=False)

JOBS_PER_PAGE = 50
ROLLOUTS_SHOWN = 4
ALERTS_SHOWN = 100
NEXT_PATH = re.compile(r"/ui(/[A-Za-z0-9_\-/]*)?")  # where a login may send the browser back to: pages of ours only

templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).resolve().parents[1] / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
)
templates.env.filters["when"] = lambda moment: moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "–"
templates.env.filters["num"] = lambda value, digits=3: "–" if value is None else f"{value:.{digits}f}"


async def page_caller(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal | None:
    """The caller exactly as the API sees it (local mode, bearer header, login cookie), or None: log in first."""
    try:
        return await get_caller(request=request, settings=settings, credentials=credentials)
    except HTTPException:
        return None


PageCallerDep = Annotated[Principal | None, Depends(page_caller)]


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    """A page with a fresh CSP nonce for its one style and one script, never cached (it shows private data)."""
    nonce = secrets.token_urlsafe(16)
    local = request.app.state.settings.local_mode
    response = templates.TemplateResponse(
        request, name, {**context, "nonce": nonce, "local_mode": local}, status_code=status_code
    )
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"  # no-referrer would make forms post `Origin: null`
    return response


def to_login(request: Request) -> RedirectResponse:
    return RedirectResponse(f"/ui/login?next={quote(request.url.path, safe='/')}", status_code=303)


@router.get("", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, caller: PageCallerDep, cursor: str | None = None) -> Response:
    """The jobs the caller may see, newest first, each with a sparkline of its validation accuracy and reward."""
    if caller is None:
        return to_login(request)
    owner_id = None if caller.is_operator else caller.id
    try:
        page, next_cursor = jobs.list_jobs(
            session.connection(), owner_id=owner_id, status=None, limit=JOBS_PER_PAGE, cursor=cursor
        )
    except jobs.BadCursor as exc:
        return render(request, "error.html", {"title": "Bad page", "message": str(exc)}, status_code=400)
    series = dashboard_store.series_by_job(session, job_ids=[job.id for job in page])
    rows = [(job, dashboard.sparkline(series[job.id])) for job in page]
    return render(request, "jobs.html", {"rows": rows, "next_cursor": next_cursor, "principal": caller})


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, session: SessionDep, caller: PageCallerDep) -> Response:
    """One job: its state, curves, alerts, manifest, failures, cost and a few rollouts; live while it runs."""
    if caller is None:
        return to_login(request)
    try:
        job = visible_job(session, caller=caller, job_id=job_id)
    except HTTPException as exc:
        return render(request, "error.html", {"title": "Not found", "message": exc.detail}, status_code=exc.status_code)
    after = dashboard_store.last_event_id(session, job_id=job.id)  # then the job as of then or later: no gap
    session.refresh(job)
    points = runs.validation_points(session, job_id=job.id)
    latest = points[-1] if points else None
    results = runs.example_results(session, job_id=job.id, step=latest.step) if latest else []
    alerts, _ = alerts_query.list_alerts(session, job_id=job.id, limit=ALERTS_SHOWN)
    rollouts = jobs.trajectories(session, job_id=job.id, step=None, split=None, limit=ROLLOUTS_SHOWN)
    context = {
        "job": job,
        "after": after,
        "alerts": alerts,
        "manifest": dashboard.manifest_view(job.manifest),
        "latest": latest,
        "failures": dashboard.failure_table(latest, results),
        "cost": dashboard.cost_rows(runs.cost_totals(session, job_id=job.id)),
        "rollouts": [(rollout, dashboard.chat(rollout)) for rollout in rollouts],
        "principal": caller,
    }
    return render(request, "job.html", context)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, settings: SettingsDep, next: str = "/ui") -> Response:
    """The token form (local mode needs none: straight to the jobs)."""
    if settings.local_mode:
        return RedirectResponse(_safe_next(next), status_code=303)
    return render(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """Check the token from the form; a live one opens a session whose secret goes into the cookie, anything else
    gets the form again (401)."""
    if settings.local_mode:
        return RedirectResponse("/ui", status_code=303)
    if not same_origin(request):
        return render(request, "error.html", {"title": "Refused", "message": "cross-site login"}, status_code=403)
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=8)
    token = (form.get("token") or [""])[0].strip()
    next_path = _safe_next((form.get("next") or ["/ui"])[0])
    ttl_s = settings.session_ttl_s
    threads = request.app.state.request_threads
    secret = await in_request_thread(threads, _open_session, session, token=token, ttl_s=ttl_s) if token else None
    if secret is None:
        context = {"next": next_path, "error": "unknown or revoked token" if token else "enter a token"}
        return render(request, "login.html", context, status_code=401)
    response = RedirectResponse(next_path, status_code=303)
    set_session_cookie(response, request=request, settings=settings, secret=secret)
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """End the session on the server (its cookie is refused from now on, even if kept) and clear the cookie."""
    if not same_origin(request):
        return render(request, "error.html", {"title": "Refused", "message": "cross-site logout"}, status_code=403)
    secret = request.cookies.get(SESSION_COOKIE)
    if secret:
        revoke_browser_session(session, secret=secret)
        session.commit()
    response = RedirectResponse("/ui/login", status_code=303)
    clear_session_cookie(response, request=request, settings=settings)
    return response


def _open_session(session: Session, *, token: str, ttl_s: int) -> str | None:
    """The committed session's secret, or None for an unknown or revoked token (database work: off the event loop)."""
    opened = create_browser_session(session, token=token, ttl_s=ttl_s)
    if opened is None:
        return None
    session.commit()
    return opened[1]


def _safe_next(path: str) -> str:
    return path if NEXT_PATH.fullmatch(path) else "/ui"
