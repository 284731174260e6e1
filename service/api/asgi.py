"""What the API's pure ASGI middlewares share: they act on HTTP requests only, and refuse with a small JSON body
sent before the app (and its exception handlers) sees the request."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send


class HTTPMiddleware:
    """Pure ASGI middleware (no per-request task or body buffering, unlike ``BaseHTTPMiddleware``): ``handle`` sees
    each HTTP request; lifespan and websocket messages pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


async def send_json_error(send: Send, status: int, detail: str, *, headers: dict[str, str]) -> None:
    """A ``{"detail": ...}`` response, shaped as FastAPI's own errors are, with extra ``headers``."""
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name.encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
