"""A cap on the requests the API works on at once: beyond it, an immediate 503 with ``Retry-After``.

Without it a flood queues for threads and connections until every request, everyone's, waits half a minute.
A request counts from its arrival until its response starts, so a live event stream stops counting once its
headers are out (streams have caps of their own, service/api/routes/events.py). ``/healthz`` has a small
allowance of its own, so a load balancer still hears from a busy server, and a flood of health checks still
cannot pass the cap.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

RETRY_AFTER_S = 1  # a request slot frees within a request's time
HEALTH_PATH = "/healthz"
HEALTH_IN_FLIGHT = 4  # health checks answered at once, besides the cap


class InFlightLimit:
    """Pure ASGI middleware: 503 with ``Retry-After`` for HTTP requests past ``max_requests`` in progress."""

    def __init__(self, app: ASGIApp, *, max_requests: int) -> None:
        self.app = app
        self.limits = {"requests": max_requests, "health": HEALTH_IN_FLIGHT}
        self.in_flight = {"requests": 0, "health": 0}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate = "health" if scope["path"] == HEALTH_PATH else "requests"
        if self.in_flight[gate] >= self.limits[gate]:
            await self._refuse(send, gate)
            return
        self.in_flight[gate] += 1  # one event loop: no lock needed between the check and the count
        counted = True

        def release() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.in_flight[gate] -= 1

        async def releasing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, releasing_send)
        finally:
            release()

    async def _refuse(self, send: Send, gate: str) -> None:
        what = "health checks" if gate == "health" else "requests (ARTSVC_MAX_CONCURRENT_REQUESTS)"
        limit = self.limits[gate]
        detail = f"the server is busy: at its limit of {limit} {what} in progress; retry in {RETRY_AFTER_S} s"
        body = json.dumps({"detail": detail}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_S).encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
