"""Turns at the inference process: round-robin between tenants, the one that just held the turn last, a line per
tenant bounded on its own, a waiter that is cancelled leaving its line, and several tenants holding turns at once,
one request each; and the baton that shares the model between the requests in progress."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.inference.baton import Baton
from service.inference.turns import FairTurns, TurnsFull


def test_a_flooding_tenant_takes_turns_with_the_others_and_only_it_is_refused():
    async def scenario() -> list[str]:
        turns, served = FairTurns(max_waiting=3), []

        async def use(name: str) -> None:
            await turns.acquire(name[0])
            served.append(name)
            await asyncio.sleep(0)
            turns.release(name[0])

        await turns.acquire("a")  # a1 holds the turn
        flood = [asyncio.create_task(use(f"a{i}")) for i in (2, 3, 4)]
        await asyncio.sleep(0)
        with pytest.raises(TurnsFull):
            await turns.acquire("a")
        others = [asyncio.create_task(use(name)) for name in ("b1", "c1", "b2")]
        await asyncio.sleep(0)
        turns.release("a")
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
        turns.release("a")  # c's turn, but c is cancelled before it runs
        granted.cancel()
        await asyncio.sleep(0)
        assert not turns.held

    asyncio.run(scenario())


def test_tenants_hold_turns_at_once_one_request_each():
    async def scenario() -> None:
        turns = FairTurns(max_waiting=2, capacity=2)
        await turns.acquire("a")
        second_of_a = asyncio.create_task(turns.acquire("a"))
        await turns.acquire("b")  # a place is free: b goes at once, beside a
        await asyncio.sleep(0)
        assert turns.holds("a") and turns.holds("b") and turns.waiting("a") == 1  # a's second waits for a's first
        third = asyncio.create_task(turns.acquire("c"))
        await asyncio.sleep(0)
        assert turns.waiting("c") == 1  # both places taken
        turns.release("a")
        await third  # c, not a's second: a just had a turn
        assert turns.waiting("a") == 1
        turns.release("b")
        await second_of_a

    asyncio.run(scenario())


def test_the_baton_hands_the_model_to_a_short_request_while_a_long_one_runs():
    baton, finished, started = Baton(slice_s=0.01), [], threading.Event()

    def run(name: str, work_s: float) -> None:
        with baton.held() as work:
            started.set()
            while work.share() < work_s:  # a stopping point per "token"
                time.sleep(0.001)
        finished.append(name)

    long = threading.Thread(target=run, args=("long", 1.0))
    long.start()
    started.wait()
    short = threading.Thread(target=run, args=("short", 0.02))
    short.start()
    short.join(5)
    assert finished == ["short"]  # done well before the long one, which waited only while short had the model
    long.join(5)
    assert finished == ["short", "long"]
