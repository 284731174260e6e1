"""Turns at the inference process, shared fairly between tenants.

The process works on up to ``capacity`` requests at once, one per tenant, and switches between them every fraction of
a second (service/inference/baton.py). Each tenant waits in a line of its own, at most ``max_waiting`` long
(TurnsFull beyond, for that tenant only), and a freed turn passes between the tenants that wait round-robin, the
tenant that just held it last: whoever floods, another tenant's request is worked on at once when a turn is free (at
most ``capacity`` tenants ask at once), else after the first request of another tenant ends, never after the whole
flood. A waiter that is cancelled (its client went away) leaves its line at once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque


class TurnsFull(Exception):
    """The tenant already has ``max_waiting`` requests waiting."""


class FairTurns:
    """Up to ``capacity`` holders at once, one per tenant; waiters served round-robin between tenants, in arrival
    order within one."""

    def __init__(self, *, max_waiting: int, capacity: int = 1) -> None:
        self.max_waiting, self.capacity = max_waiting, capacity
        self._lines: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()  # tenants with waiters only
        self._holders: set[str] = set()  # the tenants whose requests hold a turn

    @property
    def held(self) -> bool:
        return bool(self._holders)

    def holds(self, tenant: str) -> bool:
        return tenant in self._holders

    def waiting(self, tenant: str) -> int:
        return len(self._lines.get(tenant, ()))

    async def acquire(self, tenant: str) -> None:
        """Wait for a turn; TurnsFull if ``tenant`` already has ``max_waiting`` waiting. The holder calls
        :meth:`release` once its work is done."""
        if self._free_for(tenant) and tenant not in self._lines:
            self._holders.add(tenant)
            return
        if self.waiting(tenant) >= self.max_waiting:
            raise TurnsFull(tenant)
        turn = asyncio.get_running_loop().create_future()
        self._lines.setdefault(tenant, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted as it was cancelled: pass the turn on
                self.release(tenant)
            else:
                self._leave(tenant, turn)
            raise

    def release(self, tenant: str) -> None:
        """End ``tenant``'s turn and hand it to the next tenant in the rotation that holds none (the one that just
        held it goes last)."""
        self._holders.discard(tenant)
        if tenant in self._lines:
            self._lines.move_to_end(tenant)
        for waiter in list(self._lines):
            if not self._free_for(waiter):
                continue
            line = self._lines[waiter]
            while line and line[0].done():  # cancelled as it was granted: not a waiter any more
                line.popleft()
            if line:
                line.popleft().set_result(None)
                self._holders.add(waiter)
            if not line:
                del self._lines[waiter]

    def _free_for(self, tenant: str) -> bool:
        return tenant not in self._holders and len(self._holders) < self.capacity

    def _leave(self, tenant: str, turn: asyncio.Future[None]) -> None:
        line = self._lines.get(tenant)
        if line is not None and turn in line:
            line.remove(turn)
            if not line:
                del self._lines[tenant]
