"""How a browser is authenticated: the dashboard's session cookie, and the Origin check that keeps other sites'
pages from using it.

A browser attaches the cookie to any request for this host, including a form another page posts here. SameSite
does not help against same-site pages (another port on localhost, a sibling subdomain), so every state-changing
request the cookie authenticates must name this server as its Origin (or, without one, its Referer), and may not
be one of the bodies a plain HTML form can send. Bearer-token requests carry no ambient credential and are not
checked.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response
from sqlalchemy import Connection

from service.auth import Principal, authenticate_browser_session
from service.settings import Settings

SESSION_COOKIE = "artsvc_session"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")  # what HTML forms send


def same_origin(request: Request) -> bool:
    """Whether a request comes from this server's own pages: its Origin, or without one its Referer, names this host
    and port. Neither: False (browsers name the Origin of every cross-site POST; our pages also send a Referer)."""
    source = _source(request)
    return source is not None and urlsplit(source).netloc == request.headers.get("host")


def _source(request: Request) -> str | None:
    return request.headers.get("origin") or request.headers.get("referer")


def cookie_caller(request: Request, connection: Connection) -> Principal:
    """The caller of the session cookie; 403 for a cross-site or form-posted state change, 401 for a session that
    expired, was logged out, or whose token was revoked."""
    if request.method not in SAFE_METHODS:
        _refuse_forgery(request)
    principal = authenticate_browser_session(connection, secret=request.cookies[SESSION_COOKIE])
    if principal is None:
        detail = "the dashboard session expired or was logged out; log in again at /ui/login"
        raise HTTPException(401, detail, {"WWW-Authenticate": "Bearer"})
    return principal


def refuse_cross_site(request: Request) -> None:
    """403 for a state change that names another site as its Origin (or Referer). For local mode, which has no
    credential to check: a page open in the same browser could otherwise drive the local server with a form. A
    request naming no origin (the CLI, curl) is not a browser's cross-site request and passes."""
    if request.method not in SAFE_METHODS and _source(request) is not None and not same_origin(request):
        raise HTTPException(403, f"cross-site request refused: its Origin is {_source(request)[:200]!r}, not this server")


def set_session_cookie(response: Response, *, request: Request, settings: Settings, secret: str) -> None:
    """The cookie of a new session: HttpOnly, SameSite=Strict, gone after ``session_ttl_s``, Secure on https or
    when ``cookie_secure`` says a TLS proxy is in front."""
    response.set_cookie(SESSION_COOKIE, secret, max_age=settings.session_ttl_s, path="/", httponly=True,
                        samesite="strict", secure=_secure(request, settings))  # fmt: skip


def clear_session_cookie(response: Response, *, request: Request, settings: Settings) -> None:
    secure = _secure(request, settings)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=secure)


def _refuse_forgery(request: Request) -> None:
    if not same_origin(request):
        source = _source(request)
        named = f"its Origin is {source[:200]!r}" if source else "it names no Origin or Referer"
        raise HTTPException(
            403,
            f"cross-site request refused: a change authenticated by the dashboard's session cookie must come from this "
            f"server's own pages, and {named}; API clients send `Authorization: Bearer <token>` instead",
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        raise HTTPException(
            415,
            f"a change authenticated by the dashboard's session cookie cannot be a form post (content-type "
            f"{content_type}); send JSON, or use `Authorization: Bearer <token>`",
        )


def _secure(request: Request, settings: Settings) -> bool:
    return settings.cookie_secure or request.url.scheme == "https"
