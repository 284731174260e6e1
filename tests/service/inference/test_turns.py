"""Turns at the inference process: round-robin between tenants, the one that just held the turn last, a line per
tenant bounded on its own, and a waiter that is cancelled leaving its line."""

from __future__ import annotations

import asyncio

import pytest

from service.inference.turns import FairTurns, TurnsFull


def test_a_flooding_tenant_takes_turns_with_the_others_and_only_it_is_refused():
    async def scenario() -> list[str]:
        turns, served = FairTurns(max_waiting=3), []

        async def use(name: str) -> None:
            await turns.acquire(name[0])
            served.append(name)
            await asyncio.sleep(0)
            turns.release()

        await turns.acquire("a")  # a1 holds the turn
        flood = [asyncio.create_task(use(f"a{i}")) for i in (2, 3, 4)]
        await asyncio.sleep(0)
        with pytest.raises(TurnsFull):
            await turns.acquire("a")
        others = [asyncio.create_task(use(name)) for name in ("b1", "c1", "b2")]
        await asyncio.sleep(0)
        turns.release()
        await asyncio.gather(*flood, *others)
        return served

    assert asyncio.run(scenario()) == ["b1", "c1", "a2", "b2", "a3", "a4"]  # after a1


def test_a_cancelled_waiter_leaves_its_line_and_a_cancelled_grant_passes_the_turn_on():
    async def scenario() -> None:
        turns = FairTurns(max_waiting=1)
        await turns.acquire("a")
        gone = asyncio.create_task(turns.acquire("b"))
        await asyncio.sleep(0)
        assert turns.waiting("b") == 1
        gone.cancel()
        await asyncio.sleep(0)
        assert turns.waiting("b") == 0

        granted = asyncio.create_task(turns.acquire("c"))
        await asyncio.sleep(0)
        turns.release()  # c's turn, but c is cancelled before it runs
        granted.cancel()
        await asyncio.sleep(0)
        assert not turns.held

    asyncio.run(scenario())
