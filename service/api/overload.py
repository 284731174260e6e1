"""Caps on the requests the API works on at once: beyond the server's, an immediate 503 with ``Retry-After``; beyond
one caller's share, an immediate 429, so one tenant's flood cannot take every slot from the others.

Without them a flood queues for threads and connections until every request, everyone's, waits half a minute.
The caller is told apart by its credential (bearer header or session cookie) as sent, before any lookup: a request
is refused without touching the database, and a flood of made-up credentials still meets the server's cap.
A request counts from its arrival until its response starts, so a live event stream stops counting once its
headers are out (streams have caps of their own, service/api/routes/events.py). ``/healthz`` has a small
allowance of its own, so a load balancer still hears from a busy server, and a flood of health checks still
cannot pass the cap.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import HTTPMiddleware, send_json_error
from service.api.browser_auth import SESSION_COOKIE

RETRY_AFTER_S = 1  # a request slot frees within a request's time
HEALTH_PATH = "/healthz"
HEALTH_IN_FLIGHT = 4  # health checks answered at once, besides the cap


class InFlightLimit(HTTPMiddleware):
    """503 with ``Retry-After`` for HTTP requests past ``max_requests`` in progress, 429 for a
    caller's past ``max_per_caller``."""

    def __init__(self, app: ASGIApp, *, max_requests: int, max_per_caller: int) -> None:
        super().__init__(app)
        self.limits = {"requests": max_requests, "health": HEALTH_IN_FLIGHT}
        self.in_flight = {"requests": 0, "health": 0}
        self.max_per_caller = max_per_caller
        self.by_caller: dict[str, int] = {}  # callers with requests in progress only: it cannot grow past the cap

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = "health" if scope["path"] == HEALTH_PATH else "requests"
        caller = credential(scope) if gate == "requests" else None
        if self.in_flight[gate] >= self.limits[gate]:
            await self._refuse(send, gate)
            return
        if caller is not None and self.by_caller.get(caller, 0) >= self.max_per_caller:
            await self._refuse(send, "caller")
            return
        self._count(gate, caller, +1)  # one event loop: no lock needed between the check and the count
        counted = True

        def release() -> None:
            nonlocal counted
            if counted:
                counted = False
                self._count(gate, caller, -1)

        async def releasing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, releasing_send)
        finally:
            release()

    def _count(self, gate: str, caller: str | None, change: int) -> None:
        self.in_flight[gate] += change
        if caller is not None:
            if (left := self.by_caller.get(caller, 0) + change) > 0:
                self.by_caller[caller] = left
            else:
                self.by_caller.pop(caller, None)

    async def _refuse(self, send: Send, gate: str) -> None:
        if gate == "caller":
            status, limit = 429, self.max_per_caller
            detail = (f"too many requests from this caller: at its limit of {limit} in progress "
                      f"(ARTSVC_MAX_CONCURRENT_REQUESTS_PER_CALLER); retry in {RETRY_AFTER_S} s")  # fmt: skip
        else:
            what = "health checks" if gate == "health" else "requests (ARTSVC_MAX_CONCURRENT_REQUESTS)"
            status, limit = 503, self.limits[gate]
            detail = f"the server is busy: at its limit of {limit} {what} in progress; retry in {RETRY_AFTER_S} s"
        await send_json_error(send, status, detail, headers={"retry-after": str(RETRY_AFTER_S)})


def credential(scope: Scope) -> str:
    """What tells callers apart before authentication: the Authorization header, else the session cookie, else ""
    (every anonymous request shares one share)."""
    headers = Headers(scope=scope)
    if authorization := headers.get("authorization"):
        return authorization
    return cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE, "")
