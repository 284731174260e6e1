"""A deadline on each request's head, which uvicorn does not have: it times a keep-alive connection's silence between
requests, but not a new connection, nor one that sends its head a byte at a time. Such connections (slowloris) hold a
socket, and a file descriptor, each for as long as the client likes; enough of them and the server can accept no
one. A request slot is taken only once the head is in (service/api/overload.py), and the body has its own deadline
(service/api/limits.py): this bounds the time before that.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeadDeadline:
    """Mixed into a uvicorn HTTP protocol: the connection is closed if a request's head is not in ``head_timeout_s``
    after the connection opens, or after the first byte of a request that follows another."""

    head_timeout_s: float
    cycle: Any  # the protocol's current request: None before the first head, response_complete after it is answered
    transport: asyncio.Transport
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._awaiting_head():
            self._arm()  # the first bytes of a request after an answered one (idle between them: uvicorn's keep-alive)
        super().data_received(data)  # type: ignore[misc]
        if not self._awaiting_head():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _awaiting_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(self.head_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expire(self) -> None:
        self._head_timer = None
        if self._awaiting_head() and not self.transport.is_closing():
            self.transport.close()


def head_timed_protocol(head_timeout_s: float) -> type:
    """The HTTP protocol uvicorn would choose (httptools when installed, else h11), with ``HeadDeadline``."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as protocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as protocol
    return type("HeadTimed" + protocol.__name__, (HeadDeadline, protocol), {"head_timeout_s": head_timeout_s})
