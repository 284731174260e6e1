"""Turns at the inference process, one at a time, shared fairly between tenants.

Each tenant waits in a line of its own, at most ``max_waiting`` long (TurnsFull beyond, for that tenant only), and
the turn passes between the tenants that wait round-robin, the tenant that just held it last: whoever floods, another
tenant's request waits for the request being answered and at most one of each other waiting tenant, never for the
whole flood. A waiter that is cancelled (its client went
away) leaves its line at once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque


class TurnsFull(Exception):
    """The tenant already has ``max_waiting`` requests waiting."""


class FairTurns:
    """One holder at a time; waiters served round-robin between tenants, in arrival order within one."""

    def __init__(self, *, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._lines: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()  # tenants with waiters only
        self._held = False
        self._holder = ""  # the tenant whose request holds the turn

    @property
    def held(self) -> bool:
        return self._held

    def waiting(self, tenant: str) -> int:
        return len(self._lines.get(tenant, ()))

    async def acquire(self, tenant: str) -> None:
        """Wait for the turn; TurnsFull if ``tenant`` already has ``max_waiting`` waiting. The holder calls
        :meth:`release` once its work is done."""
        if not self._held and not self._lines:
            self._held, self._holder = True, tenant
            return
        if self.waiting(tenant) >= self.max_waiting:
            raise TurnsFull(tenant)
        turn = asyncio.get_running_loop().create_future()
        self._lines.setdefault(tenant, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted as it was cancelled: pass the turn on
                self.release()
            else:
                self._leave(tenant, turn)
            raise

    def release(self) -> None:
        """Hand the turn to the next tenant in the rotation (the one that just held it goes last), or free it."""
        if self._holder in self._lines:
            self._lines.move_to_end(self._holder)
        while self._lines:
            tenant, line = next(iter(self._lines.items()))
            turn = line.popleft()
            if not line:
                del self._lines[tenant]
            if not turn.done():
                turn.set_result(None)
                self._holder = tenant
                return
        self._held = False

    def _leave(self, tenant: str, turn: asyncio.Future[None]) -> None:
        line = self._lines.get(tenant)
        if line is not None and turn in line:
            line.remove(turn)
            if not line:
                del self._lines[tenant]
