"""Bounds on a request's body, so no client can make the API buffer an unbounded upload, or hold a request slot
by sending its body slowly.

Size: a declared ``Content-Length`` past the limit is refused before the body reaches the app; a body without one
(chunked) is counted as it streams in and refused the moment it passes the limit. Either way the 413 says
``Connection: close``, and up to ``DRAIN_BYTES`` of the rest of the body is read and discarded first: a connection
closed with a client's bytes still arriving is reset, and the client, still sending, would see the reset instead of
the 413 (on a reused keep-alive connection too). A body larger still is cut off there.

Time: the whole body (and any draining) must arrive within ``timeout_s`` of the request's headers, else 408 with
``Connection: close``: the response gives the request's slot back (service/api/overload.py) and the server closes
the connection. Once the body is in, the app's later waits on the connection (an event stream listening for the
client to go away) are not timed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import HTTPMiddleware, send_json_error

DRAIN_BYTES = 4 * 1024 * 1024  # read and dropped after a refusal, so the client reads the 413 (see above)


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int, setting: str = "ARTSVC_MAX_BODY_BYTES") -> None:
        detail = f"request body larger than the limit of {max_bytes} bytes ({setting})"
        super().__init__(413, detail, headers={"Connection": "close"})  # the rest of the body is not read


class BodyTooSlow(HTTPException):
    def __init__(self, timeout_s: float) -> None:
        detail = f"request body not received within {timeout_s:g} s (ARTSVC_REQUEST_BODY_TIMEOUT_S)"
        super().__init__(408, detail, headers={"Connection": "close"})  # the rest of the body is not read


async def drain(receive: Receive, *, budget: int = DRAIN_BYTES) -> None:
    """Read and discard the rest of a request body, up to ``budget`` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def body_deadline(receive: Receive, *, timeout_s: float) -> Receive:
    """``receive`` raising ``BodyTooSlow`` once the body has not all arrived ``timeout_s`` from now; after its last
    part, untimed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    body_done = False

    async def timed_receive() -> Message:
        nonlocal body_done
        if body_done:
            return await receive()
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise BodyTooSlow(timeout_s) from None
        body_done = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return timed_receive


@dataclass(frozen=True)
class PathLimits:
    """One path's body limits, and the setting that sets its size."""

    max_bytes: int
    timeout_s: float
    setting: str


class BodyLimits(HTTPMiddleware):
    """413 with a JSON ``detail`` for bodies over ``max_bytes``, 408 for bodies not in within ``timeout_s``; the paths
    in ``larger`` have limits of their own (a batch ART's client posts)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float,
                 larger: dict[str, PathLimits] | None = None) -> None:  # fmt: skip
        super().__init__(app)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.larger = larger or {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and not declared.isdigit():
            await self._refuse(send, HTTPException(400, "invalid Content-Length header"))
            return
        default = PathLimits(self.max_bytes, self.timeout_s, "ARTSVC_MAX_BODY_BYTES")
        limits = self.larger.get(scope.get("path", ""), default)
        max_bytes, timeout_s = limits.max_bytes, limits.timeout_s
        receive = body_deadline(receive, timeout_s=timeout_s)
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    if message.get("more_body", False):
                        await drain(receive)
                    # FastAPI re-raises HTTPException; the error handler answers
                    raise BodyTooLarge(max_bytes, limits.setting)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if declared is not None and int(declared) > max_bytes:
                await drain(receive)
                raise BodyTooLarge(max_bytes, limits.setting)
            await self.app(scope, counting_receive, tracking_send)
        except (BodyTooLarge, BodyTooSlow) as exc:  # raised where no handler answered it (outside a route)
            if started:
                raise
            await self._refuse(send, exc)

    @staticmethod
    async def _refuse(send: Send, exc: HTTPException) -> None:
        # the body is not read (past DRAIN_BYTES): the connection is unusable
        await send_json_error(send, exc.status_code, exc.detail, headers={"connection": "close"})
