"""Caps on the requests the API works on at once: beyond the server's, an immediate 503 with ``Retry-After``; beyond
one token's share, an immediate 429, so one tenant's flood cannot take every slot from the others; requests without
a valid credential share one small pool of their own (503 beyond), so made-up tokens cannot either.

Without them a flood queues for threads and connections until every request, everyone's, waits half a minute.
A request's slot belongs to the token behind its credential (service/api/slot_owners.py), resolved only once the
server's cap has room: a full server refuses without touching the database. A request counts from its arrival
until its response starts, so a live event stream stops counting once its headers are out (streams have caps of
their own, service/api/routes/events.py), and a body that arrives too slowly is answered 408
(service/api/limits.py), which gives its slot back. ``/healthz`` has a small allowance of its own, so a load
balancer still hears from a busy server, and a flood of health checks still cannot pass the cap.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import HTTPMiddleware, send_json_error
from service.api.slot_owners import UNAUTHENTICATED, SlotOwners

RETRY_AFTER_S = 1  # a request slot frees within a request's time
HEALTH_PATH = "/healthz"
HEALTH_IN_FLIGHT = 4  # health checks answered at once, besides the cap


class InFlightLimit(HTTPMiddleware):
    """503 with ``Retry-After`` for HTTP requests past ``max_requests`` in progress, 429 for a token's past
    ``max_per_caller``, 503 for unauthenticated ones past ``max_unauthenticated``."""

    def __init__(
        self, app: ASGIApp, *, owners: SlotOwners, max_requests: int, max_per_caller: int, max_unauthenticated: int
    ) -> None:
        super().__init__(app)
        self.owners = owners
        self.limits = {"requests": max_requests, "health": HEALTH_IN_FLIGHT}
        self.in_flight = {"requests": 0, "health": 0}
        self.max_per_caller = max_per_caller
        self.max_unauthenticated = max_unauthenticated
        self.by_owner: dict[str, int] = {}  # owners with requests in progress only: it cannot grow past the cap

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = "health" if scope["path"] == HEALTH_PATH else "requests"
        if self.in_flight[gate] >= self.limits[gate]:
            await self._refuse(send, gate)
            return
        owner = self.owners.owner(scope) if gate == "requests" else None
        if owner is not None and self.by_owner.get(owner, 0) >= self._share(owner):
            await self._refuse(send, "unauthenticated" if owner == UNAUTHENTICATED else "caller")
            return
        self._count(gate, owner, +1)  # one event loop, no await since the checks: no lock needed
        counted = True

        def release() -> None:
            nonlocal counted
            if counted:
                counted = False
                self._count(gate, owner, -1)

        async def releasing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, releasing_send)
        finally:
            release()

    def _share(self, owner: str) -> int:
        return self.max_unauthenticated if owner == UNAUTHENTICATED else self.max_per_caller

    def _count(self, gate: str, owner: str | None, change: int) -> None:
        self.in_flight[gate] += change
        if owner is not None:
            if (left := self.by_owner.get(owner, 0) + change) > 0:
                self.by_owner[owner] = left
            else:
                self.by_owner.pop(owner, None)

    async def _refuse(self, send: Send, gate: str) -> None:
        if gate == "caller":
            status, limit = 429, self.max_per_caller
            detail = (f"too many requests from this token: at its limit of {limit} in progress "
                      f"(ARTSVC_MAX_CONCURRENT_REQUESTS_PER_CALLER); retry in {RETRY_AFTER_S} s")  # fmt: skip
        elif gate == "unauthenticated":
            status, limit = 503, self.max_unauthenticated
            detail = (f"the server is busy: at its limit of {limit} requests without a valid token in progress "
                      f"(ARTSVC_MAX_CONCURRENT_UNAUTHENTICATED_REQUESTS); retry in {RETRY_AFTER_S} s")  # fmt: skip
        else:
            what = "health checks" if gate == "health" else "requests (ARTSVC_MAX_CONCURRENT_REQUESTS)"
            status, limit = 503, self.limits[gate]
            detail = f"the server is busy: at its limit of {limit} {what} in progress; retry in {RETRY_AFTER_S} s"
        await send_json_error(send, status, detail, headers={"retry-after": str(RETRY_AFTER_S)})
