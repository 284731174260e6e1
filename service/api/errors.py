"""One error shape for every refusal: ``{"detail": "<what is wrong>"}``, plus ``errors`` naming each bad field.

``install`` registers the handlers and documents the shape as every operation's ``4XX`` response,
so the OpenAPI schema promises what the handlers send. A refused submission (service/submission.py) answers the
status it carries. Unexpected exceptions answer a generic 500 (the server logs the traceback); an unreachable
store, or no free database connection within the pool's wait (overload), answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.routing import Match

from service.submission import Refused

logger = logging.getLogger(__name__)


class FieldError(BaseModel):
    loc: str = Field(description="Where the bad value is: a dotted path in the body, or query.NAME, header.NAME.")
    msg: str = Field(description="What is wrong with it.")
    type: str = Field(description="A machine-readable error kind (pydantic's).")


class ErrorBody(BaseModel):
    """What every 4xx and 5xx response carries."""

    detail: str = Field(description="One readable sentence saying what is wrong.")
    errors: list[FieldError] | None = Field(None, description="Each invalid field, for validation errors (422).")


WRONG_BODY_TYPES = ("model_attributes_type", "model_type", "dict_type")
FASTAPI_UNPARSABLE_BODY = "There was an error parsing the body"  # what FastAPI says of JSON it cannot decode

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "The request was refused; `detail` says why."},
}


def install(app: FastAPI) -> None:
    """Register the error handlers and document ``ErrorBody`` on every route added after this call."""
    app.router.responses = {**ERROR_RESPONSES, **app.router.responses}
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(OperationalError, _store_unavailable)
    app.add_exception_handler(PoolTimeout, _no_free_connection)
    app.add_exception_handler(Exception, _unexpected)


def field_path(loc: Sequence[Any]) -> str:
    """``("body", "training", "group_size")`` -> ``training.group_size``; other sources keep their prefix."""
    parts = [str(part) for part in loc]
    if parts[:1] == ["body"]:
        parts = parts[1:]
    return ".".join(parts) or "body"


def field_errors(errors: Sequence[Any], *, json_sent: bool = True) -> list[FieldError]:
    """Pydantic's errors with readable paths; whole-body errors say what the body must be."""
    found = []
    for error in errors:
        kind, message, loc = error["type"], error["msg"], tuple(error["loc"])
        if kind == "json_invalid":
            reason = error.get("ctx", {}).get("error", "invalid JSON")
            message, loc = f"malformed JSON at character {loc[-1]}: {reason}", ("body",)
        elif loc == ("body",) and kind == "missing":
            message = "a JSON body is required"
        elif loc == ("body",) and kind in WRONG_BODY_TYPES:
            message = "expected a JSON object" + ("" if json_sent else " sent with Content-Type: application/json")
        elif kind == "value_error":  # a validator's own sentence: pydantic's prefix adds nothing
            message = message.removeprefix("Value error, ")
        found.append(FieldError(loc=field_path(loc), msg=message, type=kind))
    return found


def _json(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    content_type = request.headers.get("content-type", "")
    errors = field_errors(exc.errors(), json_sent="json" in content_type.lower())
    detail = "; ".join(f"{error.loc}: {error.msg}" for error in errors) or "invalid request"
    if any(error.type == "json_invalid" for error in errors):
        return _json(400, ErrorBody(detail=detail, errors=errors))
    return _json(422, ErrorBody(detail=detail, errors=errors))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    headers, detail = exc.headers, str(exc.detail)
    if exc.status_code == 405:  # Starlette names only the first matching route's methods
        headers = {**(headers or {}), "Allow": ", ".join(sorted(_allowed_methods(request)))}
    if detail == FASTAPI_UNPARSABLE_BODY and isinstance(exc.__cause__, (ValueError, RecursionError)):
        detail = f"body: unreadable JSON: {_why_unreadable(exc.__cause__)}"
    return _json(exc.status_code, ErrorBody(detail=detail), headers)


async def _refused(request: Request, exc: Refused) -> JSONResponse:
    return _json(exc.status, ErrorBody(detail=str(exc)), exc.headers)


def _why_unreadable(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)[:200]


def _allowed_methods(request: Request) -> set[str]:
    """Every method some route serves at this path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return methods


async def _store_unavailable(request: Request, exc: OperationalError) -> JSONResponse:
    logger.error("store unavailable on %s %s: %s", request.method, request.url.path, exc.orig or exc)
    return _json(503, ErrorBody(detail="the store is unavailable; try again shortly"), {"Retry-After": "5"})


async def _no_free_connection(request: Request, exc: PoolTimeout) -> JSONResponse:
    settings = request.app.state.settings
    wait, connections = settings.db_pool_timeout_s, settings.db_pool_size + settings.db_max_overflow
    logger.warning("no free database connection for %s %s within %s s", request.method, request.url.path, wait)
    detail = (
        f"the server is busy: no database connection free within {wait} s "
        f"(ARTSVC_DB_POOL_SIZE + ARTSVC_DB_MAX_OVERFLOW = {connections}); retry shortly"
    )
    return _json(503, ErrorBody(detail=detail), {"Retry-After": "1"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
    return _json(500, ErrorBody(detail="internal error; the server log has the details"))
